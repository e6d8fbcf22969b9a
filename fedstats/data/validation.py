"""Checks shared by the data containers: the errors they raise and the validation of
per-client arrays, ids and names, with messages that name the client and the column."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

ClientId = Hashable

# how many offending items (clients, columns, rows) an error message lists before "..."
SHOW = 5


class DataError(ValueError):
    """Invalid federated data (shape, non-finite value, non-numeric column, ...)."""


class UnknownClientError(DataError, KeyError):
    """A client id that the :class:`FederatedData` does not hold.

    Both a :class:`KeyError` (``fd[cid]``) and a :class:`DataError` (``fd.subset(...)``).
    """

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes
        return str(self.args[0]) if self.args else ""


class ConstantFeatureWarning(UserWarning):
    """A feature (or the target) is constant across all clients, so its sd is taken as 1."""


def cname(client: ClientId) -> str:
    # repr() keeps client 0 and client "0" apart in messages
    return f"client {client!r}"


def preview(items: Sequence[Any], k: int = SHOW) -> str:
    shown = ", ".join(repr(i) for i in list(items)[:k])
    return shown + (", ..." if len(items) > k else "")


def normalize_id(client: Any) -> ClientId:
    # numpy scalars (e.g. from a DataFrame column) become plain Python ids
    if isinstance(client, np.generic):
        client = client.item()
    if not isinstance(client, Hashable):
        raise DataError(f"client ids must be hashable, got {client!r}")
    return client


def as_float_array(a: Any, what: str, client: ClientId) -> np.ndarray:
    """``a`` as a fresh float64 array; non-numeric input is an error, never coerced."""
    arr = np.asarray(a)
    if arr.dtype.kind in "biuf":
        return np.array(arr, dtype=np.float64, copy=True)
    if arr.dtype.kind == "O":
        try:  # an object array of plain numbers (or None -> NaN, caught later) is fine
            return np.array(arr, dtype=np.float64, copy=True)
        except (TypeError, ValueError):
            pass
    raise DataError(f"{cname(client)}: {what} is not numeric (dtype {arr.dtype}); encode it as numbers first")


def nonfinite_X(X: np.ndarray, client: ClientId, feature_names: Sequence[str]) -> str | None:
    """What is not finite in client ``client``'s ``X``, per feature (``None``: nothing)."""
    bad = ~np.isfinite(X)
    if not bad.any():
        return None
    per_col = bad.sum(axis=0)
    cols = [f"feature {feature_names[int(j)]!r} in {int(per_col[j])} row(s)" for j in np.flatnonzero(per_col)]
    n_rows = int(bad.any(axis=1).sum())
    return (
        f"{cname(client)}: non-finite values (NaN or inf) in X: {'; '.join(cols[:SHOW])}"
        f"{'; ...' if len(cols) > SHOW else ''} ({n_rows} row(s) affected)"
    )


def nonfinite_y(y: np.ndarray, client: ClientId, target_name: str | None) -> str | None:
    """What is not finite in client ``client``'s target (``None``: nothing)."""
    bad = ~np.isfinite(y)
    if not bad.any():
        return None
    return f"{cname(client)}: non-finite values (NaN or inf) in target {target_name!r} in {int(bad.sum())} row(s)"


def raise_nonfinite(reports: Sequence[str]) -> None:
    """One :class:`DataError` naming every client with non-finite values (``reports`` of
    :func:`nonfinite_X` / :func:`nonfinite_y`), if any."""
    if not reports:
        return
    shown = " | ".join(reports[:SHOW]) + (f" | and {len(reports) - SHOW} more" if len(reports) > SHOW else "")
    raise DataError(f"{shown}. Rows are never dropped silently: remove or impute them before building the data.")


def missing_target(what: str) -> DataError:
    """The error of a supervised step (``what``) on data without a target."""
    return DataError(f"{what} needs a target, but this data has none (built without ys/target)")


def readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def duplicates(items: Iterable[Any]) -> list[Any]:
    """The items that repeat an earlier one, in order (each repeat listed once per repeat)."""
    seen: set[Any] = set()
    dups = []
    for item in items:
        if item in seen:
            dups.append(item)
        else:
            seen.add(item)
    return dups


