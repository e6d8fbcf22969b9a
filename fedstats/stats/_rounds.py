"""The exchanges of :mod:`fedstats.stats`: every reply array is declared summed, so under secure
aggregation the server receives only sums over the clients.

* :class:`_CrossTable`: counts of the level combinations of categorical columns (a missing value
  is a level of its own, the last);
* :class:`_GroupMoments`: per group, each column's count, sum and sum of squares about a centre the
  server sends (a second round about the first round's means makes the variance exact), and
  the cross-products of complete rows;
* :class:`_StrataTerms`: per client, the 2x2 table's terms of the Mantel-Haenszel estimate, its
  variance and test, and (given the pooled odds ratio) the Breslow-Day terms: clients are the
  strata, so no client's table leaves it;
* :class:`_DistinctValues`: the distinct values of a column and how many rows of each group have
  each, by splitting intervals of the float64 order (at most 64 rounds): the exact global
  ranks of the rank tests.

:class:`Exchanges` runs them for one call of a function: the data's disclosure rules first,
every client must answer, and the bytes of all its rounds add up in one ``communication``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..data import FederatedData
from ..data.disclosure import MIN_CELL_COUNT, MIN_ROWS, DisclosureError, breach, refusal
from ..data.validation import DataError
from ..federation.protocol import ClientId, FederatedAlgorithm, Message
from ..federation.records import Communication
from ..federation.runner import run
from ..privacy.ledger import run_seed
from ._columns import SEARCH_ROUNDS, Column, codes, data_key, split_points, values, with_categories
from ._columns import order_key as _key
from ._columns import order_value as _value

_LOWEST = _key(np.array([-np.finfo(float).max]))[0]
_HIGHEST = _key(np.array([np.finfo(float).max]))[0]
#: a key's bytes: the limbs whose sums and sums of squares tell an interval of one value
_LIMBS = 8
_SHIFTS = np.arange(0, 64, 8, dtype=np.uint64)
#: a key's bytes: their sums and sums of squares over an interval's rows tell one value
_LIMBS = 8
_SHIFTS = np.arange(0, 64, 8, dtype=np.uint64)
MAX_SPLIT_ROUNDS = SEARCH_ROUNDS + 1  # the first count, then 4 of the 64 bits of the float64 order a round


class _SumRound:
    """One round (a mixin of the one-round exchanges); each client's reply from :meth:`sums`.
    The sums of ``count_keys`` are whole numbers: rounded (secure aggregation sums to within
    2**-44)."""

    random_client_steps = False
    count_keys: tuple[str, ...] = ()

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict:
        return {}

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> None:
        return None

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        return {}

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        return {k: np.asarray(v, dtype=float) for k, v in self.sums(data).items()}, state

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        sums = replies.sums  # type: ignore[attr-defined]
        return {k: np.rint(v) if k in self.count_keys else np.asarray(v) for k, v in sums.items()}, {}

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        raise NotImplementedError


def _complete(data: Any, cols: Sequence[Column]) -> np.ndarray:
    """The rows where none of ``cols`` is missing."""
    n = len(data.X)
    ok = np.ones(n, dtype=bool)
    for c in cols:
        ok &= codes(data, c) < c.n_categories if c.categorical else ~np.isnan(values(data, c))
    return ok


class _CrossTable(_SumRound, FederatedAlgorithm):
    """Counts of every combination of the levels of ``columns`` (categorical), a missing value
    counted as level ``L`` of its column: an array of shape ``(L1 + 1, L2 + 1, ...)``."""

    reply_keys = summed_keys = count_keys = ("counts",)

    def __init__(self, columns: Sequence[Column]) -> None:
        self.columns = tuple(columns)

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        shape = tuple(c.n_categories + 1 for c in self.columns)
        flat = np.ravel_multi_index(tuple(codes(data, c) for c in self.columns), shape)
        return {"counts": np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape)}


def group_masks(data: Any, group: Column | None, overall: bool) -> list[np.ndarray]:
    """A client's rows of each level of ``group`` (and, with ``overall`` or without a group,
    every row, last)."""
    n = len(data.X)
    if group is None:
        return [np.ones(n, dtype=bool)]
    g = codes(data, group)
    return [g == k for k in range(group.n_categories)] + ([np.ones(n, dtype=bool)] if overall else [])


class _GroupMoments(_SumRound, FederatedAlgorithm):
    """Per level of ``group`` (one group without; with ``overall``, every row as a last
    group too): for each of ``columns``, the count of its present values, their sum and sum of
    squares about ``center`` (one row per group); with ``complete``, only rows where every
    column is present count, and the cross-products about the centre come too. Shapes
    ``(G, p)`` and ``(G, p, p)``."""

    reply_keys = summed_keys = ("n", "s1", "s2", "cross")
    count_keys = ("n",)

    def __init__(
        self,
        columns: Sequence[Column],
        group: Column | None = None,
        center: np.ndarray | None = None,
        complete: bool = False,
        overall: bool = False,
    ) -> None:
        self.columns, self.group, self.complete = tuple(columns), group, bool(complete)
        self.overall = bool(overall) and group is not None
        self.center = np.zeros((self.n_groups, len(self.columns))) if center is None else np.asarray(center, float)

    @property
    def n_groups(self) -> int:
        return 1 if self.group is None else self.group.n_categories + self.overall

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        G, p = self.n_groups, len(self.columns)
        V = np.column_stack([values(data, c) for c in self.columns]) if p else np.empty((len(data.X), 0))
        full = ~np.isnan(V).any(axis=1) if self.complete else np.ones(len(V), dtype=bool)
        n, s1, s2 = np.zeros((G, p)), np.zeros((G, p)), np.zeros((G, p))
        cross = np.zeros((G, p, p))
        for k, rows in enumerate(group_masks(data, self.group, self.overall)):
            Vk = V[rows & full]
            present = ~np.isnan(Vk)
            Dk = np.where(present, Vk - self.center[k], 0.0)
            n[k] = present.sum(axis=0)
            s1[k] = Dk.sum(axis=0)
            s2[k] = (Dk * Dk).sum(axis=0)
            if self.complete:
                cross[k] = Dk.T @ Dk
        return {"n": n, "s1": s1, "s2": s2, "cross": cross}


class _LevelCounts(_SumRound, FederatedAlgorithm):
    """Per level of ``group`` (and every row, last, with ``overall``): the rows, and each
    categorical column's count of every level (a missing value the last), all in one array:
    ``rows`` ``(G,)`` and ``counts`` (for each column, ``(G, L + 1)``, flattened and joined)."""

    reply_keys = summed_keys = count_keys = ("rows", "counts")

    def __init__(self, columns: Sequence[Column], group: Column | None = None, overall: bool = False) -> None:
        self.columns, self.group = tuple(columns), group
        self.overall = bool(overall) and group is not None

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        masks = group_masks(data, self.group, self.overall)
        parts = []
        for c in self.columns:
            code = codes(data, c)
            parts.append(np.stack([np.bincount(code[m], minlength=c.n_categories + 1) for m in masks]).ravel())
        counts = np.concatenate(parts) if parts else np.zeros(0)
        return {"rows": np.array([m.sum() for m in masks], dtype=float), "counts": counts}

    def split(self, counts: np.ndarray) -> list[np.ndarray]:
        """The summed ``counts`` as one ``(G, L + 1)`` table per column."""
        G = 1 if self.group is None else self.group.n_categories + self.overall
        ends = np.cumsum([G * (c.n_categories + 1) for c in self.columns])[:-1]
        return [part.reshape(G, -1) for part in np.split(np.asarray(counts), ends)]


class _ClientSummaries(_SumRound, FederatedAlgorithm):
    """One round of each client's own summaries, per client (not summed): its rows, and per
    numeric column the count, mean and sum of squares about that mean of its present values,
    per categorical column its count of every level (a missing value the last). The node's
    policy runs it only with ``release_statistics = true``."""

    reply_keys = ("rows", "n", "mean", "ss", "counts")
    summed_keys = ()
    releases_statistics = True

    def __init__(self, numeric: Sequence[Column], categorical: Sequence[Column]) -> None:
        self.numeric, self.categorical = tuple(numeric), tuple(categorical)

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        p = len(self.numeric)
        V = np.column_stack([values(data, c) for c in self.numeric]) if p else np.empty((len(data.X), 0))
        present = ~np.isnan(V)
        n = present.sum(axis=0).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n > 0, np.where(present, V, 0.0).sum(axis=0) / np.maximum(n, 1), 0.0)
        ss = np.where(present, (V - mean) ** 2, 0.0).sum(axis=0)
        parts = [np.bincount(codes(data, c), minlength=c.n_categories + 1) for c in self.categorical]
        counts = np.concatenate(parts).astype(float) if parts else np.zeros(0)
        return {"rows": np.array([float(len(V))]), "n": n, "mean": mean, "ss": ss, "counts": counts}

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        return {c: dict(r) for c, r in replies.items()}, {}


class _StrataTerms(_SumRound, FederatedAlgorithm):
    """Each client a stratum of a 2x2 table (``exposure`` rows, ``outcome`` columns, both with
    two levels): the sums over the strata of the Mantel-Haenszel terms; with ``odds_ratio``, of
    the Breslow-Day terms at that common odds ratio."""

    reply_keys = summed_keys = ("terms",)

    def __init__(self, exposure: Column, outcome: Column, odds_ratio: float | None = None) -> None:
        self.exposure, self.outcome, self.odds_ratio = exposure, outcome, odds_ratio

    def table(self, data: Any) -> np.ndarray:
        e, o = codes(data, self.exposure), codes(data, self.outcome)
        ok = (e < 2) & (o < 2)
        return np.bincount(2 * e[ok] + o[ok], minlength=4).reshape(2, 2).astype(float)

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        t = self.table(data)
        return {"terms": mh_terms(t) if self.odds_ratio is None else bd_terms(t, self.odds_ratio)}


#: the names of :func:`mh_terms`' sums
MH_TERMS = ("strata", "a", "ad_n", "bc_n", "apd_ad_n2", "apd_bc_n2", "ad_n_rest", "bc_n_rest", "e_a", "var_a")


def mh_terms(t: np.ndarray) -> np.ndarray:
    """One stratum's terms of the Mantel-Haenszel estimate (statsmodels' ``StratifiedTable``:
    the Robins-Breslow-Greenland variance and the Cochran-Mantel-Haenszel test)."""
    (a, b), (c, d) = t
    n = a + b + c + d
    if n == 0:
        return np.zeros(len(MH_TERMS))
    apd, ad, bc = a + d, a * d, b * c
    rest = 1 - apd / n
    var = (a + b) * (c + d) * (a + c) * (b + d) / (n**2 * (n - 1)) if n > 1 else 0.0
    return np.array(
        [1.0, a, ad / n, bc / n, apd * ad / n**2, apd * bc / n**2, rest * ad / n, rest * bc / n,
         (a + b) * (a + c) / n, var]
    )  # fmt: skip


BD_TERMS = ("chi2", "diff", "var", "strata")


def bd_terms(t: np.ndarray, odds_ratio: float) -> np.ndarray:
    """One stratum's Breslow-Day terms at the common ``odds_ratio``: ``(a - E)^2 / V``,
    ``a - E``, ``V`` and 1, where ``E`` and ``V`` are the mean and variance of the first cell
    given the margins and the odds ratio (statsmodels' ``test_equal_odds``). A stratum with
    an empty row or column says nothing about its odds ratio: all zeros."""
    (a, b), (c, d) = t
    apb, apc, bpd, cpd = a + b, a + c, b + d, c + d
    if min(apb, apc, bpd, cpd) == 0:
        return np.zeros(len(BD_TERMS))
    r = odds_ratio
    qa, qb, qc = 1 - r, r * (apb + apc) + (d - a), -r * apb * apc
    e = (-qb + np.sqrt(qb**2 - 4 * qa * qc)) / (2 * qa) if qa != 0 else -qc / qb
    v = 1 / (1 / e + 1 / (apc - e) + 1 / (apb - e) + 1 / (d - a + e))
    return np.array([(a - e) ** 2 / v, a - e, v, 1.0])


class _DistinctValues(FederatedAlgorithm):
    """The distinct values of ``column`` and how many rows of each level of ``group`` have each,
    among the rows where ``column``, the group and every column of ``require`` are present.

    Each round the server sends the open intervals of the float64 order (as their end values);
    each client splits every one into 16 parts (the first round: the whole line, unsplit) and
    answers how many of its values lie in each part, per group, and for each interval the sums
    and sums of squares of the 8 bytes of its values' keys (all summed); an interval known to
    hold one row is not split, its bytes are its value. An interval whose rows all hold one
    value is found at once (every byte's sum of squares times its rows is the byte's sum
    squared: the value is the bytes' means); the others' parts that hold rows are the next
    round's intervals, a part of one key is found. At most 17 rounds (the first
    count, then 4 of the 64 bits a round); values set apart by the splitting are found the
    round after, not 4 bits at a time. The byte sums say nothing the found values and counts
    do not."""

    reply_keys = summed_keys = ("counts", "limbs")
    random_client_steps = False

    def __init__(self, column: Column, group: Column | None = None, require: Sequence[Column] = ()) -> None:
        self.column, self.group, self.require = column, group, tuple(require)

    @property
    def n_groups(self) -> int:
        return 1 if self.group is None else self.group.n_categories

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict[str, np.ndarray]:
        G = self.n_groups
        return {"lo": np.array([_LOWEST]), "hi": np.array([_HIGHEST]), "started": np.array([False]),
                "n": np.zeros((1, G)), "found": np.zeros(0, dtype=np.uint64),
                "found_counts": np.zeros((0, G))}  # fmt: skip

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> list[np.ndarray]:
        x = values(data, self.column)
        g = np.zeros(len(x), dtype=np.int64) if self.group is None else codes(data, self.group)
        ok = _complete(data, (self.column, *self.require)) & (g < self.n_groups)
        return [np.sort(data_key(x[ok & (g == k)])) for k in range(self.n_groups)]

    def final_state(self, state: Any) -> None:
        """Nothing: the client's state is its sorted values, which never leave it (a remote
        backend sends the final state to the server)."""
        return None

    @staticmethod
    def _lone(state: Mapping[str, np.ndarray]) -> np.ndarray:
        """The open intervals that hold one row: its bytes alone give its value (no parts)."""
        return bool(state["started"][0]) & (state["n"].sum(axis=1) == 1)

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        """The open intervals (their end values): those of several rows, which each client
        splits into 16 parts itself (:func:`~fedstats.stats._columns.split_points`; the first
        round: the whole line, unsplit), and those of one row (``lo1``, ``hi1``)."""
        lone = self._lone(server_state)
        lo, hi = _value(server_state["lo"]), _value(server_state["hi"])
        split = server_state["started"].astype(float)
        return {"lo": lo[~lone], "hi": hi[~lone], "lo1": lo[lone], "hi1": hi[lone], "split": split}

    @staticmethod
    def _parts(lo: np.ndarray, hi: np.ndarray, split: bool) -> tuple[np.ndarray, np.ndarray]:
        """Each interval's parts' first keys and last keys, ``(m, 16)`` (``(m, 1)`` unsplit); a
        part whose first key is past its last is empty (an interval of fewer than 16 keys)."""
        if not split:
            return lo[:, None], hi[:, None]
        t = split_points(lo, hi)
        return np.concatenate([lo[:, None], t + np.uint64(1)], axis=1), np.concatenate([t, hi[:, None]], axis=1)

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        lo, hi = _key(np.asarray(message["lo"])), _key(np.asarray(message["hi"]))
        lo1, hi1 = _key(np.asarray(message["lo1"])), _key(np.asarray(message["hi1"]))
        _, ends = self._parts(lo, hi, bool(message["split"][0]))
        # the parts of an interval are contiguous: a part's count is the difference of the counts
        # at or below consecutive ends (an empty part's end repeats the one before it)
        counts, limbs = [], np.zeros((len(lo) + len(lo1), 2 * _LIMBS))
        for s in state:
            first = np.asarray(np.searchsorted(s, np.r_[lo, lo1], side="left"))
            below = np.searchsorted(s, ends, side="right")
            counts.append(np.diff(below, axis=1, prepend=first[: len(lo), None]).ravel())
            last = np.r_[below[:, -1], np.searchsorted(s, hi1, side="right")]
            digits = ((s[:, None] >> _SHIFTS) & np.uint64(255)).astype(float)
            prefix = np.vstack([np.zeros((1, 2 * _LIMBS)), np.cumsum(np.hstack([digits, digits**2]), axis=0)])
            limbs += prefix[last] - prefix[first]
        return {"counts": np.stack(counts, axis=1).astype(float), "limbs": limbs}, state

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        sums = replies.sums  # type: ignore[attr-defined]
        counts, limbs = np.rint(sums["counts"]), np.rint(sums["limbs"])
        started = bool(server_state["started"][0])
        lone = self._lone(server_state)
        order = np.r_[np.flatnonzero(~lone), np.flatnonzero(lone)]  # the limbs' rows: split intervals first
        n = server_state["n"][order]
        # an interval whose rows all hold one value is found: each byte's mean d is whole and its
        # sum of squares is rows * d^2 (exact in float64 below 2**53 / 255**2 rows)
        c = n.sum(axis=1)[:, None]
        s1, s2 = limbs[:, :_LIMBS], limbs[:, _LIMBS:]
        with np.errstate(invalid="ignore", divide="ignore"):
            d = s1 / c
            one = started & (c[:, 0] > 0) & np.all((d == np.rint(d)) & (s2 == c * d * d), axis=1)
        key = (d[one].astype(np.uint64) << _SHIFTS).sum(axis=1, dtype=np.uint64)
        m = int(np.sum(~lone))
        assert np.all(one[m:]), "an interval of one row did not give its value"
        starts, ends = self._parts(server_state["lo"][~lone], server_state["hi"][~lone], started)
        G = counts.shape[1]
        parts = counts.reshape(m, starts.shape[1], G)[~one[:m]].reshape(-1, G)
        lo, hi = starts[~one[:m]].ravel(), ends[~one[:m]].ravel()
        keep = (parts.sum(axis=1) > 0) & (lo <= hi)
        lo, hi, parts = lo[keep], hi[keep], parts[keep]
        single = lo == hi
        state = {
            "lo": lo[~single],
            "hi": hi[~single],
            "started": np.array([True]),
            "n": parts[~single],
            "found": np.r_[server_state["found"], key, lo[single]],
            "found_counts": np.concatenate([server_state["found_counts"], n[one], parts[single]]),
        }
        return state, {"open": float(np.sum(~single))}

    def converged(self, server_state: Any, metrics: Mapping[str, float]) -> bool:
        return metrics["open"] == 0


class Exchanges:
    """The exchanges of one call of a :mod:`fedstats.stats` function over ``data``: the
    disclosure rules of ``data`` first (each client's rows and small cells in the ``columns``
    it reads), then rounds that every client must answer; ``communication`` adds them up."""

    def __init__(self, data: FederatedData, columns: Sequence[Column], *, seed: int, what: str) -> None:
        if not isinstance(data, FederatedData):
            raise TypeError(f"data must be a FederatedData, got {type(data).__name__}")
        self.data, self.seed, self.what = data, int(seed), what
        self.parts: list[Communication] = []
        check_clients(data, columns, what)

    def _run(self, algorithm: FederatedAlgorithm, rounds: int, kind: str, privacy_ledger: Any = None) -> Any:
        # a differentially private run draws its noise from a seed of its own (a ledger refuses a repeat)
        seed = self.seed if privacy_ledger is None else run_seed(self.seed, kind)
        r = run(
            algorithm, self.data, rounds=rounds, seed=seed, progress=False, batched=False, kind=kind,
            privacy_ledger=privacy_ledger,
        )  # fmt: skip
        self.parts.append(r.communication)
        failed = {c: why for rec in r.history for c, why in rec.failed.items()}
        if failed:
            c, why = next(iter(failed.items()))
            raise RuntimeError(f"{self.what}: {len(failed)} client(s) failed ({kind}); client {c!r}: {why}")
        return r

    def sums(self, algorithm: FederatedAlgorithm, kind: str) -> dict[str, np.ndarray]:
        """One summed round's sums."""
        return self._run(algorithm, 1, kind).server_state

    def per_client(self, algorithm: FederatedAlgorithm, kind: str) -> dict[ClientId, dict[str, np.ndarray]]:
        """One round's replies, client by client (an exchange whose replies are not summed)."""
        return self._run(algorithm, 1, kind).server_state

    def histogram(self, column: Column, group: Column | None = None, require: Sequence[Column] = ()) -> tuple:
        """``(distinct values, counts (m, G))`` of ``column`` (see :class:`_DistinctValues`)."""
        r = self._run(_DistinctValues(column, group, require), MAX_SPLIT_ROUNDS, "rank counts")
        s = r.server_state
        assert len(s["lo"]) == 0, "the interval splitting did not end on single values"
        order = np.argsort(s["found"])
        return _value(s["found"][order]), s["found_counts"][order]

    def categorical(self, col: Column, max_categories: int = 50) -> Column:
        """``col`` as a categorical column: as it is, or a numeric column whose levels (its
        distinct values, at most ``max_categories``) the interval splitting finds."""
        if col.categorical:
            return col
        if col.minus is not None:
            raise DataError(f"a paired difference ({col.name!r}) is not categorical")
        distinct, _ = self.histogram(col)
        if len(distinct) > max_categories:
            raise DataError(
                f"column {col.name!r} has {len(distinct)} distinct values, too many for a categorical column "
                f"(at most {max_categories})"
            )
        if len(distinct) == 0:
            raise DataError(f"column {col.name!r} has no values")
        return with_categories(col, distinct)

    def moments(
        self, columns: Sequence[Column], group: Column | None = None, complete: bool = False, overall: bool = False
    ) -> dict[str, np.ndarray]:
        """Per group (see :class:`_GroupMoments`): each column's count ``n``, ``mean``, sum of
        squares about the mean ``ss`` and (with ``complete``: rows complete in every column)
        the co-moments ``cross``, in two rounds (the second about the first one's means, as a
        two-pass variance)."""
        first = self.sums(_GroupMoments(columns, group, complete=complete, overall=overall), "moments")
        n = first["n"]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n > 0, first["s1"] / np.where(n > 0, n, 1), np.nan)
        second = self.sums(_GroupMoments(columns, group, np.nan_to_num(mean), complete, overall), "centred moments")
        d1 = second["s1"]
        safe = np.where(n > 0, n, 1)
        ss = second["s2"] - d1 * d1 / safe
        cross = second["cross"] - d1[:, :, None] * d1[:, None, :] / safe[:, :, None]
        return {"n": n, "mean": mean, "ss": ss, "cross": cross}

    def iterate(self, algorithm: FederatedAlgorithm, rounds: int, kind: str, privacy_ledger: Any = None) -> Any:
        """An iterative exchange's final server state (a private one records its releases in
        ``privacy_ledger``)."""
        return self._run(algorithm, rounds, kind, privacy_ledger).server_state

    @property
    def communication(self) -> Communication:
        return Communication.combine(self.parts)


