"""FGPR: federated Gaussian process regression (Yue and Kontar, "Federated Gaussian Process:
Convergence, Automatic Personalization and Multi-fidelity Modeling", Algorithm 1).

One GP prior (kernel lengthscale, outputscale, noise variance, optionally a constant mean)
is shared by all clients and learned by federated averaging of hyperparameters:

* the server sends the current hyperparameters;
* each client takes E steps of Adam or SGD on the exact negative log marginal likelihood
  of minibatches of its own data (uniform or nearest-neighbour batches of size
  ``M_k = min(M, N_k)``) and sends back its new hyperparameters ``h_k`` as its term
  ``w_k g(h_k)`` of the server's weighted mean (``g``: the averaging space's map);
* the server averages them with weights ``N_k / N`` (in constrained space by default, as
  the published code does), or, under partial participation, draws ``K_s`` clients with
  replacement with probabilities ``N_k / N`` and takes the plain average counting
  duplicates with their multiplicity (broadcast to each drawn client as its ``w_k``). It
  needs only the sum of the clients' terms (declared summed, for secure aggregation),
  divided by the total weight of those that answered.

Each client then predicts by conditioning the shared prior on its *own* data,
which personalises automatically; a client that took no part in training does the same
with no training. What crosses the network: the hyperparameters down and the weighted terms
up every round (and a drawn client's multiplicity under partial participation), each
client's ``N_k`` once, before the first round, and, after the rounds (``laplace``), each
client's likelihood value, gradient and Hessian in the log hyperparameters, summed
(:mod:`fedstats.gp.laplace`; once, and once per Newton step with ``newton_steps``). Never
data or predictions.

The objective is ``sum_k p_k L_k``: clients are independent draws from one prior, so FGPR
with several clients is *not* an exact GP on the pooled data.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping

import numpy as np
import torch
from numpy.typing import ArrayLike

from ..data import DataError, DataLike, FederatedData, require_target
from ..estimator import BOOL, NONE, Constraint, Estimator, Int, OneOf, Real, is_int
from ..federation import run as federation_run
from ..federation.oneshot import raise_failures
from ..federation.records import excluded_now
from ..fitting import RunOptions, federated_fit
from . import laplace
from ._core import SMALL, HyperSpec, fit_mle_sum, resolve_device, resolve_dtype, small_work
from .fgpr_algorithm import CountShare, FGPRAlgorithm, average_hypers, batch_for, draw_participants, standardize_y
from .fgpr_result import FGPRResult

__all__ = ["FGPR", "FGPRResult", "FGPRAlgorithm", "draw_participants", "average_hypers"]

SAMPLERS = ("uniform", "nearest")
OPTIMIZERS = ("adam", "sgd")
SPACES = ("constrained", "raw", "log")


# --------------------------------------------------------------------------- the model


#: the Newton steps after the rounds when ``newton_steps=None`` (the default) and the Laplace
#: approximation is computed: enough to reach the maximum from the rounds' point in the tests'
#: federations (each one exchange of the summed gradient and Hessian)
NEWTON_STEPS = 5


class FGPR(Estimator):
    """Federated Gaussian process regression: one GP prior learned by federated averaging
    of hyperparameters, personal predictions by conditioning on each client's own data.

    Parameters
    ----------
    kernel : "rbf" or "matern"
        ``ScaleKernel(RBFKernel)`` or ``ScaleKernel(MaternKernel(nu))`` from GPyTorch.
    nu : 0.5, 1.5 or 2.5
        Smoothness of the Matern kernel (the papers use 1.5).
    ard : bool
        One lengthscale per input (ARD) or one for all (the papers' formulas and code).
    mean : "zero" or "constant"
        Zero mean (the papers, with per-client standardised outputs) or a shared constant
        mean, averaged like the other hyperparameters (a deviation from the papers).
    rounds : int
        Communication rounds R (default 100).
    local_steps : int or "epoch"
        Local steps E per round (default 5); ``"epoch"`` takes ``E_k = floor(N_k / M_k)``
        steps on client k, as the published code does.
    batch_size : int or float
        M; client k uses ``M_k = min(M, N_k)`` points per step (all its data, deterministic
        steps, when ``N_k <= M``). Default 64. A float in (0, 1) takes that fraction of each
        client's points, ``M_k = max(2, floor(M N_k))`` (the published 1-D code: 0.2).
    sampler : "uniform" or "nearest"
        Minibatches drawn uniformly without replacement, fresh every step, or the M nearest
        neighbours of a uniformly drawn centre point (the published multi-fidelity code).
    optimizer : "adam" or "sgd"
        Adam (the published code) or plain gradient steps (the theory).
    lr : float
        Step size (default 0.01; the published code uses 0.1 in 1-D examples).
    lr_decay : float or None
        SGD only: ``lr_t = lr / (1 + t / lr_decay)`` with t the client's step count across
        rounds (the theory's O(1/t) schedule); None keeps ``lr`` constant.
    betas : (float, float)
        Adam's moment decays.
    optimizer_state : "fresh" or "persistent"
        A new Adam state every round (the published code) or each client keeping its own
        moments and step count between its rounds (they never leave the client).
    loss_normalization : "mean" or "sum"
        Local loss: NLL of the batch divided by its size (GPyTorch's and the code's
        convention, default) or the plain NLL.
    average_space : "constrained", "raw" or "log"
        Where the server averages: the hyperparameter values (the code, default),
        GPyTorch's raw softplus parameters, or their logarithms (geometric mean).
    participation : float or int
        1.0 (or a count >= K): every client every round, weights N_k/N. An int ``K_s < K`` (or
        a fraction of the clients, rounded up): ``K_s`` clients drawn with replacement with
        probabilities N_k/N each round, plain average counting duplicates (the theory's scheme).
    init : mapping or None
        Starting hyperparameters (constrained values); default log 2 for lengthscale,
        outputscale and noise, 0 for the mean.
    noise_floor, lengthscale_floor, outputscale_floor : float
        Lower bounds of the softplus constraints (defaults 1e-4, 1e-6, 1e-6 as the code).
    standardize : bool
        Each client standardises its own targets with its own mean and sd (the papers);
        predictions are returned in the original units.
    device : "auto", "cpu", "cuda" or torch.device
        ``"auto"`` uses CUDA when present. On the CPU, with batches of at most 512 points, a
        round of 64 or more clients shares their local steps among up to
        ``torch.get_num_threads()`` threads, with the same result for every client as on one
        thread (``torch.set_num_threads(1)`` keeps them on one).
    dtype : "float64" or "float32"
    condition_limit : int or None
        None (default): every client conditions its predictions on all of its points, by
        the exact Cholesky formulas (above 4,096 points the factor is computed in tiles that
        hold half the matrix: about 2 GB and 40 s on two CPU cores at 20,000 points;
        the cost grows as N_k^3 in time and N_k^2 in memory). An int opts in to
        conditioning a larger client on a random subset of this size instead (a warning says
        so). Results saved by versions whose default was 2000 keep that value, and its
        subsets, when loaded; set ``result.options["condition_limit"] = None`` to use all rows.
    newton_steps : int or None
        Up to this many Newton steps on the exact federated objective after the rounds, from
        the clients' summed gradient and Hessian (one exchange each, with step halving; it
        stops once a step is below 1e-3 posterior sd): the rounds' point moved to the
        likelihood's maximum, where the Laplace approximation belongs. None (default): 5
        whenever the Laplace approximation is computed (so its intervals come without a
        warning that the point is off the maximum), none otherwise; 0: none. Needs ``laplace``.
    laplace : bool or None
        Uncertainty of the shared hyperparameters (:mod:`fedstats.gp.laplace`): after the
        rounds, each client sends the gradient and Hessian of its full-data marginal likelihood
        at the fitted hyperparameters once (both summed), and the result holds the Laplace
        approximation ``N(theta_hat, H^{-1})`` on the log scale: ``summary`` gets sds and
        intervals, ``global_posterior`` the approximation, ``predict(hyper_draws=S)`` a
        mixture over hyperparameter draws. None (default): when each client's share needs at
        most 2 GiB (it factorises and inverts its full kernel matrix once: about 5,400 rows
        with one lengthscale, 3,000 with ARD over 20 inputs); True: always; False: never.

    Examples
    --------
    >>> import numpy as np
    >>> from fedstats.data import FederatedData
    >>> from fedstats.gp import FGPR
    >>> x = np.linspace(0, 10, 60)[:, None]
    >>> data = FederatedData.from_arrays([x, x], [np.sin(x[:, 0]), -np.sin(x[:, 0])])
    >>> res = FGPR(rounds=30, lr=0.1, batch_size=20).fit(data)
    >>> pred = res.predict(np.array([[2.5]]), client=1)
    >>> bool(abs(pred["mean"][0] + np.sin(2.5)) < 0.05)
    True
    """

    def __init__(
        self,
        *,
        kernel: str = "rbf",
        nu: float = 1.5,
        ard: bool = False,
        mean: str = "zero",
        rounds: int = 100,
        local_steps: int | str = 5,
        batch_size: int | float = 64,
        sampler: str = "uniform",
        optimizer: str = "adam",
        lr: float = 0.01,
        lr_decay: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        optimizer_state: str = "fresh",
        loss_normalization: str = "mean",
        average_space: str = "constrained",
        participation: int | float = 1.0,
        init: Mapping[str, ArrayLike] | None = None,
        noise_floor: float = 1e-4,
        lengthscale_floor: float = 1e-6,
        outputscale_floor: float = 1e-6,
        standardize: bool = True,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "float64",
        condition_limit: int | None = None,
        newton_steps: int | None = None,
        laplace: bool | None = None,
    ) -> None:
        self.kernel, self.nu, self.ard, self.mean = kernel, nu, ard, mean
        self.rounds, self.local_steps, self.batch_size, self.sampler = rounds, local_steps, batch_size, sampler
        self.optimizer, self.lr, self.lr_decay, self.betas = optimizer, lr, lr_decay, betas
        self.optimizer_state, self.loss_normalization = optimizer_state, loss_normalization
        self.average_space, self.participation, self.init = average_space, participation, init
        self.noise_floor, self.lengthscale_floor, self.outputscale_floor = (
            noise_floor,
            lengthscale_floor,
            outputscale_floor,
        )
        self.standardize, self.device, self.dtype, self.condition_limit = standardize, device, dtype, condition_limit
        self.newton_steps, self.laplace = newton_steps, laplace

    def spec(self, d: int) -> HyperSpec:
        return HyperSpec(
            d=d,
            kernel=self.kernel,
            nu=self.nu,
            ard=self.ard,
            mean=self.mean,
            lengthscale_floor=self.lengthscale_floor,
            outputscale_floor=self.outputscale_floor,
            noise_floor=self.noise_floor,
        )

    _constraints = {
        "kernel": OneOf("rbf", "matern"),
        "ard": BOOL,
        "rounds": Int(1),
        "standardize": BOOL,
        "local_steps": OneOf("epoch") | Int(1),
        # one point cannot separate signal from noise
        "batch_size": Int(2) | Real(0, 1, closed=(False, False)),
        "sampler": OneOf(*SAMPLERS),
        "optimizer": OneOf(*OPTIMIZERS),
        "average_space": OneOf(*SPACES),
        "optimizer_state": OneOf("fresh", "persistent"),
        "loss_normalization": OneOf("mean", "sum"),
        "lr": Real(0, closed=(False, True)),
        "lr_decay": NONE | Real(0, closed=(False, True)),
        "betas": Constraint(
            lambda v: (
                isinstance(v, (tuple, list, np.ndarray))
                and len(v) == 2
                and all(
                    isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and 0 <= x < 1
                    for x in v
                )
            ),
            "two numbers in [0, 1)",
        ),
        "condition_limit": NONE | Int(1),
        "laplace": NONE | BOOL,
        "newton_steps": NONE | Int(0),
        "participation": Int(1) | Real(0, 1, closed=(False, True)),
    }

    def _validate(self, data: DataLike) -> tuple[HyperSpec, dict]:
        self._validate_params()
        if not isinstance(data, FederatedData):
            raise TypeError(f"data must be a fedstats.FederatedData, got {type(data).__name__}")
        spec = self.spec(data.n_features)
        if self.newton_steps is not None and self.newton_steps > 0 and self.laplace is False:
            raise ValueError("FGPR: newton_steps uses the clients' curvature, which laplace=False switches off")
        if self.lr_decay is not None and self.optimizer != "sgd":
            raise ValueError("FGPR: lr_decay applies to optimizer='sgd' only")
        b = tuple(float(x) for x in self.betas)
        small = {c: n for c, n in data.n_obs.items() if n < 2}
        if small:
            c = next(iter(small))
            raise DataError(
                f"client {c!r} has {small[c]} point(s); FGPR needs at least 2 per client "
                f"(a marginal likelihood of one point cannot separate signal from noise)"
            )
        K = len(data.clients)
        p = self.participation  # a count of clients, or a fraction of them (1.0: all)
        if isinstance(p, (float, np.floating)) and p == 1.0:
            k = None
        elif is_int(p):
            k = int(p)
        else:
            k = max(1, math.ceil(round(p * K, 9)))
        if k is not None and k >= K:  # K_s = K is full participation (Algorithm 1 of the paper), not K draws
            k = None
        init = spec.check(self.init, "init") if self.init is not None else spec.default()
        return spec, {
            "participants": k,
            "init": init,
            "device": resolve_device(self.device),
            "dtype": resolve_dtype(self.dtype),
            "betas": b,
        }

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> FGPRResult:
        """Learn the shared hyperparameters from ``data`` (a :class:`~fedstats.data.FederatedData`;
        every client needs at least 2 points). All clients are checked before any training."""
        seed = run.seed
        require_target(data, "FGPR")
        spec, o = self._validate(data)
        t0 = time.perf_counter()
        counts_run = federation_run(CountShare(), data, kind="row counts", rounds=1, seed=seed, progress=False)
        counts = counts_run.server_state
        # in a fit, a client that did not report has dropped out of it (the run recorded why)
        raise_failures(counts_run.history, "FGPR's row counts")
        missing = [c for c in data.clients if c not in counts and c not in excluded_now()]
        if missing or not counts:
            raise RuntimeError(f"client {(missing or data.clients)[0]!r} did not report its number of points")
        biggest = max(batch_for(self.batch_size, n) for n in counts.values())
        # local steps this small run on one torch thread (small_work): clients share the cores instead
        small = o["device"].type == "cpu" and biggest <= SMALL
        alg = FGPRAlgorithm(
            spec,
            init=o["init"],
            counts=counts,
            local_steps=self.local_steps,
            batch_size=self.batch_size,
            sampler=self.sampler,
            optimizer=self.optimizer,
            lr=float(self.lr),
            lr_decay=self.lr_decay,
            betas=o["betas"],
            optimizer_state=self.optimizer_state,
            loss_normalization=self.loss_normalization,
            average_space=self.average_space,
            participants=o["participants"],
            seed=seed,
            standardize=bool(self.standardize),
            device=o["device"],
            dtype=o["dtype"],
            workers=torch.get_num_threads() if small else 1,
        )
        participation = 1.0 if o["participants"] is None else alg.participation
        with small_work(o["device"], biggest):
            out = run.run(alg, data, kind="FGPR rounds", rounds=int(self.rounds), participation=participation)
        failed = {c: why for rec in out.history for c, why in rec.failed.items()}
        if failed and all(len(rec.answered) == 0 for rec in out.history):
            c, why = next(iter(failed.items()))
            raise RuntimeError(f"no client completed a round; e.g. {c!r}: {why}")
        # those that never answered have dropped out of the fit (the result names them)
        failed = {c: why for c, why in failed.items() if c not in excluded_now()}
        if failed:
            c, why = next(iter(failed.items()))
            warnings.warn(
                f"{len(failed)} client(s) failed in some round and were left out of its average; e.g. {c!r}: {why}",
                RuntimeWarning,
                stacklevel=2,
            )
        hyper, curv = self._curvature(spec, out.server_state.hyper, data, counts, seed)
        # converged: at the likelihood's maximum, within 1 posterior sd (_curvature warns otherwise);
        # None where there is no curvature to tell (the rounds are a fixed budget)
        converged = None if isinstance(curv, str) else bool(laplace.newton_offset(curv) <= 1)
        return FGPRResult(
            spec=spec,
            hyperparameters=hyper,
            feature_names=list(data.feature_names),
            clients=list(data.clients),
            n_obs=dict(counts),
            options=self.get_params(),
            history=out.history,
            communication=out.communication,
            converged=converged,
            seconds=time.perf_counter() - t0,
            seed=seed,
            data=data,
            laplace=curv,
        )

    def _curvature(self, spec: HyperSpec, hyper: dict, data: FederatedData, counts: dict, seed: int):
        """After the rounds: the Newton steps and the hyperparameters' curvature exchange (under
        ``laplace`` and ``newton_steps``), with a warning where the result is off the maximum."""
        why = laplace.wanted(self.laplace, counts, spec)
        if why is not None:
            if self.newton_steps:  # asked for by name
                warnings.warn(f"FGPR: newton_steps={self.newton_steps} not taken: {why}", RuntimeWarning, stacklevel=3)
            return hyper, why
        std = bool(self.standardize)
        steps = NEWTON_STEPS if self.newton_steps is None else int(self.newton_steps)
        hyper, curv = laplace.federated_curvature(spec, hyper, data, standardize=std, seed=seed, newton_steps=steps)
        if isinstance(curv, str):
            warnings.warn(curv, RuntimeWarning, stacklevel=3)
            return hyper, curv
        off = laplace.newton_offset(curv)
        if not off <= 1:
            where = (
                "not at a maximum (its Hessian is not positive definite)"
                if np.isnan(off)
                else (f"{off:.1f} posterior sd from the likelihood's maximum (a Newton step would move it that far)")
            )
            fix = (
                f"{steps} Newton steps did not get there (more newton_steps or rounds)"
                if steps
                else "too few rounds, or the drift of the clients' local steps. FGPR(newton_steps=5) (a few "
                "exchanges of one small matrix each) moves them there"
            )
            warnings.warn(
                f"FGPR did not converge to the likelihood's maximum: the fitted hyperparameters are {where}: "
                f"{fix}; summary's intervals are centred at the fitted point",
                RuntimeWarning,
                stacklevel=3,
            )
        return hyper, curv

    def fit_centralized(
        self, data: FederatedData, *, restarts: int = 1, seed: int = 0, max_iter: int = 500
    ) -> FGPRResult:
        """The centralised reference: the same objective ``sum_k p_k L_k / N_k`` (every client's
        full data, standardised as in :meth:`fit`) maximised by L-BFGS on pooled data, from
        ``init`` and ``restarts - 1`` random starts. Same result API; predictions still
        condition each client on its own data; the hyperparameters' Laplace approximation (under
        ``laplace``) is computed from the pooled objective."""
        spec, o = self._validate(data)
        if self.loss_normalization != "mean":
            raise ValueError(
                "fit_centralized optimises sum_k p_k L_k / N_k, the objective of "
                "loss_normalization='mean'; it has no counterpart for 'sum'"
            )
        t0 = time.perf_counter()
        ys = [np.asarray(data[c].y, dtype=float) for c in data.clients]
        ys = [standardize_y(y)[0] for y in ys] if self.standardize else ys
        hyper, _, _ = fit_mle_sum(
            spec,
            [np.asarray(data[c].X) for c in data.clients],
            ys,
            init=o["init"],
            restarts=restarts,
            seed=seed,
            max_iter=max_iter,
            device=o["device"],
            dtype=o["dtype"],
        )
        why = laplace.wanted(self.laplace, data.n_obs, spec)
        return FGPRResult(
            spec=spec,
            hyperparameters=hyper,
            feature_names=list(data.feature_names),
            clients=list(data.clients),
            n_obs=dict(data.n_obs),
            options=self.get_params(),
            seconds=time.perf_counter() - t0,
            seed=seed,
            data=data,
            laplace=why or laplace.pooled_curvature(spec, hyper, data, standardize=bool(self.standardize)),
        )
