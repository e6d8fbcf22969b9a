"""HM1: federated multi-task regression that learns the covariance between devices
(Algorithm 1 of the linear-models paper; spec ``linear.md`` §1).

The coefficients of the K devices form a d x K matrix Theta with the matrix-normal prior
``MN(0, I_d, Omega)``: each coefficient, seen across devices, is ``N(0, Omega)``. A round:

* the server sends device k its own ``theta_k`` and the aggregate
  ``g_k = (Theta Omega^{-1})[:, k]``, computed from the start-of-round Theta with a jittered
  Cholesky solve (never an explicit inverse);
* the device takes ``local_steps`` gradient steps on its own data, then one prior step
  ``theta_k <- theta_k - 2 lr * shrink_scale_k * g_k``, and sends ``theta_k`` back;
* the server writes the returned columns into Theta (non-participants keep theirs) and
  updates ``Omega <- (1 - alpha) Omega + (alpha / d) Theta^T Theta``.

What the iteration optimises (spec §1.5): with Omega frozen and full-batch gradients it
converges to the solution of ``(I - M_k)(theta_k - theta_k^OLS) + 2 lr s_k (Theta
Omega^{-1})[:, k] = 0`` with ``M_k = (I - 2 lr X_k^T X_k)`` to the power T; as ``lr -> 0`` that is
the MAP with noise variance ``s_k / T`` on device k. ``shrink_scale=1`` (the paper's
algorithm) therefore assumes noise variance 1/T; ``shrink_scale="noise"`` uses
``s_k = T * sigma_k^2`` with each device's own residual variance, which targets the model
with its real noise. The joint MAP of (Theta, Omega) is degenerate, so the result depends on
alpha, the rounds, the learning rate and the initialisation: the damped update is a
heuristic, and the history records how well-conditioned Omega stays.

Uncertainty (not in the paper, opt-in): given the fitted Omega and a noise variance per
device, ``vec(Theta)`` has the Gaussian posterior with precision
``blockdiag_k(X_k^T X_k / sigma_k^2) + Omega^{-1} kron I_d``. To compute it each device sends
the server, once, its information matrix ``X_k^T X_k / sigma_k^2`` (d x d) and
``X_k^T y_k / sigma_k^2`` (d): the sufficient statistics of its data, more than Algorithm 1
shares (only theta_k). The server returns each device the mean and covariance of its own
block.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..data import require_target
import pandas as pd
from scipy import linalg as sla
from scipy import stats as sst

from ..federation import FederatedAlgorithm, run
from ..federation.backend import accepts_backend
from ..inference.posterior import GaussianPosterior
from ._local import (INITS, DeviceDesign, PointResult, check_positive_int, check_reduction, coefficient_names,
                     federated_lr, full_batch, full_batch_steps, initial_theta, local_steps,
                     resolve_lr)


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
    """``G = Theta Omega^{-1}`` (d x K), column k being device k's aggregate ``g_k``."""
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


@dataclass
class _Server:
    theta: np.ndarray  # (d, K)
    omega: np.ndarray  # (K, K)
    agg: np.ndarray  # (d, K): Theta Omega^{-1} for the current (Theta, Omega)
    index: dict


@dataclass
class _Device:
    n: int
    XtX: np.ndarray
    Xty: np.ndarray
    shrink: float