def _rows_here(data: FederatedData) -> bool:
    """Whether this process holds the clients' rows (not a deployment's view of them)."""
    X_of: dict = getattr(data, "_X", None) or {}
    return bool(X_of) and isinstance(next(iter(X_of.values())), np.ndarray)


def released_rules(data: FederatedData) -> tuple[int, int]:
    """``(min_rows, min_cell_count)`` for what a function releases (a table's cells, a
    quartile): the data's rules; for data whose rows live on nodes (a deployment, whose nodes
    check their own rows against their policies and whose view on the server has the rules
    off), at least the defaults."""
    if _rows_here(data):
        return data.min_rows, data.min_cell_count
    return max(data.min_rows, MIN_ROWS), max(data.min_cell_count, MIN_CELL_COUNT)


def check_clients(data: FederatedData, columns: Sequence[Column], what: str) -> None:
    """Refuse, naming the rule and the option, a client whose rows of ``columns`` break the
    data's disclosure rules: fewer than ``min_rows`` rows; a level of a categorical column, or
    a value of a 0/1 numeric column, held by 1 to ``min_cell_count - 1`` of its rows. Data
    whose rows live on nodes pass (each node checks its own against its policy)."""
    if not _rows_here(data):
        return
    for c, cd in data.items():
        numeric = [col for col in columns if not col.categorical]
        X = np.column_stack([values(cd, col) for col in numeric]) if numeric else np.empty((cd.n, 0))
        found = breach(
            X, None, min_rows=data.min_rows, min_cell_count=data.min_cell_count, names=[col.name for col in numeric]
        )
        for col in (col for col in columns if col.categorical and found is None and data.min_cell_count > 1):
            counts = np.bincount(codes(cd, col), minlength=col.n_categories + 1)[: col.n_categories]
            small = np.flatnonzero((counts > 0) & (counts < data.min_cell_count))
            if len(small):
                k = int(small[0])
                found = (
                    "min_cell_count",
                    f"{counts[k]} of its rows have {col.name!r} = {col.categories[k]!r}, fewer than "
                    f"{data.min_cell_count} (a small cell: the sums over those rows are their values)",
                    int(counts[k]),
                )
        if found is not None:
            raise refusal(what, c, found)


def disclosure_refusal(what: str, cell: str, count: int, min_cell_count: int) -> DisclosureError:
    """The refusal of a result that would reveal a pooled cell below the minimum count."""
    return DisclosureError(
        f"{what} refuses to release a table whose cell {cell} holds {count} row(s), fewer than "
        f"min_cell_count={min_cell_count} (rule min_cell_count): to allow it, set min_cell_count={max(count, 1)} "
        "(data.with_rules(min_cell_count=...), --min-cell-count on the command line)",
        "min_cell_count",
        None,
    )
