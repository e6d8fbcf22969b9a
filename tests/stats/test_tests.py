"""The classical tests of fedstats.stats equal scipy's and statsmodels' on the pooled rows (to
1e-10), on seeded federations (clients of 5 to 5,000 rows, ties, missing values, unequal groups)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.contingency_tables import StratifiedTable
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint, proportions_ztest

from fedstats import FederatedData
from fedstats.data.disclosure import NO_RULES, DisclosureError
from fedstats.stats import (
    adjust,
    anova,
    chi2_test,
    correlation,
    fisher_exact,
    kruskal,
    mannwhitneyu,
    mantel_haenszel,
    paired_ttest,
    proportions_test,
    ttest,
)

TOL = dict(rtol=1e-10, atol=1e-12)
SIZES = (5, 37, 260, 5000)


def frame(seed: int, sizes=SIZES) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = []
    for k, n in enumerate(sizes):
        arm = rng.choice(["c", "t"], size=n, p=[0.7, 0.3]).astype(object)
        grp = rng.choice(["a", "b", "c"], size=n, p=[0.5, 0.3, 0.2]).astype(object)
        y = np.round(rng.normal(1.0 + 0.4 * (arm == "t") + 0.3 * k, 1.0 + (grp == "c"), size=n), 1)  # ties
        y2 = np.round(0.6 * y + rng.normal(size=n), 2)
        risk = 0.2 + 0.15 * (arm == "t") + 0.05 * k
        part = pd.DataFrame(
            {"site": f"s{k}", "y": y, "y2": y2, "arm": arm, "grp": grp, "event": (rng.random(n) < risk).astype(float)}
        )
        if n > 5:  # missing values, the 5-row client complete
            for col in ("y", "y2", "arm"):
                part.loc[rng.random(n) < 0.05, col] = np.nan if col != "arm" else None
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module", params=[0, 1])
def pooled(request):
    df = frame(request.param)
    data = FederatedData.from_dataframe(df, by="site", missing="keep", **NO_RULES)
    return df, data


def close(a, b):
    np.testing.assert_allclose(a, b, **TOL)


def col(df, name, mask=None):
    s = df[name] if mask is None else df.loc[mask, name]
    return s.dropna().to_numpy(dtype=float)


@pytest.mark.parametrize("equal_var", [False, True])
def test_two_sample_ttest(pooled, equal_var):
    df, data = pooled
    res = ttest(data, "y", "arm", equal_var=equal_var)
    ref = stats.ttest_ind(col(df, "y", df.arm == "c"), col(df, "y", df.arm == "t"), equal_var=equal_var)
    close(res.statistic, ref.statistic)
    close(res.p_value, ref.pvalue)
    close(res.df, ref.df)
    ci = ref.confidence_interval(0.95)
    close([res.lower, res.upper], [ci.low, ci.high])
    assert res.details["groups"] == ["c", "t"]
    for alternative in ("less", "greater"):
        r1 = ttest(data, "y", "arm", equal_var=equal_var, alternative=alternative, level=0.9)
        ref1 = stats.ttest_ind(
            col(df, "y", df.arm == "c"), col(df, "y", df.arm == "t"), equal_var=equal_var, alternative=alternative
        )
        close(r1.p_value, ref1.pvalue)
        ci1 = ref1.confidence_interval(0.9)
        close([r1.lower, r1.upper], [ci1.low, ci1.high])


def test_one_sample_and_paired_ttest(pooled):
    df, data = pooled
    res = ttest(data, "y", mu=1.2)
    ref = stats.ttest_1samp(col(df, "y"), 1.2)
    close([res.statistic, res.p_value, res.df], [ref.statistic, ref.pvalue, ref.df])
    ci = ref.confidence_interval(0.95)
    close([res.lower, res.upper], [ci.low, ci.high])
    res = paired_ttest(data, "y", "y2")
    both = df[["y", "y2"]].dropna()
    ref = stats.ttest_rel(both.y, both.y2)
    close([res.statistic, res.p_value, res.df], [ref.statistic, ref.pvalue, ref.df])
    ci = ref.confidence_interval(0.95)
    close([res.estimate, res.lower, res.upper], [(both.y - both.y2).mean(), ci.low, ci.high])
    assert res.n == len(both)


@pytest.mark.parametrize("equal_var", [True, False])
def test_anova(pooled, equal_var):
    df, data = pooled
    res = anova(data, "y", "grp", equal_var=equal_var)
    samples = [col(df, "y", df.grp == g) for g in ("a", "b", "c")]
    ref = stats.f_oneway(*samples, equal_var=equal_var)
    close([res.statistic, res.p_value], [ref.statistic, ref.pvalue])
    if equal_var:
        allv = np.concatenate(samples)
        between = sum(len(s) * (s.mean() - allv.mean()) ** 2 for s in samples)
        close(res.estimate, between / ((allv - allv.mean()) ** 2).sum())
    assert res.details["n"] == [len(s) for s in samples]


def test_anova_reads_a_numeric_group_column_of_codes():
    df = frame(3)
    df["code"] = df.grp.map({"a": 1, "b": 2, "c": 7}).astype(float)
    data = FederatedData.from_dataframe(df.drop(columns="grp"), by="site", missing="keep", **NO_RULES)
    res = anova(data, "y", "code")
    ref = stats.f_oneway(*[col(df, "y", df.code == g) for g in (1, 2, 7)])
    close(res.statistic, ref.statistic)
    assert res.details["groups"] == [1, 2, 7]


@pytest.mark.parametrize("method", ["pearson", "spearman"])
def test_correlation(pooled, method):
    df, data = pooled
    both = df[["y", "y2"]].dropna()
    res = correlation(data, "y", "y2", method=method)
    if method == "pearson":
        ref = stats.pearsonr(both.y, both.y2)
        ci = ref.confidence_interval(0.95)
        close([res.lower, res.upper], [ci.low, ci.high])
    else:
        ref = stats.spearmanr(both.y, both.y2)
        z, se = np.arctanh(ref.statistic), np.sqrt((1 + ref.statistic**2 / 2) / (len(both) - 3))
        close([res.lower, res.upper], np.tanh([z - 1.959963984540054 * se, z + 1.959963984540054 * se]))
    close([res.statistic, res.p_value], [ref.statistic, ref.pvalue])
    assert res.n == len(both)


def test_chi2_independence_and_goodness_of_fit(pooled):
    df, data = pooled
    res = chi2_test(data, "grp", "arm")
    obs = pd.crosstab(df.grp, df.arm).to_numpy()
    ref = stats.chi2_contingency(obs)
    close([res.statistic, res.p_value, res.df], [ref.statistic, ref.pvalue, ref.dof])
    np.testing.assert_array_equal(res.details["observed"], obs)
    close(res.estimate, stats.contingency.association(obs, method="cramer"))
    for correction in (True, False):  # a 2x2 table: Yates' correction is scipy's default
        res = chi2_test(data, "arm", "event", correction=correction)
        ref = stats.chi2_contingency(pd.crosstab(df.arm, df.event).to_numpy(), correction=correction)
        close([res.statistic, res.p_value], [ref.statistic, ref.pvalue])
    res = chi2_test(data, "grp", expected=[0.5, 0.3, 0.2])
    counts = df.grp.value_counts().sort_index().to_numpy()
    ref = stats.chisquare(counts, np.array([0.5, 0.3, 0.2]) * counts.sum())
    close([res.statistic, res.p_value], [ref.statistic, ref.pvalue])


def test_fisher_exact(pooled):
    df, data = pooled
    small = df[df.site.isin(["s0", "s1"])]
    sub = data.subset(["s0", "s1"])
    table = pd.crosstab(small.arm, small.event).to_numpy()
    for alternative in ("two-sided", "less", "greater"):
        res = fisher_exact(sub, "arm", "event", alternative=alternative)
        ref = stats.fisher_exact(table, alternative=alternative)
        close([res.statistic, res.p_value], [ref.statistic, ref.pvalue])
        ci = stats.contingency.odds_ratio(table).confidence_interval(0.95, alternative=alternative)
        close([res.lower, res.upper], [ci.low, ci.high])


@pytest.mark.parametrize("correction", [False, True])
def test_mantel_haenszel_with_clients_as_strata(pooled, correction):
    df, data = pooled
    tables = [pd.crosstab(p.arm, p.event).reindex(index=["c", "t"], columns=[0.0, 1.0], fill_value=0).to_numpy()
              for _, p in df.groupby("site", sort=False)]  # fmt: skip
    ref = StratifiedTable(np.dstack(tables).astype(float))
    res = mantel_haenszel(data, "arm", "event", correction=correction)
    t = ref.test_null_odds(correction=correction)
    close([res.statistic, res.p_value], [t.statistic, t.pvalue])
    close(res.estimate, ref.oddsratio_pooled)
    close([res.lower, res.upper], ref.oddsratio_pooled_confint(0.05))
    close(res.details["log_odds_se"], ref.logodds_pooled_se)
    for tarone in (False, True):
        h = mantel_haenszel(data, "arm", "event", tarone=tarone).details["homogeneity"]
        bd = ref.test_equal_odds(adjust=tarone)
        close([h.statistic, h.p_value], [bd.statistic, bd.pvalue])
        assert h.df == len(tables) - 1


def test_mantel_haenszel_with_a_column_as_strata(pooled):
    df, data = pooled
    tables = [pd.crosstab(p.arm, p.event).reindex(index=["c", "t"], columns=[0.0, 1.0], fill_value=0).to_numpy()
              for _, p in df.groupby("grp")]  # fmt: skip
    ref = StratifiedTable(np.dstack(tables).astype(float))
    res = mantel_haenszel(data, "arm", "event", strata="grp")
    close([res.statistic, res.estimate], [ref.test_null_odds().statistic, ref.oddsratio_pooled])
    close(res.details["homogeneity"].statistic, ref.test_equal_odds().statistic)


def test_proportions(pooled):
    df, data = pooled
    res = proportions_test(data, "event", "arm")
    ok = df.arm.notna()
    counts = [df.event[ok & (df.arm == g)].sum() for g in ("c", "t")]
    nobs = [(ok & (df.arm == g)).sum() for g in ("c", "t")]
    z, p = proportions_ztest(counts, nobs)
    close([res.statistic, res.p_value], [z, p])
    lo, hi = confint_proportions_2indep(counts[0], nobs[0], counts[1], nobs[1], method="newcomb")
    close([res.lower, res.upper], [lo, hi])
    res = proportions_test(data, "event", value=0.3, alternative="greater")
    z, p = proportions_ztest(df.event.sum(), len(df), value=0.3, alternative="larger")
    close([res.statistic, res.p_value], [z, p])
    close([res.lower, res.upper], proportion_confint(df.event.sum(), len(df), method="wilson"))


def test_rank_tests_with_ties(pooled):
    df, data = pooled
    res = mannwhitneyu(data, "y", "arm")
    ref = stats.mannwhitneyu(col(df, "y", df.arm == "c"), col(df, "y", df.arm == "t"), method="asymptotic")
    close([res.statistic, res.p_value], [ref.statistic, ref.pvalue])
    for alternative in ("less", "greater"):
        r1 = mannwhitneyu(data, "y", "arm", alternative=alternative, use_continuity=False)
        ref1 = stats.mannwhitneyu(
            col(df, "y", df.arm == "c"), col(df, "y", df.arm == "t"), method="asymptotic",
            alternative=alternative, use_continuity=False,
        )  # fmt: skip
        close([r1.statistic, r1.p_value], [ref1.statistic, ref1.pvalue])
    res = kruskal(data, "y", "grp")
    ref = stats.kruskal(*[col(df, "y", df.grp == g) for g in ("a", "b", "c")])
    close([res.statistic, res.p_value], [ref.statistic, ref.pvalue])


def test_adjust_equals_statsmodels():
    p = np.random.default_rng(0).uniform(size=40) ** 3
    p[[3, 9]] = p[5]  # ties
    for method, name in (("holm", "holm"), ("bh", "fdr_bh")):
        close(adjust(p, method), multipletests(p, method=name)[1])


def test_small_pooled_cells_are_refused_naming_the_rule_and_the_option(pooled):
    df, _ = pooled
    data = FederatedData.from_dataframe(df[df.site == "s1"], by="site", missing="keep", min_rows=1)
    with pytest.raises(DisclosureError, match=r"min_cell_count.*set min_cell_count=") as err:
        fisher_exact(data.with_rules(min_cell_count=1).with_rules(min_cell_count=40), "arm", "event")
    assert err.value.rule == "min_cell_count"
    with pytest.raises(DisclosureError, match="rule min_rows"):
        ttest(FederatedData.from_dataframe(df, by="site", missing="keep"), "y", "arm")
