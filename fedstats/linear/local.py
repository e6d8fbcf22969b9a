"""What HM1 and its baselines share: local gradient steps on a squared loss, the client
view of the data, and a result of per-client point estimates.

The loss of client k is ``||y_k - X_k theta||^2``; one step is
``theta <- theta + 2 lr * X_b^T (y_b - X_b theta) / r`` on a batch ``b`` of rows, with
``r = 1`` for ``grad_reduction="sum"`` and ``r = |b|`` for ``"mean"`` (the paper does not say which).
A full batch needs only the client's ``X^T X`` and ``X^T y``, so full-batch steps of many
clients run as one batched matrix product (:func:`full_batch_steps`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .. import streams
from ..estimator import OneOf, Real
from ..federation import FederatedAlgorithm, run
from ..federation.oneshot import raise_failures
from ..federation.records import excluded_now
from ..result_file import register
from ..results import FederatedResult, check_level, prediction_frame

if TYPE_CHECKING:
    from ..data import FederatedData
    from ..federation.scaling import LinearScaling

REDUCTIONS = ("sum", "mean")
#: A step size: "auto" or a number > 0 (the constraint of every gradient model's ``lr``).
LR = OneOf("auto") | Real(0, closed=(False, True))


def full_batch(batch_size, n: int) -> bool:
    return batch_size is None or batch_size >= n


def local_steps(
    theta, X, y, *, steps: int, lr: float, batch_size, reduction: str, rng, anchor=None, anchor_weight: float = 0.0
) -> np.ndarray:
    """``steps`` (mini-batch) gradient steps from ``theta`` on one client's data.

    With ``anchor`` the loss gains ``anchor_weight/2 * ||theta - anchor||^2`` (Ditto's
    proximal term); its gradient is added at every step. Batches are drawn without
    replacement within a step (``rng``); a ``batch_size`` of ``None`` or at least the number
    of rows is full-batch gradient descent and uses no randomness.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported by the callers
        return _local_steps(
            np.array(theta, dtype=float), X, y, steps, lr, batch_size, reduction, rng, anchor, anchor_weight
        )


def _local_steps(theta, X, y, steps, lr, batch_size, reduction, rng, anchor, anchor_weight):
    n = X.shape[0]
    if full_batch(batch_size, n):
        XtX, Xty = X.T @ X, X.T @ y
        r = 1.0 if reduction == "sum" else float(n)
        for _ in range(steps):
            grad = (XtX @ theta - Xty) / r
            if anchor is not None:
                grad = grad + anchor_weight / 2 * (theta - anchor)
            theta = theta - 2 * lr * grad
        return theta
    for _ in range(steps):
        b = rng.choice(n, size=batch_size, replace=False)
        Xb, yb = X[b], y[b]
        grad = Xb.T @ (Xb @ theta - yb) / (1.0 if reduction == "sum" else float(batch_size))
        if anchor is not None:
            grad = grad + anchor_weight / 2 * (theta - anchor)
        theta = theta - 2 * lr * grad
    return theta


def full_batch_steps(thetas, XtX, Xty, *, steps: int, lr: float, scale) -> np.ndarray:
    """Full-batch steps of many clients at once: ``thetas`` (K, d), ``XtX`` (K, d, d),
    ``Xty`` (K, d), ``scale`` (K,) the gradient divisor of each client (1 or its n)."""
    thetas = np.array(thetas, dtype=float)
    scale = np.asarray(scale, dtype=float)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            thetas = thetas - 2 * lr * (np.einsum("kij,kj->ki", XtX, thetas) - Xty) / scale
    return thetas


def max_curvature(X, batch_size, reduction: str) -> float:
    """Largest eigenvalue of the Hessian/2 of one step's loss on this client (its
    expectation for mini-batches): what bounds a stable learning rate (``lr < 1/that``)."""
    n = X.shape[0]
    lam = float(np.linalg.eigvalsh(X.T @ X)[-1]) if n else 0.0
    if reduction == "mean":
        return lam / max(n, 1)
    return lam if full_batch(batch_size, n) else lam * batch_size / n


def auto_lr(Xs, batch_size, reduction: str, factor: float = 0.5) -> float:
    """``factor / max_k curvature_k``: a learning rate at which local gradient descent is
    stable on every client (each client shares one scalar, its largest curvature)."""
    return _lr_for(max(max_curvature(X, batch_size, reduction) for X in Xs), factor)


