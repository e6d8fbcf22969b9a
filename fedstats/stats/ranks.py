"""Rank tests from exact global ranks: the Wilcoxon-Mann-Whitney rank-sum test and the
Kruskal-Wallis test (and Spearman's correlation, in :func:`~fedstats.stats.correlation`).

No row moves: the server finds the column's distinct values and how many rows of each group
have each (:class:`~fedstats.stats._rounds._DistinctValues`: at most 17 rounds of counts in
intervals of the float64 order, summed over the clients), from which the pooled mid-ranks, the
rank sums and the tie correction follow exactly. What the server learns: the pooled distinct
values and their counts per group (under secure aggregation, not which client holds them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..data import FederatedData
from ..data.validation import DataError
from ..federation.backend import use_backend
from ._columns import Column, resolve
from ._common import check_level, need, numeric_column, two_categories
from ._rounds import Exchanges
from .result import TestResult

__all__ = ["mannwhitneyu", "kruskal", "rank_column", "mid_ranks"]


def mid_ranks(counts: np.ndarray) -> np.ndarray:
    """The mid-rank of each distinct value (in order) given how many rows have each."""
    end = np.cumsum(counts)
    return end - (counts - 1) / 2


def rank_column(ex: Exchanges, col: Column, require: Sequence[Column] = ()) -> Column:
    """``col`` as its pooled mid-ranks among the rows where it and ``require`` are present."""
    distinct, counts = ex.histogram(col, require=require)
    return replace(col, name=f"rank({col.name})", ranks=(distinct, mid_ranks(counts.sum(axis=1))))


def _group_counts(ex: Exchanges, data: FederatedData, column: str, group: str) -> tuple[Column, np.ndarray]:
    g = ex.categorical(resolve(data, group))
    _, counts = ex.histogram(numeric_column(data, column), g)
    return g, counts


def mannwhitneyu(
    data: FederatedData,
    column: str,
    group: str,
    *,
    groups: Sequence[Any] | None = None,
    use_continuity: bool = True,
    alternative: str = "two-sided",
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """The Wilcoxon-Mann-Whitney rank-sum test of ``column`` between two levels of ``group``,
    equal to ``scipy.stats.mannwhitneyu(x, y, method="asymptotic")`` (the normal approximation
    with the tie correction; ``x`` the first level). The statistic is ``U`` of the first level;
    the effect is the probability of superiority ``U / (n1 n2)`` (P(X > Y) + P(X = Y) / 2; no
    interval: NaN)."""
    check_level(level, alternative)
    from scipy import stats

    with use_backend(backend):
        ex = Exchanges(data, [numeric_column(data, column), resolve(data, group)], seed=seed, what="mannwhitneyu")
        g, counts = _group_counts(ex, data, column, group)
        i, j = two_categories(g, groups, counts.sum(axis=0))
        c = counts[:, [i, j]]
        c = c[c.sum(axis=1) > 0]
        n1, n2 = float(c[:, 0].sum()), float(c[:, 1].sum())
        need(min(n1, n2), 1, "a group")
        n = n1 + n2
        t = c.sum(axis=1)
        r1 = float((c[:, 0] * mid_ranks(t)).sum())
        u1 = r1 - n1 * (n1 + 1) / 2
        u2 = n1 * n2 - u1
        u, f = {"greater": (u1, 1), "less": (u2, 1)}.get(alternative, (max(u1, u2), 2))
        tie = float((t**3 - t).sum())
        s = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie / (n * (n - 1))))
        num = u - n1 * n2 / 2 - (0.5 if use_continuity else 0.0)
        z = num / s if s > 0 else math.copysign(math.inf, num) if num else math.nan
        p = min(max(float(stats.norm.sf(z)) * f, 0.0), 1.0)
        levels = [g.categories[i], g.categories[j]]
        return TestResult(
            "Wilcoxon-Mann-Whitney rank-sum test", u1, p, u1 / (n1 * n2),
            f"P({column} of {group} {levels[0]!r} > {levels[1]!r})", math.nan, math.nan, level, math.nan,
            "asymptotic", int(n), alternative, {"groups": levels, "n": [int(n1), int(n2)], "rank_sum": r1, "z": z},
            ex.communication,
        )  # fmt: skip


def kruskal(
    data: FederatedData, column: str, group: str, *, level: float = 0.95, seed: int = 0, backend: Any = None
) -> TestResult:
    """The Kruskal-Wallis H test of ``column`` across the levels of ``group`` (levels without
    values left out), equal to ``scipy.stats.kruskal`` (tie-corrected). The effect is epsilon
    squared, ``H / (n - 1)`` (no interval: NaN)."""
    check_level(level)
    from scipy import stats

    with use_backend(backend):
        ex = Exchanges(data, [numeric_column(data, column), resolve(data, group)], seed=seed, what="kruskal")
        g, counts = _group_counts(ex, data, column, group)
        keep = counts.sum(axis=0) > 0
        c = counts[:, keep]
        k = c.shape[1]
        if k < 2:
            raise DataError(f"column {group!r} has {k} level(s) with values; the test compares at least 2")
        t = c.sum(axis=1)
        n = float(t.sum())
        ng = c.sum(axis=0)
        R = (c * mid_ranks(t)[:, None]).sum(axis=0)
        H = 12 / (n * (n + 1)) * float((R**2 / ng).sum()) - 3 * (n + 1)
        ties = 1 - float((t**3 - t).sum()) / (n**3 - n)
        if ties == 0:
            raise DataError(f"every value of {column!r} is the same: the ranks say nothing")
        H /= ties
        return TestResult(
            "Kruskal-Wallis H test", H, float(stats.chi2.sf(H, k - 1)), H / (n - 1),
            f"epsilon squared of {column} by {group}", math.nan, math.nan, level, float(k - 1), "asymptotic",
            int(n), "two-sided",
            {"groups": [g.categories[q] for q in np.flatnonzero(keep)], "n": ng.astype(int).tolist(),
             "rank_sum": R.tolist()},
            ex.communication,
        )  # fmt: skip
