"""Moments of phi from MCMC chains (NUTS, Gibbs): plain sample moments or zero-variance control
variates from the chains' scores, with R-hat and ESS per client."""

from __future__ import annotations

import numpy as np

from ..gaussian import is_pd, symmetrize
from .base import TiltedResult


def chain_results(
    zs, scores, p, d, *, control_variates, precision_correction, keep_draws, extra, label
) -> list[TiltedResult]:
    """Tilted results from MCMC chains: ``zs`` and ``scores`` are (B, chains, samples, D)
    with x = (phi, [theta (d entries)], z); ``extra`` maps diagnostic names to (B,) arrays."""
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    B, C, S, D = zs.shape
    out = []
    for b in range(B):
        phi = zs[b, :, :, :p]  # (chains, samples, p)
        if not np.all(np.isfinite(phi)):
            out.append(
                TiltedResult(
                    np.full(p, np.nan), np.full((p, p), np.nan), ok=False, message=f"{label} produced non-finite draws"
                )
            )
            continue
        flat = phi.reshape(-1, p)
        mean = flat.mean(axis=0)
        cov = symmetrize(np.cov(flat.T).reshape(p, p))
        ess = np.asarray(effective_sample_size(phi)) if C > 1 or S > 3 else np.full(p, flat.shape[0])
        rhat = np.asarray(split_gelman_rubin(phi)) if C > 1 else np.full(p, np.nan)
        n_eff = float(np.min(ess))
        diag = {"ess_min": n_eff, "rhat_max": float(np.nanmax(rhat)) if C > 1 else float("nan")}
        diag.update({k: float(v[b]) for k, v in extra.items()})
        cv = None
        if control_variates:
            cv = zero_variance_moments(zs[b].reshape(-1, D), scores[b].reshape(-1, D), p)
        diag["control_variates"] = float(cv is not None)  # 0: too few draws for the CV regression
        if cv is not None:
            mean, cov = cv
        elif precision_correction and n_eff > p + 3:
            # E[inv(sample cov)] = (n-1)/(n-p-2) * true precision for Gaussian draws.
            cov = cov * (n_eff - 1) / (n_eff - p - 2)
        ok = is_pd(cov)
        res = TiltedResult(mean, cov, ok=ok, message="" if ok else f"{label} covariance not PD", diagnostics=diag)
        if keep_draws:
            res.draws = {"phi": flat}
            rest = zs[b].reshape(-1, D)[:, p:]
            if d:
                res.draws["theta"] = rest[:, :d]
            res.draws["z"] = rest[:, d:]
        out.append(res)
    return out


def zero_variance_moments(x: np.ndarray, score: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean and covariance of ``x[:, :p]`` under p(x), with zero-variance control variates.

    ``x`` (N, D) are draws from p and ``score`` (N, D) the gradients of log p at them. By
    Stein's identity, ``s_k(x)`` and ``x_l s_k(x) + delta_kl`` have mean zero under p for
    every k, l (integration by parts, for p vanishing fast at infinity). Regressing each
    target (``x_j`` and ``(x_j - m)(x_i - m)``) on these ``D + D^2`` functions and keeping
    the intercept removes the part of the Monte-Carlo error they explain: all of it when p
    is Gaussian (then first and second moments are linear combinations of them), most of
    it when p is close to Gaussian (Mira, Solgi & Imparato 2013). With fewer than
    ``4 (D + D^2)`` draws only the products with ``l < p`` are used (``D + p D`` functions,
    still exact for a Gaussian). Returns ``None`` when there are fewer than ``4 (D + p D)``
    draws or the result is not PD.
    """
    N, D = x.shape
    m0 = x[:, :p].mean(axis=0)
    xc = x - x.mean(axis=0)
    if N >= 4 * (D + D * D):
        H = np.concatenate(
            [score, (xc[:, None, :] * score[:, :, None]).reshape(N, D * D) + np.eye(D).reshape(1, -1)], axis=1
        )
    elif N >= 4 * (D + p * D):
        # Too few draws for all D^2 products: keep x_l s_k for l among the first p only.
        # Still exact for a Gaussian, since there x_j - m_j = -(P^-1 s)_j, so
        # (x_i - m_i)(x_j - m_j) lies in the span of {x_i s_k, s_k} for i, j < p.
        H = np.concatenate(
            [score, (xc[:, :p, None] * score[:, None, :]).reshape(N, p * D) + np.eye(D)[:p].reshape(1, -1)], axis=1
        )
    else:
        return None
    Hbar = H.mean(axis=0)
    H = H - Hbar
    d = x[:, :p] - m0
    iu = np.triu_indices(p)
    G = np.concatenate([x[:, :p], (d[:, :, None] * d[:, None, :])[:, iu[0], iu[1]]], axis=1)
    beta = least_squares(H, G - G.mean(axis=0))
    # H was centred on its sample mean, so mean(G - H beta) = mean(G); the correction is the
    # sample mean of the *uncentred* control variates (true mean zero) times beta.
    est = G.mean(axis=0) - Hbar @ beta
    mean = est[:p]
    second = np.zeros((p, p))
    second[iu] = est[p:]
    second = second + np.triu(second, 1).T
    dm = mean - m0
    cov = symmetrize(second - np.outer(dm, dm))
    if not (np.all(np.isfinite(cov)) and is_pd(cov)):
        return None
    return mean, cov


def least_squares(H: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """``lstsq(H, Y)``: by the normal equations of the column-scaled ``H`` (3-5x faster than
    lstsq's SVD for the control-variate regressions of thousands of draws) while they are
    well conditioned (condition number below 1e10, so that the coefficients keep at least
    six digits, far more than a control-variate regression needs), else by lstsq."""
    scale = np.sqrt(np.einsum("ij,ij->j", H, H))
    if np.all(scale > 0):
        Hs = H / scale
        G = Hs.T @ Hs
        if np.linalg.cond(G) < 1e10:
            return np.linalg.solve(G, Hs.T @ Y) / scale[:, None]
    return np.linalg.lstsq(H, Y, rcond=None)[0]