def _lr_for(largest_curvature: float, factor: float = 0.5) -> float:
    if not largest_curvature > 0:
        raise ValueError("cannot choose a learning rate: every client's design is zero")
    return factor / largest_curvature


class _CurvatureShare(FederatedAlgorithm):
    """One round for ``lr="auto"``: each client sends one scalar, the largest curvature of its
    local objective; the server keeps the maximum.

    The reply stays per client (no :attr:`summed_keys`): the server needs the maximum over
    the clients, which no sum gives (a secure maximum is another protocol)."""

    reply_keys = ("curvature",)

    def __init__(self, batch_size, reduction: str):
        self.batch_size, self.reduction = batch_size, reduction

    def init_server(self, clients, rng):
        return {"lam": 0.0}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        return {"curvature": np.array([max_curvature(data[0], self.batch_size, self.reduction)])}, state

    def server_step(self, server_state, replies, round):
        return {"lam": max([float(m["curvature"][0]) for m in replies.values()], default=0.0)}, {}


def federated_lr(lr, design, batch_size, reduction: str, *, seed: int = 0) -> float:
    """:func:`resolve_lr` for a federation: with ``lr="auto"`` the clients' largest curvatures
    come from one federated round (the server never reads a design matrix)."""
    if not (isinstance(lr, str) and lr == "auto"):
        return resolve_lr(lr, [], batch_size, reduction)
    out = run(
        _CurvatureShare(batch_size, reduction), design, kind="step-size curvature", rounds=1, seed=seed, progress=False
    )
    raise_failures(out.history, "lr='auto' (the clients' curvatures)")  # in a fit, a failed client drops out
    return _lr_for(out.server_state["lam"])


def without_excluded(theta: np.ndarray, clients: Sequence[Hashable]) -> np.ndarray:
    """``theta`` (d, K) with NaN in the columns of the clients that dropped out of the fit in
    progress (:func:`~fedstats.federation.records.excluded_now`): they have no coefficients."""
    out = np.array(theta, dtype=float)
    gone = excluded_now()
    for k, c in enumerate(clients):
        if c in gone:
            out[:, k] = np.nan
    return out


class ClientDesign:
    """What the runtime hands each client: ``(X, y)`` with the intercept column prepended
    when asked."""

    def __init__(self, data, intercept: bool):
        self.data, self.intercept = data, intercept
        self.clients = list(data.clients)

    def __getitem__(self, client):
        cd = self.data[client]
        X = np.column_stack([np.ones(cd.n), cd.X]) if self.intercept else np.asarray(cd.X)
        return X, np.asarray(cd.y)


class ScaledDesign(ClientDesign):
    """What the runtime hands each client: ``(X, y)`` on the standardised scale of ``scaling``
    (each client scales its own rows with the federation's moments, :mod:`fedstats.federation.scaling`),
    with the intercept column prepended when asked; ``scaling=None``: the data's own scale."""

    def __init__(self, data, intercept: bool, scaling: LinearScaling | None = None):
        super().__init__(data, intercept)
        self.scaling = scaling

    def __getitem__(self, client):
        if self.scaling is None:
            return super().__getitem__(client)
        cd = self.data[client]
        X, y = self.scaling.transform_X(cd.X), self.scaling.transform_y(cd.y)
        return (np.column_stack([np.ones(cd.n), X]) if self.intercept else X), y


def coefficient_names(data, intercept: bool) -> list[str]:
    return (["intercept"] if intercept else []) + list(data.feature_names)


