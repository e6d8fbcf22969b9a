"""Posterior distributions returned by every fedstats model.

A fitted model hands back a :class:`Posterior`: the joint posterior of its parameter
vector ``theta`` (length ``p``), with the summaries a statistician reports:

* posterior ``mean``, ``sd``, ``var`` and ``cov``;
* ``credible_interval(level, kind)``: equal-tailed (``"eti"``) or highest-density
  (``"hdi"``) marginal intervals;
* ``prob(pred)``: the posterior probability of an event, ``prob_positive()`` and the
  two-sided posterior tail probability ``tail_probability()``;
* ``sample``, ``marginal``, ``affine`` (e.g. the posterior of a linear predictor
  ``X theta``), ``summary`` (a pandas table) and ``to_arviz``.

Two concrete kinds exist:

* :class:`GaussianPosterior`: a multivariate normal, from moment form ``(mean, cov)``
  or information form ``(r, Q)`` (:meth:`GaussianPosterior.from_natural`); everything
  except :meth:`Posterior.prob` is exact.
* :class:`SamplePosterior`: posterior draws (MCMC output with its chain structure, or
  independent draws), optionally with importance weights.

All arrays in and out are numpy arrays; all randomness comes from an explicit ``seed``
(an int, a :class:`numpy.random.Generator`, or ``None`` for fresh OS entropy), never
from numpy's global random state.

Size: one module for now (about 1,320 lines): the two posterior classes and, at the end, MCMC
diagnostics; the diagnostics move to their own module in issue 20 (as numpyro/diagnostics.py).
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import linalg, stats
from scipy.fft import next_fast_len
from ..results import register

__all__ = [
    "Posterior",
    "GaussianPosterior",
    "SamplePosterior",
    "mvn_sample",
    "tail_probability_from_prob_positive",
]

Seed = int | np.random.Generator | np.random.SeedSequence | None
Predicate = Callable[[np.ndarray], Any]

_KINDS = ("eti", "hdi")
# Relative tolerances for accepting a covariance-like matrix: asymmetry up to this
# fraction of its largest entry is rounding noise and is symmetrised away; negative
# eigenvalues up to this fraction of the largest eigenvalue are rounding noise of a
# positive semi-definite matrix (e.g. A @ cov @ A.T with more rows than columns).
_SYM_RTOL = 1e-8
_PSD_RTOL = 1e-8
# Jitter (relative to the mean variance) tried in turn when a Cholesky factorisation of
# a singular or nearly singular covariance fails.
_JITTERS = (1e-12, 1e-10, 1e-8)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _as_rng(seed: Seed) -> np.random.Generator:
    """A Generator from an int / SeedSequence / None, or the Generator itself."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not (
        seed is None or isinstance(seed, (numbers.Integral, np.random.SeedSequence))
    ):
        raise TypeError(
            f"seed must be an int, a numpy.random.Generator or None, got {type(seed).__name__}"
        )
    return np.random.default_rng(seed)


