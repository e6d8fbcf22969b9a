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

What the iteration optimises: with Omega frozen and full-batch gradients it
converges to the solution of ``(I - M_k)(theta_k - theta_k^OLS) + 2 lr s_k (Theta
Omega^{-1})[:, k] = 0`` with ``M_k = (I - 2 lr X_k^T X_k)`` to the power T; as ``lr -> 0`` that is
the MAP with noise variance ``s_k / T`` on device k. ``shrink_scale=1`` (the paper's
algorithm) therefore assumes noise variance 1/T; ``shrink_scale="noise"`` uses
``s_k = T * sigma_k^2`` with each device's own residual variance, which targets the model
with its real noise. The joint MAP of (Theta, Omega) is degenerate, so the result depends on
alpha, the rounds, the learning rate and the initialisation: the damped update is a
heuristic, and the history records how well-conditioned Omega stays.

Convergence: a round has converged when the relative changes of Theta and of Omega in it,
``||Theta_new - Theta||_F / max(||Theta_new||_F, ||Theta||_F)`` and the same for Omega, are
both below ``tol``; ``StructuralResult.converged`` says whether the last round did, and a fit
that did not converge warns (by default all ``rounds`` run, as in the paper;
``stop_early=True`` stops at the first converged round). When K > d and ``eig_floor = 0`` the iteration has no fixed point
(Omega drifts towards the singular ``Theta^T Theta / d``, and after enough rounds Theta
oscillates), so such fits do not converge; an eigenvalue floor (``eig_floor`` 0.01 to 0.1)
makes them converge in the tests' simulations.

Uncertainty (not in the paper, opt-in): each device sends the server, once, its information
matrix ``X_k^T X_k / sigma_k^2`` (d x d) and ``X_k^T y_k / sigma_k^2`` (d), the sufficient
statistics of its data (more than Algorithm 1 shares: only theta_k), with ``sigma_k^2`` known
or its least-squares residual variance. Given an Omega, ``vec(Theta)`` then has the Gaussian
posterior with precision ``blockdiag_k(X_k^T X_k / sigma_k^2) + Omega^{-1} kron I_d``; the
server returns each device the mean and covariance of its own block.

Which Omega (``posterior_omega``). Algorithm 1's learned Omega is a poor plug-in: it is
``(1 - alpha)^C I`` plus a weighted average of ``Theta^T Theta / d``, which has rank <= d, so
when K > d it has K - d eigenvalues of about ``(1 - alpha)^C`` (0.042 after 30 rounds at
alpha = 0.1, against true eigenvalues of 1 to 10 in the README's simulation): the prior then
pins Theta to a d-dimensional subspace and the intervals are too narrow (90% intervals
covered 0.80 of the true coefficients at K = 10, d = 5; 0.68 at K = 20, d = 3). Even when
K <= d, ``Theta^T Theta / d`` of the shrunken point estimates ignores their uncertainty. The
default, ``posterior_omega="em"``, re-estimates Omega on the server from the shared
statistics (no further communication) by EM: the E-step is the posterior above, the M-step

    Omega <- (S + nu T) / (d + nu),   S = E[Theta^T Theta | y, Omega],
    T = tau^2 ((1 - rho) I + rho 1 1^T)   (tau^2, rho tau^2: mean diagonal, mean off-diagonal of S / d),

that is, ``nu`` pseudo-rows of coefficients drawn from ``N(0, T)`` are added to the d rows of
Theta: the conditional posterior mean of Omega under an inverse-Wishart prior with
``K + 1 + nu`` degrees of freedom and mean T. T is the covariance of the exchangeable model
(every client's coefficient a common value plus its own deviation, as in HM2) with the
average variance and correlation of the current estimate, so the shrinkage keeps a common
component shared by similar clients. ``S`` includes the posterior covariance, so the estimate
is positive definite whatever K and d; ``nu = omega_prior_rows`` defaults to K, which puts the
weight ``K / (K + d)`` on T (much when Omega is poorly determined, K >> d; little when
d >> K). The reported posteriors condition on this estimate (``StructuralResult.posterior_omega``)
and on the noise variances: the uncertainty of Omega and of estimated noise variances is not
propagated (with few residual degrees of freedom per device the intervals are then somewhat
narrow). They do not depend on Algorithm 1's tuning or convergence; Algorithm 1's estimate
(``coef``, column ``estimate``) is a different point and is reported beside the posterior,
never as its centre. ``posterior_omega="learned"`` conditions on Algorithm 1's Omega (the
behaviour before this option existed).

Size: one module for now (about 860 lines): Algorithm 1, the EM Omega for the intervals and the
result; splitting algorithm, uncertainty and result is part of issue 20.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import linalg as sla
from scipy import stats as sst

from ..data import require_target
from ..estimator import BOOL, NONE, Estimator, Int, OneOf, Real
from ..federation import Communication, FederatedAlgorithm, run
from ..federation.backend import accepts_backend
from ..federation.runner import record
from ..inference.posterior import GaussianPosterior
from ..results import NoPosteriorError, check_level, counted, prediction_frame, register
from ._local import (
    INITS,
    LR,
    REDUCTIONS,
    DeviceDesign,
    PointResult,
    coefficient_names,
    federated_lr,
    full_batch,
    full_batch_steps,
    initial_theta,
    local_steps,
    resolve_lr,
)

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
                 eig_floor: float = 0.0, tol: float = 1e-4, callback=None):
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
        theta_rel, omega_rel = relative_change(theta, server_state.theta), relative_change(omega, server_state.omega)
        w = np.linalg.eigvalsh(omega)
        new = _Server(theta, omega, aggregates(theta, omega, self.jitter), server_state.index)
        if self.callback is not None:
            self.callback(round, theta.copy(), omega.copy())
        return new, {"theta_rel_change": theta_rel, "omega_rel_change": omega_rel, "theta_change": change,
                     "omega_min_eig": float(w[0]), "omega_cond": float(w[-1] / w[0]) if w[0] > 0 else float("inf")}

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
    return bool(tol > 0 and metrics.get("theta_rel_change", np.inf) < tol
                and metrics.get("omega_rel_change", np.inf) < tol)


