"""HM2 with many predictors (issue 40, item 7): the default tilted moments with more than 8
sampled coordinates, a fit of 50 clients x 16 predictors against pooled NUTS of the same
model, and the progress lines' estimate of the time left."""

import io

import numpy as np
import pytest

from fedstats.datasets.synthetic import hm2_federation
from fedstats.federation.progress import TimeLeft, duration, round_lines
from fedstats.federation.records import RoundRecord
from fedstats.inference.tilted import RaoBlackwellLaplaceTilted, RaoBlackwellTilted
from fedstats.linear import HierarchicalLinearModel


def _federation(d, K=50, n=100, seed=0):
    """The issue's check: 50 clients x 100 rows, tau 0.5, sigma 1, standard normal predictors."""
    mu = np.random.default_rng(1).normal(size=d)
    return hm2_federation(n_clients=K, n_obs=n, mu=mu, tau=np.full(d, 0.5), sigma=1.0, seed=seed)


@pytest.mark.parametrize(
    "options, d, want",
    [
        ({}, 6, RaoBlackwellTilted),  # 6 predictors + intercept: 7 log tau's and log sigma_k: 8
        ({}, 7, RaoBlackwellLaplaceTilted),  # 9
        ({"fit_intercept": False}, 7, RaoBlackwellTilted),  # 8
        ({}, 16, RaoBlackwellLaplaceTilted),
        ({"sigma": 1.0, "fit_intercept": False}, 8, RaoBlackwellTilted),  # 8 log tau's
        ({"sigma": 1.0}, 8, RaoBlackwellLaplaceTilted),  # 9
        ({"tau": "iso"}, 40, RaoBlackwellTilted),  # one log tau and log sigma_k
    ],
)
def test_the_default_samples_up_to_eight_coordinates_and_expands_beyond(options, d, want):
    model = HierarchicalLinearModel(**options)
    site = model._site(d + int(model.fit_intercept))
    assert type(model._estimator(site)) is want


def test_fifty_clients_sixteen_predictors_converge_quickly_with_defaults():
    """The issue's federation (before: 15 rounds of 7-40 s with the importance sampler, not
    converged): converged in at most 12 rounds, every client in every round, no client
    sampled in the last round, the truth within 3.5 posterior sd."""
    data, truth = _federation(16)
    res = HierarchicalLinearModel().fit(data, seed=0)
    assert res.converged and res.rounds <= 12
    assert type(res.algorithm.estimator) is RaoBlackwellLaplaceTilted
    assert all(len(rec.answered) == 50 for rec in res.history)
    assert all(st.diagnostics["fallback"] == 0.0 for st in res.client_states.values())
    s = res.summary()
    mu = s.loc[[f"mu[x{i + 1}]" for i in range(16)]]
    assert np.all(np.abs(mu["mean"].to_numpy() - truth["mu"]) / mu["sd"].to_numpy() < 3.5)


@pytest.mark.slow
@pytest.mark.parametrize("d", [4, 16])
def test_defaults_match_pooled_nuts_of_the_same_model(d):
    """The acceptance's accuracy: q on the standardised scale against pooled NUTS of the same
    model on the same standardised rows (4 x 1000 + 1000; about 3 min each on 2 cores).
    Measured max |mean diff| / sd 0.03 (d = 4) and 0.05 (d = 16), sd ratios 0.96-1.02."""
    from fedstats import FederatedData
    from fedstats.reference.hierarchical import pooled_nuts

    data, _ = _federation(d)
    res = HierarchicalLinearModel().fit(data, seed=0)
    sc = res.scaling
    rows = FederatedData.from_arrays(
        [sc.transform_X(np.asarray(data[c].X)) for c in data.clients],
        [sc.transform_y(np.asarray(data[c].y)) for c in data.clients],
    )
    ref = pooled_nuts(rows, num_warmup=1000, num_samples=1000, num_chains=4, seed=0)
    q = res._q()
    rm, rs = ref["phi"].mean(0), ref["phi"].std(0)
    assert np.max(np.abs(q.mean - rm) / rs) < 0.1, np.abs(q.mean - rm) / rs
    assert np.all((q.sd / rs > 0.9) & (q.sd / rs < 1.1)), q.sd / rs


def _record(r, seconds):
    return RoundRecord(
        round=r,
        participants=[0],
        answered=[0],
        failed={},
        skipped=[],
        bytes_up=0,
        bytes_down=0,
        metrics={},
        seconds=seconds,
    )


def test_time_left_is_the_recent_mean_round_time_times_the_rounds_left():
    left = TimeLeft(10, window=3)
    assert left.add(_record(0, 9.0)) == pytest.approx(9 * 9.0)  # a slow first round (compilation)
    assert left.add(_record(1, 1.0)) == pytest.approx(8 * 5.0)
    assert left.add(_record(2, 2.0)) == pytest.approx(7 * 4.0)
    assert left.add(_record(3, 3.0)) == pytest.approx(6 * 2.0)  # the first round has left the window
    assert left.add(_record(9, 1.0)) is None  # the last round
    assert [duration(s) for s in (0.4, 42.4, 185, 7440)] == ["<1 s", "42 s", "3 min 5 s", "2 h 4 min"]


def test_hm2_progress_lines_say_at_most_how_long_is_left():
    data, _ = _federation(3, K=6, n=40)
    out = io.StringIO()
    with round_lines(out, label="hm2", min_interval=0):
        res = HierarchicalLinearModel(rounds=30).fit(data, seed=0)
    lines = out.getvalue().splitlines()
    rounds = [ln for ln in lines if ln.startswith("hm2: round")]
    assert len(rounds) == res.rounds and res.converged
    # every round line but the last estimates the time left until the limit of 30 rounds
    assert all(", at most " in ln and ln.endswith(" left") for ln in rounds[:-1])
    assert ", at most " not in rounds[-1]