def _check_n(n: Any, what: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return int(n)


def _default_names(p: int, prefix: str = "theta") -> list[str]:
    return [f"{prefix}[{i}]" for i in range(p)]


def _check_names(names: Sequence[str] | None, p: int) -> list[str]:
    if names is None:
        return _default_names(p)
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not all(isinstance(s, str) for s in names):
        raise TypeError("names must be strings")
    if len(names) != p:
        raise ValueError(f"got {len(names)} names for {p} components")
    if len(set(names)) != p:
        raise ValueError(f"names must be unique, got {names}")
    return names


def _check_level(level: Any) -> float:
    if isinstance(level, bool) or not isinstance(level, numbers.Real):
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    return level


def _check_kind(kind: Any) -> str:
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    return kind


def _finite_array(x: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be numeric") from exc
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains NaN or infinite values")
    return arr


def _symmetrised(m: np.ndarray, what: str) -> np.ndarray:
    """``(m + m.T) / 2`` if ``m`` is symmetric up to rounding noise, else ValueError."""
    scale = np.max(np.abs(m)) if m.size else 0.0
    if np.max(np.abs(m - m.T), initial=0.0) > _SYM_RTOL * scale:
        raise ValueError(f"{what} is not symmetric")
    return 0.5 * (m + m.T)


def _check_cov(cov: Any, p: int) -> np.ndarray:
    cov = _finite_array(cov, "cov")
    if cov.ndim == 0 and p == 1:
        cov = cov.reshape(1, 1)
    if cov.ndim == 1:
        raise ValueError(
            "cov must be a (p, p) matrix; for independent components pass np.diag(variances)"
        )
    if cov.shape != (p, p):
        raise ValueError(f"cov must have shape ({p}, {p}), got {cov.shape}")
    cov = _symmetrised(cov, "cov")
    eig = np.linalg.eigvalsh(cov)
    if eig[0] < -_PSD_RTOL * max(abs(eig[-1]), abs(eig[0])):
        raise ValueError(
            f"cov is not positive semi-definite (smallest eigenvalue {eig[0]:.3g}, "
            f"largest {eig[-1]:.3g})"
        )
    return cov


def _cov_factor(cov: np.ndarray) -> np.ndarray:
    """A matrix ``L`` with ``L @ L.T == cov`` (up to rounding), for drawing normals.

    Cholesky first; a singular (positive semi-definite) covariance makes it fail, so
    retry with a tiny diagonal jitter and, failing that, use the symmetric square root
    from an eigendecomposition (exact for PSD matrices, just slower).
    """
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        pass
    p = cov.shape[0]
    scale = max(float(np.mean(np.diag(cov))), np.finfo(float).tiny)
    for jitter in _JITTERS:
        try:
            return np.linalg.cholesky(cov + jitter * scale * np.eye(p))
        except np.linalg.LinAlgError:
            continue
    eig, vec = np.linalg.eigh(cov)
    if eig[0] < -_PSD_RTOL * max(abs(eig[-1]), abs(eig[0])):
        raise ValueError("cov is not positive semi-definite")
    return vec * np.sqrt(np.clip(eig, 0.0, None))


def mvn_sample(mean: Any, cov: Any, n: int, rng: Seed = None) -> np.ndarray:
    """Draw from a multivariate normal distribution.

    Uses a Cholesky factor of ``cov``; a singular covariance is handled by retrying with
    a tiny diagonal jitter (at most ``1e-8`` times the mean variance) and finally by an
    eigendecomposition square root.

    Parameters
    ----------
    mean : array_like, shape (p,)
    cov : array_like, shape (p, p)
        Symmetric positive semi-definite covariance.
    n : int
        Number of draws.
    rng : int, numpy.random.Generator or None
        Source of randomness.

    Returns
    -------
    numpy.ndarray, shape (n, p)

    Examples
    --------
    >>> x = mvn_sample([0.0, 1.0], [[1.0, 0.5], [0.5, 2.0]], 50_000, rng=0)
    >>> x.shape
    (50000, 2)
    >>> bool(np.allclose(np.cov(x.T), [[1.0, 0.5], [0.5, 2.0]], atol=0.05))
    True
    """
    mean = np.atleast_1d(_finite_array(mean, "mean"))
    if mean.ndim != 1:
        raise ValueError(f"mean must be a vector, got shape {mean.shape}")
    cov = _check_cov(cov, mean.shape[0])
    return _mvn_draw(mean, _cov_factor(cov), _check_n(n), _as_rng(rng))


def _mvn_draw(mean: np.ndarray, factor: np.ndarray, n: int, rng: np.random.Generator):
    z = rng.standard_normal((n, mean.shape[0]))
    return mean + z @ factor.T


def tail_probability_from_prob_positive(prob_positive: Any) -> np.ndarray:
    """Two-sided posterior tail probability ``p_B = 2 min(P(theta > 0), P(theta < 0))``.

    Parameters
    ----------
    prob_positive : array_like
        ``P(theta > 0)`` per component, where any posterior mass exactly at 0 has been
        counted half (so that ``P(theta < 0) = 1 - P(theta > 0)``).

    Returns
    -------
    numpy.ndarray
        ``p_B``, clipped to ``[0, 1]``.

    Examples
    --------
    >>> tail_probability_from_prob_positive([0.99, 0.5, 0.01]).round(3).tolist()
    [0.02, 1.0, 0.02]
    """
    pp = np.asarray(prob_positive, dtype=float)
    return np.clip(2.0 * np.minimum(pp, 1.0 - pp), 0.0, 1.0)


def _check_pred_output(out: Any, n: int) -> np.ndarray:
    out = np.asarray(out)
    if out.shape != (n,):
        raise ValueError(
            f"pred must return one boolean per draw, shape ({n},), got shape {out.shape}"
        )
    if out.dtype != bool:
        # 0/1 integers or floats are fine; anything else is probably not an event
        if not np.isin(out, (0, 1)).all():
            raise ValueError("pred must return booleans (or 0/1 values)")
        out = out.astype(bool)
    return out


def _check_affine(A: Any, b: Any, p: int) -> tuple[np.ndarray, np.ndarray]:
    A = _finite_array(A, "A")
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2 or A.shape[1] != p:
        raise ValueError(f"A must have shape (q, {p}), got {A.shape}")
    q = A.shape[0]
    if b is None:
        return A, np.zeros(q)
    b = _finite_array(b, "b")
    if b.ndim == 0:
        b = np.full(q, float(b))
    if b.shape != (q,):
        raise ValueError(f"b must have shape ({q},), got {b.shape}")
    return A, b


# --------------------------------------------------------------------------------------
# the base class
# --------------------------------------------------------------------------------------


class Posterior(ABC):
    """Joint posterior distribution of a parameter vector ``theta`` of length ``p``.

    Subclasses: :class:`GaussianPosterior` (exact multivariate normal) and
    :class:`SamplePosterior` (draws, possibly weighted). Intervals, probabilities and
    summaries are marginal, per component, unless stated otherwise.
    """

    _names: list[str]

    # ---- identity ---------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """Component names (a copy); default ``theta[0]``, ``theta[1]``, ..."""
        return list(self._names)

    @property
    def dim(self) -> int:
        """Number of components ``p``."""
        return len(self._names)

    # ---- moments ----------------------------------------------------------------

    @property
    @abstractmethod
    def mean(self) -> np.ndarray:
        """Posterior mean, shape (p,)."""

    @property
    @abstractmethod
    def cov(self) -> np.ndarray:
        """Posterior covariance matrix, shape (p, p)."""

    @property
    def var(self) -> np.ndarray:
        """Marginal posterior variances, shape (p,)."""
        return np.clip(np.diag(self.cov).copy(), 0.0, None)

    @property
    def sd(self) -> np.ndarray:
        """Marginal posterior standard deviations, shape (p,)."""
        return np.sqrt(self.var)

    # ---- draws, intervals, probabilities -----------------------------------------

    @abstractmethod
    def sample(self, n: int, seed: Seed = None) -> np.ndarray:
        """``n`` draws from the posterior, shape (n, p)."""

    @abstractmethod
    def credible_interval(self, level: float = 0.95, kind: str = "eti"):
        """Marginal credible intervals ``(lower, upper)``, each of shape (p,)."""

    @abstractmethod
    def prob(self, pred: Predicate, **kwargs) -> float:
        """Posterior probability of the event ``pred(theta)``."""

    @abstractmethod
    def prob_positive(self) -> np.ndarray:
        """``P(theta_i > 0)`` per component, shape (p,); mass exactly at 0 counts half."""

    def tail_probability(self) -> np.ndarray:
        """Two-sided posterior tail probability per component, shape (p,).

        ``p_B = 2 min(P(theta_i > 0), P(theta_i < 0))``, clipped to ``[0, 1]``. It is the
        Bayesian analogue of a two-sided p-value for ``theta_i = 0`` and satisfies the
        key identity: **the equal-tailed credible interval of level ``1 - a`` excludes 0
        exactly when ``p_B < a``** (for :class:`SamplePosterior` this holds for the
        sample ETI as defined in :meth:`SamplePosterior.credible_interval`, provided no
        draw is exactly 0: draws at 0 count half here but lie inside a closed interval).
        The highest-density interval enjoys no such identity for skewed posteriors.

        Examples
        --------
        >>> post = GaussianPosterior([2.0, 0.5], np.eye(2))
        >>> post.tail_probability().round(4).tolist()
        [0.0455, 0.6171]
        """
        return tail_probability_from_prob_positive(self.prob_positive())

    # ---- derived posteriors --------------------------------------------------------

    @abstractmethod
    def marginal(self, index_or_names) -> Posterior:
        """Posterior of a subset of components, of the same kind."""

    @abstractmethod
    def affine(self, A: Any, b: Any = None, names: Sequence[str] | None = None) -> Posterior:
        """Posterior of ``A @ theta + b``."""

    @abstractmethod
    def to_arviz(self, var_name: str = "theta", **kwargs):
        """The posterior as an :class:`arviz.InferenceData` (posterior group)."""

    # ---- tables -----------------------------------------------------------------------

    def summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        """Table of marginal posterior summaries, one row per component.

        Parameters
        ----------
        level : float
            Credible level of the interval, in (0, 1).
        kind : {"eti", "hdi"}
            Equal-tailed or highest-density interval.

        Returns
        -------
        pandas.DataFrame
            Indexed by name (index name ``"parameter"``), with columns ``mean``, ``sd``,
            ``lower``, ``upper`` and ``p_value`` (the two-sided posterior tail
            probability, :meth:`tail_probability`); subclasses may add columns.

        Examples
        --------
        >>> post = GaussianPosterior([1.0, -0.2], np.diag([0.25, 1.0]), names=["a", "b"])
        >>> table = post.summary()
        >>> list(table.columns)
        ['mean', 'sd', 'lower', 'upper', 'p_value']
        >>> table.loc["a", ["lower", "upper", "p_value"]].round(3).tolist()
        [0.02, 1.98, 0.046]
        """
        lower, upper = self.credible_interval(level=level, kind=kind)
        table = pd.DataFrame(
            {
                "mean": self.mean,
                "sd": self.sd,
                "lower": lower,
                "upper": upper,
                "p_value": self.tail_probability(),
            },
            index=pd.Index(self.names, name="parameter"),
        )
        return table

    # ---- internals ----------------------------------------------------------------

    def _resolve(self, index_or_names) -> list[int]:
        """Positions of the components selected by an int, a name, a slice or a list."""
        p = self.dim
        if isinstance(index_or_names, slice):
            idx = list(range(p))[index_or_names]
        else:
            items = (
                [index_or_names]
                if isinstance(index_or_names, (str, numbers.Integral))
                else list(np.ravel(np.asarray(index_or_names, dtype=object)))
            )
            idx = []
            for item in items:
                if isinstance(item, str):
                    if item not in self._names:
                        raise KeyError(f"unknown component name {item!r}; names are {self._names}")
                    idx.append(self._names.index(item))
                elif isinstance(item, numbers.Integral) and not isinstance(item, (bool, np.bool_)):
                    if not -p <= item < p:
                        raise IndexError(f"component index {item} out of range for dim {p}")
                    idx.append(int(item) % p)
                else:
                    raise TypeError(f"components are selected by int or name, got {item!r}")
        if not idx:
            raise ValueError("select at least one component")
        if len(set(idx)) != len(idx):
            raise ValueError("a component is selected more than once")
        return idx

    def _short_names(self) -> str:
        if self.dim <= 6:
            return repr(self._names)
        return f"[{', '.join(map(repr, self._names[:3]))}, ..., {self._names[-1]!r}]"


# --------------------------------------------------------------------------------------
# Gaussian posterior
# --------------------------------------------------------------------------------------


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

    def __init__(self, mean: Any, cov: Any, names: Sequence[str] | None = None):
        mean = np.atleast_1d(_finite_array(mean, "mean"))
        if mean.ndim != 1 or mean.shape[0] == 0:
            raise ValueError(f"mean must be a non-empty vector, got shape {mean.shape}")
        self._mean = mean.copy()
        self._cov = _check_cov(cov, mean.shape[0])
        self._names = _check_names(names, mean.shape[0])
        self._factor: np.ndarray | None = None  # L with L L^T = cov, computed on demand
        # information form, kept when built from it (else computed on demand)
        self._precision: np.ndarray | None = None
        self._shift: np.ndarray | None = None

    @classmethod
    def from_natural(
        cls, r: Any, Q: Any, names: Sequence[str] | None = None
    ) -> GaussianPosterior:
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
        Q = _finite_array(Q, "Q")
        r = np.atleast_1d(_finite_array(r, "r"))
        if r.ndim != 1 or r.shape[0] == 0:
            raise ValueError(f"r must be a non-empty vector, got shape {r.shape}")
        p = r.shape[0]
        if Q.ndim == 0 and p == 1:
            Q = Q.reshape(1, 1)
        if Q.shape != (p, p):
            raise ValueError(f"Q must have shape ({p}, {p}), got {Q.shape}")
        Q = _symmetrised(Q, "precision Q")
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
        if self._precision is None:
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
            self._factor = _cov_factor(self._cov)
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
        return _mvn_draw(self._mean, self._get_factor(), _check_n(n), _as_rng(seed))

    def credible_interval(self, level: float = 0.95, kind: str = "eti"):
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
        level = _check_level(level)
        _check_kind(kind)
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
        n = _check_n(n)
        draws = self.sample(n, seed=seed)
        return float(np.mean(_check_pred_output(pred(draws), n)))

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

    def marginal(self, index_or_names) -> GaussianPosterior:
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
        return GaussianPosterior(
            self._mean[idx], self._cov[np.ix_(idx, idx)], names=[self._names[i] for i in idx]
        )

    def affine(self, A: Any, b: Any = None, names: Sequence[str] | None = None):
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
        A, b = _check_affine(A, b, self.dim)
        cov = A @ self._cov @ A.T
        return GaussianPosterior(A @ self._mean + b, 0.5 * (cov + cov.T), names=names)

    def to_arviz(
        self, var_name: str = "theta", n: int = 4000, seed: Seed = 0, n_chains: int = 4
    ):
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
        n, n_chains = _check_n(n), _check_n(n_chains, "n_chains")
        if n % n_chains:
            raise ValueError(f"n={n} is not a multiple of n_chains={n_chains}")
        draws = self.sample(n, seed=seed).reshape(n_chains, n // n_chains, self.dim)
        return _arviz_from_draws(draws, self._names, var_name)

    def __repr__(self) -> str:
        return f"GaussianPosterior(dim={self.dim}, names={self._short_names()})"


# --------------------------------------------------------------------------------------
# sample-based posterior
# --------------------------------------------------------------------------------------


@register
class SamplePosterior(Posterior):
    """Posterior represented by draws, optionally importance-weighted.

    Parameters
    ----------
    draws : array_like, shape (n_draws, p), (n_chains, n_draws, p) or (n_draws,)
        Posterior draws. A 3-D array is MCMC output: its chain structure is kept for
        :meth:`to_arviz` and the ``ess`` / ``r_hat`` diagnostics of :meth:`summary`,
        and flattened for everything else. A 1-D array is a single component.
    names : sequence of str, optional
        Component names; default ``theta[0]``, ``theta[1]``, ...
    weights : array_like, optional
        Non-negative importance weights, one per draw (shape ``draws.shape[:-1]`` or
        flattened); they need not be normalised (they are divided by their sum, which
        must be positive). Moments, intervals and probabilities are then weighted and
        :meth:`sample` resamples by weight.

    Notes
    -----
    * Covariance: ``sum_i w_i d_i d_i^T / (1 - sum_i w_i^2)`` with normalised weights
      and ``d_i`` the deviations from the weighted mean; without weights this is the
      usual ``ddof=1`` sample covariance. It is NaN when one draw carries all the weight.
    * Quantiles are the (weighted) empirical inverse CDF, so interval endpoints are
      draws; see :meth:`credible_interval`.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> post = SamplePosterior(rng.normal(1.0, 2.0, size=(4, 1000, 2)), names=["a", "b"])
    >>> post
    SamplePosterior(dim=2, names=['a', 'b'], n_draws=4000, n_chains=4, weighted=False)
    >>> bool(np.allclose(post.mean, 1.0, atol=0.1))
    True
    """

    def __init__(
        self,
        draws: Any,
        names: Sequence[str] | None = None,
        weights: Any = None,
    ):
        draws = _finite_array(draws, "draws")
        if draws.ndim == 1:
            draws = draws[:, None]
        if draws.ndim not in (2, 3):
            raise ValueError(
                "draws must have shape (n_draws, p) or (n_chains, n_draws, p), "
                f"got {draws.shape}"
            )
        if min(draws.shape) == 0:
            raise ValueError(f"draws must be non-empty, got shape {draws.shape}")
        n_total = int(np.prod(draws.shape[:-1]))
        if weights is not None:
            w = _finite_array(weights, "weights")
            if w.shape not in (draws.shape[:-1], (n_total,)):
                raise ValueError(
                    f"weights must have shape {draws.shape[:-1]} or ({n_total},), got {w.shape}"
                )
            w = w.reshape(-1)
            if np.any(w < 0):
                raise ValueError("weights must be non-negative")
            total = w.sum()
            if not total > 0:
                raise ValueError("weights must have a positive sum")
            weights = w / total
        self._setup(draws, names, weights)

    @classmethod
    def _from_parts(cls, draws: np.ndarray, names, weights: np.ndarray | None):
        # derived posteriors reuse the parent's normalised weights bit for bit
        # (renormalising could change the last digits and thus break ties differently)
        post = cls.__new__(cls)
        post._setup(draws, names, weights)
        return post

    def _setup(self, draws: np.ndarray, names, weights: np.ndarray | None) -> None:
        """Store validated draws (2-D or 3-D) and normalised weights; compute moments."""
        p = draws.shape[-1]
        self._names = _check_names(names, p)
        self._chains = draws.copy() if draws.ndim == 3 else None
        flat = self._chains.reshape(-1, p) if draws.ndim == 3 else draws.copy()
        flat.flags.writeable = False
        self._draws = flat
        n_total = flat.shape[0]
        if weights is None:
            self._weights = None
        else:
            self._weights = np.array(weights, dtype=float)
            self._weights.flags.writeable = False

        # moments are cheap and used everywhere: compute once
        if self._weights is None:
            self._mean = flat.mean(axis=0)
            dev = flat - self._mean
            self._cov = (dev.T @ dev) / (n_total - 1) if n_total > 1 else np.full((p, p), np.nan)
        else:
            w = self._weights
            self._mean = w @ flat
            dev = flat - self._mean
            denom = 1.0 - np.sum(w**2)  # reliability-weights correction, = 1 - 1/n unweighted
            scatter = (dev * w[:, None]).T @ dev
            self._cov = scatter / denom if denom > 1e-12 else np.full((p, p), np.nan)
        self._cov = 0.5 * (self._cov + self._cov.T)

    # ---- data -------------------------------------------------------------------

    @property
    def draws(self) -> np.ndarray:
        """All draws, chains concatenated, shape (n_draws, p) (read-only view)."""
        return self._draws

    @property
    def weights(self) -> np.ndarray | None:
        """Normalised importance weights, shape (n_draws,), or None (read-only view)."""
        return self._weights

    @property
    def n_draws(self) -> int:
        """Total number of draws (over all chains)."""
        return self._draws.shape[0]

    @property
    def n_chains(self) -> int | None:
        """Number of chains when draws were given as (n_chains, n_draws, p), else None."""
        return None if self._chains is None else self._chains.shape[0]

    # ---- moments ----------------------------------------------------------------

    @property
    def mean(self) -> np.ndarray:
        """(Weighted) posterior mean, shape (p,)."""
        return self._mean.copy()

    @property
    def cov(self) -> np.ndarray:
        """(Weighted) posterior covariance, shape (p, p)."""
        return self._cov.copy()

    # ---- draws, intervals, probabilities -----------------------------------------

    def sample(self, n: int, seed: Seed = None) -> np.ndarray:
        """Resample ``n`` draws with replacement (by weight if weighted), shape (n, p).

        Examples
        --------
        >>> post = SamplePosterior([[0.0], [1.0]], weights=[0.0, 1.0])
        >>> post.sample(3, seed=0).ravel().tolist()
        [1.0, 1.0, 1.0]
        """
        n, rng = _check_n(n), _as_rng(seed)
        if self._weights is None:
            idx = rng.integers(0, self.n_draws, size=n)
        else:
            idx = rng.choice(self.n_draws, size=n, replace=True, p=self._weights)
        return self._draws[idx].copy()

    def _w(self) -> np.ndarray:
        # unit weights keep the unweighted cumulative sums exact integers
        return np.ones(self.n_draws) if self._weights is None else self._weights

    def credible_interval(self, level: float = 0.95, kind: str = "eti"):
        """Marginal credible intervals from the (weighted) draws.

        Parameters
        ----------
        level : float
            Posterior mass of each interval, in (0, 1).
        kind : {"eti", "hdi"}
            ``"eti"`` (equal-tailed): with ``q = (1 - level)/2``, ``lower`` is the
            smallest draw ``x`` with ``P(theta <= x) >= q`` and ``upper`` the largest
            draw ``x`` with ``P(theta >= x) >= q`` (the empirical inverse CDF, applied
            symmetrically to both tails). Less than ``q`` of the weight lies strictly
            outside each end, and this definition makes the interval agree exactly with
            :meth:`tail_probability` (see there).
            ``"hdi"`` (highest density): per component, the shortest interval between two
            draws holding at least ``level`` of the weight (a single interval, also for
            multimodal marginals; the leftmost on ties).

        Returns
        -------
        lower, upper : numpy.ndarray, shape (p,)

        Examples
        --------
        >>> post = SamplePosterior(np.arange(1.0, 101.0))
        >>> post.credible_interval(0.9)
        (array([5.]), array([96.]))
        >>> post.credible_interval(0.9, kind="hdi")
        (array([1.]), array([90.]))
        """
        level = _check_level(level)
        kind = _check_kind(kind)
        w = self._w()
        lower, upper = np.empty(self.dim), np.empty(self.dim)
        for j in range(self.dim):
            if kind == "eti":
                lower[j], upper[j] = _eti_1d(self._draws[:, j], w, (1.0 - level) / 2.0)
            else:
                lower[j], upper[j] = _hdi_1d(self._draws[:, j], w, level)
        return lower, upper

    def prob(self, pred: Predicate) -> float:
        """(Weighted) fraction of draws for which ``pred`` holds.

        Parameters
        ----------
        pred : callable
            Takes the (n_draws, p) array of draws, returns n_draws booleans.

        Returns
        -------
        float

        Examples
        --------
        >>> SamplePosterior([[1.0, 0.0], [2.0, 3.0]]).prob(lambda t: t[:, 0] > t[:, 1])
        0.5
        """
        if not callable(pred):
            raise TypeError("pred must be a callable taking an (n, p) array of draws")
        hit = _check_pred_output(pred(self._draws), self.n_draws)
        if self._weights is None:
            return float(np.mean(hit))
        return float(np.sum(self._weights[hit]))

    def prob_positive(self) -> np.ndarray:
        """(Weighted) fraction of draws above 0, draws exactly at 0 counting half.

        Examples
        --------
        >>> SamplePosterior([-1.0, 0.0, 1.0, 2.0]).prob_positive().tolist()
        [0.625]
        """
        return self._prob_above_zero(self._draws)

    def tail_probability(self) -> np.ndarray:
        # P(theta < 0) is computed directly, not as 1 - P(theta > 0), with the same
        # arithmetic as the tail fractions of credible_interval: the identity
        # "ETI excludes 0 <=> p_B < a" then also holds at the floating-point level.
        above = self._prob_above_zero(self._draws)
        below = self._prob_above_zero(-self._draws)
        return np.clip(2.0 * np.minimum(above, below), 0.0, 1.0)

    def _prob_above_zero(self, x: np.ndarray) -> np.ndarray:
        score = (x > 0) + 0.5 * (x == 0)
        if self._weights is None:
            return score.mean(axis=0)
        return np.clip(self._weights @ score, 0.0, 1.0)

    # ---- derived posteriors --------------------------------------------------------

    def _derived(self, chains_or_draws: np.ndarray, names) -> SamplePosterior:
        if not np.all(np.isfinite(chains_or_draws)):
            raise ValueError("the transformed draws contain NaN or infinite values")
        return SamplePosterior._from_parts(chains_or_draws, names, self._weights)

    def marginal(self, index_or_names) -> SamplePosterior:
        """The selected components of the draws (weights and chains kept).

        Parameters
        ----------
        index_or_names : int, str, slice, or sequence of int / str

        Returns
        -------
        SamplePosterior

        Examples
        --------
        >>> post = SamplePosterior([[1.0, 2.0], [3.0, 4.0]], names=["a", "b"])
        >>> post.marginal("b").mean.tolist()
        [3.0]
        """
        idx = self._resolve(index_or_names)
        source = self._draws if self._chains is None else self._chains
        return self._derived(source[..., idx], [self._names[i] for i in idx])

    def affine(self, A: Any, b: Any = None, names: Sequence[str] | None = None):
        """Draw-wise posterior of ``A @ theta + b`` (weights and chains kept).

        Parameters
        ----------
        A : array_like, shape (q, p) (a vector of length p is treated as one row)
        b : array_like, shape (q,) or scalar, optional
        names : sequence of str, optional
            Names of the q outputs; default ``theta[0]``, ...

        Returns
        -------
        SamplePosterior

        Examples
        --------
        >>> post = SamplePosterior([[1.0, 2.0], [3.0, 4.0]])
        >>> post.affine([1.0, -1.0], b=10.0).draws.ravel().tolist()
        [9.0, 9.0]
        """
        A, b = _check_affine(A, b, self.dim)
        source = self._draws if self._chains is None else self._chains
        return self._derived(source @ A.T + b, names)

    # ---- tables / export ----------------------------------------------------------------

    def summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        """Table of marginal summaries; see :meth:`Posterior.summary`.

        When the draws carry chain structure and no weights, two MCMC diagnostics are
        added: ``ess`` (rank-normalised bulk effective sample size) and ``r_hat``
        (rank-normalised split R-hat, NaN with a single chain), both as defined by
        Vehtari et al. (2021) and computed as ArviZ ``ess(method="bulk")`` and
        ``rhat(method="rank")`` do.

        Examples
        --------
        >>> rng = np.random.default_rng(1)
        >>> table = SamplePosterior(rng.normal(size=(4, 500, 2))).summary()
        >>> list(table.columns)
        ['mean', 'sd', 'lower', 'upper', 'p_value', 'ess', 'r_hat']
        """
        table = super().summary(level=level, kind=kind)
        if self._chains is not None and self._weights is None:
            table["ess"] = [_ess_bulk(self._chains[:, :, j]) for j in range(self.dim)]
            table["r_hat"] = [_rhat_rank(self._chains[:, :, j]) for j in range(self.dim)]
        return table

    def to_arviz(self, var_name: str = "theta", n: int | None = None, seed: Seed = 0):
        """The draws as an :class:`arviz.InferenceData`.

        Unweighted draws are stored as they are, with their chains (one chain when
        given as a 2-D array). ArviZ has no notion of importance weights, so weighted
        draws are first resampled by weight (``n`` draws, default ``n_draws``, with
        ``seed``) into one chain.

        Parameters
        ----------
        var_name : str
            Variable name; its dimension is ``f"{var_name}_dim_0"`` with the component
            names as coordinates.
        n : int, optional
            Number of resampled draws (weighted posteriors only).
        seed : int, numpy.random.Generator or None
            Resampling seed (weighted posteriors only).

        Returns
        -------
        arviz.InferenceData

        Examples
        --------
        >>> post = SamplePosterior(np.zeros((2, 50, 3)))
        >>> post.to_arviz().posterior["theta"].shape
        (2, 50, 3)
        """
        if self._weights is not None:
            draws = self.sample(self.n_draws if n is None else n, seed=seed)[None]
        elif self._chains is not None:
            draws = self._chains
        else:
            draws = self._draws[None]
        return _arviz_from_draws(draws, self._names, var_name)

    def __repr__(self) -> str:
        return (
            f"SamplePosterior(dim={self.dim}, names={self._short_names()}, "
            f"n_draws={self.n_draws}, n_chains={self.n_chains}, "
            f"weighted={self._weights is not None})"
        )


# --------------------------------------------------------------------------------------
# sample quantiles and intervals
# --------------------------------------------------------------------------------------


def _eti_1d(x: np.ndarray, w: np.ndarray, q: float) -> tuple[float, float]:
    """Equal-tailed interval: inverse CDF from below at ``q`` and from above at ``q``."""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    last = xs.shape[0] - 1

    def first_reaching(xs_, ws_):
        # first draw whose cumulative weight fraction reaches q; fractions as
        # cumsum / total (exactly k / n without weights, as in prob_positive); a draw
        # of zero weight is never chosen
        c = np.cumsum(ws_)
        return xs_[min(int(np.searchsorted(c / c[-1], q, side="left")), last)]

    # the upper end mirrors the lower one so that both tails are treated identically
    return float(first_reaching(xs, ws)), float(first_reaching(xs[::-1], ws[::-1]))


def _hdi_1d(x: np.ndarray, w: np.ndarray, level: float) -> tuple[float, float]:
    """Shortest interval between two draws with at least ``level`` of the weight."""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    c0 = np.concatenate(([0.0], np.cumsum(ws)))
    # for each left end i, the first right end j with weight(xs[i..j]) >= level * total;
    # a zero-weight draw is never such a j, and as a left end it only gives a longer
    # interval than the next draw, so zero-weight draws never become endpoints
    stop = np.searchsorted(c0, c0[:-1] + level * c0[-1], side="left")
    valid = stop <= xs.shape[0]
    starts = np.flatnonzero(valid)
    ends = stop[valid] - 1
    best = int(np.argmin(xs[ends] - xs[starts]))
    return float(xs[starts[best]]), float(xs[ends[best]])


# --------------------------------------------------------------------------------------
# MCMC diagnostics (Vehtari, Gelman, Simpson, Carpenter and Buerkner, 2021)
#
# Implemented here rather than through ArviZ so that ArviZ stays confined to
# _to_inference_data; they reproduce ArviZ 0.x ess(method="bulk") and rhat(method="rank").
# --------------------------------------------------------------------------------------


def _split_chains(x: np.ndarray) -> np.ndarray:
    half = x.shape[1] // 2
    return np.vstack((x[:, :half], x[:, -half:]))


def _z_scale(x: np.ndarray) -> np.ndarray:
    # rank-normalise over all chains jointly (Blom's offset 3/8)
    ranks = stats.rankdata(x, method="average").reshape(x.shape)
    return stats.norm.ppf((ranks - 0.375) / (x.size + 0.25))


def _rhat_basic(x: np.ndarray) -> float:
    n = x.shape[1]
    within = np.mean(np.var(x, axis=1, ddof=1))
    if within == 0:
        return np.nan
    between = n * np.var(np.mean(x, axis=1), ddof=1)
    return float(np.sqrt((between / within + n - 1) / n))


def _rhat_rank(x: np.ndarray) -> float:
    """Rank-normalised split R-hat of an (n_chains, n_draws) array (max of bulk, tail)."""
    if x.shape[0] < 2 or x.shape[1] < 4:
        return np.nan
    split = _split_chains(x)
    bulk = _rhat_basic(_z_scale(split))
    tail = _rhat_basic(_z_scale(np.abs(split - np.median(split))))
    return float(max(bulk, tail))


def _autocov(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    m = next_fast_len(2 * n)
    dev = x - x.mean(axis=1, keepdims=True)
    f = np.fft.rfft(dev, n=m, axis=1)
    return np.fft.irfft(f * np.conjugate(f), n=m, axis=1)[:, :n] / n


def _ess_basic(x: np.ndarray) -> float:
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


def _ess_bulk(x: np.ndarray) -> float:
    """Bulk ESS of an (n_chains, n_draws) array: ESS of rank-normalised split chains."""
    if x.shape[1] < 4:
        return np.nan
    return _ess_basic(_z_scale(_split_chains(x)))


# --------------------------------------------------------------------------------------
# ArviZ bridge: the only ArviZ-specific code of this module
# --------------------------------------------------------------------------------------


def _arviz_from_draws(draws: np.ndarray, names: list[str], var_name: str):
    """(n_chains, n_draws, p) draws -> InferenceData with one variable named ``var_name``."""
    if not isinstance(var_name, str) or not var_name:
        raise ValueError("var_name must be a non-empty string")
    dim = f"{var_name}_dim_0"
    return _to_inference_data({var_name: draws}, coords={dim: list(names)}, dims={var_name: [dim]})


def _to_inference_data(
    draws_dict: Mapping[str, np.ndarray],
    coords: Mapping[str, list],
    dims: Mapping[str, list[str]],
):
    """Wrap posterior draws (``(chain, draw, *shape)`` arrays) into ArviZ's container.

    Every use of ArviZ in this module goes through here, so that moving to ArviZ 1.x
    (``from_dict({"posterior": ...})`` returning a DataTree) is a local change. ArviZ
    is imported lazily: it is heavy and only needed for export.
    """
    import arviz as az

    return az.from_dict(posterior=dict(draws_dict), coords=dict(coords), dims=dict(dims))
