"""The threat-model table of :mod:`fedstats.stats`: the exchanges of the descriptive
statistics and classical tests (functions, not models: no estimator to declare)."""

from __future__ import annotations

from .exchanges import exchange
from .spec import Array, Disclosure

STATS = Disclosure(
    "Descriptive statistics and tests (fedstats.stats)",
    (
        exchange(
            "row count", "_RowCount", "quantiles: once, first", (Array("n", "its row count", "its row count"),), "all"
        ),
        exchange(
            "quantile bisection",
            "_Bisection",
            "quantiles: at most 64 rounds (one per bit of a float64)",
            (
                Array(
                    "below",
                    "per threshold, how many of its values are at or below it",
                    "where its values lie: all of them, after enough thresholds",
                ),
            ),
            "all",
        ),
    ),
    "nothing (the functions keep no state on a client).",
    note="What the server learns in the end: the sums, and the quantiles, which are values of rows "
    "(the median of an odd number of rows is one row's value); under secure aggregation, nothing per client.",
)
