"""MCMC convergence diagnostics of posterior draws: rank-normalised split R-hat and bulk
effective sample size (Vehtari, Gelman, Simpson, Carpenter and Bürkner, 2021,
"Rank-normalization, folding, and localization: an improved R-hat for assessing convergence
of MCMC", Bayesian Analysis 16(2)).

Both take one parameter's draws as an ``(n_chains, n_draws)`` array and reproduce ArviZ's
``rhat(method="rank")`` and ``ess(method="bulk")``. The basic R-hat is NumPyro's
``gelman_rubin`` (the same formula); the ESS is computed here because NumPyro's
``effective_sample_size`` lacks ArviZ's lower bound on the autocorrelation time, so the two
differ on short chains."""

from __future__ import annotations

import numpy as np
from scipy import stats
from scipy.fft import next_fast_len

from .._deprecation import renamed_module_names

__all__ = ["rhat_rank", "ess_bulk", "ess_basic", "split_chains", "rank_normalize"]


def split_chains(x: np.ndarray) -> np.ndarray:
    """Each chain cut into its first and last halves (the middle draw of an odd length
    dropped): ``(n_chains, n_draws)`` -> ``(2 n_chains, n_draws // 2)``."""
    half = x.shape[1] // 2
    return np.vstack((x[:, :half], x[:, -half:]))


def rank_normalize(x: np.ndarray) -> np.ndarray:
    """Normal scores of the draws' ranks over all chains jointly (Blom's offset 3/8)."""
    ranks = stats.rankdata(x, method="average").reshape(x.shape)
    return stats.norm.ppf((ranks - 0.375) / (x.size + 0.25))


def _rhat_basic(x: np.ndarray) -> float:
    from numpyro.diagnostics import gelman_rubin

    if np.mean(np.var(x, axis=1, ddof=1)) == 0:
        return np.nan
    return float(gelman_rubin(x))


def rhat_rank(x: np.ndarray) -> float:
    """Rank-normalised split R-hat of an ``(n_chains, n_draws)`` array: the larger of the
    bulk (ranks of the draws) and tail (ranks of their distance from the median) values;
    NaN with fewer than 2 chains or 4 draws."""
    if x.shape[0] < 2 or x.shape[1] < 4:
        return np.nan
    split = split_chains(x)
    bulk = _rhat_basic(rank_normalize(split))
    tail = _rhat_basic(rank_normalize(np.abs(split - np.median(split))))
    return float(max(bulk, tail))


def _autocov(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    m = next_fast_len(2 * n)
    dev = x - x.mean(axis=1, keepdims=True)
    f = np.fft.rfft(dev, n=m, axis=1)
    return np.fft.irfft(f * np.conjugate(f), n=m, axis=1)[:, :n] / n


def ess_basic(x: np.ndarray) -> float:
    """ESS of an (n_chains, n_draws) array, Geyer's initial monotone sequence."""
    if np.max(x) - np.min(x) < np.finfo(float).resolution:
        return float(x.size)
    n_chain, n_draw = x.shape
    acov = _autocov(x)
    mean_var = np.mean(acov[:, 0]) * n_draw / (n_draw - 1.0)
    var_plus = mean_var * (n_draw - 1.0) / n_draw
    if n_chain > 1:
        var_plus += np.var(np.mean(x, axis=1), ddof=1)

    rho = np.zeros(n_draw)
    rho_even = 1.0
    rho[0] = rho_even
    rho_odd = 1.0 - (mean_var - np.mean(acov[:, 1])) / var_plus
    rho[1] = rho_odd
    # Geyer's initial positive sequence
    t = 1
    while t < n_draw - 3 and rho_even + rho_odd > 0.0:
        rho_even = 1.0 - (mean_var - np.mean(acov[:, t + 1])) / var_plus
        rho_odd = 1.0 - (mean_var - np.mean(acov[:, t + 2])) / var_plus
        if rho_even + rho_odd >= 0:
            rho[t + 1] = rho_even
            rho[t + 2] = rho_odd
        t += 2
    max_t = t - 2
    if rho_even > 0:
        rho[max_t + 1] = rho_even
    # Geyer's initial monotone sequence
    t = 1
    while t <= max_t - 2:
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = (rho[t - 1] + rho[t]) / 2.0
            rho[t + 2] = rho[t + 1]
        t += 2
    total = n_chain * n_draw
    tau = -1.0 + 2.0 * np.sum(rho[: max_t + 1]) + np.sum(rho[max_t + 1 : max_t + 2])
    tau = max(tau, 1.0 / np.log10(total))
    return float(np.nan if np.isnan(rho).any() else total / tau)


def ess_bulk(x: np.ndarray) -> float:
    """Bulk ESS of an (n_chains, n_draws) array: ESS of rank-normalised split chains."""
    if x.shape[1] < 4:
        return np.nan
    return ess_basic(rank_normalize(split_chains(x)))


#: former names, one release
__getattr__ = renamed_module_names(__name__, {"rank_normalise": "rank_normalize"}, globals())
