"""EP site models of the Bayesian GLMs: one client's likelihood as a jax function of phi.

A client's rows travel to the tilted estimators as fixed-shape arrays padded to ``n_pad``
rows (padding has frequency weight 0), so that every client shares one compiled kernel.
The rows are rebuilt from the client's data at every step and never kept in its EP state
(:class:`~fedstats.inference.ep.RowsEP`): a client's final state, which Flower hands to the
server, holds its site only.

* :class:`SharedSite` (``BayesianGLM``): ``phi = beta`` (then ``log sigma`` for gaussian,
  ``log shape`` for gamma), the client's full likelihood;
* :class:`HierarchicalSite` (``HierarchicalGLM``): ``phi = (mu, log tau)``, the client's own
  coefficients ``theta_k ~ N(mu, diag(tau))`` integrated out by a Laplace approximation
  (10 inner Newton iterations, each step capped; the last step is differentiated, which gives the exact
  gradient and Hessian of the profile part at the optimum).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..results import register

#: families and links with a jax likelihood (the Bayesian models)
BAYES_LINKS = {"binomial": ("logit", "probit", "cloglog"), "poisson": ("log",), "negative_binomial": ("log",),
               "gaussian": ("identity",), "gamma": ("log",)}
#: families whose dispersion is a parameter (its log is the last entry of phi)
DISPERSION = {"gaussian": "log_sigma", "gamma": "log_shape"}


def loglik_rows(family: str, link: str, alpha: float, eta, y, n, disp):
    """Per-row log-likelihood at the linear predictor ``eta`` (jax); ``y`` is the proportion
    of successes for binomial (``n`` trials), ``disp`` the log dispersion parameter."""
    import jax.numpy as jnp
    from jax.scipy.special import gammaln
    from jax.scipy.stats import norm

    if family == "binomial":
        if link == "logit":
            lp, lq = -jnp.logaddexp(0.0, -eta), -jnp.logaddexp(0.0, eta)
        elif link == "probit":
            lp, lq = norm.logcdf(eta), norm.logcdf(-eta)
        else:  # cloglog: p = 1 - exp(-exp(eta))
            e = jnp.exp(jnp.minimum(eta, 30.0))
            lp, lq = jnp.log(-jnp.expm1(-e) + 1e-300), -e
        k = y * n
        return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1) + k * lp + (n - k) * lq
    if family == "poisson":
        return y * eta - jnp.exp(eta) - gammaln(y + 1)
    if family == "negative_binomial":
        a = alpha
        lmu = eta
        return (y * (jnp.log(a) + lmu) - (y + 1 / a) * jnp.logaddexp(0.0, jnp.log(a) + lmu)
                + gammaln(y + 1 / a) - gammaln(1 / a) - gammaln(y + 1))
    if family == "gaussian":
        return -0.5 * ((y - eta) * jnp.exp(-disp)) ** 2 - disp - 0.5 * jnp.log(2 * jnp.pi)
    if family == "gamma":  # log link, shape k = exp(disp)
        k = jnp.exp(disp)
        return k * disp - k * eta + (k - 1) * jnp.log(y) - k * y * jnp.exp(-eta) - gammaln(k)
    raise ValueError(family)


def rows_stats(rows, n_pad: int) -> dict[str, np.ndarray]:
    """One client's rows as fixed-shape arrays of ``n_pad`` rows (padding: weight 0)."""
    m, p = rows.X.shape
    if m > n_pad:
        raise ValueError(f"client {rows.client!r} has {m} rows, more than the {n_pad} the fit was set up for")

    def pad(a, value=0.0):
        out = np.full((n_pad, *a.shape[1:]), value, dtype=float)
        out[:m] = a
        return out

    # padded rows get y = 1/2 (inside every family's range) and weight 0
    return {"X": pad(rows.X), "y": pad(rows.y, 0.5), "n": pad(rows.n, 1.0), "f": pad(rows.f), "off": pad(rows.offset)}