class HM1Algorithm(FederatedAlgorithm):
    """Algorithm 1 as a :class:`~fedstats.federation.FederatedAlgorithm`.

    The broadcast to device k holds exactly ``theta`` (its own column) and ``aggregate``
    (``g_k``); the reply holds ``theta``. See :class:`StructuralCovarianceModel` for the
    options.
    """

    reply_keys = ("theta",)
    server_only_fields = ("theta_init", "omega_init", "callback")

    def __init__(self, d: int, *, local_steps: int, lr: float, alpha: float, batch_size, grad_reduction: str,
                 shrink_scale, init: str, omega_init=None, theta_init=None, jitter: float = 1e-8,
                 eig_floor: float = 0.0, tol: float = 0.0, callback=None):
        self.callback = callback
        self.d, self.local_steps, self.lr, self.alpha = d, local_steps, lr, alpha
        self.batch_size, self.grad_reduction, self.shrink_scale = batch_size, grad_reduction, shrink_scale
        self.init, self.omega_init, self.theta_init = init, omega_init, theta_init
        self.jitter, self.eig_floor, self.tol = jitter, eig_floor, tol

    def init_server(self, clients, rng):
        K = len(clients)
        theta = (np.array(self.theta_init, dtype=float) if self.theta_init is not None
                 else initial_theta(self.init, self.d, K, rng))
        omega = np.eye(K) if self.omega_init is None else np.array(self.omega_init, dtype=float)
        return _Server(theta, omega, aggregates(theta, omega, self.jitter), {c: i for i, c in enumerate(clients)})

    def init_client(self, client, data, rng):
        X, y = data
        n = X.shape[0]
        s = shrink_for(self.shrink_scale, X, y, client, self.local_steps, self.batch_size, self.grad_reduction)
        return _Device(n, X.T @ X, X.T @ y, s)

    def broadcast(self, server_state, client, round):
        k = server_state.index[client]
        return {"theta": server_state.theta[:, k].copy(), "aggregate": server_state.agg[:, k].copy()}

    def _scale(self, n: int) -> float:
        return 1.0 if self.grad_reduction == "sum" else float(n)

    def client_step(self, message, state, data, rng):
        X, y = data
        theta = local_steps(message["theta"], X, y, steps=self.local_steps, lr=self.lr, batch_size=self.batch_size,
                            reduction=self.grad_reduction, rng=rng)
        theta = theta - 2 * self.lr * state.shrink * message["aggregate"]
        if not np.all(np.isfinite(theta)):
            raise FloatingPointError(f"local gradient descent diverged (lr={self.lr:.3g})")
        return {"theta": theta}, state

    def client_steps(self, messages, states, datas, rngs):
        # Full-batch gradient descent needs only each device's X^T X and X^T y: one batched
        # product for all devices. Mini-batches draw rows and go one device at a time.
        if not all(full_batch(self.batch_size, s.n) for s in states):
            return super().client_steps(messages, states, datas, rngs)
        thetas = full_batch_steps(np.stack([m["theta"] for m in messages]), np.stack([s.XtX for s in states]),
                                  np.stack([s.Xty for s in states]), steps=self.local_steps, lr=self.lr,
                                  scale=[self._scale(s.n) for s in states])
        shrink = np.array([s.shrink for s in states])[:, None]
        thetas = thetas - 2 * self.lr * shrink * np.stack([m["aggregate"] for m in messages])
        return [({"theta": t}, s) if np.all(np.isfinite(t))
                else FloatingPointError(f"local gradient descent diverged (lr={self.lr:.3g})")
                for t, s in zip(thetas, states)]

    def server_step(self, server_state, replies, round):
        theta = server_state.theta.copy()
        for c, reply in replies.items():
            theta[:, server_state.index[c]] = reply["theta"]
        with np.errstate(over="ignore", invalid="ignore"):
            omega = omega_update(server_state.omega, theta, self.alpha)
        if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(omega))):
            raise FloatingPointError("the coefficients or Omega overflowed")
        omega = floor_eigenvalues(omega, self.eig_floor)
        change = float(np.linalg.norm(theta - server_state.theta))
        w = np.linalg.eigvalsh(omega)
        new = _Server(theta, omega, aggregates(theta, omega, self.jitter), server_state.index)
        if self.callback is not None:
            self.callback(round, theta.copy(), omega.copy())
        return new, {"theta_change": change, "omega_min_eig": float(w[0]),
                     "omega_cond": float(w[-1] / w[0]) if w[0] > 0 else float("inf")}

    def converged(self, server_state, metrics):
        return self.tol > 0 and metrics["theta_change"] < self.tol


