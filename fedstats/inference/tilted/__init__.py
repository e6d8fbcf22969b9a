"""Tilted-moment estimators for federated EP.

A client's tilted distribution is ``cavity(phi) * f_k(phi)``, where ``f_k`` is its
likelihood contribution with the client's local latents integrated out. EP needs the
mean and covariance of ``phi`` under it. The model supplies ``f_k`` through a
:class:`SiteModel` (:mod:`.base`); an estimator turns it into moments. Estimators work on a
*batch* of clients at once (compiled kernels, :mod:`.kernels`): every client's result
depends only on its own inputs, so batching is a simulation speed-up, not a change of
algorithm.

Estimators, one module each
---------------------------
``ExactTilted`` (:mod:`.exact`)
    The site is exactly Gaussian in ``phi`` (conjugate case): tilted = cavity x site.
``LaplaceTilted`` (:mod:`.laplace`)
    Newton to the mode of the (collapsed) tilted target, covariance from the Hessian.
``ImportanceTilted`` (:mod:`.importance`)
    Importance sampling from a defensive mixture of the cavity and the Laplace
    approximation, with control variates per stratum: Monte-Carlo noise enters mainly
    through the weights' spread (small when the tilted is close to Gaussian).
``NUTSTilted`` (:mod:`.nuts`)
    NumPyro NUTS over the client's target (``augmented``: phi, theta_k and local
    nuisances; or ``collapsed``: theta_k integrated out), several chains, vectorised over
    clients and chains, keeping the phi draws (plus R-hat and ESS of every run).
``RaoBlackwellTilted`` (:mod:`.rao_blackwell`)
    Importance sampling of the coordinates that are not conditionally Gaussian, the
    Gaussian block of phi integrated in closed form; numpy only (nothing to compile).
``RaoBlackwellLaplaceTilted`` (:mod:`.rao_blackwell`)
    The same Gaussian block in closed form, the rest from its Laplace approximation
    corrected to second order (deterministic; for many sampled coordinates), falling back
    to ``RaoBlackwellTilted`` where the corrections are large.
``GibbsTilted`` (:mod:`.gibbs`)
    Metropolis within Gibbs for sites whose ``theta_k`` and locals have exact conditionals.

All jax work runs inside a scoped ``jax.enable_x64(True)``; no global setting is changed.
"""

from __future__ import annotations

from typing import Any

from .base import (
    AugmentedSite,
    ConditionallyGaussianSite,
    ConvolvedGaussianSite,
    ExactSite,
    GibbsSite,
    PreparedSite,
    SiteModel,
    Stats,
    TiltedEstimator,
    TiltedResult,
)
from .chains import zero_variance_moments
from .exact import ExactTilted
from .gibbs import GibbsTilted
from .importance import ImportanceTilted
from .laplace import LaplaceTilted
from .nuts import NUTSTilted
from .rao_blackwell import RaoBlackwellLaplaceTilted, RaoBlackwellTilted

ESTIMATORS = {
    "exact": ExactTilted,
    "laplace": LaplaceTilted,
    "importance": ImportanceTilted,
    "nuts": NUTSTilted,
    "gibbs": GibbsTilted,
    "rao_blackwell": RaoBlackwellTilted,
    "rao_blackwell_laplace": RaoBlackwellLaplaceTilted,
}


def make_estimator(spec: str | TiltedEstimator, **options: Any) -> TiltedEstimator:
    """An estimator from its name (``exact``, ``laplace``, ``importance``, ``nuts``,
    ``gibbs``, ``rao_blackwell``, ``rao_blackwell_laplace``) or as given."""
    if isinstance(spec, TiltedEstimator):
        if options:
            raise ValueError("options can only be given with an estimator name")
        return spec
    try:
        cls = ESTIMATORS[spec]
    except (KeyError, TypeError):
        raise ValueError(f"unknown tilted estimator {spec!r}; choose one of {sorted(ESTIMATORS)}") from None
    return cls(**options)


__all__ = [
    "SiteModel",
    "AugmentedSite",
    "ConditionallyGaussianSite",
    "ConvolvedGaussianSite",
    "ExactSite",
    "GibbsSite",
    "PreparedSite",
    "Stats",
    "TiltedResult",
    "TiltedEstimator",
    "ExactTilted",
    "LaplaceTilted",
    "ImportanceTilted",
    "NUTSTilted",
    "GibbsTilted",
    "RaoBlackwellTilted",
    "RaoBlackwellLaplaceTilted",
    "make_estimator",
    "ESTIMATORS",
    "zero_variance_moments",
]
