"""Families and links of the generalised linear models (plain numpy, no statsmodels).

The formulas follow statsmodels' ``genmod`` so that a federated fit reproduces its pooled
fit to rounding: the same starting means, variance functions, deviance residuals, clipping
of means away from the edges of their range, and log-likelihoods. Each client evaluates
them on its own rows; the server only ever sees their sums.

A :class:`Family` knows its variance function, its links (``links``; the first is the
canonical default), which outcomes it accepts (:meth:`Family.check_outcome`), the deviance
and the log-likelihood, the latter split into sums that the server combines with the
estimated dispersion (:meth:`Family.loglike_sums`, :meth:`Family.loglike`).
"""

from __future__ import annotations

import numpy as np

from .._tails import norm_cdf, norm_pdf, norm_ppf, special

__all__ = ["Link", "Family", "FAMILIES", "LINKS", "family_of"]

EPS = np.finfo(float).eps


def _clip01(p):
    return np.clip(p, EPS, 1 - EPS)


def _pos(x):
    return np.clip(x, EPS, np.inf)


class Link:
    """A link ``eta = g(mu)``: :meth:`__call__`, :meth:`inverse`, :meth:`deriv` (``g'(mu)``),
    :meth:`deriv2` (``g''(mu)``) and :meth:`inverse_deriv` (``d mu / d eta``)."""

    name = ""

    def __repr__(self) -> str:
        return self.name


class Identity(Link):
    name = "identity"

    def __call__(self, mu):
        return np.asarray(mu, dtype=float)

    def inverse(self, eta):
        return np.asarray(eta, dtype=float)

    def deriv(self, mu):
        return np.ones_like(mu, dtype=float)

    def deriv2(self, mu):
        return np.zeros_like(mu, dtype=float)

    def inverse_deriv(self, eta):
        return np.ones_like(eta, dtype=float)


class Log(Link):
    name = "log"

    def __call__(self, mu):
        return np.log(_pos(mu))

    def inverse(self, eta):
        return np.exp(eta)

    def deriv(self, mu):
        return 1.0 / _pos(mu)

    def deriv2(self, mu):
        return -1.0 / _pos(mu) ** 2

    def inverse_deriv(self, eta):
        return np.exp(eta)


class Inverse(Link):
    """``g(mu) = 1 / mu`` (statsmodels' ``InversePower``)."""

    name = "inverse"

    def __call__(self, mu):
        return 1.0 / np.asarray(mu, dtype=float)

    def inverse(self, eta):
        return 1.0 / np.asarray(eta, dtype=float)

    def deriv(self, mu):
        return -1.0 / np.asarray(mu, dtype=float) ** 2

    def deriv2(self, mu):
        return 2.0 / np.asarray(mu, dtype=float) ** 3

    def inverse_deriv(self, eta):
        return -1.0 / np.asarray(eta, dtype=float) ** 2


class Logit(Link):
    name = "logit"

    def __call__(self, p):
        p = _clip01(p)
        return np.log(p / (1 - p))

    def inverse(self, eta):
        return special.expit(eta)

    def deriv(self, p):
        p = _clip01(p)
        return 1.0 / (p * (1 - p))

    def deriv2(self, p):
        p = _clip01(p)
        v = p * (1 - p)
        return (2 * p - 1) / v**2

    def inverse_deriv(self, eta):
        p = special.expit(eta)
        return p * (1 - p)


class Probit(Link):
    name = "probit"

    def __call__(self, p):
        return norm_ppf(_clip01(p))

    def inverse(self, eta):
        return norm_cdf(eta)

    def deriv(self, p):
        return 1.0 / norm_pdf(norm_ppf(_clip01(p)))

    def deriv2(self, p):
        z = norm_ppf(_clip01(p))
        return z / norm_pdf(z) ** 2

    def inverse_deriv(self, eta):
        return norm_pdf(eta)


