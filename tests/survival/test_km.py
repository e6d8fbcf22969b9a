"""KaplanMeier and logrank_test equal lifelines (and statsmodels' survdiff, stratified) on the
pooled rows."""

import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats.data import FederatedData
from fedstats.data.disclosure import DisclosureError
from fedstats.survival import KaplanMeier, logrank_test

lifelines = pytest.importorskip("lifelines")
from lifelines.statistics import multivariate_logrank_test  # noqa: E402
from statsmodels.duration.survfunc import survdiff  # noqa: E402


@pytest.fixture(scope="module")
def waltons():
    from lifelines.datasets import load_waltons

    w = load_waltons()
    w["E"] = w["E"].astype(float)
    w["site"] = np.arange(len(w)) % 3
    return w, FederatedData.from_dataframe(w, by="site", target="T", min_rows=1, min_cell_count=1)


@pytest.fixture(scope="module")
def rossi():
    from lifelines.datasets import load_rossi

    r = load_rossi()
    r["site"] = np.arange(len(r)) % 4
    return r, FederatedData.from_dataframe(r, by="site", target="week", min_rows=1, min_cell_count=1)


def test_curve_interval_and_median_equal_lifelines(rossi):
    r, fd = rossi
    km = KaplanMeier(event="arrest", group="fin").fit(fd)
    for g in (0, 1):
        ref = lifelines.KaplanMeierFitter().fit(r.week[r.fin == g], r.arrest[r.fin == g])
        t = km.table(g)
        np.testing.assert_array_equal(t.index.to_numpy(), ref.survival_function_.index.to_numpy())
        np.testing.assert_allclose(t["survival"], ref.survival_function_.iloc[:, 0], atol=1e-10)
        np.testing.assert_allclose(t["lower"], ref.confidence_interval_.iloc[:, 0], atol=1e-10)
        np.testing.assert_allclose(t["upper"], ref.confidence_interval_.iloc[:, 1], atol=1e-10)
        np.testing.assert_allclose(t["at_risk"], ref.event_table["at_risk"], atol=0)


def test_median_and_its_interval_equal_lifelines(waltons):
    from lifelines.utils import median_survival_times

    w, fd = waltons
    km = KaplanMeier(event="E", group="group").fit(fd)
    for g in ("control", "miR-137"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = lifelines.KaplanMeierFitter().fit(w["T"][w.group == g], w["E"][w.group == g])
            ci = median_survival_times(ref.confidence_interval_)
        med, lo, hi = km.median_survival(g)
        assert med == ref.median_survival_time_
        assert (lo, hi) == (ci.iloc[0, 0], ci.iloc[0, 1])
        times = np.linspace(0, 80, 33)
        np.testing.assert_allclose(km.survival_at(times, g), ref.survival_function_at_times(times), atol=1e-10)


@pytest.mark.parametrize("pq", [(0, 0), (1, 0), (0.5, 2)])
def test_logrank_equals_lifelines(waltons, pq):
    w, fd = waltons
    res = logrank_test(fd, "E", "group", p=pq[0], q=pq[1])
    kw = {"weightings": "fleming-harrington", "p": pq[0], "q": pq[1]} if any(pq) else {}
    ref = multivariate_logrank_test(w["T"], w["group"], w["E"], **kw)
    assert res.statistic == pytest.approx(ref.test_statistic, rel=1e-10)
    assert res.p_value == pytest.approx(ref.p_value, rel=1e-9)


def test_logrank_two_groups_rossi(rossi):
    r, fd = rossi
    res = logrank_test(fd, "arrest", "fin")
    g = r.fin == 0
    ref = lifelines.statistics.logrank_test(r.week[g], r.week[~g], r.arrest[g], r.arrest[~g])
    assert res.statistic == pytest.approx(ref.test_statistic, rel=1e-10) and res.df == 1


def test_stratified_logrank_equals_survdiff(waltons):
    w, fd = waltons
    for p in (0, 1):
        res = logrank_test(fd, "E", "group", stratify=True, p=p)
        kw = {"weight_type": "fh", "fh_p": p} if p else {}
        stat, pval = survdiff(w["T"], w["E"], w["group"], strata=w["site"], **kw)
        assert res.statistic == pytest.approx(stat, rel=1e-10)


def test_bins_coarsen_and_small_counts_are_refused(rossi):
    r, _ = rossi
    fd = FederatedData.from_dataframe(r, by="site", target="week")  # min_cell_count 5
    with pytest.raises(DisclosureError, match="bins="):
        KaplanMeier(event="arrest").fit(fd)
    edges = [13, 26, 39, 52]
    km = KaplanMeier(event="arrest", bins=edges).fit(fd)
    coarse = np.asarray(edges)[np.searchsorted(edges, r.week)]
    ref = lifelines.KaplanMeierFitter().fit(coarse, r.arrest)
    np.testing.assert_allclose(km.table()["survival"], ref.survival_function_.iloc[:, 0], atol=1e-12)
    at = km.at_risk_table([0, 13, 14, 52])
    assert list(at.iloc[:, 0]) == [432, 432, pd.Series(coarse >= 14).sum(), 432 - np.sum(coarse < 52)]


def test_no_clients_values_leave_it_in_its_final_state(rossi):
    # a remote backend sends each client's final state to the server: the searches' states (the
    # client's sorted values) must not go
    from fedstats.federation import run
    from fedstats.stats._columns import resolve
    from fedstats.stats._rounds import MAX_SPLIT_ROUNDS, _DistinctValues
    from fedstats.survival._data import columns_of
    from fedstats.survival._exchanges import _TimeCounts

    _, fd = rossi
    for alg in (_TimeCounts(columns_of(fd, "arrest", "test")), _DistinctValues(resolve(fd, "age"))):
        r = run(alg, fd, rounds=MAX_SPLIT_ROUNDS, progress=False)
        assert len(r.server_state["found"]) > 0
        assert r.client_states and all(s is None for s in r.client_states.values())


def test_two_group_logrank_gives_petos_log_hazard_ratio(rossi):
    r, fd = rossi
    res = logrank_test(fd, "arrest", "fin")
    ref = lifelines.statistics.logrank_test(
        r.week[r.fin == 0], r.week[r.fin == 1], r.arrest[r.fin == 0], r.arrest[r.fin == 1]
    )
    se = (res.upper - res.lower) / (2 * 1.959963984540054)
    assert (res.estimate / se) ** 2 == pytest.approx(ref.test_statistic, rel=1e-9)  # (O - E)^2 / V
    cox = lifelines.CoxPHFitter().fit(r[["week", "arrest", "fin"]], "week", "arrest")
    assert res.estimate == pytest.approx(cox.params_["fin"], abs=0.02) and res.estimate < 0
    assert res.estimate_name == "log hazard ratio (Peto), 1 vs 0" and res.n == len(r)
    assert logrank_test(fd, "arrest", "fin", stratify=True).n == len(r)
