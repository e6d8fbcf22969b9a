"""The data of a deployment as the server sees it: clients, row counts and schema, no rows
(:class:`RemoteFederatedData`), and a node's own data read from its CSV file (:func:`read_node_csv`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context

from ...data import DataError, FederatedData
from ..protocol import ClientId


class RemoteDataError(DataError):
    """The server tried to read rows that only a client holds (deployment mode)."""


class _RemoteRows:
    """Stands in, on the server, for rows that stay on a client: the shape is known, not the values."""

    dtype = np.dtype(float)

    def __init__(self, client: ClientId, shape: tuple[int, ...]):
        self.client, self.shape = client, tuple(shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def _refuse(self, *args, **kwargs):
        raise RemoteDataError(
            f"the rows of client {self.client!r} stay on its node; the server cannot read them "
            "(this computation must run on the client)"
        )

    __array__ = __getitem__ = __iter__ = _refuse


class RemoteFederatedData(FederatedData):
    """The server's view of a deployment's data: clients, row counts and schema, no rows.

    Built by :meth:`FlowerSession.remote_data` from what each node reports. Passing it to a
    model's ``fit`` works wherever the model touches rows only in its client steps; any
    server-side read of rows raises :class:`RemoteDataError` naming the client.
    """

    # stand-ins for the arrays (:class:`_RemoteRows`): shapes, no rows
    _X: dict[ClientId, Any]
    _y: dict[ClientId, Any]

    def __init__(self, n_obs: Mapping[ClientId, int], feature_names: Sequence[str], target_name: str | None) -> None:
        d = len(feature_names)
        self._X = {c: _RemoteRows(c, (int(n), d)) for c, n in n_obs.items()}
        self._y = {c: None if target_name is None else _RemoteRows(c, (int(n),)) for c, n in n_obs.items()}
        self._clients = list(n_obs)
        self._feature_names = list(feature_names)
        self._target_name = target_name
        # the rows' disclosure rules are the nodes' (each checks its own against its policy)
        self._min_rows = self._min_cell_count = 1
        self._encoding = None

    def subset(self, clients: Iterable[ClientId]) -> RemoteFederatedData:
        """The view of some clients only (no rows, as the whole)."""
        ids = list(clients)
        unknown = [c for c in ids if c not in self]
        if unknown:
            raise DataError(f"unknown client id(s) {unknown[:5]}")
        return RemoteFederatedData({c: self._X[c].shape[0] for c in ids}, self._feature_names, self._target_name)


def read_node_csv(context: Context) -> FederatedData:
    """A deployment node's own data: the CSV at its node config ``data-path``.

    Node config keys: ``data-path`` (required), ``client`` (its id; default the file name
    without extension), ``target`` (the response column; absent or empty for unsupervised
    models). Every other column must be numeric (categorical columns: encode them first).
    """
    import pandas as pd

    cfg = context.node_config
    if "data-path" not in cfg:
        raise DataError("this SuperNode has no data: start it with --node-config \"data-path='client.csv'\"")
    path = Path(str(cfg["data-path"]))
    name = str(cfg.get("client", "") or path.stem)
    target = str(cfg.get("target", "")) or None
    frame = pd.read_csv(path)
    return FederatedData.from_dataframe(frame.assign(__client__=name), by="__client__", target=target)