def shrink_for(shrink_scale, X, y, client, steps: int, batch_size, reduction: str) -> float:
    """A device's ``s`` in the prior step: ``shrink_scale`` itself, or for ``"noise"``
    ``T sigma^2`` times the expected fraction of the full-data sum gradient one step takes."""
    if shrink_scale != "noise":
        return float(shrink_scale)
    n = X.shape[0]
    frac = 1.0 / n if reduction == "mean" else (1.0 if full_batch(batch_size, n) else batch_size / n)
    return steps * residual_variance(X, y, client, "use a numeric shrink_scale") * frac


def residual_variance(X, y, client=None, hint: str = "give noise_sd") -> float:
    """Unbiased residual variance of the device's least-squares fit (needs more rows than
    the rank of its design, and a residual that is not exactly 0)."""
    n = X.shape[0]
    rank = np.linalg.matrix_rank(X)
    if n <= rank:
        raise ValueError(f"client {client!r} has {n} rows for {rank} independent coefficients: its noise variance "
                         f"cannot be estimated; {hint}")
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    rss = float(np.sum((y - X @ beta) ** 2))
    if not rss > 1e-24 * float(np.sum(y**2)):  # an exact fit up to rounding
        raise ValueError(f"client {client!r}: least squares fits its data exactly, so its noise variance cannot be "
                         f"estimated; {hint}")
    return rss / (n - rank)


class _InformationShare(FederatedAlgorithm):
    """One round in which each device sends ``X^T X / sigma^2``, ``X^T y / sigma^2`` and its
    noise variance ``sigma^2`` (known, or its least-squares residual variance); opt-in, for
    the conditional posterior. The server only collects them."""

    reply_keys = ("information", "score", "noise_var")

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


# --------------------------------------------------------------------------- model


def _check_fraction(x, name, lo_open=True) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {x!r}") from None
    if not np.isfinite(v) or v < 0 or v > 1 or (lo_open and v == 0):
        raise ValueError(f"{name} must lie in {'(0' if lo_open else '[0'}, 1], got {x!r}")
    return v


