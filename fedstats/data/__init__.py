"""Per-client regression data: :class:`FederatedData` and federated standardisation.

A :class:`FederatedData` holds, for every client (data holder), a design matrix ``X`` of
shape ``(n_k, d)`` and a response ``y`` of shape ``(n_k,)``. All clients share the same
``d`` features (``feature_names``). The container validates everything at the boundary
and fails loudly (:class:`DataError`, a :class:`ValueError`) with a message that names the
client and, where it applies, the column. Nothing is ever dropped silently: a row with a
NaN is an error, not a row to skip.

Anything computed *across* clients here (:meth:`FederatedData.fit_scaler`) is computed the
federated way, in two rounds that the server uses only through their sum over the clients:
every client reports its count and column sums (:func:`client_sums`), then its squared
deviations about the federation's means (:func:`client_moments`); the server adds them
(:func:`add_moments`) and forms the means and sds (:func:`aggregate_moments`); rows are never
pooled. :func:`fedstats.federation.federated_moments` runs both rounds over clients' rows,
optionally with differential privacy (``dp=``).

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

from .container import ClientData, FederatedData
from .convert import DataLike, as_federated, require_target
from .disclosure import DisclosureError
from .scaling import FederatedScaler, add_moments, aggregate_moments, client_moments, client_sums
from .validation import ConstantFeatureWarning, DataError, UnknownClientError

__all__ = [
    "ClientData",
    "ConstantFeatureWarning",
    "DataError",
    "DisclosureError",
    "DataLike",
    "FederatedData",
    "FederatedScaler",
    "UnknownClientError",
    "add_moments",
    "aggregate_moments",
    "as_federated",
    "client_moments",
    "client_sums",
    "require_target",
]