@register
@dataclass(frozen=True)
class SharedSite:
    """A client's likelihood of coefficients shared by every client (``BayesianGLM``)."""

    family: str
    link: str
    alpha: float
    p: int
    n_pad: int

    theta_dim = 0
    local_dim = 0

    @property
    def phi_dim(self) -> int:
        return self.p + (self.family in DISPERSION)

    def cache_key(self) -> tuple:
        return ("GLMShared", self.family, self.link, self.alpha, self.p, self.n_pad)

    def client_stats(self, rows) -> dict[str, np.ndarray]:
        return rows_stats(rows, self.n_pad)

    def init_local(self, stats):
        return np.zeros(0), np.zeros(0)

    def log_collapsed(self, phi, z, stats):
        import jax.numpy as jnp

        beta = phi[: self.p]
        disp = phi[self.p] if self.family in DISPERSION else 0.0
        eta = stats["X"] @ beta + stats["off"]
        ll = loglik_rows(self.family, self.link, self.alpha, eta, stats["y"], stats["n"], disp)
        return jnp.sum(jnp.where(stats["f"] > 0, stats["f"] * ll, 0.0))


@register
@dataclass(frozen=True)
class HierarchicalSite:
    """A client's likelihood of ``phi = (mu, log tau)`` with its own coefficients
    ``theta_k ~ N(mu, diag(tau))`` integrated out (Laplace, ``inner_steps`` Newton steps)."""

    family: str
    link: str
    alpha: float
    p: int
    n_pad: int
    inner_steps: int = 10

    theta_dim = 0
    local_dim = 0

    @property
    def phi_dim(self) -> int:
        return 2 * self.p

    def cache_key(self) -> tuple:
        return ("GLMHier", self.family, self.link, self.alpha, self.p, self.n_pad, self.inner_steps)

    def client_stats(self, rows) -> dict[str, np.ndarray]:
        return rows_stats(rows, self.n_pad)

    def init_local(self, stats):
        return np.zeros(0), np.zeros(0)

    def _joint(self, theta, mu, log_tau, stats):
        """log p(y_k | theta) + log N(theta | mu, diag tau)."""
        import jax.numpy as jnp

        eta = stats["X"] @ theta + stats["off"]
        ll = loglik_rows(self.family, self.link, self.alpha, eta, stats["y"], stats["n"], 0.0)
        ll = jnp.sum(jnp.where(stats["f"] > 0, stats["f"] * ll, 0.0))
        d = theta - mu
        return ll - 0.5 * jnp.sum(d**2 * jnp.exp(-log_tau) + log_tau + jnp.log(2 * jnp.pi))

    def theta_mode(self, mu, log_tau, stats):
        """The mode of theta_k given (mu, log tau) and the negative Hessian there (jax)."""
        import jax
        import jax.numpy as jnp

        X, w = stats["X"], jnp.where(stats["f"] > 0, stats["f"], 0.0)
        prec = jnp.exp(-log_tau)

        def rows_ll(eta):
            return jnp.sum(w * loglik_rows(self.family, self.link, self.alpha, eta, stats["y"], stats["n"], 0.0))

        d1 = jax.grad(rows_ll)  # the likelihood is a sum over rows: its derivatives in eta are per row
        d2 = jax.grad(lambda e: jnp.sum(d1(e)))

        def newton(t):
            # gradient and negative Hessian in closed form, two passes over the rows: every
            # family and link here is log-concave in eta, so -d2 >= 0 (floored against rounding)
            eta = X @ t + stats["off"]
            grad = X.T @ d1(eta) - (t - mu) * prec
            negH = X.T @ (X * jnp.maximum(-d2(eta), 0.0)[:, None]) + jnp.diag(prec)
            return jnp.linalg.solve(negH, grad), negH

        def safe_step(_, t):
            # a Newton step, capped so that no row's linear predictor moves by more than 3
            # (from a poor start, Newton on many trials per row overshoots and diverges)
            step = newton(t)[0]
            move = jnp.max(jnp.abs(X @ step) * (w > 0))
            return t + step * jnp.minimum(1.0, 3.0 / jnp.maximum(move, 1e-12))

        t = jax.lax.stop_gradient(jax.lax.fori_loop(0, self.inner_steps, safe_step, mu))
        # one more Newton step that carries the derivatives in (mu, log tau): exact first and
        # second derivatives of max_theta at the optimum (the gradient in theta is 0 there)
        t = t + newton(t)[0]
        return t, newton(t)[1]

    def log_collapsed(self, phi, z, stats):
        import jax.numpy as jnp

        mu, log_tau = phi[: self.p], phi[self.p:]
        t, negH = self.theta_mode(mu, log_tau, stats)
        sign, logdet = jnp.linalg.slogdet(negH)
        return self._joint(t, mu, log_tau, stats) + 0.5 * self.p * jnp.log(2 * jnp.pi) - 0.5 * logdet
