"""Tests of counts: chi-square (independence and goodness of fit), Fisher's exact test, the
Mantel-Haenszel pooled odds ratio with the Breslow-Day test of homogeneity, and tests of
proportions. The clients send counts (summed over the clients); a pooled table with a cell
below the data's ``min_cell_count`` (and above 0) is refused, naming the rule and the option.
With clients as the strata of a Mantel-Haenszel analysis, no client's table leaves it: each
sends its terms of the estimate, the variance and the tests, summed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..data import FederatedData
from ..data.validation import DataError
from ..federation.backend import use_backend
from ._columns import Column, resolve
from ._common import check_level, two_categories
from ._rounds import (
    BD_TERMS,
    MH_TERMS,
    Exchanges,
    _CrossTable,
    _StrataTerms,
    bd_terms,
    disclosure_refusal,
    mh_terms,
    released_rules,
)
from .bayes import log_odds_ratio_posterior
from .result import TestResult

__all__ = ["chi2_test", "fisher_exact", "mantel_haenszel", "proportions_test", "contingency_table"]


def _check_cells(table: np.ndarray, data: FederatedData, what: str, labels: Sequence[Sequence[Any]]) -> None:
    min_cell_count = released_rules(data)[1]
    small = (table > 0) & (table < min_cell_count)
    if small.any():
        at = tuple(int(i[0]) for i in np.nonzero(small))
        cell = "(" + ", ".join(repr(labels[k][i]) for k, i in enumerate(at)) + ")"
        raise disclosure_refusal(what, cell, int(table[at]), min_cell_count)


def contingency_table(ex: Exchanges, columns: Sequence[Column]) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """The pooled table of ``columns`` (categorical) over the rows complete in all of them, and
    each column's categories."""
    counts = np.rint(ex.sums(_CrossTable(columns), "counts")["counts"]).astype(np.int64)
    return counts[tuple(slice(0, c.n_categories) for c in columns)], [c.categories for c in columns]


def _binary(col: Column, what: str) -> None:
    if col.n_categories != 2:
        raise DataError(f"{what} needs two levels of {col.name!r}; it has {col.n_categories}: {list(col.categories)}")


def _drop_empty(table: np.ndarray, levels: list) -> tuple[np.ndarray, list]:
    """The table without levels that no complete row has (scipy refuses a zero margin)."""
    out_levels = []
    for axis in range(table.ndim):
        other = tuple(a for a in range(table.ndim) if a != axis)
        keep = table.sum(axis=other) > 0
        table = np.compress(keep, table, axis=axis)
        out_levels.append(tuple(lv for lv, k in zip(levels[axis], keep, strict=True) if k))
    return table, out_levels


