"""HM1: federated multi-task regression that learns the covariance between clients
(Algorithm 1 of Yue, Kontar and Estrada Gómez, "Federated data analytics: a study on linear models").

The coefficients of the K clients form a d x K matrix Theta with the matrix-normal prior
``MN(0, I_d, Omega)``: each coefficient, seen across clients, is ``N(0, Omega)``. A round:

* the server sends client k its own ``theta_k`` and the aggregate
  ``g_k = (Theta Omega^{-1})[:, k]``, computed from the start-of-round Theta with a jittered
  Cholesky solve (never an explicit inverse);
* the client takes ``local_steps`` gradient steps on its own data, then one prior step
  ``theta_k <- theta_k - 2 lr * shrink_scale_k * g_k``, and sends ``theta_k`` back;
* the server writes the returned columns into Theta (non-participants keep theirs) and
  updates ``Omega <- (1 - alpha) Omega + (alpha / d) Theta^T Theta``.

What the iteration optimises: with Omega frozen and full-batch gradients it
converges to the solution of ``(I - M_k)(theta_k - theta_k^OLS) + 2 lr s_k (Theta
Omega^{-1})[:, k] = 0`` with ``M_k = (I - 2 lr X_k^T X_k)`` to the power T; as ``lr -> 0`` that is
the MAP with noise variance ``s_k / T`` on client k. ``shrink_scale=1`` (the paper's
algorithm) therefore assumes noise variance 1/T; ``shrink_scale="noise"`` uses
``s_k = T * sigma_k^2`` with each client's own residual variance, which targets the model
with its real noise. The joint MAP of (Theta, Omega) is degenerate, so the result depends on
alpha, the rounds, the learning rate and the initialisation: the damped update is a
heuristic, and the history records how well-conditioned Omega stays.

Natural units (``standardize=True``, the default): the prior ``N(0, Omega)`` and the shared
step size assume coefficients of comparable size, which data in natural units (dollars,
kelvin, thousands of rows) do not have: on Grunfeld's firms the automatic step is 1e-9 and
every intercept stays at 0. The fit therefore first learns the federation's mean and sd of
every predictor and of the target (:func:`~fedstats.federation.scaling.federated_scaling`, one
counted exchange of sums as HM2's), each client scales its own rows
``x' = (x - m) / s``, ``y' = (y - m_y) / s_y``, and Algorithm 1, the information share and the
posteriors run on that scale. Every reported number is mapped back exactly: coefficient vectors
by the affine map ``theta = A theta' + c`` (:meth:`~fedstats.federation.scaling.LinearScaling.coef_map`),
posterior covariances by ``A Sigma A'``, noise variances by ``s_y^2``, so predictions and both
bands are on the data's scale too. Omega stays the covariance between clients of the
standardised coefficients (units-free; on the data's scale the prior covariance of
``vec(Theta)`` is ``Omega kron A A'``, no K x K matrix alone), and so do ``omega_init`` and
``lr``; ``theta_init``, ``noise_sd`` and what ``callback`` receives are on the data's scale.

Convergence: a round has converged when the relative changes of Theta and of Omega in it,
``||Theta_new - Theta||_F / max(||Theta_new||_F, ||Theta||_F)`` and the same for Omega, are
both below ``tol``; ``StructuralResult.converged`` says whether the last round did, and a fit
that did not converge warns (by default the fit stops at the first converged round, at most
``rounds = 1000``; ``stop_early=False`` runs all ``rounds``, as the paper). When K > d and
``eig_floor = 0`` the iteration has no fixed point (Omega drifts towards the singular
``Theta^T Theta / d``, and after enough rounds Theta oscillates), so such fits do not
converge; an eigenvalue floor (``eig_floor`` 0.01 to 0.3; default 0.3) makes them converge in
the tests' simulations. With the defaults the README's example converges in 12 rounds and
Grunfeld's 11 firms in 493 (each firm's small range of its predictors makes its design
ill-conditioned on the federation's scale, which slows gradient descent).

Uncertainty (not in the paper, opt-in): each client sends the server, once, its information
matrix ``X_k^T X_k / sigma_k^2`` (d x d) and ``X_k^T y_k / sigma_k^2`` (d), the sufficient
statistics of its data (more than Algorithm 1 shares: only theta_k), with ``sigma_k^2`` known
or its least-squares residual variance. Given an Omega, ``vec(Theta)`` then has the Gaussian
posterior with precision ``blockdiag_k(X_k^T X_k / sigma_k^2) + Omega^{-1} kron I_d``; the
server returns each client the mean and covariance of its own block.

Which Omega (``posterior_omega``). Algorithm 1's learned Omega is a poor plug-in: it is
``(1 - alpha)^C I`` plus a weighted average of ``Theta^T Theta / d``, which has rank <= d, so
when K > d it has K - d eigenvalues of about ``(1 - alpha)^C`` (0.042 after 30 rounds at
alpha = 0.1, against true eigenvalues of 1 to 10 in the README's simulation): the prior then
pins Theta to a d-dimensional subspace and the intervals are too narrow (in the README's
simulations their coverage falls well below the nominal level). Even when
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
and on the other clients' noise variances: the uncertainty of Omega is not propagated. They do not depend on Algorithm 1's tuning or convergence; Algorithm 1's estimate
(``coef``, column ``estimate``) is a different point and is reported beside the posterior,
never as its centre. ``posterior_omega="learned"`` conditions on Algorithm 1's Omega.

A client's estimated noise variance (``noise_variance="integrate"``, the default): plugged in,
an estimate from few residual degrees of freedom gives too narrow intervals (8 rows for 4
coefficients leave 4). Given Omega and the other clients' noise variances, client k's
coefficients have the prior ``N(Q^-1 b, Q^-1)`` from Omega and the others (the cavity, read off
the posterior above), and with the Jeffreys prior on its noise variance the marginal posterior
of ``sigma_k^2`` is a one-dimensional density computable from what the client shared and its
row count (:func:`~fedstats.linear.hm1_posterior.integrate_noise`); the client's posterior is
the Gaussian mixture over it (evaluated on a grid, no draws), reported by its mean and
covariance, and ``noise_var`` is the posterior mean of ``sigma_k^2``. With a flat prior this is
the least-squares fit with its Student-t covariance ``s^2 (X'X)^-1 (n - p) / (n - p - 2)``
(``n - p > 2``).
The EM estimate of Omega uses the estimates themselves.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

from ..data import FederatedData, require_target
from ..estimator import BOOL, NONE, Estimator, Int, OneOf, Real
from ..federation.backend import use_backend
from ..federation.scaling import LinearScaling, federated_scaling
from ..fitting import RunOptions, federated_fit
from .design import check_design
from .ep_model import ParticipationSpec
from .hm1_algorithm import (
    CannotShareError,
    HM1Algorithm,
    aggregates,
    floor_eigenvalues,
    omega_update,
    on_fit_scale,
    relative_change,
    round_converged,
    shrink_for,
)
from .hm1_result import StructuralResult, add_posteriors, to_data_scale
from .local import (
    INITS,
    LR,
    REDUCTIONS,
    ClientDesign,
    ScaledDesign,
    coefficient_names,
    federated_lr,
    full_batch_steps,
    resolve_lr,
    seeded_start,
    without_excluded,
)

# --------------------------------------------------------------------------- model


POSTERIOR_OMEGAS = ("em", "learned")
NOISE_VARIANCES = ("integrate", "plug-in")


class StructuralCovarianceModel(Estimator):
    """HM1: per-client linear regressions that borrow strength through a learned K x K
    covariance between clients (Algorithm 1 of the linear-models paper).

    Parameters
    ----------
    rounds : int
        Communication rounds C, at most (default 1000; the fit stops at the first converged
        round, ``stop_early``); the paper runs 30 (100 for the recovery figure), all of them.
    local_steps : int
        Gradient steps T per client and round (paper: 20).
    lr : float or "auto"
        The shared step size eta_2, on the scale the iteration runs on (the standardised one
        with ``standardize``). ``"auto"`` takes ``0.5 / max_k lambda_max`` of the
        clients' per-step loss curvature (each client shares that one scalar), which keeps
        local gradient descent stable; the paper grid-searches it.
    alpha : float in [0, 1]
        Damping of the Omega update (default 0.5; paper: 0.1, and 0.9 for the turbofan
        study; 0.5 reaches the fixed point in about half the rounds of 0.1). ``0`` freezes
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
        ``s_k = T sigma_k^2`` with each client's least-squares residual variance (computed on
        the client, never sent), which targets the model with its real noise.
    init : "normal" or "zeros"
        Initial Theta: i.i.d. N(0, 1) entries drawn from the seed (paper) or zeros (its code).
    omega_init : array (K, K) or None
        Initial Omega (default the identity), on the scale the iteration runs on.
    fit_intercept : bool
        Prepend a column of ones (its coefficient is shrunk like the others). Default True;
        the paper's designs carry their own constant column (``False``).
    standardize : bool
        Run the iteration and the posteriors on standardised data (default True): the
        federation's mean and sd of every predictor and of the target, from one counted
        exchange of sums (:func:`fedstats.federation.scaling.federated_scaling`, as HM2's), each
        client scaling its own rows; every reported number is mapped back to the data's
        scale exactly (module docs). ``False``: the data's own units (the paper's
        algorithm), where the prior ``N(0, Omega)`` and the step size see columns of very
        different scales (on Grunfeld's firms, ``lr="auto"`` is 1e-9 and every intercept stays
        at 0).
    participation : float, int, callable or schedule
        Who takes part in a round (see :func:`fedstats.federation.run`); default everyone.
        The paper's recommendation for partial participation is a fraction drawn uniformly
        without replacement.
    jitter : float
        Relative jitter of the Cholesky solve with Omega (never inverted explicitly: its identity
        part decays geometrically over the rounds).
    eig_floor : float
        If positive, Omega's eigenvalues are raised to at least ``eig_floor * mean(diag)``
        after every update (default 0.3: with more clients than coefficients the iteration has
        no fixed point without it, and below about 0.2 it oscillated on 11 of 216 simulated
        federations of 3 to 6 clients, none at 0.3; the paper has none, 0).
    tol : float
        Convergence tolerance (default 1e-4): a round has converged when the relative changes
        of Theta and of Omega in it (Frobenius norms, ``||new - old|| / max(||new||, ||old||)``)
        are both below ``tol``. ``StructuralResult.converged`` says whether the last round did; a fit
        that did not converge warns, naming the rounds and the last changes (``tol=0``: never
        converged, no warning). A small change in one round is not a proof that the fixed
        point is near when gradient descent is slow (ill-conditioned designs, tiny ``lr``).
    stop_early : bool
        Stop at the first converged round (default True; ``False`` runs all ``rounds``, as
        the paper).
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
    noise_variance : "integrate" or "plug-in"
        How the posteriors treat a noise variance the client estimated (no ``noise_sd``):
        ``"integrate"`` (default) integrates it out of the client's posterior, given Omega
        and the other clients' estimates (module docs), which widens the intervals of
        clients with few residual degrees of freedom as a t interval is wider than a normal
        one; ``"plug-in"`` conditions on the estimate (too narrow intervals on data-poor
        clients: on 8-row clients with 4 coefficients 90% intervals covered 0.81 in the
        natural-units simulations of ``tests/linear/test_hm1_natural_units.py``, 0.86
        integrated).

    Examples
    --------
    >>> import numpy as np
    >>> from fedstats.data import FederatedData
    >>> from fedstats.linear import StructuralCovarianceModel
    >>> rng = np.random.default_rng(0)
    >>> Xs = [rng.normal(1000, 100, (30, 2)) for _ in range(4)]  # natural units
    >>> ys = [50 + X @ [0.02, -0.01] + 0.1 * rng.standard_normal(30) for X in Xs]
    >>> res = StructuralCovarianceModel().fit(FederatedData.from_arrays(Xs, ys))
    >>> res.omega.shape, res.converged, res.feature_names
    ((4, 4), True, ['intercept', 'x0', 'x1'])
    >>> bool(np.allclose(res.client_posterior(0).mean[1:], [0.02, -0.01], atol=0.002))
    True
    """

    def __init__(
        self,
        *,
        rounds: int = 1000,
        local_steps: int = 20,
        lr: float | str = "auto",
        alpha: float = 0.5,
        batch_size: int | None = None,
        grad_reduction: str = "sum",
        shrink_scale: float | str = 1.0,
        init: str = "normal",
        omega_init: ArrayLike | None = None,
        fit_intercept: bool = True,
        standardize: bool = True,
        participation: ParticipationSpec | Sequence[Sequence[Hashable]] = 1.0,
        jitter: float = 1e-8,
        eig_floor: float = 0.3,
        tol: float = 1e-4,
        stop_early: bool = True,
        posterior_omega: str = "em",
        omega_prior_rows: float | None = None,
        noise_variance: str = "integrate",
    ) -> None:
        self.rounds, self.local_steps, self.lr, self.alpha = rounds, local_steps, lr, alpha
        self.batch_size, self.grad_reduction, self.shrink_scale = batch_size, grad_reduction, shrink_scale
        self.init, self.omega_init, self.fit_intercept = init, omega_init, fit_intercept
        self.standardize = standardize
        self.participation, self.jitter, self.eig_floor, self.tol = participation, jitter, eig_floor, tol
        self.stop_early, self.posterior_omega, self.omega_prior_rows = stop_early, posterior_omega, omega_prior_rows
        self.noise_variance = noise_variance

    _constraints = {
        "rounds": Int(1),
        "local_steps": Int(1),
        "lr": LR,
        "alpha": Real(0, 1),
        "batch_size": NONE | Int(1),
        "grad_reduction": OneOf(*REDUCTIONS),
        "shrink_scale": OneOf("noise") | Real(0),
        "init": OneOf(*INITS),
        "fit_intercept": BOOL,
        "standardize": BOOL,
        "jitter": Real(0),
        "eig_floor": Real(0),
        "tol": Real(0),
        "stop_early": BOOL,
        "posterior_omega": OneOf(*POSTERIOR_OMEGAS),
        "omega_prior_rows": NONE | Real(0),
        "noise_variance": OneOf(*NOISE_VARIANCES),
    }

    def _validated(self, K: int) -> dict:
        """The declarative checks, then those that need the number of clients K."""
        self._validate_params()
        omega = None
        if self.omega_init is not None:
            omega = np.asarray(self.omega_init, dtype=float)
            if omega.shape != (K, K) or not np.all(np.isfinite(omega)):
                raise ValueError(
                    f"omega_init must be a finite {K} x {K} matrix (one row per client), got shape {omega.shape}"
                )
            if not np.allclose(omega, omega.T) or np.linalg.eigvalsh((omega + omega.T) / 2)[0] <= 0:
                raise ValueError("omega_init must be symmetric positive definite")
        return {"alpha": float(self.alpha), "omega": omega}

    def _prepare(self, data: FederatedData) -> tuple[list[Hashable], dict, ClientDesign, list[str]]:
        """Validated options and the client view: ``(clients, options, clients, names)``."""
        clients = list(data.clients)
        if len(clients) < 2:
            raise ValueError("HM1 learns a covariance between clients: it needs at least 2 clients")
        opts = self._validated(len(clients))
        names = coefficient_names(data, self.fit_intercept)
        return clients, opts, ScaledDesign(data, bool(self.fit_intercept)), names

    @federated_fit
    def fit(
        self,
        data: FederatedData,
        run: RunOptions,
        *,
        uncertainty: bool | str = "auto",
        noise_sd: float | Mapping[Hashable, float] | None = None,
        theta_init: ArrayLike | None = None,
        callback: Callable[[int, np.ndarray, np.ndarray], object] | None = None,
    ) -> StructuralResult:
        """Fit Algorithm 1 on ``data`` (a :class:`~fedstats.data.FederatedData`, K >= 2).

        With uncertainty one more exchange follows, in which every client shares its
        information matrix (see the module docs), and the result holds Gaussian posteriors
        of every ``theta_k`` given an estimate of Omega (``posterior_omega``: by default the
        EM estimate from those matrices, not Algorithm 1's Omega); their mean is the
        reported estimate (``mean`` of ``client_summary`` and ``predict``; Algorithm 1's point
        stays beside it as ``estimate``, ``coef``, ``theta``, and is what ``rmse`` scores).
        ``noise_sd`` (a float, or a dict client -> float, on the data's scale) gives known
        noise sds, else each client uses its least-squares residual variance (which needs
        more rows than coefficients), integrated out of its posterior by default
        (``noise_variance``). ``uncertainty="auto"`` (default): posteriors whenever every client
        can share (a warning otherwise, and the result then holds Algorithm 1's point only);
        ``True``: posteriors or an error; ``False``: Algorithm 1 only. Why the posterior mean
        is the default estimate: on data-poor clients it is the better point (README,
        ``benchmarks/results/hm1_defaults.md``). The
        result's ``converged`` says whether Algorithm 1's last round changed Theta and Omega
        by less than ``tol`` (relative); if not, a :class:`RuntimeWarning` says so.
        ``theta_init`` (d x K, on the data's scale) overrides ``init``.
        ``callback(round, Theta, Omega)`` is called on the server after every round (copies;
        Theta on the data's scale, Omega on the fit's; e.g. to trace parameter recovery).
        With ``standardize`` (default) the fit starts with one exchange of sums for the
        federation's moments (module docs), counted in ``communication``.
        """
        seed = run.seed
        require_target(data, "StructuralCovarianceModel")
        if not (uncertainty is True or uncertainty is False or uncertainty == "auto"):
            raise ValueError(
                f"StructuralCovarianceModel.fit: uncertainty must be True, False or 'auto', got {uncertainty!r}"
            )
        clients, opts, _, names = self._prepare(data)
        K, d = len(clients), len(names)
        check_design(data, data.feature_names, bool(self.fit_intercept), seed=seed)  # unidentifiable: refused
        scaling, design = self._scaled(data, seed)
        start, callback = on_fit_scale(scaling, self._theta_init(theta_init, d, K), callback)
        start = start if start is not None else seeded_start(self.init, d, K, seed)
        lr = federated_lr(self.lr, design, self.batch_size, self.grad_reduction, seed=seed)
        alg = HM1Algorithm(
            d,
            local_steps=int(self.local_steps),
            lr=lr,
            alpha=opts["alpha"],
            batch_size=self.batch_size,
            grad_reduction=self.grad_reduction,
            shrink_scale=self.shrink_scale,
            init=self.init,
            omega_init=opts["omega"],
            theta_init=start,
            jitter=float(self.jitter),
            eig_floor=float(self.eig_floor),
            tol=float(self.tol),
            callback=callback,
        )
        t0 = time.perf_counter()
        try:
            # converged() judges every round; without stop_early the run may stop only at the last
            out = run.run(
                alg,
                design,
                kind="HM1 rounds",
                rounds=int(self.rounds),
                participation=self.participation,
                min_rounds=1 if self.stop_early else int(self.rounds),
            )
        except (FloatingPointError, np.linalg.LinAlgError) as exc:
            raise FloatingPointError(f"HM1 diverged ({exc}) with lr={lr:.3g}: lower lr") from exc
        failed = {c: why for rec in out.history for c, why in rec.failed.items()}
        diverged = [c for c, why in failed.items() if why.startswith("FloatingPointError")]
        if diverged:
            raise FloatingPointError(
                f"HM1 diverged on {len(diverged)} client(s) (e.g. {diverged[0]!r}) with lr={lr:.3g}: lower lr"
            )
        if failed:
            c, why = next(iter(failed.items()))
            warnings.warn(
                f"{len(failed)} client(s) failed in some round and kept their previous coefficients; e.g. {c!r}: {why}",
                RuntimeWarning,
                stacklevel=2,
            )
        last = out.history[-1].metrics if len(out.history) else {}
        res = StructuralResult(
            feature_names=names,
            clients=clients,
            theta=out.server_state.theta,
            omega_array=out.server_state.omega,
            lr=lr,
            options=self.get_params(),
            history=out.history,
            communication=out.communication,
            converged=round_converged(last, float(self.tol)),
            seconds=time.perf_counter() - t0,
            seed=seed,
            model="StructuralCovarianceModel",
        )
        self._warn_unconverged(res.rounds, res.converged, last, K, d, stacklevel=4)
        # a client that dropped out of the fit has no coefficients and no covariances
        res.theta = without_excluded(res.theta, clients)
        gone = [k for k, c in enumerate(clients) if np.isnan(res.theta[:, k]).all()]
        if gone and res.omega_array is not None:
            res.omega_array = res.omega_array.copy()
            res.omega_array[gone, :] = res.omega_array[:, gone] = np.nan
        if uncertainty:
            try:
                add_posteriors(
                    res,
                    design,
                    noise_sd,
                    seed=seed,
                    jitter=float(self.jitter),
                    how=self.posterior_omega,
                    prior_rows=self.omega_prior_rows,
                    y_scale=1.0 if scaling is None else scaling.y_sd,
                    noise=self.noise_variance,
                )
            except CannotShareError as exc:
                if uncertainty is True:
                    raise
                warnings.warn(
                    f"HM1 reports Algorithm 1's point estimates only, without posteriors: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        to_data_scale(res, scaling)
        return res

    def _theta_init(self, theta_init: ArrayLike | None, d: int, K: int) -> np.ndarray | None:
        if theta_init is None:
            return None
        theta_init = np.asarray(theta_init, dtype=float)
        if theta_init.shape != (d, K) or not np.all(np.isfinite(theta_init)):
            raise ValueError(f"theta_init must be a finite {d} x {K} matrix, got shape {theta_init.shape}")
        return theta_init

    def _scaled(self, data: FederatedData, seed: int) -> tuple[LinearScaling | None, ScaledDesign]:
        """The federation's scaling (one counted exchange of sums, as HM2's; ``None`` without
        ``standardize``) and the clients' view of their rows on that scale."""
        scaling = federated_scaling(data, bool(self.fit_intercept), seed=seed) if self.standardize else None
        return scaling, ScaledDesign(data, bool(self.fit_intercept), scaling)

    def _warn_unconverged(
        self, rounds: int, converged: bool, metrics: Mapping, K: int, d: int, *, stacklevel: int
    ) -> None:
        if converged or not float(self.tol) > 0:
            return
        th, om = metrics.get("theta_rel_change", np.nan), metrics.get("omega_rel_change", np.nan)
        hint = (
            "with more clients than coefficients (K = %d > d = %d) Omega drifts towards the singular "
            "Theta'Theta/d and the iteration has no fixed point: set eig_floor (e.g. 0.3, the default)" % (K, d)
            if K > d and float(self.eig_floor) == 0 and float(self.alpha) > 0
            else "run more rounds, or lower lr or raise eig_floor if the changes do not shrink (history metrics "
            "theta_rel_change, omega_rel_change)"
        )
        warnings.warn(
            f"HM1 did not converge in {rounds} rounds: in the last round Theta changed by {th:.2g} "
            f"and Omega by {om:.2g} (relative; tol={float(self.tol):g}), so Algorithm 1's estimates are "
            f"not at a fixed point; {hint}",
            RuntimeWarning,
            stacklevel=stacklevel,
        )

    def fit_centralized(
        self, data: FederatedData, *, seed: int = 0, theta_init: ArrayLike | None = None
    ) -> StructuralResult:
        """The same iteration on pooled data in one process, without the federated runtime:
        every client's ``X^T X`` and ``X^T y`` stacked, all columns of Theta updated at once.
        The reference that the federated fit must equal (full-batch steps, everyone taking
        part) and the baseline of ``benchmarks/hm1.py``. ``converged``, ``tol`` and
        ``stop_early`` work as in :meth:`fit` (no history is kept)."""

        if self.batch_size is not None or self.participation != 1.0:
            raise ValueError("fit_centralized runs full-batch steps with every client taking part")
        clients, opts, _, names = self._prepare(data)
        K = len(clients)
        t0 = time.perf_counter()
        with use_backend("inprocess"):
            scaling, design = self._scaled(data, seed)
        start, _ = on_fit_scale(scaling, self._theta_init(theta_init, len(names), K), None)
        Xs = [design[c] for c in clients]
        lr = resolve_lr(self.lr, [X for X, _ in Xs], self.batch_size, self.grad_reduction)
        XtX = np.stack([X.T @ X for X, _ in Xs])
        Xty = np.stack([X.T @ y for X, y in Xs])
        n = np.array([len(y) for _, y in Xs], dtype=float)
        scale = np.ones(K) if self.grad_reduction == "sum" else n
        shrink = np.array(
            [
                shrink_for(self.shrink_scale, X, y, c, self.local_steps, None, self.grad_reduction)
                for (X, y), c in zip(Xs, clients)
            ]
        )
        theta = start if start is not None else seeded_start(self.init, len(names), K, seed)
        omega = np.eye(K) if opts["omega"] is None else opts["omega"]
        metrics, done = {}, 0
        for _ in range(int(self.rounds)):
            g = aggregates(theta, omega, self.jitter)
            new = full_batch_steps(
                np.ascontiguousarray(theta.T), XtX, Xty, steps=int(self.local_steps), lr=lr, scale=scale
            ).T
            new = new - 2 * lr * shrink[None, :] * g
            if not np.all(np.isfinite(new)):
                raise FloatingPointError(f"HM1 diverged with lr={lr:.3g}: lower lr")
            new_omega = floor_eigenvalues(omega_update(omega, new, opts["alpha"]), self.eig_floor)
            metrics = {
                "theta_rel_change": relative_change(new, theta),
                "omega_rel_change": relative_change(new_omega, omega),
            }
            theta, omega, done = new, new_omega, done + 1
            if self.stop_early and round_converged(metrics, float(self.tol)):
                break
        res = StructuralResult(
            feature_names=names,
            clients=clients,
            theta=theta,
            omega_array=omega,
            lr=lr,
            options=self.get_params(),
            converged=round_converged(metrics, float(self.tol)),
            seconds=time.perf_counter() - t0,
            seed=seed,
            model="StructuralCovarianceModel",
        )
        self._warn_unconverged(done, res.converged, metrics, K, len(names), stacklevel=3)
        to_data_scale(res, scaling)
        return res
