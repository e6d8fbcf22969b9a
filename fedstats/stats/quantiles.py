"""Exact federated quantiles by a search on summed counts.

A quantile of the pooled rows is an order statistic (or two, interpolated). The ``r``-th
smallest value is the smallest ``t`` with at least ``r + 1`` pooled values ``<= t``, and that
count is a sum over the clients. So the server searches: each round it sends thresholds, each
client answers how many of its values are ``<=`` each one, and the server receives only the
sums (declared summed: under secure aggregation it learns nothing else). The search runs over
the float64 numbers in their order (an order-preserving map of their bits to integers), each
round narrowing a statistic's interval to one of 16 parts (15 thresholds), so it ends on a
value exactly: 16 rounds at most (4 of a float64's 64 bits a round), after one round that
counts the present values. Every order statistic needed by every requested quantile is found
in the same rounds.

What the server learns: the row count, and for each threshold the number of values at or
below it over all clients; at the end the order statistics themselves, which are values of
some rows (the median of an odd number of rows is a row's value). The disclosure rules apply:
the pooled row count must reach the data's ``min_rows``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..data import FederatedData
from ..data.validation import DataError
from ..federation.backend import use_backend
from ..federation.protocol import ClientId, FederatedAlgorithm, Message
from ._columns import (
    BRANCHES,
    SEARCH_ROUNDS,
    Column,
    codes,
    data_key,
    order_key,
    order_value,
    resolve,
    split_points,
    values,
)
from ._rounds import Exchanges, _GroupMoments, _SumRound, released_rules

__all__ = ["quantiles", "QuantileResult", "QUANTILE_METHODS", "order_statistics"]

#: numpy's definitions this module computes exactly (``numpy.quantile(..., method=)``)
QUANTILE_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")
_MAX_ROUNDS = SEARCH_ROUNDS


class _QuantileSearch(FederatedAlgorithm):
    """Rounds of counts below thresholds. Each order statistic sought belongs to a *cell* (a
    numeric column, within one level of a group column or over all rows); each round the server
    splits the statistic's interval of the float64 order (:func:`~fedstats.stats._columns.order_key`)
    into 16 parts, and a client sends, per statistic and part end, how many of its present
    values of that cell are at or below it (summed over the clients); the server keeps the
    part that holds the statistic: at most 16 rounds (4 of the 64 bits a round)."""

    reply_keys = ("below",)
    summed_keys = ("below",)
    random_client_steps = False

    def __init__(self, cells: Sequence[tuple[Column, Column | None, int]], cell: np.ndarray, ranks: np.ndarray) -> None:
        self.cells = tuple(cells)
        self.cell = np.asarray(cell, dtype=np.int64)
        self.ranks = np.asarray(ranks, dtype=np.int64)

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict[str, np.ndarray]:
        m = len(self.ranks)
        lo = np.full(m, order_key(np.array([-np.finfo(float).max]))[0], dtype=np.uint64)
        hi = np.full(m, order_key(np.array([np.finfo(float).max]))[0], dtype=np.uint64)
        return {"lo": lo, "hi": hi}

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> list[np.ndarray]:
        """The client's sorted keys of each cell (kept on the client for every round)."""
        out = []
        for col, group, level in self.cells:
            x = values(data, col)
            ok = ~np.isnan(x) if group is None else ~np.isnan(x) & (codes(data, group) == level)
            out.append(np.sort(data_key(x[ok])))
        return out

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        return {"threshold": order_value(split_points(server_state["lo"], server_state["hi"]))}

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        t = order_key(np.asarray(message["threshold"], dtype=float))
        below = np.zeros(t.shape)
        for k, keys in enumerate(state):
            at = self.cell == k
            below[at] = np.searchsorted(keys, t[at], side="right")
        return {"below": below}, state

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        # whole counts (secure aggregation sums to within 2**-44)
        below = np.rint(replies.sums["below"])  # type: ignore[attr-defined]
        lo, hi = server_state["lo"], server_state["hi"]
        t = split_points(lo, hi)
        enough = below >= (self.ranks + 1)[:, None]
        j = np.where(enough.any(axis=1), enough.argmax(axis=1), t.shape[1])  # the first part end with enough
        rows = np.arange(len(lo))
        new_hi = np.where(j < t.shape[1], t[rows, np.minimum(j, t.shape[1] - 1)], hi)
        new_lo = np.where(j > 0, t[rows, np.maximum(j - 1, 0)] + np.uint64(1), lo)
        done = lo == hi  # already found: keep
        lo, hi = np.where(done, lo, new_lo), np.where(done, hi, new_hi)
        return {"lo": lo, "hi": hi}, {"open": float(np.sum(lo != hi))}

    def converged(self, server_state: Any, metrics: Mapping[str, float]) -> bool:
        return metrics["open"] == 0


