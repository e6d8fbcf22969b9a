"""Federated descriptive statistics and classical tests, each equal to the pooled answer
(scipy-style functions over a :class:`~fedstats.data.FederatedData`; data built with
``missing="keep"`` may hold missing values, and each function uses the rows complete in its
own columns).

* :func:`describe`: a "Table 1" (counts, missing values, means, sds, exact quartiles,
  categories' counts and percentages; overall and per group; small cells suppressed);
* :func:`quantiles`: exact quantiles of a column, equal to ``numpy.quantile`` of the pooled
  rows, by a search on counts that the server receives only summed over the clients;
* tests of means: :func:`ttest`, :func:`paired_ttest`, :func:`anova`, :func:`correlation`;
* tests of counts: :func:`chi2_test`, :func:`fisher_exact`, :func:`mantel_haenszel`,
  :func:`proportions_test`;
* rank tests from exact global ranks: :func:`mannwhitneyu`, :func:`kruskal` (and Spearman's
  correlation);
* :func:`adjust`: Holm's and Benjamini-Hochberg's adjusted p-values.

Every test returns a :class:`TestResult`; every function takes ``backend=`` as a model's
``fit`` (in process, or on Flower with secure aggregation: every reply is declared summed).
"""

from .adjust import ADJUST_METHODS, adjust
from .describe import DescribeResult, describe
from .means import anova, correlation, paired_ttest, ttest
from .quantiles import QUANTILE_METHODS, QuantileResult, quantiles
from .ranks import kruskal, mannwhitneyu
from .result import TestResult
from .tables import chi2_test, fisher_exact, mantel_haenszel, proportions_test

__all__ = [
    "describe",
    "DescribeResult",
    "quantiles",
    "QuantileResult",
    "QUANTILE_METHODS",
    "ttest",
    "paired_ttest",
    "anova",
    "correlation",
    "chi2_test",
    "fisher_exact",
    "mantel_haenszel",
    "proportions_test",
    "mannwhitneyu",
    "kruskal",
    "adjust",
    "ADJUST_METHODS",
    "TestResult",
]
