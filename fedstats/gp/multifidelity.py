"""Multi-fidelity surrogates with FGPR: fidelity levels as clients (the FGPR paper's Application I).

* :func:`fidelity_data` builds the federation of a test problem: one client per fidelity
  level (the paper's layout: ``"HF"``, ``"MF"``, ``"LF"``) or two per level (the published
  code's layout: ``"HF1"``, ``"HF2"``, ...), with 1,000 uniform test inputs and the noise-free
  high-fidelity truth. Fidelity is not an input: each client only holds (x, y).
* Baselines with the same ``predict`` API: :class:`SeparateGP` (a GP on the high-fidelity
  data alone) and :class:`AR1CoKriging` (Kennedy & O'Hagan's autoregressive model,
  fitted recursively level by level on all the data: centralised).
* :class:`FederatedAR1` (beyond the paper): the same AR1 with one level per client, each
  keeping its outputs; input locations travel down the chain of levels and predictive
  means and variances come back.
* The paper's multi-fidelity table is reproduced by :mod:`fedstats.experiments.multifidelity_paper`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.autograd.function import once_differentiable

from ..data import FederatedData, require_target
from ._core import HyperSpec, band_frame, fit_mle, posterior
from .fgpr import FGPR, FGPRResult
from .fgpr_algorithm import standardise
from .testfunctions import Problem, problem

__all__ = ["MFData", "fidelity_data", "SeparateGP", "AR1CoKriging", "FederatedAR1"]


@dataclass
class MFData:
    """A multi-fidelity federation: ``train`` (one client per level, or two), the test inputs
    (already scaled like the training inputs), the noise-free high-fidelity truth there, and
    the client whose predictions are scored."""

    problem: Problem
    train: FederatedData
    X_test: np.ndarray
    f_test: np.ndarray
    hf_client: str
    levels: dict  # client -> level name ("HF", "MF", "LF")

    def truth_standardized(self) -> np.ndarray:
        """The test truth on the scored client's standardised scale (its own training mean and sd)."""
        _, mu, sd = standardise(np.asarray(self.train[self.hf_client].y))
        return (self.f_test - mu) / sd

    def level_data(self, level: str) -> tuple[np.ndarray, np.ndarray]:
        """All training points of one fidelity level, pooled over its clients."""
        cs = [c for c, lv in self.levels.items() if lv == level]
        return (
            np.vstack([np.asarray(self.train[c].X) for c in cs]),
            np.concatenate([np.asarray(self.train[c].y) for c in cs]),
        )


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

    ``layout="paper"``: one client per level; ``"code"``: two clients per level, each with
    the level's size (the published code). ``sizes`` overrides the paper's sizes per level.
    Inputs are uniform on the box (an equally spaced grid for the 1-D examples) and, with
    ``scale_x`` (default), mapped to [0, 1]^d by the known box (the paper does not say how
    it scales inputs; the published code feeds Borehole and BRANIN raw). The simulators are noise-free.
    """
    prob = name if isinstance(name, Problem) else problem(name, code_compat=code_compat)
    if layout not in ("paper", "code"):
        raise ValueError(f"layout must be 'paper' or 'code', got {layout!r}")
    sizes = {**prob.sizes, **(sizes or {})}
    rng = np.random.default_rng(seed)
    Xs, ys, clients, levels = [], [], [], {}
    copies = 1 if layout == "paper" else 2
    for level, f in prob.levels.items():
        for j in range(copies):
            n = sizes[level]
            if prob.grid:
                X = np.linspace(prob.bounds[0, 0], prob.bounds[0, 1], n)[:, None]
            else:
                X = prob.sample(n, rng)
            c = level if layout == "paper" else f"{level}{j + 1}"
            Xs.append(prob.to_unit(X) if scale_x else X)
            ys.append(f(X))
            clients.append(c)
            levels[c] = level
    Xt = prob.sample(n_test, rng)
    if prob.grid:
        Xt = np.sort(Xt, axis=0)
    ft = prob.levels["HF"](Xt)
    train = FederatedData.from_arrays(Xs, ys, clients=clients)
    return MFData(prob, train, prob.to_unit(Xt) if scale_x else Xt, ft, clients[0], levels)


class SeparateGP:
    """A GP on one data set alone (the high-fidelity level), no communication.

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
        data = FederatedData.from_arrays([X], [np.asarray(y, dtype=float)], clients=["HF"])
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
        hyper, _, _ = fit_mle(spec, X, standardise(np.asarray(y, dtype=float))[0], restarts=self.restarts, seed=seed)
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


