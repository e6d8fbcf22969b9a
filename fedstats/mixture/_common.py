"""What the federated Gaussian mixtures share: the estimator base (parameters, their checks,
the federated start, client sampling) and small helpers. The three models are siblings, as
scikit-learn keeps ``GaussianMixture`` and ``BayesianGaussianMixture``:

* :class:`~fedstats.mixture.fedem.FederatedGaussianMixture` (FedEM, maximum likelihood);
* :class:`~fedstats.mixture.bayes.VariationalGaussianMixture` (variational FedEM);
* :class:`~fedstats.mixture.decentralized.DecentralizedGaussianMixture` (D-FedEM, gossip).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..data import DataError, FederatedData, as_federated
from ..estimator import BOOL, NONE, Constraint, Estimator, Int, OneOf, Real
from ..federation.participation import everyone_first
from ..federation.records import excluded_now, in_fit
from .gmm import cov_shape, precision_cholesky

__all__ = [
    "MixtureEstimator",
    "as_federated",
    "initial_weights",
    "check_failures",
    "still_in_fit",
    "norm",
    "log_weights",
]

ARRAY = Constraint(lambda v: np.ndim(v) >= 1, "an array")
WEIGHTS = Constraint(lambda v: isinstance(v, Mapping) or np.ndim(v) == 1, "an (M,) array or a dict client -> (M,)")


def log_weights(p: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(p, 1e-300))


def norm(w):
    return w / w.sum()


def initial_weights(weights_init, client, M) -> np.ndarray:
    """A client's starting weights: uniform, the common (M,) vector, or its entry of a dict."""
    if weights_init is None:
        return np.full(M, 1.0 / M)
    w = np.asarray(weights_init[client] if isinstance(weights_init, Mapping) else weights_init, dtype=float)
    if w.shape != (M,) or np.any(w < 0) or not np.isclose(w.sum(), 1.0):
        raise ValueError(f"weights_init for client {client!r} must be {M} non-negative weights summing to 1")
    return w


def check_failures(history, seen, clients, what):
    """Clients that failed in some round: an error if one never contributed statistics outside
    a fit (inside one it has dropped out of the fit, which names it), else a warning
    (incremental EM used its last statistics in the rounds it missed)."""
    gone = excluded_now()
    failed = {c: why for rec in history for c, why in rec.failed.items() if c not in gone}
    never = [c for c, s in zip(clients, seen) if not s and c not in gone]
    if never and not in_fit():
        c, why = next(iter(failed.items()), (never[0], "no answer"))
        raise RuntimeError(f"{what}: client(s) {never[:5]} never answered; client {c!r} failed with {why}")
    if not failed:
        return
    c, why = next(iter(failed.items()))
    warnings.warn(
        f"{what}: {len(failed)} client(s) failed in some round and counted with their last statistics; "
        f"client {c!r}: {why}",
        RuntimeWarning,
        stacklevel=3,
    )


def still_in_fit(data: FederatedData) -> FederatedData:
    """The data of the clients still in the fit in progress: one that dropped out (its node
    was lost or refused, its steps failed: :func:`~fedstats.federation.records.excluded_now`)
    is not asked again, and its weights are not in the result, which names it with the reason.
    A node lost during the rounds leaves its last statistics in the components."""
    gone = excluded_now()
    if not any(c in gone for c in data.clients):
        return data
    return data.subset([c for c in data.clients if c not in gone])


