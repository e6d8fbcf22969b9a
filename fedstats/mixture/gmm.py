"""Gaussian-mixture numerics shared by FedEM, D-FedEM and variational FedEM (numpy only).

Everything here works on whole arrays of points: no Python loop over data points, only
over components (and, for full scatter matrices, over clients).

Layout (scikit-learn's, so parameters can be compared one to one):

==========  ====================  ===============================================
cov_type    covariances           statistic ``S2`` of one client (per component j)
==========  ====================  ===============================================
full        (M, d, d)             sum_i r_ij (x_i - a_j)(x_i - a_j)^T   (M, d, d)
tied        (d, d)                same as full                          (M, d, d)
diag        (M, d)                sum_i r_ij (x_i - a_j)**2             (M, d)
spherical   (M,)                  sum_i r_ij ||x_i - a_j||^2            (M,)
==========  ====================  ===============================================

Statistics are *shifted*: they are reported about a reference point ``a_j`` per component
(the component means the client was sent), which keeps them well conditioned; they are computed about the centre of the means (see :func:`centre`).
:func:`reshift` moves statistics to another reference exactly.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

COV_TYPES = ("full", "tied", "diag", "spherical")
LOG_2PI = float(np.log(2 * np.pi))


class DegenerateCovarianceError(np.linalg.LinAlgError):
    """A covariance matrix that is not positive definite even after jitter."""


def check_cov_type(cov_type: str) -> str:
    if cov_type not in COV_TYPES:
        raise ValueError(f"covariance_type must be one of {COV_TYPES}, got {cov_type!r}")
    return cov_type


def cov_shape(cov_type: str, M: int, d: int) -> tuple[int, ...]:
    return {"full": (M, d, d), "tied": (d, d), "diag": (M, d), "spherical": (M,)}[cov_type]


def s2_shape(cov_type: str, M: int, d: int) -> tuple[int, ...]:
    return {"full": (M, d, d), "tied": (M, d, d), "diag": (M, d), "spherical": (M,)}[cov_type]


def full_covariances(cov: np.ndarray, cov_type: str, M: int, d: int) -> np.ndarray:
    """Every component's covariance as an ``(M, d, d)`` array."""
    if cov_type == "full":
        return np.array(cov, dtype=float)
    if cov_type == "tied":
        return np.broadcast_to(cov, (M, d, d)).copy()
    if cov_type == "diag":
        return np.stack([np.diag(c) for c in cov])
    return np.stack([np.eye(d) * c for c in cov])


def _chol_lower(a: np.ndarray, what: str) -> np.ndarray:
    """Lower Cholesky factor; jitter 10^k * eps * scale (k = 0..8) before giving up."""
    try:
        return linalg.cholesky(a, lower=True)
    except linalg.LinAlgError:
        pass
    scale = max(float(np.mean(np.abs(np.diag(a)))), 1e-300)
    for k in range(9):
        try:
            return linalg.cholesky(a + np.eye(a.shape[0]) * (10.0**k) * np.finfo(float).eps * scale, lower=True)
        except linalg.LinAlgError:
            continue
    raise DegenerateCovarianceError(f"{what} is not positive definite (increase reg_covar)")


def precision_cholesky(cov: np.ndarray, cov_type: str) -> np.ndarray:
    """Cholesky factors of the precisions, as scikit-learn's ``precisions_cholesky_``.

    full: (M, d, d) upper-triangular-in-use ``P_j`` with ``Sigma_j^{-1} = P_j P_j^T``;
    tied: (d, d); diag: (M, d) ``1/sqrt(var)``; spherical: (M,).
    """
    if cov_type in ("full", "tied"):
        covs = cov if cov_type == "full" else cov[None]
        out = np.empty_like(covs)
        for j, c in enumerate(covs):
            L = _chol_lower(c, f"the covariance of component {j}" if cov_type == "full" else "the tied covariance")
            out[j] = linalg.solve_triangular(L, np.eye(c.shape[0]), lower=True).T
        return out if cov_type == "full" else out[0]
    if np.any(cov <= 0):
        j = int(np.flatnonzero(np.ravel(cov <= 0))[0])
        raise DegenerateCovarianceError(f"a variance is not positive (entry {j}); increase reg_covar")
    return 1.0 / np.sqrt(cov)


