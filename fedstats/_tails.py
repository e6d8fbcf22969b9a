"""Normal and chi-square distribution functions from :mod:`scipy.special`, the functions
:mod:`scipy.stats` itself evaluates (the same numbers to the last bit), without importing
:mod:`scipy.stats`, which costs about a second: the exact GLM, the Wald tables and the command
line's summaries need only these. :mod:`scipy.special` itself (about 0.2 s: it loads numpy's
f2py and testing modules) is loaded at the first call, through :data:`special`.

>>> float(norm_ppf(0.975)), float(2 * norm_sf(1.959963984540054)), round(float(chi2_sf(3.841458820694124, 1)), 12)
(1.959963984540054, 0.05, 0.05)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["norm_cdf", "norm_sf", "norm_ppf", "norm_pdf", "chi2_sf", "special"]


class _Special:
    """:mod:`scipy.special`, imported at the first use of one of its functions."""

    def __getattr__(self, name: str) -> Any:
        from scipy import special

        return getattr(special, name)


#: :mod:`scipy.special`, loaded on first use
special = _Special()

_SQRT_2PI = float(np.sqrt(2 * np.pi))


def norm_cdf(x: ArrayLike) -> np.ndarray:
    """``scipy.stats.norm.cdf``."""
    return special.ndtr(x)


def norm_sf(x: ArrayLike) -> np.ndarray:
    """``scipy.stats.norm.sf``."""
    return special.ndtr(-np.asarray(x, dtype=float))


def norm_ppf(p: ArrayLike) -> np.ndarray:
    """``scipy.stats.norm.ppf``."""
    return special.ndtri(p)


def norm_pdf(x: ArrayLike) -> np.ndarray:
    """``scipy.stats.norm.pdf``."""
    x = np.asarray(x, dtype=float)
    return np.exp(-x * x / 2.0) / _SQRT_2PI


def chi2_sf(x: ArrayLike, df: ArrayLike) -> np.ndarray:
    """``scipy.stats.chi2.sf``."""
    return special.chdtrc(df, x)
