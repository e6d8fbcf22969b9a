"""Model-agnostic inference: Gaussians in natural parameters, federated EP, tilted moments, posteriors."""

import importlib.metadata as _md
import warnings as _warnings

try:  # without importing jax: reading its version is free, importing it is not
    _JAXLIB = _md.version("jaxlib")
except _md.PackageNotFoundError:  # pragma: no cover - jaxlib is a dependency
    _JAXLIB = ""
# jaxlib releases whose parallel LAPACK batches deadlock vectorised fits
DEADLOCKING_JAXLIB = ("0.10.", "0.11.0")
if _JAXLIB.startswith(DEADLOCKING_JAXLIB):
    _warnings.warn(
        f"jaxlib {_JAXLIB} splits batched LAPACK calls over XLA's thread pool and can deadlock fedstats's "
        "vectorised fits (from about 9 predictors; fixed upstream by jax-ml/jax 859992407d): install "
        "jaxlib 0.9.2 (constraints.txt) or a release after 0.11.0",
        RuntimeWarning,
        stacklevel=2,
    )

from .custom import federated_ep
from .ep import EPClientState, EPServerState, FederatedEP, RowsEP
from .ep_checks import check_invariants
from .gaussian import NaturalGaussian, NotPositiveDefinite, is_pd
from .posterior import GaussianPosterior, Posterior, SamplePosterior
from .tilted import (
    ExactTilted,
    ImportanceTilted,
    LaplaceTilted,
    NUTSTilted,
    SiteModel,
    TiltedEstimator,
    TiltedResult,
    make_estimator,
)

__all__ = [
    "EPClientState",
    "EPServerState",
    "FederatedEP",
    "RowsEP",
    "check_invariants",
    "federated_ep",
    "NaturalGaussian",
    "NotPositiveDefinite",
    "is_pd",
    "GaussianPosterior",
    "Posterior",
    "SamplePosterior",
    "ExactTilted",
    "ImportanceTilted",
    "LaplaceTilted",
    "NUTSTilted",
    "SiteModel",
    "TiltedEstimator",
    "TiltedResult",
    "make_estimator",
]
