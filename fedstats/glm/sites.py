"""EP site models of the Bayesian GLMs: one client's likelihood as a jax function of phi.

A client's rows travel to the tilted estimators as fixed-shape arrays padded to ``n_pad``
rows (padding has frequency weight 0), so that every client shares one compiled kernel.
The rows are rebuilt from the client's data at every step and never kept in its EP state
(:class:`~fedstats.inference.ep.RowsEP`): a client's final state, which Flower hands to the
server, holds its site only.

* :class:`SharedSite` (``BayesianGLM``): ``phi = beta`` (then ``log sigma`` for gaussian,
  ``log shape`` for gamma), the client's full likelihood;
* :class:`HierarchicalSite` (``HierarchicalGLM``): ``phi = (mu, log tau)``, the client's own
  coefficients ``theta_k ~ N(mu, diag(tau))`` integrated out by adaptive Gauss-Hermite
  quadrature (``quadrature`` nodes per coefficient, centred at the mode of theta_k and
  scaled by the curvature there; 1 node is the Laplace approximation). The mode comes from a
  few Newton iterations from a start built from the client's own estimate, each step capped;
  the last step is differentiated, which gives the exact gradient and Hessian of the profile
  part at the optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..federation.protocol import client_function
from ..result_file import register

#: families and links with a jax likelihood (the Bayesian models)
BAYES_LINKS = {
    "binomial": ("logit", "probit", "cloglog"),
    "poisson": ("log",),
    "negative_binomial": ("log",),
    "gaussian": ("identity",),
    "gamma": ("log",),
}
#: families whose dispersion is a parameter (its log is the last entry of phi)
DISPERSION = {"gaussian": "log_sigma", "gamma": "log_shape"}
#: the largest rows x coefficients^2 for which HierarchicalSite keeps the rows' outer products
#: (1 MiB per client)
_OUTER_LIMIT = 2**17


def loglik_rows(family: str, link: str, alpha: float, eta, y, n, disp):
    """Per-row log-likelihood at the linear predictor ``eta`` (jax); ``y`` is the proportion
    of successes for binomial (``n`` trials), ``disp`` the log dispersion parameter."""
    import jax.numpy as jnp
    from jax.scipy.special import gammaln
    from jax.scipy.stats import norm

    if family == "binomial":
        k = y * n
        const = gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)
        if link == "logit":  # k log p + (n - k) log(1 - p) = k eta - n log(1 + e^eta): one softplus
            return const + k * eta - n * jnp.logaddexp(0.0, eta)
        if link == "probit":
            lp, lq = norm.logcdf(eta), norm.logcdf(-eta)
        else:  # cloglog: p = 1 - exp(-exp(eta))
            e = jnp.exp(jnp.minimum(eta, 30.0))
            lp, lq = jnp.log(-jnp.expm1(-e) + 1e-300), -e
        return const + k * lp + (n - k) * lq
    if family == "poisson":
        return y * eta - jnp.exp(eta) - gammaln(y + 1)
    if family == "negative_binomial":
        a = alpha
        lmu = eta
        return (
            y * (jnp.log(a) + lmu)
            - (y + 1 / a) * jnp.logaddexp(0.0, jnp.log(a) + lmu)
            + gammaln(y + 1 / a)
            - gammaln(1 / a)
            - gammaln(y + 1)
        )
    if family == "gaussian":
        return -0.5 * ((y - eta) * jnp.exp(-disp)) ** 2 - disp - 0.5 * jnp.log(2 * jnp.pi)
    if family == "gamma":  # log link, shape k = exp(disp)
        k = jnp.exp(disp)
        return k * disp - k * eta + (k - 1) * jnp.log(y) - k * y * jnp.exp(-eta) - gammaln(k)
    raise ValueError(family)


@client_function
def pointwise_rows(spec, X, y):
    """``(draws, rows)`` log-likelihood of a client's GLM rows at the draws of ``spec``
    (:mod:`fedstats.inference.elpd`): ``coef`` (``(draws, p)``, data scale), ``disp`` (the log
    dispersion per draw, or None), ``family``, ``link``, ``alpha``, ``intercept`` and the
    column indices of the predictors (``keep``) and of the ``offset``, ``exposure`` and
    ``trials`` columns (None where unused)."""
    D = X[:, list(spec["keep"])]
    if spec["intercept"]:
        D = np.column_stack([np.ones(len(X)), D])
    off = np.zeros(len(X))
    if spec["offset"] is not None:
        off = off + X[:, spec["offset"]]
    if spec["exposure"] is not None:
        off = off + np.log(X[:, spec["exposure"]])
    n = np.ones(len(X)) if spec["trials"] is None else X[:, spec["trials"]]
    y = y if spec["trials"] is None else y / n
    eta = np.asarray(spec["coef"], dtype=float) @ D.T + off
    disp = 0.0 if spec["disp"] is None else np.asarray(spec["disp"], dtype=float)[:, None]
    import jax

    with jax.enable_x64(True):  # scoped, as every jax computation of fedstats
        return np.asarray(loglik_rows(spec["family"], spec["link"], spec["alpha"], eta, y, n, disp), dtype=float)


def eta_derivatives(family: str, link: str, alpha: float, eta, y, n):
    """First and second derivatives of :func:`loglik_rows` in ``eta``, per row (jax): closed
    forms for the canonical-like pairs the hierarchical models use most, automatic
    differentiation for the others."""
    import jax
    import jax.numpy as jnp

    if family == "binomial" and link == "logit":
        s = jax.nn.sigmoid(eta)
        return n * (y - s), -n * s * (1 - s)
    if family == "poisson":
        mu = jnp.exp(eta)
        return y - mu, -mu
    if family == "negative_binomial":
        mu = jnp.exp(eta)
        return (y - mu) / (1 + alpha * mu), -mu * (1 + alpha * y) / (1 + alpha * mu) ** 2
    d1 = jax.grad(lambda e: jnp.sum(loglik_rows(family, link, alpha, e, y, n, 0.0)))
    return d1(eta), jax.grad(lambda e: jnp.sum(d1(e)))(eta)


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
    ``theta_k ~ N(mu, diag(tau))`` integrated out (at most ``max_steps`` Newton steps to the
    mode, then adaptive Gauss-Hermite quadrature with ``quadrature`` nodes per coefficient,
    a product rule of ``quadrature ** p`` nodes; 1: the Laplace approximation)."""

    family: str
    link: str
    alpha: float
    p: int
    n_pad: int
    max_steps: int = 15
    quadrature: int = 1

    theta_dim = 0
    local_dim = 0

    @property
    def phi_dim(self) -> int:
        return 2 * self.p

    def cache_key(self) -> tuple:
        return ("GLMHier", self.family, self.link, self.alpha, self.p, self.n_pad, self.max_steps, self.quadrature)

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

    def _newton(self, stats):
        """``(newton, curvature)``: ``newton(t, mu, prec)`` is the Newton step of ``log p(y_k | t)
        + log N(t | mu, 1/prec)`` and ``curvature(t, prec)`` its negative Hessian, one pass over
        the rows each (every family and link here is log-concave in eta: the per-row curvature
        is floored at 0 against rounding)."""
        import jax.numpy as jnp

        X, w = stats["X"], jnp.where(stats["f"] > 0, stats["f"], 0.0)
        n, p = X.shape
        if n * p * p <= _OUTER_LIMIT:
            # X' diag(c) X as one product of the per-row curvatures with the rows' outer
            # products, which depend on the rows only: under vmap over draws of phi they are
            # formed once per client and each batch of draws costs one matrix product
            outer = (X[:, :, None] * X[:, None, :]).reshape(n, p * p)

            def gram(c):
                return (c @ outer).reshape(p, p)
        else:

            def gram(c):
                return X.T @ (X * c[:, None])

        def derivs(t):
            d1, d2 = eta_derivatives(self.family, self.link, self.alpha, X @ t + stats["off"], stats["y"], stats["n"])
            return w * d1, w * jnp.maximum(-d2, 0.0)

        def newton(t, mu, prec):
            d1, c = derivs(t)
            return jnp.linalg.solve(gram(c) + jnp.diag(prec), X.T @ d1 - (t - mu) * prec)

        def curvature(t, prec):
            return gram(derivs(t)[1]) + jnp.diag(prec)

        return newton, curvature

    def _iterate(self, stats, newton, t, mu, prec, max_steps):
        """Newton steps from ``t`` until no row's linear predictor moves by more than 1e-4
        (at most ``max_steps``), each capped so that none moves by more than 3 (from a poor
        start, Newton on many trials per row overshoots and diverges). Under ``vmap`` the
        loop runs until every lane has converged: near the posterior that is two or three
        steps; a separated client (no finite estimate of its own) about five."""
        import jax
        import jax.numpy as jnp

        X, live = stats["X"], stats["f"] > 0

        def body(carry):
            i, t, _ = carry
            d = newton(t, mu, prec)
            move = jnp.max(jnp.abs(X @ d) * live)
            return i + 1, t + d * jnp.minimum(1.0, 3.0 / jnp.maximum(move, 1e-12)), move

        init = (jnp.zeros((), jnp.int32), t, jnp.array(jnp.inf, t.dtype))
        return jax.lax.while_loop(lambda c: (c[0] < max_steps) & (c[2] > 1e-4), body, init)[1]

    def prepare(self, stats):
        """The statistics with the client's :meth:`_anchor` added (inside the compiled kernels,
        once per client, before any loop over phi; never kept or sent)."""
        t, P = self._anchor(stats)
        return {**stats, "anchor": t, "anchor_curvature": P}

    def _anchor(self, stats):
        """The client's own coefficients under a vague ``N(0, 10^2)`` (the maximum likelihood
        estimate, kept finite under separation) and the likelihood's curvature there: a
        Gaussian summary of its rows that depends on the rows only (:meth:`prepare` computes
        it once per client)."""
        import jax.numpy as jnp

        if "anchor" in stats:
            return stats["anchor"], stats["anchor_curvature"]
        newton, curvature = self._newton(stats)
        zero = jnp.zeros(self.p)
        t = self._iterate(stats, newton, zero, zero, jnp.full(self.p, 0.01), self.max_steps)
        return t, curvature(t, zero)

    def theta_mode(self, mu, log_tau, stats):
        """The mode of theta_k given (mu, log tau) and the negative Hessian there (jax).

        Newton starts where the mode would be if the client's likelihood were the Gaussian
        of :meth:`_anchor` (the precision-weighted mean of its estimate and ``mu``), close
        for any (mu, tau) near the posterior, and iterates (:meth:`_iterate`); then one full
        step that carries the derivatives in (mu, log tau): at the optimum (the gradient in
        theta is 0 there) it gives the exact first and second derivatives of the joint at
        its maximum over theta."""
        import jax
        import jax.numpy as jnp

        newton, curvature = self._newton(stats)
        prec = jnp.exp(-log_tau)
        # the iterations carry no derivatives (their inputs are constants to autodiff)
        m, q = jax.lax.stop_gradient(mu), jax.lax.stop_gradient(prec)
        t_hat, P = self._anchor(stats)
        t = self._iterate(stats, newton, jnp.linalg.solve(P + jnp.diag(q), P @ t_hat + q * m), m, q, self.max_steps)
        t = t + newton(t, mu, prec)
        return t, curvature(t, prec)

    def log_collapsed(self, phi, z, stats):
        """``log p(y_k | mu, tau)``: theta_k integrated out around its mode ``t`` with the
        curvature ``negH = L L'`` there, ``theta = t + sqrt(2) L^-T x`` at the Gauss-Hermite
        nodes ``x`` (one node, ``x = 0``, is the Laplace approximation). The Laplace error is
        largest for clients whose own coefficients are poorly determined and skewed (few rows,
        all-0 or all-1 outcomes); its sum over the clients biases ``log tau``."""
        import jax
        import jax.numpy as jnp

        mu, log_tau = phi[: self.p], phi[self.p :]
        t, negH = self.theta_mode(mu, log_tau, stats)
        if self.quadrature == 1:
            sign, logdet = jnp.linalg.slogdet(negH)
            return self._joint(t, mu, log_tau, stats) + 0.5 * self.p * jnp.log(2 * jnp.pi) - 0.5 * logdet
        x, logw = gauss_hermite(self.quadrature, self.p)
        L = jnp.linalg.cholesky(negH)
        thetas = t + jax.scipy.linalg.solve_triangular(L.T, np.sqrt(2.0) * x.T, lower=False).T
        joint = jax.vmap(lambda th: self._joint(th, mu, log_tau, stats))(thetas)
        logdet_L = jnp.sum(jnp.log(jnp.diagonal(L)))
        return jax.scipy.special.logsumexp(joint + np.sum(x**2, axis=1) + logw) + 0.5 * self.p * np.log(2.0) - logdet_L


def gauss_hermite(nodes: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The product Gauss-Hermite rule for ``int exp(-|x|^2) f(x) dx`` over ``p`` dimensions:
    nodes ``(nodes**p, p)`` and log weights ``(nodes**p,)``."""
    x, w = np.polynomial.hermite.hermgauss(nodes)
    grid = np.stack(np.meshgrid(*[np.arange(nodes)] * p, indexing="ij"), axis=-1).reshape(-1, p)
    return x[grid], np.log(w)[grid].sum(axis=1)


#: nodes per coefficient of HierarchicalGLM's ``quadrature="auto"``: 7 for a random intercept
#: alone, 3 (9 product nodes) for two coefficients, the Laplace approximation for more (27
#: nodes for three cost 6x the fit time on clients of 30-150 rows, for a small gain)
AUTO_QUADRATURE = {1: 7, 2: 3}


def n_pad(n: int) -> int:
    """Rows per client as the kernels see them: the largest client's, rounded up to a
    multiple of 32, so that fits of similar data share compilations."""
    return -(-n // 32) * 32
