"""The client likelihood of HM2 (Example 4.1 of the linear-models paper) on sufficient statistics.

Client k holds ``(X_k, y_k)``; the model is

    y_k | theta_k, sigma_k ~ N(X_k theta_k, sigma_k^2 I)
    theta_k | phi         ~ N(mu, diag(tau))

Everything a client contributes depends on its data only through ``A = X^T X``,
``b = X^T y``, ``c = y^T y`` and ``n``, so all clients share array shapes and one compiled
kernel serves them all. ``phi`` stacks ``mu`` (if unknown) and ``log tau`` (if unknown);
``z`` holds ``log sigma_k`` when the noise is unknown (a local nuisance that never leaves
the client).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..result_file import register


@register
@dataclass(frozen=True)
class HM2Site:
    """Site model of HM2. See module docstring.

    Parameters
    ----------
    d : int
        Number of coefficients per client.
    tau_kind : {"diag", "iso", "known"}
        One log tau per coefficient, one shared log tau, or tau fixed at ``tau_known``.
    tau_known : tuple of float or None
        Known prior variances (length d) when ``tau_kind == "known"``.
    sigma_known : bool
        Whether each client knows its noise sd (``stats["sigma2"]``) or samples log sigma_k.
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

    # ------------------------------------------------------------------ client side
    def client_stats(self, data) -> dict[str, np.ndarray]:
        """Sufficient statistics of a client's ``(X, y, sigma)``, computed on the client."""
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

    def _split_draws(self, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`split_phi` for a batch of draws (M, p) in numpy: (mu, tau), each (M, d)."""
        mu, rest = phi[:, : self.d], phi[:, self.d :]
        if self.tau_kind == "diag":
            tau = np.exp(rest)
        elif self.tau_kind == "iso":
            tau = np.broadcast_to(np.exp(rest[:, :1]), mu.shape)
        else:
            tau = np.broadcast_to(np.asarray(self.tau_known, dtype=float), mu.shape)
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

    def convolved(
        self, a: np.ndarray, C: np.ndarray, x: np.ndarray, stats, *, order: int = 2
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``log_collapsed`` averaged over ``mu ~ N(a, C)`` (in closed form), with its gradient
        and Hessian in ``(a, x)``: see :class:`~fedstats.inference.tilted.ConvolvedGaussianSite`.

        ``a`` (B, M, d), ``C`` (B, d, d), ``x = (log tau, log sigma_k)`` (the unknown ones)
        (B, M, D), stats stacked (B, ...). With ``mu ~ N(a, C)`` and ``theta_k ~ N(mu, T)``,
        ``theta_k ~ N(a, S)``, ``S = C + T``, so the value is ``log N(y; X a, Sigma) + log
        p(log sigma_k)`` with ``Sigma = s2 I + X S X'``, which the statistics give through
        ``K = s2 S^-1 + A`` (``W = K^-1``): ``u = X' Sigma^-1 r = (e - A W e) / s2`` and
        ``R = X' Sigma^-1 X = (A - A W A) / s2`` with ``e = b - A a``, and

        * ``d/da = u``, ``d/dtau_j = (u_j^2 - R_jj) / 2``,
          ``d/dlog sigma = s2 (|Sigma^-1 r|^2 - tr Sigma^-1)``;
        * ``d2/da da' = -R``, ``d2/da dtau_j = -R[:, j] u_j``,
          ``d2/dtau_i dtau_j = R_ij^2 / 2 - u_i R_ij u_j``; along log sigma ``du = -2 (I - A W)
          u`` and ``dR = -2 (I - A W) R`` per unit, and the second derivative from
          ``r' Sigma^-3 r`` and ``tr Sigma^-2``.

        ``order`` 0 gives the value only (``None`` for the rest), 1 the gradient too.
        Returns value (B, M), gradient (B, M, d + D), Hessian (B, M, d + D, d + D).
        """
        d, nt = self.d, self.n_log_tau
        B, M = a.shape[:2]
        D = x.shape[-1]
        A = np.asarray(stats["A"], dtype=float)[:, None]  # (B, 1, d, d)
        b = np.asarray(stats["b"], dtype=float)[:, None]  # (B, 1, d)
        c = np.asarray(stats["c"], dtype=float)[:, None]
        n = np.asarray(stats["n"], dtype=float)[:, None]
        if self.tau_kind == "diag":
            J = np.eye(d)
        elif self.tau_kind == "iso":
            J = np.ones((d, 1))
        else:
            J = np.zeros((d, 0))
        log_tau = (
            x[..., :nt] @ J.T if nt else np.broadcast_to(np.log(np.asarray(self.tau_known, dtype=float)), (B, M, d))
        )
        tau = np.exp(log_tau)
        if self.sigma_known:
            s2 = np.broadcast_to(np.asarray(stats["sigma2"], dtype=float)[:, None], (B, M))
            lp, dlp, d2lp = 0.0, None, None
        else:
            z = x[..., nt]
            m0, s0 = self.log_sigma_prior
            s2 = np.exp(2 * z)
            lp = -0.5 * ((z - m0) / s0) ** 2 - np.log(s0) - 0.5 * np.log(2 * np.pi)
            dlp, d2lp = -(z - m0) / s0**2, -1.0 / s0**2
        eye = np.eye(d)
        S = np.asarray(C, dtype=float)[:, None] + tau[..., None] * eye  # (B, M, d, d)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # far points: NaN, masked by callers
            Ls = _cholesky(S)
            Sinv = _chol_inverse(Ls)
            K = s2[..., None, None] * Sinv + A
            Lk = _cholesky(K)
            W = _chol_inverse(Lk)
            e = b - (A @ a[..., None])[..., 0]
            We = (W @ e[..., None])[..., 0]
            AWe = (A @ We[..., None])[..., 0]
            rr = c - 2 * np.sum(a * b, -1) + np.einsum("bmi,bmi->bm", a, (A @ a[..., None])[..., 0])
            eWe = np.sum(e * We, -1)
            logdet = (n - d) * np.log(s2) + _logdet(Ls) + _logdet(Lk)
            value = -0.5 * n * np.log(2 * np.pi) - 0.5 * logdet - 0.5 * (rr - eWe) / s2 + lp
            if order == 0:
                return value, None, None
            u = (e - AWe) / s2[..., None]
            AW = A @ W
            R = (A - AW @ A) / s2[..., None, None]
            R = 0.5 * (R + np.swapaxes(R, -1, -2))
            g_tau = 0.5 * (u**2 - np.diagonal(R, axis1=-2, axis2=-1))
            grad = np.zeros((B, M, d + D))
            grad[..., :d] = u
            grad[..., d : d + nt] = (tau * g_tau) @ J  # chain rule to log tau
            if not self.sigma_known:
                qq = (rr - 2 * eWe + np.sum(We * AWe, -1)) / s2**2  # |Sigma^-1 r|^2
                tr1 = (n - np.trace(AW, axis1=-2, axis2=-1)) / s2  # tr Sigma^-1
                grad[..., d + nt] = s2 * (qq - tr1) + dlp
            if order == 1:
                return value, grad, None
            H = np.zeros((B, M, d + D, d + D))
            H[..., :d, :d] = -R
            # tau-blocks, then mapped to log tau: J' diag(tau) H diag(tau) J + J' diag(tau g) J
            ut = u * tau
            Hal = -R * ut[..., None, :]  # d2 / da dlog tau_j
            Hll = R * (0.5 * R * tau[..., :, None] - ut[..., :, None] * u[..., None, :]) * tau[..., None, :]
            if self.tau_kind == "diag":  # J = I
                Hll[..., np.arange(d), np.arange(d)] += tau * g_tau
            else:
                Hal, Hll = Hal @ J, J.T @ Hll @ J + J.T @ ((tau * g_tau)[..., :, None] * J)
            H[..., :d, d : d + nt] = Hal
            H[..., d : d + nt, :d] = np.swapaxes(Hal, -1, -2)
            H[..., d : d + nt, d : d + nt] = Hll
            if not self.sigma_known:
                IAW = eye - AW
                du = -2 * (IAW @ u[..., None])[..., 0]  # d u / d log sigma
                dR = -2 * IAW @ R  # d R / d log sigma
                H[..., :d, d + nt] = H[..., d + nt, :d] = du
                Hlz = (tau * (u * du - 0.5 * np.diagonal(dR, axis1=-2, axis2=-1))) @ J
                H[..., d : d + nt, d + nt] = H[..., d + nt, d : d + nt] = Hlz
                uWu = np.sum(u * (W @ u[..., None])[..., 0], -1)
                q3 = (qq - uWu) / s2  # r' Sigma^-3 r
                tr2 = (
                    n - 2 * np.trace(AW, axis1=-2, axis2=-1) + np.sum(AW * np.swapaxes(AW, -1, -2), (-2, -1))
                ) / s2**2
                H[..., d + nt, d + nt] = 2 * s2 * (qq - tr1) + 2 * s2**2 * (tr2 - 2 * q3) + d2lp
        return value, grad, H

    def theta_conditional(self, phi: np.ndarray, z: np.ndarray, stats) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of theta_k | phi, sigma_k, y_k for a batch of draws.

        ``phi`` (M, p), ``z`` (M, local_dim) -> means (M, d), covariances (M, d, d).
        """
        mu, tau = self._split_draws(np.asarray(phi, dtype=float))
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


def _cholesky(S: np.ndarray) -> np.ndarray:
    """Lower Cholesky factors of a batch (..., d, d); NaN for a matrix that is not positive
    definite (the others are unaffected)."""
    try:
        return np.linalg.cholesky(S)
    except np.linalg.LinAlgError:
        flat = S.reshape(-1, *S.shape[-2:])
        out = np.full_like(flat, np.nan)
        for i, m in enumerate(flat):
            try:
                out[i] = np.linalg.cholesky(m)
            except np.linalg.LinAlgError:
                pass
        return out.reshape(S.shape)


def _chol_inverse(L: np.ndarray) -> np.ndarray:
    """``(L L')^-1`` for a batch of lower factors (..., d, d)."""
    Linv = np.linalg.inv(L) if np.all(np.isfinite(L)) else _nan_safe_inv(L)
    return np.swapaxes(Linv, -1, -2) @ Linv


def _nan_safe_inv(L: np.ndarray) -> np.ndarray:
    good = np.all(np.isfinite(L), axis=(-2, -1))
    out = np.full_like(L, np.nan)
    out[good] = np.linalg.inv(L[good])
    return out


def _logdet(L: np.ndarray) -> np.ndarray:
    return 2 * np.sum(np.log(np.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
