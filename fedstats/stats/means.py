"""Tests of means and correlations from summed moments: t-tests (one- and two-sample, Welch
and Student, paired), one-way ANOVA (and Welch's), Pearson's correlation. Every client sends,
per group and column, its count, sum and (about the pooled means the server sends back) sum
of squares and cross-products, all summed; the statistics equal scipy's on the pooled rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..data import FederatedData
from ..data.validation import DataError
from ..federation.backend import use_backend
from ._columns import Column, resolve
from ._common import check_level, need, numeric_column, t_interval, t_p_value, two_categories
from ._rounds import Exchanges
from .bayes import difference_posterior, mean_posterior
from .ranks import rank_column
from .result import TestResult

__all__ = ["ttest", "paired_ttest", "anova", "correlation"]


def ttest(
    data: FederatedData,
    column: str,
    group: str | None = None,
    *,
    mu: float = 0.0,
    equal_var: bool = False,
    groups: Sequence[Any] | None = None,
    alternative: str = "two-sided",
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """A t-test of ``column``'s mean: one-sample (``group=None``: the mean against ``mu``,
    as ``scipy.stats.ttest_1samp``) or two-sample (the means of two levels of ``group``, as
    ``scipy.stats.ttest_ind``: Welch's by default, Student's with ``equal_var=True``).

    The estimate is the mean (one sample) or the difference of the two means (first level minus
    second; the levels in their order, or as ``groups=(a, b)`` gives them), with its t interval.
    Rows missing ``column`` (or ``group``) are left out, as scipy's ``nan_policy="omit"``.
    ``details`` holds each group's n, mean and sd, and ``details["bayes"]`` the Bayesian
    comparison (:mod:`fedstats.stats.bayes`): the posterior mean, central credible interval
    and the posterior probability that the mean (difference) is above ``mu``.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> from fedstats import FederatedData
    >>> from fedstats.stats import ttest
    >>> rng = np.random.default_rng(1)
    >>> df = pd.DataFrame({"site": np.repeat(["a", "b", "c"], 40), "arm": np.tile(["t", "c"], 60),
    ...                    "y": rng.normal(size=120)})
    >>> data = FederatedData.from_dataframe(df, by="site")
    >>> res = ttest(data, "y", "arm")
    >>> from scipy import stats
    >>> ref = stats.ttest_ind(df.y[df.arm == "c"], df.y[df.arm == "t"], equal_var=False)
    >>> bool(abs(res.statistic - ref.statistic) < 1e-10 and abs(res.p_value - ref.pvalue) < 1e-10)
    True
    """
    check_level(level, alternative)
    with use_backend(backend):
        y = numeric_column(data, column)
        if group is None:
            ex = Exchanges(data, [y], seed=seed, what="ttest")
            m = ex.moments([y])
            n, mean, ss = float(m["n"][0, 0]), float(m["mean"][0, 0]), float(m["ss"][0, 0])
            need(n, 2, f"column {column!r}")
            sd = math.sqrt(ss / (n - 1))
            se = sd / math.sqrt(n)
            t = (mean - mu) / se
            lo, hi = t_interval(mean, se, n - 1, level, alternative)
            return TestResult(
                "one-sample t-test",
                t,
                t_p_value(t, n - 1, alternative),
                mean,
                f"mean of {column}",
                lo,
                hi,
                level,
                n - 1,
                f"t-test of mean = {mu:g}",
                int(n),
                alternative,
                {
                    "mu": mu,
                    "mean": mean,
                    "sd": sd,
                    "bayes": mean_posterior(mean, sd, n, level, mu, f"mean of {column}"),
                },
                ex.communication,
            )
        ex = Exchanges(data, [y, g0 := resolve(data, group)], seed=seed, what="ttest")
        g = ex.categorical(g0)
        m = ex.moments([y], g)
        ns, means, sss = m["n"][:, 0], m["mean"][:, 0], m["ss"][:, 0]
        i, j = two_categories(g, groups, ns)
        for k in (i, j):
            need(ns[k], 2, f"group {g.categories[k]!r} of {group!r}")
        v1, v2 = sss[i] / (ns[i] - 1), sss[j] / (ns[j] - 1)
        diff = means[i] - means[j] - mu
        if equal_var:
            df = ns[i] + ns[j] - 2
            sp = ((ns[i] - 1) * v1 + (ns[j] - 1) * v2) / df
            se = math.sqrt(sp * (1 / ns[i] + 1 / ns[j]))
            name = "Student's two-sample t-test"
        else:
            a, b = v1 / ns[i], v2 / ns[j]
            se = math.sqrt(a + b)
            df = (a + b) ** 2 / (a**2 / (ns[i] - 1) + b**2 / (ns[j] - 1))
            name = "Welch's two-sample t-test"
        t = diff / se
        lo, hi = t_interval(means[i] - means[j], se, df, level, alternative)
        levels = (g.categories[i], g.categories[j])
        return TestResult(
            name,
            float(t),
            t_p_value(t, df, alternative),
            float(means[i] - means[j]),
            f"difference of means of {column} ({group} {levels[0]!r} - {levels[1]!r})",
            float(lo),
            float(hi),
            level,
            float(df),
            "student" if equal_var else "welch",
            int(ns[i] + ns[j]),
            alternative,
            {
                "groups": list(levels),
                "n": [int(ns[i]), int(ns[j])],
                "mean": [float(means[i]), float(means[j])],
                "sd": [math.sqrt(v1), math.sqrt(v2)],
                "mu": mu,
                "bayes": difference_posterior(
                    means[i], math.sqrt(v1), ns[i], means[j], math.sqrt(v2), ns[j], level, equal_var, mu
                ),
            },
            ex.communication,
        )


def paired_ttest(
    data: FederatedData,
    a: str,
    b: str,
    *,
    mu: float = 0.0,
    alternative: str = "two-sided",
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """The paired t-test of the columns ``a`` and ``b`` of the same rows (``scipy.stats.ttest_rel``):
    a one-sample t-test of ``a - b`` on the rows where both are present. The estimate is the mean
    difference with its t interval; ``details["bayes"]`` its posterior (as :func:`ttest`'s)."""
    check_level(level, alternative)
    with use_backend(backend):
        ca, cb = numeric_column(data, a), numeric_column(data, b)
        d = Column(f"{a} - {b}", ca.index, minus=cb)
        ex = Exchanges(data, [ca, cb], seed=seed, what="paired_ttest")
        m = ex.moments([d])
        n, mean, ss = float(m["n"][0, 0]), float(m["mean"][0, 0]), float(m["ss"][0, 0])
        need(n, 2, f"the pairs of {a!r} and {b!r}")
        se = math.sqrt(ss / (n - 1)) / math.sqrt(n)
        t = (mean - mu) / se
        lo, hi = t_interval(mean, se, n - 1, level, alternative)
        return TestResult(
            "paired t-test",
            t,
            t_p_value(t, n - 1, alternative),
            mean,
            f"mean difference {a} - {b}",
            lo,
            hi,
            level,
            n - 1,
            "paired",
            int(n),
            alternative,
            {
                "mu": mu,
                "sd": math.sqrt(ss / (n - 1)),
                "bayes": mean_posterior(mean, math.sqrt(ss / (n - 1)), n, level, mu, f"mean difference {a} - {b}"),
            },
            ex.communication,
        )


def anova(
    data: FederatedData,
    column: str,
    group: str,
    *,
    equal_var: bool = True,
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """One-way analysis of variance of ``column`` across the levels of ``group``
    (``scipy.stats.f_oneway``; Welch's ANOVA with ``equal_var=False``). The effect is eta
    squared (the share of the sum of squares between the groups; its interval is not computed:
    NaN). Levels without values are left out. ``details`` holds each group's n, mean and sd."""
    check_level(level)
    from scipy import stats

    with use_backend(backend):
        y = numeric_column(data, column)
        ex = Exchanges(data, [y, g0 := resolve(data, group)], seed=seed, what="anova")
        g = ex.categorical(g0)
        m = ex.moments([y], g)
        n_all, mean_all, ss_all = m["n"][:, 0], m["mean"][:, 0], m["ss"][:, 0]
        keep = n_all > 0
        n, mean, ss = n_all[keep], mean_all[keep], ss_all[keep]
        k, N = len(n), float(n.sum())
        if k < 2:
            raise DataError(f"column {group!r} has {k} level(s) with values; an ANOVA compares at least 2")
        grand = float((n * mean).sum() / N)
        between = float((n * (mean - grand) ** 2).sum())
        within = float(ss.sum())
        if equal_var:
            df = (float(k - 1), N - k)
            F = (between / df[0]) / (within / df[1])
            name = "one-way ANOVA"
        else:
            if np.any(n < 2):
                raise DataError("Welch's ANOVA needs at least 2 values in every group")
            var = ss / (n - 1)
            w = n / var
            mw = float((w * mean).sum() / w.sum())
            A = float((w * (mean - mw) ** 2).sum()) / (k - 1)
            tmp = float(((1 - w / w.sum()) ** 2 / (n - 1)).sum()) / (k**2 - 1)
            F = A / (1 + 2 * (k - 2) * tmp)
            df = (float(k - 1), 1 / (3 * tmp))
            name = "Welch's ANOVA"
        levels = [g.categories[i] for i in np.flatnonzero(keep)]
        return TestResult(
            name,
            float(F),
            float(stats.f.sf(F, *df)),
            between / (between + within),
            f"eta squared of {column} by {group}",
            math.nan,
            math.nan,
            level,
            df,
            "anova" if equal_var else "welch",
            int(N),
            "two-sided",
            {
                "groups": levels,
                "n": n.astype(int).tolist(),
                "mean": mean.tolist(),
                "sd": np.sqrt(ss / np.maximum(n - 1, 1)).tolist(),
            },
            ex.communication,
        )


def correlation(
    data: FederatedData,
    x: str,
    y: str,
    *,
    method: str = "pearson",
    alternative: str = "two-sided",
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """The correlation of columns ``x`` and ``y`` over the rows where both are present, and the
    test of zero correlation: ``method="pearson"`` (``scipy.stats.pearsonr``, its interval by
    Fisher's z as scipy's ``confidence_interval``) or ``"spearman"`` (``scipy.stats.spearmanr``:
    Pearson's correlation of the exact global mid-ranks, which the clients compute from the
    pooled distinct values and counts; its interval by Fisher's z with the Bonett-Wright
    standard error ``sqrt((1 + r^2 / 2) / (n - 3))``)."""
    check_level(level, alternative)
    if method not in ("pearson", "spearman"):
        raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
    from scipy import stats

    with use_backend(backend):
        cx, cy = numeric_column(data, x), numeric_column(data, y)
        ex = Exchanges(data, [cx, cy], seed=seed, what="correlation")
        if method == "pearson":
            m = ex.moments([cx, cy], complete=True)
        else:
            rx, ry = rank_column(ex, cx, require=[cy]), rank_column(ex, cy, require=[cx])
            m = ex.moments([rx, ry], complete=True)
        n = float(m["n"][0, 0])
        need(n, 3, f"the pairs of {x!r} and {y!r}")
        C = m["cross"][0]
        r = float(C[0, 1] / math.sqrt(C[0, 0] * C[1, 1]))
        r = max(min(r, 1.0), -1.0)
        if method == "pearson":
            dist = stats.beta(n / 2 - 1, n / 2 - 1, loc=-1, scale=2)
            p = {"less": dist.cdf(r), "greater": dist.sf(r)}.get(alternative, 2 * dist.cdf(-abs(r)))
            se = 1 / math.sqrt(n - 3)
            name = "Pearson's correlation"
        else:
            with np.errstate(divide="ignore"):
                t = r * math.sqrt((n - 2) / ((r + 1.0) * (1.0 - r))) if abs(r) < 1 else math.copysign(math.inf, r)
            p = t_p_value(t, n - 2, alternative)
            se = math.sqrt((1 + r * r / 2) / (n - 3))
            name = "Spearman's rank correlation"
        lo, hi = _fisher_interval(r, se, level, alternative)
        return TestResult(
            name, r, float(p), r, f"{method} correlation of {x} and {y}", lo, hi, level, n - 2, method, int(n),
            alternative, {}, ex.communication,
        )  # fmt: skip


def _fisher_interval(r: float, se: float, level: float, alternative: str) -> tuple[float, float]:
    from scipy import stats

    z = math.atanh(r) if abs(r) < 1 else math.copysign(math.inf, r)
    if alternative == "two-sided":
        h = float(stats.norm.ppf(0.5 + level / 2)) * se
        return math.tanh(z - h), math.tanh(z + h)
    h = float(stats.norm.ppf(level)) * se
    return (-1.0, math.tanh(z + h)) if alternative == "less" else (math.tanh(z - h), 1.0)
