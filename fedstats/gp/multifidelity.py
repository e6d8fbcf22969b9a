"""Multi-fidelity surrogates with FGPR: fidelities as clients (the FGPR paper's Application I).

* :func:`fidelity_data` builds the federation of a test problem: one client per fidelity
  fidelity (the paper's layout: ``"HF"``, ``"MF"``, ``"LF"``) or two per fidelity (the published
  code's layout: ``"HF1"``, ``"HF2"``, ...), with 1,000 uniform test inputs and the noise-free
  high-fidelity truth. Fidelity is not an input: each client only holds (x, y).
* Baselines with the same ``predict`` API: :class:`SeparateGP` (a GP on the high-fidelity
  data alone) and :class:`AR1CoKriging` (Kennedy & O'Hagan's autoregressive model,
  fitted recursively fidelity by fidelity on all the data: centralised).
* :class:`FederatedAR1` (beyond the paper): the same AR1 with one fidelity per client, each
  keeping its outputs; input locations travel down the chain of fidelities and predictive
  means and variances come back.
* The paper's multi-fidelity table is reproduced by :mod:`fedstats.experiments.multifidelity_paper`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._deprecation import renamed_attribute, renamed_parameters, warn_renamed
from ..data import DataError, FederatedData, require_target
from ..data.disclosure import NO_RULES
from ..estimator import BOOL, Constraint, Estimator, Int, OneOf, Real
from ..fitting import RunOptions, federated_fit
from ._core import NUS, HyperSpec, fit_mle
from .ar1_result import AR1Fidelity, AR1Result, FederatedAR1Result, ar1_chain
from .chain_fit import ChainFit
from .chain_result import Fidelities, fit_pooled_chain
from .fgpr import FGPR, FGPRResult
from .fgpr_algorithm import standardize_y
from .testfunctions import Problem, problem

__all__ = ["MFData", "fidelity_data", "SeparateGP", "AR1CoKriging", "FederatedAR1", "AR1Result", "FederatedAR1Result"]


@dataclass
class MFData:
    """A multi-fidelity federation: ``train`` (one client per fidelity, or two), the test inputs
    (already scaled like the training inputs), the noise-free high-fidelity truth there, and
    the client whose predictions are scored."""

    problem: Problem
    train: FederatedData
    X_test: np.ndarray
    f_test: np.ndarray
    hf_client: str
    fidelities: dict  # client -> fidelity name ("HF", "MF", "LF")
    levels = renamed_attribute("fidelities")  # the former name, one release

    def truth_standardized(self) -> np.ndarray:
        """The test truth on the scored client's standardised scale (its own training mean and sd)."""
        _, mu, sd = standardize_y(np.asarray(self.train[self.hf_client].y))
        return (self.f_test - mu) / sd

    def fidelity_data(self, fidelity: str) -> tuple[np.ndarray, np.ndarray]:
        """All training points of one fidelity, pooled over its clients."""
        cs = [c for c, lv in self.fidelities.items() if lv == fidelity]
        return (
            np.vstack([np.asarray(self.train[c].X) for c in cs]),
            np.concatenate([np.asarray(self.train[c].y) for c in cs]),
        )

    def level_data(self, fidelity: str) -> tuple[np.ndarray, np.ndarray]:
        """Former name of :meth:`fidelity_data` (one release)."""
        warn_renamed("MFData.level_data", ".fidelity_data")
        return self.fidelity_data(fidelity)


