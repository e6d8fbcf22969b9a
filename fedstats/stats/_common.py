"""What the tests share: the checks of their options, t-based p-values and intervals, and the
columns they read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..data import FederatedData
from ..data.validation import DataError
from ._columns import Column, resolve
from .result import ALTERNATIVES

__all__ = ["check_level", "t_p_value", "t_interval", "two_categories", "need", "numeric_column"]


def check_level(level: float, alternative: str = "two-sided") -> None:
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")


def t_p_value(t: float, df: float, alternative: str) -> float:
    """scipy's p-value of a t statistic."""
    from scipy import stats

    if alternative == "less":
        return float(stats.t.cdf(t, df))
    if alternative == "greater":
        return float(stats.t.sf(t, df))
    return float(2 * stats.t.sf(abs(t), df))


def t_interval(estimate: float, se: float, df: float, level: float, alternative: str) -> tuple[float, float]:
    """The interval of a t-based estimate (scipy's ``confidence_interval``: one-sided for a
    one-sided alternative)."""
    from scipy import stats

    if alternative == "two-sided":
        h = float(stats.t.ppf(0.5 + level / 2, df)) * se
        return estimate - h, estimate + h
    h = float(stats.t.ppf(level, df)) * se
    return (-math.inf, estimate + h) if alternative == "less" else (estimate - h, math.inf)


def two_categories(col: Column, groups: Sequence[Any] | None, n: np.ndarray) -> tuple[int, int]:
    """The positions of the two compared levels of ``col`` (``groups``, or its only two present ones)."""
    if groups is not None:
        if len(groups) != 2:
            raise ValueError(f"groups must name two levels, got {groups!r}")
        missing = [g for g in groups if g not in col.categories]
        if missing:
            raise DataError(f"column {col.name!r} has no level(s) {missing}; its levels are {list(col.categories)}")
        return col.categories.index(groups[0]), col.categories.index(groups[1])
    present = [k for k in range(col.n_categories) if n[k] > 0]
    if len(present) != 2:
        raise DataError(
            f"column {col.name!r} has {len(present)} levels with values ({[col.categories[k] for k in present]}); "
            "a two-sample test compares two: name them with groups=(a, b)"
        )
    return present[0], present[1]


def need(n: float, at_least: int, what: str) -> None:
    if n < at_least:
        raise DataError(f"{what} has {int(n)} value(s); the test needs at least {at_least}")


def numeric_column(data: FederatedData, name: str) -> Column:
    col = resolve(data, name)
    if col.categorical:
        raise DataError(f"column {name!r} is categorical (levels {list(col.categories)}); the test needs a numeric one")
    return col
