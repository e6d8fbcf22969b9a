"""Data-frame ingestion: the arrays of a long data frame with one row per observation and a
client-id column, and the way back (:meth:`FederatedData.from_dataframe` and
:meth:`FederatedData.to_dataframe` call these)."""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .validation import SHOW, DataError, cname, normalize_id, preview

if TYPE_CHECKING:
    from .container import FederatedData


def frame_to_arrays(
    df: pd.DataFrame,
    *,
    by: Hashable,
    target: Hashable | None,
    features: Sequence[Hashable] | None,
    categorical: str,
    drop_first: bool,
    missing: str = "error",
) -> dict[str, Any]:
    """The per-client arrays, ids and names of ``df`` (arguments of
    :meth:`FederatedData.from_dataframe`), as keyword arguments of ``FederatedData``."""
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    if categorical not in ("error", "onehot"):
        raise DataError(f"categorical must be 'error' or 'onehot', got {categorical!r}")
    if missing not in ("error", "keep"):
        raise DataError(f"missing must be 'error' or 'keep', got {missing!r}")
    cols = list(df.columns)
    absent = [c for c in (by, target) if c not in cols and not (c is target and target is None)]
    if absent:
        which = ", ".join(f"{'by' if c == by else 'target'}={c!r}" for c in absent)
        raise DataError(f"column(s) not in the data frame: {which}; columns are {preview(cols, 10)}")
    if target is not None and by == target:
        raise DataError(f"by and target are the same column {by!r}")
    if features is None:
        features = [c for c in cols if c != by and c != target]
    else:
        if isinstance(features, str):
            raise DataError("features must be a sequence of column names, not a single str")
        features = list(features)
        absent_features = [c for c in features if c not in cols]
        if absent_features:
            raise DataError(f"feature column(s) not in the data frame: {preview(absent_features, 10)}")
        clash = [c for c in features if c == by or c == target]
        if clash:
            raise DataError(f"features must not include the by/target column(s): {preview(clash)}")
    if not features and target is None:  # with a target, features=[] is an intercept-only model
        raise DataError("no feature columns")
    dup_cols = sorted({c for c in [by, target, *features] if cols.count(c) > 1}, key=str)
    if dup_cols:
        raise DataError(f"duplicate column label(s) in the data frame: {preview(dup_cols)}")
    if len(df) == 0:
        raise DataError("the data frame has no rows")

    # clients in order of first appearance; a missing id would silently lose rows
    codes, uniques = pd.factorize(df[by], sort=False, use_na_sentinel=True)
    n_na = int((codes < 0).sum())
    if n_na:
        raise DataError(f"column by={by!r} has {n_na} missing client id(s)")
    client_ids = [normalize_id(u) for u in uniques]
    rows = [np.flatnonzero(codes == k) for k in range(len(client_ids))]

    def client_of(mask: np.ndarray) -> str:
        # the clients whose rows are flagged, for error messages
        return ", ".join(cname(client_ids[k]) for k in np.unique(codes[mask])[:SHOW])

    blocks: list[np.ndarray] = []
    names: list[str] = []
    encoded: list[dict[str, Any]] = []  # how each column became features (fedstats.data.encoding)
    for col in features:
        s = df[col]
        kind = _column_kind(s)
        if kind == "numeric":
            blocks.append(_numeric_column(s)[:, None])
            names.append(str(col))
            encoded.append({"column": str(col), "levels": None})
        elif kind == "unsupported":
            raise DataError(
                f"feature column {col!r} has dtype {s.dtype}, which fedstats does not "
                "encode; convert it to numbers first"
            )
        elif categorical == "error":
            i = _first_non_number(s)
            raise DataError(
                f"feature column {col!r} is not numeric (dtype {s.dtype}; e.g. value "
                f"{s.iloc[i]!r} in {cname(client_ids[int(codes[i])])}); pass "
                "categorical='onehot' to one-hot encode it, or convert it with pd.to_numeric"
            )
        else:
            na = s.isna().to_numpy()
            if na.any() and missing != "keep":
                raise DataError(
                    f"categorical feature column {col!r} has {int(na.sum())} missing "
                    f"value(s) (in {client_of(na)}); rows are never dropped silently"
                )
            levels = _levels(s[~na]) if na.any() else _levels(s)
            used = levels[1:] if drop_first else levels
            if not used:
                warnings.warn(
                    f"categorical feature column {col!r} has a single level "
                    f"{levels[0]!r}; with drop_first=True it contributes no column",
                    UserWarning,
                    stacklevel=2,
                )
            values = s.to_numpy(dtype=object)
            encoded.append(
                {"column": str(col), "levels": [_plain(v) for v in levels], "used": [_plain(v) for v in used]}
            )
            for lev in used:
                blocks.append(np.where(na, np.nan, (values == lev).astype(np.float64))[:, None])
                names.append(f"{col}[{lev}]")

    y_all = None
    if target is not None:
        t = df[target]
        if _column_kind(t) != "numeric":
            raise DataError(f"target column {target!r} is not numeric (dtype {t.dtype}); encode it as numbers")
        y_all = _numeric_column(t)
    if not blocks and (features or target is None):
        raise DataError("no feature columns left after encoding")
    # one (n, d) array of the frame the caller already holds, split straight back per client
    X_all = np.hstack(blocks) if blocks else np.empty((len(df), 0))
    return {
        "Xs": [X_all[r] for r in rows],
        "ys": None if y_all is None else [y_all[r] for r in rows],
        "clients": client_ids,
        "feature_names": names,
        "target_name": str(target) if target is not None else "y",
        "encoding": {"features": encoded, "names": names, "ignore": [str(c) for c in (by, target) if c is not None]},
    }


