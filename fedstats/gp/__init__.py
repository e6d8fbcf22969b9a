"""Federated Gaussian process regression on GPyTorch (spec ``fgpr.md``).

* :class:`FGPR`: one GP prior learned by federated averaging of hyperparameters; each
  client predicts by conditioning it on its own data.
"""

from .fgpr import FGPR, FGPRResult

__all__ = ["FGPR", "FGPRResult"]
