"""Adjusted p-values for a family of tests (the p-values are the server's: nothing is exchanged)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["adjust", "ADJUST_METHODS"]

#: Holm's step-down (family-wise error) and Benjamini-Hochberg's step-up (false discovery rate)
ADJUST_METHODS = ("holm", "bh")


def adjust(p_values: Sequence[float], method: str = "holm") -> np.ndarray:
    """Adjusted p-values, in the order given, equal to statsmodels' ``multipletests(p,
    method="holm" | "fdr_bh")[1]`` (and R's ``p.adjust``).

    Examples
    --------
    >>> adjust([0.01, 0.04, 0.03], "holm").round(4).tolist()
    [0.03, 0.06, 0.06]
    >>> adjust([0.01, 0.04, 0.03], "bh").round(4).tolist()
    [0.03, 0.04, 0.04]
    """
    if method not in ADJUST_METHODS:
        raise ValueError(f"method must be one of {ADJUST_METHODS}, got {method!r}")
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1 or np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("p_values must be a sequence of probabilities in [0, 1], without NaN")
    m = len(p)
    if m == 0:
        return p
    if method == "holm":
        order = np.argsort(p, kind="stable")
        stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    else:
        order = np.argsort(p, kind="stable")[::-1]
        stepped = np.minimum.accumulate(m / np.arange(m, 0, -1) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out
