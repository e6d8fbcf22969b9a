"""Federated linear models: HM2 (hierarchical Bayesian regression by federated EP)."""

from .hierarchical import HierarchicalLinearModel, HierarchicalResult

__all__ = ["HierarchicalLinearModel", "HierarchicalResult"]
