"""Baselines for HM1 (those of the linear-models paper's Sections 5.1 and 6.2: Dis-Ridge as one
closed-form ridge per client averaged once, Ditto with local gradient steps), with the same result
API (:class:`~fedstats.linear.local.PointResult`: ``coef``, ``coefficients``, ``predict``,
``rmse``, ``history``, ``communication``).

* :class:`Separate` -- every client alone: the same local gradient steps and budget as HM1
  (``rounds * local_steps``, no communication), or closed-form least squares;
* :class:`FedAvg` -- local steps, then the server's unweighted average of the participants'
  coefficients; every client predicts with the average;
* :class:`Ditto` -- FedAvg plus, on each client, personal coefficients ``v_k`` that take
  local steps on ``F_k(v) + lam/2 ||v - theta_bar||^2`` alongside (Li et al. 2021);
* :class:`DistributedRidge` -- one shot: each client solves
  ``(1/N_k)||y - X theta||^2 + lam ||theta||^2`` and the server averages the solutions;
* :class:`PooledOracle` -- the posterior mean of all clients' coefficients under the HM1
  prior with a *known* Omega and noise variances, from the pooled data (no federation): what
  HM1 would reach if it knew the truth.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from .. import streams
from ..data import FederatedData, require_target
from ..estimator import BOOL, NONE, Estimator, Int, OneOf, Real, subclass_init
from ..federation import FederatedAlgorithm
from ..federation.oneshot import raise_failures
from ..fitting import RunOptions, federated_fit
from .design import check_design
from .local import (
    INITS,
    LR,
    REDUCTIONS,
    ClientDesign,
    PointResult,
    coefficient_names,
    federated_lr,
    full_batch,
    full_batch_steps,
    initial_theta,
    local_steps,
    seeded_start,
    without_excluded,
)


def _common(model, data) -> tuple[ClientDesign, list, list[str], float]:
    model._validate_params()
    if data.n_clients < 1:
        raise ValueError("no clients")
    check_design(data, data.feature_names, model.fit_intercept, per_client=not isinstance(model, FedAvg))
    design = ClientDesign(data, model.fit_intercept)
    clients = list(data.clients)
    lr = federated_lr(model.lr, design, model.batch_size, model.grad_reduction)
    return design, clients, coefficient_names(data, model.fit_intercept), lr


class _GDOptions(Estimator):
    """The parameters of the gradient-descent baselines (HM1's: the same step budget)."""

    _constraints = {
        "rounds": Int(1),
        "local_steps": Int(1),
        "lr": LR,
        "batch_size": NONE | Int(1),
        "grad_reduction": OneOf(*REDUCTIONS),
        "init": OneOf(*INITS),
        "fit_intercept": BOOL,
    }

    def __init__(
        self,
        *,
        rounds=30,
        local_steps=20,
        lr="auto",
        batch_size=None,
        grad_reduction="sum",
        init="normal",
        fit_intercept=True,
        participation=1.0,
    ):
        self.rounds, self.local_steps, self.lr, self.batch_size = rounds, local_steps, lr, batch_size
        self.grad_reduction, self.init, self.fit_intercept = grad_reduction, init, fit_intercept
        self.participation = participation

    def _options(self, **extra) -> dict:
        return {**self.get_params(), **extra}


class Separate(_GDOptions):
    """Each client fits alone. ``method="gd"`` (default): ``rounds * local_steps`` local
    gradient steps from the same initialisation as HM1 (the paper's baseline: the same step
    budget, no shrinkage); ``method="ols"``: closed-form least squares (minimum-norm when a
    client has fewer rows than coefficients)."""

    __init__ = subclass_init(_GDOptions, method="gd")
    method: str

    _constraints = {**_GDOptions._constraints, "method": OneOf("gd", "ols")}

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> PointResult:
        """Each client's own fit, in one round; returns a :class:`PointResult`."""
        require_target(data, "Separate")
        seed = run.seed
        t0 = time.perf_counter()
        design, clients, names, lr = _common(self, data)
        d, K = len(names), len(clients)
        # the same initial Theta as HM1 under the same seed (runner's init stream)
        theta0 = seeded_start(self.init, d, K, seed)
        alg = _SeparateFit(
            self.method,
            theta0,
            seed=seed,
            steps=self.rounds * self.local_steps,
            lr=lr,
            batch_size=self.batch_size,
            reduction=self.grad_reduction,
        )
        out = run.run(alg, design, kind="local fits", rounds=1)
        if any(why.startswith("FloatingPointError") for why in out.history[0].failed.values()):
            raise FloatingPointError(f"local gradient descent diverged with lr={lr:.3g}: lower lr")
        raise_failures(out.history, "Separate")  # in a fit, a failed client drops out
        nan = np.full(d, np.nan)
        theta = without_excluded(np.column_stack([out.server_state["theta"].get(c, nan) for c in clients]), clients)
        return PointResult(
            names,
            clients,
            theta,
            self._options(lr_used=lr),
            seconds=time.perf_counter() - t0,
            seed=seed,
            model="Separate",
        )


class _SeparateFit(FederatedAlgorithm):
    """Separate as one round: client ``k`` gets its column of the common start, fits alone
    (``rounds * local_steps`` gradient steps, or least squares) and sends its coefficients.
    Client ``k``'s minibatches draw from the stream ``separate batches`` of ``k``
    (:mod:`fedstats.streams`). The coefficients stay per client (not summed): each client's
    own fit is the result."""

    reply_keys = ("theta",)

    def __init__(self, method, theta0, *, seed, steps, lr, batch_size, reduction):
        self.method, self.theta0, self.seed, self.steps = method, theta0, seed, steps
        self.lr, self.batch_size, self.reduction = lr, batch_size, reduction

    def init_server(self, clients, rng):
        return {"index": {c: k for k, c in enumerate(clients)}, "theta": {}}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        k = server_state["index"][client]
        return {"theta": self.theta0[:, k].copy(), "k": np.array([k])}

    def _check(self, theta):
        if not np.all(np.isfinite(theta)):
            raise FloatingPointError(f"local gradient descent diverged (lr={self.lr:.3g})")
        return {"theta": theta}, None

    def client_step(self, message, state, data, rng):
        X, y = data
        if self.method == "ols":
            return {"theta": np.linalg.lstsq(X, y, rcond=None)[0]}, None
        k = int(message["k"][0])
        return self._check(
            local_steps(
                message["theta"],
                X,
                y,
                steps=self.steps,
                lr=self.lr,
                batch_size=self.batch_size,
                reduction=self.reduction,
                rng=streams.stream(self.seed, "separate batches", k),
            )
        )

    def client_steps(self, messages, states, datas, rngs):
        if self.method == "ols" or not all(full_batch(self.batch_size, len(y)) for _, y in datas):
            return super().client_steps(messages, states, datas, rngs)
        # every client's full-batch steps in one product
        thetas = full_batch_steps(
            np.stack([m["theta"] for m in messages]),
            np.stack([X.T @ X for X, _ in datas]),
            np.stack([X.T @ y for X, y in datas]),
            steps=self.steps,
            lr=self.lr,
            scale=[1.0 if self.reduction == "sum" else float(len(y)) for _, y in datas],
        )
        out = []
        for theta in thetas:
            try:
                out.append(self._check(theta))
            except FloatingPointError as exc:
                out.append(exc)
        return out

    def server_step(self, server_state, replies, round):
        return {
            "index": server_state["index"],
            "theta": {**server_state["theta"], **{c: r["theta"] for c, r in replies.items()}},
        }, {}


class _Averaging(FederatedAlgorithm):
    """FedAvg, and Ditto when ``lam`` is not None: the server holds the global coefficients
    and sends them to every participant; replies are the locally updated coefficients, which
    the server uses only through their sum (the average is the sum over the participants
    that answered divided by their number). Ditto's personal ``v_k`` never leave the client."""

    reply_keys = ("theta",)
    summed_keys = reply_keys

    def __init__(self, d, *, lr, local_steps, batch_size, reduction, init, lam=None):
        self.d, self.lr, self.steps, self.batch_size, self.reduction = d, lr, local_steps, batch_size, reduction
        self.init, self.lam = init, lam

    def init_server(self, clients, rng):
        return initial_theta(self.init, self.d, 1, rng)[:, 0]

    def init_client(self, client, data, rng):
        return None  # Ditto's personal v_k starts at the first global model it receives

    def broadcast(self, server_state, client, round):
        return {"theta": server_state.copy()}

    def _steps(self, theta, data, rng, anchor=None):
        out = local_steps(
            theta,
            *data,
            steps=self.steps,
            lr=self.lr,
            batch_size=self.batch_size,
            reduction=self.reduction,
            rng=rng,
            anchor=anchor,
            anchor_weight=self.lam or 0.0,
        )
        if not np.all(np.isfinite(out)):
            raise FloatingPointError(f"local gradient descent diverged (lr={self.lr:.3g})")
        return out

    def client_step(self, message, state, data, rng):
        g = message["theta"]
        w = self._steps(g, data, rng)
        if self.lam is not None:
            v = g if state is None else state
            state = self._steps(v, data, rng, anchor=g)
        return {"theta": w}, state

    def server_step(self, server_state, replies, round):
        new = np.array(replies.sums["theta"]) / len(replies) if replies else server_state
        with np.errstate(over="ignore"):
            return new, {"theta_change": float(np.linalg.norm(new - server_state))}


def _run_averaging(model, data, run: RunOptions, lam=None):
    t0 = time.perf_counter()
    design, clients, names, lr = _common(model, data)
    alg = _Averaging(
        len(names),
        lr=lr,
        local_steps=int(model.local_steps),
        batch_size=model.batch_size,
        reduction=model.grad_reduction,
        init=model.init,
        lam=lam,
    )
    out = run.run(alg, design, kind="rounds", rounds=int(model.rounds), participation=model.participation)
    diverged = [why for rec in out.history for why in rec.failed.values() if why.startswith("FloatingPointError")]
    if diverged:
        raise FloatingPointError(f"{type(model).__name__} diverged with lr={lr:.3g}: lower lr")
    # converged: the last round moved the global coefficients by less than tol (relative)
    moved = float(out.history[-1].metrics.get("theta_change", np.nan)) / max(
        float(np.linalg.norm(out.server_state)), 1e-12
    )
    converged = bool(moved < float(model.tol))
    if not converged:
        noisy = "" if model.batch_size is None else "; with minibatches (batch_size) the steps' noise keeps them moving"
        warnings.warn(
            f"{type(model).__name__} did not converge in {model.rounds} rounds: the last round moved the global "
            f"coefficients by {moved:.3g} of their norm (tol={float(model.tol):g}); raise rounds or lower lr{noisy}",
            RuntimeWarning,
            stacklevel=4,
        )
    if lam is None:
        theta = np.repeat(out.server_state[:, None], len(clients), axis=1)
    else:
        # every client in the fit has taken part, so it has its personal model
        theta = np.column_stack(
            [out.server_state if out.client_states.get(c) is None else out.client_states[c] for c in clients]
        )
    theta = without_excluded(theta, clients)  # a client that dropped out has no coefficients
    return PointResult(
        names,
        clients,
        theta,
        model._options(lr_used=lr),
        history=out.history,
        communication=out.communication,
        converged=converged,
        seconds=time.perf_counter() - t0,
        seed=run.seed,
        model=type(model).__name__,
        shared=lam is None,
    )


class FedAvg(_GDOptions):
    """FedAvg for linear regression (the paper's version): each round the participants take
    ``local_steps`` gradient steps from the global coefficients and the server takes their
    unweighted average; every client predicts with the final average. All ``rounds`` run (the
    paper's budget); the fit has ``converged`` when the last round moved the global
    coefficients by less than ``tol`` relative to their norm, and warns otherwise."""

    _constraints = {**_GDOptions._constraints, "tol": Real(0)}

    __init__ = subclass_init(_GDOptions, tol=1e-4)
    tol: float

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> PointResult:
        """FedAvg's rounds; returns a :class:`PointResult` (one coefficient vector for all)."""
        require_target(data, "FedAvg")
        return _run_averaging(self, data, run)


class Ditto(_GDOptions):
    """Ditto (Li et al. 2021): FedAvg for the global coefficients and, alongside it on each
    participant, ``local_steps`` steps on its personal ``v_k`` for
    ``F_k(v) + lam/2 ||v - theta_bar||^2`` (``theta_bar``: the global coefficients it
    received that round). Clients predict with ``v_k``. ``lam`` is searched over
    {0.01, 0.1, 1, 10} in the studies (the paper gives no grid)."""

    _constraints = {**_GDOptions._constraints, "lam": Real(0), "tol": Real(0)}

    __init__ = subclass_init(_GDOptions, lam=1.0, tol=1e-4)
    lam: float
    tol: float

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> PointResult:
        """Ditto's rounds; returns a :class:`PointResult` (each client's personal coefficients)."""
        require_target(data, "Ditto")
        return _run_averaging(self, data, run, lam=float(self.lam))


class _OneShotRidge(FederatedAlgorithm):
    """One round: every client sends its closed-form ridge solution; the server averages them
    without weights, through their sum only."""

    reply_keys = ("theta",)
    summed_keys = reply_keys

    def __init__(self, lam):
        self.lam = lam

    def init_server(self, clients, rng):
        return None

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        X, y = data
        n, d = X.shape
        return {"theta": np.linalg.solve(X.T @ X / n + self.lam * np.eye(d), X.T @ y / n)}, state

    def server_step(self, server_state, replies, round):
        # no client answered: no average (the fit reports the failures)
        return (np.array(replies.sums["theta"]) / len(replies) if replies else None), {}


class DistributedRidge(Estimator):
    """One-shot distributed ridge (Zhang et al. 2015, one node per client): each client solves ``(1/N_k)||y - X theta||^2 + lam ||theta||^2`` in closed form,
    the server averages the solutions without weights, and every client uses the average."""

    _constraints = {"lam": Real(0, closed=(False, True)), "fit_intercept": BOOL}

    def __init__(self, *, lam: float = 1e-3, fit_intercept: bool = True):
        self.lam, self.fit_intercept = lam, fit_intercept

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> PointResult:
        """The one round of ridge solutions; returns a :class:`PointResult`."""
        require_target(data, "DistributedRidge")
        seed = run.seed
        lam = float(self.lam)
        t0 = time.perf_counter()
        check_design(data, data.feature_names, self.fit_intercept, seed=seed, per_client=False)
        design, clients = ClientDesign(data, self.fit_intercept), list(data.clients)
        out = run.run(_OneShotRidge(lam), design, kind="ridge statistics", rounds=1)
        raise_failures(out.history, "distributed ridge")  # in a fit, a failed client drops out
        theta = without_excluded(np.repeat(out.server_state[:, None], len(clients), axis=1), clients)
        return PointResult(
            coefficient_names(data, self.fit_intercept),
            clients,
            theta,
            self.get_params(),
            history=out.history,
            communication=out.communication,
            seconds=time.perf_counter() - t0,
            seed=seed,
            model="DistributedRidge",
            shared=True,
        )


class PooledOracle(Estimator):
    """The posterior mean of every client's coefficients under the HM1 prior
    ``vec(Theta) ~ N(0, Omega kron I_d)`` with known ``omega`` (K x K) and ``noise_var``
    (a float or one per client), computed on the pooled data; a yardstick for HM1 in
    simulations where the truth is known."""

    def __init__(self, *, omega, noise_var, fit_intercept: bool = False):
        self.omega, self.noise_var, self.fit_intercept = omega, noise_var, fit_intercept

    def fit(self, data, *, seed: int = 0) -> PointResult:
        require_target(data, "PooledOracle")
        from .hm1_posterior import conditional_posterior

        t0 = time.perf_counter()
        clients = list(data.clients)
        K = len(clients)
        omega = np.asarray(self.omega, dtype=float)
        if omega.shape != (K, K):
            raise ValueError(f"omega must be {K} x {K}, got shape {omega.shape}")
        nv = np.broadcast_to(np.asarray(self.noise_var, dtype=float), (K,))
        if not np.all(nv > 0):
            raise ValueError("noise_var must be positive")
        design = ClientDesign(data, self.fit_intercept)
        info = np.stack([design[c][0].T @ design[c][0] / v for c, v in zip(clients, nv)])
        score = np.stack([design[c][0].T @ design[c][1] / v for c, v in zip(clients, nv)])
        mean, _ = conditional_posterior(omega, info, score)
        return PointResult(
            coefficient_names(data, self.fit_intercept),
            clients,
            mean.T,
            {"fit_intercept": self.fit_intercept},
            seconds=time.perf_counter() - t0,
            seed=seed,
            model="PooledOracle",
        )
