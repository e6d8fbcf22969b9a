"""Nonlinear autoregressive multi-fidelity GPs (NARGP; Perdikaris, Raissi, Damianou, Lawrence and
Karniadakis, "Nonlinear information fusion algorithms for data-efficient multi-fidelity
modelling", Proc. R. Soc. A 2017), centralised (:class:`NARGP`) and with one level per client
(:class:`FederatedNARGP`).

Level 1 is an exact GP on its own data. Level t > 1 is an exact GP on the augmented input
``(x, f_{t-1}(x))``: the lower level's prediction enters as an extra input, so the link between
levels can be any smooth function, where AR1 allows only ``rho f_{t-1}(x) + delta(x)``. The
kernel is a simplification of the paper's ``k_rho(x, x') k_f(f, f') + k_delta(x, x')``: one ARD
kernel on ``(x, f)`` (a lengthscale for each column of x and one for the lower level's value),
which is the paper's product term without the additive ``k_delta``. Each level's targets are
standardised by their own mean and sd.

Training: level t's extra input at its design points is the lower level's predictive mean there.
Prediction: uncertainty is propagated by sampling. Level 1's predictive normal at the query
points is drawn ``samples`` times; each draw is a path, and level t, given a path's draw of
``f_{t-1}`` at the queries, has a normal predictive ``(m_t, v_t)`` along it, from which the path
draws ``f_t`` for the level above. The highest level's prediction is the mixture over paths:
mean ``mean_s m_s``, variance ``mean_s v_s + var_s m_s``. Level t's standard normals come from
its own stream (``nargp draws`` of ``t``, :mod:`fedstats.streams`), so the federated model, which draws on each
level's client, gives the centralised answer given the same hyperparameters.

``fit`` returns a result that keeps the result contract (:mod:`fedstats.gp.nargp_result`):
predictions, ``level_moments`` and ``summary()`` on the data's scale by default.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence

import numpy as np

from ..data import FederatedData
from ..federation import Communication
from ..federation.records import record
from ..results import counted
from ._core import HyperSpec
from .chain_result import Levels, Wire, check_levels
from .multifidelity import chain_order
from .nargp_result import FederatedNARGPResult, NARGPLevel, NARGPResult, mixture, nargp_chain

__all__ = ["NARGP", "FederatedNARGP", "NARGPResult", "FederatedNARGPResult", "mixture"]


class _NARGPOptions:
    """The options both NARGP models share (see :class:`NARGP`), checked at construction."""

    def __init__(self, *, kernel: str = "rbf", restarts: int = 5, samples: int = 200):
        if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 2:
            raise ValueError(f"samples must be an integer of at least 2, got {samples!r}")
        if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 1:
            raise ValueError(f"restarts must be a positive integer, got {restarts!r}")
        self.kernel, self.restarts, self.samples = kernel, int(restarts), int(samples)
        self.level_spec(1, 0)  # refuses a bad kernel now, not at fit

    def options(self) -> dict:
        """The options as given (kept in the result)."""
        return {"kernel": self.kernel, "restarts": self.restarts, "samples": self.samples}

    def level_spec(self, d: int, t: int) -> HyperSpec:
        """Level ``t``'s GP prior on ``d`` inputs (and the level below's value above the lowest):
        an ARD kernel."""
        return HyperSpec(d=d + (t > 0), kernel=self.kernel, ard=True)


class NARGP(_NARGPOptions):
    """NARGP (see the module's docs), centralised: every level's data in one place.

    Parameters
    ----------
    kernel : "rbf" or "matern"
        Each level's ARD kernel family (Matern-3/2 for "matern").
    restarts : int
        Random restarts of each level's maximum-likelihood fit (L-BFGS, the best kept).
    samples : int
        Paths drawn to propagate the lower levels' uncertainty (the paper uses 100 or more).

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.gp.nargp import NARGP
    >>> x_lo, x_hi = np.linspace(0, 2, 40), np.linspace(0, 2, 8)
    >>> lo = lambda x: np.cos(15 * x)
    >>> res = NARGP(restarts=2, samples=50).fit([(x_lo, lo(x_lo)), (x_hi, x_hi * np.exp(lo(2 * x_hi - 0.2)) - 1)])
    >>> list(res.predict(np.array([0.5, 1.5])).columns[:5])  # on the data's scale
    ['mean', 'lower', 'upper', 'pred_lower', 'pred_upper']
    """

    def fit(self, levels: Levels, *, seed: int = 0) -> NARGPResult:
        """``levels``: ``(X, y)`` per fidelity, lowest first, highest last (a list, or a dict
        ``name -> (X, y)`` that names them; a list's levels are ``level0``, ``level1``, ...)."""
        t0 = time.perf_counter()
        names, pairs = check_levels(levels, "NARGP")
        fitted: list[NARGPLevel] = []
        for t, (X, y) in enumerate(pairs):
            lv = NARGPLevel(X, y, t, self.level_spec(X.shape[1], t), restarts=self.restarts, seed=seed + t)
            lower = None if t == 0 else mixture(nargp_chain(fitted, lv.X, t, self.samples, seed))[0]
            fitted.append(lv.fit(lower))
        return NARGPResult(
            levels=fitted,
            names=names,
            feature_names=[f"x{j}" for j in range(pairs[0][0].shape[1])],
            options=self.options(),
            seed=seed,
            seconds=time.perf_counter() - t0,
        )


class FederatedNARGP(_NARGPOptions):
    """NARGP with one fidelity level per client, as :class:`~.multifidelity.FederatedAR1` is
    for AR1: each client keeps its outputs and its GP. To fit level t, its client sends its
    design points down the chain; level 1 answers with its predictive means and variances
    there, each level above draws its paths from what comes up and answers with its own means
    and variances along them, and level t takes the mixture mean as its extra input. A
    prediction travels the same chain. Shared during the fit: input locations downwards,
    predictive means and variances (per path) upwards, never outputs; at its end each level
    releases its hyperparameters and the mean and sd of its outputs, from which the result
    reports the model on the data's scale. The result
    (:class:`~fedstats.gp.nargp_result.FederatedNARGPResult`) records the shape of every array
    sent (``messages``), counts the fit's bytes (``communication``) and those of later queries
    (``query_communication``)."""

    @counted
    def fit(self, data: FederatedData, order: Sequence[Hashable], *, seed: int = 0) -> FederatedNARGPResult:
        """``order``: the clients of ``data`` from the lowest fidelity to the highest."""
        order = chain_order(data, order, "FederatedNARGP")
        wire = Wire()
        clients: list[NARGPLevel] = []
        for t, c in enumerate(order):
            X = np.asarray(data[c].X, dtype=float)
            lv = NARGPLevel(
                X, np.asarray(data[c].y), t, self.level_spec(X.shape[1], t), restarts=self.restarts, seed=seed + t
            )
            lower = None
            if t:  # the client's inputs go down the chain below it; the paths there come back
                lower = mixture(nargp_chain(clients, lv.X, t, self.samples, seed, wire, order, "chain", t))[0]
            clients.append(lv.fit(lower))
        for c, lv in zip(order, clients):
            wire.release(c, lv.hyper, {"mu": lv.mu, "sd": lv.sd})
        record(wire.comm)
        return FederatedNARGPResult(
            clients=clients,
            messages=wire.messages,
            names=order,
            feature_names=list(data.feature_names),
            options=self.options(),
            seed=seed,
            communication=Communication.combine([wire.comm]),
        )
