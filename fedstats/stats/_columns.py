"""Columns by name, as the statistics read them: a numeric column (a feature or the target),
or a categorical one (the dummies of a data frame's categorical column, or a numeric column
of codes whose levels are known). The server resolves names into :class:`Column` specs; the
specs travel inside the exchanges, and each client reads its own rows with them
(:func:`values`, :func:`codes`). NaN marks a missing value (data built with
``missing="keep"``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data import FederatedData
from ..data.validation import DataError

__all__ = [
    "Column",
    "resolve",
    "values",
    "codes",
    "column_names",
    "order_key",
    "order_value",
    "data_key",
    "split_points",
    "BRANCHES",
    "SEARCH_ROUNDS",
]

_SIGN = np.uint64(1) << np.uint64(63)


def order_key(x: np.ndarray) -> np.ndarray:
    """An order-preserving map of float64 values to uint64 keys (``-0.0`` just below ``0.0``;
    a client maps its data with :func:`data_key`)."""
    u = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    return np.where(u & _SIGN, ~u, u | _SIGN)


#: how many parts a search splits an interval of the float64 order into per round: 16 parts,
#: 4 bits a round, so at most 16 rounds cover the 64 bits of a float64
BRANCHES = 16
SEARCH_ROUNDS = 16


def split_points(lo: np.ndarray, hi: np.ndarray, parts: int = BRANCHES) -> np.ndarray:
    """For each interval ``[lo, hi]`` of keys, the ends of its first ``parts - 1`` parts
    (``floor((hi - lo) * j / parts)`` above ``lo``, j = 1 .. parts - 1, exactly in uint64),
    shape ``(m, parts - 1)``: the parts are ``[lo, t1], [t1 + 1, t2], ..., [t_(parts-1) + 1, hi]``
    (some empty when the interval holds fewer than ``parts`` keys)."""
    lo = np.asarray(lo, dtype=np.uint64)[:, None]
    w = np.asarray(hi, dtype=np.uint64)[:, None] - lo
    j = np.arange(1, parts, dtype=np.uint64)[None, :]
    b = np.uint64(parts)
    return lo + (w // b) * j + ((w % b) * j) // b


def data_key(x: np.ndarray) -> np.ndarray:
    """The keys of data values: :func:`order_key` with ``-0.0`` read as ``0.0`` (equal values,
    one key: a tie in the ranks)."""
    return order_key(np.asarray(x, dtype=np.float64) + 0.0)


def order_value(k: np.ndarray) -> np.ndarray:
    """The float64 values of keys (:func:`order_key` inverted)."""
    k = np.asarray(k, dtype=np.uint64)
    return np.where(k & _SIGN, k & ~_SIGN, ~k).view(np.float64)


@dataclass(frozen=True)
class Column:
    """Where a column's values are in a client's arrays.

    ``index``: the feature positions (one for a numeric column; a categorical column's dummies),
    ``None`` for the target. ``categories``: a categorical column's categories (its levels), in
    order (``()`` for a numeric column). ``dummy_category``: the category of each dummy (by
    position in ``categories``);
    ``reference``: the level of a row whose dummies are all 0 (-1: none). ``codes_of``: a
    numeric column read as categorical: the values that are its levels. ``minus``: a paired
    difference, this column's values minus those of ``minus`` (both numeric). ``ranks``: the
    column's values replaced by their pooled mid-ranks (the sorted distinct values and their
    ranks; a value not among them, or missing, becomes NaN).
    """

    name: str
    index: tuple[int, ...] | None
    categories: tuple[Any, ...] = ()
    dummy_category: tuple[int, ...] = ()
    reference: int = -1
    codes_of: tuple[float, ...] = ()
    minus: Column | None = None  # a paired difference: this column's values minus ``minus``'s
    ranks: tuple[np.ndarray, np.ndarray] | None = None  # (sorted distinct values, their mid-ranks)

    @property
    def categorical(self) -> bool:
        return bool(self.categories)

    @property
    def n_categories(self) -> int:
        return len(self.categories)


def column_names(data: FederatedData) -> list[str]:
    """The columns of ``data`` as the statistics name them: each categorical column once by its
    name, each numeric feature, then the target."""
    out = [str(f["column"]) for f in data.encoding["features"]]
    return out + ([data.target_name] if data.has_target and data.target_name not in out else [])  # type: ignore[list-item]


def resolve(data: FederatedData, name: str) -> Column:
    """The :class:`Column` of ``name`` (a feature, a categorical column of a data frame, or
    the target), or a :class:`DataError` listing the columns."""
    if not isinstance(name, str):
        raise DataError(f"a column is named by a str, got {name!r}")
    names = data.feature_names
    for f in data.encoding["features"]:
        if str(f["column"]) != name or f["levels"] is None:
            continue
        used = [f"{name}[{lev}]" for lev in f["used"]]
        levels = tuple(f["levels"])
        dummy_category = tuple(levels.index(lev) for lev in f["used"])
        rest = [i for i in range(len(levels)) if i not in dummy_category]
        return Column(name, tuple(names.index(u) for u in used), levels, dummy_category, rest[0] if rest else -1)
    if name in names:
        return Column(name, (names.index(name),))
    if data.has_target and name == data.target_name:
        return Column(name, None)
    raise DataError(f"no column {name!r}; the columns are {column_names(data)}")


def with_categories(col: Column, values: Sequence[float]) -> Column:
    """A numeric column read as categorical, its categories the ``values``."""
    lv = tuple(float(v) for v in values)
    return Column(col.name, col.index, tuple(_plain(v) for v in lv), codes_of=lv)


def _plain(v: float) -> Any:
    return int(v) if float(v).is_integer() else v


def values(data: Any, col: Column) -> np.ndarray:
    """A client's values of numeric column ``col`` (NaN: missing)."""
    if col.categorical and not col.codes_of:
        raise DataError(f"column {col.name!r} is categorical (levels {list(col.categories)}), not numeric")
    x = np.asarray(data.y if col.index is None else data.X[:, col.index[0]], dtype=float)
    if col.minus is not None:
        x = x - values(data, col.minus)
    if col.ranks is not None:
        distinct, rank = col.ranks
        at = np.clip(np.searchsorted(distinct, x), 0, len(distinct) - 1)
        x = np.where(distinct[at] == x, rank[at], np.nan)
    return x


def codes(data: Any, col: Column) -> np.ndarray:
    """A client's level codes of categorical column ``col`` (0 .. L-1; L marks a missing value)."""
    L = col.n_categories
    if col.codes_of:
        x = values(data, Column(col.name, col.index))
        out = np.full(len(x), L, dtype=np.int64)
        for k, v in enumerate(col.codes_of):
            out[x == v] = k
        bad = (out == L) & ~np.isnan(x)
        if bad.any():
            raise DataError(
                f"column {col.name!r} has values other than its levels {list(col.categories)} in {int(bad.sum())} row(s)"
            )
        return out
    assert col.index is not None
    D = np.asarray(data.X[:, list(col.index)], dtype=float)
    out = np.full(len(D), L, dtype=np.int64)
    missing = np.isnan(D).any(axis=1)
    hot = D == 1
    any_hot = hot.any(axis=1)
    if len(col.dummy_category):
        out[any_hot] = np.asarray(col.dummy_category)[np.argmax(hot[any_hot], axis=1)]
    if col.reference >= 0:
        out[~any_hot] = col.reference
    out[missing] = L
    return out
