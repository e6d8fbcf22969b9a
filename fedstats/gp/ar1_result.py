"""The results of the AR1 multi-fidelity models (:class:`AR1Result` of
:class:`~fedstats.gp.multifidelity.AR1CoKriging`, :class:`FederatedAR1Result` of
:class:`~fedstats.gp.multifidelity.FederatedAR1`) and their fidelities (:class:`AR1Fidelity`).

The scales. Each fidelity t is fitted on its outputs standardised by their own mean and sd,
``z_t = (y_t - m_t) / s_t``, as ``z_t(x) = r_t z_{t-1}(x) + d_t(x)`` with ``d_t`` a zero-mean GP
(outputscale ``a_t``, noise ``v_t``, lengthscales ``l_t``). On the data's scale that is

    ``f_t(x) = rho_t f_{t-1}(x) + c_t + delta_t(x)``,
    ``rho_t = r_t s_t / s_{t-1}``, ``c_t = m_t - rho_t m_{t-1}``,

with ``delta_t = s_t d_t`` a zero-mean GP of outputscale ``s_t^2 a_t``, noise ``s_t^2 v_t`` and the
same lengthscales (the inputs are not rescaled); the lowest fidelity is ``f_1 = m_1 + s_1 d_1``.
These are what ``summary()`` and :attr:`AR1Result.rho` / :attr:`AR1Result.offset` report (the
value as fitted, on the standardised scales, in the column ``standardized``). An affine change
of units of fidelity t's outputs, ``y -> a y + b`` with ``a > 0``, leaves the standardised fit
unchanged, multiplies ``rho_t`` by ``a`` and divides ``rho_{t+1}`` by it, as the formulas say.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch.autograd.function import once_differentiable

from ..data import FederatedData, UnknownClientError
from ..result_file import register
from ._core import HyperSpec, fit_mle, posterior
from .chain_result import ChainFidelity, ChainResult, FederatedChain, Wire, check_queries

__all__ = ["AR1Fidelity", "AR1Result", "FederatedAR1Result", "ar1_chain"]

Moments = tuple[np.ndarray, np.ndarray]


@register
class AR1Fidelity(ChainFidelity):
    """One fidelity of an AR1 fit (:class:`~fedstats.gp.chain_result.ChainFidelity`): its GP
    prior, hyperparameters and link ``rho`` (0 at the lowest fidelity), both on its
    standardised scale, and, where the holder keeps them, its rows and the residuals ``resid``
    its GP conditions on. A released fidelity (:meth:`released`) has no ``X``, ``z`` or
    ``resid``."""

    _rows = ("X", "z", "resid")
    _link = ("rho",)
    _transient = ("_gp",)  # its BoTorch model, built on the first BoTorch query

    def __init__(self, X: ArrayLike, y: ArrayLike, spec: HyperSpec, *, restarts: int = 1, seed: int = 0) -> None:
        super().__init__(X, y, spec, restarts=restarts, seed=seed)
        self.rho = 0.0
        self.resid: np.ndarray | None = None
        self._gp: Any = None

    def fit(self, lower_mean: np.ndarray | None = None) -> AR1Fidelity:
        """Maximum likelihood of the fidelity's GP (and of ``rho`` on the fidelity below's posterior
        mean at its inputs, ``lower_mean``; None at the lowest fidelity)."""
        self.hyper, rho, _ = fit_mle(
            self.spec, self.X, self.z, feature=lower_mean, restarts=self.restarts, seed=self.seed
        )
        self.rho = 0.0 if lower_mean is None else float(rho)
        self._condition(lower_mean)
        return self

    def _condition(self, lower_mean: np.ndarray | None) -> None:
        self.resid = self.z if lower_mean is None else self.z - self.rho * lower_mean
        self._gp = None

    def answer(self, Xq: np.ndarray, lower: Moments | None = None) -> Moments:
        """The fidelity's mean and latent variance at ``Xq`` on its standardised scale, given the
        fidelity below's there (``lower``; None at the lowest fidelity): ``rho m + m_t``,
        ``rho^2 v + v_t``."""
        if self.X is None or self.resid is None:
            raise ValueError("a released fidelity holds no rows: it cannot answer queries")
        m, v = posterior(self.spec, self.hyper, self.X, self.resid, Xq, device=torch.device("cpu"), dtype=torch.float64)
        return (m, v) if lower is None else (self.rho * lower[0] + m, self.rho**2 * lower[1] + v)

    def gp(self) -> Any:
        """The fidelity's own term as a BoTorch ``SingleTaskGP`` on its residuals (cached)."""
        from .bo import exact_gp

        if self._gp is None:
            self._gp = exact_gp(self.spec, self.hyper, self.X, self.resid)
        return self._gp

    def ask(self, X: torch.Tensor, lower, final: bool, noise: bool):
        """The joint version of :meth:`answer` for a BoTorch query batch ``X`` (``[..., q, d]``):
        ``(rho m + m_t, rho^2 S + S_t)`` given the fidelity below's ``(m, S)`` (``lower``; None at
        the lowest fidelity), on the data's scale at the highest fidelity (``final``, with its
        noise if ``noise``); and ``vjp``, which maps the gradients of a loss with respect to
        that answer to those with respect to ``X`` and ``lower``. The graph between them stays
        with the fidelity, as its outputs, residuals and hyperparameters do."""
        from .bo import chain, latent, natural

        gp = self.gp()
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in (X, *(lower or ()))]
        with torch.enable_grad():
            out = chain(None if lower is None else (leaves[1], leaves[2]), self.rho, latent(gp, leaves[0]))
            if final:
                out = natural(out[0], out[1], self.mu, self.sd, float(self.hyper["noise"][0]) if noise else None)

        def vjp(dm: torch.Tensor, dS: torch.Tensor) -> tuple:
            # the graph is kept: a caller may differentiate the same posterior twice
            need = [t for t in leaves if t.requires_grad]
            got = iter(torch.autograd.grad(out, need, (dm, dS), allow_unused=True, retain_graph=True) if need else ())
            return tuple(next(got) if t.requires_grad else None for t in leaves)

        return out[0].detach(), out[1].detach(), vjp


