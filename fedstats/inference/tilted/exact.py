"""Exact tilted moments of a site that is Gaussian in phi (the conjugate case)."""

from __future__ import annotations

import numpy as np

from ...result_file import register
from ..gaussian import NaturalGaussian
from .base import SiteModel, TiltedEstimator, TiltedResult


@register
class ExactTilted(TiltedEstimator):
    """Exact moments when the model's site is Gaussian in phi (``model.exact_site(stats)``)."""

    name = "exact"

    def estimate(
        self,
        model: SiteModel,
        cavity_mean: np.ndarray,
        cavity_cov: np.ndarray,
        stats: list[dict[str, np.ndarray]],
        seeds: np.ndarray,
        *,
        keep_draws: bool = False,
    ) -> list[TiltedResult]:
        if not hasattr(model, "exact_site"):
            raise TypeError(f"{type(model).__name__} has no exact Gaussian site; use another estimator")
        out = []
        for m, c, s in zip(cavity_mean, cavity_cov, stats):
            site = model.exact_site(s)
            tilted = NaturalGaussian.from_moments(m, c) * site
            mean, cov = tilted.moments()
            out.append(TiltedResult(mean, cov))
        return out
