"""CoxPH equals the pooled fit: lifelines' CoxPHFitter (Efron) and statsmodels' PHReg (Efron and
Breslow), unstratified and stratified by client, with and without robust errors, on seeded
federations with ties, clients without events and clients of 5 to 5,000 rows, and on a real data
set (lifelines' Rossi recidivism data, clients as sites)."""

import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats.data import DataError, FederatedData
from fedstats.data.disclosure import DisclosureError
from fedstats.survival import CoxPH
from fedstats.survival.simulate import proportional_hazards

lifelines = pytest.importorskip("lifelines")
PHReg = pytest.importorskip("statsmodels.duration.hazard_regression").PHReg


def pooled(data):
    X = np.concatenate([np.asarray(data[c].X) for c in data.clients])
    t = np.concatenate([np.asarray(data[c].y) for c in data.clients])
    site = np.concatenate([[k] * data[c].n for k, c in enumerate(data.clients)])
    return X, t, site


def statsmodels_fit(data, ties, stratify, robust):
    X, t, site = pooled(data)
    if stratify and robust:  # statsmodels' residuals are NaN in a stratum without events (ours: 0, no risk set)
        keep = np.isin(site, [k for k in np.unique(site) if X[site == k, -1].any()])
        X, t, site = X[keep], t[keep], site[keep]
    e = X[:, -1]
    m = PHReg(t, X[:, :-1], status=e, ties=ties, **({"strata": site} if stratify else {}))
    groups = {"groups": np.arange(len(t))} if robust else {}
    return m.fit(method="newton", tol=1e-13, maxiter=200, **groups)


@pytest.fixture(scope="module")
def federation():
    # ties (times rounded), a client with no event, clients of 5 to 5,000 rows
    fd = proportional_hazards(5, seed=3, rows=[5, 40, 5000, 300, 12], beta=(0.6, -0.4, 0.2), resolution=0.05)
    X = {c: np.asarray(fd[c].X).copy() for c in fd.clients}
    X["site4"][:, -1] = 0.0  # no event at this client
    y = {c: np.asarray(fd[c].y) for c in fd.clients}
    return FederatedData(X, y, feature_names=fd.feature_names, target_name="time", min_rows=1, min_cell_count=1)


@pytest.mark.parametrize("ties", ["efron", "breslow"])
@pytest.mark.parametrize("stratify", [False, True])
@pytest.mark.parametrize("robust", [False, True])
def test_equal_to_statsmodels_on_the_pooled_rows(federation, ties, stratify, robust):
    res = CoxPH(event="event", ties=ties, stratify=stratify, robust=robust).fit(federation)
    ref = statsmodels_fit(federation, ties, stratify, robust)
    assert res.converged
    np.testing.assert_allclose(res.coef, ref.params, atol=1e-8, rtol=0)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.bse, atol=1e-6, rtol=0)
    assert res.llf == pytest.approx(ref.llf, abs=1e-7)


def test_equal_to_lifelines_efron_unstratified_and_stratified(federation):
    X, t, site = pooled(federation)
    df = pd.DataFrame(X, columns=federation.feature_names).assign(time=t, site=site)
    for stratify in (False, True):
        res = CoxPH(event="event", stratify=stratify).fit(federation)
        kw = {"strata": ["site"]} if stratify else {}
        ref = lifelines.CoxPHFitter().fit(
            df if stratify else df.drop(columns="site"), "time", "event", fit_options={"precision": 1e-12}, **kw
        )
        np.testing.assert_allclose(res.coef, ref.params_.to_numpy(), atol=1e-8, rtol=0)
        np.testing.assert_allclose(res.bse.to_numpy(), ref.standard_errors_.to_numpy(), atol=1e-6, rtol=0)
        assert res.llf == pytest.approx(ref.log_likelihood_, abs=1e-7)


def test_robust_equals_lifelines_without_ties():
    fd = proportional_hazards(4, seed=5, rows=[30, 200, 700, 8])
    X, t, _ = pooled(fd)
    df = pd.DataFrame(X, columns=fd.feature_names).assign(time=t)
    ref = lifelines.CoxPHFitter().fit(df, "time", "event", robust=True, fit_options={"precision": 1e-12})
    res = CoxPH(event="event", robust=True).fit(fd)
    np.testing.assert_allclose(res.coef, ref.params_.to_numpy(), atol=1e-8, rtol=0)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.standard_errors_.to_numpy(), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def rossi():
    from lifelines.datasets import load_rossi

    r = load_rossi()
    r["site"] = np.arange(len(r)) % 4
    return r


