"""The posterior represented by draws (MCMC chains or independent draws, optionally weighted)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Self

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from ...arviz_export import from_draws
from ...result_file import register
from ..diagnostics import ess_bulk, rhat_rank
from ._checks import (
    Predicate,
    Seed,
    Selection,
    as_rng,
    check_affine,
    check_kind,
    check_level,
    check_n,
    check_names,
    check_pred_output,
    finite_array,
)
from .base import Posterior

if TYPE_CHECKING:
    from arviz import InferenceData


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

    _chains: np.ndarray | None
    _draws: np.ndarray
    _weights: np.ndarray | None
    _mean: np.ndarray
    _cov: np.ndarray

    def __init__(self, draws: ArrayLike, names: Sequence[str] | None = None, weights: ArrayLike | None = None) -> None:
        draws = finite_array(draws, "draws")
        if draws.ndim == 1:
            draws = draws[:, None]
        if draws.ndim not in (2, 3):
            raise ValueError(f"draws must have shape (n_draws, p) or (n_chains, n_draws, p), got {draws.shape}")
        if min(draws.shape) == 0:
            raise ValueError(f"draws must be non-empty, got shape {draws.shape}")
        n_total = int(np.prod(draws.shape[:-1]))
        normalised: np.ndarray | None = None
        if weights is not None:
            w = finite_array(weights, "weights")
            if w.shape not in (draws.shape[:-1], (n_total,)):
                raise ValueError(f"weights must have shape {draws.shape[:-1]} or ({n_total},), got {w.shape}")
            w = w.reshape(-1)
            if np.any(w < 0):
                raise ValueError("weights must be non-negative")
            total = w.sum()
            if not total > 0:
                raise ValueError("weights must have a positive sum")
            normalised = w / total
        self._setup(draws, names, normalised)

    @classmethod
    def _from_parts(cls, draws: np.ndarray, names: Sequence[str] | None, weights: np.ndarray | None) -> Self:
        # derived posteriors reuse the parent's normalised weights bit for bit
        # (renormalising could change the last digits and thus break ties differently)
        post = cls.__new__(cls)
        post._setup(draws, names, weights)
        return post

    def _setup(self, draws: np.ndarray, names: Sequence[str] | None, weights: np.ndarray | None) -> None:
        """Store validated draws (2-D or 3-D) and normalised weights; compute moments."""
        p = draws.shape[-1]
        self._names = check_names(names, p)
        chains = draws.copy() if draws.ndim == 3 else None
        self._chains = chains
        flat = chains.reshape(-1, p) if chains is not None else draws.copy()
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
        n, rng = check_n(n), as_rng(seed)
        if self._weights is None:
            idx = rng.integers(0, self.n_draws, size=n)
        else:
            idx = rng.choice(self.n_draws, size=n, replace=True, p=self._weights)
        return self._draws[idx].copy()

    def _w(self) -> np.ndarray:
        # unit weights keep the unweighted cumulative sums exact integers
        return np.ones(self.n_draws) if self._weights is None else self._weights

    def credible_interval(self, level: float = 0.95, kind: str = "eti") -> tuple[np.ndarray, np.ndarray]:
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
        level = check_level(level)
        kind = check_kind(kind)
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
        hit = check_pred_output(pred(self._draws), self.n_draws)
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

    def _derived(self, chains_or_draws: np.ndarray, names: Sequence[str] | None) -> SamplePosterior:
        if not np.all(np.isfinite(chains_or_draws)):
            raise ValueError("the transformed draws contain NaN or infinite values")
        return SamplePosterior._from_parts(chains_or_draws, names, self._weights)

    def marginal(self, index_or_names: Selection) -> SamplePosterior:
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

    def affine(self, A: ArrayLike, b: ArrayLike | None = None, names: Sequence[str] | None = None) -> SamplePosterior:
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
        A, b = check_affine(A, b, self.dim)
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
            table["ess"] = [ess_bulk(self._chains[:, :, j]) for j in range(self.dim)]
            table["r_hat"] = [rhat_rank(self._chains[:, :, j]) for j in range(self.dim)]
        return table

    def to_arviz(self, var_name: str = "theta", n: int | None = None, seed: Seed = 0) -> InferenceData:
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
        return from_draws(draws, self._names, var_name)

    def __repr__(self) -> str:
        return (
            f"SamplePosterior(dim={self.dim}, names={self._short_names()}, "
            f"n_draws={self.n_draws}, n_chains={self.n_chains}, "
            f"weighted={self._weights is not None})"
        )


def _eti_1d(x: np.ndarray, w: np.ndarray, q: float) -> tuple[float, float]:
    """Equal-tailed interval: inverse CDF from below at ``q`` and from above at ``q``."""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    last = xs.shape[0] - 1

    def first_reaching(xs_: np.ndarray, ws_: np.ndarray) -> float:
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
