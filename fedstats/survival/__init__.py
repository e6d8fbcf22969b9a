"""Survival analysis across clients: the pooled Kaplan-Meier curve, the log-rank test and the
Cox proportional hazards model (exact, stratified by client, robust), each equal to the pooled
fit (lifelines, statsmodels' ``PHReg``), and a hierarchical Cox model (each client's own
baseline hazard and coefficients around a population) by federated EP.

The time is the data's target; ``event=`` names the 0/1 column of events, which each client
takes out of its predictors itself (as the GLM's special columns)."""

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from .cox import CoxConvergenceWarning, CoxPH, CoxResult
from .km import KaplanMeier, KaplanMeierResult, logrank_test

if TYPE_CHECKING:
    from .hierarchical import HierarchicalCox, HierarchicalCoxResult


#: the hierarchical model loads the inference package on first use
__getattr__ = lazy_names(
    "fedstats.survival", dict.fromkeys(("HierarchicalCox", "HierarchicalCoxResult"), "fedstats.survival.hierarchical")
)


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