def test_rossi_by_site_equals_lifelines(rossi):
    fd = FederatedData.from_dataframe(rossi, by="site", target="week", min_rows=1, min_cell_count=1)
    res = CoxPH(event="arrest").fit(fd)
    ref = lifelines.CoxPHFitter().fit(rossi.drop(columns="site"), "week", "arrest", fit_options={"precision": 1e-12})
    np.testing.assert_allclose(res.coef, ref.params_.to_numpy(), atol=1e-8, rtol=0)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.standard_errors_.to_numpy(), atol=1e-6, rtol=0)
    # the likelihood-ratio test against no predictor, the baseline and a new row's curve
    assert res.lr_test()["statistic"] == pytest.approx(ref.log_likelihood_ratio_test().test_statistic, abs=1e-6)
    base = ref.baseline_hazard_.loc[res.times].iloc[:, 0].to_numpy()
    np.testing.assert_allclose(res.baseline_hazard().iloc[:, 0].to_numpy(), base, atol=1e-8)
    rows = rossi[res.predictors].iloc[:3]
    curves = res.predict_survival(rows)
    np.testing.assert_allclose(curves.to_numpy(), ref.predict_survival_function(rows, times=res.times), atol=1e-7)
    ph = res.predict(rows)
    np.testing.assert_allclose(ph["mean"].to_numpy(), ref.predict_partial_hazard(rows).to_numpy(), rtol=1e-7)
    hr = res.hazard_ratios()
    assert hr.attrs["ratio"] == "hazard ratio" and np.all(hr["lower"] < hr["ratio"])


def test_reordered_columns_predict_by_name(rossi):
    fd = FederatedData.from_dataframe(rossi, by="site", target="week", min_rows=1, min_cell_count=1)
    res = CoxPH(event="arrest").fit(fd)
    rows = rossi[res.predictors].iloc[:4]
    np.testing.assert_allclose(res.predict(rows[rows.columns[::-1]])["mean"], res.predict(rows)["mean"])


def test_default_rules_refuse_risk_sets_that_set_rows_apart(rossi):
    fd = FederatedData.from_dataframe(rossi, by="site", target="week")  # min_cell_count 5
    with pytest.raises(DisclosureError, match="min_cell_count"):
        CoxPH(event="arrest").fit(fd)
    # stratified by client: no risk-set sum leaves a client; coarse bins: each group large enough
    assert CoxPH(event="arrest", stratify=True).fit(fd).converged
    assert CoxPH(event="arrest", bins=[13, 26, 39, 52]).fit(fd).converged


def test_bins_fit_the_coarsened_times(federation):
    edges = np.arange(0.5, 40.0, 0.5)
    res = CoxPH(event="event", bins=edges).fit(federation)
    X, t, _ = pooled(federation)
    ref = PHReg(edges[np.searchsorted(edges, t)], X[:, :-1], status=X[:, -1], ties="efron").fit(
        method="newton", tol=1e-13
    )
    np.testing.assert_allclose(res.coef, ref.params, atol=1e-8)


def test_clear_errors():
    fd = proportional_hazards(3, rows=40)
    with pytest.raises(DataError, match="event='status' is not a column"):
        CoxPH(event="status").fit(fd)
    X = {c: np.asarray(fd[c].X).copy() for c in fd.clients}
    y = {c: np.asarray(fd[c].y).copy() for c in fd.clients}
    bad = dict(y, site1=-y["site1"])
    with pytest.raises(DataError, match="client 'site1': time 'time' must be finite and >= 0"):
        CoxPH(event="event").fit(FederatedData(X, bad, feature_names=fd.feature_names, target_name="time", min_rows=1))
    X2 = {c: np.column_stack([x[:, :2], np.ones(len(x)), x[:, 2:]]) for c, x in X.items()}
    names = ["x0", "x1", "k", "event"]
    with pytest.raises(DataError, match="'k' is constant"):
        CoxPH(event="event").fit(FederatedData(X2, y, feature_names=names, target_name="time", min_rows=1))
    X3 = {c: np.column_stack([x[:, :-1], 2 * x[:, :1], x[:, -1:]]) for c, x in X.items()}
    with pytest.raises(DataError, match="'x2' is a linear combination"):
        CoxPH(event="event").fit(
            FederatedData(X3, y, feature_names=["x0", "x1", "x2", "event"], target_name="time", min_rows=1)
        )
    none = {c: np.column_stack([x[:, :-1], np.zeros(len(x))]) for c, x in X.items()}
    with pytest.raises(DataError, match="no row has an event"):
        CoxPH(event="event").fit(FederatedData(none, y, feature_names=fd.feature_names, target_name="time", min_rows=1))
    with pytest.raises(ValueError, match="ties"):
        CoxPH(event="event", ties="exact").fit(fd)


