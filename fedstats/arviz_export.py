"""Posterior draws as ArviZ's container: the only ArviZ-specific code of fedstats.

On Python 3.11 the ArviZ 0.x line installs (``from_dict`` returning ``InferenceData``); the
1.x line (``from_dict({"posterior": ...})`` returning a ``DataTree``) needs Python 3.12, and
moving to it is a change of this module only. ArviZ is imported lazily: it is heavy and only
needed for export."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from arviz import InferenceData

__all__ = [
    "to_inference_data",
    "from_draws",
    "add_log_likelihood",
    "relative_efficiency",
    "good_k",
    "elpd_terms",
    "elpd_data",
]


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


def add_log_likelihood(idata: InferenceData, log_lik: np.ndarray, obs: list[str], var_name: str = "y") -> InferenceData:
    """``idata`` with a ``log_likelihood`` group: ``log_lik`` of shape ``(chain, draw, obs)``,
    the observations named ``obs`` (what ``arviz.loo`` and ``arviz.waic`` read)."""
    idata.add_groups({"log_likelihood": {var_name: log_lik}}, coords={"obs": list(obs)}, dims={var_name: ["obs"]})
    return idata


def relative_efficiency(idata: InferenceData) -> float:
    """The relative efficiency ``arviz.loo`` uses for its Pareto smoothing when given none:
    1 for one chain, else the mean ESS over the posterior's variables over the number of draws."""
    import arviz as az

    post = idata.posterior  # type: ignore[attr-defined]
    n_samples = post.sizes["chain"] * post.sizes["draw"]
    if post.sizes["chain"] == 1:
        return 1.0
    ess = az.ess(post, method="mean")
    return float(np.hstack([ess[v].values.flatten() for v in ess.data_vars]).mean() / n_samples)


def good_k(n_samples: int) -> float:
    """The Pareto shape above which ``arviz.loo`` warns, for ``n_samples`` draws."""
    return float(min(1 - 1 / np.log10(n_samples), 0.7))


def elpd_terms(log_lik: np.ndarray, reff: float) -> dict[str, float]:
    """One client's sums for PSIS-LOO and WAIC from its rows' log-likelihood at the posterior
    draws (``log_lik`` of shape ``(draws, rows)``, draws in ArviZ's chain-major order), with
    ``arviz.loo``'s and ``arviz.waic``'s arithmetic row by row: every term is a sum over rows,
    so the clients' sums add up to the pooled answer."""
    import arviz as az
    from scipy.special import logsumexp

    ll = np.asarray(log_lik, dtype=float).T  # (rows, draws)
    s = ll.shape[1]
    log_w, k = az.psislw(-ll, reff)
    loo_i = logsumexp(log_w + ll, axis=1)
    lppd_i = logsumexp(ll, axis=1) - np.log(s)
    var_i = ll.var(axis=1)
    waic_i = lppd_i - var_i
    return {
        "n": float(ll.shape[0]),
        "loo": float(loo_i.sum()),
        "loo_sq": float((loo_i**2).sum()),
        "lppd": float(lppd_i.sum()),
        "bad_k": float(np.sum(np.asarray(k) > good_k(s))),
        "waic": float(waic_i.sum()),
        "waic_sq": float((waic_i**2).sum()),
        "p_waic": float(var_i.sum()),
        "high_var": float(np.sum(var_i > 0.4)),
    }


def elpd_data(sums: Mapping[str, float], n_samples: int, kind: str) -> Any:
    """ArviZ's ``ELPDData`` (what ``arviz.loo`` / ``arviz.waic`` return, without pointwise
    values) from the clients' summed :func:`elpd_terms`; ``kind`` ``"loo"`` or ``"waic"``."""
    from arviz.stats.stats import ELPDData

    n = sums["n"]

    def se(total: float, squares: float) -> float:
        return float(np.sqrt(max(n * (squares / n - (total / n) ** 2), 0.0)))

    if kind == "loo":
        data: list[Any] = [sums["loo"], se(sums["loo"], sums["loo_sq"]), sums["lppd"] - sums["loo"], n_samples, int(n)]
        data += [bool(sums["bad_k"] > 0), "log", good_k(n_samples)]
        index = ["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "scale", "good_k"]
    else:
        data = [sums["waic"], se(sums["waic"], sums["waic_sq"]), sums["p_waic"], n_samples, int(n)]
        data += [bool(sums["high_var"] > 0), "log"]
        index = ["elpd_waic", "se", "p_waic", "n_samples", "n_data_points", "warning", "scale"]
    return ELPDData(data=data, index=index)