def chi2_test(
    data: FederatedData,
    a: str,
    b: str | None = None,
    *,
    expected: Sequence[float] | None = None,
    correction: bool = True,
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """Pearson's chi-square test: of independence of the categorical columns ``a`` and ``b``
    (``scipy.stats.chi2_contingency``, Yates' correction for a 2x2 table unless
    ``correction=False``; the effect is Cramér's V, no interval), or, with ``b=None`` and
    ``expected`` (proportions or counts, one per level of ``a``), of goodness of fit
    (``scipy.stats.chisquare``; the effect is Cohen's w). A numeric column of codes is read
    as categorical (its distinct values, at most 50). Levels that no complete row has are left
    out; ``details`` holds the observed and expected tables."""
    check_level(level)
    from scipy import stats

    with use_backend(backend):
        cols = [resolve(data, a)] + ([] if b is None else [resolve(data, b)])
        ex = Exchanges(data, cols, seed=seed, what="chi2_test")
        cols = [ex.categorical(c) for c in cols]
        table, levels = contingency_table(ex, cols)
        if b is None:
            if expected is None:
                raise ValueError("a goodness-of-fit test needs expected= (one proportion or count per level)")
            f_exp = np.asarray(expected, dtype=float)
            if f_exp.shape != table.shape:
                raise ValueError(f"expected has {f_exp.size} values; {a!r} has {table.size} levels {list(levels[0])}")
            n = float(table.sum())
            f_exp = f_exp / f_exp.sum() * n
            _check_cells(table, data, "chi2_test", levels)
            res = stats.chisquare(table, f_exp)
            w = math.sqrt(float(res.statistic) / n)
            return TestResult(
                "chi-square goodness-of-fit test", float(res.statistic), float(res.pvalue), w,
                f"Cohen's w of {a}", math.nan, math.nan, level, float(table.size - 1), "pearson", int(n),
                "two-sided", {"categories": list(levels[0]), "observed": table, "expected": f_exp}, ex.communication,
            )  # fmt: skip
        if expected is not None:
            raise ValueError("expected= is for a goodness-of-fit test (b=None)")
        table, levels = _drop_empty(table, levels)
        if min(table.shape) < 2:
            raise DataError(f"the table of {a!r} and {b!r} has shape {table.shape}: nothing to test")
        _check_cells(table, data, "chi2_test", levels)
        res = stats.chi2_contingency(table, correction=correction)
        v = float(stats.contingency.association(table, method="cramer"))
        return TestResult(
            "chi-square test of independence", float(res.statistic), float(res.pvalue), v,
            f"Cramér's V of {a} and {b}", math.nan, math.nan, level, float(res.dof),
            "yates" if correction and table.shape == (2, 2) else "pearson", int(table.sum()), "two-sided",
            {"categories": [list(lv) for lv in levels], "observed": table, "expected": res.expected_freq},
            ex.communication,
        )  # fmt: skip


def fisher_exact(
    data: FederatedData,
    a: str,
    b: str,
    *,
    alternative: str = "two-sided",
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """Fisher's exact test of the 2x2 table of ``a`` (rows) and ``b`` (columns), levels in their
    order: the statistic and p-value of ``scipy.stats.fisher_exact``; the effect is the
    conditional maximum-likelihood odds ratio with its exact interval
    (``scipy.stats.contingency.odds_ratio``); ``details["bayes"]`` the posterior of the log odds
    ratio under Jeffreys priors (:mod:`fedstats.stats.bayes`)."""
    check_level(level, alternative)
    from scipy import stats

    with use_backend(backend):
        cols = [resolve(data, a), resolve(data, b)]
        ex = Exchanges(data, cols, seed=seed, what="fisher_exact")
        cols = [ex.categorical(c) for c in cols]
        for c in cols:
            _binary(c, "fisher_exact")
        table, levels = contingency_table(ex, cols)
        _check_cells(table, data, "fisher_exact", levels)
        res = stats.fisher_exact(table, alternative=alternative)
        orr = stats.contingency.odds_ratio(table.astype(np.int64))
        ci = orr.confidence_interval(confidence_level=level, alternative=alternative)
        return TestResult(
            "Fisher's exact test", float(res.statistic), float(res.pvalue), float(orr.statistic),
            f"odds ratio of {b} = {levels[1][1]!r}, {a} {levels[0][1]!r} vs {levels[0][0]!r} (conditional MLE)", float(ci.low), float(ci.high), level,
            math.nan, "exact", int(table.sum()), alternative,
            {"categories": [list(lv) for lv in levels], "observed": table,
             "bayes": log_odds_ratio_posterior(table[1, 1], table[1].sum(), table[0, 1], table[0].sum(), level)},
            ex.communication,
        )  # fmt: skip


def mantel_haenszel(
    data: FederatedData,
    exposure: str,
    outcome: str,
    strata: str | None = None,
    *,
    correction: bool = False,
    tarone: bool = False,
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """The Mantel-Haenszel analysis of 2x2 tables (``exposure`` rows, ``outcome`` columns, two
    levels each) over strata: the clients (``strata=None``, the default: no client's table
    leaves it) or the levels of a categorical column. Equal to statsmodels'
    ``StratifiedTable``: the statistic and p-value are the Cochran-Mantel-Haenszel test of a
    common odds ratio of 1 (``test_null_odds``, with ``correction``), the estimate is the
    pooled odds ratio with its Robins-Breslow-Greenland interval, and
    ``details["homogeneity"]`` is the Breslow-Day test that the strata share one odds ratio
    (``test_equal_odds``, Tarone's adjustment with ``tarone=True``), over the strata with no
    empty row or column. ``details`` also holds the crude pooled table."""
    check_level(level)
    from scipy import stats

    with use_backend(backend):
        cols = [resolve(data, exposure), resolve(data, outcome)]
        ex = Exchanges(data, cols + ([resolve(data, strata)] if strata else []), seed=seed, what="mantel_haenszel")
        e, o = (ex.categorical(c) for c in cols)
        _binary(e, "mantel_haenszel")
        _binary(o, "mantel_haenszel")
        crude, levels = contingency_table(ex, [e, o])
        _check_cells(crude, data, "mantel_haenszel", levels)
        if strata is None:
            terms = ex.sums(_StrataTerms(e, o), "Mantel-Haenszel terms")["terms"]
        else:
            s = ex.categorical(resolve(data, strata))
            tables, _ = contingency_table(ex, [s, e, o])
            terms = sum((mh_terms(t) for t in tables), np.zeros(len(MH_TERMS)))
        T = dict(zip(MH_TERMS, terms, strict=True))
        if T["ad_n"] == 0 or T["bc_n"] == 0:
            raise DataError("the pooled odds ratio is 0 or infinite: a cell is empty in every stratum")
        odds = T["ad_n"] / T["bc_n"]
        var = (
            T["apd_ad_n2"] / T["ad_n"] ** 2
            + (T["apd_bc_n2"] + T["ad_n_rest"]) / (T["ad_n"] * T["bc_n"])
            + T["bc_n_rest"] / T["bc_n"] ** 2
        ) / 2
        se = math.sqrt(var)
        z = float(stats.norm.ppf(0.5 + level / 2))
        num = abs(T["a"] - T["e_a"]) - (0.5 if correction else 0.0)
        chi2 = num**2 / T["var_a"]
        if strata is None:
            bd = ex.sums(_StrataTerms(e, o, odds), "Breslow-Day terms")["terms"]
        else:
            bd = sum((bd_terms(t, odds) for t in tables), np.zeros(len(BD_TERMS)))
        B = dict(zip(BD_TERMS, bd, strict=True))
        bd_stat = B["chi2"] - (B["diff"] ** 2 / B["var"] if tarone else 0.0)
        k = round(B["strata"])
        homogeneity = TestResult(
            "Breslow-Day test of homogeneity" + (" (Tarone)" if tarone else ""), float(bd_stat),
            float(stats.chi2.sf(bd_stat, k - 1)) if k > 1 else math.nan, odds, "common odds ratio",
            level=level, df=float(k - 1), method="tarone" if tarone else "breslow-day", n=int(crude.sum()),
        )  # fmt: skip
        return TestResult(
            "Mantel-Haenszel test", float(chi2), float(stats.chi2.sf(chi2, 1)), float(odds),
            f"pooled odds ratio of {outcome} = {levels[1][1]!r}, {exposure} {levels[0][1]!r} vs {levels[0][0]!r}",
            math.exp(math.log(odds) - z * se), math.exp(math.log(odds) + z * se), level, 1.0,
            "cmh" + (" (continuity)" if correction else ""), int(crude.sum()), "two-sided",
            {"homogeneity": homogeneity, "strata": round(T["strata"]), "log_odds_se": se, "crude": crude,
             "categories": [list(lv) for lv in levels], "strata_by": strata or "client"},
            ex.communication,
        )  # fmt: skip


def _wilson(count: float, n: float, z: float) -> tuple[float, float]:
    p = count / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return center - half, center + half


def proportions_test(
    data: FederatedData,
    column: str,
    group: str | None = None,
    *,
    value: float | None = None,
    success: Any = None,
    groups: Sequence[Any] | None = None,
    alternative: str = "two-sided",
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """The z-test of a proportion (``column`` = ``success``, by default its last level; a 0/1
    column's 1), as statsmodels' ``proportions_ztest``: one sample against ``value`` (the
    estimate is the proportion with its Wilson interval), or two levels of ``group``
    (pooled under the null; the estimate is the difference of the proportions, first level
    minus second, with Newcomb's hybrid score interval, statsmodels'
    ``confint_proportions_2indep`` default; ``details["bayes"]``: the posterior of the log odds
    ratio of the two groups under Jeffreys priors)."""
    check_level(level, alternative)
    from scipy import stats

    with use_backend(backend):
        cols = [resolve(data, column)] + ([] if group is None else [resolve(data, group)])
        ex = Exchanges(data, cols, seed=seed, what="proportions_test")
        cols = [ex.categorical(c) for c in cols]
        y = cols[0]
        _binary(y, "proportions_test")
        s = y.n_categories - 1 if success is None else _category_index(y, success)
        table, levels = contingency_table(ex, cols[::-1] if group else cols)
        _check_cells(table, data, "proportions_test", levels)
        z_level = float(stats.norm.ppf(0.5 + level / 2))

        def p_of(z: float) -> float:
            if alternative == "less":
                return float(stats.norm.cdf(z))
            return float(stats.norm.sf(z)) if alternative == "greater" else float(2 * stats.norm.sf(abs(z)))

        if group is None:
            count, n = float(table[s]), float(table.sum())
            p = count / n
            v = 0.5 if value is None else float(value)
            z = (p - v) / math.sqrt(p * (1 - p) / n)
            lo, hi = _wilson(count, n, z_level)
            return TestResult(
                "one-sample z-test of a proportion", z, p_of(z), p, f"proportion of {column} = {y.categories[s]!r}",
                lo, hi, level, math.nan, "wald", int(n), alternative, {"count": count, "value": v},
                ex.communication,
            )  # fmt: skip
        g = cols[1]
        i, j = two_categories(g, groups, table.sum(axis=1))
        c1, n1, c2, n2 = float(table[i, s]), float(table[i].sum()), float(table[j, s]), float(table[j].sum())
        p1, p2 = c1 / n1, c2 / n2
        pooled = (c1 + c2) / (n1 + n2)
        v = 0.0 if value is None else float(value)
        z = (p1 - p2 - v) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
        l1, u1 = _wilson(c1, n1, z_level)
        l2, u2 = _wilson(c2, n2, z_level)
        d = p1 - p2
        lo, hi = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
        return TestResult(
            "two-sample z-test of proportions", z, p_of(z), d,
            f"difference of proportions of {column} = {y.categories[s]!r} ({group} {g.categories[i]!r} - {g.categories[j]!r})",
            lo, hi, level, math.nan, "pooled", int(n1 + n2), alternative,
            {"groups": [g.categories[i], g.categories[j]], "count": [c1, c2], "n": [int(n1), int(n2)],
             "bayes": log_odds_ratio_posterior(c1, n1, c2, n2, level)},
            ex.communication,
        )  # fmt: skip


def _category_index(col: Column, value: Any) -> int:
    for k, lv in enumerate(col.categories):
        if lv == value:
            return k
    raise DataError(f"column {col.name!r} has no category {value!r}; its categories are {list(col.categories)}")