class _AR1Options:
    """The options both AR1 models share (see :class:`AR1CoKriging`), checked at construction."""

    def __init__(
        self, *, kernel: str = "rbf", nu: float = 1.5, ard: bool = False, restarts: int = 5, noise_floor: float = 1e-4
    ):
        self.kernel, self.nu, self.ard, self.restarts, self.noise_floor = kernel, nu, ard, restarts, noise_floor
        self.level_spec(1)  # refuses bad options now, not at fit

    def level_spec(self, d: int) -> HyperSpec:
        """The GP prior of every level, on ``d`` inputs."""
        return HyperSpec(d=d, kernel=self.kernel, nu=self.nu, ard=self.ard, noise_floor=self.noise_floor)


class AR1CoKriging(_AR1Options):
    """Autoregressive co-kriging (Kennedy & O'Hagan 2000), recursive form (Le Gratiet):
    ``f_t(x) = rho_t f_{t-1}(x) + delta_t(x)``.

    Centralised: it sees every level. Each level's targets are standardised by their own
    mean and sd; level 1 is an exact GP fitted by maximum likelihood; level t fits rho_t and
    the GP delta_t jointly by maximum likelihood on ``y_t - rho_t mu_{t-1}(X_t)``, where
    ``mu_{t-1}`` is the previous level's posterior mean. Prediction: mean
    ``rho_t mu_{t-1}(x) + mu_delta(x)``, variance ``rho_t^2 var_{t-1}(x) + var_delta(x)``.
    The recursion is the full co-kriging model when each level's design contains the next
    one's (nested designs, Le Gratiet 2013).

    Options: each level's kernel (``kernel`` ``"rbf"`` or ``"matern"`` with smoothness ``nu``,
    ``ard``), the maximum-likelihood starts per level (``restarts``), and ``noise_floor``, the
    smallest noise variance on each level's standardised scale (default 1e-4; lower it for a
    deterministic simulator, whose levels are otherwise smoothed by at least that much noise).
    """

    def fit(self, levels: list[tuple[np.ndarray, np.ndarray]], *, seed: int = 0) -> AR1CoKriging:
        """``levels``: ``(X, y)`` per fidelity, lowest first, highest last."""
        if len(levels) < 2:
            raise ValueError("AR1 co-kriging needs at least two fidelity levels")
        self.levels_, self.fits_ = [], []
        for t, (X, y) in enumerate(levels):
            X = np.asarray(X, dtype=float)
            X = X[:, None] if X.ndim == 1 else X
            ys, mu, sd = standardise(np.asarray(y, dtype=float))
            spec = self.level_spec(X.shape[1])
            feature = None if t == 0 else self._predict(X, t)[0]
            hyper, rho, _ = fit_mle(spec, X, ys, feature=feature, restarts=self.restarts, seed=seed + t)
            resid = ys if feature is None else ys - rho * feature
            self.levels_.append((X, resid, mu, sd))
            self.fits_.append((spec, hyper, rho))
        return self

    def _predict(self, Xs, upto: int):
        """Mean and variance of the standardised level ``upto - 1`` at ``Xs``."""
        mean = var = None
        for t in range(upto):
            X, resid, _, _ = self.levels_[t]
            spec, hyper, rho = self.fits_[t]
            m, v = posterior(spec, hyper, X, resid, Xs, device=torch.device("cpu"), dtype=torch.float64)
            if mean is None or var is None:  # the first level (t == 0)
                mean, var = m, v
            else:
                mean, var = rho * mean + m, rho**2 * var + v
        return mean, var

    @property
    def rho(self) -> list[float]:
        return [r for _, _, r in self.fits_[1:]]

    def level_moments(self, X, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of level ``t`` (0: the lowest) at ``X``, on its standardised scale."""
        Xs = np.asarray(X, dtype=float)
        return self._predict(Xs[:, None] if Xs.ndim == 1 else Xs, t + 1)

    def to_botorch(self) -> Any:
        """The highest-fidelity predictor as a one-output BoTorch ``Model`` (the optional extra
        ``fedstats[bo]``) on the highest level's original scale: ``posterior(X)`` is the joint
        normal of f over the query batch, mean ``rho_T m_{T-1} + m_T`` and covariance
        ``rho_T^2 S_{T-1} + S_T`` level by level (each level an exact ``SingleTaskGP`` on its
        residuals with its fitted hyperparameters, :mod:`fedstats.gp.bo`), differentiable in
        ``X``: ``optimize_acqf`` and the acquisition functions that only ask for posteriors
        work on it (not those that need fantasies: see :mod:`fedstats.gp.bo`).
        ``observation_noise=True`` adds the highest level's noise."""
        from .bo import chain, exact_gp, joint_model, latent, natural

        gps = [exact_gp(spec, hyper, X, resid) for (X, resid, _, _), (spec, hyper, _) in zip(self.levels_, self.fits_)]
        rhos = [0.0] + self.rho
        _, _, mu, sd = self.levels_[-1]
        noise = float(self.fits_[-1][1]["noise"][0])

        def answer(X, observation_noise: bool):
            out = None
            for gp, rho in zip(gps, rhos):
                out = chain(out, rho, latent(gp, X))
            assert out is not None  # at least two levels
            return natural(out[0], out[1], mu, sd, noise if observation_noise else None)

        return joint_model(answer)

    def predict(self, X, *, level: float = 0.95, scale: str = "standardized") -> pd.DataFrame:
        """Highest-fidelity prediction: mean, sd of f and the credible band; ``scale``
        ``"standardized"`` (the highest level's training scale) or ``"original"``."""
        Xs = np.asarray(X, dtype=float)
        Xs = Xs[:, None] if Xs.ndim == 1 else Xs
        mean, var = self._predict(Xs, len(self.levels_))
        if scale == "original":
            _, _, mu, sd = self.levels_[-1]
            mean, var = mu + sd * mean, var * sd**2
        return band_frame(mean, var, level)


def chain_order(data: FederatedData, order, model: str) -> list:
    """``order`` as a list, checked: at least two clients of ``data`` (which must have targets),
    from the lowest fidelity to the highest, for a model with one level per client."""
    require_target(data, model)
    order = list(order)
    if len(order) < 2 or any(c not in data.clients for c in order):
        raise ValueError(f"order must name at least two clients of the data, got {order!r}")
    return order


class _LevelClient:
    """One fidelity level in :class:`FederatedAR1`: holds its own (X, y), its fitted GP and
    its link rho; none of them leaves it. It answers queries ``(X*, mean and variance of the
    level below at X*)`` with its own predictive mean and variance at ``X*``."""

    def __init__(self, X, y, spec: HyperSpec, restarts: int, seed: int):
        self.X, self.spec, self.restarts, self.seed = np.asarray(X, dtype=float), spec, restarts, seed
        self.y, self.mu, self.sd = standardise(np.asarray(y, dtype=float))
        self._gp: Any = None  # its BoTorch model, built on the first query of :meth:`ask`

    def fit(self, lower_mean=None) -> None:
        self.hyper, self.rho, _ = fit_mle(
            self.spec, self.X, self.y, feature=lower_mean, restarts=self.restarts, seed=self.seed
        )
        self.resid = self.y if lower_mean is None else self.y - self.rho * lower_mean

    def answer(self, Xq, lower=None):
        m, v = posterior(self.spec, self.hyper, self.X, self.resid, Xq, device=torch.device("cpu"), dtype=torch.float64)
        return (m, v) if lower is None else (self.rho * lower[0] + m, self.rho**2 * lower[1] + v)

    def ask(self, X: torch.Tensor, lower, final: bool, noise: bool):
        """The joint version of :meth:`answer` for a BoTorch query batch ``X`` (``[..., q, d]``):
        ``(rho m + m_t, rho^2 S + S_t)`` given the level below's ``(m, S)`` (``lower``; None at
        the lowest level), on the original scale at the highest level (``final``, with its
        noise if ``noise``); and ``vjp``, which maps the gradients of a loss with respect to
        that answer to those with respect to ``X`` and ``lower``. The graph between them stays
        here, as the client's outputs, residuals and hyperparameters do."""
        from .bo import chain, exact_gp, latent, natural

        if self._gp is None:
            self._gp = exact_gp(self.spec, self.hyper, self.X, self.resid)
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in (X, *(lower or ()))]
        with torch.enable_grad():
            out = chain(None if lower is None else (leaves[1], leaves[2]), self.rho, latent(self._gp, leaves[0]))
            if final:
                out = natural(out[0], out[1], self.mu, self.sd, float(self.hyper["noise"][0]) if noise else None)

        def vjp(dm: torch.Tensor, dS: torch.Tensor) -> tuple:
            # the graph is kept: a caller may differentiate the same posterior twice
            need = [t for t in leaves if t.requires_grad]
            got = iter(torch.autograd.grad(out, need, (dm, dS), allow_unused=True, retain_graph=True) if need else ())
            return tuple(next(got) if t.requires_grad else None for t in leaves)

        return out[0].detach(), out[1].detach(), vjp


