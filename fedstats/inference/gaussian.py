"""Gaussians in information (natural) form: precision ``Q`` and shift ``r = Q mean``.

Products and quotients of Gaussian densities are sums and differences of natural
parameters (Lemma 1 of the linear-models paper), which is all expectation propagation
needs. Everything here is float64 numpy; solves go through Cholesky factors with a
jitter retry, never through explicit inverses of ill-conditioned matrices.

Example
-------
>>> import numpy as np
>>> a = NaturalGaussian.from_moments(np.zeros(2), np.eye(2))
>>> b = NaturalGaussian.from_moments(np.ones(2), 2 * np.eye(2))
>>> (a * b).mean
array([0.33333333, 0.33333333])
>>> ((a * b) / b).mean
array([0., 0.])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla
from numpy.typing import ArrayLike

from ..result_file import register


class NotPositiveDefinite(ValueError):
    """A precision or covariance matrix that should be positive definite is not."""


def symmetrize(M: np.ndarray) -> np.ndarray:
    """Return ``(M + M.T) / 2`` (removes round-off asymmetry)."""
    M = np.asarray(M, dtype=float)
    return 0.5 * (M + np.swapaxes(M, -1, -2))


def is_pd(M: np.ndarray) -> bool:
    """Whether the symmetric matrix ``M`` is (numerically) positive definite."""
    M = np.asarray(M, dtype=float)
    if not np.all(np.isfinite(M)):
        return False
    try:
        np.linalg.cholesky(symmetrize(M))
    except np.linalg.LinAlgError:
        return False
    return True


def cholesky(M: np.ndarray, *, jitter: float = 0.0, max_tries: int = 6) -> np.ndarray:
    """Lower Cholesky factor, adding ``jitter * mean(diag)`` (x10 per retry) if needed.

    With ``jitter=0`` a failure raises :class:`NotPositiveDefinite` at once.
    """
    M = symmetrize(M)
    scale = float(np.mean(np.abs(np.diag(M)))) or 1.0
    eps = 0.0
    for i in range(max_tries if jitter > 0 else 1):
        try:
            return np.linalg.cholesky(M + eps * scale * np.eye(M.shape[0]))
        except np.linalg.LinAlgError:
            eps = jitter * 10**i
    raise NotPositiveDefinite(f"matrix is not positive definite (min eigenvalue {np.linalg.eigvalsh(M).min():.3g})")


def chol_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Solve ``(L L^T) X = B`` given the lower Cholesky factor ``L``."""
    return sla.cho_solve((L, True), B)


def pd_inverse(M: np.ndarray, *, jitter: float = 0.0) -> np.ndarray:
    """Inverse of a positive-definite matrix through its Cholesky factor (symmetric output)."""
    L = cholesky(M, jitter=jitter)
    return symmetrize(chol_solve(L, np.eye(M.shape[0])))


@register
@dataclass(frozen=True)
class NaturalGaussian:
    """A (possibly improper) Gaussian ``exp(r^T x - x^T Q x / 2)`` in natural parameters.

    Sites of EP may have indefinite ``Q``; only ``mean``/``cov`` require ``Q`` to be PD.

    Parameters
    ----------
    r : array, shape (p,)
        Shift, ``Q @ mean``.
    Q : array, shape (p, p)
        Precision matrix (symmetric).
    """

    r: np.ndarray
    Q: np.ndarray

    def __post_init__(self) -> None:
        r = np.asarray(self.r, dtype=float).reshape(-1)
        Q = symmetrize(np.atleast_2d(np.asarray(self.Q, dtype=float)))
        if Q.shape != (r.size, r.size):
            raise ValueError(f"Q has shape {Q.shape}, expected {(r.size, r.size)} to match r")
        if not (np.all(np.isfinite(r)) and np.all(np.isfinite(Q))):
            raise ValueError("natural parameters contain NaN or inf")
        object.__setattr__(self, "r", r)
        object.__setattr__(self, "Q", Q)

    # ----------------------------------------------------------------- constructors
    @classmethod
    def flat(cls, p: int) -> "NaturalGaussian":
        """The uniform (zero) site: ``r = 0``, ``Q = 0``."""
        return cls(np.zeros(p), np.zeros((p, p)))

    @classmethod
    def from_moments(cls, mean: ArrayLike, cov: ArrayLike) -> NaturalGaussian:
        """From mean and covariance (covariance must be PD)."""
        mean = np.asarray(mean, dtype=float).reshape(-1)
        cov = np.atleast_2d(np.asarray(cov, dtype=float))
        L = cholesky(cov)
        Q = symmetrize(chol_solve(L, np.eye(mean.size)))
        return cls(Q @ mean, Q)

    # ----------------------------------------------------------------- algebra
    @property
    def dim(self) -> int:
        return self.r.size

    def __mul__(self, other: "NaturalGaussian") -> "NaturalGaussian":
        return NaturalGaussian(self.r + other.r, self.Q + other.Q)

    def __truediv__(self, other: "NaturalGaussian") -> "NaturalGaussian":
        return NaturalGaussian(self.r - other.r, self.Q - other.Q)

    def __pow__(self, a: float) -> "NaturalGaussian":
        return NaturalGaussian(a * self.r, a * self.Q)

    def interpolate(self, other: "NaturalGaussian", delta: float) -> "NaturalGaussian":
        """``(1 - delta) * self + delta * other`` in natural parameters (EP damping)."""
        return NaturalGaussian((1 - delta) * self.r + delta * other.r, (1 - delta) * self.Q + delta * other.Q)

    def is_proper(self) -> bool:
        """Whether ``Q`` is positive definite (a normalisable density)."""
        return is_pd(self.Q)

    # ----------------------------------------------------------------- moments
    def _chol(self) -> np.ndarray:
        try:
            return cholesky(self.Q)
        except NotPositiveDefinite as exc:
            raise NotPositiveDefinite(f"improper Gaussian has no moments: {exc}") from None

    @property
    def mean(self) -> np.ndarray:
        return chol_solve(self._chol(), self.r)

    @property
    def cov(self) -> np.ndarray:
        return symmetrize(chol_solve(self._chol(), np.eye(self.dim)))

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, cov)`` with a single factorisation."""
        L = self._chol()
        return chol_solve(L, self.r), symmetrize(chol_solve(L, np.eye(self.dim)))

    def logpdf_unnormalized(self, x: np.ndarray) -> np.ndarray:
        """``r^T x - x^T Q x / 2`` at the rows of ``x`` (log density up to a constant)."""
        x = np.atleast_2d(x)
        return x @ self.r - 0.5 * np.einsum("ni,ij,nj->n", x, self.Q, x)

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        """Normalised log density at the rows of ``x`` (requires a PD ``Q``)."""
        L = self._chol()
        m = chol_solve(L, self.r)
        x = np.atleast_2d(x)
        d = x - m
        logdet_Q = 2.0 * np.sum(np.log(np.diag(L)))
        return -0.5 * (self.dim * np.log(2 * np.pi) - logdet_Q + np.einsum("ni,ij,nj->n", d, self.Q, d))

    def to_message(self, prefix: str = "") -> dict[str, np.ndarray]:
        """As a protocol message ``{prefix+'r': r, prefix+'Q': Q}``."""
        return {prefix + "r": self.r.copy(), prefix + "Q": self.Q.copy()}

    @classmethod
    def from_message(cls, msg: Mapping[str, np.ndarray], prefix: str = "") -> NaturalGaussian:
        return cls(msg[prefix + "r"], msg[prefix + "Q"])