class _NoisyQuantileSearch(FederatedAlgorithm):
    """The differentially private search: each round, per sought quantile, 15 thresholds
    evenly spaced in its interval of values; each client sends, per threshold, how many of its
    present values (clipped into ``bounds``) are at or below it, with its share of Gaussian
    noise (``privacy``); the server keeps the part where the noisy count first reaches the
    quantile's noisy target count. A row's contribution is one 0/1 indicator per threshold, so
    its L2 norm is at most ``sqrt(15 m)`` (m quantiles): that is the bound, and nothing is
    clipped."""

    reply_keys = summed_keys = ("below",)

    def __init__(
        self, column: Column, privacy: Any, n_clients: int, targets: np.ndarray, bounds: tuple[float, float]
    ) -> None:
        self.column, self.privacy, self.n_clients = column, privacy, int(n_clients)
        self.targets = np.asarray(targets, dtype=float)
        self.bounds = (float(bounds[0]), float(bounds[1]))

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict[str, np.ndarray]:
        m = len(self.targets)
        return {"a": np.full(m, self.bounds[0]), "b": np.full(m, self.bounds[1])}

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> None:
        return None

    @staticmethod
    def _thresholds(state: Mapping[str, np.ndarray]) -> np.ndarray:
        j = np.arange(1, BRANCHES) / BRANCHES
        return state["a"][:, None] + (state["b"] - state["a"])[:, None] * j[None, :]

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        return {"threshold": self._thresholds(server_state)}

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        x = values(data, self.column)
        x = np.clip(x[~np.isnan(x)], *self.bounds)
        t = np.asarray(message["threshold"], dtype=float)
        rows = {"below": (x[:, None, None] <= t[None]).reshape(len(x), -1).astype(float)}
        out = self.privacy.client_sums(rows, rng, n_clients=self.n_clients)
        return {"below": np.asarray(out.sums["below"], dtype=float).reshape(t.shape)}, state

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        below = np.maximum.accumulate(np.asarray(replies.sums["below"]).reshape(len(self.targets), -1), axis=1)  # type: ignore[attr-defined]
        t = self._thresholds(server_state)
        enough = below >= self.targets[:, None]
        j = np.where(enough.any(axis=1), enough.argmax(axis=1), t.shape[1])
        ends = np.concatenate([server_state["a"][:, None], t, server_state["b"][:, None]], axis=1)
        rows = np.arange(len(self.targets))
        return {"a": ends[rows, j], "b": ends[rows, j + 1]}, {}


def private_quantiles(
    ex: Exchanges, col: Column, qs: np.ndarray, dp: Any, bounds: Any, rounds: int
) -> tuple[np.ndarray, float, Any]:
    """The differentially private quantiles (see :func:`quantiles`): ``(values, the noisy
    count, the privacy spent)``."""
    from ..privacy import DifferentialPrivacy, PrivacyLedger, PrivacySpent

    if not isinstance(dp, DifferentialPrivacy):
        raise TypeError(f"dp must be a fedstats.privacy.DifferentialPrivacy, got {type(dp).__name__}")
    if bounds is None or len(bounds) != 2 or not (np.isfinite(bounds).all() and bounds[0] < bounds[1]):
        raise ValueError(
            f"the private quantiles search a public range of values: give bounds=(low, high), got {bounds!r}"
        )
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    ledger = PrivacyLedger(dp.accountant)
    K = ex.data.n_clients

    def option(bound: float) -> DifferentialPrivacy:
        return DifferentialPrivacy(**{**dp.as_dict(), "clip": {"n" if bound == 1.0 else "below": bound}})

    n_noisy = float(ex.iterate(_NoisyCount(col, option(1.0), K), 1, "private count", ledger)["n"][0])
    targets = np.maximum(qs * max(n_noisy, 1.0), 0.5)
    search = _NoisyQuantileSearch(col, option(float(np.sqrt((BRANCHES - 1) * len(qs)))), K, targets, tuple(bounds))
    s = ex.iterate(search, rounds, "private quantile search", ledger)
    return (s["a"] + s["b"]) / 2, n_noisy, PrivacySpent(dp, ledger)


