"""HierarchicalCox: the piecewise-exponential pieces against the closed-form likelihood, the EP
fit against pooled NUTS of the same model (and its speed), calibration over replicates drawn
from the model's prior, the data's scale against the exact Cox fit, and the refusals."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from scipy.special import gammaln

from fedstats.data import DataError, FederatedData
from fedstats.reference.glm import pooled_nuts
from fedstats.survival import CoxPH, HierarchicalCox
from fedstats.survival.hierarchical import pieces
from fedstats.survival.simulate import piecewise_hazards, proportional_hazards


def test_pieces_give_the_piecewise_exponential_likelihood():
    """Summed over a row's pieces, the Poisson log-likelihood is the row's own
    ``d log h(t) - H(t)`` plus ``d log(t - e_j)`` (the time in the interval of its event), which
    no parameter changes: the same likelihood (Poisson's ``-log y!`` is 0 for y in {0, 1})."""
    rng = np.random.default_rng(0)
    n, edges = 200, np.array([0.0, 0.4, 1.1, 2.0])
    t = rng.exponential(1.0, n)
    t[:5] = [0.4, 1.1, 2.0, 0.0, 3.5]  # at an edge (the interval it closes), 0 (no piece), beyond the last
    d = rng.random(n) < 0.7
    d[3] = False
    x = rng.normal(size=(n, 2))
    a, b, scale = np.array([-0.3, 0.2, 0.1, -0.5]), np.array([0.5, -0.2]), 1.7
    X, y, off = pieces(t, d, x, edges, scale)
    eta = X @ np.r_[a, b] + off
    poisson = np.sum(y * eta - np.exp(eta) - gammaln(y + 1))
    j = np.searchsorted(edges, t, side="left") - 1
    h = np.exp(a[np.maximum(j, 0)] + x @ b) / scale  # the hazard per unit of the data's time at t
    width = np.r_[np.diff(edges), np.inf]
    H = (np.exp(a) / scale * np.clip(t[:, None] - edges, 0, width)).sum(axis=1) * np.exp(x @ b)
    spent = np.where(d, np.log(np.where(d, t - edges[np.maximum(j, 0)], 1.0)), 0.0)
    assert poisson == pytest.approx(np.sum(np.where(d, np.log(h), 0.0) - H + spent), rel=1e-12)
    assert y.sum() == d.sum() and len(y) == np.sum(np.clip(t[:, None] - edges, 0, width) > 0)


@pytest.fixture(scope="module")
def federation():
    rng = np.random.default_rng(1)
    return proportional_hazards(12, seed=1, rows=list(rng.integers(30, 150, 12)), beta=(0.6, -0.3), client_effect=0.4)


def test_k12_equals_pooled_nuts_and_is_five_times_faster(federation):
    """Population (mu, log tau) within 0.25 NUTS sd, sd ratios in [0.8, 1.25], every client's
    coefficients within 0.3 sd; the EP fit (compiled) at least 5x faster than pooled NUTS
    (compiled), each timed once in this run."""
    model = HierarchicalCox(event="event", intervals=3)
    model.fit(federation, progress=False)  # compiles
    t0 = time.perf_counter()
    res = model.fit(federation, progress=False)
    t_ep = time.perf_counter() - t0
    design = model.design(federation).design
    pooled_nuts(design, "poisson", "log", hierarchical=True, num_warmup=20, num_samples=20)  # compiles
    t0 = time.perf_counter()
    ref = pooled_nuts(design, "poisson", "log", hierarchical=True, num_warmup=500, num_samples=1000)
    t_nuts = time.perf_counter() - t0
    phi, q = ref["phi"], res._fitted_q()
    assert np.max(np.abs(q.mean - phi.mean(0)) / phi.std(0)) < 0.25
    assert np.all((q.sd / phi.std(0) > 0.8) & (q.sd / phi.std(0) < 1.25))
    for k, c in enumerate(federation.clients):
        m, _ = res.theta[c]
        th = ref["theta"][:, k]
        assert np.max(np.abs(m - th.mean(0)) / th.std(0)) < 0.3, c
    assert t_nuts / t_ep >= 5.0, (t_nuts, t_ep)
    assert res.names == ["log_hazard_1", "log_hazard_2", "log_hazard_3", "x0", "x1"]
    assert res.communication.by_kind["client posteriors"]["rounds"] == 1
    assert res.events == sum(int(federation[c].X[:, 2].sum()) for c in federation.clients)


def replicate(seed, K=8, cuts=(0.3, 1.0)):
    """One federation drawn from the model's prior (mu, log tau ~ N(0, 1)), clients from the
    population: whether each 90% interval of phi and of the clients' coefficients holds the truth.
    A draw in which no row lives past the last cut (the fit refuses an empty interval) is drawn
    again: posterior intervals are calibrated given any property of the data, so the selection
    leaves the coverage 0.90."""
    rng = np.random.default_rng([seed, 45])
    d = len(cuts) + 2  # three log hazards and one coefficient
    while True:
        mu, log_tau = rng.normal(size=d), rng.normal(size=d)
        theta = mu + np.exp(0.5 * log_tau) * rng.normal(size=(K, d))
        fd = piecewise_hazards(theta, cuts, seed, rows=list(rng.integers(40, 100, K)), follow_up=3.0)
        if max(np.max(fd[c].y) for c in fd.clients) > cuts[-1]:
            break
    res = HierarchicalCox(event="event", cuts=cuts, standardize=False).fit(fd, seed=seed, progress=False)
    lo, hi = res._fitted_q().credible_interval(0.9)
    truth = np.r_[mu, log_tau]
    own = [res.client_posterior(c).credible_interval(0.9) for c in fd.clients]
    clients = np.concatenate([(lo_k <= th) & (th <= hi_k) for (lo_k, hi_k), th in zip(own, theta, strict=True)])
    return (lo <= truth) & (truth <= hi), clients


def coverage(n):
    out = [replicate(s) for s in range(n)]
    return np.mean([p for p, _ in out]), np.mean([c for _, c in out])


def test_coverage_20_replicates():
    phi, clients = coverage(20)
    assert abs(phi - 0.90) <= 0.07 and abs(clients - 0.90) <= 0.07, (phi, clients)


@pytest.mark.slow
def test_coverage_100_replicates():
    phi, clients = coverage(100)
    assert abs(phi - 0.90) <= 0.07 and abs(clients - 0.90) <= 0.07, (phi, clients)


def test_natural_units_report_on_the_data_scale():
    """Ages in years and times in days: with one population (no client effect) and many rows the
    population's coefficients are the exact Cox fit's, and the baseline hazard is per day."""
    fd = proportional_hazards(5, seed=3, rows=600, beta=(0.5, -0.4))
    frames = []
    for c in fd.clients:
        X, t = np.asarray(fd[c].X), np.asarray(fd[c].y)
        frames.append(pd.DataFrame({"age": 60 + 10 * X[:, 0], "dose": X[:, 1], "died": X[:, 2], "days": 365 * t}))
    data = FederatedData.from_arrays(
        [f[["age", "dose", "died"]].to_numpy() for f in frames], [f["days"].to_numpy() for f in frames],
        feature_names=["age", "dose", "died"], target_name="days", min_rows=1, min_cell_count=1,
    )  # fmt: skip
    res = HierarchicalCox(event="died").fit(data, progress=False)
    cox = CoxPH(event="died").fit(data)
    mu = res.summary().loc[["mu[age]", "mu[dose]"]]
    assert np.all(np.abs(mu["mean"].to_numpy() - cox.params.to_numpy()) < 2 * cox.bse.to_numpy())
    assert mu.loc["mu[age]", "mean"] == pytest.approx(0.05, abs=0.01)
    base = res.baseline_hazard()
    assert list(base.columns) == ["start", "end", "hazard", "lower", "upper"]
    assert np.all((base["hazard"] > 1 / 365 / 3) & (base["hazard"] < 3 / 365))  # about 1 per year, per day
    # a data frame is read by name: reordered columns, the time and event columns ignored
    rows = pd.DataFrame({"dose": [0.0, 1.0], "days": [1.0, 2.0], "age": [60.0, 70.0], "died": [1, 0]})
    a = res.predict(rows, client=0)
    b = res.predict(np.array([[60.0, 0.0], [70.0, 1.0]]), client=0)
    np.testing.assert_allclose(a["mean"], b["mean"])
    s = res.predict_survival(rows, [0, 365, 730], client=0)
    assert s.shape == (6, 5) and np.all(s.loc[s["time"] == 0, "mean"] == 1)
    assert np.all(np.diff(s.loc[s["row"] == 0, "mean"]) < 0)
    hr = res.hazard_ratios(level=0.9)
    assert list(hr.index) == ["age", "dose"] and hr.attrs["ratio"] == "hazard ratio"
    assert hr.loc["age", "lower"] < np.exp(cox.params["age"]) < hr.loc["age", "upper"]


def test_refusals_name_the_problem():
    fd = proportional_hazards(3, seed=0, rows=40, beta=(0.5,))
    X = {c: np.asarray(fd[c].X).copy() for c in fd.clients}
    y = {c: np.asarray(fd[c].y).copy() for c in fd.clients}
    rules = dict(min_rows=1, min_cell_count=1)
    with pytest.raises(DataError, match="no row has an event"):
        none = {c: np.column_stack([x[:, :1], np.zeros(len(x))]) for c, x in X.items()}
        HierarchicalCox(event="event").fit(
            FederatedData(none, y, feature_names=["x0", "event"], target_name="time", **rules)
        )
    y0 = {**y, "site1": np.r_[0.0, y["site1"][1:]]}
    X0 = {**X, "site1": np.vstack([[0.1, 1.0], X["site1"][1:]])}
    with pytest.raises(DataError, match=r"client 'site1'.*event\(s\) at time 0"):
        HierarchicalCox(event="event").fit(
            FederatedData(X0, y0, feature_names=["x0", "event"], target_name="time", **rules)
        )
    with pytest.raises(DataError, match="no row lives into the interval after 1000"):
        HierarchicalCox(event="event", cuts=[1.0, 1000.0]).fit(fd)
    with pytest.raises(ValueError, match="cuts"):
        HierarchicalCox(event="event", cuts=[2.0, 1.0]).fit(fd)
    with pytest.raises(DataError, match="event='dead' is not a column"):
        HierarchicalCox(event="dead").fit(fd)
    with pytest.warns(RuntimeWarning, match="EP did not converge in 3 rounds"):
        res = HierarchicalCox(event="event", intervals=2, rounds=3).fit(fd, progress=False)
    with pytest.raises(ValueError, match="X must have 1 columns"):
        res.predict(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="LOO and WAIC"):
        res.loo(fd)
