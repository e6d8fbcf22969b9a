"""Algorithm 1 of HM1 (the federated multi-task regression that learns the covariance Omega
between clients; see :mod:`fedstats.linear.structural` for the model): its numerics, the
federated algorithm, and the one-off exchange of the clients' information for the posteriors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import linalg as sla

from ..federation import FederatedAlgorithm
from ..result_file import register
from .local import full_batch, full_batch_steps, initial_theta, local_steps

if TYPE_CHECKING:
    from ..federation.scaling import LinearScaling

# --------------------------------------------------------------------------- numerics


def jittered_cholesky(A: np.ndarray, jitter: float = 1e-8, max_tries: int = 12) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of ``A + eps I`` with ``eps = jitter * mean(diag A)``, raised
    tenfold until the factorisation succeeds. Returns ``(L, eps)``."""
    A = (A + A.T) / 2
    scale = float(np.mean(np.diag(A)))
    if not np.isfinite(scale) or scale <= 0:
        scale = 1.0
    eps = jitter * scale
    for _ in range(max_tries):
        try:
            L = np.linalg.cholesky(A + eps * np.eye(len(A)))
            if np.all(np.isfinite(L)):
                return L, eps
        except np.linalg.LinAlgError:
            pass
        eps = max(eps * 10, 1e-12 * scale)
    raise np.linalg.LinAlgError(f"matrix not positive definite even with jitter {eps:.3g}")


def solve_omega(omega: np.ndarray, B: np.ndarray, jitter: float = 1e-8) -> np.ndarray:
    """``Omega^{-1} B`` by a jittered Cholesky solve."""
    L, _ = jittered_cholesky(omega, jitter)
    return sla.cho_solve((L, True), B)


def aggregates(theta: np.ndarray, omega: np.ndarray, jitter: float = 1e-8) -> np.ndarray:
    """``G = Theta Omega^{-1}`` (d x K), column k being client k's aggregate ``g_k``."""
    return solve_omega(omega, theta.T, jitter).T


def floor_eigenvalues(omega: np.ndarray, floor: float) -> np.ndarray:
    """``Omega`` with its eigenvalues raised to at least ``floor * mean(diag Omega)``."""
    if floor <= 0:
        return omega
    w, V = np.linalg.eigh((omega + omega.T) / 2)
    lo = floor * float(np.mean(np.diag(omega)))
    if w[0] >= lo:
        return omega
    return (V * np.maximum(w, lo)) @ V.T


def omega_update(omega: np.ndarray, theta: np.ndarray, alpha: float) -> np.ndarray:
    """``(1 - alpha) Omega + (alpha / d) Theta^T Theta``, symmetrised."""
    d = theta.shape[0]
    new = (1 - alpha) * omega + (alpha / d) * (theta.T @ theta)
    return (new + new.T) / 2


# --------------------------------------------------------------------------- the algorithm


@register
@dataclass
class _HM1Server:
    theta: np.ndarray  # (d, K)
    omega: np.ndarray  # (K, K)
    agg: np.ndarray  # (d, K): Theta Omega^{-1} for the current (Theta, Omega)
    index: dict
    #: clients that have answered a round: Omega learns only between them (one that never did,
    #: e.g. it dropped out of the fit, keeps its starting row, so its starting column steers no one)
    seen: frozenset = frozenset()


@register
@dataclass
class _HM1Client:
    n: int
    XtX: np.ndarray
    Xty: np.ndarray
    shrink: float