def shrink_for(shrink_scale, X, y, client, steps: int, batch_size, reduction: str) -> float:
    """A device's ``s`` in the prior step: ``shrink_scale`` itself, or for ``"noise"``
    ``T sigma^2`` times the expected fraction of the full-data sum gradient one step takes."""
    if shrink_scale != "noise":
        return float(shrink_scale)
    n = X.shape[0]
    frac = 1.0 / n if reduction == "mean" else (1.0 if full_batch(batch_size, n) else batch_size / n)
    return steps * residual_variance(X, y, client, "use a numeric shrink_scale") * frac


class CannotShareError(ValueError):
    """A device could not share its information matrix or estimate its noise variance (``fit`` with ``uncertainty="auto"``
    then keeps Algorithm 1's point and warns)."""


def residual_variance(X, y, client=None, hint: str = "give noise_sd") -> float:
    """Unbiased residual variance of the device's least-squares fit (needs more rows than
    the rank of its design, and a residual that is not exactly 0)."""
    n = X.shape[0]
    rank = np.linalg.matrix_rank(X)
    if n <= rank:
        raise CannotShareError(f"client {client!r} has {n} rows for {rank} independent coefficients: its noise variance "
                         f"cannot be estimated; {hint}")
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    rss = float(np.sum((y - X @ beta) ** 2))
    if not rss > 1e-24 * float(np.sum(y**2)):  # an exact fit up to rounding
        raise CannotShareError(f"client {client!r}: least squares fits its data exactly, so its noise variance cannot be "
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

POSTERIOR_OMEGAS = ("em", "learned")


class StructuralCovarianceModel(Estimator):
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
        Whether a step's gradient sums or averages over the batch (the paper does not say;
        "sum" matches its derivation and code; a full-batch sum step diverges once
        ``2 lr`` times the largest eigenvalue of ``X_k^T X_k`` exceeds 2).
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
        Relative jitter of the Cholesky solve with Omega (never inverted explicitly: its identity
        part decays geometrically over the rounds).
    eig_floor : float
        If positive, Omega's eigenvalues are raised to at least ``eig_floor * mean(diag)``
        after every update (off by default, as in the paper).
    tol : float
        Convergence tolerance (default 1e-4): a round has converged when the relative changes
        of Theta and of Omega in it (Frobenius norms, ``||new - old|| / max(||new||, ||old||)``)
        are both below ``tol``. ``StructuralResult.converged`` says whether the last round did; a fit
        that did not converge warns, naming the rounds and the last changes (``tol=0``: never
        converged, no warning). A small change in one round is not a proof that the fixed
        point is near when gradient descent is slow (ill-conditioned designs, tiny ``lr``).
    stop_early : bool
        Stop at the first converged round (default False: run all ``rounds``, as the paper).
    posterior_omega : "em" or "learned"
        The Omega that ``fit(..., uncertainty=True)`` conditions on (module docs). ``"em"``
        (default): re-estimated on the server from the shared information matrices by EM
        with ``omega_prior_rows`` pseudo-rows, positive definite for any K and d; calibrated
        in simulations (90% intervals: coverage 0.88-0.90, K = 4 to 50, d = 3 to 30).
        ``"learned"``: Algorithm 1's Omega, which is close to singular when K > d and then
        gives too narrow intervals (coverage 0.80 at K = 10, d = 5; 0.68 at K = 20, d = 3).
    omega_prior_rows : float or None
        ``nu`` of the EM estimate: pseudo-rows of coefficients from ``N(0, T)`` added to the
        d rows of Theta, T the exchangeable covariance with Omega's average variance and
        correlation (an inverse-Wishart prior with K + 1 + nu degrees of freedom and mean T).
        ``None`` (default): K. ``0`` is the maximum-likelihood EM, singular when K > d.

    Examples
    --------
    >>> import numpy as np
    >>> from fedstats.data import FederatedData
    >>> from fedstats.linear import StructuralCovarianceModel
    >>> rng = np.random.default_rng(0)
    >>> Xs = [rng.standard_normal((30, 3)) for _ in range(4)]
    >>> ys = [X @ np.ones(3) + 0.1 * rng.standard_normal(30) for X in Xs]
    >>> res = StructuralCovarianceModel(rounds=100, eig_floor=0.1).fit(FederatedData.from_arrays(Xs, ys))
    >>> res.omega.shape, res.converged, bool(np.allclose(res.coef(0), 1, atol=0.1))
    ((4, 4), True, True)
    """

    def __init__(self, *, rounds: int = 30, local_steps: int = 20, lr="auto", alpha: float = 0.1,
                 batch_size=None, grad_reduction: str = "sum", shrink_scale=1.0, init: str = "normal",
                 omega_init=None, fit_intercept: bool = False, participation=1.0, jitter: float = 1e-8,
                 eig_floor: float = 0.0, tol: float = 1e-4, stop_early: bool = False, posterior_omega: str = "em",
                 omega_prior_rows=None):
        self.rounds, self.local_steps, self.lr, self.alpha = rounds, local_steps, lr, alpha
        self.batch_size, self.grad_reduction, self.shrink_scale = batch_size, grad_reduction, shrink_scale
        self.init, self.omega_init, self.fit_intercept = init, omega_init, fit_intercept
        self.participation, self.jitter, self.eig_floor, self.tol = participation, jitter, eig_floor, tol
        self.stop_early, self.posterior_omega, self.omega_prior_rows = stop_early, posterior_omega, omega_prior_rows


    _constraints = {"rounds": Int(1), "local_steps": Int(1), "lr": LR, "alpha": Real(0, 1),
                    "batch_size": NONE | Int(1), "grad_reduction": OneOf(*REDUCTIONS), "shrink_scale": OneOf("noise") | Real(0),
                    "init": OneOf(*INITS), "fit_intercept": BOOL, "jitter": Real(0), "eig_floor": Real(0), "tol": Real(0),
                    "stop_early": BOOL, "posterior_omega": OneOf(*POSTERIOR_OMEGAS), "omega_prior_rows": NONE | Real(0)}

    def _validated(self, K: int) -> dict:
        """The declarative checks, then those that need the number of clients K."""
        self._validate_params()
        omega = None
        if self.omega_init is not None:
            omega = np.asarray(self.omega_init, dtype=float)
            if omega.shape != (K, K) or not np.all(np.isfinite(omega)):
                raise ValueError(f"omega_init must be a finite {K} x {K} matrix (one row per client), "
                                 f"got shape {omega.shape}")
            if not np.allclose(omega, omega.T) or np.linalg.eigvalsh((omega + omega.T) / 2)[0] <= 0:
                raise ValueError("omega_init must be symmetric positive definite")
        return {"alpha": float(self.alpha), "omega": omega}

    def _prepare(self, data):
        """Validated options and the device view: ``(clients, options, devices, names)``."""
        clients = list(data.clients)
        if len(clients) < 2:
            raise ValueError("HM1 learns a covariance between clients: it needs at least 2 clients")
        opts = self._validated(len(clients))
        return clients, opts, DeviceDesign(data, self.fit_intercept), coefficient_names(data, self.fit_intercept)

    @counted
    @accepts_backend
    def fit(self, data, *, seed: int = 0, progress: bool | None = None, uncertainty: bool | str = "auto",
            noise_sd=None, checkpoint=None, resume: bool = False, batched: bool = True,
            theta_init=None, callback=None) -> StructuralResult:
        """Fit Algorithm 1 on ``data`` (a :class:`~fedstats.data.FederatedData`, K >= 2).

        With uncertainty one more exchange follows, in which every device shares its
        information matrix (see the module docs), and the result holds Gaussian posteriors
        of every ``theta_k`` given an estimate of Omega (``posterior_omega``: by default the
        EM estimate from those matrices, not Algorithm 1's Omega); their mean is the
        reported estimate (``mean`` of ``client_summary`` and ``predict``; Algorithm 1's point
        stays beside it as ``estimate``, ``coef``, ``theta``, and is what ``rmse`` scores).
        ``noise_sd`` (a float, or a dict client -> float) gives known noise sds, else each
        device uses its least-squares residual variance (which needs more rows than
        coefficients). ``uncertainty="auto"`` (default): posteriors whenever every device
        can share (a warning otherwise, and the result then holds Algorithm 1's point only);
        ``True``: posteriors or an error; ``False``: Algorithm 1 only. Why the posterior mean
        is the default estimate: on data-poor devices it is the better point (README,
        ``benchmarks/results/hm1_defaults.md``). The
        result's ``converged`` says whether Algorithm 1's last round changed Theta and Omega
        by less than ``tol`` (relative); if not, a :class:`RuntimeWarning` says so.
        ``theta_init`` (d x K) overrides ``init``. ``callback(round, Theta, Omega)`` is called
        on the server after every round (copies; e.g. to trace parameter recovery).
        """
        require_target(data, "StructuralCovarianceModel")
        if not (uncertainty is True or uncertainty is False or uncertainty == "auto"):
            raise ValueError(f"StructuralCovarianceModel.fit: uncertainty must be True, False or 'auto', got "
                             f"{uncertainty!r}")
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
            # converged() judges every round; without stop_early the run may stop only at the last
            out = run(alg, devices, kind="HM1 rounds", rounds=int(self.rounds), participation=self.participation, seed=seed,
                      progress=progress, checkpoint=checkpoint, resume=resume, batched=batched,
                      min_rounds=1 if self.stop_early else int(self.rounds))
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
        last = out.history[-1].metrics if len(out.history) else {}
        res = StructuralResult(
            feature_names=names, clients=clients, theta=out.server_state.theta, omega_=out.server_state.omega,
            lr=lr, options=self._options(), history=out.history, communication=out.communication,
            converged=round_converged(last, float(self.tol)), seconds=time.perf_counter() - t0, seed=seed,
            model="StructuralCovarianceModel",
        )
        self._warn_unconverged(res.rounds, res.converged, last, K, d, stacklevel=4)
        if uncertainty:
            try:
                res._add_posteriors(devices, noise_sd, seed=seed, jitter=float(self.jitter), how=self.posterior_omega,
                                    prior_rows=self.omega_prior_rows)
            except CannotShareError as exc:
                if uncertainty is True:
                    raise
                warnings.warn(f"HM1 reports Algorithm 1's point estimates only, without posteriors: {exc}",
                              RuntimeWarning, stacklevel=3)
        return res

    def _warn_unconverged(self, rounds: int, converged: bool, metrics: Mapping, K: int, d: int, *,
                          stacklevel: int) -> None:
        if converged or not float(self.tol) > 0:
            return
        th, om = metrics.get("theta_rel_change", np.nan), metrics.get("omega_rel_change", np.nan)
        hint = ("with more clients than coefficients (K = %d > d = %d) Omega drifts towards the singular "
                "Theta'Theta/d and the iteration has no fixed point: set eig_floor (e.g. 0.1)" % (K, d)
                if K > d and float(self.eig_floor) == 0 and float(self.alpha) > 0 else
                "run more rounds, or lower lr or raise eig_floor if the changes do not shrink (history metrics "
                "theta_rel_change, omega_rel_change)")
        warnings.warn(f"HM1 did not converge in {rounds} rounds: in the last round Theta changed by {th:.2g} "
                      f"and Omega by {om:.2g} (relative; tol={float(self.tol):g}), so Algorithm 1's estimates are "
                      f"not at a fixed point; {hint}", RuntimeWarning, stacklevel=stacklevel)

    def fit_centralised(self, data, *, seed: int = 0, theta_init=None) -> StructuralResult:
        """The same iteration on pooled data in one process, without the federated runtime:
        every device's ``X^T X`` and ``X^T y`` stacked, all columns of Theta updated at once.
        The reference that the federated fit must equal (full-batch steps, everyone taking
        part) and the baseline of ``benchmarks/hm1.py``. ``converged``, ``tol`` and
        ``stop_early`` work as in :meth:`fit` (no history is kept)."""
        from .. import streams

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
                 else initial_theta(self.init, len(names), K, streams.stream(seed, streams.INIT)))
        omega = np.eye(K) if opts["omega"] is None else opts["omega"]
        metrics, done = {}, 0
        for _ in range(int(self.rounds)):
            g = aggregates(theta, omega, self.jitter)
            new = full_batch_steps(np.ascontiguousarray(theta.T), XtX, Xty, steps=int(self.local_steps), lr=lr,
                                   scale=scale).T
            new = new - 2 * lr * shrink[None, :] * g
            if not np.all(np.isfinite(new)):
                raise FloatingPointError(f"HM1 diverged with lr={lr:.3g}: lower lr")
            new_omega = floor_eigenvalues(omega_update(omega, new, opts["alpha"]), self.eig_floor)
            metrics = {"theta_rel_change": relative_change(new, theta), "omega_rel_change": relative_change(new_omega,
                                                                                                            omega)}
            theta, omega, done = new, new_omega, done + 1
            if self.stop_early and round_converged(metrics, float(self.tol)):
                break
        res = StructuralResult(feature_names=names, clients=clients, theta=theta, omega_=omega, lr=lr,
                               options=self._options(), converged=round_converged(metrics, float(self.tol)),
                               seconds=time.perf_counter() - t0, seed=seed, model="StructuralCovarianceModel")
        self._warn_unconverged(done, res.converged, metrics, K, len(names), stacklevel=3)
        return res

    def _options(self) -> dict:
        return {k: getattr(self, k) for k in ("rounds", "local_steps", "lr", "alpha", "batch_size", "grad_reduction",
                                              "shrink_scale", "init", "fit_intercept", "participation", "jitter",
                                              "eig_floor", "tol", "stop_early", "posterior_omega",
                                              "omega_prior_rows")}


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


def _joint_posterior(omega, information, score, jitter: float = 1e-8):
    """Mean (K, d) and the full covariance (K d, K d), client-major, of ``vec(Theta)`` given
    Omega: precision ``blockdiag(information_k) + Omega^{-1} kron I_d``, linear term ``score``."""
    K, d = score.shape
    omega_inv = solve_omega(omega, np.eye(K), jitter)
    P = np.kron((omega_inv + omega_inv.T) / 2, np.eye(d))
    for k in range(K):
        P[k * d:(k + 1) * d, k * d:(k + 1) * d] += information[k]
    L, _ = jittered_cholesky(P, 1e-12)
    cov = sla.cho_solve((L, True), np.eye(K * d))
    return (cov @ score.reshape(-1)).reshape(K, d), cov


def conditional_posterior(omega, information, score, jitter: float = 1e-8):
    """Mean (K, d) and per-device covariance (K, d, d) of ``vec(Theta)`` given Omega:
    precision ``blockdiag(information_k) + Omega^{-1} kron I_d``, linear term ``score_k``."""
    K, d = score.shape
    mean, cov = _joint_posterior(omega, information, score, jitter)
    blocks = np.stack([cov[k * d:(k + 1) * d, k * d:(k + 1) * d] for k in range(K)])
    return mean, (blocks + np.swapaxes(blocks, 1, 2)) / 2


def em_omega(information, score, *, prior_rows: float, start=None, tol: float = 1e-6, max_iter: int = 500,
             jitter: float = 1e-8) -> tuple[np.ndarray, dict]:
    """Omega estimated from the devices' information by EM with ``prior_rows`` (nu)
    pseudo-rows of coefficients from ``N(0, T)`` (see the module docs):

        Omega <- (S + nu T) / (d + nu),   S = E[Theta^T Theta | y, Omega],

    where ``S = M^T M + sum_j Cov(row j of Theta)`` under the conditional posterior given the
    current Omega (M the posterior mean) and ``T = tau^2 ((1 - rho) I + rho 1 1^T)`` is the
    exchangeable covariance with the mean variance and mean covariance of ``S / d``
    (:func:`exchangeable_target`). Iterates from ``start`` (default ``tau0^2 I`` from least
    squares) until the relative change (Frobenius) is below ``tol``. Returns ``(Omega,
    info)``, info holding ``iterations``, ``converged``, ``last_change``, ``tau2``, ``rho`` and
    ``prior_rows``. Each iteration factors the K d x K d posterior precision."""
    K, d = score.shape
    nu = float(prior_rows)
    if start is None:
        tau0 = np.mean([np.sum(np.linalg.lstsq(information[k], score[k], rcond=None)[0] ** 2) / d for k in range(K)])
        start = (tau0 if np.isfinite(tau0) and tau0 > 0 else 1.0) * np.eye(K)
    omega = (np.asarray(start, dtype=float) + np.asarray(start, dtype=float).T) / 2
    change, it = np.inf, 0
    tau2, rho, _ = exchangeable_target(omega)
    for it in range(1, max_iter + 1):
        mean, cov = _joint_posterior(omega, information, score, jitter)
        S = mean @ mean.T + np.einsum("kjlj->kl", cov.reshape(K, d, K, d))
        tau2, rho, target = exchangeable_target(S / d)
        new = (S + nu * target) / (d + nu)
        new = (new + new.T) / 2
        change = relative_change(new, omega)
        omega = new
        if change < tol:
            break
    return omega, {"iterations": it, "converged": bool(change < tol), "last_change": float(change), "tau2": tau2,
                   "rho": rho, "prior_rows": nu}


def exchangeable_target(A: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The exchangeable (compound-symmetric) covariance closest in average to ``A``:
    ``tau^2 ((1 - rho) I + rho 1 1^T)`` with ``tau^2`` the mean diagonal and ``rho tau^2`` the
    mean off-diagonal entry of ``A`` (rho clipped to ``[-1/(K-1), 1]``). Returns
    ``(tau^2, rho, target)``."""
    K = len(A)
    tau2 = float(np.trace(A) / K)
    if not tau2 > 0:
        return 1.0, 0.0, np.eye(K)
    rho = float((A.sum() - np.trace(A)) / (K * (K - 1)) / tau2)
    rho = min(max(rho, -1.0 / (K - 1)), 1.0)
    return tau2, rho, tau2 * ((1 - rho) * np.eye(K) + rho * np.ones((K, K)))


# --------------------------------------------------------------------------- result


@register
@dataclass(repr=False)
class StructuralResult(PointResult):
    """An HM1 fit: per-device coefficients (``coef``, ``coefficients``), the learned
    device covariance (``omega``, ``correlation``), predictions, and, after
    ``fit(..., uncertainty=True)``, Gaussian posteriors of each device's coefficients given
    an estimate of Omega (``client_posterior``, ``posterior_omega``) with credible and
    predictive intervals.

    Two points per coefficient, never mixed up:

    * Algorithm 1's estimate: ``theta``, ``coef(client)``, ``coefficients``, ``predict(X,
      client)`` without ``level``, and the column ``estimate`` of ``summary`` and of
      ``predict(..., level=...)``;
    * the posterior mean ``posterior_mean`` (with ``uncertainty=True``): the column ``mean`` of
      ``summary`` and of ``predict(..., level=...)``, the centre of their intervals.

    They differ because Algorithm 1 assumes noise variance ``1 / local_steps`` (with
    ``shrink_scale=1``), runs a finite number of gradient steps and uses its own Omega, while
    the posterior uses each device's noise variance and the EM estimate of Omega.

    ``converged``: whether the last round's relative changes of Theta and Omega were both
    below the model's ``tol`` (see :class:`StructuralCovarianceModel`); the changes of every
    round are in ``history`` (metrics ``theta_rel_change``, ``omega_rel_change``).
    """

    omega_: np.ndarray | None = None
    lr: float = 0.0
    posterior_mean: np.ndarray | None = None
    posterior_cov: np.ndarray | None = None
    noise_var: np.ndarray | None = None
    posterior_omega_: np.ndarray | None = None
    posterior_info: dict = field(default_factory=dict)

    @property
    def omega(self) -> pd.DataFrame:
        """Algorithm 1's learned K x K covariance between devices, labelled by client."""
        return pd.DataFrame(self.omega_, index=self.clients, columns=self.clients)

    @property
    def correlation(self) -> pd.DataFrame:
        """Omega scaled to a correlation matrix."""
        s = np.sqrt(np.clip(np.diag(self.omega_), 1e-300, None))
        return pd.DataFrame(self.omega_ / np.outer(s, s), index=self.clients, columns=self.clients)

    @property
    def posterior_omega(self) -> pd.DataFrame:
        """The Omega the posteriors condition on (needs ``uncertainty=True``): the EM
        estimate (default) or Algorithm 1's ``omega`` (``posterior_omega="learned"``)."""
        self._need_posterior()
        return pd.DataFrame(self.posterior_omega_, index=self.clients, columns=self.clients)

    # ------------------------------------------------------------ uncertainty
    def _add_posteriors(self, devices, noise_sd, *, seed: int, jitter: float, how: str = "em",
                        prior_rows=None) -> None:
        alg = _InformationShare(_noise_vars(noise_sd, self.clients))
        out = run(alg, devices, kind="information share", rounds=1, seed=seed, progress=False)
        replies = out.server_state
        missing = [c for c in self.clients if c not in replies]
        if missing:
            why = out.history[0].failed
            c = missing[0]
            raise CannotShareError(f"client {c!r} could not share its information matrix: {why.get(c, 'no reply')}")
        info = np.stack([replies[c]["information"] for c in self.clients])
        score = np.stack([replies[c]["score"] for c in self.clients])
        self.noise_var = np.array([float(replies[c]["noise_var"]) for c in self.clients])
        K, d = len(self.clients), len(self.feature_names)
        if how == "learned":
            omega, details = self.omega_, {"omega": "learned"}
        else:
            nu = float(K if prior_rows is None else prior_rows)
            # start from Algorithm 1's Theta, shrunk as in the M-step (positive definite)
            S0 = self.theta.T @ self.theta
            w = max(nu, 1.0)
            start = (S0 + w * exchangeable_target(S0 / d)[2]) / (d + w)
            if np.linalg.eigvalsh(start)[0] <= 0:
                start = exchangeable_target(S0 / d)[0] * np.eye(K)
            omega, details = em_omega(info, score, prior_rows=nu, start=start, jitter=jitter)
            details = {"omega": "em", **details}
            if not details["converged"]:
                warnings.warn(f"the EM estimate of Omega for the intervals did not converge in "
                              f"{details['iterations']} iterations (last relative change "
                              f"{details['last_change']:.2g}); omega_prior_rows={nu:g}", RuntimeWarning, stacklevel=4)
        self.posterior_omega_, self.posterior_info = omega, details
        self.posterior_mean, self.posterior_cov = conditional_posterior(omega, info, score, jitter)
        # the server returns each device the mean and covariance of its own block
        back = {c: {"bytes_up": 0, "bytes_down": 8 * (d + d * d)} for c in self.clients}
        record(Communication(bytes_down=8 * (d + d * d) * K, per_client=back, by_kind={
            "posterior blocks": {"bytes_up": 0, "bytes_down": 8 * (d + d * d) * K, "rounds": 0, "runs": 1}}))

    @property
    def has_uncertainty(self) -> bool:
        return self.posterior_mean is not None

    def _no_posterior(self, what: str) -> str:
        if what == "global":
            return ("HM1 has no global parameters with a posterior (summary() lists the estimated Omega); client "
                    "posteriors need fit(..., uncertainty=True)")
        return ("no client posterior: fit with uncertainty=True (each device then shares its information matrix "
                "once)")

    def _need_posterior(self) -> None:
        if not self.has_uncertainty:
            raise NoPosteriorError(self._no_posterior("client"))

    def client_posterior(self, client) -> GaussianPosterior:
        """Gaussian posterior of device ``client``'s coefficients given ``posterior_omega`` and
        the devices' noise variances (needs ``fit(..., uncertainty=True)``). Its mean
        (``posterior_mean``) is the centre of every interval this result reports; Algorithm
        1's estimate (``coef``) is a different point (see the class docs)."""
        k = self._k(client)
        self._need_posterior()
        return GaussianPosterior(self.posterior_mean[k], self.posterior_cov[k], names=self.feature_names)

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        """The devices' covariance, one row per distinct entry ``omega[a, b]`` (a <= b): the
        Omega the posteriors condition on (``posterior_omega``) with uncertainty, else
        Algorithm 1's (``omega``). Estimates only: no distribution."""
        om = self.posterior_omega_ if self.has_uncertainty else self.omega_
        a, b = np.triu_indices(len(self.clients))
        names = [f"omega[{self.clients[i]}, {self.clients[j]}]" for i, j in zip(a, b)]
        return pd.DataFrame({"mean": om[a, b]}, index=pd.Index(names, name="parameter"))

    def _client_table(self, client, level: float, kind: str) -> pd.DataFrame:
        """Device ``client``'s coefficients: with uncertainty the posterior ``mean``, ``sd``,
        credible interval and ``p_value`` (one distribution, centred at ``mean``), else
        Algorithm 1's estimate in ``mean``; always ``estimate`` = Algorithm 1's estimate
        (``coef``), which is not the posterior's centre and may lie outside the interval."""
        est = self.coef(client)
        if self.has_uncertainty:
            t = self.client_posterior(client).summary(level=level, kind=kind)
        else:
            t = pd.DataFrame({"mean": est}, index=pd.Index(self.feature_names, name="parameter"))
        t["estimate"] = est
        return t

    # ------------------------------------------------------------ prediction
    def predict(self, X, client=None, *, level: float = 0.95) -> pd.DataFrame:
        """Predictions of device ``client`` for the rows of ``X`` (HM1 has no model of a new
        client: ``client`` must be a fitted one).

        With ``uncertainty=True`` the table describes the posterior of the mean response
        ``x' theta_k``, as :meth:`client_summary` does for the coefficients: ``mean`` (the
        posterior mean, centre of both intervals), ``lower``, ``upper`` (credible interval
        of the mean response), ``pred_lower``, ``pred_upper`` (predictive interval of a new
        observation: the device's noise variance added), then ``sd`` and ``estimate``,
        Algorithm 1's point prediction (what ``rmse`` scores; it need not lie inside the
        intervals). Without uncertainty, ``mean`` and ``estimate`` are Algorithm 1's point
        prediction and the intervals are NaN."""
        level = check_level(level)
        if client is None:
            raise ValueError("HM1 has no model for a client that took no part in the fit: give a fitted client")
        Xd = self._design(X)
        k = self._k(client)
        point = Xd @ self.theta[:, k]
        if not self.has_uncertainty:
            return prediction_frame(point, estimate=point)
        m = Xd @ self.posterior_mean[k]
        v = np.einsum("ij,jk,ik->i", Xd, self.posterior_cov[k], Xd)
        z = sst.norm.ppf(0.5 + level / 2)
        sd, psd = np.sqrt(v), np.sqrt(v + self.noise_var[k])
        return prediction_frame(m, m - z * sd, m + z * sd, m - z * psd, m + z * psd, sd=sd, estimate=point)
