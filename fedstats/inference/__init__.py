"""Model-agnostic inference: Gaussians in natural parameters, federated EP, tilted moments, posteriors."""

from .ep import EPClientState, EPServerState, FederatedEP, check_invariants
from .gaussian import NaturalGaussian, NotPositiveDefinite, is_pd
from .posterior import GaussianPosterior, Posterior, SamplePosterior
from .tilted import (ExactTilted, ImportanceTilted, LaplaceTilted, NUTSTilted, SiteModel, TiltedEstimator,
                     TiltedResult, make_estimator)

__all__ = [
    "EPClientState", "EPServerState", "FederatedEP", "check_invariants", "NaturalGaussian",
    "NotPositiveDefinite", "is_pd", "GaussianPosterior", "Posterior", "SamplePosterior", "ExactTilted",
    "ImportanceTilted", "LaplaceTilted", "NUTSTilted", "SiteModel", "TiltedEstimator", "TiltedResult",
    "make_estimator",
]
