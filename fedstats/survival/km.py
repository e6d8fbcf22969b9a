"""The pooled Kaplan-Meier curve and the log-rank test, from summed counts at the times.

The server finds the distinct times of the pooled rows and, at each, how many rows of each group
have an event and how many are censored (:class:`~fedstats.survival._exchanges._TimeCounts`, a
search on summed counts; with ``bins=``, one round of counts in public bins, each time coarsened
to the upper edge of its bin). The curve, its Greenwood interval and the log-rank test follow
from those counts exactly as from the pooled rows: equal to lifelines' ``KaplanMeierFitter`` and
``logrank_test``. ``stratify=True`` makes each client a stratum of the log-rank test: a client
sends only its own observed-minus-expected counts and variance, summed, and no time leaves it.

What the server learns (exact times): every distinct time of the pooled rows and the summed
counts of events and censored rows at it, per group. The data's ``min_cell_count`` applies to
those counts: a time with 1 to ``min_cell_count - 1`` events or censored rows is refused before
anything is returned, naming ``bins=`` (coarser times) and the rule.

Example
-------
>>> import numpy as np
>>> from fedstats.data import FederatedData
>>> from fedstats.survival import KaplanMeier
>>> rng = np.random.default_rng(0)
>>> parts = []
>>> for _ in range(3):
...     t = np.ceil(rng.exponential(10, 200))
...     parts.append((rng.integers(0, 2, (200, 1)).astype(float), t))
>>> fd = FederatedData.from_arrays([X for X, _ in parts], [t for _, t in parts], feature_names=["E"], target_name="T")
>>> km = KaplanMeier(event="E", bins=[5, 10, 20, 200]).fit(fd)  # exact days: too few rows on most
>>> km.table()["at_risk"].tolist()
[600.0, 600.0, 385.0, 236.0, 84.0]
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .._tails import chi2_sf, norm_ppf
from ..data import FederatedData
from ..data.disclosure import DisclosureError
from ..federation.backend import use_backend
from ..results import check_level
from ..stats._columns import Column, resolve
from ..stats._rounds import MAX_SPLIT_ROUNDS, Exchanges, released_rules
from ..stats._rounds import _value as order_value
from ..stats.result import TestResult
from ._data import SurvivalColumns, columns_of
from ._exchanges import _BinnedCounts, _LogRankStrata, _TimeCounts
from ._partial import logrank_terms, risk_table

__all__ = ["KaplanMeier", "KaplanMeierResult", "logrank_test"]


def time_counts(ex: Exchanges, spec: SurvivalColumns, events_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(times (m,), counts)``: the distinct (event) times and the summed counts at each
    (:class:`_TimeCounts`); with ``spec.bins``, the bin edges that hold rows."""
    if spec.bins is not None and not events_only:
        counts = ex.sums(_BinnedCounts(spec), "binned counts")["counts"]
        keep = counts.sum(axis=1) > 0
        return np.asarray(spec.bins)[keep], counts[keep]
    s = ex.iterate(_TimeCounts(spec, events_only), MAX_SPLIT_ROUNDS, "time counts")
    assert len(s["lo"]) == 0, "the interval search did not end on single times"
    order = np.argsort(s["found"])
    return order_value(s["found"][order]), s["found_counts"][order]


def check_counts(counts: np.ndarray, min_cell_count: int, what: str, times: np.ndarray, public: bool = False) -> None:
    """Refuse counts at a time of 1 .. ``min_cell_count - 1`` rows (a small cell). With
    ``public`` times (bin edges the user chose) the message names the bins; exact times it
    never names."""
    small = ((counts > 0) & (counts < min_cell_count)).any(axis=1)
    if small.any():
        where = f"bin(s) ending at {', '.join(f'{t:g}' for t in times[small])}" if public else "time(s)"
        raise DisclosureError(
            f"{what} refuses to release counts at {int(small.sum())} of {len(times)} {where}: held by fewer than "
            f"{min_cell_count} rows (rule min_cell_count): coarsen the times with bins=[...] (each time becomes the "
            "upper edge of its bin; wider bins where they are named), or allow it with "
            "data.with_rules(min_cell_count=1) (--min-cell-count 1 on the command line)",
            "min_cell_count",
            None,
        )


