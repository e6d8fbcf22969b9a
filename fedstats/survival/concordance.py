"""Harrell's concordance index of a fitted Cox model across clients (:meth:`CoxResult.concordance`).

A pair of rows is comparable when the first had its event and the second outlived it (a later
time, or censored at the same time: lifelines' ``concordance_index``); it is concordant when the
first had the higher risk ``x'b``, and a tie in risk counts one half. The index is the share of
comparable pairs that are concordant.

* **Within clients** (``within_clients=True``, the default for a stratified fit; R's
  ``concordance`` with strata): only pairs of one client's rows. Each client counts its own
  concordant, tied and comparable pairs and sends the three counts (summed): exact, and nothing
  else leaves it.
* **Over all pairs** (the pooled index, lifelines' ``CoxPHFitter.concordance_index_``): a pair
  may join two clients, so the rows must meet in some form. Each client sends a table of counts
  (summed): its events and its censored rows per time cell and per risk bin. Time cells are the
  fit's event times (each time exactly, and the gaps between them) when the server knows them
  (an unstratified fit of exact times), else the bins of ``bins=`` (or the fit's); risk bins
  split the risk scores at ``risk_bins`` quantiles of a normal with their pooled mean and sd
  (one more summed round). Pairs in different cells and bins are classified exactly; a pair in
  one risk bin, or (binned times) in one time bin, is not. The result gives the exact index's
  **bounds** (every unresolved pair set against, then for, concordance) and the estimate that
  counts each unresolved pair as one half (in one time bin: comparable one time in two). The
  exact index lies between the bounds, by construction; more risk bins narrow them. The table's
  cells fall under the data's ``min_cell_count`` (refused before anything is returned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from ..data.disclosure import DisclosureError
from ..federation.protocol import FederatedAlgorithm
from ..stats._rounds import _SumRound, released_rules
from ._data import SurvivalColumns

__all__ = ["Concordance", "pair_counts", "binned_bounds"]


def pair_counts(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> tuple[int, int, int]:
    """``(concordant, tied, comparable)`` pairs of these rows (lifelines' definitions), in
    ``O(n log n)``: rows ordered by time, events before censored rows at one time; an event's
    comparable partners are the rows after the last event at its time, counted by risk rank in a
    Fenwick tree filled from the end."""
    n = len(time)
    if n == 0 or not np.any(event):
        return 0, 0, 0
    order = np.lexsort((~event, time))  # by time, events first within a time
    t, d, r = time[order], event[order], risk[order]
    levels, rank = np.unique(r, return_inverse=True)
    m = len(levels)
    tree = np.zeros(m + 1, dtype=np.int64)

    def below(k: int) -> int:  # rows inserted with rank < k
        s = 0
        while k > 0:
            s += tree[k]
            k -= k & -k
        return s

    # an event's partners start after the events at its time (the censored rows there come after them)
    first = np.searchsorted(t, t, side="left")
    events_to = np.r_[0, np.cumsum(d)]  # events before each position
    start = first + events_to[np.searchsorted(t, t, side="right")] - events_to[first]
    ev_pos = np.flatnonzero(d)
    correct = tied = pairs = 0
    inserted = 0
    pos = n
    for i in ev_pos[np.argsort(-start[ev_pos], kind="stable")]:
        s = start[i]
        while pos > s:  # insert rows s .. n-1
            pos -= 1
            k = rank[pos] + 1
            while k <= m:
                tree[k] += 1
                k += k & -k
            inserted += 1
        lo, hi = below(rank[i]), below(rank[i] + 1)
        correct += lo
        tied += hi - lo
        pairs += inserted
    return int(correct), int(tied), int(pairs)


class _WithinPairs(_SumRound, FederatedAlgorithm):
    """One round: each client's own concordant, tied and comparable pairs."""

    reply_keys = summed_keys = count_keys = ("correct", "tied", "pairs")

    def __init__(self, spec: SurvivalColumns, coef: np.ndarray) -> None:
        self.spec, self.coef = spec, np.asarray(coef, dtype=float)

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        return dict(zip(self.reply_keys, map(np.atleast_1d, pair_counts(r.time, r.event, r.X @ self.coef))))


class _RiskSums(_SumRound, FederatedAlgorithm):
    """One round: the rows, and the sum and sum of squares of their risk scores ``x'b``."""

    reply_keys = summed_keys = ("n", "s1", "s2")
    count_keys = ("n",)

    def __init__(self, spec: SurvivalColumns, coef: np.ndarray) -> None:
        self.spec, self.coef = spec, np.asarray(coef, dtype=float)

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        s = r.X @ self.coef
        return {"n": np.array([len(s)]), "s1": np.array([s.sum()]), "s2": np.array([s @ s])}


class _RiskTable(_SumRound, FederatedAlgorithm):
    """One round: per time cell and risk bin, the client's events and censored rows. Time cells:
    with ``times`` (the fit's event times), 0 before the first, ``2k + 1`` at ``times[k]``,
    ``2k + 2`` between it and the next; with ``edges``, bin ``k`` is ``(edges[k-1], edges[k]]``."""

    reply_keys = summed_keys = count_keys = ("events", "censored")

    def __init__(
        self, spec: SurvivalColumns, coef: np.ndarray, cuts: np.ndarray, times: np.ndarray | None, edges: Any
    ) -> None:
        self.spec, self.coef, self.cuts = spec, np.asarray(coef, dtype=float), np.asarray(cuts, dtype=float)
        self.times, self.edges = times, None if edges is None else np.asarray(edges, dtype=float)

    @property
    def cells(self) -> int:
        return 2 * len(self.times) + 1 if self.times is not None else len(self.edges)  # type: ignore[arg-type]

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        if self.times is not None:
            k = np.searchsorted(self.times, r.time, side="right") - 1
            at = (k >= 0) & (self.times[np.maximum(k, 0)] == r.time)
            cell = np.where(k < 0, 0, np.where(at, 2 * k + 1, 2 * k + 2))
        else:
            assert self.edges is not None
            cell = np.searchsorted(self.edges, r.time, side="left")
            if np.any(cell >= len(self.edges)):
                raise ValueError(
                    f"times beyond the last bin edge {self.edges[-1]:g}: add an edge at or above the largest"
                )
        b = np.searchsorted(self.cuts, r.X @ self.coef, side="right")
        shape = (self.cells, len(self.cuts) + 1)
        ev = np.zeros(shape)
        cen = np.zeros(shape)
        np.add.at(ev, (cell[r.event], b[r.event]), 1.0)
        np.add.at(cen, (cell[~r.event], b[~r.event]), 1.0)
        return {"events": ev, "censored": cen}


def binned_bounds(events: np.ndarray, censored: np.ndarray, exact_times: bool) -> dict[str, float]:
    """The concordance of a table of counts (time cells x risk bins, see :class:`_RiskTable`):
    ``lower``, ``upper`` (the exact index lies between), ``estimate`` and ``pairs`` (the
    comparable pairs, counting half of those in one time bin when the times are binned)."""
    E, C = np.asarray(events, float), np.asarray(censored, float)
    R = E + C
    later = np.cumsum(R[::-1], axis=0)[::-1]  # rows in this cell or after
    later = np.r_[later[1:], np.zeros((1, R.shape[1]))]  # strictly later cells
    if exact_times:  # a row censored at an event's own time outlives it
        later = later + C
    lower_risk = np.cumsum(later, axis=1) - later  # partners in a lower risk bin
    higher_risk = later.sum(axis=1, keepdims=True) - lower_risk - later
    sure_c, sure_w, sure_u = (float(np.sum(E * x)) for x in (lower_risk, higher_risk, later))
    if exact_times:
        may_c = may_w = may_u = 0.0
    else:  # partners in the event's own time bin (but itself): comparable or not
        own = R - 1.0 * (E > 0)
        low = np.cumsum(R, axis=1) - R
        may_c = float(np.sum(E * low))
        may_w = float(np.sum(E * (R.sum(axis=1, keepdims=True) - low - R)))
        may_u = float(np.sum(E * own))
    sure = sure_c + sure_w + sure_u
    lower = sure_c / (sure + may_w + may_u) if sure + may_w + may_u > 0 else np.nan
    upper = (sure_c + sure_u + may_c + may_u) / (sure + may_c + may_u) if sure + may_c + may_u > 0 else np.nan
    pairs = sure + 0.5 * (may_c + may_w + may_u)
    est = (sure_c + 0.5 * sure_u + 0.5 * (may_c + 0.5 * may_u)) / pairs if pairs > 0 else np.nan
    return {"estimate": est, "lower": lower, "upper": upper, "pairs": pairs}


def risk_cuts(mean: float, sd: float, bins: int) -> np.ndarray:
    """``bins - 1`` cut points of the risk scores: quantiles of ``N(mean, sd^2)``."""
    q = np.arange(1, bins) / bins
    return mean + sd * np.sqrt(2.0) * special.erfinv(2 * q - 1)


def check_cells(events: np.ndarray, censored: np.ndarray, min_cell_count: int) -> None:
    """Refuse a table with a cell of 1 .. ``min_cell_count - 1`` rows (events or censored)."""
    small = sum(int(np.sum((x > 0) & (x < min_cell_count))) for x in (events, censored))
    if small:
        raise DisclosureError(
            f"concordance refuses to release its table of counts: {small} cell(s) hold fewer than {min_cell_count} "
            "rows (rule min_cell_count): use fewer risk_bins=, coarser bins=[...] of the times, or "
            "within_clients=True (each client's own pairs, exact, only three counts leave it), or allow it with "
            "data.with_rules(min_cell_count=1)",
            "min_cell_count",
            None,
        )


@dataclass
class Concordance:
    """Harrell's concordance index: ``estimate`` with the ``lower`` and ``upper`` bounds of the
    exact index (equal to it where ``exact``), the comparable ``pairs``, whether only pairs
    ``within_clients`` count, and the ``risk_bins`` and time cells it used (None: exact)."""

    estimate: float
    lower: float
    upper: float
    pairs: float
    exact: bool
    within_clients: bool
    risk_bins: int | None
    time_cells: str | None

    def __repr__(self) -> str:
        how = "within clients" if self.within_clients else "over all pairs"
        if self.exact:
            return f"Concordance({self.estimate:.4f}, exact, {how}, {self.pairs:.0f} comparable pairs)"
        return (
            f"Concordance({self.estimate:.4f}, exact index in [{self.lower:.4f}, {self.upper:.4f}], {how}, "
            f"{self.risk_bins} risk bins, time cells: {self.time_cells})"
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def within_clients(ex: Any, spec: SurvivalColumns, coef: np.ndarray) -> Concordance:
    s = ex.sums(_WithinPairs(spec, coef), "concordant pairs")
    c, t, p = (float(s[k][0]) for k in ("correct", "tied", "pairs"))
    v = (c + 0.5 * t) / p if p > 0 else np.nan
    return Concordance(v, v, v, p, True, True, None, None)


def over_all_pairs(
    ex: Any, spec: SurvivalColumns, coef: np.ndarray, times: np.ndarray | None, edges: Any, risk_bins: int
) -> Concordance:
    s = ex.sums(_RiskSums(spec, coef), "risk sums")
    n = float(s["n"][0])
    mean = float(s["s1"][0]) / n
    sd = float(np.sqrt(max(float(s["s2"][0]) / n - mean**2, 0.0)))
    cuts = risk_cuts(mean, sd if sd > 0 else 1.0, int(risk_bins))
    table = ex.sums(_RiskTable(spec, coef, cuts, times, edges), "risk table")
    check_cells(table["events"], table["censored"], released_rules(ex.data)[1])
    b = binned_bounds(table["events"], table["censored"], times is not None)
    exact = bool(b["lower"] == b["upper"])
    cells = "the fit's event times" if times is not None else f"{len(edges)} bins"
    return Concordance(b["estimate"], b["lower"], b["upper"], b["pairs"], exact, False, int(risk_bins), cells)
