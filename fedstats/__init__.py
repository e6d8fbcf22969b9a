"""fedstats: federated statistics.

Fit probabilistic models across data holders whose rows never leave them, and get
posteriors, credible intervals, tests and predictions with uncertainty.
"""

from ._version import __version__
from .data import ClientData, DataError, FederatedData, FederatedScaler
from .inference import GaussianPosterior, SamplePosterior
from .linear import HierarchicalLinearModel

__all__ = [
    "ClientData",
    "DataError",
    "FederatedData",
    "FederatedScaler",
    "GaussianPosterior",
    "SamplePosterior",
    "HierarchicalLinearModel",
    "__version__",
]