def _plain(v: Any) -> Any:
    """A level as a plain Python value (numpy scalars become Python ones: the encoding is saved as JSON)."""
    return v.item() if isinstance(v, np.generic) else v


def frame_of(fd: FederatedData, client_col: str) -> pd.DataFrame:
    """``fd`` in long format (:meth:`FederatedData.to_dataframe`)."""
    if client_col in fd.feature_names or client_col == fd.target_name:
        raise DataError(
            f"client column name {client_col!r} clashes with a feature/target name; pass another client_col"
        )
    frames = []
    for c, cd in fd.items():
        part = pd.DataFrame(cd.X, columns=fd.feature_names)
        part.insert(0, client_col, pd.Series([c] * len(part), dtype=object))
        if cd.y is not None:
            part[fd.target_name] = cd.y
        frames.append(part)
    out = pd.concat(frames, ignore_index=True)
    # a homogeneous id column (all str / all int) gets its natural dtype back
    out[client_col] = out[client_col].infer_objects()
    return out


def _column_kind(s: pd.Series) -> str:
    """'numeric' (incl. bool), 'categorical' (strings, objects, category) or 'unsupported'."""
    dt = s.dtype
    if pd.api.types.is_bool_dtype(dt):
        return "numeric"
    if isinstance(dt, pd.CategoricalDtype):
        return "categorical"
    if pd.api.types.is_complex_dtype(dt):
        return "unsupported"
    if pd.api.types.is_numeric_dtype(dt):
        return "numeric"
    if (
        pd.api.types.is_datetime64_any_dtype(dt)
        or pd.api.types.is_timedelta64_dtype(dt)
        or isinstance(dt, pd.PeriodDtype)
    ):
        return "unsupported"
    return "categorical"


def _first_non_number(s: pd.Series) -> int:
    """Position of the first value that is not a plain number (for error messages)."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        return 0
    for i, v in enumerate(s.to_numpy(dtype=object)):
        if not isinstance(v, (int, float, np.number)) or isinstance(v, bool):
            return i
    return 0


def _numeric_column(s: pd.Series) -> np.ndarray:
    # nullable dtypes: a missing value becomes NaN and is then reported per client
    return s.to_numpy(dtype=np.float64, na_value=np.nan)


def _levels(s: pd.Series) -> list[Any]:
    """Levels of a categorical column over the whole frame: category order, else sorted."""
    present = pd.unique(s.to_numpy(dtype=object))
    if isinstance(s.dtype, pd.CategoricalDtype):
        # only levels that occur: an unused category would be an all-zero dummy everywhere
        keep = set(present)
        return [lev for lev in s.cat.categories if lev in keep]
    try:
        return sorted(present)
    except TypeError:  # mixed types: a deterministic order all the same
        return sorted(present, key=lambda v: (type(v).__name__, str(v)))