def pair_up(Xs: Any, ys: Any, clients: Any) -> tuple[list[ClientId], list[Any], list[Any]]:
    """Client ids and the matching lists of X and y, with the id checks."""
    if isinstance(Xs, (np.ndarray, pd.DataFrame)):
        # a single array would silently be read as one "client" per row
        raise DataError("Xs must be a sequence (or dict) of per-client arrays, not a single array")
    if ys is None:  # no target: a placeholder per client keeps the pairing below simple
        if not isinstance(Xs, Mapping):
            Xs = list(Xs)
        ys = {c: None for c in Xs} if isinstance(Xs, Mapping) else [None] * len(Xs)
    if isinstance(Xs, Mapping):
        if clients is not None:
            raise DataError("give client ids either as the keys of Xs or via clients=, not both")
        if not isinstance(ys, Mapping):
            raise DataError("Xs is a dict, so ys must be a dict with the same client keys")
        ids = list(Xs.keys())
        missing = [c for c in ids if c not in ys]
        extra = [c for c in ys if c not in Xs]
        if missing or extra:
            raise DataError(
                "Xs and ys have different client keys: "
                + (f"no y for {preview(missing)}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"no X for {preview(extra)}" if extra else "")
            )
        X_list = [Xs[c] for c in ids]
        y_list = [ys[c] for c in ids]
    else:
        if isinstance(ys, Mapping):
            raise DataError("ys is a dict, so Xs must be a dict with the same client keys")
        X_list, y_list = list(Xs), list(ys)
        if len(X_list) != len(y_list):
            raise DataError(f"got {len(X_list)} X arrays but {len(y_list)} y arrays")
        if clients is None:
            ids = list(range(len(X_list)))
        else:
            if isinstance(clients, (str, bytes)):
                raise DataError("clients must be a sequence of ids, not a single string")
            ids = list(clients)
            if len(ids) != len(X_list):
                raise DataError(f"got {len(ids)} client ids for {len(X_list)} clients")
    if not ids:
        raise DataError("no clients: at least one client is required")
    ids = [normalize_id(c) for c in ids]
    dups = duplicates(ids)
    if dups:
        raise DataError(f"duplicate client ids: {preview(dups)}")
    return ids, X_list, y_list


def check_feature_names(feature_names: Any, d: int, target_name: str | None) -> list[str]:
    if feature_names is None:
        return [f"x{j}" for j in range(d)]
    if isinstance(feature_names, str):
        raise DataError("feature_names must be a sequence of str, not a single str")
    names = list(feature_names)
    if len(names) != d:
        raise DataError(f"feature_names has {len(names)} names but X has {d} columns")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise DataError(f"feature names must be str, got {preview(bad)}")
    dups = duplicates(names)
    if dups:
        raise DataError(f"duplicate feature names: {preview(dups)}")
    if target_name is not None and target_name in names:
        raise DataError(f"target_name {target_name!r} is also a feature name")
    return names


def validated_arrays(
    clients: Sequence[ClientId],
    X_list: Sequence[Any],
    y_list: Sequence[Any],
    target: str | None,
    feature_names: Sequence[str] | None,
    missing: str = "error",
) -> tuple[dict[ClientId, np.ndarray], dict[ClientId, np.ndarray | None], list[str]]:
    """Every client's ``X`` (2-D float, read-only) and ``y`` (1-D or ``None``), checked: shapes,
    rows (at least one), the same columns at every client, finite values (every client
    with a non-finite value named at once; with ``missing="keep"``, NaN marks a missing value
    and only infinities are refused); and the feature names. ``target`` is ``None`` for
    unsupervised data, whose ``X`` must have columns (with a target, none is an intercept-only
    model)."""
    Xd: dict[ClientId, np.ndarray] = {}
    yd: dict[ClientId, np.ndarray | None] = {}
    d: int | None = None
    first: ClientId = None
    for cid, X, y in zip(clients, X_list, y_list):
        X = as_float_array(X, "X", cid)
        if X.ndim == 1:  # a single feature given as a vector
            X = X[:, None]
        if X.ndim != 2:
            raise DataError(f"{cname(cid)}: X must be 2-D (n, d), got shape {X.shape}")
        if y is not None:
            y = as_float_array(y, f"target {target!r}", cid)
            if y.ndim == 2 and y.shape[1] == 1:  # a column vector is unambiguous
                y = y[:, 0]
            if y.ndim != 1:
                raise DataError(f"{cname(cid)}: y must be 1-D (n,), got shape {y.shape}")
        if y is not None and X.shape[0] != y.shape[0]:
            raise DataError(f"{cname(cid)}: X has {X.shape[0]} rows but y has {y.shape[0]} entries")
        if X.shape[0] == 0:
            raise DataError(f"{cname(cid)} has no rows (empty client)")
        if d is None:
            d, first = X.shape[1], cid
            if d == 0 and target is None:  # with a target, no column is an intercept-only model
                raise DataError(f"{cname(cid)}: X has no columns (d == 0)")
        elif X.shape[1] != d:
            raise DataError(
                f"{cname(cid)}: X has {X.shape[1]} columns but {cname(first)} has {d}; "
                "all clients must share the same features"
            )
        Xd[cid], yd[cid] = X, y

    assert d is not None
    names = check_feature_names(feature_names, d, target)
    if missing not in ("error", "keep"):
        raise DataError(f"missing must be 'error' or 'keep', got {missing!r}")
    keep = missing == "keep"
    reports = []  # every client with a non-finite value is named, not only the first
    for cid in clients:
        reports.append(nonfinite_X(np.where(np.isnan(Xd[cid]), 0.0, Xd[cid]) if keep else Xd[cid], cid, names))
        readonly(Xd[cid])
        y_cid = yd[cid]
        if y_cid is not None:
            reports.append(nonfinite_y(np.where(np.isnan(y_cid), 0.0, y_cid) if keep else y_cid, cid, target))
            readonly(y_cid)
    raise_nonfinite([r for r in reports if r is not None])

    return Xd, yd, names


def client_key(value: Any) -> str:
    """A client id as text; a float that is a whole number reads like the int (1.0 -> "1").

    >>> client_key(3.0), client_key("A"), client_key(2)
    ('3', 'A', '2')
    """
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    return str(value)
