"""Federated generalised linear models.

* :class:`FederatedGLM`: exact maximum likelihood by federated IRLS (statsmodels' pooled fit,
  to rounding): coefficients, standard errors (model-based or HC0 sandwich), Wald intervals
  and tests, deviance, log-likelihood, AIC/BIC, likelihood-ratio tests between nested fits.
* :mod:`~fedstats.glm.families`: the families (gaussian, binomial, poisson, gamma, negative
  binomial) and links.
"""

from .families import FAMILIES, LINKS, family_of
from .frequentist import FederatedGLM, GLMConvergenceWarning, GLMResult, SeparationError

__all__ = ["FederatedGLM", "GLMResult", "SeparationError", "GLMConvergenceWarning", "FAMILIES", "LINKS", "family_of"]
