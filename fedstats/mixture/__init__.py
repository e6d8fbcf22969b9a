"""Federated Gaussian mixtures: FedEM (client-server), D-FedEM (gossip), variational FedEM.

* :class:`FederatedGaussianMixture` -- shared components, private per-client weights,
  fitted by FedEM on summed sufficient statistics (federated = centralised EM exactly);
* :class:`GaussianMixtureResult` -- the fit: ``predict``, ``predict_proba``, ``score`` per
  client, unseen clients, tables, save/load.
"""

from .fedem import FedEMAlgorithm, FederatedGaussianMixture, GaussianMixtureResult

__all__ = ["FederatedGaussianMixture", "GaussianMixtureResult", "FedEMAlgorithm"]
