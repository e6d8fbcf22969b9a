"""Reading and checking the command's CSV files: the training data as a
:class:`~fedstats.data.FederatedData`, and the rows to predict encoded with its schema."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..data.disclosure import MIN_CELL_COUNT, MIN_ROWS
from ..data.validation import client_key
from .errors import CLIError


def read_csv(path: str, decimal: str = ".") -> pd.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise CLIError(f"file not found: {path}")
    try:
        # decimal commas go with semicolon-separated files (the convention where "1,5" is 1.5)
        df = pd.read_csv(p, sep=None if decimal == "." else ";", engine="python", decimal=decimal)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's file
        raise CLIError(f"cannot read {path} as CSV: {exc}") from None
    if df.empty:
        raise CLIError(f"{path} has no rows")
    return df


DECIMAL_COMMA = r"^\s*[-+]?\d+,\d+(?:[eE][-+]?\d+)?\s*$"


def check_columns(df: pd.DataFrame, features: list[str], target: str | None, by: str, path: str) -> None:
    """Refuse what would be fitted as silent nonsense: numbers written with decimal commas, text
    with so many levels that one-hot encoding would fit one coefficient per few rows, values too
    large to square in float64. (Missing columns and values are reported by :func:`data_from`;
    constant, duplicated and dependent predictors by the models' own design checks, by name.)"""
    cols = [*features, *([target] if target else [])]
    if by not in df.columns or any(c not in df.columns for c in cols):
        return
    n = len(df)
    for c in cols:
        v = df[c]
        if v.dtype == object or isinstance(v.dtype, pd.StringDtype):
            text = v.dropna().astype(str)
            if len(text) and text.str.match(DECIMAL_COMMA).mean() >= 0.5:
                raise CLIError(
                    f"{path}: column {c!r} holds numbers written with a decimal comma (e.g. "
                    f"{text[text.str.match(DECIMAL_COMMA)].iloc[0]!r}): pass --decimal ,"
                )
            if len(text) and pd.to_numeric(text, errors="coerce").notna().mean() >= 0.5:
                bad = text[pd.to_numeric(text, errors="coerce").isna()].iloc[0]
                raise CLIError(
                    f"{path}: column {c!r} is mostly numbers but holds text such as {bad!r}: fix or "
                    "remove those values (missing values must be empty)"
                )
            levels = text.nunique()
            if levels > 20 and levels > n / 5:
                raise CLIError(
                    f"{path}: column {c!r} is text with {levels} distinct values in {n} rows; one-hot "
                    f"encoding it would fit {levels - 1} coefficients: drop it (--features) or encode it"
                )
        elif pd.api.types.is_numeric_dtype(v) and not pd.api.types.is_bool_dtype(v):
            big = np.abs(v.to_numpy(dtype=float))
            if np.any(np.isfinite(big) & (big > 1e150)):
                raise CLIError(
                    f"{path}: column {c!r} has a value ({v.iloc[int(np.nanargmax(big))]:g}) too large to "
                    "square in float64: rescale it or check for a sentinel value"
                )


def data_from(
    df: pd.DataFrame,
    by: str,
    target: str | None,
    features,
    *,
    path: str,
    min_rows: int = MIN_ROWS,
    min_cell_count: int = MIN_CELL_COUNT,
):
    from ..data import DataError, FederatedData

    missing = [c for c in [by, *([target] if target else []), *(features or [])] if c not in df.columns]
    if missing:
        raise CLIError(
            f"{path}: column(s) not found: {', '.join(missing)} (columns: {', '.join(map(str, df.columns))})"
        )
    try:
        return FederatedData.from_dataframe(
            df,
            by=by,
            target=target,
            features=features or None,
            categorical="onehot",
            min_rows=min_rows,
            min_cell_count=min_cell_count,
        )
    except DataError as exc:
        raise CLIError(f"{path}: {exc}") from None


def data_columns(df, args) -> list[str]:
    return list(args.features) if args.features else [c for c in df.columns if c not in (args.by, args.target)]


def design(test: pd.DataFrame, data, path: str) -> np.ndarray:
    """Rows of ``test`` encoded as the training data were (its encoding: numeric columns and
    ``col[level]`` dummies over the levels it had, :func:`fedstats.data.encoding.encode_rows`),
    the feature columns read by name."""
    from ..data import DataError
    from ..data.encoding import encode_rows

    columns = [f["column"] for f in data.encoding["features"]]
    try:
        return np.asarray(encode_rows(test[columns], data.encoding, data.feature_names), dtype=float)
    except DataError as exc:
        raise CLIError(f"{path}: {exc}") from None


def read_test(args, df, data, refuse_new: str | None = None):
    """The prediction file: its rows and their design (checked before the fit). ``refuse_new``:
    why the model cannot predict a client that took no part in the fit (``None``: it can)."""
    tdf = read_csv(args.predict, args.decimal)
    cols = [args.by, *data_columns(df, args)]
    missing = [c for c in cols if c not in tdf.columns]
    if missing:
        raise CLIError(f"{args.predict}: column(s) not found: {', '.join(missing)}")
    if tdf[args.by].isna().any():
        lines = ", ".join(str(i + 2) for i in np.flatnonzero(tdf[args.by].isna().to_numpy())[:5])
        raise CLIError(f"{args.predict}: column {args.by!r} has missing client ids (line(s) {lines})")
    known = {client_key(c) for c in data.clients}
    unknown = sorted({client_key(v) for v in tdf[args.by]} - known)
    if unknown and refuse_new:
        raise CLIError(f"{args.predict}: {refuse_new}; client(s) not in the fit: {', '.join(unknown[:5])}")
    return tdf, design(tdf, data, args.predict)