def log_gaussian(X: np.ndarray, means: np.ndarray, prec_chol: np.ndarray, cov_type: str) -> np.ndarray:
    """``log N(x_i; mu_j, Sigma_j)`` for every point and component: ``(n, M)``.

    Matrix products over all points at once (the diagonal and spherical cases expand the
    square as scikit-learn does; callers centre ``X`` near the means first, see
    :func:`centre`, so the expansion loses nothing). Computed component by row, ``(M, n)``,
    and returned as its transpose (Fortran order): the reductions over components of
    :func:`e_step` then run along contiguous rows.
    """
    n, d = X.shape
    M = means.shape[0]
    XT = X.T
    if cov_type in ("full", "tied"):
        P = prec_chol if cov_type == "full" else np.broadcast_to(prec_chol, (M, d, d))
        # one product for every component: row (j, e) of y is (P_j' (x_i - mu_j))_e over i
        y = np.ascontiguousarray(P.transpose(0, 2, 1).reshape(M * d, d)) @ XT
        y -= np.einsum("md,mde->me", means, P).reshape(M * d, 1)
        np.square(y, out=y)
        out = y.reshape(M, d, n).sum(axis=1)
        out *= -0.5
        out += np.sum(np.log(np.diagonal(P, axis1=1, axis2=2)), axis=1)[:, None]
    elif cov_type == "diag":
        prec = prec_chol**2
        out = prec @ XT**2
        out -= 2.0 * ((means * prec) @ XT)
        out += np.sum(means**2 * prec, 1)[:, None]
        out *= -0.5
        out += np.sum(np.log(prec_chol), 1)[:, None]
    else:
        prec = prec_chol**2
        out = np.einsum("ij,ij->i", X, X)[None, :] - 2.0 * (means @ XT) + np.sum(means**2, 1)[:, None]
        out *= -0.5 * prec[:, None]
        out += d * np.log(prec_chol)[:, None]
    out -= 0.5 * d * LOG_2PI
    return out.T


def centre(X: np.ndarray, means: np.ndarray):
    """``(X - g, means - g, g)`` with ``g`` the average of the component means.

    Log-densities and shifted statistics are translation invariant, so a common offset of
    the data (1e8, say) costs nothing. Raw matrix-product moments about ``g`` are then moved
    to each component's mean, which loses about ``log10((max_j ||mu_j - g|| / sigma)^2)``
    digits for components ``max ||mu_j - g||`` apart relative to their spread ``sigma``
    (two digits at ten standard deviations), against one pass per component for
    explicitly shifted moments.
    """
    g = means.mean(0)
    return X - g, means - g, g


def e_step(log_dens: np.ndarray, log_weights: np.ndarray):
    """Responsibilities by log-sum-exp (one exponential per entry).

    ``log_weights`` is ``(M,)`` or ``(n, M)`` (each row's client weights). Returns
    ``(resp (n, M), log_lik (n,), ra (n,))`` where ``ra_i = sum_j r_ij a_ij`` with
    ``a = log_dens + log_weights``, so that the entropy of row i is ``log_lik_i - ra_i``.
    """
    # components by row (M, n): every reduction below runs along contiguous rows
    aT = np.ascontiguousarray((log_dens + log_weights).T)
    amax = aT.max(axis=0)
    e = aT - amax
    np.exp(e, out=e)
    s = e.sum(axis=0)
    ll = amax + np.log(s)
    e /= s
    ra = np.einsum("ji,ji->i", e, aT)
    return e.T, ll, ra


