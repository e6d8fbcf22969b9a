"""Pooled NUTS of the Bayesian lasso and ridge (defined in :mod:`fedstats.linear.shrinkage_pooled`,
beside the model whose :meth:`~fedstats.linear.BayesianShrinkage.fit_centralized` runs it)."""

from ..linear.shrinkage_pooled import pooled_nuts

__all__ = ["pooled_nuts"]
