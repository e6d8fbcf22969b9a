"""Summary rows shared by the models' tables: parameters sampled or approximated on the log
scale reported on their natural scale, and rows whose tail probability states no useful test."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .base import Posterior
from .sample_posterior import SamplePosterior

__all__ = ["log_scale_rows", "no_p_value"]


def log_scale_rows(g: Posterior, prefix: str, level: float, new_prefix: str) -> pd.DataFrame:
    """Summary rows of ``exp(x)`` for the components of ``g`` named ``prefix...``: the
    log-normal mean and sd, and the equal-tailed interval mapped through exp (for draws: the
    summary of the exponentiated draws)."""
    idx = [i for i, n in enumerate(g.names) if n.startswith(prefix)]
    new_names = [new_prefix + g.names[i][len(prefix) :] for i in idx]
    if isinstance(g, SamplePosterior):
        t = SamplePosterior(np.exp(g.draws[:, idx]), names=new_names, weights=g.weights).summary(level=level)
        return t[["mean", "sd", "lower", "upper"]].assign(p_value=np.nan).rename_axis(None)
    lo, hi = g.credible_interval(level, kind="eti")
    m, s = g.mean[idx], g.sd[idx]
    lm = np.exp(m + s**2 / 2)
    return pd.DataFrame(
        {
            "mean": lm,
            "sd": lm * np.sqrt(np.expm1(s**2)),
            "lower": np.exp(lo[idx]),
            "upper": np.exp(hi[idx]),
            "p_value": np.nan,
        },
        index=[new_prefix + g.names[i][len(prefix) :] for i in idx],
    )


def no_p_value(table: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """``table`` with NaN as ``p_value`` of the rows named ``prefix...`` (parameters such as log
    variances, for which a test of 0 states no null hypothesis anyone holds)."""
    table = table.copy()
    table.loc[table.index.str.startswith(prefix), "p_value"] = np.nan
    return table