def ar1_chain(
    fidelities: Sequence[AR1Fidelity],
    Xq: np.ndarray,
    upto: int,
    wire: Wire | None = None,
    names: Sequence[Hashable] = (),
    kind: str = "",
    asker: int | None = None,
) -> Moments:
    """Mean and latent variance of fidelity ``upto - 1`` at ``Xq`` on its standardised scale, the
    fidelities ``0..upto-1`` in turn. With ``wire`` (a federated chain), each fidelity but the asking
    one (``asker``, which computes its own term) is an exchange with its client: the queries and
    the moments from below go down, its moments come up."""
    lower: Moments | None = None
    for t, lv in enumerate(fidelities[:upto]):
        if wire is not None and t != asker:
            wire.exchange(names[t], kind)
            wire.send(names[t], "down", "queries", Xq, kind)
            for a in lower or ():
                wire.send(names[t], "down", "moments from below", a, kind)
        lower = lv.answer(Xq, lower)
        if wire is not None and t != asker:
            for a in lower:
                wire.send(names[t], "up", "moments", a, kind)
    assert lower is not None
    return lower


@register
class AR1Result(ChainResult):
    """A fitted :class:`~fedstats.gp.multifidelity.AR1CoKriging` (centralised): every fidelity's
    fitted state with its rows (:class:`AR1Fidelity`), so :meth:`save` writes every fidelity's inputs
    and standardised residuals: the file holds the training data's information, as a pooled
    fit's does. ``predict`` (the highest fidelity), ``fidelity_moments``, ``summary`` and ``rho``
    are on the data's scale by default (see :mod:`fedstats.gp.ar1_result` for the mapping).

    ``summary()``: one row per parameter, lowest fidelity first: ``mean[L]`` (the lowest fidelity's
    constant mean), ``rho[L]`` and ``offset[L]`` (the link ``f_t = rho f_{t-1} + offset +
    delta_t``), then each fidelity's ``lengthscale[L]`` (``lengthscale[L, x]`` under ARD),
    ``outputscale[L]`` and ``noise[L]`` (variances of its own term on the data's scale);
    ``mean``/``estimate`` on the data's scale, ``standardized`` as fitted, no sd or interval.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.gp.multifidelity import AR1CoKriging
    >>> x_lo, x_hi = np.linspace(0, 1, 11), np.array([0.0, 0.4, 0.6, 1.0])
    >>> f = lambda x: (6 * x - 2) ** 2 * np.sin(12 * x - 4)
    >>> res = AR1CoKriging(restarts=1).fit({"LF": (x_lo, 0.5 * f(x_lo) + 10 * x_lo), "HF": (x_hi, f(x_hi))})
    >>> round(res.rho[0], 1)  # f_HF = 2 f_LF - 20 x: rho 2 on the data's scale
    2.0
    >>> list(res.predict(np.array([0.75])).columns[:5])
    ['mean', 'lower', 'upper', 'pred_lower', 'pred_upper']
    """

    model = "AR1CoKriging"

    def _moments(self, Xs: np.ndarray, t: int, kind: str) -> Moments:
        return ar1_chain(self.fidelities, Xs, t + 1)

    @property
    def rho(self) -> list[float]:
        """The links ``rho_t`` of the fidelities above the lowest, on the data's scale
        (``r_t s_t / s_{t-1}``)."""
        return [lv.rho * lv.sd / lo.sd for lo, lv in zip(self.fidelities[:-1], self.fidelities[1:])]

    @property
    def offset(self) -> list[float]:
        """The constants ``c_t = m_t - rho_t m_{t-1}`` of the fidelities above the lowest (the prior
        mean of ``f_t - rho_t f_{t-1}`` on the data's scale)."""
        return [lv.mu - r * lo.mu for lo, lv, r in zip(self.fidelities[:-1], self.fidelities[1:], self.rho)]

    def _fidelity_rows(self, t: int) -> list[tuple[str, float, float]]:
        name, lv = self.names[t], self.fidelities[t]
        if t == 0:
            rows = [(f"mean[{name}]", lv.mu, 0.0)]
        else:
            rows = [(f"rho[{name}]", self.rho[t - 1], lv.rho), (f"offset[{name}]", self.offset[t - 1], 0.0)]
        ls = np.asarray(lv.hyper["lengthscale"], dtype=float).reshape(-1)
        rows += [(label, float(v), float(v)) for label, v in zip(self._lengthscale_labels(t), ls)]
        for p in ("outputscale", "noise"):
            v = float(lv.hyper[p][0])
            rows.append((f"{p}[{name}]", lv.sd**2 * v, v))
        return rows

    def to_botorch(self) -> Any:
        """The highest-fidelity predictor as a one-output BoTorch ``Model`` (the optional extra
        ``fedstats[bo]``) on the highest fidelity's data scale: ``posterior(X)`` is the joint
        normal of f over the query batch, mean ``rho_T m_{T-1} + m_T`` and covariance
        ``rho_T^2 S_{T-1} + S_T`` fidelity by fidelity (each fidelity an exact ``SingleTaskGP`` on its
        residuals with its fitted hyperparameters, :mod:`fedstats.gp.bo`), differentiable in
        ``X``: ``optimize_acqf`` and the acquisition functions that only ask for posteriors
        work on it (not those that need fantasies: see :mod:`fedstats.gp.bo`).
        ``observation_noise=True`` adds the highest fidelity's noise."""
        from .bo import chain, joint_model, latent, natural

        gps = [lv.gp() for lv in self.fidelities]
        rhos = [lv.rho for lv in self.fidelities]
        top = self.fidelities[-1]
        noise = float(top.hyper["noise"][0])

        def answer(X, observation_noise: bool):
            out = None
            for gp, rho in zip(gps, rhos):
                out = chain(out, rho, latent(gp, X))
            assert out is not None  # at least two fidelities
            return natural(out[0], out[1], top.mu, top.sd, noise if observation_noise else None)

        return joint_model(answer)


