"""Privacy budgets (issue 41, item 5): a fit warns when its epsilon passes a stated level,
several fits of the same data compose, and a node's policy enforces its own budget, noise floor
and secure aggregation (the Flower simulation's test is in tests/federation/test_flower.py)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.federation import NodePolicy, PolicyRefusal
from fedstats.federation.budget import NodeBudget, node_noise_multiplier
from fedstats.federation.policy import check_run, check_step
from fedstats.glm import FederatedGLM
from fedstats.privacy import WARN_EPSILON, DifferentialPrivacy, PrivacyLedger, spent_together

dpa = pytest.importorskip("dp_accounting")

CLIP = {"n": 1.0, "sum_y": 1.0, "xtwx": 4.0, "score": 4.0}


@pytest.fixture(scope="module")
def logit():
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(400, 2)) for _ in range(3)]
    ys = [(rng.random(400) < 1 / (1 + np.exp(-(X @ [1.0, -1.0])))).astype(float) for X in Xs]
    return FederatedData.from_arrays(Xs, ys)


def fit(data, z, seed=0, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = FederatedGLM("binomial", dp=DifferentialPrivacy(z, clip=CLIP, **kw), dp_rounds=5).fit(data, seed=seed)
    return res, [str(w.message) for w in caught if "warn_epsilon" in str(w.message)]


def test_a_fit_past_the_stated_epsilon_warns_and_says_why(logit):
    # 6 releases among 3 clients, in process (no secure aggregation): each reply holds one
    # client's share of the noise, z / sqrt(3)
    res, said = fit(logit, 2.0)
    assert res.privacy.epsilon > WARN_EPSILON == 10.0
    assert len(said) == 1, said
    assert f"epsilon={res.privacy.epsilon:.3g}" in said[0] and "down to 1.15, not 2" in said[0]
    assert "secure aggregation" in said[0] and "warn_epsilon=" in said[0]
    res, said = fit(logit, 10.0)
    assert res.privacy.epsilon < 10.0 and said == []
    # the level is the user's: a stricter one warns at the same fit
    res, said = fit(logit, 10.0, warn_epsilon=1.0)
    assert len(said) == 1 and "more than warn_epsilon=1" in said[0]
    with pytest.raises(ValueError, match="warn_epsilon must be a number > 0"):
        DifferentialPrivacy(1.0, clip=1.0, warn_epsilon=0)
    assert DifferentialPrivacy(1.0, clip=1.0, warn_epsilon=math.inf).as_dict()["warn_epsilon"] == math.inf


def test_fits_of_the_same_data_compose(logit):
    fits = [fit(logit, 10.0, seed=s)[0] for s in range(4)]
    each = [f.privacy.epsilon for f in fits]
    total = spent_together(*fits)
    # the composition of every release of the four fits, as dp-accounting computes it
    acct = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    count = sum(r.count for f in fits for r in f.privacy.ledger.releases)
    assert count == 4 * 6  # each: the design check and 5 IRLS rounds
    acct.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(10.0 / math.sqrt(3)), count))
    assert total.epsilon(1e-6) == pytest.approx(acct.get_epsilon(1e-6), rel=1e-9)
    assert max(each) < total.epsilon(1e-6) < sum(each)
    assert spent_together(fits[0]).epsilon(1e-6) == pytest.approx(each[0], rel=1e-12)
    with pytest.raises(ValueError, match="different accountants"):
        spent_together(PrivacyLedger("rdp"), PrivacyLedger("pld"))
    with pytest.raises(TypeError, match="privacy attribute"):
        spent_together(object())


class Alg:
    """The attributes a node's rules read from an algorithm."""

    def __init__(self, privacy=None, n_clients=4, reply_keys=("s",), summed_keys=("s",)):
        self.privacy, self.n_clients, self.reply_keys, self.summed_keys = privacy, n_clients, reply_keys, summed_keys


def refused(rule, fn, *a, **kw):
    with pytest.raises(PolicyRefusal, match=f"rule {rule}") as info:
        fn(*a, **kw)
    return str(info.value)


