"""The multivariate normal posterior."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scipy import linalg, stats

from ...arviz_export import from_draws
from ...result_file import register
from ._checks import (
    Predicate,
    Seed,
    Selection,
    as_rng,
    check_affine,
    check_cov,
    check_kind,
    check_level,
    check_n,
    check_names,
    check_pred_output,
    cov_factor,
    finite_array,
    mvn_draw,
    symmetrised,
)
from .base import Posterior

if TYPE_CHECKING:
    from arviz import InferenceData


@register
class GaussianPosterior(Posterior):
    """Multivariate normal posterior ``theta ~ N(mean, cov)``.

    Parameters
    ----------
    mean : array_like, shape (p,)
    cov : array_like, shape (p, p)
        Symmetric positive semi-definite covariance. Asymmetry at rounding level is
        symmetrised away; a covariance that is not symmetric or has a clearly negative
        eigenvalue raises ``ValueError``. Singular covariances are allowed (e.g. the
        posterior of ``X @ theta`` with more rows than parameters).
    names : sequence of str, optional
        Component names; default ``theta[0]``, ``theta[1]``, ...

    See Also
    --------
    GaussianPosterior.from_natural : construct from precision ``Q`` and shift ``r``.

    Notes
    -----
    Moments, intervals, ``prob_positive``, ``tail_probability``, ``marginal`` and
    ``affine`` are exact; :meth:`prob` of a general event is a seeded Monte-Carlo
    estimate and :meth:`to_arviz` stores seeded draws.

    Examples
    --------
    >>> post = GaussianPosterior([1.0, 0.0], [[1.0, 0.3], [0.3, 0.5]], names=["a", "b"])
    >>> post
    GaussianPosterior(dim=2, names=['a', 'b'])
    >>> lo, hi = post.credible_interval(0.95)
    >>> lo.round(3).tolist(), hi.round(3).tolist()
    ([-0.96, -1.386], [2.96, 1.386])
    """

    def __init__(self, mean: ArrayLike, cov: ArrayLike, names: Sequence[str] | None = None) -> None:
        mean = np.atleast_1d(finite_array(mean, "mean"))
        if mean.ndim != 1 or mean.shape[0] == 0:
            raise ValueError(f"mean must be a non-empty vector, got shape {mean.shape}")
        self._mean = mean.copy()
        self._cov = check_cov(cov, mean.shape[0])
        self._names = check_names(names, mean.shape[0])
        self._factor: np.ndarray | None = None  # L with L L^T = cov, computed on demand
        # information form, kept when built from it (else computed on demand)
        self._precision: np.ndarray | None = None
        self._shift: np.ndarray | None = None

    @classmethod
    def from_natural(cls, r: ArrayLike, Q: ArrayLike, names: Sequence[str] | None = None) -> GaussianPosterior:
        """Build from information (natural) form: precision ``Q`` and shift ``r = Q mean``.

        Federated models aggregate posteriors in this form (precisions and shifts add
        across data holders). The mean is obtained by Cholesky solves; the covariance
        from the inverse of the Cholesky factor, whose transpose also serves as the
        sampling factor, so ``Q`` is never inverted directly.

        Parameters
        ----------
        r : array_like, shape (p,)
        Q : array_like, shape (p, p)
            Symmetric positive definite precision matrix; otherwise ``ValueError``.
        names : sequence of str, optional

        Returns
        -------
        GaussianPosterior

        Examples
        --------
        >>> post = GaussianPosterior.from_natural([2.0, 1.0], [[2.0, 0.0], [0.0, 4.0]])
        >>> post.mean.round(12).tolist(), np.diag(post.cov).round(12).tolist()
        ([1.0, 0.25], [0.5, 0.25])
        """
        Q = finite_array(Q, "Q")
        r = np.atleast_1d(finite_array(r, "r"))
        if r.ndim != 1 or r.shape[0] == 0:
            raise ValueError(f"r must be a non-empty vector, got shape {r.shape}")
        p = r.shape[0]
        if Q.ndim == 0 and p == 1:
            Q = Q.reshape(1, 1)
        if Q.shape != (p, p):
            raise ValueError(f"Q must have shape ({p}, {p}), got {Q.shape}")
        Q = symmetrised(Q, "precision Q")
        try:
            L = np.linalg.cholesky(Q)
        except np.linalg.LinAlgError:
            raise ValueError("precision Q is not positive definite") from None
        # Q = L L^T  =>  cov = L^-T L^-1 and mean = L^-T L^-1 r
        L_inv = linalg.solve_triangular(L, np.eye(p), lower=True)
        mean = linalg.cho_solve((L, True), r)
        cov = L_inv.T @ L_inv
        post = cls(mean, 0.5 * (cov + cov.T), names=names)
        post._factor = L_inv.T  # (L^-T)(L^-T)^T = cov: exact sampling factor for free
        post._precision, post._shift = Q, r.copy()
        return post

    def to_natural(self) -> tuple[np.ndarray, np.ndarray]:
        """Information form ``(r, Q)``: precision ``Q = cov^-1`` and ``r = Q mean``.

        Returns
        -------
        r : numpy.ndarray, shape (p,)
        Q : numpy.ndarray, shape (p, p)

        Raises
        ------
        ValueError
            If the covariance is singular (no precision exists).

        Examples
        --------
        >>> r, Q = GaussianPosterior([1.0], [[0.5]]).to_natural()
        >>> r.round(12).tolist(), Q.round(12).tolist()
        ([2.0], [[2.0]])
        """
        if self._precision is None or self._shift is None:  # both set together, or neither
            try:
                c = linalg.cho_factor(self._cov, lower=True)
            except linalg.LinAlgError:
                raise ValueError("cov is singular: the posterior has no precision matrix") from None
            Q = linalg.cho_solve(c, np.eye(self.dim))
            self._precision = 0.5 * (Q + Q.T)
            self._shift = linalg.cho_solve(c, self._mean)  # solve, not Q @ mean
        return self._shift.copy(), self._precision.copy()

    # ---- moments ----------------------------------------------------------------

    @property
    def mean(self) -> np.ndarray:
        """Posterior mean, shape (p,)."""
        return self._mean.copy()

    @property
    def cov(self) -> np.ndarray:
        """Posterior covariance, shape (p, p)."""
        return self._cov.copy()

    # ---- draws, intervals, probabilities -----------------------------------------

    def _get_factor(self) -> np.ndarray:
        if self._factor is None:
            self._factor = cov_factor(self._cov)
        return self._factor

    def sample(self, n: int, seed: Seed = None) -> np.ndarray:
        """``n`` independent draws, shape (n, p).

        Parameters
        ----------
        n : int
        seed : int, numpy.random.Generator or None

        Examples
        --------
        >>> GaussianPosterior([0.0, 1.0], np.eye(2)).sample(3, seed=1).shape
        (3, 2)
        """
        return mvn_draw(self._mean, self._get_factor(), check_n(n), as_rng(seed))

    def credible_interval(self, level: float = 0.95, kind: str = "eti") -> tuple[np.ndarray, np.ndarray]:
        """Exact marginal credible intervals.

        Parameters
        ----------
        level : float
            Posterior mass of each interval, in (0, 1).
        kind : {"eti", "hdi"}
            ``"eti"``: normal quantiles ``(1 - level)/2`` and ``(1 + level)/2``.
            ``"hdi"``: the same interval, since normal marginals are symmetric and
            unimodal.

        Returns
        -------
        lower, upper : numpy.ndarray, shape (p,)

        Examples
        --------
        >>> lo, hi = GaussianPosterior([0.0], [[1.0]]).credible_interval(0.95)
        >>> round(float(hi[0]), 4)
        1.96
        """
        level = check_level(level)
        check_kind(kind)
        sd = self.sd
        lower = self._mean + sd * stats.norm.ppf((1.0 - level) / 2.0)
        upper = self._mean + sd * stats.norm.ppf((1.0 + level) / 2.0)
        return lower, upper

    def prob(self, pred: Predicate, n: int = 100_000, seed: Seed = 0) -> float:
        """Monte-Carlo posterior probability of an event.

        Parameters
        ----------
        pred : callable
            Takes an (n, p) array of draws, returns n booleans.
        n : int
            Number of draws; the Monte-Carlo standard error is at most ``0.5/sqrt(n)``.
        seed : int, numpy.random.Generator or None
            Fixed by default so that repeated calls agree.

        Returns
        -------
        float

        Examples
        --------
        >>> post = GaussianPosterior([1.0, 0.0], np.eye(2))
        >>> round(post.prob(lambda t: t[:, 0] > t[:, 1]), 2)  # exact: Phi(1/sqrt(2))
        0.76
        """
        if not callable(pred):
            raise TypeError("pred must be a callable taking an (n, p) array of draws")
        n = check_n(n)
        draws = self.sample(n, seed=seed)
        return float(np.mean(check_pred_output(pred(draws), n)))

    def prob_positive(self) -> np.ndarray:
        """Exact ``P(theta_i > 0) = Phi(mean_i / sd_i)``, shape (p,).

        A degenerate component (sd 0) gives 1, 0, or 1/2 when its mean is exactly 0.

        Examples
        --------
        >>> GaussianPosterior([0.0, 1.96], np.eye(2)).prob_positive().round(3).tolist()
        [0.5, 0.975]
        """
        sd = self.sd
        out = np.where(self._mean > 0, 1.0, np.where(self._mean < 0, 0.0, 0.5))
        pos = sd > 0
        out[pos] = stats.norm.cdf(self._mean[pos] / sd[pos])
        return out

    def tail_probability(self) -> np.ndarray:
        # 2 * sf(|z|) rather than 2 * min(cdf, 1 - cdf): no cancellation in far tails
        sd = self.sd
        out = np.where(self._mean == 0, 1.0, 0.0)
        pos = sd > 0
        out[pos] = 2.0 * stats.norm.sf(np.abs(self._mean[pos]) / sd[pos])
        return np.clip(out, 0.0, 1.0)

    # ---- derived posteriors --------------------------------------------------------

    def marginal(self, index_or_names: Selection) -> GaussianPosterior:
        """Exact marginal posterior of the selected components.

        Parameters
        ----------
        index_or_names : int, str, slice, or sequence of int / str

        Returns
        -------
        GaussianPosterior

        Examples
        --------
        >>> post = GaussianPosterior([1.0, 2.0, 3.0], np.eye(3), names=["a", "b", "c"])
        >>> post.marginal(["c", "a"]).mean.tolist()
        [3.0, 1.0]
        """
        idx = self._resolve(index_or_names)
        return GaussianPosterior(self._mean[idx], self._cov[np.ix_(idx, idx)], names=[self._names[i] for i in idx])

    def affine(self, A: ArrayLike, b: ArrayLike | None = None, names: Sequence[str] | None = None) -> GaussianPosterior:
        """Exact posterior of ``A @ theta + b``: ``N(A mean + b, A cov A^T)``.

        Parameters
        ----------
        A : array_like, shape (q, p) (a vector of length p is treated as one row)
        b : array_like, shape (q,) or scalar, optional
        names : sequence of str, optional
            Names of the q outputs; default ``theta[0]``, ...

        Returns
        -------
        GaussianPosterior

        Examples
        --------
        >>> post = GaussianPosterior([1.0, 2.0], np.eye(2))
        >>> pred = post.affine([[1.0, 1.0]], b=[0.5], names=["y"])
        >>> pred.mean.tolist(), pred.cov.tolist()
        ([3.5], [[2.0]])
        """
        A, b = check_affine(A, b, self.dim)
        cov = A @ self._cov @ A.T
        return GaussianPosterior(A @ self._mean + b, 0.5 * (cov + cov.T), names=names)

    def to_arviz(self, var_name: str = "theta", n: int = 4000, seed: Seed = 0, n_chains: int = 4) -> InferenceData:
        """Seeded posterior draws as an :class:`arviz.InferenceData`.

        Parameters
        ----------
        var_name : str
            Variable name in the posterior group; its dimension is ``f"{var_name}_dim_0"``
            with the component names as coordinates.
        n : int
            Total number of draws, split into ``n_chains`` chains of ``n // n_chains``.
        seed : int, numpy.random.Generator or None
        n_chains : int
            Number of (independent) chains; must divide ``n``.

        Returns
        -------
        arviz.InferenceData

        Examples
        --------
        >>> post = GaussianPosterior([0.0, 1.0], np.eye(2), names=["a", "b"])
        >>> idata = post.to_arviz()
        >>> idata.posterior["theta"].shape
        (4, 1000, 2)
        >>> idata.posterior["theta_dim_0"].values.tolist()
        ['a', 'b']
        """
        n, n_chains = check_n(n), check_n(n_chains, "n_chains")
        if n % n_chains:
            raise ValueError(f"n={n} is not a multiple of n_chains={n_chains}")
        draws = self.sample(n, seed=seed).reshape(n_chains, n // n_chains, self.dim)
        return from_draws(draws, self._names, var_name)

    def __repr__(self) -> str:
        return f"GaussianPosterior(dim={self.dim}, names={self._short_names()})"
