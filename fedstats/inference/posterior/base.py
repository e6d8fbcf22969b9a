"""The interface every posterior implements (:class:`Posterior`), and Gaussian draws and tail
probabilities as functions."""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from ._checks import Predicate, Seed, Selection, as_rng, check_cov, check_n, cov_factor, finite_array, mvn_draw

if TYPE_CHECKING:
    from arviz import InferenceData


def mvn_sample(mean: ArrayLike, cov: ArrayLike, n: int, rng: Seed = None) -> np.ndarray:
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
    mean = np.atleast_1d(finite_array(mean, "mean"))
    if mean.ndim != 1:
        raise ValueError(f"mean must be a vector, got shape {mean.shape}")
    cov = check_cov(cov, mean.shape[0])
    return mvn_draw(mean, cov_factor(cov), check_n(n), as_rng(rng))


def tail_probability_from_prob_positive(prob_positive: ArrayLike) -> np.ndarray:
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
    def credible_interval(self, level: float = 0.95, kind: str = "eti") -> tuple[np.ndarray, np.ndarray]:
        """Marginal credible intervals ``(lower, upper)``, each of shape (p,)."""

    @abstractmethod
    def prob(self, pred: Predicate) -> float:
        """Posterior probability of the event ``pred(theta)`` (subclasses may take options,
        such as the number of Monte-Carlo draws)."""

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
        >>> from fedstats.inference import GaussianPosterior
        >>> post = GaussianPosterior([2.0, 0.5], np.eye(2))
        >>> post.tail_probability().round(4).tolist()
        [0.0455, 0.6171]
        """
        return tail_probability_from_prob_positive(self.prob_positive())

    # ---- derived posteriors --------------------------------------------------------

    @abstractmethod
    def marginal(self, index_or_names: Selection) -> Posterior:
        """Posterior of a subset of components, of the same kind."""

    @abstractmethod
    def affine(self, A: ArrayLike, b: ArrayLike | None = None, names: Sequence[str] | None = None) -> Posterior:
        """Posterior of ``A @ theta + b``."""

    @abstractmethod
    def to_arviz(self, var_name: str = "theta") -> InferenceData:
        """The posterior as an :class:`arviz.InferenceData` (posterior group); subclasses
        may take options, such as the number of draws."""

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
        >>> from fedstats.inference import GaussianPosterior
        >>> post = GaussianPosterior([1.0, -0.2], np.diag([0.25, 1.0]), names=["a", "b"])
        >>> table = post.summary()
        >>> list(table.columns)
        ['mean', 'sd', 'lower', 'upper', 'p_value']
        >>> table.loc["a", ["lower", "upper", "p_value"]].round(3).tolist()
        [0.02, 1.98, 0.046]
        """
        lower, upper = self.credible_interval(level=level, kind=kind)
        table = pd.DataFrame(
            {"mean": self.mean, "sd": self.sd, "lower": lower, "upper": upper, "p_value": self.tail_probability()},
            index=pd.Index(self.names, name="parameter"),
        )
        return table

    # ---- internals ----------------------------------------------------------------

    def _resolve(self, index_or_names: Selection) -> list[int]:
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
                    if not -p <= int(item) < p:
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
