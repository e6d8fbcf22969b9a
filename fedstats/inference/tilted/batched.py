"""Linear algebra on very many small matrices at once, in numpy, with the matrix axes
*leading*: a batch of ``d x d`` matrices is an array ``(d, d, *batch)``, a batch of vectors
``(d, *batch)``.

LAPACK's batched routines (``np.linalg.cholesky`` on ``(N, 4, 4)``) pay a fixed cost per
matrix; here each step of the algorithm is one vectorised operation over the whole batch
(``d`` steps in all), about ten times faster for ``d <= 8`` and 10^5 matrices, with nothing
to compile. Used by the Rao-Blackwellised tilted moments, which factorise one small matrix
per importance draw.
"""

from __future__ import annotations

import numpy as np


def cholesky(A: np.ndarray) -> np.ndarray:
    """Lower Cholesky factors of a batch ``A`` (d, d, *batch). A matrix that is not positive
    definite gets NaN in its factor (no exception: callers mask such draws)."""
    d = A.shape[0]
    L = np.zeros_like(A)
    with np.errstate(invalid="ignore", divide="ignore"):
        for j in range(d):
            s = A[j, j] - np.sum(L[j, :j] ** 2, axis=0)
            L[j, j] = np.sqrt(np.where(s > 0, s, np.nan))
            if j + 1 < d:
                L[j + 1 :, j] = (A[j + 1 :, j] - np.sum(L[j + 1 :, :j] * L[j, :j][None], axis=1)) / L[j, j]
    return L


def solve_lower(L: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``L^{-1} b`` for lower-triangular ``L`` (d, d, *batch) and ``b`` (d, *batch)."""
    x = np.empty(np.broadcast_shapes(L.shape[1:], b.shape))
    for i in range(L.shape[0]):
        x[i] = (b[i] - np.sum(L[i, :i] * x[:i], axis=0)) / L[i, i]
    return x


def solve_upper_t(L: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``L^{-T} b`` for lower-triangular ``L`` (d, d, *batch) and ``b`` (d, *batch)."""
    d = L.shape[0]
    x = np.empty(np.broadcast_shapes(L.shape[1:], b.shape))
    for i in reversed(range(d)):
        x[i] = (b[i] - np.sum(L[i + 1 :, i] * x[i + 1 :], axis=0)) / L[i, i]
    return x


def inv_lower(L: np.ndarray) -> np.ndarray:
    """``L^{-1}`` (lower triangular) for lower-triangular ``L`` (d, d, *batch)."""
    d = L.shape[0]
    M = np.zeros_like(L)
    for i in range(d):
        # row i of L^{-1}: (e_i - sum_{k<i} L[i, k] M[k, :]) / L[i, i], nonzero up to column i
        M[i, : i + 1] = -np.sum(L[i, :i, None] * M[:i, : i + 1], axis=0)
        M[i, i] += 1.0
        M[i, : i + 1] /= L[i, i][None]
    return M


def inv_from_cholesky(L: np.ndarray) -> np.ndarray:
    """``(L L^T)^{-1} = L^{-T} L^{-1}`` for lower-triangular ``L`` (d, d, *batch)."""
    M = inv_lower(L)
    d = L.shape[0]
    out = np.empty_like(M)
    for i in range(d):
        for j in range(i + 1):
            # M is lower triangular: only rows k >= i contribute to (M^T M)[i, j], j <= i
            out[i, j] = out[j, i] = np.sum(M[i:, i] * M[i:, j], axis=0)
    return out


def logdet_from_cholesky(L: np.ndarray) -> np.ndarray:
    """``log |L L^T|`` for lower-triangular ``L`` (d, d, *batch) -> (*batch)."""
    d = L.shape[0]
    return 2.0 * np.sum(np.log(np.stack([L[i, i] for i in range(d)])), axis=0)


def matvec(A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``A x`` for ``A`` (m, d, *batch) and ``x`` (d, *batch), broadcasting the batch axes."""
    out = A[:, 0] * x[0]
    for j in range(1, A.shape[1]):
        out = out + A[:, j] * x[j]
    return out


def quad(x: np.ndarray, A: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """``x^T A y`` (``y = x`` by default) for ``A`` (d, d, *batch), ``x``, ``y`` (d, *batch)."""
    return np.sum(x * matvec(A, x if y is None else y), axis=0)
