"""Nonlinear autoregressive multi-fidelity GPs (NARGP; Perdikaris, Raissi, Damianou, Lawrence and
Karniadakis, "Nonlinear information fusion algorithms for data-efficient multi-fidelity
modelling", Proc. R. Soc. A 2017), centralised (:class:`NARGP`) and with one fidelity per client
(:class:`FederatedNARGP`).

Fidelity 1 is an exact GP on its own data. Fidelity t > 1 is an exact GP on the augmented input
``(x, f_{t-1}(x))``: the lower fidelity's prediction enters as an extra input, so the link between
fidelities can be any smooth function, where AR1 allows only ``rho f_{t-1}(x) + delta(x)``. The
kernel is a simplification of the paper's ``k_rho(x, x') k_f(f, f') + k_delta(x, x')``: one ARD
kernel on ``(x, f)`` (a lengthscale for each column of x and one for the lower fidelity's value),
which is the paper's product term without the additive ``k_delta``. Each fidelity's targets are
standardised by their own mean and sd.

Training: fidelity t's extra input at its design points is the lower fidelity's predictive mean there.
Prediction: uncertainty is propagated by sampling. Fidelity 1's predictive normal at the query
points is drawn ``samples`` times; each draw is a path, and fidelity t, given a path's draw of
``f_{t-1}`` at the queries, has a normal predictive ``(m_t, v_t)`` along it, from which the path
draws ``f_t`` for the fidelity above. The highest fidelity's prediction is the mixture over paths:
mean ``mean_s m_s``, variance ``mean_s v_s + var_s m_s``. Fidelity t's standard normals come from
its own stream (``nargp draws`` of ``t``, :mod:`fedstats.streams`), so the federated model, which draws on each
fidelity's client, gives the centralised answer given the same hyperparameters.

``fit`` returns a result that keeps the result contract (:mod:`fedstats.gp.nargp_result`):
predictions, ``fidelity_moments`` and ``summary()`` on the data's scale by default.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .._deprecation import renamed_parameters
from ..data import FederatedData
from ..estimator import Estimator, Int, OneOf
from ..fitting import RunOptions, federated_fit
from ._core import HyperSpec
from .chain_result import Fidelities, fit_pooled_chain
from .multifidelity import fit_chain
from .nargp_result import FederatedNARGPResult, NARGPFidelity, NARGPResult, mixture, nargp_chain

__all__ = ["NARGP", "FederatedNARGP", "NARGPResult", "FederatedNARGPResult", "mixture"]


class _NARGPOptions(Estimator):
    """The options both NARGP models share (see :class:`NARGP`), checked when ``fit`` starts."""

    _constraints = {"kernel": OneOf("rbf", "matern"), "restarts": Int(1), "samples": Int(2)}

    def __init__(self, *, kernel: str = "rbf", restarts: int = 5, samples: int = 200) -> None:
        self.kernel, self.restarts, self.samples = kernel, restarts, samples

    def fidelity_spec(self, d: int, t: int) -> HyperSpec:
        """Fidelity ``t``'s GP prior on ``d`` inputs (and the fidelity below's value above the lowest):
        an ARD kernel."""
        return HyperSpec(d=d + (t > 0), kernel=self.kernel, ard=True)


class NARGP(_NARGPOptions):
    """NARGP (see the module's docs), centralised: every fidelity's data in one place.

    Parameters
    ----------
    kernel : "rbf" or "matern"
        Each fidelity's ARD kernel family (Matern-3/2 for "matern").
    restarts : int
        Random restarts of each fidelity's maximum-likelihood fit (L-BFGS, the best kept).
    samples : int
        Paths drawn to propagate the lower fidelities' uncertainty (the paper uses 100 or more).

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

    @renamed_parameters(levels="fidelities")
    def fit(self, fidelities: Fidelities, *, seed: int = 0) -> NARGPResult:
        """``fidelities``: ``(X, y)`` per fidelity, lowest first, highest last (a list, or a dict
        ``name -> (X, y)`` that names them; a list's fidelities are ``fidelity0``, ``fidelity1``, ...)."""
        return fit_pooled_chain(self, NARGPResult, fidelities, seed, "NARGP")

    def _fidelity(self, X: np.ndarray, y: np.ndarray, t: int, seed: int) -> NARGPFidelity:
        return NARGPFidelity(X, y, t, self.fidelity_spec(X.shape[1], t), restarts=self.restarts, seed=seed + t)

    def _lower(self, fitted: list[NARGPFidelity], X: np.ndarray, t: int, seed: int) -> np.ndarray:
        """The paths' mixture mean of the fidelities below ``t`` at ``X`` (fidelity t's extra input)."""
        return mixture(nargp_chain(fitted, X, t, self.samples, seed))[0]


class FederatedNARGP(_NARGPOptions):
    """NARGP with one fidelity per client, as :class:`~.multifidelity.FederatedAR1` is
    for AR1: each client keeps its outputs and its GP. To fit fidelity t, its client sends its
    design points down the chain; fidelity 1 answers with its predictive means and variances
    there, each fidelity above draws its paths from what comes up and answers with its own means
    and variances along them, and fidelity t takes the mixture mean as its extra input. A
    prediction travels the same chain. Shared during the fit: input locations downwards,
    predictive means and variances (per path) upwards, never outputs; at its end each fidelity
    releases its hyperparameters and the mean and sd of its outputs, from which the result
    reports the model on the data's scale. The result
    (:class:`~fedstats.gp.nargp_result.FederatedNARGPResult`) records the shape of every array
    sent (``messages``), counts the fit's bytes (``communication``) and those of later queries
    (``query_communication``)."""

    @federated_fit
    def fit(
        self, data: FederatedData, run: RunOptions, order: Sequence[Hashable] | None = None
    ) -> FederatedNARGPResult:
        """``order``: the clients of ``data`` from the lowest fidelity to the highest (default:
        the data's order). One run of the runtime (:class:`~fedstats.gp.chain_fit.ChainFit`);
        ``checkpoint`` and ``resume`` as every model's (the run's rounds are the chain's steps)."""
        return fit_chain(self, "nargp", FederatedNARGPResult, data, run, order)