@dataclass(repr=False)
class KaplanMeierResult:
    """The pooled Kaplan-Meier curve of each group (one, ``"all"``, without a group).

    ``times``: the distinct times (or bin edges) of the pooled rows; ``events``, ``censored``
    and ``at_risk``: ``(m, G)`` counts at them; ``survival`` ``(m, G)`` the product-limit
    estimate just after each time; ``greenwood`` the running sum ``sum d / (n (n - d))``.
    ``survival_at(t, group)``, ``median_survival(group)`` (with its interval), ``table(group)``
    (lifelines' survival function, interval and counts at the group's own times),
    ``at_risk_table(times)``, ``plot()``."""

    times: np.ndarray
    groups: list[Hashable]
    events: np.ndarray
    censored: np.ndarray
    at_risk: np.ndarray
    time_name: str
    event_name: str
    group_name: str | None
    bins: tuple[float, ...] | None
    communication: Any = None
    survival: np.ndarray = field(init=False)
    greenwood: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        d, n = self.events, self.at_risk
        with np.errstate(invalid="ignore", divide="ignore"):
            self.survival = np.cumprod(np.where(n > 0, 1 - d / np.where(n > 0, n, 1), 1.0), axis=0)
            g = np.where((n > d) & (d > 0), d / (n * (n - d)), 0.0)
        self.greenwood = np.cumsum(g, axis=0)

    def __repr__(self) -> str:
        n = self.at_risk[0] if len(self.times) else np.zeros(len(self.groups))
        parts = ", ".join(f"{g}: {int(k)} rows, {int(e)} events" for g, k, e in zip(self.groups, n, self.events.sum(0)))
        return f"KaplanMeierResult({parts})"

    def _g(self, group: Hashable | None) -> int:
        if group is None:
            if len(self.groups) == 1:
                return 0
            raise ValueError(f"name the group: one of {self.groups}")
        if group not in self.groups:
            raise KeyError(f"no group {group!r}; the groups are {self.groups}")
        return self.groups.index(group)

    def _bounds(self, k: int, level: float) -> tuple[np.ndarray, np.ndarray]:
        """The log(-log) Greenwood interval (lifelines' and R's survfit default) at the times."""
        z = norm_ppf(0.5 + check_level(level) / 2)
        with np.errstate(invalid="ignore", divide="ignore"):
            v = np.log(self.survival[:, k])
            h = z * np.sqrt(self.greenwood[:, k]) / v
            lo = np.exp(-np.exp(np.log(-v) - h))
            hi = np.exp(-np.exp(np.log(-v) + h))
        return np.nan_to_num(lo, nan=1.0), np.nan_to_num(hi, nan=1.0)

    def table(self, group: Hashable | None = None, level: float = 0.95) -> pd.DataFrame:
        """The group's curve at time 0 and at each time where it has rows: ``survival``, its
        ``level`` interval ``lower``, ``upper``, ``at_risk``, ``events``, ``censored``."""
        k = self._g(group)
        lo, hi = self._bounds(k, level)
        own = (self.events[:, k] + self.censored[:, k]) > 0
        t = self.times[own]
        frame = pd.DataFrame(
            {
                "survival": self.survival[own, k],
                "lower": lo[own],
                "upper": hi[own],
                "at_risk": self.at_risk[own, k],
                "events": self.events[own, k],
                "censored": self.censored[own, k],
            },
            index=pd.Index(t, name=self.time_name),
        )
        if not len(t) or t[0] > 0:
            n0 = self.at_risk[0, k] if len(self.times) else 0.0
            start = pd.DataFrame(
                {
                    "survival": [1.0],
                    "lower": [1.0],
                    "upper": [1.0],
                    "at_risk": [n0],
                    "events": [0.0],
                    "censored": [0.0],
                },
                index=pd.Index([0.0], name=self.time_name),
            )
            frame = pd.concat([start, frame])
        return frame

    def survival_at(self, t: Any, group: Hashable | None = None) -> np.ndarray:
        """The curve at times ``t`` (right-continuous: the value just after each time)."""
        k = self._g(group)
        at = np.searchsorted(self.times, np.asarray(t, dtype=float), side="right") - 1
        return np.where(at >= 0, self.survival[np.maximum(at, 0), k], 1.0)

    def median_survival(self, group: Hashable | None = None, level: float = 0.95) -> tuple[float, float, float]:
        """``(median, lower, upper)``: the first time the curve (its interval's lower and upper
        ends) is at or below 0.5 (lifelines' rule); ``inf`` where it never is."""
        f = self.table(group, level)

        def first(col: str) -> float:
            below = np.flatnonzero(f[col].to_numpy() <= 0.5)
            return float(f.index[below[0]]) if len(below) else math.inf

        return first("survival"), first("lower"), first("upper")

    def at_risk_table(self, times: Sequence[float]) -> pd.DataFrame:
        """How many rows of each group are at risk (time at or after) at each of ``times``."""
        t = np.asarray(times, dtype=float)
        total = self.at_risk[0] if len(self.times) else np.zeros(len(self.groups))
        gone = np.cumsum(self.events + self.censored, axis=0)
        before = np.searchsorted(self.times, t, side="left") - 1
        left = np.where(before[:, None] >= 0, gone[np.maximum(before, 0)], 0.0)
        return pd.DataFrame(total - left, index=pd.Index(t, name=self.time_name), columns=self.groups)

    def plot(self, ax: Any = None, level: float = 0.95) -> Any:
        """Step curves with their intervals (matplotlib; the ``plots`` extra)."""
        import matplotlib.pyplot as plt

        ax = ax or plt.gca()
        for g in self.groups:
            f = self.table(g if len(self.groups) > 1 else None, level)
            line = ax.step(f.index, f["survival"], where="post", label=str(g))[0]
            ax.fill_between(f.index, f["lower"], f["upper"], step="post", alpha=0.2, color=line.get_color())
        ax.set_xlabel(self.time_name)
        ax.set_ylabel("survival")
        ax.set_ylim(0, 1.02)
        if len(self.groups) > 1:
            ax.legend(title=self.group_name)
        return ax