class CLogLog(Link):
    name = "cloglog"

    def __call__(self, p):
        return np.log(-np.log1p(-_clip01(p)))

    def inverse(self, eta):
        return -np.expm1(-np.exp(eta))

    def deriv(self, p):
        p = _clip01(p)
        return 1.0 / ((p - 1) * np.log1p(-p))

    def deriv2(self, p):
        p = _clip01(p)
        fl = np.log1p(-p)
        return -1.0 / ((1 - p) ** 2 * fl) * (1 + 1 / fl)

    def inverse_deriv(self, eta):
        return np.exp(eta - np.exp(eta))


LINKS = {cls.name: cls for cls in (Identity, Log, Inverse, Logit, Probit, CLogLog)}


class Family:
    """An exponential-family likelihood for one outcome per row.

    Outcomes ``y`` are per row; ``trials`` (binomial only) the number of trials of a row,
    then ``y`` counts its successes. ``f`` are frequency weights.
    """

    name = ""
    links: tuple[str, ...] = ()
    #: True where the dispersion is fixed at 1 (binomial, Poisson, negative binomial)
    fixed_scale = True

    def __init__(self, link: str | None = None):
        self.link = LINKS[link or self.links[0]]()

    def __repr__(self) -> str:
        return f"{self.name}({self.link.name})"

    # -- per row, on the client
    def variance(self, mu):
        raise NotImplementedError

    def variance_deriv(self, mu):
        raise NotImplementedError

    def start_mu(self, y, ybar):
        """statsmodels' IRLS start: ``(y + mean(y)) / 2`` (binomial: ``(y + 1/2) / 2``)."""
        return (y + ybar) / 2.0

    def fitted(self, eta):
        return self.link.inverse(eta)

    def resid_dev(self, y, mu, n):
        raise NotImplementedError

    def loglike_sums(self, y, mu, f, n) -> np.ndarray:
        """Sums over rows that :meth:`loglike` combines with the dispersion: by default the
        log-likelihood itself (dispersion 1)."""
        raise NotImplementedError

    def loglike(self, sums, scale: float, wnobs: float, rss_mle: bool = False) -> float:
        return float(sums[0])

    def check_outcome(self, y, trials) -> str | None:
        """Why ``y`` is not an outcome of this family (a phrase), or None."""
        return None


class Gaussian(Family):
    name = "gaussian"
    links = ("identity", "log", "inverse")
    fixed_scale = False

    def variance(self, mu):
        return np.ones_like(mu, dtype=float)

    def variance_deriv(self, mu):
        return np.zeros_like(mu, dtype=float)

    def resid_dev(self, y, mu, n):
        return (y - mu) ** 2

    def loglike_sums(self, y, mu, f, n):
        return np.array([np.sum(f * (y - mu) ** 2)])

    def loglike(self, sums, scale, wnobs, rss_mle=False):
        # statsmodels: identity link gives the concentrated log-likelihood (scale RSS / n)
        s = sums[0] / wnobs if rss_mle else scale
        return float(-0.5 * (sums[0] / s + wnobs * np.log(2 * np.pi * s)))


class Binomial(Family):
    name = "binomial"
    links = ("logit", "probit", "cloglog", "log")

    def variance(self, mu):
        p = _clip01(mu)
        return p * (1 - p)

    def variance_deriv(self, mu):
        return 1 - 2 * np.asarray(mu, dtype=float)

    def start_mu(self, y, ybar):
        return (y + 0.5) / 2.0

    def resid_dev(self, y, mu, n):
        a = _pos(y / (mu + 1e-20))
        b = _pos((1.0 - y) / (1.0 - mu + 1e-20))
        return 2 * n * (y * np.log(a) + (1 - y) * np.log(b))

    def loglike_sums(self, y, mu, f, n):
        k = y * n  # successes (y is the proportion)
        ll = (
            special.gammaln(n + 1)
            - special.gammaln(k + 1)
            - special.gammaln(n - k + 1)
            + k * np.log((mu + 1e-20) / (1 - mu + 1e-20))
            + n * np.log(1 - mu + 1e-20)
        )
        return np.array([np.sum(f * ll)])

    def check_outcome(self, y, trials):
        if trials is None:
            bad = (y != 0) & (y != 1)
            return "is not 0/1 (binomial without trials=): values such as " + _values(y[bad]) if bad.any() else None
        bad = (y < 0) | (y > trials) | (y != np.round(y))
        if bad.any():
            return "is not a count of successes between 0 and the trials: values such as " + _values(y[bad])
        return None