def segment_statistics(X, resp, ll, ra, starts, shift, cov_type):
    """Per-client soft counts, shifted moments, log-likelihoods and entropies.

    ``X`` (n, d) and ``resp`` (n, M) stack the clients' rows; client ``c`` owns rows
    ``starts[c]:starts[c+1]`` (every client non-empty); ``ll``, ``ra`` come from
    :func:`e_step`. Moments are formed by one matrix product per client about the
    reference 0 (callers centre ``X``) and then moved to ``shift`` (M, d) exactly (``None``:
    left about 0).
    Returns ``N (C, M)``, ``S1 (C, M, d)``, ``S2 (C, ...)``, ``loglik (C,)``,
    ``entropy (C,)`` (``-sum r log r``).
    """
    n, d = X.shape
    M = resp.shape[1]
    starts = np.asarray(starts)
    C = len(starts)
    bounds = np.r_[starts, n]
    N = np.add.reduceat(resp, starts, axis=0)
    S1 = np.empty((C, M, d))
    S2 = np.empty((C,) + s2_shape(cov_type, M, d))
    X2 = X**2 if cov_type == "diag" else (np.einsum("ij,ij->i", X, X) if cov_type == "spherical" else None)
    # rows by column: (M, n_c) and (d, n_c) blocks, contiguous along each client's rows
    respT, XT = np.ascontiguousarray(resp.T), np.ascontiguousarray(X.T)
    for c in range(C):
        s = slice(bounds[c], bounds[c + 1])
        rT, XcT = respT[:, s], XT[:, s]
        S1[c] = rT @ XcT.T
        if cov_type in ("full", "tied"):
            S2[c] = ((rT[:, None, :] * XcT[None, :, :]).reshape(M * d, -1) @ XcT.T).reshape(M, d, d)
        else:
            S2[c] = rT @ X2[s]
    if shift is not None:
        S1, S2 = reshift(N, S1, S2, np.zeros((M, d)), shift, cov_type)
    L = np.add.reduceat(ll, starts)
    ent = L - np.add.reduceat(ra, starts)
    return N, S1, S2, L, ent


def estep_statistics(X, starts, means, prec_chol, log_weights, cov_type, ref=None):
    """E-step and statistics of stacked clients in one pass (see :func:`segment_statistics`).

    ``log_weights`` is ``(M,)`` (shared) or ``(C, M)`` (one row per client). The moments are
    about the component means, or, given ``ref = (g, X - g)`` (a fixed point ``g`` (d,) and
    the rows centred on it, computed once), about ``g`` itself: no per-round centring, no move.
    """
    if ref is None:
        Xg, mg, _ = centre(X, means)
        shift = mg  # the moments moved to each component's mean
    else:
        g, Xg = ref
        mg, shift = means - g, None  # the moments left about g
    ld = log_gaussian(Xg, mg, prec_chol, cov_type)
    resp, ll, ra = e_step(ld, _row_weights(log_weights, starts, X.shape[0]))
    return segment_statistics(Xg, resp, ll, ra, starts, shift, cov_type)


def _row_weights(log_weights, starts, n):
    """``(M,)`` as it is, or each client's row of ``(C, M)`` repeated for its rows."""
    lw = np.asarray(log_weights)
    return np.repeat(lw.T, np.diff(np.r_[starts, n]), axis=1).T if lw.ndim == 2 else lw


def reshift(N, S1, S2, old, new, cov_type):
    """Move shifted statistics from reference ``old`` to ``new`` (each (M, d) or, per
    client, (C, M, d)), exactly. Works on one client's arrays or on stacked ``(C, ...)`` ones.
    """
    N = np.asarray(N)
    delta = np.broadcast_to(np.asarray(old, dtype=float) - np.asarray(new, dtype=float), np.shape(S1))
    S1n = S1 + N[..., None] * delta
    if cov_type in ("full", "tied"):
        # S2 + S1 delta' + delta S1' + N delta delta' = S2 + (S1 + N delta) delta' + delta S1'
        S2n = S2 + S1n[..., :, None] * delta[..., None, :]
        S2n += delta[..., :, None] * S1[..., None, :]
    elif cov_type == "diag":
        S2n = S2 + 2 * delta * S1 + N[..., None] * delta**2
    else:
        S2n = S2 + 2 * np.einsum("...md,...md->...m", S1, delta) + N * np.sum(delta**2, axis=-1)
    return S1n, S2n