class StructuralCovarianceModel:
    """HM1: per-device linear regressions that borrow strength through a learned K x K
    covariance between devices (Algorithm 1 of the linear-models paper).

    Parameters
    ----------
    rounds : int
        Communication rounds C (paper: 30; 100 for the recovery figure).
    local_steps : int
        Gradient steps T per device and round (paper: 20).
    lr : float or "auto"
        The shared step size eta_2. ``"auto"`` takes ``0.5 / max_k lambda_max`` of the
        devices' per-step loss curvature (each device shares that one scalar), which keeps
        local gradient descent stable; the paper grid-searches it.
    alpha : float in [0, 1]
        Damping of the Omega update (paper: 0.1; 0.9 for the turbofan study). ``0`` freezes
        Omega at ``omega_init``.
    batch_size : int or None
        Rows per local step; ``None`` (default) is full-batch gradient descent.
    grad_reduction : "sum" or "mean"
        Whether a step's gradient sums or averages over the batch (the paper does not say,
        spec §1.5 item 4; "sum" matches its derivation and code).
    shrink_scale : float or "noise"
        ``s`` in the prior step ``theta_k <- theta_k - 2 lr s g_k``. ``1`` is the paper's
        algorithm (its fixed point assumes noise variance 1/T); ``"noise"`` uses
        ``s_k = T sigma_k^2`` with each device's least-squares residual variance (computed on
        the device, never sent), which targets the model with its real noise.
    init : "normal" or "zeros"
        Initial Theta: i.i.d. N(0, 1) entries drawn from the seed (paper) or zeros (its code).
    omega_init : array (K, K) or None
        Initial Omega (default the identity).
    fit_intercept : bool
        Prepend a column of ones (its coefficient is shrunk like the others). Default False:
        the paper's designs carry their own constant column.
    participation : float, int, callable or schedule
        Who takes part in a round (see :func:`fedstats.federation.run`); default everyone.
        The paper's recommendation for partial participation is a fraction drawn uniformly
        without replacement.
    jitter : float
        Relative jitter of the Cholesky solve with Omega (spec §1.5 item 3).
    eig_floor : float
        If positive, Omega's eigenvalues are raised to at least ``eig_floor * mean(diag)``
        after every update (off by default, as in the paper).
    tol : float
        Stop early once ``||Theta_new - Theta||_F < tol`` (0: run all rounds).

    Examples
    --------
    >>> import numpy as np
    >>> from fedstats.data import FederatedData
    >>> from fedstats.linear import StructuralCovarianceModel
    >>> rng = np.random.default_rng(0)
    >>> Xs = [rng.standard_normal((30, 3)) for _ in range(4)]
    >>> ys = [X @ np.ones(3) + 0.1 * rng.standard_normal(30) for X in Xs]
    >>> res = StructuralCovarianceModel(rounds=20).fit(FederatedData.from_arrays(Xs, ys))
    >>> res.omega.shape, bool(np.allclose(res.coef(0), 1, atol=0.1))
    ((4, 4), True)
    """

    def __init__(self, *, rounds: int = 30, local_steps: int = 20, lr="auto", alpha: float = 0.1,
                 batch_size=None, grad_reduction: str = "sum", shrink_scale=1.0, init: str = "normal",
                 omega_init=None, fit_intercept: bool = False, participation=1.0, jitter: float = 1e-8,
                 eig_floor: float = 0.0, tol: float = 0.0):
        self.rounds, self.local_steps, self.lr, self.alpha = rounds, local_steps, lr, alpha
        self.batch_size, self.grad_reduction, self.shrink_scale = batch_size, grad_reduction, shrink_scale
        self.init, self.omega_init, self.fit_intercept = init, omega_init, fit_intercept
        self.participation, self.jitter, self.eig_floor, self.tol = participation, jitter, eig_floor, tol

    def __repr__(self):
        return (f"StructuralCovarianceModel(rounds={self.rounds}, local_steps={self.local_steps}, lr={self.lr!r}, "
                f"alpha={self.alpha}, batch_size={self.batch_size}, grad_reduction={self.grad_reduction!r}, "
                f"shrink_scale={self.shrink_scale!r})")

    def _validated(self, K: int) -> dict:
        check_positive_int(self.rounds, "rounds")
        check_positive_int(self.local_steps, "local_steps")
        check_positive_int(self.batch_size, "batch_size", allow_none=True)
        check_reduction(self.grad_reduction)
        alpha = _check_fraction(self.alpha, "alpha", lo_open=False)
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if not (isinstance(self.shrink_scale, str) and self.shrink_scale == "noise") and not (
                isinstance(self.shrink_scale, (int, float, np.number)) and not isinstance(self.shrink_scale, bool)
                and np.isfinite(self.shrink_scale) and self.shrink_scale >= 0):
            raise ValueError(f"shrink_scale must be a non-negative number or 'noise', got {self.shrink_scale!r}")
        for name in ("jitter", "eig_floor", "tol"):
            v = getattr(self, name)
            if not (np.isscalar(v) and np.isfinite(float(v)) and float(v) >= 0):
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")
        omega = None
        if self.omega_init is not None:
            omega = np.asarray(self.omega_init, dtype=float)
            if omega.shape != (K, K) or not np.all(np.isfinite(omega)):
                raise ValueError(f"omega_init must be a finite {K} x {K} matrix (one row per client), "
                                 f"got shape {omega.shape}")
            if not np.allclose(omega, omega.T) or np.linalg.eigvalsh((omega + omega.T) / 2)[0] <= 0:
                raise ValueError("omega_init must be symmetric positive definite")
        return {"alpha": alpha, "omega": omega}

    def _prepare(self, data):
        """Validated options and the device view: ``(clients, options, devices, names)``."""
        clients = list(data.clients)
        if len(clients) < 2:
            raise ValueError("HM1 learns a covariance between clients: it needs at least 2 clients")
        opts = self._validated(len(clients))
        return clients, opts, DeviceDesign(data, self.fit_intercept), coefficient_names(data, self.fit_intercept)

    @accepts_backend
    def fit(self, data, *, seed: int = 0, progress: bool | None = None, uncertainty: bool = False,
            noise_sd=None, checkpoint=None, resume: bool = False, batched: bool = True,
            theta_init=None, callback=None) -> StructuralResult:
        """Fit Algorithm 1 on ``data`` (a :class:`~fedstats.data.FederatedData`, K >= 2).

        ``uncertainty=True`` then runs one more exchange in which every device shares its
        information matrix (see the module docs) and returns Gaussian conditional
        posteriors of every ``theta_k`` given the fitted Omega; ``noise_sd`` (a float, or a
        dict client -> float) gives known noise sds, else each device uses its
        least-squares residual variance (which needs more rows than coefficients).
        ``theta_init`` (d x K) overrides ``init``. ``callback(round, Theta, Omega)`` is called
        on the server after every round (copies; e.g. to trace parameter recovery).
        """
        require_target(data, "StructuralCovarianceModel")
        clients, opts, devices, names = self._prepare(data)
        K, d = len(clients), len(names)
        if theta_init is not None:
            theta_init = np.asarray(theta_init, dtype=float)
            if theta_init.shape != (d, K) or not np.all(np.isfinite(theta_init)):
                raise ValueError(f"theta_init must be a finite {d} x {K} matrix, got shape {theta_init.shape}")
        lr = federated_lr(self.lr, devices, self.batch_size, self.grad_reduction, seed=seed)
        alg = HM1Algorithm(d, local_steps=int(self.local_steps), lr=lr, alpha=opts["alpha"], batch_size=self.batch_size,
                           grad_reduction=self.grad_reduction, shrink_scale=self.shrink_scale, init=self.init,
                           omega_init=opts["omega"], theta_init=theta_init, jitter=float(self.jitter),
                           eig_floor=float(self.eig_floor), tol=float(self.tol), callback=callback)
        t0 = time.perf_counter()
        try:
            out = run(alg, devices, rounds=int(self.rounds), participation=self.participation, seed=seed,
                      progress=progress, checkpoint=checkpoint, resume=resume, batched=batched)
        except (FloatingPointError, np.linalg.LinAlgError) as exc:
            raise FloatingPointError(f"HM1 diverged ({exc}) with lr={lr:.3g}: lower lr") from exc
        failed = {c: why for rec in out.history for c, why in rec.failed.items()}
        diverged = [c for c, why in failed.items() if why.startswith("FloatingPointError")]
        if diverged:
            raise FloatingPointError(f"HM1 diverged on {len(diverged)} client(s) (e.g. {diverged[0]!r}) with "
                                     f"lr={lr:.3g}: lower lr")
        if failed:
            c, why = next(iter(failed.items()))
            warnings.warn(f"{len(failed)} client(s) failed in some round and kept their previous coefficients; "
                          f"e.g. {c!r}: {why}", RuntimeWarning, stacklevel=2)
        res = StructuralResult(
            feature_names=names, clients=clients, theta=out.server_state.theta, omega_=out.server_state.omega,
            lr=lr, options=self._options(), history=out.history, communication=out.communication,
            converged=out.converged, seconds=time.perf_counter() - t0, seed=seed,
        )
        if uncertainty:
            res._add_posteriors(devices, noise_sd, seed=seed, jitter=float(self.jitter))
        return res

    def fit_centralised(self, data, *, seed: int = 0, theta_init=None) -> StructuralResult:
        """The same iteration on pooled data in one process, without the federated runtime:
        every device's ``X^T X`` and ``X^T y`` stacked, all columns of Theta updated at once.
        The reference that the federated fit must equal (full-batch steps, everyone taking
        part) and the baseline of ``benchmarks/hm1.py``."""
        from ..federation.runner import _INIT_TAG

        if self.batch_size is not None or self.participation != 1.0:
            raise ValueError("fit_centralised runs full-batch steps with every device taking part")
        clients, opts, devices, names = self._prepare(data)
        K = len(clients)
        t0 = time.perf_counter()
        Xs = [devices[c] for c in clients]
        lr = resolve_lr(self.lr, [X for X, _ in Xs], self.batch_size, self.grad_reduction)
        XtX = np.stack([X.T @ X for X, _ in Xs])
        Xty = np.stack([X.T @ y for X, y in Xs])
        n = np.array([len(y) for _, y in Xs], dtype=float)
        scale = np.ones(K) if self.grad_reduction == "sum" else n
        shrink = np.array([shrink_for(self.shrink_scale, X, y, c, self.local_steps, None, self.grad_reduction)
                           for (X, y), c in zip(Xs, clients)])
        theta = (np.array(theta_init, dtype=float) if theta_init is not None
                 else initial_theta(self.init, len(names), K, np.random.default_rng([seed, _INIT_TAG])))
        omega = np.eye(K) if opts["omega"] is None else opts["omega"]
        for _ in range(int(self.rounds)):
            g = aggregates(theta, omega, self.jitter)
            new = full_batch_steps(np.ascontiguousarray(theta.T), XtX, Xty, steps=int(self.local_steps), lr=lr,
                                   scale=scale).T
            new = new - 2 * lr * shrink[None, :] * g
            if not np.all(np.isfinite(new)):
                raise FloatingPointError(f"HM1 diverged with lr={lr:.3g}: lower lr")
            change = float(np.linalg.norm(new - theta))
            theta = new
            omega = floor_eigenvalues(omega_update(omega, theta, opts["alpha"]), self.eig_floor)
            if self.tol > 0 and change < self.tol:
                break
        return StructuralResult(feature_names=names, clients=clients, theta=theta, omega_=omega, lr=lr,
                                options=self._options(), seconds=time.perf_counter() - t0, seed=seed)

    def _options(self) -> dict:
        return {k: getattr(self, k) for k in ("rounds", "local_steps", "lr", "alpha", "batch_size", "grad_reduction",
                                              "shrink_scale", "init", "fit_intercept", "participation", "jitter",
                                              "eig_floor", "tol")}


