"""Federated Gaussian process regression on GPyTorch (FGPR: Yue and Kontar, "Federated Gaussian
Process: Convergence, Automatic Personalization and Multi-fidelity Modeling").

* :class:`FGPR`: one GP prior learned by federated averaging of hyperparameters; each
  client predicts by conditioning it on its own data; :mod:`fedstats.gp.laplace`: the
  uncertainty of its hyperparameters (a Laplace approximation from the clients' summed Hessians).
* :mod:`fedstats.gp.multifidelity`: fidelities as clients, AR1 co-kriging centralised and
  federated; :mod:`fedstats.gp.nargp`: the nonlinear autoregressive GP (NARGP), centralised
  and federated.
  Their fits return results that keep the result contract, on the data's scale
  (:mod:`fedstats.gp.ar1_result`, :mod:`fedstats.gp.nargp_result`).
* :mod:`fedstats.gp.bo`: these surrogates as BoTorch models (``FGPRResult.to_botorch``,
  ``AR1Result.to_botorch``, ``FederatedAR1Result.to_botorch``; the optional extra ``fedstats[bo]``).
"""

from .ar1_result import AR1Result, FederatedAR1Result
from .fgpr import FGPR, FGPRResult
from .multifidelity import AR1CoKriging, FederatedAR1
from .nargp import NARGP, FederatedNARGP
from .nargp_result import FederatedNARGPResult, NARGPResult

__all__ = [
    "FGPR",
    "FGPRResult",
    "AR1CoKriging",
    "FederatedAR1",
    "AR1Result",
    "FederatedAR1Result",
    "NARGP",
    "FederatedNARGP",
    "NARGPResult",
    "FederatedNARGPResult",
]
