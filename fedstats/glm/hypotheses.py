"""What a fitted exact GLM tests and reports beyond its coefficients (:class:`GLMTests`, a base
of :class:`~fedstats.glm.GLMResult`): likelihood-ratio and Wald tests, and the coefficients on
the ratio scale (odds, risk and rate ratios) with their intervals.

>>> import numpy as np
>>> from fedstats.glm import FederatedGLM
>>> rng = np.random.default_rng(0)
>>> Xs = [rng.normal(size=(200, 1)) for _ in range(3)]
>>> ys = [rng.binomial(1, 1 / (1 + np.exp(-(0.5 + 0.7 * X[:, 0])))).astype(float) for X in Xs]
>>> res = FederatedGLM("binomial").fit(list(zip(Xs, ys)))
>>> table = res.ratios()
>>> table.attrs["ratio"], list(table.columns)
('odds ratio', ['ratio', 'lower', 'upper', 'p_value'])
>>> bool(table.loc["x0", "lower"] < np.exp(0.7) < table.loc["x0", "upper"])
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .._tails import chi2_sf
from ..results import Coefficients

__all__ = ["GLMTests", "ratio_kind", "posterior_ratios"]


def ratio_kind(family: str, link: str) -> str | None:
    """What ``exp`` of a coefficient is under ``family`` and ``link``: ``"odds ratio"`` (logit
    link), ``"risk ratio"`` (binomial, log link), ``"rate ratio"`` (poisson or negative
    binomial, log link), ``"ratio of means"`` (another family's log link); ``None`` under any
    other link, where it is no ratio."""
    if link == "logit":
        return "odds ratio"
    if link != "log":
        return None
    return {"binomial": "risk ratio", "poisson": "rate ratio", "negative_binomial": "rate ratio"}.get(
        family, "ratio of means"
    )


def posterior_ratios(table: pd.DataFrame, rows: Sequence[str], family: str, link: str) -> pd.DataFrame:
    """A Bayesian GLM's coefficients (the rows ``rows`` of its summary ``table``) on the ratio
    scale: ``ratio = exp(posterior mean)`` (the posterior median of the ratio when the posterior
    is Gaussian), the credible interval's ends exponentiated (exact: exp is monotone) and the
    coefficient's tail probability of 0 (of a ratio of 1). ``attrs["ratio"]`` as
    :func:`ratio_kind`; another link: ``ValueError``."""
    kind = ratio_kind(family, link)
    if kind is None:
        raise ValueError(
            f"exp of a coefficient is a ratio only under the log or logit link; this fit has the {link} link"
        )
    t = table.loc[list(rows)]
    out = pd.DataFrame(
        {
            "ratio": np.exp(t["mean"].astype(float)),
            "lower": np.exp(t["lower"].astype(float)),
            "upper": np.exp(t["upper"].astype(float)),
            "p_value": t["p_value"],
        }
    ).rename_axis("parameter")
    out.attrs["ratio"] = kind
    return out


class GLMTests(Coefficients):
    """The tests and ratio tables of a fitted exact GLM (its result's ``llf``, ``family``,
    ``link`` and the coefficients' :class:`~fedstats.results.Coefficients` view, whose
    :meth:`~fedstats.results.Coefficients.wald_test` it has)."""

    family: str
    link: str
    alpha: float
    llf: float
    wnobs: float
    n_obs: Any
    privacy: Any

    def lr_test(self, other: GLMTests) -> pd.Series:
        """Likelihood-ratio test of the smaller of ``self`` and ``other`` (nested: its
        coefficients a subset of the larger's, same family, link, rows and weights):
        ``statistic = 2 (llf_large - llf_small)`` on the difference in coefficients;
        returns ``statistic, df, p_value``."""
        if not isinstance(other, GLMTests):
            raise TypeError(f"lr_test compares two GLMResult fits, got {type(other).__name__}")
        if self.privacy is not None or other.privacy is not None:
            raise ValueError(
                "lr_test needs the log-likelihoods, which a differentially private fit does not release; use wald_test"
            )
        big, small = (self, other) if len(self.names) >= len(other.names) else (other, self)
        if (big.family, big.link, big.alpha) != (small.family, small.link, small.alpha):
            raise ValueError(
                f"lr_test needs the same family and link: {big.family}/{big.link} vs {small.family}/{small.link}"
            )
        if not set(small.names) < set(big.names):
            raise ValueError(f"the models are not nested: {small.names} is not a subset of {big.names}")
        if big.wnobs != small.wnobs or big.n_obs != small.n_obs:
            raise ValueError("the two fits used different rows or weights")
        stat = 2 * (big.llf - small.llf)
        df = len(big.names) - len(small.names)
        return pd.Series({"statistic": stat, "df": float(df), "p_value": float(chi2_sf(stat, df))})

    def ratios(self, level: float = 0.95) -> pd.DataFrame:
        """The coefficients on the ratio scale: ``ratio = exp(coefficient)`` with the Wald
        interval at ``level`` mapped the same way (``exp(lower)``, ``exp(upper)``) and the
        test of ratio 1 (the coefficient's ``p_value``). What the ratio is (``attrs["ratio"]``)
        follows the link (:func:`ratio_kind`): odds ratios under the logit link, risk or rate
        ratios or ratios of means under the log link. The intercept's row is the baseline
        odds, risk, rate or mean. Any other link has no ratio scale: ``ValueError``."""
        kind = ratio_kind(self.family, self.link)
        if kind is None:
            raise ValueError(
                f"exp of a coefficient is a ratio only under the log or logit link; this {self.family} fit has the "
                f"{self.link} link"
            )
        ci = self.conf_int(level)
        out = pd.DataFrame(
            {
                "ratio": np.exp(self.params),
                "lower": np.exp(ci["lower"]),
                "upper": np.exp(ci["upper"]),
                "p_value": self.pvalues,
            }
        ).rename_axis("parameter")
        out.attrs["ratio"] = kind
        return out
