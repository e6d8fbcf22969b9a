"""The threat-model table of :mod:`fedstats.stats`: the exchanges of the descriptive
statistics and classical tests (functions, not models: no estimator to declare)."""

from __future__ import annotations

from .exchanges import dp_exchange, exchange
from .spec import Array, Disclosure

_VALUES = "where its values lie: all of them, after enough rounds"

STATS = Disclosure(
    "Descriptive statistics and tests (fedstats.stats)",
    (
        exchange(
            "counts",
            "_LevelCounts",
            "describe: once; per group and overall",
            (
                Array("rows", "its row count per group", "its row count per group"),
                Array("counts", "per group, each category's count (missing last)", "its table of counts"),
            ),
            "all",
        ),
        exchange(
            "client summaries",
            "_ClientSummaries",
            "describe(clients=True): once; a node runs it only with release_statistics = true",
            (
                Array("rows", "its row count", "its row count"),
                Array("n", "per numeric column, its count of present values", "its counts"),
                Array("mean", "per numeric column, its mean", "its means"),
                Array("ss", "per numeric column, its sum of squares about its mean", "its spread"),
                Array("counts", "per categorical column, its count of each category", "its table of counts"),
            ),
        ),
        exchange(
            "table",
            "_CrossTable",
            "chi2_test, fisher_exact, mantel_haenszel (the crude table; the strata's with strata=), "
            "proportions_test: once",
            (Array("counts", "the counts of every combination of the columns' levels", "its table of counts"),),
            "all",
        ),
        exchange(
            "moments",
            "_GroupMoments",
            "describe, ttest, paired_ttest, anova, correlation: two rounds (sums, then about the pooled means)",
            (
                Array("n", "per group and column, the count of present values", "its counts per group"),
                Array("s1", "the sum of the values (about the means sent)", "its sums per group"),
                Array("s2", "the sum of squares about the means sent", "its spread per group"),
                Array("cross", "cross-products about the means sent (correlation, paired)", "its co-variation"),
            ),
            "all",
        ),
        exchange(
            "Mantel-Haenszel terms",
            "_StrataTerms",
            "mantel_haenszel with clients as strata: two rounds (the estimate's terms, then Breslow-Day's at the "
            "pooled odds ratio)",
            (
                Array(
                    "terms",
                    "its 2x2 table's terms of the Mantel-Haenszel estimate, variance and test (a*d/n, b*c/n, ...), "
                    "or of the Breslow-Day test",
                    "its 2x2 table, nearly (ten functions of four counts)",
                ),
            ),
            "all",
        ),
        exchange(
            "quantile search",
            "_QuantileSearch",
            "quantiles, describe's quartiles: at most 16 rounds (a float64's 64 bits, 4 a round)",
            (Array("below", "per threshold, how many of its values are at or below it", _VALUES),),
            "all",
        ),
        exchange(
            "rank counts",
            "_DistinctValues",
            "mannwhitneyu, kruskal, correlation(method='spearman'), a numeric column read as categorical: at "
            "most 17 rounds",
            (
                Array("counts", "per interval of values and group, how many of its values lie in it", _VALUES),
                Array(
                    "limbs",
                    "per interval, the sums and sums of squares of the bytes of its values' keys",
                    "with `counts`: whether its values in an interval are one value, and which",
                ),
            ),
            "all",
        ),
        dp_exchange("private count", "_NoisyCount", "quantiles(dp=...): once, first", "n: 1 per present value"),
        dp_exchange(
            "private quantile search",
            "_NoisyQuantileSearch",
            "quantiles(dp=...): `rounds` rounds (default 8)",
            "below: per threshold, 1 if the value is at or below it",
        ),
    ),
    "nothing (the functions keep no state on a client).",
    note="Every reply but the per-client summaries of describe(clients=True) is summed: under secure aggregation the server learns only sums over the clients. "
    "What it learns then: the tables and moments the results are computed from; the quantiles, which are "
    "values of rows (the median of an odd number of rows is one row's value); for the rank tests, Spearman's "
    "correlation and a numeric column read as categorical, the pooled distinct values and how many rows of "
    "each group have each (the pooled empirical distribution, not who holds which value). Without secure "
    "aggregation the server sees each client's replies: for the quantile and rank searches, where the "
    "client's values lie (all of them, for the rank counts): require secure aggregation in the nodes' "
    "policies (`require_secure_aggregation = true`) for these. Each client must meet the data's disclosure "
    "rules on the columns read (rows, and every category held by at least `min_cell_count` rows, or none); "
    "a released table with a cell under `min_cell_count` is refused (the tests) or withheld (describe, with "
    "complementary suppression); no quartile is computed from fewer than `min_rows` values.",
)
