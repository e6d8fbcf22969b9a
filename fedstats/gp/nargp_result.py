"""The results of the NARGP models (:class:`NARGPResult` of :class:`~fedstats.gp.nargp.NARGP`,
:class:`FederatedNARGPResult` of :class:`~fedstats.gp.nargp.FederatedNARGP`), their fidelities
(:class:`NARGPFidelity`) and the propagation of paths through them (see :mod:`fedstats.gp.nargp`).

The scales. Fidelity t is a GP fitted on its outputs standardised by their own mean and sd,
``z_t = (y_t - m_t) / s_t``; above the lowest fidelity its inputs are ``(x, z_{t-1})``, the fidelity
below's prediction on *its* standardised scale. On the data's scale that is a GP of mean
``m_t``, outputscale ``s_t^2 a_t`` and noise ``s_t^2 v_t`` in ``(x, f_{t-1})``, with the
lengthscales of ``x`` as fitted and that of ``f_{t-1} = m_{t-1} + s_{t-1} z_{t-1}`` multiplied by
``s_{t-1}`` (a stationary kernel only sees differences): what ``summary()`` reports (the values
as fitted in the column ``standardized``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch
from numpy.typing import ArrayLike

from .. import streams
from ..data import FederatedData
from ..result_file import register
from ._core import HyperSpec, fit_mle, mixture, posterior
from .ar1_result import _client_rows
from .chain_result import ChainFidelity, ChainResult, FederatedChain, Wire

__all__ = ["NARGPFidelity", "NARGPResult", "FederatedNARGPResult", "mixture", "nargp_chain"]


Paths = tuple[np.ndarray, np.ndarray]  # means and variances, (paths, points) each


@register
class NARGPFidelity(ChainFidelity):
    """One fidelity of a NARGP fit (:class:`~fedstats.gp.chain_result.ChainFidelity`): its
    GP's prior on ``(x, z_{t-1})`` above the lowest fidelity, its hyperparameters and index
    ``t``, and, where the holder keeps them, its rows and the GP's inputs ``Z`` (``X`` with the
    fidelity below's mean there). A released fidelity (:meth:`released`) has no ``X``, ``Z`` or
    ``z``."""

    _rows = ("X", "Z", "z")

    def __init__(
        self, X: ArrayLike, y: ArrayLike, t: int, spec: HyperSpec, *, restarts: int = 1, seed: int = 0
    ) -> None:
        super().__init__(X, y, spec, restarts=restarts, seed=seed)
        self.t = int(t)
        self.Z: np.ndarray | None = None

    def _condition(self, lower_mean: np.ndarray | None) -> None:
        self.Z = self.X if lower_mean is None else np.column_stack([self.X, lower_mean])

    def fit(self, lower_mean: np.ndarray | None) -> NARGPFidelity:
        """Maximum likelihood of the fidelity's GP on ``(x, lower_mean)`` (the fidelity below's
        mixture mean at its inputs; ``x`` alone at the lowest fidelity)."""
        self._condition(lower_mean)
        assert self.Z is not None  # _condition sets it
        self.hyper, _, _ = fit_mle(self.spec, self.Z, self.z, restarts=self.restarts, seed=self.seed)
        return self

    def inputs(self, Xq: np.ndarray, lower: Paths | None, samples: int, seed: int) -> np.ndarray:
        """The GP's inputs at the queries: ``Xq`` itself at fidelity 1; above, ``Xq`` with one draw
        of the lower fidelity per path appended (``(paths * n, d + 1)``, path by path)."""
        if lower is None:
            return Xq
        M, V = lower
        # point i's draws are the i-th block of ``samples`` normals of the stream: the same for
        # a point whatever follows it in the batch
        eps = streams.stream(seed, "nargp draws", self.t).standard_normal((len(Xq), samples)).T
        f = M + np.sqrt(np.maximum(V, 0.0)) * eps  # (samples, n): one path per row
        return np.column_stack([np.tile(Xq, (samples, 1)), f.reshape(-1)])

    def answer(self, Xq: np.ndarray, lower: Paths | None, samples: int, seed: int) -> Paths:
        """This fidelity's predictive means and variances along each path, ``(paths, n)`` each (one
        path at fidelity 1, whose predictive is exact), on its standardised scale."""
        if self.Z is None or self.z is None:
            raise ValueError("a released fidelity holds no rows: it cannot answer queries")
        Zq = self.inputs(Xq, lower, samples, seed)
        m, v = posterior(self.spec, self.hyper, self.Z, self.z, Zq, device=torch.device("cpu"), dtype=torch.float64)
        return m.reshape(-1, len(Xq)), v.reshape(-1, len(Xq))


def nargp_chain(
    fidelities: Sequence[NARGPFidelity],
    Xq: np.ndarray,
    upto: int,
    samples: int,
    seed: int,
    wire: Wire | None = None,
    names: Sequence[Hashable] = (),
    kind: str = "",
    asker: int | None = None,
) -> Paths:
    """The paths of fidelity ``upto - 1`` at ``Xq``, the fidelities ``0..upto-1`` in turn. With
    ``wire`` (a federated chain), each fidelity but the asking one (``asker``) is an exchange with
    its client: the queries and the paths from below go down, its paths come up."""
    lower: Paths | None = None
    for t, lv in enumerate(fidelities[:upto]):
        if wire is not None and t != asker:
            wire.exchange(names[t], kind)
            wire.send(names[t], "down", "queries", Xq, kind)
            for a in lower or ():
                wire.send(names[t], "down", "moments from below", a, kind)
        lower = lv.answer(Xq, lower, samples, seed)
        if wire is not None and t != asker:
            for a in lower:
                wire.send(names[t], "up", "moments", a, kind)
    assert lower is not None
    return lower


@register
class NARGPResult(ChainResult):
    """A fitted :class:`~fedstats.gp.nargp.NARGP` (centralised): every fidelity's fitted state with
    its rows (:class:`NARGPFidelity`), so :meth:`save` writes every fidelity's inputs and standardised
    outputs (the file holds the training data's information, as a pooled fit's does).
    ``predict`` (the highest fidelity: the mixture over ``samples`` paths, as a normal with its
    mean and variance), ``fidelity_moments`` and ``summary`` are on the data's scale by default.

    ``summary()``: one row per parameter, lowest fidelity first: each fidelity's ``mean[L]``, its
    ``lengthscale[L, x]`` per input column (and ``lengthscale[L, f(K)]`` of the fidelity below's
    value, in its data units), ``outputscale[L]`` and ``noise[L]`` (variances on the data's
    scale); ``mean``/``estimate`` on the data's scale, ``standardized`` as fitted, no sd or
    interval.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.gp.nargp import NARGP
    >>> x_lo, x_hi = np.linspace(0, 1, 11), np.linspace(0, 1, 6)
    >>> f = lambda x: (6 * x - 2) ** 2 * np.sin(12 * x - 4)
    >>> res = NARGP(restarts=2, samples=50).fit({"LF": (x_lo, 0.5 * f(x_lo) + 10 * x_lo), "HF": (x_hi, f(x_hi))})
    >>> list(res.summary().index[:3])
    ['mean[LF]', 'lengthscale[LF, x0]', 'outputscale[LF]']
    """

    model = "NARGP"

    @property
    def samples(self) -> int:
        return int(self.options["samples"])

    def _moments(self, Xs: np.ndarray, t: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        return mixture(nargp_chain(self.fidelities, Xs, t + 1, self.samples, self.seed))

    def _fidelity_rows(self, t: int) -> list[tuple[str, float, float]]:
        name, lv = self.names[t], self.fidelities[t]
        rows = [(f"mean[{name}]", lv.mu, 0.0)]
        ls = np.asarray(lv.hyper["lengthscale"], dtype=float).reshape(-1)
        labels = self._lengthscale_labels(t, None if t == 0 else f"f({self.names[t - 1]})")
        # the last lengthscale above the lowest fidelity is that of the fidelity below's value
        units = [1.0] * len(self.feature_names) + ([self.fidelities[t - 1].sd] if t else [])
        rows += [(label, float(u * v), float(v)) for label, u, v in zip(labels, units, ls)]
        for p in ("outputscale", "noise"):
            v = float(lv.hyper[p][0])
            rows.append((f"{p}[{name}]", lv.sd**2 * v, v))
        return rows


@register
class FederatedNARGPResult(FederatedChain, NARGPResult):
    """A fitted :class:`~fedstats.gp.nargp.FederatedNARGP`: one fidelity per client. What it
    holds, how its queries travel and are counted, and what a result loaded from a file can do
    (:meth:`attach`) are as for :class:`~fedstats.gp.ar1_result.FederatedAR1Result`: each
    fidelity's release (hyperparameters on its standardised scale, the mean and sd of its outputs)
    is in the result; its rows, GP inputs and outputs stay with its client; each fidelity draws its
    paths from its own stream, so the answers equal the centralised :class:`NARGPResult`'s."""

    model = "FederatedNARGP"
    federated = True

    def _moments(self, Xs: np.ndarray, t: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        clients = self._live()
        with self._query() as wire:
            paths = nargp_chain(clients, Xs, t + 1, self.samples, self.seed, wire, self.names, kind, len(clients) - 1)
        return mixture(paths)

    def _rebuild(self, data: FederatedData) -> list[NARGPFidelity]:
        """Each fidelity rebuilt by its client from its own rows of ``data`` and its release (its
        GP inputs from the chain below, as in the fit); rows other than the fit's are refused."""
        rows = [_client_rows(data, name, self.d) for name in self.names]
        own = [
            NARGPFidelity(X, y, t, rel.spec, restarts=rel.restarts, seed=rel.seed).check_rows(rel, name)
            for t, ((X, y), name, rel) in enumerate(zip(rows, self.names, self.fidelities))
        ]
        clients: list[NARGPFidelity] = []
        with self._query() as wire:
            for t, (name, rel, lv) in enumerate(zip(self.names, self.fidelities, own)):
                lower = None
                if t:
                    paths = nargp_chain(clients, lv.X, t, self.samples, self.seed, wire, self.names, "rebuild", t)
                    lower = mixture(paths)[0]
                clients.append(lv.restore(rel, lower, name))
        return clients