class HM1Algorithm(FederatedAlgorithm):
    """Algorithm 1 as a :class:`~fedstats.federation.FederatedAlgorithm`.

    The broadcast to client k holds exactly ``theta`` (its own column) and ``aggregate``
    (``g_k``); the reply holds ``theta``. See :class:`StructuralCovarianceModel` for the
    options.

    The reply stays per client (no :attr:`summed_keys`): the server keeps every client's
    coefficients as its column of ``Theta`` and learns the covariance ``Omega`` between
    clients from ``Theta^T Theta``, the products of different clients' coefficients, and
    sends client k its own ``g_k`` (column k of ``Theta Omega^{-1}``); no sum over clients
    carries them.
    """

    reply_keys = ("theta",)
    server_only_fields = ("theta_init", "omega_init", "callback")

    def __init__(
        self,
        d: int,
        *,
        local_steps: int,
        lr: float,
        alpha: float,
        batch_size,
        grad_reduction: str,
        shrink_scale,
        init: str,
        omega_init=None,
        theta_init=None,
        jitter: float = 1e-8,
        eig_floor: float = 0.0,
        tol: float = 1e-4,
        callback=None,
    ):
        self.callback = callback
        self.d, self.local_steps, self.lr, self.alpha = d, local_steps, lr, alpha
        self.batch_size, self.grad_reduction, self.shrink_scale = batch_size, grad_reduction, shrink_scale
        self.init, self.omega_init, self.theta_init = init, omega_init, theta_init
        self.jitter, self.eig_floor, self.tol = jitter, eig_floor, tol

    def init_server(self, clients, rng):
        K = len(clients)
        theta = (
            np.array(self.theta_init, dtype=float)
            if self.theta_init is not None
            else initial_theta(self.init, self.d, K, rng)
        )
        omega = np.eye(K) if self.omega_init is None else np.array(self.omega_init, dtype=float)
        return _HM1Server(theta, omega, aggregates(theta, omega, self.jitter), {c: i for i, c in enumerate(clients)})

    def init_client(self, client, data, rng):
        X, y = data
        n = X.shape[0]
        s = shrink_for(self.shrink_scale, X, y, client, self.local_steps, self.batch_size, self.grad_reduction)
        return _HM1Client(n, X.T @ X, X.T @ y, s)

    def broadcast(self, server_state, client, round):
        k = server_state.index[client]
        return {"theta": server_state.theta[:, k].copy(), "aggregate": server_state.agg[:, k].copy()}

    def _scale(self, n: int) -> float:
        return 1.0 if self.grad_reduction == "sum" else float(n)

    def client_step(self, message, state, data, rng):
        X, y = data
        theta = local_steps(
            message["theta"],
            X,
            y,
            steps=self.local_steps,
            lr=self.lr,
            batch_size=self.batch_size,
            reduction=self.grad_reduction,
            rng=rng,
        )
        theta = theta - 2 * self.lr * state.shrink * message["aggregate"]
        if not np.all(np.isfinite(theta)):
            raise FloatingPointError(f"local gradient descent diverged (lr={self.lr:.3g})")
        return {"theta": theta}, state

    def client_steps(self, messages, states, datas, rngs):
        # Full-batch gradient descent needs only each client's X^T X and X^T y: one batched
        # product for all clients. Mini-batches draw rows and go one client at a time.
        if not all(full_batch(self.batch_size, s.n) for s in states):
            return super().client_steps(messages, states, datas, rngs)
        thetas = full_batch_steps(
            np.stack([m["theta"] for m in messages]),
            np.stack([s.XtX for s in states]),
            np.stack([s.Xty for s in states]),
            steps=self.local_steps,
            lr=self.lr,
            scale=[self._scale(s.n) for s in states],
        )
        shrink = np.array([s.shrink for s in states])[:, None]
        thetas = thetas - 2 * self.lr * shrink * np.stack([m["aggregate"] for m in messages])
        return [
            ({"theta": t}, s)
            if np.all(np.isfinite(t))
            else FloatingPointError(f"local gradient descent diverged (lr={self.lr:.3g})")
            for t, s in zip(thetas, states)
        ]

    def server_step(self, server_state, replies, round):
        theta = server_state.theta.copy()
        for c, reply in replies.items():
            theta[:, server_state.index[c]] = reply["theta"]
        seen = server_state.seen | frozenset(replies)
        with np.errstate(over="ignore", invalid="ignore"):
            omega = omega_update(server_state.omega, theta, self.alpha)
        unseen = [k for c, k in server_state.index.items() if c not in seen]
        if unseen:
            omega[unseen, :], omega[:, unseen] = server_state.omega[unseen, :], server_state.omega[:, unseen]
        if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(omega))):
            raise FloatingPointError("the coefficients or Omega overflowed")
        omega = floor_eigenvalues(omega, self.eig_floor)
        change = float(np.linalg.norm(theta - server_state.theta))
        theta_rel, omega_rel = relative_change(theta, server_state.theta), relative_change(omega, server_state.omega)
        w = np.linalg.eigvalsh(omega)
        new = _HM1Server(theta, omega, aggregates(theta, omega, self.jitter), server_state.index, seen)
        if self.callback is not None:
            self.callback(round, theta.copy(), omega.copy())
        return new, {
            "theta_rel_change": theta_rel,
            "omega_rel_change": omega_rel,
            "theta_change": change,
            "omega_min_eig": float(w[0]),
            "omega_cond": float(w[-1] / w[0]) if w[0] > 0 else float("inf"),
        }

    def final_state(self, state):
        """Nothing: the client's ``X'X`` and ``X'y`` stay on it (the result needs no client state)."""
        return None

    def converged(self, server_state, metrics):
        """:func:`round_converged` (the fit runs all rounds unless ``stop_early``, by passing
        ``min_rounds=rounds`` to the runner)."""
        return round_converged(metrics, self.tol)