class _NoisyCount(_SumRound, FederatedAlgorithm):
    """The differentially private count of present values (each row's 1, with noise)."""

    reply_keys = summed_keys = ("n",)
    random_client_steps = True

    def __init__(self, column: Column, privacy: Any, n_clients: int) -> None:
        self.column, self.privacy, self.n_clients = column, privacy, int(n_clients)

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        x = values(data, self.column)
        out = self.privacy.client_sums({"n": np.ones(int(np.sum(~np.isnan(x))))}, rng, n_clients=self.n_clients)
        return {"n": np.atleast_1d(np.asarray(out.sums["n"], dtype=float))}, state


def order_statistics(
    ex: Exchanges, cells: Sequence[tuple[Column, Column | None, int]], cell: np.ndarray, ranks: np.ndarray
) -> tuple[np.ndarray, int]:
    """The order statistics ``ranks`` (0-based) of their cells (``cell``), in one search:
    ``(values, rounds)``."""
    if len(ranks) == 0:
        return np.empty(0), 0
    state = ex.iterate(_QuantileSearch(cells, cell, ranks), _MAX_ROUNDS, "quantile search")
    assert np.all(state["lo"] == state["hi"])
    return order_value(state["lo"]), int(ex.parts[-1].rounds)


def quantile_values(
    ex: Exchanges, cells: Sequence[tuple[Column, Column | None, int]], ns: Sequence[int], q: np.ndarray, method: str
) -> tuple[np.ndarray, int]:
    """The quantiles ``q`` of every cell (``ns``: its count of present values; a cell without
    values gets NaN), in one search: ``(values (cells, len(q)), rounds)``."""
    which: list[int] = []
    ranks: list[int] = []
    plan: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = []
    for k, n in enumerate(ns):
        if n < 1:
            plan.append(None)
            continue
        low, high, gamma = _order_positions(int(n), q, method)
        plan.append((low, high, gamma))
        for r in np.unique(np.r_[low, high]):
            which.append(k)
            ranks.append(int(r))
    found, rounds = order_statistics(ex, cells, np.asarray(which), np.asarray(ranks))
    at = {(k, r): v for k, r, v in zip(which, ranks, found, strict=True)}
    out = np.full((len(ns), len(q)), np.nan)
    for k, p in enumerate(plan):
        if p is None:
            continue
        low, high, gamma = p
        a = np.array([at[k, int(i)] for i in low])
        b = np.array([at[k, int(i)] for i in high])
        out[k] = a if method in ("lower", "higher", "nearest") else _lerp(a, b, gamma)
    return out, rounds


@dataclass
class QuantileResult:
    """Exact quantiles of a column over the clients: ``values`` (one per ``q``), the ``method``
    (numpy's definition), the row count ``n``, the ``rounds`` (the row count's and the
    search's: at most 17) and the run's ``communication``."""

    column: str
    q: np.ndarray
    values: np.ndarray
    method: str
    n: int
    rounds: int
    communication: Any
    privacy: Any = None

    def to_series(self) -> pd.Series:
        """The quantiles indexed by ``q``."""
        return pd.Series(self.values, index=pd.Index(self.q, name="q"), name=self.column)

    def to_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "q": self.q.tolist(),
            "values": self.values.tolist(),
            "method": self.method,
            "n": self.n,
            "rounds": self.rounds,
            **({} if self.privacy is None else {"epsilon": self.privacy.epsilon, "delta": self.privacy.delta}),
        }

    def summary(self) -> pd.DataFrame:
        """One row per ``q``: the quantile."""
        return self.to_series().to_frame("quantile")


