"""Federated Gaussian mixtures: FedEM (client-server), D-FedEM (gossip), variational FedEM.

* :class:`FederatedGaussianMixture` -- shared components, private per-client weights,
  fitted by FedEM on summed sufficient statistics (federated = centralised EM exactly);
* :class:`VariationalGaussianMixture` -- its variational sibling: Dirichlet weights per
  client, Normal-Wishart components, credible intervals;
* :class:`DecentralizedGaussianMixture` -- D-FedEM: no server, gossip of the statistics
  over a client graph (Metropolis-Hastings or fastest-mixing weights);
* :class:`GaussianMixtureResult` (maximum likelihood) and :class:`BayesianMixtureResult`
  (variational), siblings under :class:`MixtureResult`: ``predict``, ``predict_proba``,
  ``score`` per client, unseen clients, tables, save/load;
* :class:`FEMOMD` -- online: federated EM per time step, mirror descent on each client's
  drifting weights; :mod:`fedstats.mixture.regret` measures its regret.
"""

from .bayes import BayesianMixtureResult, VariationalGaussianMixture, VBFedEMAlgorithm
from .decentralized import (
    DecentralizedGaussianMixture,
    DecentralizedMixtureResult,
    DFedEMAlgorithm,
    erdos_renyi_graph,
    fast_mixing_weights,
    metropolis_weights,
    ring_graph,
    slem,
)
from .fedem import FedEMAlgorithm, FederatedGaussianMixture, GaussianMixtureResult, MixtureResult
from .online import FEMOMD, FEMOMDStep, eg_update, omd_gradient

__all__ = ["FederatedGaussianMixture", "VariationalGaussianMixture", "GaussianMixtureResult", "MixtureResult", "FedEMAlgorithm", "DecentralizedGaussianMixture",
           "DecentralizedMixtureResult", "DFedEMAlgorithm", "metropolis_weights", "fast_mixing_weights",
           "ring_graph", "erdos_renyi_graph", "slem", "BayesianMixtureResult", "VBFedEMAlgorithm", "FEMOMD",
           "FEMOMDStep", "eg_update", "omd_gradient"]