@register
class FederatedAR1Result(FederatedChain, AR1Result):
    """A fitted :class:`~fedstats.gp.multifidelity.FederatedAR1`: one fidelity per client.

    What the result holds: each fidelity's release at the end of the fit (:class:`AR1Fidelity`
    without rows: its hyperparameters and link on its standardised scale, and the mean and sd
    of its outputs, from which ``summary``, ``rho`` and ``offset`` are on the data's scale), the
    order, options and ``communication`` of the fit (one run of the runtime:
    :mod:`fedstats.gp.chain_fit`). Each fidelity's rows, residuals and GP stay with its client (in
    this in-process simulation, the federation the result was fitted on, from which each fidelity
    rebuilds its GP on the first query, counted as ``"rebuild"``; never written to a file).

    Queries travel the chain: ``predict``, ``fidelity_moments`` and ``to_botorch`` send the query
    points down to the fidelities below the asking (highest) fidelity and their predictive moments
    come back, counted in ``query_communication`` (and in any open
    :func:`~fedstats.federation.counting` block); ``messages`` logs every array's
    ``(client, direction, what, shape)``.

    A result loaded from a file has no clients: ``summary``, ``rho`` and ``communication`` work,
    queries raise until :meth:`~fedstats.gp.chain_result.FederatedChain.attach` hands it the
    federation again; each fidelity then rebuilds its fitted GP from its own rows and its release,
    without refitting, and the predictions equal those before saving exactly. (In a deployment
    each client would keep its own fidelity; queries after the fit run in process only.)
    """

    model = "FederatedAR1"
    federated = True

    def _moments(self, Xs: np.ndarray, t: int, kind: str) -> Moments:
        clients = self._live()
        with self._query() as wire:
            return ar1_chain(clients, Xs, t + 1, wire, self.names, kind, asker=len(clients) - 1)

    def _rebuild(self, data: FederatedData) -> list[AR1Fidelity]:
        """Each fidelity rebuilt by its client from its own rows of ``data`` and its release (the
        residuals from the chain below, as in the fit); rows other than the fit's are refused."""
        rows = [_client_rows(data, name, self.d) for name in self.names]
        own = [
            AR1Fidelity(X, y, rel.spec, restarts=rel.restarts, seed=rel.seed).check_rows(rel, name)
            for (X, y), name, rel in zip(rows, self.names, self.fidelities)
        ]
        clients: list[AR1Fidelity] = []
        with self._query() as wire:
            for t, (name, rel, lv) in enumerate(zip(self.names, self.fidelities, own)):
                lower = None if t == 0 else ar1_chain(clients, lv.X, t, wire, self.names, "rebuild", asker=t)[0]
                clients.append(lv.restore(rel, lower, name))
        return clients

    def to_botorch(self) -> Any:
        """The highest-fidelity predictor as a one-output BoTorch ``Model`` (the optional extra
        ``fedstats[bo]``), equal to :meth:`AR1Result.to_botorch` of the same fits, and as
        federated as :meth:`predict`: each ``posterior(X)`` sends the query batch down the
        chain of fidelities (each adds its term to the joint mean and covariance from below, the
        highest maps them to its data scale), and when an acquisition function is
        differentiated, the gradients with respect to each answer go back down and the
        gradients with respect to the queries come up (each fidelity keeps its own graph:
        :meth:`AR1Fidelity.ask`). Outputs, residuals, rho and hyperparameters stay on their
        clients; ``query_communication`` counts every array either way (kinds ``"BoTorch
        posterior"`` and ``"BoTorch gradients"``)."""
        from .bo import joint_model

        clients = self._live()

        def answer(X, observation_noise: bool):
            lower: tuple = (None, None)
            for t, (name, client) in enumerate(zip(self.names, clients)):
                final = t == len(clients) - 1
                lower = _Ask.apply(X, *lower, client, final, observation_noise and final, self._counter(name))
            return lower

        return joint_model(answer)

    def _counter(self, name: str):
        def count(kind: str, direction: str, what: str, arrays: Sequence[torch.Tensor]) -> None:
            with self._query() as wire:
                if direction == "down":
                    wire.exchange(name, kind)
                for a in arrays:
                    wire.send(name, direction, what, a, kind)

        return count