def fidelity_data(
    name: str | Problem,
    *,
    seed: int = 0,
    layout: str = "paper",
    sizes: dict | None = None,
    n_test: int = 1000,
    scale_x: bool = True,
    code_compat: bool = False,
) -> MFData:
    """The federation of one repetition of problem ``name`` (see :mod:`fedstats.gp.testfunctions`).

    ``layout="paper"``: one client per fidelity; ``"code"``: two clients per fidelity, each with
    the fidelity's size (the published code). ``sizes`` overrides the paper's sizes per fidelity.
    Inputs are uniform on the box (an equally spaced grid for the 1-D examples) and, with
    ``scale_x`` (default), mapped to [0, 1]^d by the known box (the paper does not say how
    it scales inputs; the published code feeds Borehole and BRANIN raw). The simulators are noise-free.
    """
    prob = name if isinstance(name, Problem) else problem(name, code_compat=code_compat)
    if layout not in ("paper", "code"):
        raise ValueError(f"layout must be 'paper' or 'code', got {layout!r}")
    sizes = {**prob.sizes, **(sizes or {})}
    rng = np.random.default_rng(seed)
    Xs, ys, clients, fidelities = [], [], [], {}
    copies = 1 if layout == "paper" else 2
    for fidelity, f in prob.fidelities.items():
        for j in range(copies):
            n = sizes[fidelity]
            if prob.grid:
                X = np.linspace(prob.bounds[0, 0], prob.bounds[0, 1], n)[:, None]
            else:
                X = prob.sample(n, rng)
            c = fidelity if layout == "paper" else f"{fidelity}{j + 1}"
            Xs.append(prob.to_unit(X) if scale_x else X)
            ys.append(f(X))
            clients.append(c)
            fidelities[c] = fidelity
    Xt = prob.sample(n_test, rng)
    if prob.grid:
        Xt = np.sort(Xt, axis=0)
    ft = prob.fidelities["HF"](Xt)
    train = FederatedData.from_arrays(Xs, ys, clients=clients, **NO_RULES)
    return MFData(prob, train, prob.to_unit(Xt) if scale_x else Xt, ft, clients[0], fidelities)


class SeparateGP:
    """A GP on one data set alone (the high-fidelity), no communication.

    ``protocol="paper"``: the published code's budget: Adam kept across
    ``rounds`` epochs of ``floor(N / M)`` nearest-neighbour steps from log 2 (a one-client
    FGPR with a persistent optimiser state). ``"converged"``: exact maximum likelihood by
    L-BFGS (``restarts`` starts); predictions then condition on all of its points exactly.
    """

    def __init__(
        self,
        *,
        protocol: str = "paper",
        kernel: str = "rbf",
        nu: float = 1.5,
        ard: bool = False,
        lr: float = 0.01,
        rounds: int = 200,
        batch_size=None,
        restarts: int = 5,
    ):
        if protocol not in ("paper", "converged"):
            raise ValueError(f"protocol must be 'paper' or 'converged', got {protocol!r}")
        self.protocol, self.kernel, self.nu, self.ard, self.lr, self.rounds = protocol, kernel, nu, ard, lr, rounds
        self.batch_size, self.restarts = batch_size, restarts

    def fit(self, X, y, *, seed: int = 0) -> FGPRResult:
        X = np.asarray(X, dtype=float)
        X = X[:, None] if X.ndim == 1 else X
        data = FederatedData.from_arrays([X], [np.asarray(y, dtype=float)], clients=["HF"], **NO_RULES)
        if self.protocol == "paper":
            M = len(y) if self.batch_size is None else self.batch_size
            return FGPR(
                kernel=self.kernel,
                nu=self.nu,
                ard=self.ard,
                rounds=self.rounds,
                local_steps="epoch",
                batch_size=M,
                sampler="nearest",
                optimizer="adam",
                lr=self.lr,
                optimizer_state="persistent",
                device="cpu",
                laplace=False,  # the paper's protocol: predictions only
            ).fit(data, seed=seed, progress=False)
        spec = HyperSpec(d=X.shape[1], kernel=self.kernel, nu=self.nu, ard=self.ard)
        hyper, _, _ = fit_mle(spec, X, standardize_y(np.asarray(y, dtype=float))[0], restarts=self.restarts, seed=seed)
        return FGPRResult(
            spec=spec,
            hyperparameters=hyper,
            feature_names=data.feature_names,
            clients=["HF"],
            n_obs=data.n_obs,
            options={"standardize": True, "device": "cpu"},
            seed=seed,
            data=data,
        )