@dataclass
class KaplanMeier:
    """The pooled Kaplan-Meier estimate of the survival curve (per level of ``group``).

    The curves' intervals (``table(level=)``, ``median_survival(level=)``) are Greenwood's on
    the log(-log) scale (R's and lifelines' default).

    Parameters
    ----------
    event : str
        The 0/1 column of events (1: the event happened at the time; 0: censored then). The time
        is the data's target.
    group : str, optional
        A column whose levels get a curve each.
    bins : sequence of float, optional
        Bin edges: each time becomes the upper edge of its bin (``(e_(k-1), e_k]``) on the
        client; one round of counts, and the server learns no exact time.
    """

    event: str
    group: str | None = None
    bins: Sequence[float] | None = None

    def fit(self, data: FederatedData, *, seed: int = 0, backend: Any = None) -> KaplanMeierResult:
        with use_backend(backend):
            ex, spec = _exchanges(data, self.event, self.group, self.bins, seed, "KaplanMeier")
            times, counts = time_counts(ex, spec)
            check_counts(counts, released_rules(data)[1], "KaplanMeier", times, spec.bins is not None)
            d, n = risk_table(counts)
            return KaplanMeierResult(
                times, _labels(spec), d, counts[:, 1::2], n, spec.time_name, self.event,
                self.group, spec.bins, ex.communication,
            )  # fmt: skip


