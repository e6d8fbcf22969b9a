"""federated_moments(dp=...): the two releases of the federated moments (counts and sums, then
squared deviations about the noisy means) with per-row clipping and the Gaussian mechanism."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats.data import DataError
from fedstats.federation import federated_moments
from fedstats.privacy import DifferentialPrivacy, PrivacyLedger

dpa = pytest.importorskip("dp_accounting")

LOOSE = {"n": 1.0, "sum_x": 1e4, "sum_y": 1e4, "m2_x": 1e6, "m2_y": 1e6}


def clients(K=20, n=100, seed=0, d=2):
    rng = np.random.default_rng(seed)
    return [(rng.normal(2.0, 3.0, size=(n, d)), rng.normal(1.0, 2.0, size=n)) for _ in range(K)]


@pytest.mark.parametrize("placement", ["central", "client"])
@pytest.mark.parametrize("with_y", [True, False])
def test_no_noise_and_loose_bounds_give_the_plain_moments(placement, with_y):
    rows = clients() if with_y else [(X, None) for X, _ in clients()]
    clip = LOOSE if with_y else {k: v for k, v in LOOSE.items() if not k.endswith("_y")}
    plain = federated_moments(rows)
    out = federated_moments(rows, dp=DifferentialPrivacy(0.0, clip=clip, placement=placement))
    assert out["n"] == plain["n"] == 2000 and out["n_noisy"] == 2000.0
    for k in ("mean_x", "sd_x") + (("mean_y", "sd_y") if with_y else ()):
        np.testing.assert_allclose(out[k], plain[k], rtol=1e-12)
    assert out["floored"] == ({"x": [], "y": []} if with_y else {"x": []})
    assert out["privacy"].epsilon == np.inf


def test_the_ledger_has_both_releases_and_dp_accountings_epsilon():
    dp = DifferentialPrivacy(2.0, clip={"n": 1.0, "sum_x": 15.0, "sum_y": 10.0, "m2_x": 100.0, "m2_y": 50.0})
    dp = DifferentialPrivacy(2.0, clip=dict(dp.clip), placement="central", accountant="pld")
    ledger = PrivacyLedger("pld")
    out = federated_moments(clients(), dp=dp, seed=3, privacy_ledger=ledger)
    rel = out["privacy"].ledger.releases
    assert [(r.name, r.noise_multiplier, r.count) for r in rel] == [
        ("moments: sums", 2.0, 1),
        ("moments: squares", 2.0, 1),
    ]
    assert ledger.releases == rel
    acct = dpa.pld.PLDAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acct.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 2))
    assert out["privacy"].epsilon == pytest.approx(acct.get_epsilon(1e-6), rel=1e-9)
    assert 1 < out["privacy"].epsilon < 10
    # moderate epsilon, 2,000 rows: the means and sds close to the plain ones
    plain = federated_moments(clients())
    np.testing.assert_allclose(out["mean_x"], plain["mean_x"], atol=0.1)
    np.testing.assert_allclose(out["sd_x"], plain["sd_x"], rtol=0.05)


@pytest.mark.parametrize("placement", ["central", "client"])
def test_the_noise_has_the_declared_size(placement):
    rows = clients(K=5, n=20, seed=1)
    clip = {"n": 1.0, "sum_x": 20.0, "sum_y": 20.0, "m2_x": 400.0, "m2_y": 400.0}
    dp = DifferentialPrivacy(1.5, clip=clip, placement=placement)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sds of 100 rows under this noise are often floored
        draws = [federated_moments(rows, dp=dp, seed=s) for s in range(200)]
    n = np.array([d["n_noisy"] for d in draws])
    first = DifferentialPrivacy(1.5, clip={k: clip[k] for k in ("n", "sum_x", "sum_y")}, placement=placement)
    sd_n = first.noise_std(["n", "sum_x", "sum_y"], n_clients=5, n_answered=5)["n"]
    assert sd_n == pytest.approx(1.5 * np.sqrt(3))  # per-key bounds: z sqrt(K) C_n, K = 3 keys
    z = (n - 100) / sd_n
    assert abs(z.mean()) < 4 / np.sqrt(200) and abs(z.std() - 1) < 0.15


def test_clipping_bounds_the_rows_and_noisy_squares_are_floored_positive():
    rows = [(np.array([[0.0], [1.0], [100.0]]), None), (np.array([[2.0], [3.0]]), None)]
    out = federated_moments(rows, dp=DifferentialPrivacy(0.0, clip={"n": 1.0, "sum_x": 4.0, "m2_x": 1e6}))
    assert out["mean_x"][0] == pytest.approx((0 + 1 + 4 + 2 + 3) / 5)  # the row of 100 counts as 4
    # one joint bound: each row's (1, x) scaled to norm <= C together
    joint = federated_moments([(np.array([[0.0], [3.0]]), None)], dp=DifferentialPrivacy(0.0, clip=1e3))
    assert joint["mean_x"][0] == pytest.approx(1.5)
    # huge noise on a column of tiny spread: its sum of squares falls below the noise, raised to it
    tiny = [(np.full((50, 1), 1.0) + 1e-6 * np.arange(50)[:, None], None) for _ in range(4)]
    dp = DifferentialPrivacy(50.0, clip={"n": 1.0, "sum_x": 2.0, "m2_x": 1.0}, placement="central")
    floored = 0
    for s in range(20):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = federated_moments(tiny, dp=dp, seed=s)
        assert np.all(out["sd_x"] > 0) and np.all(np.isfinite(out["sd_x"]))
        if out["floored"]["x"]:
            floored += 1
            assert any("raised to it" in str(x.message) for x in w)
    assert floored > 0


def test_clear_errors_for_bad_input():
    rows = clients(K=2, n=5)
    with pytest.raises(TypeError, match="dp must be a fedstats.privacy.DifferentialPrivacy"):
        federated_moments(rows, dp={"noise_multiplier": 1.0})
    with pytest.raises(ValueError, match=r"missing \['m2_y'\]"):
        federated_moments(rows, dp=DifferentialPrivacy(1.0, clip={k: v for k, v in LOOSE.items() if k != "m2_y"}))
    with pytest.raises(ValueError, match=r"not released \['sum_y', 'm2_y'\]"):
        federated_moments([(X, None) for X, _ in rows], dp=DifferentialPrivacy(1.0, clip=LOOSE))
    with pytest.raises(DataError, match="every client or for none"):
        federated_moments([rows[0], (rows[1][0], None)], dp=DifferentialPrivacy(1.0, clip=1.0))
    with pytest.raises(DataError, match="at least one client"):
        federated_moments([], dp=DifferentialPrivacy(1.0, clip=1.0))
