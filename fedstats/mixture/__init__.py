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
  drifting weights; :mod:`fedstats.experiments.regret` measures its regret.
"""

from .bayes import VariationalGaussianMixture
from .bayes_result import BayesianMixtureResult
from .decentralized import (
    DecentralizedGaussianMixture,
    DecentralizedMixtureResult,
    erdos_renyi_graph,
    fast_mixing_weights,
    metropolis_weights,
    ring_graph,
    slem,
)
from .fedem import FederatedGaussianMixture
from .online import FEMOMD
from .result import GaussianMixtureResult, MixtureResult

# the models and their results, and the graphs D-FedEM gossips over; the federated algorithms
# (FedEMAlgorithm, DFedEMAlgorithm, VBFedEMAlgorithm, FEMOMDStep) live in their models' modules
__all__ = [
    "FederatedGaussianMixture",
    "VariationalGaussianMixture",
    "GaussianMixtureResult",
    "MixtureResult",
    "DecentralizedGaussianMixture",
    "DecentralizedMixtureResult",
    "metropolis_weights",
    "fast_mixing_weights",
    "ring_graph",
    "erdos_renyi_graph",
    "slem",
    "BayesianMixtureResult",
    "FEMOMD",
]