def initial_theta(init: str, d: int, K: int, rng) -> np.ndarray:
    """The starting coefficients (d, K): i.i.d. N(0, 1) (the paper) or zeros (its code)."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    return rng.standard_normal((d, K)) if init == "normal" else np.zeros((d, K))


INITS = ("normal", "zeros")


def seeded_start(init: str, d: int, K: int, seed: int) -> np.ndarray:
    """The start HM1's federated and centralised fits and the Separate baseline share:
    :func:`initial_theta` from the stream ``initial theta`` of ``seed``."""
    return initial_theta(init, d, K, streams.stream(seed, "initial theta"))


def resolve_lr(lr, Xs, batch_size, reduction: str) -> float:
    """``lr`` as a positive float; ``"auto"`` is :func:`auto_lr`."""
    if isinstance(lr, str) and lr == "auto":
        return auto_lr(Xs, batch_size, reduction)
    try:
        v = float(lr)
    except (TypeError, ValueError):
        raise ValueError(f"lr must be a positive number or 'auto', got {lr!r}") from None
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"lr must be a positive number or 'auto', got {lr!r}")
    return v


@register
@dataclass(repr=False)
class PointResult(FederatedResult):
    """Per-client point estimates of a linear model: ``coef(client)``, ``coefficients``,
    ``predict(X, client)``, with the run's ``history`` and ``communication`` (``None``
    when the method does not communicate) and ``save``/``load``.

    The result contract (:mod:`fedstats.results`) with points only: ``client_summary`` holds
    each client's coefficients in ``mean`` and NaN in ``sd, lower, upper, p_value``;
    ``summary`` holds the shared coefficients where every client uses one model (``shared``:
    FedAvg, distributed ridge) and no rows otherwise; ``predict`` fills ``mean`` only;
    the posterior verbs raise :class:`~fedstats.results.NoPosteriorError`."""

    estimates = "estimate"  # point estimates (no distribution)

    feature_names: list[str]
    clients: list
    theta: np.ndarray  # (d, K)
    options: dict
    history: Any = None
    communication: Any = None
    converged: bool = True
    seconds: float = 0.0
    seed: int = 0
    model: str | None = None  # the estimator's class name
    shared: bool = False  # every client predicts with one shared model
    excluded: dict = field(default_factory=dict)  # client -> why it is not in the fit
    encoding: dict | None = None  # how the fit's columns were encoded (predict reads frames by name)

    @property
    def rounds(self) -> int:
        return 0 if self.history is None else len(self.history)

    def _k(self, client: Hashable) -> int:
        self._check_client(client)
        return self.clients.index(client)

    def _no_posterior(self, what: str) -> str:
        return (
            f"{self.model or type(self).__name__} estimates points, with no {what} posterior; for posteriors fit "
            "HierarchicalLinearModel, or StructuralCovarianceModel with fit(..., uncertainty=True)"
        )

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        if not self.shared:
            return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))
        return pd.DataFrame({"mean": self.theta[:, 0]}, index=pd.Index(self.feature_names, name="parameter"))

    def _client_table(self, client, level: float, kind: str) -> pd.DataFrame:
        return pd.DataFrame({"mean": self.coef(client)}, index=pd.Index(self.feature_names, name="parameter"))

    def coef(self, client: Hashable) -> np.ndarray:
        """The coefficients client ``client`` predicts with (a copy)."""
        return self.theta[:, self._k(client)].copy()

    @property
    def coefficients(self) -> pd.DataFrame:
        """All coefficients: one row per client, one column per coefficient."""
        return pd.DataFrame(self.theta.T, index=pd.Index(self.clients, name="client"), columns=self.feature_names)

    def _design(self, X: ArrayLike) -> np.ndarray:
        intercept = bool(self.options.get("fit_intercept"))
        X = self._feature_rows(X, self.feature_names[int(intercept) :])
        X = np.atleast_2d(np.asarray(X, dtype=float))
        k = len(self.feature_names) - int(intercept)
        if X.shape[1] != k:
            raise ValueError(f"X has {X.shape[1]} columns, the model was fitted on {k} features")
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains NaN or inf")
        return np.column_stack([np.ones(len(X)), X]) if intercept else X

    def point_predict(self, X: ArrayLike, client: Hashable) -> np.ndarray:
        """The point predictions ``X coef(client)`` (what :meth:`rmse` scores)."""
        return self._design(X) @ self.theta[:, self._k(client)]

    def _new_client_k(self, client: Hashable | None) -> int:
        if client is not None:
            return self._k(client)
        if not self.shared:
            raise ValueError(
                f"{self.model or 'this model'} has no model for a client that took no part in the fit: "
                "give a fitted client"
            )
        return 0

    def predict(self, X: ArrayLike, client: Hashable | None = None, *, level: float = 0.95) -> pd.DataFrame:
        """Point predictions of client ``client`` for the rows of ``X``: column ``mean``, NaN
        bands (this model has no distribution). ``client=None`` (a new client) uses the
        shared model where there is one, and is refused otherwise."""
        check_level(level)
        k = self._new_client_k(client)
        return prediction_frame(
            self._design(X) @ self.theta[:, k], predicted_for="client" if client is not None else "new client"
        )

    def rmse(self, test: FederatedData) -> pd.Series:
        """Root mean squared error of each client's predictions on ``test`` (a
        :class:`~fedstats.data.FederatedData` with the same clients); ``.mean()`` is the A-RMSE."""
        out = {c: float(np.sqrt(np.mean((self.point_predict(test[c].X, c) - test[c].y) ** 2))) for c in test.clients}
        return pd.Series(out, name="rmse")
