"""The declarations of what you fit with your own model or statistic: federated EP of a NumPyro
model, and federated moments."""

from __future__ import annotations

from .exchanges import DP_NOTE, ROWS_EP, dp_exchange, exchange
from .spec import Array, Declaration, Disclosure

CUSTOM_EP = Declaration(
    "custom-ep",
    "fedstats.inference:federated_ep",
    "fedstats.inference.custom:CustomEPResult",
    "your own NumPyro model, its global latents' posterior by federated EP",
    (
        Disclosure(
            "federated_ep (your own NumPyro model)",
            (
                ROWS_EP,
                exchange(
                    "client posteriors",
                    "_LocalPosteriors",
                    "with local latents: once, after the rounds",
                    (
                        Array("mean", "its local latents' posterior mean", "its own latents"),
                        Array("cov", "their posterior covariance", "their uncertainty"),
                    ),
                ),
            ),
            "its EP site (in process only: not on Flower).",
        ),
    ),
    reference="fedstats.reference.custom:pooled_nuts",
)
MOMENTS = Declaration(
    "moments",
    "fedstats.federation:federated_moments",
    "builtins:dict",
    "the pooled means and variances of the columns (optionally differentially private)",
    (
        Disclosure(
            "federated_moments (dp=)",
            (
                dp_exchange(
                    "moments: sums",
                    "_DPMomentSums",
                    "once",
                    "n: counts (1 each); sum_x: values; sum_y: targets (with y)",
                ),
                dp_exchange(
                    "moments: squares",
                    "_DPMomentSquares",
                    "once, after the sums",
                    "m2_x: squared deviations; m2_y: the same, y",
                ),
            ),
            "nothing.",
            note=DP_NOTE,
        ),
    ),
    reference="numpy:var",
)

DECLARATIONS = (CUSTOM_EP, MOMENTS)
