"""Federated descriptive statistics and classical tests, each equal to the pooled answer
(scipy-style functions over a :class:`~fedstats.data.FederatedData`).

* :func:`quantiles`: exact quantiles of a column, equal to ``numpy.quantile`` of the pooled
  rows, by bisection on counts that the server receives only summed over the clients.
"""

from .quantiles import QUANTILE_METHODS, QuantileResult, quantiles

__all__ = ["quantiles", "QuantileResult", "QUANTILE_METHODS"]
