"""Survival analysis across clients: the pooled Kaplan-Meier curve, the log-rank test and the
Cox proportional hazards model (exact, stratified by client, robust), each equal to the pooled
fit (lifelines, statsmodels' ``PHReg``).

The time is the data's target; ``event=`` names the 0/1 column of events, which each client
takes out of its predictors itself (as the GLM's special columns)."""

from .cox import CoxConvergenceWarning, CoxPH, CoxResult
from .km import KaplanMeier, KaplanMeierResult, logrank_test

__all__ = ["CoxPH", "CoxResult", "CoxConvergenceWarning", "KaplanMeier", "KaplanMeierResult", "logrank_test"]
