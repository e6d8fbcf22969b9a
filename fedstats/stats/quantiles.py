"""Exact federated quantiles by bisection on summed counts.

A quantile of the pooled rows is an order statistic (or two, interpolated). The ``r``-th
smallest value is the smallest ``t`` with at least ``r + 1`` pooled values ``<= t``, and that
count is a sum over the clients. So the server bisects: each round it sends thresholds, each
client answers how many of its values are ``<=`` each one, and the server receives only the
sums (declared summed: under secure aggregation it learns nothing else). The search runs over
the float64 numbers in their order (an order-preserving map of their bits to integers), so it
ends on a value exactly: 64 rounds at most (the bits of a float64), after one round that sums
the clients' row counts. Every order statistic needed by every requested quantile is found in the same
rounds (one threshold each per round).

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
from ..federation.oneshot import OneShotSums, raise_failures, run_once
from ..federation.protocol import ClientId, FederatedAlgorithm, Message, client_function
from ..federation.runner import run

__all__ = ["quantiles", "QuantileResult", "QUANTILE_METHODS"]

#: numpy's definitions this module computes exactly (``numpy.quantile(..., method=)``)
QUANTILE_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")
_SIGN = np.uint64(1) << np.uint64(63)
_MAX_ROUNDS = 64


def _key(x: np.ndarray) -> np.ndarray:
    """An order-preserving map of float64 values to uint64 keys (``-0.0`` just below ``0.0``)."""
    u = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    return np.where(u & _SIGN, ~u, u | _SIGN)


def _value(k: np.ndarray) -> np.ndarray:
    """The float64 values of keys (:func:`_key` inverted)."""
    k = np.asarray(k, dtype=np.uint64)
    return np.where(k & _SIGN, k & ~_SIGN, ~k).view(np.float64)


def _column(data: FederatedData, column: str) -> int | None:
    """The position of ``column`` among the features, or ``None`` for the target."""
    if column in data.feature_names:
        return data.feature_names.index(column)
    if data.has_target and column == data.target_name:
        return None
    raise DataError(
        f"no column {column!r}; the columns are {[*data.feature_names, *([data.target_name] if data.has_target else [])]}"
    )


@client_function
def row_count(payload: Message, X: np.ndarray, rng: np.random.Generator, private: Any) -> Message:
    """A client's row count (summed over the clients)."""
    return {"n": np.array([float(len(X))])}


class _RowCount(OneShotSums):
    """One round: each client's row count, summed over the clients."""

    reply_keys = ("n",)
    summed_keys = ("n",)

    def __init__(self) -> None:
        super().__init__(("n",), ("n",), {}, row_count)


class _Bisection(FederatedAlgorithm):
    """Rounds of counts below thresholds: each client sends, per threshold, how many of its
    values of one column are ``<=`` it (summed over the clients); the server narrows each
    order statistic's interval of keys by half."""

    reply_keys = ("below",)
    summed_keys = ("below",)
    random_client_steps = False

    def __init__(self, column: int | None, ranks: np.ndarray) -> None:
        self.column = column
        self.ranks = np.asarray(ranks, dtype=np.int64)

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict[str, np.ndarray]:
        m = len(self.ranks)
        lo = np.full(m, _key(np.array([-np.finfo(float).max]))[0], dtype=np.uint64)
        hi = np.full(m, _key(np.array([np.finfo(float).max]))[0], dtype=np.uint64)
        return {"lo": lo, "hi": hi}

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> None:
        return None

    def _mid(self, state: Mapping[str, np.ndarray]) -> np.ndarray:
        lo, hi = state["lo"], state["hi"]
        return lo + (hi - lo) // np.uint64(2)

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        return {"threshold": _value(self._mid(server_state))}

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        x = np.asarray(data.y if self.column is None else data.X[:, self.column], dtype=float)
        t = np.asarray(message["threshold"], dtype=float)
        return {"below": np.sum(x[:, None] <= t[None, :], axis=0).astype(float)}, state

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        below = np.asarray(replies.sums["below"])  # type: ignore[attr-defined]
        mid = self._mid(server_state)
        enough = below >= self.ranks + 1
        lo = np.where(enough, server_state["lo"], mid + np.uint64(1))
        hi = np.where(enough, mid, server_state["hi"])
        done = server_state["lo"] == server_state["hi"]  # already found: keep
        lo, hi = np.where(done, server_state["lo"], lo), np.where(done, server_state["hi"], hi)
        return {"lo": lo, "hi": hi}, {"open": float(np.sum(lo != hi))}

    def converged(self, server_state: Any, metrics: Mapping[str, float]) -> bool:
        return metrics["open"] == 0


@dataclass
class QuantileResult:
    """Exact quantiles of a column over the clients: ``values`` (one per ``q``), the ``method``
    (numpy's definition), the row count ``n``, the ``rounds`` (the row count's and the
    bisection's: at most 65) and the bisection's ``communication``."""

    column: str
    q: np.ndarray
    values: np.ndarray
    method: str
    n: int
    rounds: int
    communication: Any

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
    data: FederatedData, column: str, q: float | Sequence[float], *, method: str = "linear", seed: int = 0
) -> QuantileResult:
    """Exact quantiles of ``column`` (a feature or the target) over every client's rows, equal
    to ``numpy.quantile(pooled, q, method=method)`` (see the module's docs for the rounds and
    what the server learns).

    Parameters
    ----------
    data : FederatedData
    column : str
    q : float or sequence of float
        Probabilities in [0, 1].
    method : {"linear", "lower", "higher", "midpoint", "nearest"}
        numpy's definition (default ``"linear"``, numpy's default).
    seed : int
        The runtime's seed (the rounds draw nothing).

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
    col = _column(data, column)
    replies, _ = run_once(_RowCount(), data, seed=seed, what="the row count")
    n = int(np.asarray(replies.sums["n"])[0])
    if n < data.min_rows:
        raise DataError(
            f"quantiles of {n} rows would reveal rows: the disclosure rule min_rows asks for at least {data.min_rows}"
        )
    low, high, gamma = _order_positions(n, qs, method)
    ranks = np.unique(np.r_[low, high])
    r = run(_Bisection(col, ranks), data, rounds=_MAX_ROUNDS, seed=seed, progress=False, kind="quantile bisection")
    raise_failures(r.history, "the quantile bisection")
    found = dict(zip(ranks.tolist(), _value(r.server_state["lo"]).tolist(), strict=True))
    a = np.array([found[i] for i in low])
    b = np.array([found[i] for i in high])
    values = a if method in ("lower", "higher", "nearest") else _lerp(a, b, gamma)
    return QuantileResult(column, qs, np.asarray(values, dtype=float), method, n, 1 + len(r.history), r.communication)