def _noise_vars(noise_sd, clients) -> dict | None:
    if noise_sd is None:
        return None
    if isinstance(noise_sd, Mapping):
        unknown = [c for c in noise_sd if c not in clients]
        if unknown:
            raise ValueError(f"noise_sd names unknown client(s): {unknown[:5]}")
        vals = dict(noise_sd)
    else:
        vals = {c: noise_sd for c in clients}
    out = {}
    for c, v in vals.items():
        v = float(v)
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"noise_sd of client {c!r} must be positive, got {v!r}")
        out[c] = v**2
    return out


def conditional_posterior(omega, information, score, jitter: float = 1e-8):
    """Mean (K, d) and per-device covariance (K, d, d) of ``vec(Theta)`` given Omega:
    precision ``blockdiag(information_k) + Omega^{-1} kron I_d``, linear term ``score_k``."""
    K, d = score.shape
    omega_inv = solve_omega(omega, np.eye(K), jitter)
    P = np.kron((omega_inv + omega_inv.T) / 2, np.eye(d))
    for k in range(K):
        P[k * d:(k + 1) * d, k * d:(k + 1) * d] += information[k]
    L, _ = jittered_cholesky(P, 1e-12)
    cov = sla.cho_solve((L, True), np.eye(K * d))
    mean = cov @ score.reshape(-1)
    blocks = np.stack([cov[k * d:(k + 1) * d, k * d:(k + 1) * d] for k in range(K)])
    return mean.reshape(K, d), (blocks + np.swapaxes(blocks, 1, 2)) / 2


