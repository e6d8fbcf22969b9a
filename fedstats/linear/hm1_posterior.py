"""HM1's posteriors: the Gaussian posterior of the coefficients given Omega, and the EM
estimate of Omega from the clients' shared information (see :mod:`fedstats.linear.structural`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy import linalg as sla

from .hm1_algorithm import jittered_cholesky, relative_change, solve_omega


def noise_vars(noise_sd, clients) -> dict | None:
    if noise_sd is None:
        return None
    if isinstance(noise_sd, Mapping):
        unknown = [c for c in noise_sd if c not in clients]
        if unknown:
            raise ValueError(f"noise_sd names unknown client(s): {unknown[:5]}")
        vals = dict(noise_sd)
    else:
        vals = {c: noise_sd for c in clients}
    out = {}
    for c, v in vals.items():
        v = float(v)
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"noise_sd of client {c!r} must be positive, got {v!r}")
        out[c] = v**2
    return out


def joint_posterior(omega, information, score, jitter: float = 1e-8):
    """Mean (K, d) and the full covariance (K d, K d), client-major, of ``vec(Theta)`` given
    Omega: precision ``blockdiag(information_k) + Omega^{-1} kron I_d``, linear term ``score``."""
    K, d = score.shape
    omega_inv = solve_omega(omega, np.eye(K), jitter)
    P = np.kron((omega_inv + omega_inv.T) / 2, np.eye(d))
    for k in range(K):
        P[k * d : (k + 1) * d, k * d : (k + 1) * d] += information[k]
    L, _ = jittered_cholesky(P, 1e-12)
    cov = sla.cho_solve((L, True), np.eye(K * d))
    return (cov @ score.reshape(-1)).reshape(K, d), cov


def conditional_posterior(omega, information, score, jitter: float = 1e-8):
    """Mean (K, d) and per-client covariance (K, d, d) of ``vec(Theta)`` given Omega:
    precision ``blockdiag(information_k) + Omega^{-1} kron I_d``, linear term ``score_k``."""
    K, d = score.shape
    mean, cov = joint_posterior(omega, information, score, jitter)
    blocks = np.stack([cov[k * d : (k + 1) * d, k * d : (k + 1) * d] for k in range(K)])
    return mean, (blocks + np.swapaxes(blocks, 1, 2)) / 2


def em_omega(
    information, score, *, prior_rows: float, start=None, tol: float = 1e-6, max_iter: int = 500, jitter: float = 1e-8
) -> tuple[np.ndarray, dict]:
    """Omega estimated from the clients' information by EM with ``prior_rows`` (nu)
    pseudo-rows of coefficients from ``N(0, T)`` (see the module docs):

        Omega <- (S + nu T) / (d + nu),   S = E[Theta^T Theta | y, Omega],

    where ``S = M^T M + sum_j Cov(row j of Theta)`` under the conditional posterior given the
    current Omega (M the posterior mean) and ``T = tau^2 ((1 - rho) I + rho 1 1^T)`` is the
    exchangeable covariance with the mean variance and mean covariance of ``S / d``
    (:func:`exchangeable_target`). Iterates from ``start`` (default ``tau0^2 I`` from least
    squares) until the relative change (Frobenius) is below ``tol``. Returns ``(Omega,
    info)``, info holding ``iterations``, ``converged``, ``last_change``, ``tau2``, ``rho`` and
    ``prior_rows``. Each iteration factors the K d x K d posterior precision."""
    K, d = score.shape
    nu = float(prior_rows)
    if start is None:
        tau0 = np.mean([np.sum(np.linalg.lstsq(information[k], score[k], rcond=None)[0] ** 2) / d for k in range(K)])
        start = (tau0 if np.isfinite(tau0) and tau0 > 0 else 1.0) * np.eye(K)
    omega = (np.asarray(start, dtype=float) + np.asarray(start, dtype=float).T) / 2
    change, it = np.inf, 0
    tau2, rho, _ = exchangeable_target(omega)
    for it in range(1, max_iter + 1):
        mean, cov = joint_posterior(omega, information, score, jitter)
        S = mean @ mean.T + np.einsum("kjlj->kl", cov.reshape(K, d, K, d))
        tau2, rho, target = exchangeable_target(S / d)
        new = (S + nu * target) / (d + nu)
        new = (new + new.T) / 2
        change = relative_change(new, omega)
        omega = new
        if change < tol:
            break
    return omega, {
        "iterations": it,
        "converged": bool(change < tol),
        "last_change": float(change),
        "tau2": tau2,
        "rho": rho,
        "prior_rows": nu,
    }


def exchangeable_target(A: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The exchangeable (compound-symmetric) covariance closest in average to ``A``:
    ``tau^2 ((1 - rho) I + rho 1 1^T)`` with ``tau^2`` the mean diagonal and ``rho tau^2`` the
    mean off-diagonal entry of ``A`` (rho clipped to ``[-1/(K-1), 1]``). Returns
    ``(tau^2, rho, target)``."""
    K = len(A)
    tau2 = float(np.trace(A) / K)
    if not tau2 > 0:
        return 1.0, 0.0, np.eye(K)
    rho = float((A.sum() - np.trace(A)) / (K * (K - 1)) / tau2)
    rho = min(max(rho, -1.0 / (K - 1)), 1.0)
    return tau2, rho, tau2 * ((1 - rho) * np.eye(K) + rho * np.ones((K, K)))


