"""The result of a classical test of :mod:`fedstats.stats` (scipy's and statsmodels' names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["TestResult", "ALTERNATIVES"]

ALTERNATIVES = ("two-sided", "less", "greater")


def _plain(v: Any) -> Any:
    """A JSON-ready value (NaN becomes ``None``)."""
    if isinstance(v, TestResult):
        return v.to_dict()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.ndarray):
        return _plain(v.tolist())
    if isinstance(v, pd.DataFrame):
        return _plain(v.reset_index().to_dict(orient="list"))
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


@dataclass
class TestResult:
    """A test's answer, equal to scipy's or statsmodels' on the pooled rows.

    ``statistic``, ``df`` (NaN where the test has none; a pair ``(df1, df2)`` for an F test),
    ``p_value``; the effect ``estimate`` (what it is: ``estimate_name``) with its interval
    ``lower``/``upper`` at ``level`` (NaN where the effect has no interval); ``test`` and
    ``method`` (what was computed), ``n`` (the rows it used), ``alternative``; ``details``
    (the test's own extras: group sizes and means, the table, a homogeneity test, a Bayesian
    comparison); and the run's ``communication``.
    """

    __test__ = False  # not a pytest test class

    test: str
    statistic: float
    p_value: float
    estimate: float
    estimate_name: str
    lower: float = math.nan
    upper: float = math.nan
    level: float = 0.95
    df: Any = math.nan
    method: str = ""
    n: int = 0
    alternative: str = "two-sided"
    details: dict[str, Any] = field(default_factory=dict)
    communication: Any = None

    @property
    def pvalue(self) -> float:
        """``p_value`` (scipy's name)."""
        return self.p_value

    def summary(self) -> pd.DataFrame:
        """One row: the test, its statistic, df, p-value, and the effect with its interval."""
        return pd.DataFrame(
            [
                {
                    "test": self.test,
                    "statistic": self.statistic,
                    "df": self.df if not isinstance(self.df, tuple) else "{:g}, {:g}".format(*self.df),
                    "p_value": self.p_value,
                    "estimate": self.estimate,
                    "lower": self.lower,
                    "upper": self.upper,
                    "effect": self.estimate_name,
                    "n": self.n,
                }
            ]
        ).set_index("test")

    def to_dict(self) -> dict[str, Any]:
        """Every field but ``communication`` (whose bytes are ``communication_bytes``), JSON-ready."""
        out = {k: _plain(getattr(self, k)) for k in self.__dataclass_fields__ if k != "communication"}
        comm = self.communication
        if comm is not None:
            out["communication_bytes"] = {"up": int(comm.bytes_up), "down": int(comm.bytes_down), "rounds": comm.rounds}
        return out

    def __repr__(self) -> str:
        df = "" if _nan(self.df) else f", df={self.df}"
        both = _nan(self.lower) and _nan(self.upper)
        ci = "" if both else f" [{self.lower:.4g}, {self.upper:.4g}] ({self.level:.0%})"
        return (
            f"{self.test}: statistic={self.statistic:.6g}{df}, p_value={self.p_value:.4g}; "
            f"{self.estimate_name} {self.estimate:.6g}{ci}, n={self.n}"
        )


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)