def _order_positions(n: int, q: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's arithmetic (``numpy.quantile``'s virtual indices, method by method): the two
    order statistics (0-based) each quantile interpolates between and the weight of the upper."""
    h = (n - 1) * q
    if method in ("lower", "higher", "nearest"):
        rounded = np.floor(h) if method == "lower" else np.ceil(h) if method == "higher" else np.around(h)
        i = rounded.astype(np.int64)
        return i, i, np.zeros_like(q)
    virtual = h if method == "linear" else 0.5 * (np.floor(h) + np.ceil(h))
    prev = np.floor(virtual).astype(np.int64)
    gamma = virtual - prev if method == "linear" else np.where(virtual % 1 == 0, 0.0, 0.5)
    return np.clip(prev, 0, n - 1), np.clip(prev + 1, 0, n - 1), gamma


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's interpolation between order statistics, to the last bit."""
    diff = b - a
    out = np.asarray(a + diff * t)
    return np.where(t >= 0.5, b - diff * (1 - t), out)


def quantiles(
    data: FederatedData,
    column: str,
    q: float | Sequence[float],
    *,
    method: str = "linear",
    dp: Any = None,
    bounds: tuple[float, float] | None = None,
    rounds: int = 8,
    seed: int = 0,
    backend: Any = None,
) -> QuantileResult:
    """Exact quantiles of ``column`` (a feature or the target) over every client's rows, equal
    to ``numpy.quantile(pooled, q, method=method)`` of its present values (see the module's
    docs for the rounds and what the server learns).

    Parameters
    ----------
    data : FederatedData
    column : str
    q : float or sequence of float
        Probabilities in [0, 1].
    method : {"linear", "lower", "higher", "midpoint", "nearest"}
        numpy's definition (default ``"linear"``, numpy's default).
    dp : DifferentialPrivacy, optional
        Differentially private quantiles instead (:mod:`fedstats.privacy`: its
        ``noise_multiplier``, ``delta``, ``accountant`` and ``placement``; the bound of each
        row's contribution is set here, as nothing needs clipping): a noisy count of the
        present values, then ``rounds`` rounds of noisy counts below 15 thresholds per
        quantile in ``bounds``, values clipped into them. Each quantile is where the noisy
        count of values at or below it first reaches ``q`` times the noisy count (no
        interpolation: ``method`` does not apply), to within ``(high - low) / 16**rounds``
        plus the noise's effect. ``result.privacy`` holds the epsilon spent (at ``delta``).
    bounds : (float, float)
        With ``dp``: the public range of the values (required).
    rounds : int
        With ``dp``: the rounds of the search (default 8).
    seed : int
        The runtime's seed (the exact rounds draw nothing; the private ones draw the noise).
    backend : optional
        Where the clients' steps run (as every model's ``fit``: ``"inprocess"``, ``"flower"``
        or a :class:`~fedstats.federation.flower.FlowerSession`).

    Examples
    --------
    >>> import numpy as np
    >>> from fedstats import FederatedData
    >>> rng = np.random.default_rng(0)
    >>> Xs = [rng.normal(size=(n, 1)) for n in (30, 50, 20)]
    >>> data = FederatedData.from_arrays(Xs)
    >>> res = quantiles(data, "x0", [0.25, 0.5, 0.75])
    >>> bool(np.array_equal(res.values, np.quantile(np.concatenate(Xs)[:, 0], [0.25, 0.5, 0.75])))
    True
    """
    if method not in QUANTILE_METHODS:
        raise ValueError(f"method must be one of {QUANTILE_METHODS}, got {method!r}")
    qs = np.atleast_1d(np.asarray(q, dtype=float))
    if qs.ndim != 1 or not np.all((qs >= 0) & (qs <= 1)):
        raise ValueError(f"q must be probabilities in [0, 1], got {q!r}")
    with use_backend(backend):
        col = resolve(data, column)
        if col.categorical:
            raise DataError(f"column {column!r} is categorical: its quantiles are not defined")
        ex = Exchanges(data, [col], seed=seed, what="quantiles")
        if dp is not None:
            vals, n_noisy, spent = private_quantiles(ex, col, qs, dp, bounds, rounds)
            return QuantileResult(column, qs, vals, "private", round(n_noisy), 1 + rounds, ex.communication, spent)
        n = int(ex.sums(_GroupMoments([col]), "row count")["n"][0, 0])
        min_rows = released_rules(data)[0]
        if n < min_rows:
            raise DataError(
                f"quantiles of {n} values would reveal rows: the disclosure rule min_rows asks for at least "
                f"{min_rows} (data.with_rules(min_rows=...) to relax it)"
            )
        vals, rounds = quantile_values(ex, [(col, None, 0)], [n], qs, method)
    return QuantileResult(column, qs, vals[0], method, n, 1 + rounds, ex.communication)