class Poisson(Family):
    name = "poisson"
    links = ("log", "identity")

    def variance(self, mu):
        return np.abs(mu)

    def variance_deriv(self, mu):
        return np.sign(mu)

    def resid_dev(self, y, mu, n):
        return 2 * (y * np.log(_pos(y / mu)) - (y - mu))

    def loglike_sums(self, y, mu, f, n):
        return np.array([np.sum(f * (y * np.log(mu) - mu - special.gammaln(y + 1)))])

    def check_outcome(self, y, trials):
        bad = y < 0
        return "has negative counts: values such as " + _values(y[bad]) if bad.any() else None


class Gamma(Family):
    name = "gamma"
    links = ("inverse", "log", "identity")
    fixed_scale = False

    def variance(self, mu):
        return np.abs(mu) ** 2

    def variance_deriv(self, mu):
        return 2 * np.asarray(mu, dtype=float)

    def resid_dev(self, y, mu, n):
        return 2 * ((y - mu) / mu - np.log(_pos(y / mu)))

    def loglike_sums(self, y, mu, f, n):
        r = _pos(y / mu)
        return np.array([np.sum(f * np.log(r)), np.sum(f * r), np.sum(f * np.log(y))])

    def loglike(self, sums, scale, wnobs, rss_mle=False):
        w = 1.0 / scale
        return float(w * (wnobs * np.log(w) + sums[0]) - w * sums[1] - wnobs * special.gammaln(w) - sums[2])

    def check_outcome(self, y, trials):
        bad = y <= 0
        return "is not positive (gamma): values such as " + _values(y[bad]) if bad.any() else None


class NegativeBinomial(Family):
    """Negative binomial with a fixed ``alpha``: variance ``mu + alpha mu^2``."""

    name = "negative_binomial"
    links = ("log", "identity")

    def __init__(self, link=None, alpha: float = 1.0):
        super().__init__(link)
        self.alpha = float(alpha)

    def __repr__(self) -> str:
        return f"{self.name}({self.link.name}, alpha={self.alpha:g})"

    def variance(self, mu):
        return mu + self.alpha * mu**2

    def variance_deriv(self, mu):
        return 1 + 2 * self.alpha * mu

    def resid_dev(self, y, mu, n):
        ya = y + 1 / self.alpha
        return 2 * (y * np.log(_pos(y / mu)) - ya * np.log(ya / (mu + 1 / self.alpha)))

    def loglike_sums(self, y, mu, f, n):
        a = self.alpha
        ll = (
            y * np.log(a * mu)
            - (y + 1 / a) * np.log(1 + a * mu)
            + special.gammaln(y + 1 / a)
            - special.gammaln(1 / a)
            - special.gammaln(y + 1)
        )
        return np.array([np.sum(f * ll)])

    check_outcome = Poisson.check_outcome


def _values(v) -> str:
    return ", ".join(f"{x:g}" for x in np.unique(v)[:3])


FAMILIES = {cls.name: cls for cls in (Gaussian, Binomial, Poisson, Gamma, NegativeBinomial)}


def family_of(name: str, link: str | None = None, alpha: float = 1.0) -> Family:
    """The family ``name`` with ``link`` (None: its canonical link); ValueError naming the
    choices otherwise."""
    if name not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {name!r}")
    cls = FAMILIES[name]
    if link is not None and link not in cls.links:
        raise ValueError(f"the {name} family takes the links {list(cls.links)}, got link={link!r}")
    return cls(link, alpha=alpha) if cls is NegativeBinomial else cls(link)
