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

Modules: :mod:`.base` (the interface), :mod:`.gaussian_posterior`, :mod:`.sample_posterior`;
MCMC diagnostics are :mod:`fedstats.inference.diagnostics`, the ArviZ export
:mod:`fedstats.arviz_export`.
"""

from __future__ import annotations

from ._checks import Predicate, Seed
from .base import Posterior, mvn_sample, tail_probability_from_prob_positive
from .gaussian_posterior import GaussianPosterior
from .sample_posterior import SamplePosterior

__all__ = [
    "Posterior",
    "GaussianPosterior",
    "SamplePosterior",
    "mvn_sample",
    "tail_probability_from_prob_positive",
    "Seed",
    "Predicate",
]