class FederatedAR1(_AR1Options):
    """AR1 co-kriging with one fidelity level per client, beyond the paper.

    Each client keeps its outputs, its GP and its link ``rho_t``. To fit level t, its client
    sends its *inputs* down the chain: level 1 answers with its predictive mean and variance
    there, level 2 adds its own term, and so on up to level t - 1; the client then fits
    ``rho_t`` and its GP ``delta_t`` by maximum likelihood on its own data (the recursive AR1
    of :class:`AR1CoKriging`). A prediction at ``X*`` travels the same chain. What is shared:
    input locations (the higher levels' design points and the query points) downwards, and
    predictive means and variances at them upwards; never outputs or hyperparameters. The
    result equals the centralised :class:`AR1CoKriging` (same fits and options), which the
    tests check; ``communication`` counts the bytes.
    """

    def fit(self, data: FederatedData, order, *, seed: int = 0) -> FederatedAR1:
        """``order``: the clients of ``data`` from the lowest fidelity to the highest."""
        order = chain_order(data, order, "FederatedAR1")
        self.order_ = order
        self.communication = {"bytes_down": 0, "bytes_up": 0}
        self.clients_ = []
        for t, c in enumerate(order):
            X = np.asarray(data[c].X, dtype=float)
            client = _LevelClient(X, data[c].y, self.level_spec(X.shape[1]), self.restarts, seed + t)
            client.fit(None if t == 0 else self._chain(X, t)[0])
            self.clients_.append(client)
        return self

    def _chain(self, Xq, upto: int):
        """Mean and variance of level ``upto - 1`` at ``Xq``: the query goes to each of the
        clients below in turn (inputs down, mean and variance up)."""
        lower = None
        for client in self.clients_[:upto]:
            self.communication["bytes_down"] += Xq.nbytes + (0 if lower is None else 2 * lower[0].nbytes)
            lower = client.answer(Xq, lower)
            self.communication["bytes_up"] += 2 * lower[0].nbytes
        return lower

    @property
    def rho(self) -> list[float]:
        return [c.rho for c in self.clients_[1:]]

    def level_moments(self, X, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of level ``t`` (0: the lowest) at ``X``, on its standardised scale:
        the query goes down the chain of levels 0..t, their moments come up (counted)."""
        Xs = np.asarray(X, dtype=float)
        return self._chain(Xs[:, None] if Xs.ndim == 1 else Xs, t + 1)

    def to_botorch(self) -> Any:
        """The highest-fidelity predictor as a one-output BoTorch ``Model`` (the optional extra
        ``fedstats[bo]``), equal to :meth:`AR1CoKriging.to_botorch` of the same fits, and as
        federated as :meth:`predict`: each ``posterior(X)`` sends the query batch down the
        chain of levels (each adds its term to the joint mean and covariance from below, the
        highest maps them to its original scale), and when an acquisition function is
        differentiated, the gradients with respect to each answer go back down and the
        gradients with respect to the queries come up (each level keeps its own graph:
        :meth:`_LevelClient.ask`). Outputs, residuals, rho and hyperparameters stay on their
        clients; ``communication`` counts every array either way."""
        from .bo import joint_model

        def answer(X, observation_noise: bool):
            lower: tuple = (None, None)
            for t, client in enumerate(self.clients_):
                final = t == len(self.clients_) - 1
                lower = _Ask.apply(X, *lower, client, final, observation_noise and final, self.communication)
            return lower

        return joint_model(answer)

    def predict(self, X, *, level: float = 0.95, scale: str = "standardized") -> pd.DataFrame:
        """Highest-fidelity prediction (same columns and scales as :meth:`AR1CoKriging.predict`)."""
        Xs = np.asarray(X, dtype=float)
        Xs = Xs[:, None] if Xs.ndim == 1 else Xs
        top = self.clients_[-1]  # the highest level asks; its own term is computed locally
        mean, var = top.answer(Xs, self._chain(Xs, len(self.clients_) - 1))
        if scale == "original":
            mean, var = top.mu + top.sd * mean, var * top.sd**2
        return band_frame(mean, var, level)


class _Ask(torch.autograd.Function):
    """One level's answer to a BoTorch query as one exchange with its client: the query batch
    and the level below's joint mean and covariance go down, the client's go up; backward sends
    the gradients with respect to the client's answer down and brings up those with respect to
    the query and the answer below (the client computes them on its own graph)."""

    @staticmethod
    def forward(ctx, X, lm, lS, client, final, noise, comm):
        lower = None if lm is None else (lm, lS)
        m, S, ctx.vjp = client.ask(X, lower, final, noise)
        ctx.comm = comm
        comm["bytes_down"] += sum(t.numel() * t.element_size() for t in (X, lm, lS) if t is not None)
        comm["bytes_up"] += (m.numel() + S.numel()) * m.element_size()
        return m, S

    @staticmethod
    @once_differentiable  # first derivatives only: a clear error for second ones
    def backward(ctx, dm, dS):
        ctx.comm["bytes_down"] += (dm.numel() + dS.numel()) * dm.element_size()
        grads = ctx.vjp(dm, dS)
        ctx.comm["bytes_up"] += sum(g.numel() * g.element_size() for g in grads if g is not None)
        return (*grads, *((None,) * (3 - len(grads))), None, None, None, None)
