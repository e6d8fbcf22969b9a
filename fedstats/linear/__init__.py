"""Federated linear models: HM2 (hierarchical Bayesian regression) and the Bayesian lasso and
ridge, fitted by federated EP."""

from .hierarchical import HierarchicalLinearModel, HierarchicalResult
from .shrinkage import (BayesianLasso, BayesianRidge, BayesianShrinkage, CentralisedShrinkageResult,
                        ShrinkageResult)

__all__ = ["HierarchicalLinearModel", "HierarchicalResult", "BayesianShrinkage", "BayesianLasso", "BayesianRidge",
           "ShrinkageResult", "CentralisedShrinkageResult"]