def test_stratified_fit_has_no_pooled_baseline(federation):
    res = CoxPH(event="event", stratify=True).fit(federation)
    with pytest.raises(ValueError, match="one baseline hazard per client"):
        res.baseline_survival()


def test_secure_aggregation_record_no_client_count_reaches_the_server(federation, record_exchanges=None):
    # every reply array of every exchange of the fit is declared summed
    from fedstats.survival import _exchanges as ex

    for cls in (ex._TimeCounts, ex._Leaving, ex._CoxCheck, ex._CoxNewton, ex._CoxStrata, ex._CoxScores):
        assert set(cls.reply_keys) == set(cls.summed_keys), cls.__name__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = CoxPH(event="event").fit(federation)
    kinds = set(res.communication.by_kind)
    assert {"design check", "time counts", "risk-set counts", "Newton rounds"} <= kinds


def test_proportional_hazards_test_equals_lifelines(rossi):
    from lifelines.statistics import proportional_hazard_test

    fd = FederatedData.from_dataframe(rossi, by="site", target="week", min_rows=1, min_cell_count=1)
    res = CoxPH(event="arrest").fit(fd)
    df = rossi.drop(columns="site")
    ref = lifelines.CoxPHFitter().fit(df, "week", "arrest", fit_options={"precision": 1e-12})
    for transform in ("km", "identity", "log"):  # Rossi's weeks are tied: each the same for tied events
        ours = res.proportional_hazards_test(fd, transform)
        theirs = proportional_hazard_test(ref, df, time_transform=transform).summary.loc[res.names]
        np.testing.assert_allclose(ours["statistic"], theirs["test_statistic"], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(ours["p_value"], theirs["p"], rtol=1e-6)


def test_proportional_hazards_test_rank_and_stratified():
    from lifelines.statistics import proportional_hazard_test

    fd = proportional_hazards(4, seed=7, rows=[30, 200, 90, 60], beta=(0.5, -0.5))  # no ties: ranks are defined
    X, t, site = pooled(fd)
    df = pd.DataFrame(X, columns=fd.feature_names).assign(time=t)
    ref = lifelines.CoxPHFitter().fit(df, "time", "event", fit_options={"precision": 1e-12})
    res = CoxPH(event="event").fit(fd)
    ours = res.proportional_hazards_test(fd, "rank")
    theirs = proportional_hazard_test(ref, df, time_transform="rank").summary.loc[res.names]
    np.testing.assert_allclose(ours["statistic"], theirs["test_statistic"], rtol=1e-6, atol=1e-8)
    # robust standard errors (lifelines' robust errors are ours where no times tie)
    ref = lifelines.CoxPHFitter().fit(df, "time", "event", robust=True, fit_options={"precision": 1e-12})
    ours = CoxPH(event="event", robust=True).fit(fd).proportional_hazards_test(fd, "km")
    theirs = proportional_hazard_test(ref, df, time_transform="km").summary.loc[res.names]
    np.testing.assert_allclose(ours["statistic"], theirs["test_statistic"], rtol=1e-6, atol=1e-8)
    strat = CoxPH(event="event", stratify=True).fit(fd)
    ref = lifelines.CoxPHFitter().fit(df.assign(site=site), "time", "event", strata=["site"],
                                      fit_options={"precision": 1e-12})  # fmt: skip
    ours = strat.proportional_hazards_test(fd, "log")
    theirs = proportional_hazard_test(ref, df.assign(site=site), time_transform="log").summary.loc[res.names]
    np.testing.assert_allclose(ours["statistic"], theirs["test_statistic"], rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="stratified fit keeps its event times"):
        strat.proportional_hazards_test(fd, "km")
