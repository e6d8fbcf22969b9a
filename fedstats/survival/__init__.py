"""Survival analysis across clients: the pooled Kaplan-Meier curve, the log-rank test and the
Cox proportional hazards model (exact, stratified by client, robust), each equal to the pooled
fit (lifelines, statsmodels' ``PHReg``), and a hierarchical Cox model (each client's own
baseline hazard and coefficients around a population) by federated EP.

The time is the data's target; ``event=`` names the 0/1 column of events, which each client
takes out of its predictors itself (as the GLM's special columns)."""

from .cox import CoxConvergenceWarning, CoxPH, CoxResult
from .hierarchical import HierarchicalCox, HierarchicalCoxResult
from .km import KaplanMeier, KaplanMeierResult, logrank_test

__all__ = [
    "HierarchicalCox",
    "HierarchicalCoxResult",
    "CoxPH",
    "CoxResult",
    "CoxConvergenceWarning",
    "KaplanMeier",
    "KaplanMeierResult",
    "logrank_test",
]
