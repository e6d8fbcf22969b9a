"""Posterior draws as ArviZ's container: the only ArviZ-specific code of fedstats.

On Python 3.11 the ArviZ 0.x line installs (``from_dict`` returning ``InferenceData``); the
1.x line (``from_dict({"posterior": ...})`` returning a ``DataTree``) needs Python 3.12, and
moving to it is a change of this module only. ArviZ is imported lazily: it is heavy and only
needed for export."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from arviz import InferenceData

__all__ = ["to_inference_data", "from_draws"]


def from_draws(draws: np.ndarray, names: list[str], var_name: str) -> InferenceData:
    """``(n_chains, n_draws, p)`` draws as an ``InferenceData`` with one variable named
    ``var_name`` whose components are ``names``."""
    if not isinstance(var_name, str) or not var_name:
        raise ValueError("var_name must be a non-empty string")
    dim = f"{var_name}_dim_0"
    return to_inference_data({var_name: draws}, coords={dim: list(names)}, dims={var_name: [dim]})


def to_inference_data(
    draws_dict: Mapping[str, np.ndarray], coords: Mapping[str, list], dims: Mapping[str, list[str]]
) -> InferenceData:
    """Posterior draws (``(chain, draw, *shape)`` arrays by variable name) as ArviZ's container."""
    import arviz as az

    return az.from_dict(posterior=dict(draws_dict), coords=dict(coords), dims=dict(dims))