class _AR1Options(Estimator):
    """The options both AR1 models share (see :class:`AR1CoKriging`), checked when ``fit`` starts."""

    _constraints = {
        "kernel": OneOf("rbf", "matern"),
        "nu": Constraint(lambda v: Real().check(v) and float(v) in NUS, "one of 0.5, 1.5, 2.5"),
        "ard": BOOL,
        "restarts": Int(1),
        "noise_floor": Real(0),
    }

    def __init__(
        self, *, kernel: str = "rbf", nu: float = 1.5, ard: bool = False, restarts: int = 5, noise_floor: float = 1e-4
    ) -> None:
        self.kernel, self.nu, self.ard, self.restarts, self.noise_floor = kernel, nu, ard, restarts, noise_floor

    def fidelity_spec(self, d: int, t: int = 0) -> HyperSpec:
        """The GP prior of every fidelity (fidelity ``t``'s is the same), on ``d`` inputs."""
        return HyperSpec(d=d, kernel=self.kernel, nu=self.nu, ard=self.ard, noise_floor=self.noise_floor)


class AR1CoKriging(_AR1Options):
    """Autoregressive co-kriging (Kennedy & O'Hagan 2000), recursive form (Le Gratiet):
    ``f_t(x) = rho_t f_{t-1}(x) + delta_t(x)``.

    Centralised: it sees every fidelity. Each fidelity's targets are standardised by their own
    mean and sd; fidelity 1 is an exact GP fitted by maximum likelihood; fidelity t fits rho_t and
    the GP delta_t jointly by maximum likelihood on ``y_t - rho_t mu_{t-1}(X_t)``, where
    ``mu_{t-1}`` is the previous fidelity's posterior mean. Prediction: mean
    ``rho_t mu_{t-1}(x) + mu_delta(x)``, variance ``rho_t^2 var_{t-1}(x) + var_delta(x)``.
    The recursion is the full co-kriging model when each fidelity's design contains the next
    one's (nested designs, Le Gratiet 2013). :meth:`fit` returns an
    :class:`~fedstats.gp.ar1_result.AR1Result`: predictions, ``rho`` and ``summary()`` on the
    data's scale (the mapping from the standardised fit is in :mod:`fedstats.gp.ar1_result`).

    Options: each fidelity's kernel (``kernel`` ``"rbf"`` or ``"matern"`` with smoothness ``nu``,
    ``ard``), the maximum-likelihood starts per fidelity (``restarts``), and ``noise_floor``, the
    smallest noise variance on each fidelity's standardised scale (default 1e-4; lower it for a
    deterministic simulator, whose fidelities are otherwise smoothed by at least that much noise).

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.gp.multifidelity import AR1CoKriging
    >>> from fedstats.gp.testfunctions import FORRESTER_DESIGN, forrester_hf, forrester_lf
    >>> x_lo, x_hi = FORRESTER_DESIGN["LF"], FORRESTER_DESIGN["HF"]
    >>> res = AR1CoKriging(restarts=2).fit({"LF": (x_lo, forrester_lf(x_lo)), "HF": (x_hi, forrester_hf(x_hi))})
    >>> res.predict(np.array([0.1, 0.75]))[["mean", "lower", "upper"]].round(1)  # truth -0.66, -6.0
       mean  lower  upper
    0  -0.6   -0.8   -0.4
    1  -6.0   -6.1   -5.8
    >>> round(res.rho[0], 1)  # the data's scale: f_HF = 2 f_LF - 20 (x - 0.5) + 10
    2.0
    """

    @renamed_parameters(levels="fidelities")
    def fit(self, fidelities: Fidelities, *, seed: int = 0) -> AR1Result:
        """``fidelities``: ``(X, y)`` per fidelity, lowest first, highest last (a list, or a dict
        ``name -> (X, y)`` that names them; a list's fidelities are ``fidelity0``, ``fidelity1``, ...)."""
        return fit_pooled_chain(self, AR1Result, fidelities, seed, "AR1 co-kriging")

    def _fidelity(self, X: np.ndarray, y: np.ndarray, t: int, seed: int) -> AR1Fidelity:
        return AR1Fidelity(X, y, self.fidelity_spec(X.shape[1]), restarts=self.restarts, seed=seed + t)

    def _lower(self, fitted: list[AR1Fidelity], X: np.ndarray, t: int, seed: int) -> np.ndarray:
        """The mean of the fidelities below ``t`` at ``X`` (the input of fidelity t's link)."""
        return ar1_chain(fitted, X, t)[0]


