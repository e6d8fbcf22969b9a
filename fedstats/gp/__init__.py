"""Federated Gaussian process regression on GPyTorch (FGPR: Yue and Kontar, "Federated Gaussian
Process: Convergence, Automatic Personalization and Multi-fidelity Modeling").

* :class:`FGPR`: one GP prior learned by federated averaging of hyperparameters; each
  client predicts by conditioning it on its own data.
"""

from .fgpr import FGPR, FGPRResult

__all__ = ["FGPR", "FGPRResult"]