# --------------------------------------------------------------------------- result


@dataclass
class StructuralResult(PointResult):
    """An HM1 fit: per-device coefficients (``coef``, ``coefficients``), the learned
    device covariance (``omega``, ``correlation``), predictions, and, after
    ``fit(..., uncertainty=True)``, Gaussian conditional posteriors of each device's
    coefficients (``client_posterior``) with credible and predictive intervals."""

    omega_: np.ndarray | None = None
    lr: float = 0.0
    posterior_mean: np.ndarray | None = None
    posterior_cov: np.ndarray | None = None
    noise_var: np.ndarray | None = None
    extra_communication: dict = field(default_factory=dict)

    @property
    def omega(self) -> pd.DataFrame:
        """The learned K x K covariance between devices, labelled by client."""
        return pd.DataFrame(self.omega_, index=self.clients, columns=self.clients)

    @property
    def correlation(self) -> pd.DataFrame:
        """Omega scaled to a correlation matrix."""
        s = np.sqrt(np.clip(np.diag(self.omega_), 1e-300, None))
        return pd.DataFrame(self.omega_ / np.outer(s, s), index=self.clients, columns=self.clients)

    # ------------------------------------------------------------ uncertainty
    def _add_posteriors(self, devices, noise_sd, *, seed: int, jitter: float) -> None:
        alg = _InformationShare(_noise_vars(noise_sd, self.clients))
        out = run(alg, devices, rounds=1, seed=seed, progress=False)
        replies = out.server_state
        missing = [c for c in self.clients if c not in replies]
        if missing:
            why = out.history[0].failed
            c = missing[0]
            raise ValueError(f"client {c!r} could not share its information matrix: {why.get(c, 'no reply')}")
        info = np.stack([replies[c]["information"] for c in self.clients])
        score = np.stack([replies[c]["score"] for c in self.clients])
        self.noise_var = np.array([float(replies[c]["noise_var"]) for c in self.clients])
        self.posterior_mean, self.posterior_cov = conditional_posterior(self.omega_, info, score, jitter)
        d = len(self.feature_names)
        self.extra_communication = {"bytes_up": int(out.communication.bytes_up),
                                    "bytes_down": int(8 * (d + d * d) * len(self.clients))}

    @property
    def has_uncertainty(self) -> bool:
        return self.posterior_mean is not None

    def client_posterior(self, client) -> GaussianPosterior:
        """Gaussian posterior of device ``client``'s coefficients given the fitted Omega and
        the devices' noise variances (needs ``fit(..., uncertainty=True)``). Its mean is
        the exact conditional posterior mean, which Algorithm 1's estimate approaches as
        ``lr -> 0`` with ``shrink_scale="noise"`` (spec A2)."""
        k = self._k(client)
        if not self.has_uncertainty:
            raise RuntimeError("no posterior: fit with uncertainty=True (each device then shares its "
                               "information matrix once)")
        return GaussianPosterior(self.posterior_mean[k], self.posterior_cov[k], names=self.feature_names)

    def summary(self, level: float = 0.95) -> pd.DataFrame:
        """Long table of every device's coefficients: client, name, estimate (Algorithm 1)
        and, with uncertainty, the posterior mean, sd, credible interval and p_value."""
        rows = []
        for c in self.clients:
            df = pd.DataFrame({"client": c, "name": self.feature_names, "estimate": self.coef(c)})
            if self.has_uncertainty:
                s = self.client_posterior(c).summary(level=level)
                for col in ("mean", "sd", "lower", "upper", "p_value"):
                    df[col] = s[col].to_numpy()
            rows.append(df)
        return pd.concat(rows, ignore_index=True)

    # ------------------------------------------------------------ prediction
    def predict(self, X, client, *, level: float | None = None) -> pd.DataFrame:
        """Predictions of device ``client`` for the rows of ``X``: column ``mean``
        (Algorithm 1's point prediction). With uncertainty and a ``level``, also ``lower``,
        ``upper`` (credible interval of the mean response under the conditional
        posterior, centred at its mean ``posterior_mean``) and ``pred_lower``,
        ``pred_upper`` (noise included)."""
        Xd = self._design(X)
        k = self._k(client)
        out = pd.DataFrame({"mean": Xd @ self.theta[:, k]})
        if level is None:
            return out
        if not self.has_uncertainty:
            raise RuntimeError("intervals need fit(..., uncertainty=True)")
        if not 0 < level < 1:
            raise ValueError(f"level must lie in (0, 1), got {level!r}")
        m = Xd @ self.posterior_mean[k]
        v = np.einsum("ij,jk,ik->i", Xd, self.posterior_cov[k], Xd)
        z = sst.norm.ppf(0.5 + level / 2)
        sd, psd = np.sqrt(v), np.sqrt(v + self.noise_var[k])
        out["posterior_mean"] = m
        out["lower"], out["upper"] = m - z * sd, m + z * sd
        out["pred_lower"], out["pred_upper"] = m - z * psd, m + z * psd
        return out
