"""Per-client regression data: :class:`FederatedData` and federated standardisation.

A :class:`FederatedData` holds, for every client (data holder), a design matrix ``X`` of
shape ``(n_k, d)`` and a response ``y`` of shape ``(n_k,)``. All clients share the same
``d`` features (``feature_names``). The container validates everything at the boundary
and fails loudly (:class:`DataError`, a :class:`ValueError`) with a message that names the
client and, where it applies, the column. Nothing is ever dropped silently: a row with a
NaN is an error, not a row to skip.

Anything computed *across* clients here (:meth:`FederatedData.fit_scaler`) is computed the
federated way: every client reports a few sums of its own rows (:func:`client_moments`)
and the server combines only those sums (:func:`aggregate_moments`); rows are never pooled.

Example
-------
>>> import numpy as np
>>> from fedstats.data import FederatedData
>>> rng = np.random.default_rng(0)
>>> Xs = [rng.normal(size=(n, 2)) for n in (5, 8)]
>>> ys = [X @ [1.0, -2.0] for X in Xs]
>>> fd = FederatedData.from_arrays(Xs, ys, clients=["a", "b"], feature_names=["u", "v"])
>>> fd
FederatedData(K=2 clients, d=2 features, n=13, rows per client 5..8, target='y')
>>> scaled, scaler = fd.standardize()
>>> scaled["a"].X.shape
(5, 2)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "ClientData",
    "ConstantFeatureWarning",
    "DataError",
    "FederatedData",
    "FederatedScaler",
    "UnknownClientError",
    "aggregate_moments",
    "client_moments",
]

ClientId = Hashable

# how many offending items (clients, columns, rows) an error message lists before "..."
_SHOW = 5


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


def _cname(client: ClientId) -> str:
    # repr() keeps client 0 and client "0" apart in messages
    return f"client {client!r}"


def _preview(items: Sequence[Any], k: int = _SHOW) -> str:
    shown = ", ".join(repr(i) for i in list(items)[:k])
    return shown + (", ..." if len(items) > k else "")


def _normalise_id(client: Any) -> ClientId:
    # numpy scalars (e.g. from a DataFrame column) become plain Python ids
    if isinstance(client, np.generic):
        client = client.item()
    if not isinstance(client, Hashable):
        raise DataError(f"client ids must be hashable, got {client!r}")
    return client


def _as_float_array(a: Any, what: str, client: ClientId) -> np.ndarray:
    """``a`` as a fresh float64 array; non-numeric input is an error, never coerced."""
    arr = np.asarray(a)
    if arr.dtype.kind in "biuf":
        return np.array(arr, dtype=np.float64, copy=True)
    if arr.dtype.kind == "O":
        try:  # an object array of plain numbers (or None -> NaN, caught later) is fine
            return np.array(arr, dtype=np.float64, copy=True)
        except (TypeError, ValueError):
            pass
    raise DataError(
        f"{_cname(client)}: {what} is not numeric (dtype {arr.dtype}); "
        "encode it as numbers first"
    )


def _check_finite_X(X: np.ndarray, client: ClientId, feature_names: Sequence[str]) -> None:
    bad = ~np.isfinite(X)
    if not bad.any():
        return
    per_col = bad.sum(axis=0)
    cols = [f"feature {feature_names[j]!r} in {int(per_col[j])} row(s)" for j in np.flatnonzero(per_col)]
    n_rows = int(bad.any(axis=1).sum())
    raise DataError(
        f"{_cname(client)}: non-finite values (NaN or inf) in X: {'; '.join(cols[:_SHOW])}"
        f"{'; ...' if len(cols) > _SHOW else ''} ({n_rows} row(s) affected). "
        "Rows are never dropped silently: remove or impute them before building the data."
    )


def _check_finite_y(y: np.ndarray, client: ClientId, target_name: str) -> None:
    bad = ~np.isfinite(y)
    if bad.any():
        raise DataError(
            f"{_cname(client)}: non-finite values (NaN or inf) in target {target_name!r} "
            f"in {int(bad.sum())} row(s). Rows are never dropped silently: remove or impute "
            "them before building the data."
        )


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def require_target(data, what: str) -> None:
    """Raise :class:`DataError` if ``data`` is a :class:`FederatedData` without a target
    (supervised models call it first, so unsupervised data fails with a clear message)."""
    if isinstance(data, FederatedData):
        data._need_target(what)


@dataclass(frozen=True, eq=False)
class ClientData:
    """The data of one client: ``X`` (n, d), ``y`` (n,), both read-only float64.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.data import FederatedData
    >>> fd = FederatedData.from_arrays([np.ones((3, 2))], [np.zeros(3)])
    >>> cd = fd[0]
    >>> cd.client, cd.n, cd.X.shape
    (0, 3, (3, 2))
    """

    X: np.ndarray
    y: np.ndarray | None
    client: ClientId

    @property
    def n(self) -> int:
        """Number of rows (observations) of this client."""
        return int(self.X.shape[0])


class FederatedData:
    """Per-client regression data with a shared feature schema.

    Build it with :meth:`from_arrays` or :meth:`from_dataframe` (the constructor takes the
    same arguments as :meth:`from_arrays`). Arrays are copied on the way in and stored
    read-only; every method returns a new object.

    Parameters
    ----------
    Xs, ys, clients, feature_names, target_name, min_rows
        See :meth:`from_arrays`.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.data import FederatedData
    >>> fd = FederatedData.from_arrays({"a": np.arange(6.0).reshape(3, 2), "b": np.ones((2, 2))},
    ...                                {"a": np.zeros(3), "b": np.ones(2)})
    >>> fd.clients, fd.n_obs, fd.feature_names
    (['a', 'b'], {'a': 3, 'b': 2}, ['x0', 'x1'])
    """

    __slots__ = ("_X", "_y", "_clients", "_feature_names", "_target_name")

    def __init__(
        self,
        Xs: Sequence[Any] | Mapping[ClientId, Any],
        ys: Sequence[Any] | Mapping[ClientId, Any] | None = None,
        *,
        clients: Sequence[ClientId] | None = None,
        feature_names: Sequence[str] | None = None,
        target_name: str = "y",
        min_rows: int = 1,
    ) -> None:
        clients, X_list, y_list = self._pair_up(Xs, ys, clients)
        if not isinstance(min_rows, (int, np.integer)) or isinstance(min_rows, bool) or min_rows < 1:
            raise DataError(f"min_rows must be an integer >= 1, got {min_rows!r}")
        if not isinstance(target_name, str):
            raise DataError(f"target_name must be a str, got {target_name!r}")
        if ys is None:  # unsupervised data (e.g. for mixture models): no target at all
            target_name = None

        Xd: dict[ClientId, np.ndarray] = {}
        yd: dict[ClientId, np.ndarray] = {}
        d: int | None = None
        first: ClientId = None
        for cid, X, y in zip(clients, X_list, y_list):
            X = _as_float_array(X, "X", cid)
            if X.ndim == 1:  # a single feature given as a vector
                X = X[:, None]
            if X.ndim != 2:
                raise DataError(f"{_cname(cid)}: X must be 2-D (n, d), got shape {X.shape}")
            if y is not None:
                y = _as_float_array(y, f"target {target_name!r}", cid)
                if y.ndim == 2 and y.shape[1] == 1:  # a column vector is unambiguous
                    y = y[:, 0]
                if y.ndim != 1:
                    raise DataError(f"{_cname(cid)}: y must be 1-D (n,), got shape {y.shape}")
            if y is not None and X.shape[0] != y.shape[0]:
                raise DataError(
                    f"{_cname(cid)}: X has {X.shape[0]} rows but y has {y.shape[0]} entries"
                )
            if X.shape[0] == 0:
                raise DataError(f"{_cname(cid)} has no rows (empty client)")
            if X.shape[0] < min_rows:
                raise DataError(
                    f"{_cname(cid)} has {X.shape[0]} row(s), fewer than min_rows={min_rows}"
                )
            if d is None:
                d, first = X.shape[1], cid
                if d == 0:
                    raise DataError(f"{_cname(cid)}: X has no columns (d == 0)")
            elif X.shape[1] != d:
                raise DataError(
                    f"{_cname(cid)}: X has {X.shape[1]} columns but {_cname(first)} has {d}; "
                    "all clients must share the same features"
                )
            Xd[cid], yd[cid] = X, y

        assert d is not None
        names = self._check_feature_names(feature_names, d, target_name)
        for cid in clients:
            _check_finite_X(Xd[cid], cid, names)
            _readonly(Xd[cid])
            if yd[cid] is not None:
                _check_finite_y(yd[cid], cid, target_name)
                _readonly(yd[cid])

        self._X = Xd
        self._y = yd
        self._clients = list(clients)
        self._feature_names = names
        self._target_name = target_name

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _pair_up(Xs: Any, ys: Any, clients: Any) -> tuple[list, list, list]:
        """Client ids and the matching lists of X and y, with the id checks."""
        if isinstance(Xs, (np.ndarray, pd.DataFrame)):
            # a single array would silently be read as one "client" per row
            raise DataError(
                "Xs must be a sequence (or dict) of per-client arrays, not a single array"
            )
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
                    + (f"no y for {_preview(missing)}" if missing else "")
                    + ("; " if missing and extra else "")
                    + (f"no X for {_preview(extra)}" if extra else "")
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
        ids = [_normalise_id(c) for c in ids]
        seen: set = set()
        dups = [c for c in ids if c in seen or seen.add(c)]
        if dups:
            raise DataError(f"duplicate client ids: {_preview(dups)}")
        return ids, X_list, y_list

    @staticmethod
    def _check_feature_names(feature_names: Any, d: int, target_name: str) -> list[str]:
        if feature_names is None:
            return [f"x{j}" for j in range(d)]
        if isinstance(feature_names, str):
            raise DataError("feature_names must be a sequence of str, not a single str")
        names = list(feature_names)
        if len(names) != d:
            raise DataError(f"feature_names has {len(names)} names but X has {d} columns")
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise DataError(f"feature names must be str, got {_preview(bad)}")
        seen: set = set()
        dups = [n for n in names if n in seen or seen.add(n)]
        if dups:
            raise DataError(f"duplicate feature names: {_preview(dups)}")
        if target_name is not None and target_name in names:
            raise DataError(f"target_name {target_name!r} is also a feature name")
        return names

    @classmethod
    def _from_validated(
        cls,
        Xd: dict[ClientId, np.ndarray],
        yd: dict[ClientId, np.ndarray],
        feature_names: list[str],
        target_name: str,
    ) -> FederatedData:
        """Internal: wrap arrays derived from an already validated object (no re-checks)."""
        self = object.__new__(cls)
        self._X = {c: _readonly(X) for c, X in Xd.items()}
        self._y = {c: None if y is None else _readonly(y) for c, y in yd.items()}
        self._clients = list(Xd.keys())
        self._feature_names = list(feature_names)
        self._target_name = target_name
        return self

    @classmethod
    def from_arrays(
        cls,
        Xs: Sequence[Any] | Mapping[ClientId, Any],
        ys: Sequence[Any] | Mapping[ClientId, Any] | None = None,
        *,
        clients: Sequence[ClientId] | None = None,
        feature_names: Sequence[str] | None = None,
        target_name: str = "y",
        min_rows: int = 1,
    ) -> FederatedData:
        """Build from per-client arrays.

        Parameters
        ----------
        Xs : sequence of array_like, or dict client id -> array_like
            Design matrices, each ``(n_k, d)``; a 1-D array is read as ``(n_k, 1)``.
        ys : sequence of array_like, or dict client id -> array_like, optional
            Responses, each ``(n_k,)`` (an ``(n_k, 1)`` column is accepted). Must be a dict
            with the same keys when ``Xs`` is a dict. ``None`` (default) gives data without
            a target (for unsupervised models such as mixtures; ``y`` is then ``None``).
        clients : sequence of hashable, optional
            Client ids when ``Xs`` is a sequence (default ``0 .. K-1``). Not allowed with a
            dict ``Xs`` (its keys are the ids).
        feature_names : sequence of str, optional
            Default ``["x0", ..., "x{d-1}"]``.
        target_name : str, default "y"
        min_rows : int, default 1
            A client with fewer rows is an error.

        Returns
        -------
        FederatedData

        Raises
        ------
        DataError
            Shape mismatch, empty client, duplicate ids, non-numeric or non-finite values.

        Example
        -------
        >>> import numpy as np
        >>> from fedstats.data import FederatedData
        >>> fd = FederatedData.from_arrays([np.ones((3, 2)), np.zeros((4, 2))],
        ...                                [np.ones(3), np.zeros(4)], clients=["a", "b"])
        >>> len(fd), fd.n_features, fd.n_obs
        (2, 2, {'a': 3, 'b': 4})
        """
        return cls(
            Xs, ys, clients=clients, feature_names=feature_names,
            target_name=target_name, min_rows=min_rows,
        )

    @classmethod
    def from_dataframe(
        cls,
        df: pd.DataFrame,
        *,
        by: Hashable,
        target: Hashable | None = None,
        features: Sequence[Hashable] | None = None,
        categorical: str = "error",
        drop_first: bool = True,
        min_rows: int = 1,
    ) -> FederatedData:
        """Build from a long data frame, one client per distinct value of column ``by``.

        Clients come in order of first appearance in ``by``. Numeric columns are used as
        they are, bool columns become 0/1. Other columns (strings, objects, categoricals)
        are an error unless ``categorical="onehot"``, which one-hot encodes them into
        dummies named ``col[level]``. The levels are taken from the whole frame (the
        shared schema, not pooled data) so every client gets the same columns, even when a
        level never occurs at that client.

        Parameters
        ----------
        df : pandas.DataFrame
        by : column label
            The client id column.
        target : column label, optional
            The response column (numeric or bool). ``None`` (default): no target, for
            unsupervised models (every column but ``by`` is then a feature by default).
        features : sequence of column labels, optional
            Default: every column except ``by`` and ``target``, in frame order.
        categorical : {"error", "onehot"}, default "error"
        drop_first : bool, default True
            With ``"onehot"``, drop the first level (the reference): k-1 dummies. Levels are
            sorted (a pandas categorical keeps its category order).
        min_rows : int, default 1
            A client with fewer rows is an error.

        Returns
        -------
        FederatedData

        Raises
        ------
        DataError
            Missing columns, missing client ids, non-numeric columns, NaN values, ...

        Example
        -------
        >>> import pandas as pd
        >>> from fedstats.data import FederatedData
        >>> df = pd.DataFrame({"site": ["a", "a", "b", "b"], "age": [30, 40, 50, 60],
        ...                    "sex": ["f", "m", "f", "f"], "y": [1.0, 2.0, 3.0, 4.0]})
        >>> fd = FederatedData.from_dataframe(df, by="site", target="y", categorical="onehot")
        >>> fd.feature_names, fd.n_obs
        (['age', 'sex[m]'], {'a': 2, 'b': 2})
        """
        if not isinstance(df, pd.DataFrame):
            raise DataError(f"df must be a pandas DataFrame, got {type(df).__name__}")
        if categorical not in ("error", "onehot"):
            raise DataError(f"categorical must be 'error' or 'onehot', got {categorical!r}")
        cols = list(df.columns)
        absent = [c for c in (by, target) if c not in cols and not (c is target and target is None)]
        if absent:
            which = ", ".join(
                f"{'by' if c == by else 'target'}={c!r}" for c in absent
            )
            raise DataError(f"column(s) not in the data frame: {which}; columns are {_preview(cols, 10)}")
        if target is not None and by == target:
            raise DataError(f"by and target are the same column {by!r}")
        if features is None:
            features = [c for c in cols if c != by and c != target]
        else:
            if isinstance(features, str):
                raise DataError("features must be a sequence of column names, not a single str")
            features = list(features)
            missing = [c for c in features if c not in cols]
            if missing:
                raise DataError(f"feature column(s) not in the data frame: {_preview(missing, 10)}")
            clash = [c for c in features if c == by or c == target]
            if clash:
                raise DataError(f"features must not include the by/target column(s): {_preview(clash)}")
        if not features:
            raise DataError("no feature columns")
        dup_cols = sorted({c for c in [by, target, *features] if cols.count(c) > 1}, key=str)
        if dup_cols:
            raise DataError(f"duplicate column label(s) in the data frame: {_preview(dup_cols)}")
        if len(df) == 0:
            raise DataError("the data frame has no rows")

        # clients in order of first appearance; a missing id would silently lose rows
        codes, uniques = pd.factorize(df[by], sort=False, use_na_sentinel=True)
        n_na = int((codes < 0).sum())
        if n_na:
            raise DataError(f"column by={by!r} has {n_na} missing client id(s)")
        client_ids = [_normalise_id(u) for u in uniques]
        rows = [np.flatnonzero(codes == k) for k in range(len(client_ids))]

        def client_of(mask: np.ndarray) -> str:
            # the clients whose rows are flagged, for error messages
            return ", ".join(_cname(client_ids[k]) for k in np.unique(codes[mask])[:_SHOW])

        blocks: list[np.ndarray] = []
        names: list[str] = []
        for col in features:
            s = df[col]
            kind = _column_kind(s)
            if kind == "numeric":
                blocks.append(_numeric_column(s)[:, None])
                names.append(str(col))
            elif kind == "unsupported":
                raise DataError(
                    f"feature column {col!r} has dtype {s.dtype}, which fedstats does not "
                    "encode; convert it to numbers first"
                )
            elif categorical == "error":
                i = _first_non_number(s)
                raise DataError(
                    f"feature column {col!r} is not numeric (dtype {s.dtype}; e.g. value "
                    f"{s.iloc[i]!r} in {_cname(client_ids[int(codes[i])])}); pass "
                    "categorical='onehot' to one-hot encode it, or convert it with pd.to_numeric"
                )
            else:
                na = s.isna().to_numpy()
                if na.any():
                    raise DataError(
                        f"categorical feature column {col!r} has {int(na.sum())} missing "
                        f"value(s) (in {client_of(na)}); rows are never dropped silently"
                    )
                levels = _levels(s)
                used = levels[1:] if drop_first else levels
                if not used:
                    warnings.warn(
                        f"categorical feature column {col!r} has a single level "
                        f"{levels[0]!r}; with drop_first=True it contributes no column",
                        UserWarning, stacklevel=2,
                    )
                values = s.to_numpy(dtype=object)
                for lev in used:
                    blocks.append((values == lev).astype(np.float64)[:, None])
                    names.append(f"{col}[{lev}]")

        y_all = None
        if target is not None:
            t = df[target]
            if _column_kind(t) != "numeric":
                raise DataError(
                    f"target column {target!r} is not numeric (dtype {t.dtype}); encode it as numbers"
                )
            y_all = _numeric_column(t)
        if not blocks:
            raise DataError("no feature columns left after encoding")
        # one (n, d) array of the frame the caller already holds, split straight back per client
        X_all = np.hstack(blocks)
        return cls(
            [X_all[r] for r in rows],
            None if y_all is None else [y_all[r] for r in rows],
            clients=client_ids,
            feature_names=names,
            target_name=str(target) if target is not None else "y",
            min_rows=min_rows,
        )

    # ------------------------------------------------------------------ accessors
    @property
    def clients(self) -> list[ClientId]:
        """The client ids, in order."""
        return list(self._clients)

    @property
    def n_clients(self) -> int:
        """Number of clients K."""
        return len(self._clients)

    @property
    def n_features(self) -> int:
        """Number of features d (columns of every X)."""
        return len(self._feature_names)

    @property
    def feature_names(self) -> list[str]:
        """The d feature names (a copy)."""
        return list(self._feature_names)

    @property
    def has_target(self) -> bool:
        """Whether the data has a target ``y`` (``False`` for unsupervised data)."""
        return self._target_name is not None

    def _need_target(self, what: str) -> None:
        if not self.has_target:
            raise DataError(f"{what} needs a target, but this data has none (built without ys/target)")

    @property
    def target_name(self) -> str | None:
        """Name of the response."""
        return self._target_name

    @property
    def n_obs(self) -> dict[ClientId, int]:
        """Rows per client, ``{client: n_k}``."""
        return {c: int(self._X[c].shape[0]) for c in self._clients}

    @property
    def n_total(self) -> int:
        """Total number of rows over all clients."""
        return sum(self.n_obs.values())

    def __len__(self) -> int:
        return len(self._clients)

    def __iter__(self) -> Iterator[ClientId]:
        return iter(list(self._clients))

    def __contains__(self, client: object) -> bool:
        try:
            return client in self._X
        except TypeError:  # unhashable
            return False

    def _unknown(self, client: Any) -> UnknownClientError:
        return UnknownClientError(
            f"unknown {_cname(client)}; known clients ({self.n_clients}): "
            f"{_preview(self._clients)}"
        )

    def __getitem__(self, client: ClientId) -> ClientData:
        """The :class:`ClientData` of one client (read-only arrays)."""
        if client not in self:
            raise self._unknown(client)
        return ClientData(X=self._X[client], y=self._y[client], client=client)

    def items(self) -> list[tuple[ClientId, ClientData]]:
        """``[(client, ClientData), ...]`` in client order."""
        return [(c, self[c]) for c in self._clients]

    def __repr__(self) -> str:
        ns = list(self.n_obs.values())
        return (
            f"FederatedData(K={self.n_clients} client{'s' if self.n_clients != 1 else ''}, "
            f"d={self.n_features} feature{'s' if self.n_features != 1 else ''}, "
            f"n={sum(ns)}, rows per client {min(ns)}..{max(ns)}, target={self._target_name!r})"
        )

    # ------------------------------------------------------------------ derived data
    def subset(self, clients: Iterable[ClientId]) -> FederatedData:
        """A new :class:`FederatedData` with only ``clients``, in the order given.

        Raises
        ------
        DataError
            Unknown (:class:`UnknownClientError`), duplicate, or no client ids.

        Example
        -------
        >>> import numpy as np
        >>> from fedstats.data import FederatedData
        >>> fd = FederatedData.from_arrays([np.ones((2, 1))] * 3, [np.ones(2)] * 3)
        >>> fd.subset([2, 0]).clients
        [2, 0]
        """
        if isinstance(clients, (str, bytes)) or not isinstance(clients, Iterable):
            raise DataError(f"clients must be a sequence of client ids, got {clients!r}")
        ids = [_normalise_id(c) for c in clients]
        unknown = [c for c in ids if c not in self]
        if unknown:
            raise UnknownClientError(
                f"unknown client id(s) {_preview(unknown)}; known clients "
                f"({self.n_clients}): {_preview(self._clients)}"
            )
        seen: set = set()
        dups = [c for c in ids if c in seen or seen.add(c)]
        if dups:
            raise DataError(f"duplicate client ids: {_preview(dups)}")
        if not ids:
            raise DataError("subset needs at least one client")
        return FederatedData._from_validated(
            {c: self._X[c] for c in ids}, {c: self._y[c] for c in ids},
            self._feature_names, self._target_name,
        )

    def train_test_split(
        self,
        test_size: float = 0.4,
        *,
        seed: int | np.random.Generator | np.random.SeedSequence | None,
        shuffle: bool = True,
    ) -> tuple[FederatedData, FederatedData]:
        """Split every client's own rows into a train and a test part.

        Each client puts ``round(test_size * n_k)`` rows (clipped to ``1 .. n_k - 1``, so
        both sides keep at least one row of every client) into the test part. Within each
        part, rows keep their original order.

        Parameters
        ----------
        test_size : float in (0, 1), default 0.4
        seed : int, Generator or SeedSequence; keyword-only and required
            Drives the shuffling (client ``k`` uses the k-th spawned stream, so the split is
            reproducible). May be ``None`` only with ``shuffle=False``.
        shuffle : bool, default True
            ``False`` gives a chronological split: the first rows train, the last rows test.

        Returns
        -------
        (train, test) : tuple of FederatedData

        Raises
        ------
        DataError
            A client with fewer than 2 rows, or a bad ``test_size``.

        Example
        -------
        >>> import numpy as np
        >>> from fedstats.data import FederatedData
        >>> fd = FederatedData.from_arrays([np.arange(10.0)], [np.arange(10.0)])
        >>> tr, te = fd.train_test_split(0.3, seed=None, shuffle=False)
        >>> te[0].y
        array([7., 8., 9.])
        """
        if isinstance(test_size, bool) or not isinstance(test_size, (float, int, np.floating)) or not 0 < test_size < 1:
            raise DataError(f"test_size must be a float strictly between 0 and 1, got {test_size!r}")
        if shuffle and seed is None:
            raise DataError("train_test_split(shuffle=True) needs a seed, for reproducibility")
        small = [c for c in self._clients if self._X[c].shape[0] < 2]
        if small:
            raise DataError(
                f"cannot split {', '.join(_cname(c) for c in small[:_SHOW])}: fewer than 2 rows"
            )
        if shuffle:
            gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
            rngs = gen.spawn(self.n_clients)
        Xtr, ytr, Xte, yte = {}, {}, {}, {}
        for k, c in enumerate(self._clients):
            n = self._X[c].shape[0]
            n_test = min(max(math.floor(test_size * n + 0.5), 1), n - 1)
            if shuffle:
                perm = rngs[k].permutation(n)
                te_idx, tr_idx = np.sort(perm[:n_test]), np.sort(perm[n_test:])
            else:
                tr_idx, te_idx = np.arange(n - n_test), np.arange(n - n_test, n)
            y = self._y[c]
            Xtr[c], ytr[c] = self._X[c][tr_idx], None if y is None else y[tr_idx]
            Xte[c], yte[c] = self._X[c][te_idx], None if y is None else y[te_idx]
        make = FederatedData._from_validated
        return (
            make(Xtr, ytr, self._feature_names, self._target_name),
            make(Xte, yte, self._feature_names, self._target_name),
        )

    # ------------------------------------------------------------------ statistics
    def sufficient_statistics(self) -> dict[ClientId, dict[str, Any]]:
        """Per-client Gaussian-linear-model sufficient statistics, computed client-side.

        Returns
        -------
        dict
            ``{client: {"A": X^T X (d, d), "b": X^T y (d,), "c": y^T y (float), "n": n_k}}``.

        Example
        -------
        >>> import numpy as np
        >>> from fedstats.data import FederatedData
        >>> fd = FederatedData.from_arrays([np.ones((3, 1))], [np.full(3, 2.0)])
        >>> s = fd.sufficient_statistics()[0]
        >>> s["A"], s["b"], s["c"], s["n"]
        (array([[3.]]), array([6.]), 12.0, 3)
        """
        self._need_target("sufficient_statistics")
        out = {}
        for c in self._clients:
            X, y = self._X[c], self._y[c]
            out[c] = {"A": X.T @ X, "b": X.T @ y, "c": float(y @ y), "n": int(y.shape[0])}
        return out

    def fit_scaler(
        self, *, center: bool = True, scale: bool = True, target: bool = False
    ) -> FederatedScaler:
        """Fit a :class:`FederatedScaler` from per-client sums only.

        Each client reports ``n_k``, its column sums and its sum of squared deviations
        (:func:`client_moments`); the server combines those (:func:`aggregate_moments`)
        into the overall mean and sample sd (``n - 1`` denominator). No rows are pooled.

        Parameters
        ----------
        center : bool, default True
            Subtract the mean (else ``mean`` is all zeros).
        scale : bool, default True
            Divide by the sd (else ``sd`` is all ones). A constant feature gets sd 1 and a
            :class:`ConstantFeatureWarning`.
        target : bool, default False
            Also standardise ``y`` (fills ``y_mean`` and ``y_sd``).

        Returns
        -------
        FederatedScaler

        Example
        -------
        >>> import numpy as np
        >>> from fedstats.data import FederatedData
        >>> fd = FederatedData.from_arrays([np.array([[0.0], [2.0]]), np.array([[4.0]])],
        ...                                [np.zeros(2), np.ones(1)])
        >>> sc = fd.fit_scaler()
        >>> sc.mean, sc.sd
        (array([2.]), array([2.]))
        """
        if target:
            self._need_target("fit_scaler(target=True)")
        # Federated on purpose: a client's rows only ever enter client_moments (run by that
        # client); the server step sees the list of per-client sums and nothing else.
        moments = [
            client_moments(self._X[c], self._y[c] if target else None) for c in self._clients
        ]
        agg = aggregate_moments(moments)
        n = agg["n"]
        if n < 2:
            raise DataError("fit_scaler needs at least 2 rows in total for a sample sd")
        d = self.n_features
        mean = agg["mean_x"] if center else np.zeros(d)
        sd = _safe_sd(agg["sd_x"], agg["mean_x"], self._feature_names) if scale else np.ones(d)
        y_mean = y_sd = None
        if target:
            y_mean = float(agg["mean_y"]) if center else 0.0
            y_sd = (
                float(_safe_sd(np.atleast_1d(agg["sd_y"]), np.atleast_1d(agg["mean_y"]),
                               [self._target_name], what="target")[0])
                if scale else 1.0
            )
        return FederatedScaler(
            mean=mean, sd=sd, feature_names=tuple(self._feature_names),
            y_mean=y_mean, y_sd=y_sd, n=n,
        )

    def standardize(
        self, *, center: bool = True, scale: bool = True, target: bool = False
    ) -> tuple[FederatedData, FederatedScaler]:
        """Fit a scaler (:meth:`fit_scaler`) and apply it: returns ``(scaled, scaler)``.

        Example
        -------
        >>> import numpy as np
        >>> from fedstats.data import FederatedData
        >>> fd = FederatedData.from_arrays([np.array([[0.0], [2.0]]), np.array([[4.0]])],
        ...                                [np.zeros(2), np.ones(1)])
        >>> scaled, sc = fd.standardize()
        >>> scaled[0].X.ravel(), scaled[1].X.ravel()
        (array([-1.,  0.]), array([1.]))
        """
        scaler = self.fit_scaler(center=center, scale=scale, target=target)
        return scaler.transform(self), scaler

    def to_dataframe(self, *, client_col: str = "client") -> pd.DataFrame:
        """Long format: one row per observation, columns ``client_col``, features, target.

        Example
        -------
        >>> import numpy as np
        >>> from fedstats.data import FederatedData
        >>> fd = FederatedData.from_arrays({"a": np.ones((1, 1))}, {"a": np.zeros(1)})
        >>> fd.to_dataframe()
          client   x0    y
        0      a  1.0  0.0
        """
        if client_col in self._feature_names or client_col == self._target_name:
            raise DataError(
                f"client column name {client_col!r} clashes with a feature/target name; "
                "pass another client_col"
            )
        frames = []
        for c in self._clients:
            part = pd.DataFrame(self._X[c], columns=self._feature_names)
            part.insert(0, client_col, pd.Series([c] * len(part), dtype=object))
            if self._y[c] is not None:
                part[self._target_name] = self._y[c]
            frames.append(part)
        out = pd.concat(frames, ignore_index=True)
        # a homogeneous id column (all str / all int) gets its natural dtype back
        out[client_col] = out[client_col].infer_objects()
        return out


# ---------------------------------------------------------------------------- scaling
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
    if pd.api.types.is_datetime64_any_dtype(dt) or pd.api.types.is_timedelta64_dtype(dt) or isinstance(dt, pd.PeriodDtype):
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


def client_moments(X: np.ndarray, y: np.ndarray | None = None) -> dict[str, Any]:
    """Sums a client computes from its own rows and reports for federated scaling.

    The sum of squares is reported centred at the client's own mean,
    ``m2 = sum((x - sum/n)**2)``: it carries the same information as the raw
    ``sum(x**2)`` (``m2 = sum(x**2) - sum**2 / n``) but cannot lose digits to cancellation
    when the mean is large relative to the sd.

    Parameters
    ----------
    X : (n, d) array
    y : (n,) array, optional

    Returns
    -------
    dict
        ``n`` (int), ``sum_x`` (d,), ``m2_x`` (d,), and ``sum_y``, ``m2_y`` (floats)
        when ``y`` is given.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.data import client_moments
    >>> m = client_moments(np.array([[1.0], [3.0]]))
    >>> m["n"], m["sum_x"], m["m2_x"]
    (2, array([4.]), array([2.]))
    """
    X = np.asarray(X, dtype=np.float64)
    n = int(X.shape[0])
    sum_x = X.sum(axis=0)
    out: dict[str, Any] = {"n": n, "sum_x": sum_x, "m2_x": ((X - sum_x / n) ** 2).sum(axis=0)}
    if y is not None:
        y = np.asarray(y, dtype=np.float64)
        sum_y = float(y.sum())
        out["sum_y"] = sum_y
        out["m2_y"] = float(((y - sum_y / n) ** 2).sum())
    return out


def aggregate_moments(moments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Server side: overall mean and sample sd from the clients' :func:`client_moments`.

    Uses only the per-client sums: ``mean = sum_k sum_k / N`` and
    ``M2 = sum_k m2_k + sum_k n_k (mean_k - mean)**2`` (the parallel-variance formula),
    ``sd = sqrt(M2 / (N - 1))``.

    Parameters
    ----------
    moments : sequence of dict
        One :func:`client_moments` result per client.

    Returns
    -------
    dict
        ``n``, ``mean_x``, ``sd_x`` and, if every client sent y sums, ``mean_y``, ``sd_y``
        (sd is NaN when ``N < 2``).

    Example
    -------
    >>> from fedstats.data import aggregate_moments
    >>> import numpy as np
    >>> agg = aggregate_moments([{"n": 2, "sum_x": np.array([2.0]), "m2_x": np.array([2.0])},
    ...                          {"n": 1, "sum_x": np.array([4.0]), "m2_x": np.array([0.0])}])
    >>> agg["n"], agg["mean_x"], agg["sd_x"]
    (3, array([2.]), array([2.]))
    """
    if not moments:
        raise DataError("aggregate_moments needs the sums of at least one client")
    has_y = all("sum_y" in m for m in moments)
    n = sum(int(m["n"]) for m in moments)
    out: dict[str, Any] = {"n": n}
    keys = [("x", "sum_x", "m2_x")] + ([("y", "sum_y", "m2_y")] if has_y else [])
    for name, s_key, m2_key in keys:
        total = sum(np.asarray(m[s_key], dtype=np.float64) for m in moments)
        mean = total / n
        m2 = sum(
            np.asarray(m[m2_key], dtype=np.float64)
            + m["n"] * (np.asarray(m[s_key], dtype=np.float64) / m["n"] - mean) ** 2
            for m in moments
        )
        var = m2 / (n - 1) if n > 1 else np.full_like(mean, np.nan)
        if name == "y":
            out["mean_y"], out["sd_y"] = float(mean), float(np.sqrt(var))
        else:
            out["mean_x"], out["sd_x"] = np.asarray(mean), np.sqrt(var)
    return out