def _client_rows(data: FederatedData, name: str, d: int) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(data, FederatedData):
        raise TypeError(f"data must be the FederatedData the result was fitted on, got {type(data).__name__}")
    if name not in data.clients:
        raise UnknownClientError(f"the data has no client {name!r}, a fidelity of the fit (clients {data.clients})")
    X = check_queries(np.asarray(data[name].X), d)
    return X, np.asarray(data[name].y, dtype=float)


class _Ask(torch.autograd.Function):
    """One fidelity's answer to a BoTorch query as one exchange with its client: the query batch
    and the fidelity below's joint mean and covariance go down, the client's go up; backward sends
    the gradients with respect to the client's answer down and brings up those with respect to
    the query and the answer below (the client computes them on its own graph)."""

    @staticmethod
    def forward(ctx, X, lm, lS, client, final, noise, count):
        lower = None if lm is None else (lm, lS)
        m, S, ctx.vjp = client.ask(X, lower, final, noise)
        ctx.count = count
        count("BoTorch posterior", "down", "queries and moments from below", [t for t in (X, lm, lS) if t is not None])
        count("BoTorch posterior", "up", "moments", [m, S])
        return m, S

    @staticmethod
    @once_differentiable  # first derivatives only: a clear error for second ones
    def backward(ctx, dm, dS):
        ctx.count("BoTorch gradients", "down", "gradients", [dm, dS])
        grads = ctx.vjp(dm, dS)
        ctx.count("BoTorch gradients", "up", "gradients", [g for g in grads if g is not None])
        return (*grads, *((None,) * (3 - len(grads))), None, None, None, None)