def chain_order(data: FederatedData, order: Sequence[Hashable] | None, model: str) -> list:
    """``order`` as a list, checked: at least two clients of ``data`` (which must have targets),
    from the lowest fidelity to the highest, for a model with one fidelity per client (``None``:
    the data's clients in their order)."""
    require_target(data, model)
    order = list(data.clients if order is None else order)
    if len(order) < 2 or any(c not in data.clients for c in order):
        raise ValueError(f"order must name at least two clients of the data, got {order!r}")
    if len(set(order)) != len(order):
        raise ValueError(f"order names a client twice: {order!r}")
    few = {c: data.n_obs[c] for c in order if data.n_obs[c] < 2}
    if few:  # every fidelity is needed: a chain cannot leave one out
        raise DataError(f"every fidelity needs at least 2 rows; too few at {few} ({model} needs each fidelity)")
    return order


class FederatedAR1(_AR1Options):
    """AR1 co-kriging with one fidelity per client, beyond the paper.

    Each client keeps its outputs, its GP and its link ``rho_t``. To fit fidelity t, its client
    sends its *inputs* down the chain: fidelity 1 answers with its predictive mean and variance
    there, fidelity 2 adds its own term, and so on up to fidelity t - 1; the client then fits
    ``rho_t`` and its GP ``delta_t`` by maximum likelihood on its own data (the recursive AR1
    of :class:`AR1CoKriging`). A prediction at ``X*`` travels the same chain. What is shared
    during the fit: input locations (the higher fidelities' design points) downwards, and
    predictive means and variances at them upwards, never outputs; at its end each fidelity
    releases its fitted parameters (hyperparameters and link on its standardised scale, and the
    mean and sd of its outputs: a few numbers per fidelity) so that the result reports the model on
    the data's scale (``summary``, ``rho``). The result equals the centralised
    :class:`AR1CoKriging` (same fits and options), which the tests check; its
    ``communication`` counts the bytes of the fit, ``query_communication`` those of later
    queries (see :class:`~fedstats.gp.ar1_result.FederatedAR1Result`, also for what a result
    loaded from a file can do).
    """

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions, order: Sequence[Hashable] | None = None) -> FederatedAR1Result:
        """``order``: the clients of ``data`` from the lowest fidelity to the highest (default:
        the data's order). One run of the runtime (:class:`~fedstats.gp.chain_fit.ChainFit`);
        ``checkpoint`` and ``resume`` as every model's (the run's rounds are the chain's steps)."""
        return fit_chain(self, "ar1", FederatedAR1Result, data, run, order)


def fit_chain(
    model: Any, kind: str, result: type, data: FederatedData, run: RunOptions, order: Sequence[Hashable] | None
) -> Any:
    """The fit of a federated chain of fidelities (``kind`` ``"ar1"`` or ``"nargp"``): one
    run of :class:`~fedstats.gp.chain_fit.ChainFit` over the clients of ``order``, and its
    ``result``."""
    order = chain_order(data, order, type(model).__name__)
    params = model.get_params()
    specs = [model.fidelity_spec(data.n_features, t) for t in range(len(order))]
    algorithm = ChainFit(kind, order, specs, params["restarts"], run.seed, samples=params.get("samples", 0))
    clients = data.subset(order)
    out = run.run(algorithm, clients, rounds=len(algorithm.plan), kind="chain", participation=algorithm.schedule())
    return result(
        fidelities=algorithm.released(out.server_state),
        data=data,
        names=order,
        feature_names=list(data.feature_names),
        options=params,
        seed=run.seed,
        communication=out.communication,
        history=out.history,
    )
