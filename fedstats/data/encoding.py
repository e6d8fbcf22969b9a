"""How a fit's columns were encoded, and new rows encoded the same way, by name.

A :class:`~fedstats.data.FederatedData` remembers how its feature columns came from a data
frame (:attr:`~fedstats.data.FederatedData.encoding`): numeric columns as they are, a
categorical column as dummies ``col[level]`` over the levels it had. Every fitted model keeps
that encoding, so ``predict`` on a data frame matches columns by name (in any order), refuses
a column the fit never saw or one it needs and does not get, naming them, and encodes a
category exactly as the fit did. An array is taken by position, as before.

The encoding is a plain dict (it is saved in result files as it is)::

    {"features": [{"column": "age", "levels": None},
                  {"column": "smoker", "levels": ["no", "yes"], "used": ["yes"]}],
     "names": ["age", "smoker[yes]"],      # the encoded feature names, in order
     "ignore": ["site", "y"]}              # the fit's client and target columns
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .validation import DataError, preview


def numeric_encoding(names: Sequence[str], ignore: Sequence[Hashable] = ()) -> dict[str, Any]:
    """The encoding of numeric features ``names`` (data given as arrays: each name its own column)."""
    return {
        "features": [{"column": str(n), "levels": None} for n in names],
        "names": [str(n) for n in names],
        "ignore": [str(c) for c in ignore],
    }


def encode_rows(X: Any, encoding: dict[str, Any] | None, names: Sequence[str]) -> Any:
    """The rows of ``X`` as the float array of the encoded features ``names`` (in that order).

    A :class:`pandas.DataFrame` is read by column name through ``encoding`` (``None``: every
    name of ``names`` is a numeric column): a column the fit did not use (and that is not
    its client or target column) or a column it needs and does not find raises
    :class:`~fedstats.data.DataError` naming them; a categorical column is encoded with the
    fit's levels (a level the fit did not see, or a missing value, raises). Anything else is
    returned as it is, to be read by position.

    Example
    -------
    >>> import pandas as pd
    >>> enc = {"features": [{"column": "age", "levels": None},
    ...                     {"column": "smoker", "levels": ["no", "yes"], "used": ["yes"]}],
    ...        "names": ["age", "smoker[yes]"], "ignore": []}
    >>> encode_rows(pd.DataFrame({"smoker": ["yes", "no"], "age": [50, 60]}), enc, enc["names"])
    array([[50.,  1.],
           [60.,  0.]])
    """
    if not isinstance(X, pd.DataFrame):
        return X
    if encoding is None:
        encoding = numeric_encoding(names)
    names = [str(n) for n in names]
    dummies: dict[str, tuple[str, Any]] = {}  # encoded name -> (column, level)
    plain: dict[str, str] = {}  # encoded name -> its numeric column
    for f in encoding["features"]:
        col = str(f["column"])
        if f["levels"] is None:
            plain[col] = col
        else:
            for lev in f["used"]:
                dummies[f"{col}[{lev}]"] = (col, lev)
    unknown_names = [n for n in names if n not in plain and n not in dummies]
    if unknown_names:  # the model's own names must come from its encoding
        raise DataError(f"the fit's encoding has no feature(s) {preview(unknown_names)}")
    need = list(dict.fromkeys(plain[n] if n in plain else dummies[n][0] for n in names))
    known = {str(f["column"]) for f in encoding["features"]} | {str(c) for c in encoding.get("ignore", [])}
    cols = [str(c) for c in X.columns]
    if len(set(cols)) != len(cols):
        raise DataError(f"duplicate column label(s): {preview(sorted({c for c in cols if cols.count(c) > 1}))}")
    unknown = [c for c in cols if c not in known]
    if unknown:
        raise DataError(f"column(s) {preview(unknown)} were not in the fit (it used {preview(need, 20)})")
    missing = [c for c in need if c not in cols]
    if missing:
        raise DataError(f"column(s) {preview(missing)} of the fit are missing (it used {preview(need, 20)})")
    frame = X.set_axis(cols, axis=1)
    levels = {str(f["column"]): list(f["levels"]) for f in encoding["features"] if f["levels"] is not None}
    out = np.empty((len(X), len(names)))
    for j, n in enumerate(names):
        if n in plain:
            s = frame[plain[n]]
            if not (pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s)):
                raise DataError(f"column {plain[n]!r} is numeric in the fit, got dtype {s.dtype}")
            out[:, j] = s.to_numpy(dtype=float)
            continue
        col, lev = dummies[n]
        values = frame[col].to_numpy(dtype=object)
        na = pd.isna(frame[col]).to_numpy()
        if na.any():
            raise DataError(f"categorical column {col!r} has {int(na.sum())} missing value(s)")
        new = sorted({v for v in values if v not in levels[col]}, key=repr)
        if new:
            raise DataError(
                f"categorical column {col!r} has level(s) {preview(new)} the fit did not see (its levels: "
                f"{preview(levels[col], 20)})"
            )
        out[:, j] = (values == lev).astype(float)
    return out
