"""A federated "Table 1": per column, overall and per group, the count, the missing values, the
mean and sd (with the mean's interval), the exact quartiles, and each category's count and
percentage, equal to pandas and numpy on the pooled rows, with small cells suppressed.

Rounds (every reply summed over the clients): the rows and the categories' counts (one
round), the moments (two rounds: sums, then sums of squares about the pooled means), and the
quartiles of every numeric column in every group together (one search, at most 16 rounds);
a numeric ``by`` column first has its distinct values found (at most 17 rounds).

Disclosure (the data's rules, :mod:`fedstats.data.disclosure`): every client must meet them
on the columns described (as every function of :mod:`fedstats.stats`); in the table, a count
from 1 to ``min_cell_count - 1`` is suppressed, and so are the statistics (mean, sd, interval,
quartiles) of fewer than ``min_rows`` values; then, so that no suppressed count follows from
the others by subtraction, wherever a sum (a column's levels and missing values adding up to
the group's rows; the groups adding up to the overall count) has exactly one suppressed term,
the smallest other term is suppressed too, until no sum has one (a count withheld so takes
the mean's interval with it, whose width would give the count away). Suppressed cells are NaN in
:meth:`DescribeResult.to_frame`, marked in ``suppressed`` and printed as ``<5`` or ``--``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..data import FederatedData
from ..data.validation import DataError
from ..federation.backend import use_backend
from ._columns import Column, column_names, resolve
from ._common import check_level
from ._rounds import Exchanges, _ClientSummaries, _LevelCounts, released_rules
from .quantiles import quantile_values

__all__ = ["describe", "DescribeResult"]

_NUMERIC = ("n", "missing", "mean", "sd", "mean_lower", "mean_upper", "q1", "median", "q3")
_COUNTS = ("n", "missing")  # the numeric rows that are counts


@dataclass
class DescribeResult:
    """The table of :func:`describe`.

    ``table``: a long DataFrame, one row per (``variable``, ``statistic``) (numeric columns:
    ``n, missing, mean, sd, mean_lower, mean_upper, q1, median, q3``; categorical columns:
    ``n`` and ``percent`` per level, ``missing``), one column per group (``overall`` first);
    ``suppressed``: the same shape, True where a cell is withheld (NaN in ``table``);
    ``small``: True where a count is withheld for being small (the others in ``suppressed``
    are withheld so that it cannot be recovered by subtraction); ``rows``:
    each group's row count; ``kinds``: each variable's kind; ``level`` of the mean's interval;
    ``min_cell_count`` and ``min_rows`` the rules applied; ``communication``.
    """

    table: pd.DataFrame
    suppressed: pd.DataFrame
    small: pd.DataFrame
    rows: pd.Series
    kinds: dict[str, str]
    by: str | None
    level: float
    min_cell_count: int
    min_rows: int
    communication: Any = None

    def to_frame(self) -> pd.DataFrame:
        """The long table (suppressed cells NaN)."""
        return self.table.copy()

    def table1(self, digits: int = 2) -> pd.DataFrame:
        """The table as text, as a paper's "Table 1": ``mean (sd)``, ``median [Q1, Q3]``, the
        missing values, and ``n (%)`` per category; ``<k`` or ``--`` where suppressed, ``--``
        where not computed (a client's quartiles)."""
        t, sup = self.table, self.suppressed
        small = f"<{self.min_cell_count}"
        header = {g: (f"{g} (n={int(n)})" if not math.isnan(n) else f"{g} (n {small})") for g, n in self.rows.items()}
        lines: list[tuple[str, list[str]]] = []

        def num(v: float, s: bool) -> str:
            return "--" if s or math.isnan(v) else f"{v:.{digits}f}"

        def count(v: float, s: bool, primary: bool) -> str:
            return (small if primary else "--") if s else f"{int(v)}"

        for var, kind in self.kinds.items():
            if kind == "numeric":
                row = t.loc[var]
                srow = sup.loc[var]
                lines.append(
                    (
                        f"{var}, mean (sd)",
                        [
                            "--"
                            if srow.at["mean", g] or math.isnan(row.at["mean", g])
                            else f"{num(row.at['mean', g], False)} ({num(row.at['sd', g], srow.at['sd', g])})"
                            for g in t.columns
                        ],
                    )
                )
                lines.append(
                    (
                        "  median [Q1, Q3]",
                        [
                            "--"
                            if srow.at["median", g] or math.isnan(row.at["median", g])
                            else f"{num(row.at['median', g], False)} [{num(row.at['q1', g], False)}, "
                            f"{num(row.at['q3', g], False)}]"
                            for g in t.columns
                        ],
                    )
                )
                lines.append(
                    (
                        "  missing",
                        [
                            count(row.at["missing", g], srow.at["missing", g], self.small.at[(var, "missing"), g])
                            for g in t.columns
                        ],
                    )
                )
            else:
                lines.append((f"{var}, n (%)", [""] * len(t.columns)))
                sub, ssub = t.loc[var], sup.loc[var]
                for stat in sub.index:
                    if not stat.startswith("n: "):
                        continue
                    lev = stat[3:]
                    cells = []
                    for g in t.columns:
                        if ssub.at[stat, g]:
                            cells.append(small if self.small.at[(var, stat), g] else "--")
                        else:
                            pct = sub.at[f"percent: {lev}", g]
                            cells.append(f"{int(sub.at[stat, g])} ({pct:.1f}%)" if not math.isnan(pct) else "0")
                    lines.append((f"  {lev}", cells))
                lines.append(
                    (
                        "  missing",
                        [
                            count(sub.at["missing", g], ssub.at["missing", g], self.small.at[(var, "missing"), g])
                            for g in t.columns
                        ],
                    )
                )
        out = pd.DataFrame([c for _, c in lines], index=[name for name, _ in lines], columns=list(t.columns))
        return out.rename(columns=header)

    def __repr__(self) -> str:
        note = (
            f"(counts under {self.min_cell_count} shown as <{self.min_cell_count}; --: withheld, a statistic of "
            f"fewer than {self.min_rows} values or a count that would reveal a small one; interval of the mean at "
            f"{self.level:.0%} in to_frame())"
        )
        return self.table1().to_string() + "\n" + note

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_html(self) -> str:
        """The "Table 1" as an HTML table."""
        return self.table1().to_html(escape=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the groups and their rows, and per variable its kind and statistics
        (a suppressed cell is ``None``, listed in ``suppressed``)."""
        out: dict[str, Any] = {
            "by": self.by,
            "level": self.level,
            "rules": {"min_cell_count": self.min_cell_count, "min_rows": self.min_rows},
            "groups": [str(g) for g in self.table.columns],
            "rows": {str(g): (None if math.isnan(v) else int(v)) for g, v in self.rows.items()},
            "variables": {},
        }
        for var, kind in self.kinds.items():
            sub, ssub = self.table.loc[var], self.suppressed.loc[var]
            out["variables"][var] = {
                "kind": kind,
                "statistics": {
                    str(stat): {
                        str(g): (None if ssub.at[stat, g] or math.isnan(sub.at[stat, g]) else float(sub.at[stat, g]))
                        for g in sub.columns
                    }
                    for stat in sub.index
                },
                "suppressed": [[str(stat), str(g)] for stat in sub.index for g in sub.columns if ssub.at[stat, g]],
            }
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


def describe(
    data: FederatedData,
    columns: Sequence[str] | None = None,
    by: str | None = None,
    *,
    level: float = 0.95,
    clients: bool = False,
    seed: int = 0,
    backend: Any = None,
) -> DescribeResult:
    """A descriptive table of ``columns`` (default: every column but ``by``), over all rows
    and per level of ``by``, equal to pandas/numpy on the pooled rows (see the module docs for
    the rounds and the suppression of small cells).

    Numeric columns: ``n`` (present values), ``missing``, ``mean``, ``sd`` (``ddof=1``), the
    mean's t interval at ``level``, and the quartiles (``numpy.quantile``'s linear definition,
    exact). Categorical columns (a data frame's text or category columns): per level its count
    ``n: level`` and its share of the present values ``percent: level``, and ``missing``. Rows
    whose ``by`` is missing count in ``overall`` only.

    ``clients=True`` adds a column per client (``client = id``; its own n, missing values, mean,
    sd and interval, and counts; no quartiles: they would be the client's own rows' values),
    from an exchange whose replies are each client's statistics themselves, not sums: a node
    runs it only if its policy says ``release_statistics = true``; the same suppression applies.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> from fedstats import FederatedData
    >>> from fedstats.stats import describe
    >>> rng = np.random.default_rng(0)
    >>> df = pd.DataFrame({"site": np.repeat(["a", "b", "c"], 50), "age": rng.normal(50, 10, 150).round(),
    ...                    "sex": rng.choice(["f", "m"], 150), "arm": np.tile(["t", "c"], 75)})
    >>> tab = describe(FederatedData.from_dataframe(df, by="site"), by="arm")
    >>> float(tab.to_frame().loc[("age", "median"), "overall"]) == float(df.age.median())
    True
    """
    check_level(level)
    with use_backend(backend):
        names = [c for c in column_names(data) if c != by] if columns is None else list(columns)
        if isinstance(columns, str):
            raise DataError("columns must be a sequence of column names, not a single str")
        if by is not None and by in names:
            raise DataError(f"column {by!r} is the by column; it cannot be described in its own table")
        if not names:
            raise DataError("no columns to describe")
        cols = [resolve(data, c) for c in names]
        group0 = None if by is None else resolve(data, by)
        ex = Exchanges(data, cols + ([group0] if group0 is not None else []), seed=seed, what="describe")
        min_rows, min_cell_count = released_rules(data)
        group = None if group0 is None else ex.categorical(group0)
        numeric = [c for c in cols if not c.categorical]
        categorical = [c for c in cols if c.categorical]
        groups = ["overall"] + ([] if group is None else [f"{by} = {lv}" for lv in group.categories])
        G = len(groups)
        order = [G - 1, *range(G - 1)] if group is not None else [0]  # overall (computed last) first

        counting = _LevelCounts(categorical, group, overall=True)
        summed = ex.sums(counting, "counts")
        rows = np.asarray(summed["rows"])[order]
        tables = [t[order] for t in counting.split(summed["counts"])]

        stats_num: dict[str, np.ndarray] = {}
        if numeric:
            m = ex.moments(numeric, group, overall=True)
            stats_num = _numeric_statistics(m["n"][order], m["mean"][order], m["ss"][order], rows, level)
            cells = [(c, group if k < G - 1 else None, k) for k in range(G) for c in numeric]
            # no quartiles of fewer than min_rows values: the server would learn those rows' values
            counts = [int(v) if v >= min_rows else 0 for v in m["n"].ravel()]
            qv, _ = quantile_values(ex, cells, counts, np.array([0.25, 0.5, 0.75]), "linear")
            qv = qv.reshape(G, len(numeric), 3)[order]
            stats_num |= {"q1": qv[:, :, 0], "median": qv[:, :, 1], "q3": qv[:, :, 2]}

        table = _long_table(cols, numeric, categorical, stats_num, tables, groups)
        partitions = [list(range(1, G))] if G > 1 else []
        if clients:
            per = ex.per_client(_ClientSummaries(numeric, categorical), "client summaries")
            ids = [c for c in data.clients if c in per]
            client_table = _long_table(
                cols,
                numeric,
                categorical,
                *_client_statistics({c: per[c] for c in ids}, numeric, categorical, level),
                [f"client = {c}" for c in ids],
            )
            table = pd.concat([table, client_table], axis=1)
            partitions.append(list(range(G, G + len(ids))))
            rows = np.r_[rows, [per[c]["rows"][0] for c in ids]]
            groups = groups + list(client_table.columns)
    kinds = {c.name: "categorical" if c.categorical else "numeric" for c in cols}
    suppressed, small = _suppress(table, kinds, partitions, min_cell_count, min_rows)
    rows_s = pd.Series(rows.astype(float), index=groups)
    small_group = (rows_s > 0) & (rows_s < min_cell_count)
    rows_s[small_group] = np.nan
    return DescribeResult(
        table.mask(suppressed), suppressed, small, rows_s, kinds, by, level, min_cell_count, min_rows, ex.communication
    )


def _long_table(
    cols: Sequence[Column],
    numeric: Sequence[Column],
    categorical: Sequence[Column],
    stats_num: dict[str, np.ndarray],
    tables: Sequence[np.ndarray],
    labels: Sequence[str],
) -> pd.DataFrame:
    """The long table: one row per (variable, statistic), one column per label, from the
    numeric statistics (each ``(columns of the table, numeric columns)``) and the categorical
    columns' counts (each ``(columns of the table, levels + 1)``)."""
    index, data_rows = [], []
    for c in cols:
        if not c.categorical:
            j = list(numeric).index(c)
            for stat in _NUMERIC:
                index.append((c.name, stat))
                data_rows.append(stats_num[stat][:, j])
        else:
            t = tables[list(categorical).index(c)]
            present = t[:, :-1].sum(axis=1)
            for k, lv in enumerate(c.categories):
                index.append((c.name, f"n: {lv}"))
                data_rows.append(t[:, k])
            for k, lv in enumerate(c.categories):
                index.append((c.name, f"percent: {lv}"))
                with np.errstate(invalid="ignore", divide="ignore"):
                    data_rows.append(np.where(present > 0, 100 * t[:, k] / present, np.nan))
            index.append((c.name, "missing"))
            data_rows.append(t[:, -1])
    return pd.DataFrame(
        np.asarray(data_rows, dtype=float).reshape(len(index), len(labels)),
        index=pd.MultiIndex.from_tuples(index, names=["variable", "statistic"]),
        columns=pd.Index(list(labels), name="group"),
    )


def _numeric_statistics(
    n: np.ndarray, mean: np.ndarray, ss: np.ndarray, rows: np.ndarray, level: float
) -> dict[str, np.ndarray]:
    """n, missing, mean, sd and the mean's t interval (each ``(columns of the table, numeric columns)``)."""
    from scipy import stats

    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(ss / (n - 1))
        h = stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * sd / np.sqrt(n)
    return {
        "n": n,
        "missing": rows[:, None] - n,
        "mean": np.where(n > 0, mean, np.nan),
        "sd": np.where(n > 1, sd, np.nan),
        "mean_lower": np.where(n > 1, mean - h, np.nan),
        "mean_upper": np.where(n > 1, mean + h, np.nan),
    }


def _client_statistics(
    per: dict[Any, dict[str, np.ndarray]], numeric: Sequence[Column], categorical: Sequence[Column], level: float
) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The per-client columns' statistics (no quartiles: NaN) and counts from the clients' summaries."""
    ids = list(per)  # in the data's order (describe orders them)
    rows = np.array([per[c]["rows"][0] for c in ids])
    stack = {k: np.array([np.asarray(per[c][k], dtype=float) for c in ids]) for k in ("n", "mean", "ss")}
    out = _numeric_statistics(stack["n"].reshape(len(ids), -1), stack["mean"].reshape(len(ids), -1),
                              stack["ss"].reshape(len(ids), -1), rows, level)  # fmt: skip
    for q in ("q1", "median", "q3"):
        out[q] = np.full(out["n"].shape, np.nan)
    counts = np.array([np.asarray(per[c]["counts"], dtype=float) for c in ids]).reshape(len(ids), -1)
    ends = np.cumsum([c.n_categories + 1 for c in categorical])[:-1]
    tables = np.split(counts, ends, axis=1) if categorical else []
    return out, tables


def _suppress(
    table: pd.DataFrame, kinds: dict[str, str], partitions: list[list[int]], min_cell: int, min_rows: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cells to withhold: small counts, statistics of few values, and (complementary
    suppression) one more term of every sum with exactly one withheld term (a variable's
    counts within a column; each partition of the columns adding up to the first, overall);
    and the small counts alone."""
    values = table.to_numpy()
    sup = np.zeros(values.shape, dtype=bool)
    pos = {key: i for i, key in enumerate(table.index)}
    G = values.shape[1]
    count_rows: list[int] = []
    sums: list[tuple[list[tuple[int, int]], tuple[int, int] | None]] = []  # (terms, published total)
    for var, kind in kinds.items():
        if kind == "numeric":
            terms = [pos[var, "n"], pos[var, "missing"]]
            count_rows += terms
            for g in range(G):
                sums.append(([(r, g) for r in terms], None))  # n + missing = the group's rows
        else:
            levels = [s for (v, s) in table.index if v == var and s.startswith("n: ")]
            terms = [pos[var, s] for s in levels] + [pos[var, "missing"]]
            count_rows += terms
            for g in range(G):
                sums.append(([(r, g) for r in terms], None))
    for r in count_rows:  # the groups, and the clients, add up to overall (column 0)
        for part in partitions:
            sums.append(([(r, g) for g in part], (r, 0)))
    small = (values > 0) & (values < min_cell)
    sup[count_rows] = small[count_rows]
    primary = sup.copy()
    changed = True
    while changed:
        changed = False
        for members, total in sums:
            if sum(bool(sup[t]) for t in members) != 1:
                continue
            # the smallest other term (a non-zero one first: a zero is often known from the totals)
            open_terms = sorted((t for t in members if not sup[t]), key=lambda t: (values[t] == 0, values[t]))
            pick = open_terms[0] if open_terms else total
            if pick is None or sup[pick]:
                continue
            sup[pick] = True
            changed = True
    for var, kind in kinds.items():  # what depends on the suppressed counts
        if kind == "numeric":
            # few or a small count: every statistic; a count withheld only to protect another:
            # the mean's interval, whose width says the count
            few = (values[pos[var, "n"]] < min_rows) | primary[pos[var, "n"]]
            for stat in _NUMERIC:
                if stat not in _COUNTS:
                    sup[pos[var, stat]] |= few
            for stat in ("mean_lower", "mean_upper"):
                sup[pos[var, stat]] |= sup[pos[var, "n"]]
        else:
            for s in [s for (v, s) in table.index if v == var and s.startswith("n: ")]:
                sup[pos[var, "percent: " + s[3:]]] |= sup[pos[var, s]]
    frame = pd.DataFrame(sup, index=table.index, columns=table.columns)
    return frame, pd.DataFrame(primary, index=table.index, columns=table.columns)
