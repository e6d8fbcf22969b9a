"""What every model's ``fit`` takes as data (:data:`DataLike`) and the conversion to a
:class:`~fedstats.data.FederatedData` (:func:`as_federated`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from .container import FederatedData
from .validation import DataError


def require_target(data: DataLike, what: str) -> None:
    """Raise :class:`DataError` if ``data`` is a :class:`FederatedData` without a target
    (supervised models call it first, so unsupervised data fails with a clear message)."""
    if isinstance(data, FederatedData):
        data._need_target(what)


#: What every model's ``fit`` takes as data: a :class:`FederatedData`, a dict client -> X or
#: client -> (X, y), or a list of X or of (X, y) pairs (:func:`as_federated` converts them).
DataLike: TypeAlias = "FederatedData | Mapping[Any, Any] | Sequence[Any]"


def as_federated(data: DataLike) -> FederatedData:
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
    raise DataError(
        f"data must be a FederatedData, a dict client -> X or (X, y), or a list of X or of (X, y) "
        f"pairs; got {type(data).__name__}"
    )