def m_step(N, S1, S2, shift, cov_type, reg_covar, prev_means=None, prev_cov=None, min_count=None):
    """Component parameters from *summed* statistics (all clients), closed form.

    ``N (M,)``, ``S1 (M, d)``, ``S2`` summed over clients and taken about ``shift``.
    A component whose total soft count is below ``min_count`` keeps its previous
    parameters (``prev_means``/``prev_cov``) and is reported in ``empty``.
    Returns ``(means, covariances, empty)``.
    """
    M, d = S1.shape
    if min_count is None:
        min_count = 1e-8 * max(float(np.sum(N)), 1.0)
    empty = np.flatnonzero(N < min_count)
    Nsafe = np.where(N < min_count, 1.0, N)
    delta = S1 / Nsafe[:, None]
    means = shift + delta
    if cov_type == "full":
        cov = S2 / Nsafe[:, None, None] - np.einsum("md,me->mde", delta, delta)
        cov = 0.5 * (cov + np.swapaxes(cov, 1, 2))
        cov += reg_covar * np.eye(d)
    elif cov_type == "tied":
        live = np.setdiff1d(np.arange(M), empty)
        scatter = S2[live] - N[live, None, None] * np.einsum("md,me->mde", delta[live], delta[live])
        cov = scatter.sum(0) / max(float(N[live].sum()), 1e-300)
        cov = 0.5 * (cov + cov.T) + reg_covar * np.eye(d)
    elif cov_type == "diag":
        cov = S2 / Nsafe[:, None] - delta**2 + reg_covar
    else:
        cov = (S2 / Nsafe - np.sum(delta**2, axis=1)) / d + reg_covar
    if empty.size:
        if prev_means is None:
            raise ValueError(f"component(s) {empty.tolist()} received no mass and have no previous value")
        means[empty] = prev_means[empty]
        if cov_type != "tied":
            cov[empty] = prev_cov[empty]
    return means, cov, empty


def means_and_variances(N, S1, S2, shift, cov_type, reg_covar):
    """The M-step's means and each coordinate's variance (the covariances' diagonals) from
    summed statistics, for several sets at once: ``N (..., M)``, ``S1 (..., M, d)``, ``S2``
    as :func:`s2_shape` with the same leading axes, about ``shift (M, d)``. Components with
    no mass (below ``1e-8`` of the set's total) come out NaN. Returns two ``(..., M, d)``."""
    N = np.asarray(N, dtype=float)
    live = N >= 1e-8 * N.sum(axis=-1, keepdims=True)
    Nsafe = np.where(live, N, np.nan)
    delta = S1 / Nsafe[..., None]
    d = S1.shape[-1]
    if cov_type == "spherical":
        var = (S2[..., None] / Nsafe[..., None] - np.sum(delta**2, axis=-1, keepdims=True)) / d
        return shift + delta, np.broadcast_to(var, delta.shape) + reg_covar
    second = np.diagonal(S2, axis1=-2, axis2=-1) if cov_type in ("full", "tied") else S2
    if cov_type == "tied":
        Nlive = np.where(live, N, 0.0)
        scatter = np.where(live[..., None], second - Nlive[..., None] * delta**2, 0.0).sum(axis=-2)
        var = np.broadcast_to((scatter / Nlive.sum(axis=-1, keepdims=True))[..., None, :], delta.shape)
    else:
        var = second / Nsafe[..., None] - delta**2
    return shift + delta, var + reg_covar


def expected_loglik_terms(N, S1, S2, shift, means, cov, cov_type):
    """``sum_j sum_i r_ij log N(x_i; mu_j, Sigma_j)`` per client from shifted statistics.

    Inputs stacked over clients (``N (C, M)``...). Used for the free energy of
    incremental EM: the server can evaluate it at new parameters from statistics only.
    """
    C, M = N.shape
    d = means.shape[1]
    S1m, S2m = reshift(N, S1, S2, shift, means, cov_type)
    del S1m  # about the component means S1 only enters through S2m
    if cov_type in ("full", "tied"):
        covs = full_covariances(cov, cov_type, M, d)
        logdet = np.empty(M)
        quad = np.empty((C, M))
        for j in range(M):
            L = _chol_lower(covs[j], f"the covariance of component {j}")
            logdet[j] = 2 * np.sum(np.log(np.diag(L)))
            P = linalg.cho_solve((L, True), np.eye(d))
            quad[:, j] = np.einsum("cde,de->c", S2m[:, j], P)
    elif cov_type == "diag":
        logdet = np.sum(np.log(cov), axis=1)
        quad = np.einsum("cmd,md->cm", S2m, 1.0 / cov)
    else:
        logdet = d * np.log(cov)
        quad = S2m / cov
    return np.sum(-0.5 * (N * (d * LOG_2PI + logdet) + quad), axis=1)


def n_parameters(M: int, d: int, cov_type: str, n_clients: int, shared_weights: bool) -> int:
    """Free parameters (for AIC and BIC): means, covariances, and every client's free weights."""
    cov = {"full": M * d * (d + 1) // 2, "diag": M * d, "spherical": M, "tied": d * (d + 1) // 2}[cov_type]
    return M * d + cov + (1 if shared_weights else n_clients) * (M - 1)