def test_the_noise_a_node_counts_is_what_leaves_it():
    dp = DifferentialPrivacy(4.0, clip=1.0)
    assert node_noise_multiplier(Alg(dp), secure=False) == 2.0  # its own share among 4
    assert node_noise_multiplier(Alg(dp), secure=True) == 4.0  # every share in the secure sum
    assert node_noise_multiplier(Alg(DifferentialPrivacy(4.0, clip=1.0, placement="central")), secure=True) == 0.0
    assert node_noise_multiplier(Alg(None), secure=True) == 0.0  # exact statistics


def test_policy_rules_on_secure_aggregation_and_noise():
    p = NodePolicy.from_toml("require_secure_aggregation = true\nmin_noise_multiplier = 1.5\n")
    dp = DifferentialPrivacy(4.0, clip=1.0)
    check_run(p, Alg(dp), "a", secure=True, rounds=3)
    assert "not under secure aggregation" in refused(
        "require_secure_aggregation", check_run, p, Alg(dp), "a", secure=False, rounds=3
    )
    msg = refused(
        "require_secure_aggregation", check_run, p, Alg(dp, reply_keys=("s", "t")), "a", secure=True, rounds=3
    )
    assert "['t'] per client" in msg
    assert "exact statistics" in refused("min_noise_multiplier", check_run, p, Alg(None), "a", secure=True, rounds=3)
    weak = DifferentialPrivacy(1.0, clip=1.0)
    assert "noise multiplier 1" in refused("min_noise_multiplier", check_run, p, Alg(weak), "a", secure=True, rounds=3)
    # per step too: a server cannot switch secure aggregation off mid-run
    assert check_step(p, Alg(dp), "a", secure=True, what="round 1") is None  # no budget: nothing to record
    refused("require_secure_aggregation", check_step, p, Alg(dp), "a", secure=False, what="round 1")
    for bad in (
        "require_secure_aggregation = 1",
        "min_noise_multiplier = -1",
        "epsilon_budget = 'x'",
        "budget_delta = 2.0",
    ):
        with pytest.raises(ValueError):
            NodePolicy.from_toml(bad)


def test_a_node_budget_plans_runs_records_steps_and_fails_closed(tmp_path):
    ledger = (tmp_path / "books-{client}.json").as_posix()
    p = NodePolicy.from_toml(f'epsilon_budget = 5.0\nprivacy_ledger = "{ledger}"\n')
    dp = DifferentialPrivacy(5.2227 * 2 / math.sqrt(3), clip=1.0)  # 4 clients, no secure sum: z_node 3.015
    assert "exact statistics" in refused("epsilon_budget", check_run, p, Alg(None), "a", secure=False, rounds=1)
    central = DifferentialPrivacy(50.0, clip=1.0, placement="central")
    refused("epsilon_budget", check_run, p, Alg(central), "a", secure=True, rounds=1)  # exact sums leave the node
    assert "how many rounds" in refused("epsilon_budget", check_run, p, Alg(dp), "a", secure=False, rounds=None)
    check_run(p, Alg(dp), "a", secure=False, rounds=4)
    for r in range(4):
        book, z = check_step(p, Alg(dp), "a", secure=False, what=f"round {r}")
        book.record("run1", "Alg", "Alg", z)
    assert book.path.endswith("books-a.json") and not (tmp_path / "books-b.json").exists()
    assert book.epsilon() == pytest.approx(3.3, abs=0.01)
    msg = refused("epsilon_budget", check_run, p, Alg(dp), "a", secure=False, rounds=12)
    assert "from 3.3 to" in msg and "budget is 5" in msg
    check_run(p, Alg(dp), "b", secure=False, rounds=4)  # another client's data has its own ledger
    # a ledger the node cannot read refuses everything
    (tmp_path / "books-c.json").write_text("{not json")
    assert "cannot read the node's privacy ledger" in refused(
        "epsilon_budget", check_run, p, Alg(dp), "c", secure=False, rounds=1
    )
    (tmp_path / "books-c.json").write_text(json.dumps({"format": "fedstats-node-privacy", "releases": [{"count": 1}]}))
    refused("epsilon_budget", check_run, p, Alg(dp), "c", secure=False, rounds=1)
    assert NodeBudget(tmp_path / "none.json", 5.0, 1e-6).epsilon() == 0.0
