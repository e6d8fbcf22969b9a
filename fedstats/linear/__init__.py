"""Federated linear models: HM2 (hierarchical Bayesian regression) and the Bayesian lasso and
ridge, fitted by federated EP; HM1 (a multi-task model that learns the covariance between
clients, Algorithm 1); and the baselines of fedstats.linear.baselines.

"The linear-models paper" in these modules is Yue, Kontar and Estrada Gómez, "Federated data
analytics: a study on linear models", IISE Transactions (2023); section, table and algorithm
numbers are that paper's."""

from .._deprecation import renamed_module_names
from .hierarchical import HierarchicalLinearModel, HierarchicalResult
from .shrinkage import BayesianLasso, BayesianRidge, BayesianShrinkage, CentralizedShrinkageResult, ShrinkageResult
from .structural import StructuralCovarianceModel, StructuralResult

__all__ = [
    "HierarchicalLinearModel",
    "HierarchicalResult",
    "BayesianShrinkage",
    "BayesianLasso",
    "BayesianRidge",
    "ShrinkageResult",
    "CentralizedShrinkageResult",
    "StructuralCovarianceModel",
    "StructuralResult",
]

#: former names, one release
__getattr__ = renamed_module_names(__name__, {"CentralisedShrinkageResult": "CentralizedShrinkageResult"}, globals())