def _exchanges(
    data: FederatedData, event: str, group: str | None, bins: Any, seed: int, what: str
) -> tuple[Exchanges, SurvivalColumns]:
    """The exchanges of one call (the data's disclosure rules checked on the event and group
    columns) and the columns it reads."""
    spec = columns_of(data, event, what, bins=bins)
    cols = [Column(event, (spec.event,)), Column(spec.time_name, None)]
    if group is not None:
        cols.append(resolve(data, group))
    ex = Exchanges(data, cols, seed=seed, what=what)
    g = None if group is None else ex.categorical(cols[-1])
    return ex, columns_of(data, event, what, group=g, bins=bins)


def _labels(spec: SurvivalColumns) -> list[Hashable]:
    return ["all"] if spec.group is None else list(spec.group.categories)


def logrank_test(
    data: FederatedData,
    event: str,
    group: str,
    *,
    stratify: bool = False,
    p: float = 0.0,
    q: float = 0.0,
    bins: Sequence[float] | None = None,
    level: float = 0.95,
    seed: int = 0,
    backend: Any = None,
) -> TestResult:
    """The log-rank test that the survival curves of the levels of ``group`` are equal (chi-square
    on ``G - 1`` df), equal to lifelines' ``logrank_test`` / ``multivariate_logrank_test`` and R's
    ``survdiff`` on the pooled rows. ``p``, ``q``: Fleming-Harrington weights
    ``S(t-)^p (1 - S(t-))^q`` (lifelines' ``weightings="fleming-harrington"``; 0, 0: log-rank).
    ``stratify=True``: each client a stratum (R's ``survdiff(... + strata(site))``): a client
    sends only its own observed-minus-expected counts and their variance, summed (its weights
    from its own curve), and no time leaves it. With two levels and no weights the estimate is
    Peto's one-step log hazard ratio of the second level against the first, ``(O - E) / V``,
    with its ``level`` interval. ``details``: the ``groups``, their ``observed`` events (NaN
    stratified), ``observed_minus_expected`` and its ``variance``."""
    check_level(level)
    for name, value in (("p", p), ("q", q)):
        if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    with use_backend(backend):
        ex, spec = _exchanges(data, event, group, bins, seed, "logrank_test")
        G = spec.group.n_categories  # type: ignore[union-attr]
        if stratify:
            s = ex.sums(_LogRankStrata(spec, G, p, q), "log-rank strata")
            o_e, v, observed, n_rows = s["o_e"], s["v"], np.full(G, np.nan), float(s["rows"][0])
        else:
            times, counts = time_counts(ex, spec)
            check_counts(counts, released_rules(data)[1], "logrank_test", times, spec.bins is not None)
            d, n = risk_table(counts)
            o_e, v = logrank_terms(d, n, p, q)
            observed, n_rows = d.sum(axis=0), float(n[0].sum()) if len(n) else 0.0
        present = np.flatnonzero(np.diag(v) > 0)
        if len(present) < 2:
            raise ValueError(f"logrank_test: group {group!r} needs at least two levels with rows at risk at an event")
        k = present[:-1]
        stat = float(o_e[k] @ np.linalg.pinv(v[np.ix_(k, k)]) @ o_e[k])
        df = len(present) - 1
        weights = "log-rank" if not (p or q) else f"Fleming-Harrington (p={p:g}, q={q:g})"
        labels = _labels(spec)
        effect, name, lo, hi = math.nan, "", math.nan, math.nan
        if df == 1 and not (p or q):  # Peto's one-step log hazard ratio of the second level against the first
            a, b = present
            effect, se = float(o_e[b] / v[b, b]), float(1 / math.sqrt(v[b, b]))
            name = f"log hazard ratio (Peto), {labels[b]} vs {labels[a]}"
            z = float(norm_ppf(0.5 + level / 2))
            lo, hi = effect - z * se, effect + z * se
        return TestResult(
            "log-rank test" + (", stratified by client" if stratify else ""),
            stat,
            float(chi2_sf(stat, df)),
            effect,
            name,
            lo,
            hi,
            level,
            df=float(df),
            method=f"{weights} weights, chi-square on {df} df",
            n=int(n_rows),
            details={"groups": labels, "observed": observed, "observed_minus_expected": o_e, "variance": v},
            communication=ex.communication,
        )