def _safe_sd(sd: np.ndarray, mean: np.ndarray, names: Sequence[str], what: str = "feature") -> np.ndarray:
    """sd with constant columns set to 1 (and a warning), so nothing divides by zero."""
    sd = np.array(sd, dtype=np.float64)
    # relative tolerance: a constant column's sd is rounding noise of order eps * |mean|
    const = (sd == 0) | (sd <= 1e-12 * np.abs(mean))
    for j in np.flatnonzero(const):
        warnings.warn(
            f"{what} {names[j]!r} is constant across all clients (sd == 0); "
            "its sd is taken as 1, so it is only centred",
            ConstantFeatureWarning, stacklevel=3,
        )
    sd[const] = 1.0
    return sd

def as_federated(data) -> FederatedData:
    """The :class:`FederatedData` every model's ``fit`` takes, from what converts to one: a
    FederatedData (returned as is); a dict client -> X, or client -> (X, y); a list of X, or
    of (X, y) pairs (clients 0, 1, ...)."""
    if isinstance(data, FederatedData):
        return data
    if isinstance(data, Mapping):
        vals = list(data.values())
        if vals and all(isinstance(v, tuple) and len(v) == 2 for v in vals):
            return FederatedData.from_arrays({c: v[0] for c, v in data.items()}, {c: v[1] for c, v in data.items()})
        return FederatedData.from_arrays(dict(data))
    if isinstance(data, (list, tuple)):
        if data and all(isinstance(v, tuple) and len(v) == 2 for v in data):
            return FederatedData.from_arrays([v[0] for v in data], [v[1] for v in data])
        return FederatedData.from_arrays(list(data))
    raise DataError(f"data must be a FederatedData, a dict client -> X or (X, y), or a list of X or of (X, y) "
                    f"pairs; got {type(data).__name__}")



