"""Federated generalised linear models.

* :class:`FederatedGLM`: exact maximum likelihood by federated IRLS (statsmodels' pooled fit,
  to rounding): coefficients, standard errors (model-based or HC0 sandwich), Wald intervals
  and tests, deviance, log-likelihood, AIC/BIC, likelihood-ratio tests between nested fits.
* :class:`BayesianGLM`: the same likelihoods with shared coefficients and a Normal prior, by
  federated EP; :class:`HierarchicalGLM`: each client's own coefficients around a population
  (HM2's structure with a GLM likelihood), posteriors for both.
* :mod:`~fedstats.glm.families`: the families (gaussian, binomial, poisson, gamma, negative
  binomial) and links; ``BAYES_LINKS``: the links of each family that the Bayesian models take.
* ``ROLES``: the column roles a GLM's data may give besides predictors and outcome (offset,
  exposure, frequency weights, binomial trials).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._design import SPECIAL as ROLES
from .families import FAMILIES, LINKS, family_of
from .frequentist import FederatedGLM, GLMConvergenceWarning, GLMResult, SeparationError
from .sites import BAYES_LINKS

if TYPE_CHECKING:
    from .bayes import BayesianGLM, BayesianGLMResult, HierarchicalGLM, HierarchicalGLMResult

#: the Bayesian models load the inference package on first use: the exact GLM needs only numpy,
#: pandas and scipy's special functions
__getattr__ = lazy_names(
    "fedstats.glm",
    dict.fromkeys(
        ("BayesianGLM", "BayesianGLMResult", "HierarchicalGLM", "HierarchicalGLMResult"), "fedstats.glm.bayes"
    ),
)

__all__ = [
    "FederatedGLM",
    "GLMResult",
    "SeparationError",
    "GLMConvergenceWarning",
    "BayesianGLM",
    "BayesianGLMResult",
    "HierarchicalGLM",
    "HierarchicalGLMResult",
    "FAMILIES",
    "LINKS",
    "family_of",
    "ROLES",
    "BAYES_LINKS",
]