@dataclass(eq=False, repr=False)
class MixtureEstimator(Estimator):
    """The parameters every federated mixture has (each declared once, here: the models are
    dataclasses whose constructors add their own), their checks and the federated start.

    Subclasses declare their own parameters as fields and their constraints in
    ``_constraints`` (merged with these)."""

    n_components: int
    _: KW_ONLY
    covariance_type: str = "full"
    reg_covar: float = 1e-6
    rounds: int = 100
    n_init: int = 10
    means_init: ArrayLike | None = None
    covariances_init: ArrayLike | None = None

    _constraints = {
        "n_components": Int(1),
        "covariance_type": OneOf("full", "tied", "diag", "spherical"),
        "reg_covar": Real(0),
        "rounds": Int(1),
        "n_init": Int(1),
        "means_init": NONE | ARRAY,
        "covariances_init": NONE | ARRAY,
    }

    def _check(self, data: FederatedData) -> None:
        self._validate_params()
        M, d = self.n_components, data.n_features
        if data.n_total < M:
            raise DataError(f"{data.n_total} rows in total, fewer than n_components={M}")
        if self.means_init is not None and np.shape(self.means_init) != (M, d):
            raise ValueError(f"means_init must have shape {(M, d)}, got {np.shape(self.means_init)}")
        if self.covariances_init is not None:
            want = cov_shape(self.covariance_type, M, d)
            if np.shape(self.covariances_init) != want:
                raise ValueError(
                    f"covariances_init must have shape {want} for covariance_type="
                    f"{self.covariance_type!r}, got {np.shape(self.covariances_init)}"
                )
            precision_cholesky(np.asarray(self.covariances_init, float), self.covariance_type)
        weights_init = getattr(self, "weights_init", None)
        if isinstance(weights_init, Mapping):
            missing = [c for c in data.clients if c not in weights_init]
            if missing:
                raise ValueError(f"weights_init has no weights for client(s) {missing[:5]}")

    def _start(self, data, seed):
        """Initial (means, covariances, info): the federated k-means start (``info``: its
        candidates' log-likelihoods), or the given means (with the federated within-cluster
        covariance unless given; ``info`` empty)."""
        from ._init import federated_kmeans_init, hard_covariances

        M, ct = self.n_components, self.covariance_type
        if self.means_init is None:
            return federated_kmeans_init(data, M, ct, self.reg_covar, self.n_init, seed)
        means = np.array(self.means_init, dtype=float)
        if self.covariances_init is not None:
            return means, np.array(self.covariances_init, dtype=float), {}
        return means, hard_covariances(data, means, ct, self.reg_covar, seed), {}

    def _run_fields(self, data: FederatedData, res: Any, info: Any, converged: bool | None = None) -> dict[str, Any]:
        """What every mixture's result holds of its run (keyword arguments of its constructor):
        the data's names and sizes, the run's history, counters and convergence (``converged``
        where the model judges it itself), the start and ``reg_covar``."""
        return {
            "feature_names": data.feature_names,
            "n_obs": data.n_obs,
            "history": res.history,
            "communication": res.communication,
            "rounds": res.rounds,
            "converged": res.converged if converged is None else converged,
            "init_info": info,
            "reg_covar": self.reg_covar,
        }

    def _participation(self, clients):
        return everyone_first(self.participation, clients)


@dataclass(eq=False, repr=False, kw_only=True)
class ServerMixture(MixtureEstimator):
    """The parameters of the two client-server models (FedEM and variational FedEM)."""

    tol: float | None = 1e-6
    shared_weights: bool = False
    participation: float = 1.0

    _constraints = {
        **MixtureEstimator._constraints,
        "tol": NONE | Real(0),
        "shared_weights": BOOL,
        "participation": Real(0, 1, closed=(False, True)),
    }

    def _warn_unconverged(self, res: Any, what: str) -> None:
        """Warn where the run stopped at its round budget before its ``tol`` was met."""
        if not res.converged and self.tol:
            warnings.warn(
                f"{what} did not converge in {self.rounds} rounds (tol={self.tol}); increase rounds",
                RuntimeWarning,
                stacklevel=3,
            )


class RowStack:
    """Simulation-side cache of the participants' rows stacked into one array.

    The batched client step of FedEM computes every participant's E-step in one pass
    (the components are the same for all of them). Only the in-process simulator uses it;
    it lives on the algorithm object and is dropped from pickles.
    """

    def __init__(self) -> None:
        self.key: tuple = ()
        self.X = None
        self.starts = None
        self.centred = None  # (g, X - g)

    def get(self, Xs):
        if len(Xs) != len(self.key) or any(a is not b for a, b in zip(Xs, self.key)):
            self.key = tuple(Xs)
            self.X = np.concatenate(Xs) if len(Xs) > 1 else Xs[0]
            self.starts = np.cumsum([0] + [x.shape[0] for x in Xs[:-1]])
            self.centred = None
        return self.X, self.starts

    def centred_on(self, g):
        """``(g, X - g)`` for the rows of the last :meth:`get`, computed once per ``g``."""
        if self.centred is None or not np.array_equal(self.centred[0], g):
            self.centred = (g, self.X - g)
        return self.centred
