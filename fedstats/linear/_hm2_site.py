"""The device likelihood of HM2 (Example 4.1 of the linear-models paper) on sufficient statistics.

Device k holds ``(X_k, y_k)``; the model is

    y_k | theta_k, sigma_k ~ N(X_k theta_k, sigma_k^2 I)
    theta_k | phi         ~ N(mu, diag(tau))

Everything a device contributes depends on its data only through ``A = X^T X``,
``b = X^T y``, ``c = y^T y`` and ``n``, so all devices share array shapes and one compiled
kernel serves them all. ``phi`` stacks ``mu`` (if unknown) and ``log tau`` (if unknown);
``z`` holds ``log sigma_k`` when the noise is unknown (a local nuisance that never leaves
the device).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..results import register


@register
@dataclass(frozen=True)
class HM2Site:
    """Site model of HM2. See module docstring.

    Parameters
    ----------
    d : int
        Number of coefficients per device.
    tau_kind : {"diag", "iso", "known"}
        One log tau per coefficient, one shared log tau, or tau fixed at ``tau_known``.
    tau_known : tuple of float or None
        Known prior variances (length d) when ``tau_kind == "known"``.
    sigma_known : bool
        Whether each device knows its noise sd (``stats["sigma2"]``) or samples log sigma_k.
    log_sigma_prior : (float, float)
        Normal prior (mean, sd) of log sigma_k when unknown: sigma_k ~ LogNormal.
    """

    d: int
    tau_kind: str = "diag"
    tau_known: tuple | None = None
    sigma_known: bool = False
    log_sigma_prior: tuple = (0.0, 1.0)

    # ------------------------------------------------------------------ dimensions
    @property
    def n_log_tau(self) -> int:
        return {"diag": self.d, "iso": 1, "known": 0}[self.tau_kind]

    @property
    def phi_dim(self) -> int:
        return self.d + self.n_log_tau

    @property
    def theta_dim(self) -> int:
        return self.d

    @property
    def local_dim(self) -> int:
        return 0 if self.sigma_known else 1

    @property
    def gaussian_dim(self) -> int:
        """phi's leading block ``mu``: given tau and sigma_k the site is Gaussian in it."""
        return self.d

    def cache_key(self) -> tuple:
        return ("HM2Site", self.d, self.tau_kind, self.tau_known, self.sigma_known, self.log_sigma_prior)

    # ------------------------------------------------------------------ device side
    def client_stats(self, data) -> dict[str, np.ndarray]:
        """Sufficient statistics of a device's ``(X, y, sigma)``, computed on the device."""
        X, y, sigma = data
        return self.stats_from(X, y, sigma)

    def stats_from(self, X: np.ndarray, y: np.ndarray, sigma: float | None = None) -> dict[str, np.ndarray]:
        """Sufficient statistics ``A = X^T X, b = X^T y, c = y^T y, n`` (and sigma^2 if known)."""
        stats = {"A": X.T @ X, "b": X.T @ y, "c": np.array(float(y @ y)), "n": np.array(float(len(y)))}
        if self.sigma_known:
            if sigma is None or not np.isfinite(sigma) or sigma <= 0:
                raise ValueError(f"a known noise sd must be a positive number, got {sigma!r}")
            stats["sigma2"] = np.array(float(sigma) ** 2)
        return stats

    def init_local(self, stats) -> tuple[np.ndarray, np.ndarray]:
        """Starting values of (theta_k, z_k) for samplers: a ridge fit and its residual sd."""
        A, b, c, n = stats["A"], stats["b"], float(stats["c"]), float(stats["n"])
        theta = np.linalg.solve(A + 1e-6 * (np.trace(A) / self.d + 1.0) * np.eye(self.d), b)
        if self.sigma_known:
            return theta, np.zeros(0)
        if n <= self.d:  # the fit interpolates: no residual to start from, start at the prior's mean
            return theta, np.array([float(self.log_sigma_prior[0])])
        rss = max(c - 2 * b @ theta + theta @ A @ theta, 1e-12 * max(c, 1.0))
        return theta, np.array([0.5 * np.log(rss / (n - self.d))])

    # ------------------------------------------------------------------ parameters
    def split_phi(self, phi):
        """(mu, tau) from phi (jax or numpy)."""
        import jax.numpy as jnp

        mu, rest = phi[: self.d], phi[self.d :]
        if self.tau_kind == "diag":
            tau = jnp.exp(rest)
        elif self.tau_kind == "iso":
            tau = jnp.exp(rest[0]) * jnp.ones(self.d, dtype=phi.dtype)
        else:
            tau = jnp.asarray(self.tau_known, dtype=phi.dtype)
        return mu, tau

    def _noise(self, z, stats):
        import jax.numpy as jnp

        if self.sigma_known:
            return stats["sigma2"], 0.0
        m, s = self.log_sigma_prior
        lp = -0.5 * ((z[0] - m) / s) ** 2 - jnp.log(s) - 0.5 * jnp.log(2 * jnp.pi)
        return jnp.exp(2 * z[0]), lp

    # ------------------------------------------------------------------ densities (jax)
    def log_collapsed(self, phi, z, stats):
        """log p(y_k | phi, sigma_k) + log p(log sigma_k), with theta_k integrated out."""
        import jax.numpy as jnp
        from jax.scipy.linalg import solve_triangular

        mu, tau = self.split_phi(phi)
        s2, lp_z = self._noise(z, stats)
        A, b, c, n = stats["A"], stats["b"], stats["c"], stats["n"]
        dinv = 1.0 / tau
        P = A / s2 + jnp.diag(dinv)
        h = b / s2 + dinv * mu
        L = jnp.linalg.cholesky(P)
        v = solve_triangular(L, h, lower=True)
        logf = (
            -0.5 * n * jnp.log(2 * jnp.pi * s2)
            - 0.5 * c / s2
            - 0.5 * jnp.sum(mu**2 * dinv)
            - 0.5 * jnp.sum(jnp.log(tau))
            - jnp.sum(jnp.log(jnp.diag(L)))
            + 0.5 * v @ v
        )
        return logf + lp_z

    def log_augmented(self, phi, theta, z, stats):
        """log p(y_k | theta_k, sigma_k) + log p(theta_k | phi) + log p(log sigma_k)."""
        import jax.numpy as jnp

        mu, tau = self.split_phi(phi)
        s2, lp_z = self._noise(z, stats)
        A, b, c, n = stats["A"], stats["b"], stats["c"], stats["n"]
        rss = c - 2 * b @ theta + theta @ A @ theta
        ll = -0.5 * n * jnp.log(2 * jnp.pi * s2) - 0.5 * rss / s2
        lp = -0.5 * jnp.sum((theta - mu) ** 2 / tau + jnp.log(2 * jnp.pi * tau))
        return ll + lp + lp_z

    # ------------------------------------------------------------------ numpy closed forms
    def gaussian_given(self, x: np.ndarray, stats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``log_collapsed`` as ``-mu' P mu / 2 + mu' h + c`` at each point ``x = (log tau,
        log sigma_k)`` (the unknown ones), x (D, B, M), stats stacked (B, ...): see
        :class:`~fedstats.inference.tilted.ConditionallyGaussianSite`.

        With ``Dinv = diag(1 / tau)`` and ``Q = A / s2 + Dinv`` (theta_k's conditional
        precision): ``P = Dinv - Dinv Q^-1 Dinv``, ``h = Dinv Q^-1 b / s2`` (the form whose
        subtraction cancels only where the prior outweighs the data).
        """
        from ..inference.tilted import batched as bt

        d, nt = self.d, self.n_log_tau
        B, M = x.shape[1:]
        if self.tau_kind == "diag":
            log_tau = x[:d]
        elif self.tau_kind == "iso":
            log_tau = np.broadcast_to(x[:1], (d, B, M))
        else:
            log_tau = np.broadcast_to(np.log(np.asarray(self.tau_known, dtype=float))[:, None, None], (d, B, M))
        dinv = np.exp(-log_tau)
        if self.sigma_known:
            s2, lp_z = np.asarray(stats["sigma2"], dtype=float)[:, None], 0.0
        else:
            z = x[nt]
            m, s = self.log_sigma_prior
            s2, lp_z = np.exp(2 * z), -0.5 * ((z - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)
        A = np.moveaxis(np.asarray(stats["A"], dtype=float), 0, -1)[..., None]  # (d, d, B, 1)
        bs = np.moveaxis(np.asarray(stats["b"], dtype=float), 0, -1)[..., None] / s2  # (d, B, M or 1)
        c, n = np.asarray(stats["c"], dtype=float)[:, None], np.asarray(stats["n"], dtype=float)[:, None]
        Dinv = np.eye(d)[:, :, None, None] * dinv[None]  # diag(1 / tau), (d, d, B, M)
        L = bt.cholesky(A / s2 + Dinv)
        Qinv = bt.inv_from_cholesky(L)
        P = Dinv - dinv[:, None] * Qinv * dinv[None]
        Qb = bt.matvec(Qinv, bs)
        h = dinv * Qb
        const = (
            -0.5 * n * np.log(2 * np.pi * s2)
            - 0.5 * c / s2
            - 0.5 * np.sum(log_tau, axis=0)
            - 0.5 * bt.logdet_from_cholesky(L)
            + 0.5 * np.sum(bs * Qb, axis=0)
            + lp_z
        )
        return P, h, const

    def theta_conditional(self, phi: np.ndarray, z: np.ndarray, stats) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of theta_k | phi, sigma_k, y_k for a batch of draws.

        ``phi`` (M, p), ``z`` (M, local_dim) -> means (M, d), covariances (M, d, d).
        """
        import jax

        with jax.enable_x64(True):
            mu, tau = jax.vmap(self.split_phi)(jax.numpy.asarray(phi, dtype=float))
            mu, tau = np.asarray(mu), np.asarray(tau)
        s2 = np.full(len(phi), float(stats["sigma2"])) if self.sigma_known else np.exp(2 * z[:, 0])
        P = stats["A"][None] / s2[:, None, None] + np.einsum("mi,ij->mij", 1.0 / tau, np.eye(self.d))
        h = stats["b"][None] / s2[:, None] + mu / tau
        V = np.linalg.solve(P, np.broadcast_to(np.eye(self.d), P.shape))
        m = np.einsum("mij,mj->mi", V, h)
        return m, 0.5 * (V + np.swapaxes(V, 1, 2))

    def noise_variance(self, phi: np.ndarray, z: np.ndarray, stats) -> np.ndarray:
        """sigma_k^2 at each of a batch of draws (its known value, or exp(2 log sigma_k))."""
        if self.sigma_known:
            return np.full(len(phi), float(stats["sigma2"]))
        return np.exp(2 * np.asarray(z)[:, 0])

    def exact_site(self, stats):
        """The Gaussian site in mu when tau and sigma are known (phi = mu)."""
        from ..inference.gaussian import NaturalGaussian, chol_solve, cholesky

        if not (self.tau_kind == "known" and self.sigma_known):
            raise TypeError("the exact site needs phi = mu with tau and sigma known")
        dinv = 1.0 / np.asarray(self.tau_known, dtype=float)
        s2 = float(stats["sigma2"])
        P = stats["A"] / s2 + np.diag(dinv)
        L = cholesky(P)
        # f_k(mu) = N(y; X mu, s2 I + X D X^T): Q = D^-1 - D^-1 P^-1 D^-1, r = D^-1 P^-1 b / s2
        PinvDinv = chol_solve(L, np.diag(dinv))
        Q = np.diag(dinv) - dinv[:, None] * PinvDinv
        r = dinv * chol_solve(L, stats["b"] / s2)
        return NaturalGaussian(r, Q)

    def theta_given_gaussian_mu(self, mean: np.ndarray, cov: np.ndarray, stats) -> tuple[np.ndarray, np.ndarray]:
        """Exact moments of theta_k when mu ~ N(mean, cov), tau and sigma known (linear in mu)."""
        dinv = 1.0 / np.asarray(self.tau_known, dtype=float)
        s2 = float(stats["sigma2"])
        P = stats["A"] / s2 + np.diag(dinv)
        V = np.linalg.inv(P)
        G = V * dinv[None, :]  # d E[theta] / d mu
        m = V @ (stats["b"] / s2) + G @ mean
        C = V + G @ cov @ G.T
        return m, 0.5 * (C + C.T)
