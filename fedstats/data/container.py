"""The per-client data container, :class:`FederatedData`, and the conversion every model's
``fit`` applies to its input (:func:`as_federated`)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .disclosure import MIN_CELL_COUNT, MIN_ROWS, check_setting
from .encoding import numeric_encoding
from .frames import frame_of, frame_to_arrays
from .scaling import FederatedScaler, fit_scaler
from .validation import (
    SHOW,
    ClientId,
    DataError,
    UnknownClientError,
    cname,
    duplicates,
    missing_target,
    normalize_id,
    pair_up,
    preview,
    readonly,
    validated_arrays,
)


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
    Xs, ys, clients, feature_names, target_name, min_rows, min_cell_count
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

    __slots__ = ("_X", "_y", "_clients", "_feature_names", "_target_name", "_encoding", "_min_rows", "_min_cell_count")

    _X: dict[ClientId, np.ndarray]
    _y: dict[ClientId, np.ndarray | None]
    _clients: list[ClientId]
    _feature_names: list[str]
    _target_name: str | None
    _encoding: dict[str, Any] | None
    _min_rows: int
    _min_cell_count: int

    def __init__(
        self,
        Xs: Sequence[Any] | Mapping[ClientId, Any],
        ys: Sequence[Any] | Mapping[ClientId, Any] | None = None,
        *,
        clients: Sequence[ClientId] | None = None,
        feature_names: Sequence[str] | None = None,
        target_name: str = "y",
        min_rows: int | None = None,
        min_cell_count: int | None = None,
        missing: str = "error",
    ) -> None:
        clients, X_list, y_list = pair_up(Xs, ys, clients)
        self._min_rows = MIN_ROWS if min_rows is None else check_setting("min_rows", min_rows)
        self._min_cell_count = (
            MIN_CELL_COUNT if min_cell_count is None else check_setting("min_cell_count", min_cell_count)
        )
        if not isinstance(target_name, str):
            raise DataError(f"target_name must be a str, got {target_name!r}")
        target: str | None = target_name
        if ys is None:  # unsupervised data (e.g. for mixture models): no target at all
            target = None

        Xd, yd, names = validated_arrays(clients, X_list, y_list, target, feature_names, missing)
        self._X = Xd
        self._y = yd
        self._clients = list(clients)
        self._feature_names = names
        self._target_name = target

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(
        cls,
        Xs: Sequence[Any] | Mapping[ClientId, Any],
        ys: Sequence[Any] | Mapping[ClientId, Any] | None = None,
        *,
        clients: Sequence[ClientId] | None = None,
        feature_names: Sequence[str] | None = None,
        target_name: str = "y",
        min_rows: int | None = None,
        min_cell_count: int | None = None,
        missing: str = "error",
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
        min_rows : int, optional
            The disclosure rule on rows (:mod:`fedstats.data.disclosure`): every model refuses
            to fit a client with fewer rows, or, with a target, fewer than 3 per column.
            Default 10; 1 turns both row rules off for this data.
        min_cell_count : int, optional
            The rule on small cells: in a 0/1 column (a category's dummy, a binary outcome), a
            client's count of 1s and of 0s must be at least this where the column varies at the
            client. Default 5; 1 turns it off.
        missing : {"error", "keep"}, default "error"
            ``"error"``: a NaN is refused, naming the client and column. ``"keep"``: NaN marks a
            missing value, for the descriptive statistics and tests of :mod:`fedstats.stats`
            (each uses the rows complete in its own columns); the models refuse such data.

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
            Xs,
            ys,
            clients=clients,
            feature_names=feature_names,
            target_name=target_name,
            min_rows=min_rows,
            min_cell_count=min_cell_count,
            missing=missing,
        )

    @classmethod
    def from_dataframe(
        cls,
        df: pd.DataFrame,
        *,
        by: Hashable,
        target: Hashable | None = None,
        features: Sequence[Hashable] | None = None,
        categorical: str = "onehot",
        drop_first: bool = True,
        min_rows: int | None = None,
        min_cell_count: int | None = None,
        missing: str = "error",
    ) -> FederatedData:
        """Build from a long data frame, one client per distinct value of column ``by``.

        Clients come in order of first appearance in ``by``. Numeric columns are used as
        they are, bool columns become 0/1. Other columns (strings, objects, categoricals)
        are one-hot encoded into dummies named ``col[level]`` (``categorical="onehot"``, the
        default, as on the command line), or refused (``categorical="error"``). A fitted
        model keeps the encoding and encodes a data frame's rows the same way at ``predict``. The levels are taken from the whole frame (the
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
        categorical : {"onehot", "error"}, default "onehot"
        drop_first : bool, default True
            With ``"onehot"``, drop the first level (the reference): k-1 dummies. Levels are
            sorted (a pandas categorical keeps its category order).
        min_rows, min_cell_count : int, optional
            The disclosure rules of this data, as in :meth:`from_arrays`.
        missing : {"error", "keep"}, default "error"
            As in :meth:`from_arrays` (``"keep"``: a missing category is NaN in its dummies).

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
        >>> fd = FederatedData.from_dataframe(df, by="site", target="y")
        >>> fd.feature_names, fd.n_obs
        (['age', 'sex[m]'], {'a': 2, 'b': 2})
        """
        parts = frame_to_arrays(
            df, by=by, target=target, features=features, categorical=categorical, drop_first=drop_first, missing=missing
        )
        encoding = parts.pop("encoding")
        fd = cls(**parts, min_rows=min_rows, min_cell_count=min_cell_count, missing=missing)
        fd._encoding = encoding
        return fd

    # ------------------------------------------------------------------ accessors
    @property
    def min_rows(self) -> int:
        """The disclosure rule on rows every model applies to this data (1: off); see
        :mod:`fedstats.data.disclosure`."""
        return self._min_rows

    @property
    def min_cell_count(self) -> int:
        """The disclosure rule on small cells of 0/1 columns (1: off)."""
        return self._min_cell_count

    def with_rules(self, *, min_rows: int | None = None, min_cell_count: int | None = None) -> FederatedData:
        """The same data under other disclosure rules (``None``: keep this data's)
        (:mod:`fedstats.data.disclosure`): ``data.with_rules(min_rows=1)`` lets every model
        fit clients of any size.

        Example
        -------
        >>> import numpy as np
        >>> fd = FederatedData.from_arrays([np.ones((3, 1))], [np.ones(3)])
        >>> fd.min_rows, fd.with_rules(min_rows=1).min_rows
        (10, 1)
        """
        fd = checked_data(self._X, self._y, self._feature_names, self._target_name, self)
        if min_rows is not None:
            fd._min_rows = check_setting("min_rows", min_rows)
        if min_cell_count is not None:
            fd._min_cell_count = check_setting("min_cell_count", min_cell_count)
        return fd

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
    def encoding(self) -> dict[str, Any]:
        """How the feature columns came from the data (:mod:`fedstats.data.encoding`): numeric
        columns, and each categorical column's levels; fitted models keep it to read new rows
        by name."""
        enc = getattr(self, "_encoding", None)
        return numeric_encoding(self._feature_names) if enc is None else enc

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
            raise missing_target(what)

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
            f"unknown {cname(client)}; known clients ({self.n_clients}): {preview(self._clients)}"
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
        ids = [normalize_id(c) for c in clients]
        unknown = [c for c in ids if c not in self]
        if unknown:
            raise UnknownClientError(
                f"unknown client id(s) {preview(unknown)}; known clients ({self.n_clients}): {preview(self._clients)}"
            )
        dups = duplicates(ids)
        if dups:
            raise DataError(f"duplicate client ids: {preview(dups)}")
        if not ids:
            raise DataError("subset needs at least one client")
        return checked_data(
            {c: self._X[c] for c in ids}, {c: self._y[c] for c in ids}, self._feature_names, self._target_name, self
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
            raise DataError(f"cannot split {', '.join(cname(c) for c in small[:SHOW])}: fewer than 2 rows")
        if shuffle:
            gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
            rngs = gen.spawn(self.n_clients)
        Xtr: dict[ClientId, np.ndarray] = {}
        Xte: dict[ClientId, np.ndarray] = {}
        ytr: dict[ClientId, np.ndarray | None] = {}
        yte: dict[ClientId, np.ndarray | None] = {}
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
        make = checked_data
        return (
            make(Xtr, ytr, self._feature_names, self._target_name, self),
            make(Xte, yte, self._feature_names, self._target_name, self),
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
        out: dict[ClientId, dict[str, Any]] = {}
        for c in self._clients:
            X, y = self._X[c], self._y[c]
            if y is None:  # a client given no y (ys=[None, ...]) in data that has a target
                raise DataError(f"sufficient_statistics: {cname(c)} has no target values")
            out[c] = {"A": X.T @ X, "b": X.T @ y, "c": float(y @ y), "n": int(y.shape[0])}
        return out

    def fit_scaler(self, *, center: bool = True, scale: bool = True, target: bool = False) -> FederatedScaler:
        """Fit a :class:`FederatedScaler` from per-client sums only.

        Two rounds, each used by the server only through its sum over the clients: each
        client reports ``n_k`` and its column sums (:func:`client_sums`); then its sum of
        squared deviations about the federation's means (:func:`client_moments` with
        ``about``). The server adds them (:func:`add_moments`) into the overall mean and
        sample sd (``n - 1`` denominator, :func:`aggregate_moments`). No rows are pooled.

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
        return fit_scaler(self, center=center, scale=scale, target=target)

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
        return frame_of(self, client_col)


def checked_data(
    Xd: dict[ClientId, np.ndarray],
    yd: dict[ClientId, np.ndarray | None],
    feature_names: Sequence[str],
    target_name: str | None,
    source: FederatedData | None = None,
) -> FederatedData:
    """A :class:`FederatedData` of arrays derived from an already validated one (same features,
    finite values), without checking them again: for the data's own derived objects (a subset,
    a split, a scaled copy), which keep the ``source``'s encoding."""
    fd = object.__new__(FederatedData)
    fd._encoding = None if source is None else getattr(source, "_encoding", None)
    fd._min_rows = MIN_ROWS if source is None else source.min_rows
    fd._min_cell_count = MIN_CELL_COUNT if source is None else source.min_cell_count
    fd._X = {c: readonly(X) for c, X in Xd.items()}
    fd._y = {c: None if y is None else readonly(y) for c, y in yd.items()}
    fd._clients = list(Xd.keys())
    fd._feature_names = list(feature_names)
    fd._target_name = target_name
    return fd
