"""fedstats: federated statistics.

Fit probabilistic models across data holders whose rows never leave them, and get
posteriors, credible intervals, tests and predictions with uncertainty.
"""

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .data import ClientData, DataError, FederatedData, FederatedScaler

if TYPE_CHECKING:
    from .inference import GaussianPosterior, SamplePosterior
    from .linear import HierarchicalLinearModel

#: loaded on first use, so that ``import fedstats`` stays light (the inference package needs scipy's
#: statistics; the exact GLM and the summaries do not)
_LAZY = {
    "GaussianPosterior": "fedstats.inference",
    "SamplePosterior": "fedstats.inference",
    "HierarchicalLinearModel": "fedstats.linear",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedstats' has no attribute {name!r}")


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