def relative_change(new: np.ndarray, old: np.ndarray) -> float:
    """``||new - old||_F / max(||new||_F, ||old||_F)`` (0 when they are equal)."""
    num = float(np.linalg.norm(new - old))
    if num == 0:
        return 0.0
    return num / max(float(np.linalg.norm(new)), float(np.linalg.norm(old)))


def round_converged(metrics: Mapping, tol: float) -> bool:
    """Whether a round's relative changes of Theta and Omega are both below ``tol`` (> 0)."""
    return bool(
        tol > 0 and metrics.get("theta_rel_change", np.inf) < tol and metrics.get("omega_rel_change", np.inf) < tol
    )


def shrink_for(shrink_scale, X, y, client, steps: int, batch_size, reduction: str) -> float:
    """A client's ``s`` in the prior step: ``shrink_scale`` itself, or for ``"noise"``
    ``T sigma^2`` times the expected fraction of the full-data sum gradient one step takes."""
    if shrink_scale != "noise":
        return float(shrink_scale)
    n = X.shape[0]
    frac = 1.0 / n if reduction == "mean" else (1.0 if full_batch(batch_size, n) else batch_size / n)
    return steps * residual_variance(X, y, client, "use a numeric shrink_scale") * frac


class CannotShareError(ValueError):
    """A client could not share its information matrix or estimate its noise variance (``fit`` with ``uncertainty="auto"``
    then keeps Algorithm 1's point and warns)."""


def residual_variance(X, y, client=None, hint: str = "give noise_sd") -> float:
    """Unbiased residual variance of the client's least-squares fit (needs more rows than
    the rank of its design, and a residual that is not exactly 0)."""
    n = X.shape[0]
    rank = np.linalg.matrix_rank(X)
    if n <= rank:
        raise CannotShareError(
            f"client {client!r} has {n} rows for {rank} independent coefficients: its noise variance "
            f"cannot be estimated; {hint}"
        )
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    rss = float(np.sum((y - X @ beta) ** 2))
    if not rss > 1e-24 * float(np.sum(y**2)):  # an exact fit up to rounding
        raise CannotShareError(
            f"client {client!r}: least squares fits its data exactly, so its noise variance cannot be estimated; {hint}"
        )
    return rss / (n - rank)


class InformationShare(FederatedAlgorithm):
    """One round in which each client sends ``X^T X / sigma^2``, ``X^T y / sigma^2`` and its
    noise variance ``sigma^2`` (known, or its least-squares residual variance); opt-in, for
    the conditional posterior. The server only collects them.

    The replies stay per client (no :attr:`summed_keys`): the posterior of all clients'
    coefficients given ``Omega`` (:func:`~fedstats.linear.hm1_posterior.conditional_posterior`)
    and the EM estimate of ``Omega`` put each client's information and score in its own
    block, coupled to the others' through ``Omega``; client k's posterior block and its
    predictive intervals need its own noise variance."""

    reply_keys = ("information", "score", "noise_var")
    # the whole least-squares fit of the client: a node's policy must allow it
    releases_statistics = True

    def __init__(self, noise_var: Mapping | None):
        self.noise_var = noise_var

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        if self.noise_var is not None and client in self.noise_var:
            return float(self.noise_var[client])
        return residual_variance(*data, client)

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        X, y = data
        return {"information": X.T @ X / state, "score": X.T @ y / state, "noise_var": np.array(state)}, state

    def server_step(self, server_state, replies, round):
        return dict(replies), {}


def on_fit_scale(
    scaling: LinearScaling | None, theta_init: np.ndarray | None, callback: Callable | None
) -> tuple[np.ndarray | None, Callable | None]:
    """``theta_init`` (data scale) on the scale the iteration runs on, and a callback that
    receives Theta on the data's scale."""
    if scaling is None:
        return theta_init, callback
    if theta_init is not None:
        theta_init = scaling.coef_forward(theta_init.T).T
    if callback is not None:
        user = callback

        def callback(r: int, theta: np.ndarray, omega: np.ndarray) -> object:
            return user(r, scaling.coef_back(theta.T).T, omega)

    return theta_init, callback
