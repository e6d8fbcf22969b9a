"""fedstats.stats on two real multi-site data sets shipped with statsmodels, with the sites as
clients, equal to scipy / statsmodels on the pooled rows: the China smoking and lung cancer
study (8 cities) and Grunfeld's investment data (11 firms)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.contingency_tables import StratifiedTable

from fedstats import FederatedData
from fedstats.stats import (
    anova,
    chi2_test,
    correlation,
    describe,
    fisher_exact,
    kruskal,
    mannwhitneyu,
    mantel_haenszel,
    paired_ttest,
    proportions_test,
    quantiles,
    ttest,
)

TOL = dict(rtol=1e-10, atol=1e-12)


def china_rows() -> pd.DataFrame:
    import statsmodels.api as sm

    t = sm.datasets.china_smoking.load_pandas().data
    rows = []
    for city, r in t.iterrows():
        for smoking in ("yes", "no"):
            for cancer in ("yes", "no"):
                n = int(r[f"smoking_{smoking}_cancer_{cancer}"])
                rows.append(pd.DataFrame({"city": [city] * n, "smoking": smoking, "cancer": cancer}))
    return pd.concat(rows, ignore_index=True)


def grunfeld() -> pd.DataFrame:
    import statsmodels.api as sm

    g = sm.datasets.grunfeld.load_pandas().data
    g["firm"] = g["firm"].astype(str)
    g["period"] = np.where(g.year < 1945, "1935-44", "1945-54")
    g["decade"] = pd.cut(g.year, [1934, 1941, 1948, 1954], labels=["35-41", "42-48", "49-54"]).astype(str)
    return g


def test_china_smoking_cities_as_clients_equal_statsmodels():
    df = china_rows()
    data = FederatedData.from_dataframe(df, by="city")
    # exposure rows (no, yes), outcome columns (no, yes): the statsmodels example's table, flipped twice
    tables = [pd.crosstab(p.smoking, p.cancer).to_numpy() for _, p in df.groupby("city", sort=False)]
    ref = StratifiedTable(np.dstack(tables).astype(float))
    res = mantel_haenszel(data, "smoking", "cancer")
    np.testing.assert_allclose(
        [res.statistic, res.p_value, res.estimate, res.details["log_odds_se"]],
        [ref.test_null_odds().statistic, ref.test_null_odds().pvalue, ref.oddsratio_pooled, ref.logodds_pooled_se],
        **TOL,
    )
    bd = ref.test_equal_odds()
    np.testing.assert_allclose(
        [res.details["homogeneity"].statistic, res.details["homogeneity"].p_value], [bd.statistic, bd.pvalue], **TOL
    )
    pooled = pd.crosstab(df.smoking, df.cancer).to_numpy()
    chi = chi2_test(data, "smoking", "cancer")
    ref_chi = stats.chi2_contingency(pooled)
    np.testing.assert_allclose([chi.statistic, chi.p_value], [ref_chi.statistic, ref_chi.pvalue], **TOL)
    fe = fisher_exact(data, "smoking", "cancer")
    ref_fe = stats.fisher_exact(pooled)
    np.testing.assert_allclose([fe.statistic, fe.p_value], [ref_fe.statistic, ref_fe.pvalue], **TOL)
    pr = proportions_test(data, "cancer", "smoking", success="yes")
    from statsmodels.stats.proportion import proportions_ztest

    counts = [((df.smoking == g) & (df.cancer == "yes")).sum() for g in ("no", "yes")]
    z, p = proportions_ztest(counts, [(df.smoking == g).sum() for g in ("no", "yes")])
    np.testing.assert_allclose([pr.statistic, pr.p_value], [z, p], **TOL)
    table = describe(data, by="smoking").to_frame()
    assert table.loc[("cancer", "n: yes"), "smoking = yes"] == pooled[1, 1]


@pytest.fixture(scope="module")
def firms():
    g = grunfeld()
    return g, FederatedData.from_dataframe(g[["firm", "invest", "value", "capital", "period", "decade"]], by="firm")


def test_grunfeld_firms_as_clients_equal_scipy(firms):
    g, data = firms
    for method, ref in (
        ("pearson", stats.pearsonr(g.value, g.invest)),
        ("spearman", stats.spearmanr(g.value, g.invest)),
    ):
        res = correlation(data, "value", "invest", method=method)
        np.testing.assert_allclose([res.statistic, res.p_value], [ref.statistic, ref.pvalue], **TOL)
    early, late = g.invest[g.period == "1935-44"], g.invest[g.period == "1945-54"]
    for equal_var in (False, True):
        res = ttest(data, "invest", "period", equal_var=equal_var)
        ref = stats.ttest_ind(early, late, equal_var=equal_var)
        np.testing.assert_allclose([res.statistic, res.p_value], [ref.statistic, ref.pvalue], **TOL)
    res = mannwhitneyu(data, "invest", "period")
    ref = stats.mannwhitneyu(early, late, method="asymptotic")
    np.testing.assert_allclose([res.statistic, res.p_value], [ref.statistic, ref.pvalue], **TOL)
    groups = [g.invest[g.decade == d] for d in ("35-41", "42-48", "49-54")]
    for fn, ref in ((anova, stats.f_oneway(*groups)), (kruskal, stats.kruskal(*groups))):
        res = fn(data, "invest", "decade")
        np.testing.assert_allclose([res.statistic, res.p_value], [ref.statistic, ref.pvalue], **TOL)
    res = paired_ttest(data, "value", "capital")
    ref = stats.ttest_rel(g.value, g.capital)
    np.testing.assert_allclose([res.statistic, res.p_value], [ref.statistic, ref.pvalue], **TOL)
    q = quantiles(data, "invest", [0.1, 0.5, 0.9])
    np.testing.assert_array_equal(q.values, np.quantile(g.invest, [0.1, 0.5, 0.9]))


def test_grunfeld_describe_equals_pandas(firms):
    g, data = firms
    t = describe(data, ["invest", "value", "capital"], by="period").to_frame()
    for label, part in (("overall", g), ("period = 1935-44", g[g.period == "1935-44"])):
        d = part[["invest", "value", "capital"]].describe()
        for var in ("invest", "value", "capital"):
            np.testing.assert_allclose(
                t.loc[var, label].loc[["n", "mean", "sd", "q1", "median", "q3"]].to_numpy(dtype=float),
                d[var].loc[["count", "mean", "std", "25%", "50%", "75%"]].to_numpy(dtype=float),
                **TOL,
            )
