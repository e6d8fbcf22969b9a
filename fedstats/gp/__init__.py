"""Federated Gaussian process regression on GPyTorch (FGPR: Yue and Kontar, "Federated Gaussian
Process: Convergence, Automatic Personalization and Multi-fidelity Modeling").

* :class:`FGPR`: one GP prior learned by federated averaging of hyperparameters; each
  client predicts by conditioning it on its own data; :mod:`fedstats.gp.laplace`: the
  uncertainty of its hyperparameters (a Laplace approximation from the clients' summed Hessians).
* :mod:`fedstats.gp.multifidelity`: fidelity levels as clients, AR1 co-kriging centralised and
  federated; :mod:`fedstats.gp.nargp`: the nonlinear autoregressive GP (NARGP), centralised
  and federated.
* :mod:`fedstats.gp.bo`: these surrogates as BoTorch models (``FGPRResult.to_botorch``,
  ``AR1CoKriging.to_botorch``, ``FederatedAR1.to_botorch``; the optional extra ``fedstats[bo]``).
"""

from .fgpr import FGPR, FGPRResult

__all__ = ["FGPR", "FGPRResult"]
