"""Site model of the federated Bayesian lasso and ridge (the linear-models paper's Section 4.3),
on sufficient statistics.

Client k: ``y_k = X_k beta_k + e``, ``e ~ N(0, sigma^2 I)`` with ``X_k`` = [1, features]
when there is an intercept. The intercept has a fixed N(0, intercept_sd^2) prior (never
penalised, never selected); each penalised coefficient has, given phi,

* lasso: ``beta_ki ~ Laplace(0, b)``, ``b = sigma / lambda`` (Park-Casella, default) or
  ``sigma^2 / lambda`` (the journal's convention);
* ridge: ``beta_ki ~ N(0, sigma^2 / lambda)``.

``phi = (log lambda, log sigma^2)`` with shared noise, ``phi = (log lambda,)`` with
per-client noise, in which case ``log sigma_k^2`` is a local latent with a normal prior.

The lasso is sampled as a scale mixture, non-centred: ``beta_ki | s_ki ~ N(0, s_ki)``,
``s_ki = b^2 e_ki``, ``e_ki ~ Exponential(rate 1/2)`` (then ``beta_ki ~ Laplace(0, b)``),
and the local latents are ``u_ki = log e_ki``. Given (phi, u) every coefficient is
Gaussian and is integrated out in closed form, so the sampler sees the smooth, (2 + d)-
dimensional target ``p(phi-cavity) p(y_k | phi, u) p(u)``, and client posteriors of the
coefficients are mixtures of exact Gaussians (Rao-Blackwellised). Non-centring keeps the
``u`` of coefficients the data say little about independent of lambda.

Collapsed likelihood, with ``D`` the prior variances and ``R = diag(sqrt(D))``:
``y ~ N(0, sigma^2 I + X D X^T)``; with ``P = I + R A R / sigma^2`` (eigenvalues >= 1),
``log det = n log sigma^2 + log det P`` and
``y^T Sigma^-1 y = c / sigma^2 - (R b)^T P^-1 (R b) / sigma^4``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from ..result_file import register


@register
@dataclass(frozen=True)
class ShrinkageSite:
    """Likelihood of one client for the shrinkage model, as a function of phi and locals.

    Parameters
    ----------
    d : int
        Penalised coefficients.
    penalty : {"lasso", "ridge"}
    scale : {"sd", "variance"}
        Lasso scale ``sigma / lambda`` ("sd") or ``sigma^2 / lambda`` ("variance").
        Ignored by the ridge (variance ``sigma^2 / lambda``).
    noise : {"shared", "client"}
    intercept : bool
        Whether column 0 of the design is an unpenalised intercept.
    intercept_sd : float
    log_sigma2_prior : (float, float)
        Normal prior of ``log sigma_k^2`` with per-client noise.
    """

    d: int
    penalty: str = "lasso"
    scale: str = "sd"
    noise: str = "shared"
    intercept: bool = True
    intercept_sd: float = 10.0
    log_sigma2_prior: tuple = (0.0, 1.0)

    def __post_init__(self):
        if self.penalty not in ("lasso", "ridge"):
            raise ValueError(f"penalty must be 'lasso' or 'ridge', not {self.penalty!r}")
        if self.scale not in ("sd", "variance"):
            raise ValueError(f"scale must be 'sd' or 'variance', not {self.scale!r}")
        if self.noise not in ("shared", "client"):
            raise ValueError(f"noise must be 'shared' or 'client', not {self.noise!r}")

    # ------------------------------------------------------------------ dimensions
    @property
    def phi_dim(self) -> int:
        return 2 if self.noise == "shared" else 1

    @property
    def theta_dim(self) -> int:
        return self.d + int(self.intercept)

    @property
    def local_dim(self) -> int:
        return int(self.noise == "client") + (self.d if self.penalty == "lasso" else 0)

    def cache_key(self) -> tuple:
        return (
            "ShrinkageSite",
            self.d,
            self.penalty,
            self.scale,
            self.noise,
            self.intercept,
            self.intercept_sd,
            self.log_sigma2_prior,
        )

    # ------------------------------------------------------------------ client side
    def client_stats(self, data) -> dict[str, np.ndarray]:
        """Sufficient statistics ``A = X^T X, b = X^T y, c = y^T y, n`` of a client."""
        X, y, _ = data
        return self.stats_from(X, y)

    def stats_from(self, X: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        if X.shape[1] != self.theta_dim:
            raise ValueError(f"design has {X.shape[1]} columns, the site expects {self.theta_dim}")
        return {"A": X.T @ X, "b": X.T @ y, "c": np.array(float(y @ y)), "n": np.array(float(len(y)))}

    def init_local(self, stats) -> tuple[np.ndarray, np.ndarray]:
        """Starting values of (beta_k, z_k): a ridge fit; log residual variance; u = log 2
        (the prior mean of e)."""
        A, b, c, n = stats["A"], stats["b"], float(stats["c"]), float(stats["n"])
        p = self.theta_dim
        beta = np.linalg.solve(A + 1e-3 * (np.trace(A) / p + 1.0) * np.eye(p), b)
        z = []
        if self.noise == "client" and n <= p:  # the fit interpolates: start at the prior's mean
            z.append(float(self.log_sigma2_prior[0]))
        elif self.noise == "client":
            rss = max(c - 2 * b @ beta + beta @ A @ beta, 1e-6 * max(c, 1.0))
            z.append(np.log(rss / (n - p)))
        if self.penalty == "lasso":
            z.extend([np.log(2.0)] * self.d)
        return beta, np.asarray(z, dtype=float)

    # ------------------------------------------------------------------ parameters (jax)
    def _log_variances(self, phi, z, xp=None):
        """(log sigma^2, log prior variances of all coefficients, log p(z)) at (phi, z), or
        at a batch of them along leading axes; ``xp`` is the array module (jax.numpy inside
        kernels, numpy for batches of draws outside them)."""
        if xp is None:
            import jax.numpy as xp

        log_lam = phi[..., 0]
        lp = 0.0
        if self.noise == "shared":
            log_s2 = phi[..., 1]
            u = z
        else:
            m, s = self.log_sigma2_prior
            log_s2 = z[..., 0]
            lp = lp - 0.5 * ((log_s2 - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)
            u = z[..., 1:]
        if self.penalty == "ridge":
            log_D = (log_s2 - log_lam)[..., None] * xp.ones(self.d, dtype=phi.dtype)
        else:
            # log b = log sigma - log lambda (sd) or log sigma^2 - log lambda (variance)
            log_b = (0.5 if self.scale == "sd" else 1.0) * log_s2 - log_lam
            log_D = 2 * log_b[..., None] + u
            lp = lp + xp.sum(u - xp.exp(u) / 2 - np.log(2.0), axis=-1)  # e ~ Exp(rate 1/2), u = log e
        if self.intercept:
            first = xp.full(log_D.shape[:-1] + (1,), 2 * np.log(self.intercept_sd), dtype=log_D.dtype)
            log_D = xp.concatenate([first, log_D], axis=-1)
        return log_s2, log_D, lp

    def _variances(self, phi, z):
        """(sigma^2, prior variances D of all coefficients, log p(z)) at one (phi, z)."""
        import jax.numpy as jnp

        log_s2, log_D, lp = self._log_variances(phi, z)
        return jnp.exp(log_s2), jnp.exp(log_D), lp

    def log_collapsed(self, phi, z, stats):
        """log p(y_k | phi, z) + log p(z), every coefficient integrated out."""
        return self.collapsed_factor(phi, z, stats)[0]

    def collapsed_factor(self, phi, z, stats):
        """``(log_collapsed(phi, z, stats), factor)``: ``factor`` = (R, L, L^-1 R b / sigma^2)
        with ``L L^T = P`` is what :meth:`draw_theta` needs, so that a sampler pays for one
        Cholesky factor per (phi, z). The factor carries no gradient; the value's gradient is
        written out (:func:`gaussian_evidence`)."""
        import jax

        log_s2, log_D, lp = self._log_variances(phi, z)
        value, factor = gaussian_evidence()(log_s2, log_D, stats["A"], stats["b"], stats["c"], stats["n"])
        return value + lp, jax.lax.stop_gradient(factor)

    def collapsed_score(self, phi, z, stats, factor):
        """The gradient of :meth:`log_collapsed` at (phi, z), as ``(d/d phi, d/d z)``, from
        the ``factor`` of :meth:`collapsed_factor` at a point with the same sigma^2 and prior
        variances (e.g. (phi, z) itself): no second factorisation."""
        import jax
        import jax.numpy as jnp

        parts = lambda phi, z: tuple(jnp.asarray(a) for a in self._log_variances(phi, z))  # noqa: E731
        (log_s2, _, lp), pullback = jax.vjp(parts, phi, z)
        d_log_s2, d_log_D, _, _ = evidence_score(log_s2, factor, stats["c"], stats["n"])
        return pullback((d_log_s2, d_log_D, jnp.ones_like(lp)))

    def log_locals_prior(self, phi, z):
        """``log p(z)``: the part of :meth:`log_collapsed` that changes along
        :meth:`invariant_direction` (the likelihood does not)."""
        return self._log_variances(phi, z)[2]

    def log_augmented(self, phi, theta, z, stats):
        raise NotImplementedError("the shrinkage site is sampled collapsed (target='collapsed')")

    # ------------------------------------------------------------------ Gibbs conditionals (jax)
    @property
    def mh_locals(self) -> int:
        """Leading entries of z updated by Metropolis together with phi (log sigma_k^2 with
        per-client noise); the rest (the lasso's u) are drawn by :meth:`draw_locals`."""
        return int(self.noise == "client")

    def draw_theta(self, factor, key):
        """One draw of all coefficients from their Gaussian conditional given (phi, z), from
        that point's ``factor`` (:meth:`collapsed_factor`)."""
        import jax
        from jax.scipy.linalg import solve_triangular

        r, L, w = factor
        eps = jax.random.normal(key, r.shape, dtype=r.dtype)
        # P^-1 = L^-T L^-1: mean R P^-1 R b / s2, noise R L^-T eps ~ N(0, R P^-1 R).
        return r * solve_triangular(L.T, w + eps, lower=False)

    def theta_mean(self, factor):
        """The mean of the coefficients' Gaussian conditional, from the ``factor`` of
        :meth:`collapsed_factor` (what :meth:`draw_theta` draws around)."""
        from jax.scipy.linalg import solve_triangular

        r, L, w = factor
        return r * solve_triangular(L.T, w, lower=False)

    def draw_locals(self, phi, theta, z, stats, key):
        """z with its lasso scales redrawn given (phi, theta): ``1 / e_ki`` is inverse
        Gaussian with mean ``b / |beta_ki|`` and shape 1 (Park & Casella 2008), drawn by
        Michael, Schucany & Haas (1976) in a form that stays finite for beta near 0."""
        import jax
        import jax.numpy as jnp

        if self.penalty != "lasso":
            return z
        m = self.mh_locals
        log_s2 = phi[1] if self.noise == "shared" else z[0]
        log_b = (0.5 if self.scale == "sd" else 1.0) * log_s2 - phi[0]
        beta = theta[int(self.intercept) :]
        mu = jnp.exp(log_b) / jnp.maximum(jnp.abs(beta), 1e-150)
        k1, k2 = jax.random.split(key)
        w = 0.5 * mu * jax.random.normal(k1, beta.shape, dtype=phi.dtype) ** 2
        x = mu / (1.0 + w + jnp.sqrt(w * w + 2.0 * w))  # = mu + mu^2 y/2 - mu/2 sqrt(4 mu y + mu^2 y^2)
        keep = jax.random.uniform(k2, beta.shape, dtype=phi.dtype) * (mu + x) <= mu
        log_inv_e = jnp.where(keep, jnp.log(x), 2 * jnp.log(mu) - jnp.log(x))
        return jnp.concatenate([z[:m], -log_inv_e])

    def invariant_direction(self) -> np.ndarray | None:
        """A direction in (phi, z) along which the likelihood is constant: log lambda + t,
        u + 2t leaves every prior variance b^2 e unchanged (the lasso's centred
        parametrisation, an interweaving move against slow lambda-u mixing)."""
        if self.penalty != "lasso":
            return None
        v = np.zeros(self.phi_dim + self.local_dim)
        v[0] = 1.0
        v[self.phi_dim + self.mh_locals :] = 2.0
        return v

    # ------------------------------------------------------------------ numpy, batches of draws
    def _batch_variances(self, phi, z):
        phi = np.asarray(phi, dtype=float)
        log_s2, log_D, _ = self._log_variances(phi, np.asarray(z, dtype=float).reshape(len(phi), -1), xp=np)
        return np.exp(log_s2), np.exp(log_D)

    def theta_conditional(self, phi: np.ndarray, z: np.ndarray, stats) -> tuple[np.ndarray, np.ndarray]:
        """Mean (M, p) and covariance (M, p, p) of the coefficients given each draw of (phi, z)."""
        s2, D = self._batch_variances(phi, z)
        r = np.sqrt(D)
        p = D.shape[1]
        P = np.eye(p)[None] + r[:, :, None] * stats["A"][None] * r[:, None, :] / s2[:, None, None]
        Pinv = np.linalg.inv(P)
        V = r[:, :, None] * Pinv * r[:, None, :]
        V = 0.5 * (V + np.swapaxes(V, 1, 2))
        m = np.einsum("mij,j->mi", V, stats["b"]) / s2[:, None]
        return m, V

    def noise_variance(self, phi: np.ndarray, z: np.ndarray, stats) -> np.ndarray:
        return self._batch_variances(phi, z)[0]

    def prior_draws(self, phi: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
        """Coefficients and noise sd of a new client at each draw of phi (shared noise; with
        per-client noise log sigma^2 is drawn from its prior)."""
        M = len(phi)
        parts: list[np.ndarray] = []
        if self.noise == "client":
            m, s = self.log_sigma2_prior
            parts.append(m + s * rng.standard_normal((M, 1)))
        if self.penalty == "lasso":
            parts.append(np.log(rng.exponential(2.0, size=(M, self.d))))
        z = np.concatenate(parts, axis=1) if parts else np.zeros((M, 0))
        s2, D = self._batch_variances(phi, z)
        beta = np.sqrt(D) * rng.standard_normal(D.shape)
        return beta, np.sqrt(s2)


def evidence_score(log_s2, factor, c, n):
    """``(d/d log sigma^2, d/d log D, L^-1, g)`` of the Gaussian evidence (see
    :func:`gaussian_evidence`) from its factor ``(R, L, w)``: one triangular inverse, no
    factorisation."""
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular

    r, L, w = factor
    s2 = jnp.exp(log_s2)
    Linv = solve_triangular(L, jnp.eye(r.size, dtype=r.dtype), lower=True)
    g = solve_triangular(L.T, w, lower=False)
    diag = jnp.sum(Linv * Linv, axis=0)  # of P^-1 = L^-T L^-1
    d_log_s2 = 0.5 * (-n + c / s2 + r.size - jnp.sum(diag) - w @ w - g @ g)
    d_log_D = 0.5 * (-1.0 + diag + g * g)
    return d_log_s2, d_log_D, Linv, g


@cache
def gaussian_evidence():
    """``f(log sigma^2, log D, A, b, c, n) -> (log N(y; 0, sigma^2 I + X D X^T), (R, L, w))``
    from the statistics (module docstring), a jax function whose gradient is written out:
    with ``P = L L^T``, ``w = L^-1 R b / sigma^2`` and ``g = L^-T w`` (``R g`` is the
    conditional mean of the coefficients),

    * d/d log D_i = (-1 + (P^-1)_ii + g_i^2) / 2,
    * d/d log sigma^2 = (-n + c / sigma^2 + k - tr P^-1 - |w|^2 - |g|^2) / 2 (k coefficients),
    * d/dA = -R (P^-1 + g g^T) R / (2 sigma^2), d/db = R g / sigma^2, d/dc = -1 / (2 sigma^2),
      d/dn = -log(2 pi sigma^2) / 2,

    one triangular inverse where autodiff of the Cholesky factor takes about ten times as
    long (the control variates need the score at every kept draw). The factor's cotangent is
    ignored: callers stop its gradient."""
    import jax
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular

    def parts(log_s2, log_D, A, b, c, n):
        s2, r = jnp.exp(log_s2), jnp.exp(0.5 * log_D)
        P = jnp.eye(r.size, dtype=r.dtype) + (r[:, None] * A * r[None, :]) / s2
        L = jnp.linalg.cholesky(P)
        w = solve_triangular(L, r * b, lower=True) / s2
        value = -0.5 * n * jnp.log(2 * jnp.pi * s2) - 0.5 * c / s2 - jnp.sum(jnp.log(jnp.diag(L))) + 0.5 * w @ w
        return value, (r, L, w)

    @jax.custom_vjp
    def evidence(log_s2, log_D, A, b, c, n):
        return parts(log_s2, log_D, A, b, c, n)

    def fwd(log_s2, log_D, A, b, c, n):
        out = parts(log_s2, log_D, A, b, c, n)
        return out, (log_s2, out[1], c, n)

    def bwd(res, cotangents):
        log_s2, (r, L, w), c, n = res
        gv = cotangents[0]
        s2 = jnp.exp(log_s2)
        d_log_s2, d_log_D, Linv, g = evidence_score(log_s2, (r, L, w), c, n)
        Pinv = Linv.T @ Linv
        d_A = -0.5 * (r[:, None] * (Pinv + jnp.outer(g, g)) * r[None, :]) / s2
        d_b = r * g / s2
        d_c = jnp.broadcast_to(-0.5 / s2, jnp.shape(c)).astype(r.dtype)
        d_n = jnp.broadcast_to(-0.5 * jnp.log(2 * jnp.pi * s2), jnp.shape(n)).astype(r.dtype)
        return tuple(gv * t for t in (d_log_s2, d_log_D, d_A, d_b, d_c, d_n))

    evidence.defvjp(fwd, bwd)
    return evidence