def integrate_noise(
    mean: np.ndarray,
    cov: np.ndarray,
    information: np.ndarray,
    score: np.ndarray,
    noise_var: np.ndarray,
    n_obs: np.ndarray,
    estimated: np.ndarray,
    *,
    points: int = 200,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Client posteriors with each estimated noise variance integrated out instead of plugged in.

    ``mean`` (K, d) and ``cov`` (K, d, d) are the posteriors given Omega with every client's
    noise variance at its estimate ``s_k^2 = noise_var[k]`` (``information`` and ``score``
    are ``X'X / s^2`` and ``X'y / s^2``). For each client with ``estimated[k]``, given Omega
    and the other clients' noise variances, its coefficients' prior from Omega and the other
    clients is the cavity ``N(Q^-1 b, Q^-1)`` with ``Q = cov_k^-1 - information_k`` and
    ``b = cov_k^-1 mean_k - score_k``, and with ``w = s^2 / sigma^2`` and the Jeffreys prior
    (flat in ``log w``) the exact marginal posterior of the noise variance is

        log p(w | y) = (n / 2) log w - w c / 2 - log|w I_k + Q| / 2
                       + (w u + b)' (w I_k + Q)^-1 (w u + b) / 2 + const    (per unit of log w),

    ``I_k, u`` the information and score, ``c = y'y / s^2 = (n - rank) + u' I_k^+ u``
    (the residual and fitted sums of squares, from the shared statistics and the row count
    ``n``). Given ``w`` the coefficients are ``N((w I_k + Q)^-1 (w u + b), (w I_k + Q)^-1)``; the
    result is that Gaussian mixture over ``points`` points of ``log w`` spanning where the
    density is above ``exp(-30)`` of its maximum, summarised by its mean and covariance,
    and the noise variance's posterior mean ``E[sigma^2 | y]``. Clients with a known noise
    variance keep theirs. Returns ``(mean, cov, noise_var)``; deterministic (no draws).
    """
    mean, cov, noise_var = mean.copy(), cov.copy(), np.asarray(noise_var, dtype=float).copy()
    K, d = mean.shape
    for k in np.flatnonzero(estimated):
        I, u, s2 = information[k], score[k], noise_var[k]
        L, _ = jittered_cholesky(cov[k], 1e-12)
        P = sla.cho_solve((L, True), np.eye(d))
        P = (P + P.T) / 2
        lam, V = np.linalg.eigh(P - I)
        # the cavity precision is positive definite; the difference can round below 0
        Q = (V * np.clip(lam, 1e-12 * float(np.mean(np.diag(P))), None)) @ V.T
        b = P @ mean[k] - u
        rank = np.linalg.matrix_rank(I)
        fitted = float(u @ np.linalg.lstsq(I, u, rcond=None)[0])
        c = (float(n_obs[k]) - rank) + fitted

        def logp(t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            w = np.exp(t)[:, None, None]
            A = w * I + Q  # (G, d, d)
            r = w[:, :, 0] * u + b  # (G, d)
            Lg = np.linalg.cholesky(A)
            z = np.linalg.solve(Lg, r[:, :, None])[:, :, 0]
            logdet = 2 * np.log(np.diagonal(Lg, axis1=1, axis2=2)).sum(axis=1)
            lp = 0.5 * float(n_obs[k]) * t - 0.5 * np.exp(t) * c - 0.5 * logdet + 0.5 * np.sum(z**2, axis=1)
            return lp, A, r

        coarse = np.linspace(-40.0, 40.0, 801)
        lp, _, _ = logp(coarse)
        keep = coarse[lp > lp.max() - 30.0]
        step = coarse[1] - coarse[0]
        t = np.linspace(keep[0] - step, keep[-1] + step, points)
        lp, A, r = logp(t)
        p = np.exp(lp - lp.max())
        p /= p.sum()
        Li = np.linalg.solve(np.linalg.cholesky(A), np.broadcast_to(np.eye(d), A.shape))
        Vg = np.einsum("gki,gkj->gij", Li, Li)  # (w I + Q)^-1 = L^-T L^-1
        mg = np.einsum("gij,gj->gi", Vg, r)
        m = p @ mg
        C = np.einsum("g,gij->ij", p, Vg) + np.einsum("g,gi,gj->ij", p, mg, mg) - np.outer(m, m)
        mean[k], cov[k] = m, (C + C.T) / 2
        noise_var[k] = float(p @ (s2 / np.exp(t)))
    return mean, cov, noise_var