@dataclass(frozen=True, eq=False)
class FederatedScaler:
    """Federated standardisation: ``x -> (x - mean) / sd`` per feature (and for y).

    Fitted by :meth:`FederatedData.fit_scaler` from per-client sums only. ``mean`` is the
    shift applied (zeros when fitted with ``center=False``), ``sd`` the divisor applied
    (ones with ``scale=False``; 1 for a constant feature). ``y_mean``/``y_sd`` are ``None``
    unless fitted with ``target=True``. ``n`` is the number of rows it was fitted on.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.data import FederatedScaler
    >>> sc = FederatedScaler(mean=np.array([1.0]), sd=np.array([2.0]), feature_names=("x0",),
    ...                      y_mean=10.0, y_sd=5.0, n=4)
    >>> sc.transform_X(np.array([[3.0]])), sc.inverse_transform_y(np.array([1.0]))
    (array([[1.]]), array([15.]))
    >>> FederatedScaler.from_dict(sc.to_dict()).sd
    array([2.])
    """

    mean: np.ndarray
    sd: np.ndarray
    feature_names: tuple[str, ...]
    y_mean: float | None = None
    y_sd: float | None = None
    n: int | None = field(default=None)

    def __post_init__(self) -> None:
        mean = np.array(self.mean, dtype=np.float64).reshape(-1)
        sd = np.array(self.sd, dtype=np.float64).reshape(-1)
        names = tuple(self.feature_names)
        if not (mean.shape == sd.shape == (len(names),)):
            raise DataError(
                f"scaler: mean ({mean.size}), sd ({sd.size}) and feature_names ({len(names)}) "
                "must have the same length"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(sd)) and np.all(sd > 0)):
            raise DataError("scaler: mean must be finite and sd finite and > 0")
        if (self.y_mean is None) != (self.y_sd is None):
            raise DataError("scaler: give both y_mean and y_sd, or neither")
        if self.y_sd is not None and not (math.isfinite(self.y_mean) and math.isfinite(self.y_sd) and self.y_sd > 0):
            raise DataError("scaler: y_mean must be finite and y_sd finite and > 0")
        object.__setattr__(self, "mean", _readonly(mean))
        object.__setattr__(self, "sd", _readonly(sd))
        object.__setattr__(self, "feature_names", names)
        if self.y_sd is not None:
            object.__setattr__(self, "y_mean", float(self.y_mean))
            object.__setattr__(self, "y_sd", float(self.y_sd))

    @property
    def has_target(self) -> bool:
        """Whether y is standardised too."""
        return self.y_sd is not None

    def transform(self, fd: FederatedData) -> FederatedData:
        """A new :class:`FederatedData` with every client's X (and y, if fitted) scaled.

        Each client applies the broadcast ``mean``/``sd`` to its own rows.
        """
        if list(self.feature_names) != fd.feature_names:
            raise DataError(
                f"scaler was fitted on features {list(self.feature_names)} but the data has "
                f"{fd.feature_names}"
            )
        Xd, yd = {}, {}
        for c, cd in fd.items():
            Xd[c] = self.transform_X(cd.X)
            if self.has_target and cd.y is None:
                raise DataError("the scaler standardises a target, but the data has none")
            yd[c] = self.transform_y(cd.y) if self.has_target else cd.y
        return FederatedData._from_validated(Xd, yd, fd.feature_names, fd.target_name)

    def transform_X(self, X: np.ndarray) -> np.ndarray:
        """``(X - mean) / sd`` for an ``(n, d)`` array (e.g. new points to predict at)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.mean.size:
            raise DataError(f"X must have shape (n, {self.mean.size}), got {X.shape}")
        return (X - self.mean) / self.sd

    def transform_y(self, y: np.ndarray) -> np.ndarray:
        """``(y - y_mean) / y_sd``; needs a scaler fitted with ``target=True``."""
        self._need_target()
        return (np.asarray(y, dtype=np.float64) - self.y_mean) / self.y_sd

    def inverse_transform_y(self, y: np.ndarray) -> np.ndarray:
        """Back to the original units of y: ``y * y_sd + y_mean``.

        Only for values of y itself (predictions, posterior draws); an sd or a
        residual scale is multiplied by ``y_sd`` alone, without the shift.
        """
        self._need_target()
        return np.asarray(y, dtype=np.float64) * self.y_sd + self.y_mean

    def _need_target(self) -> None:
        if not self.has_target:
            raise DataError("this scaler was fitted without target=True; it has no y_mean/y_sd")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (plain lists and floats)."""
        return {
            "feature_names": list(self.feature_names),
            "mean": self.mean.tolist(),
            "sd": self.sd.tolist(),
            "y_mean": self.y_mean,
            "y_sd": self.y_sd,
            "n": self.n,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FederatedScaler:
        """Inverse of :meth:`to_dict` (validated)."""
        missing = [k for k in ("feature_names", "mean", "sd") if k not in d]
        if missing:
            raise DataError(f"scaler dict lacks key(s) {missing}")
        return cls(
            mean=np.asarray(d["mean"], dtype=np.float64),
            sd=np.asarray(d["sd"], dtype=np.float64),
            feature_names=tuple(d["feature_names"]),
            y_mean=d.get("y_mean"),
            y_sd=d.get("y_sd"),
            n=d.get("n"),
        )
