"""fedstats: federated statistics.

Fit probabilistic models across data holders whose rows never leave them, and get
posteriors, credible intervals, tests and predictions with uncertainty.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_names
from ._version import __version__
from .data import ClientData, DataError, FederatedData, FederatedScaler

if TYPE_CHECKING:
    from .inference import GaussianPosterior, SamplePosterior
    from .linear import HierarchicalLinearModel

#: loaded on first use, so that ``import fedstats`` stays light (the inference package needs scipy's
#: statistics; the exact GLM and the summaries do not)
__getattr__ = lazy_names(
    "fedstats",
    {
        "GaussianPosterior": "fedstats.inference",
        "SamplePosterior": "fedstats.inference",
        "HierarchicalLinearModel": "fedstats.linear",
    },
)

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
