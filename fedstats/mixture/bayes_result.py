"""The result of variational FedEM (:class:`BayesianMixtureResult`): Dirichlet posteriors of each
client's weights, Normal-Wishart posteriors of the components, credible intervals."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .._deprecation import renamed_attributes
from ..inference import SamplePosterior
from ..result_file import register
from .gmm import full_covariances
from .result import MixtureResult

_EPS10 = 10 * np.finfo(float).eps  # scikit-learn adds this to every soft count


#: the former (scikit-learn) names of the attributes, read for one release
_FORMER = {
    "weight_concentration_": "weight_concentration",
    "mean_precision_": "mean_precision",
    "degrees_of_freedom_": "degrees_of_freedom",
}


@register
@renamed_attributes(**_FORMER)
class BayesianMixtureResult(MixtureResult):
    """Variational FedEM fit: :class:`~fedstats.mixture.MixtureResult` plus the posterior ``q``
    (the sibling of the maximum-likelihood ``GaussianMixtureResult``: no log-likelihood, BIC or
    Wald intervals; compare fits by :meth:`elbo_trace`).

    ``weight_concentration`` (dict client -> alpha_c), ``mean_precision`` (beta),
    ``degrees_of_freedom`` (nu), ``covariances`` (``W^{-1}/nu``, scikit-learn's meaning),
    ``means`` (m); point predictions use the posterior-mean weights and ``covariances``.
    """

    # set by the fit
    weight_concentration: dict[Hashable, np.ndarray]
    mean_precision: np.ndarray
    degrees_of_freedom: np.ndarray | float  # one for all components with covariance_type="tied"
    prior: dict[str, Any]  # alpha0, beta0, m0, nu0, cov0

    def _scale_inv(self) -> np.ndarray:
        """``W_j^{-1}`` as (M, d, d)."""
        M, d = self.means.shape
        nu = np.broadcast_to(np.atleast_1d(self.degrees_of_freedom), (M,))
        return full_covariances(self.covariances, self.covariance_type, M, d) * nu[:, None, None]

    def _nu(self) -> np.ndarray:
        return np.broadcast_to(np.atleast_1d(self.degrees_of_freedom), (self.n_components,)).astype(float)

    def _beta(self) -> np.ndarray:
        return np.asarray(self.mean_precision, float)

    def _marginal_params(self):
        """Per (component, feature): Student-t dof and scale of the mean, inverse-gamma shape
        and scale of the variance.

        full / tied: the marginals of a Normal-inverse-Wishart with ``nu`` degrees of freedom
        (dof ``nu - d + 1``); diag: independent Normal-inverse-gamma per coordinate (dof
        ``nu``); spherical: one variance seen in all ``d`` coordinates (dof ``nu d``). In every
        case the variance's posterior mean-ish scale is ``covariances``."""
        M, d = self.means.shape
        nu = self._nu()
        var = np.diagonal(full_covariances(self.covariances, self.covariance_type, M, d), axis1=1, axis2=2)
        dof = {"full": nu - d + 1, "tied": nu - d + 1, "diag": nu, "spherical": nu * d}[self.covariance_type]
        dof = np.broadcast_to(dof[:, None], (M, d))
        ig_scale = nu[:, None] * var / 2 * (d if self.covariance_type == "spherical" else 1)
        t_scale = np.sqrt(2 * ig_scale / (self._beta()[:, None] * dof))
        return dof, t_scale, dof / 2, ig_scale

    def mean_intervals(self, level: float = 0.95) -> pd.DataFrame:
        """Student-t marginals of every mean coordinate: mean, sd, lower, upper."""
        M, d = self.means.shape
        dof, scale, _, _ = self._marginal_params()
        q = stats.t.ppf(0.5 + level / 2, dof)
        sd = np.where(dof > 2, scale * np.sqrt(dof / np.maximum(dof - 2, 1e-300)), np.inf)
        rows = {
            "mean": self.means.ravel(),
            "sd": sd.ravel(),
            "lower": (self.means - q * scale).ravel(),
            "upper": (self.means + q * scale).ravel(),
        }
        names = [f"mean[{j}][{f}]" for j in range(M) for f in self.feature_names]
        return pd.DataFrame(rows, index=pd.Index(names, name="parameter"))

    def variance_intervals(self, level: float = 0.95) -> pd.DataFrame:
        """Inverse-gamma marginals of every variance ``[Sigma_j]_ll``."""
        M, d = self.means.shape
        _, _, a, b = self._marginal_params()
        dist = stats.invgamma(a, scale=b)
        mean = np.where(a > 1, b / np.maximum(a - 1, 1e-300), np.inf)
        rows = {
            "mean": mean.ravel(),
            "sd": dist.std().ravel(),
            "lower": dist.ppf(0.5 - level / 2).ravel(),
            "upper": dist.ppf(0.5 + level / 2).ravel(),
        }
        names = [f"var[{j}][{f}]" for j in range(M) for f in self.feature_names]
        return pd.DataFrame(rows, index=pd.Index(names, name="parameter"))

    def weight_intervals(self, client: Hashable, level: float = 0.95) -> pd.DataFrame:
        """Beta marginals of the client's weights (computed on the client)."""
        a = self.weight_concentration[client]
        if len(a) == 1:  # the weight is 1 by definition
            sd, lo, hi = np.zeros(1), np.ones(1), np.ones(1)
        else:
            dist = stats.beta(a, a.sum() - a)
            sd, lo, hi = dist.std(), dist.ppf(0.5 - level / 2), dist.ppf(0.5 + level / 2)
        return pd.DataFrame(
            {"mean": a / a.sum(), "sd": sd, "lower": lo, "upper": hi},
            index=pd.Index([f"weight[{j}]" for j in range(len(a))], name="parameter"),
        )

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        """Shared parameters with closed-form credible intervals (Student-t means, inverse-gamma
        variances); highest-density intervals (``kind="hdi"``) from exact draws. No
        ``p_value``: no one tests a component mean or variance against 0."""
        table = pd.concat([self.mean_intervals(level), self.variance_intervals(level)])
        if kind == "hdi":
            hdi = self.global_posterior(n=40000, seed=0).summary(level=level, kind="hdi")
            table[["lower", "upper"]] = hdi.loc[table.index, ["lower", "upper"]].to_numpy()
        return table

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        """The client's weights with Beta credible intervals (from draws for ``kind="hdi"``)."""
        table = self.weight_intervals(client, level)
        if kind == "hdi" and len(table) > 1:
            hdi = self.client_posterior(client, n=40000, seed=0).summary(level=level, kind="hdi")
            table[["lower", "upper"]] = hdi.loc[table.index, ["lower", "upper"]].to_numpy()
        return table

    def sample_components(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Exact draws from q(mu, Sigma): ``(means (n, M, d), covariances (n, M, d, d))``.

        full: an inverse-Wishart per component; tied: one inverse-Wishart draw shared by all
        components; diag / spherical: inverse-gamma variances (per coordinate / one per
        component), with the same marginals as :meth:`variance_intervals`. Given Sigma,
        ``mu_j ~ N(m_j, Sigma_j / beta_j)``.
        """
        rng = np.random.default_rng(seed)
        M, d = self.means.shape
        ct, beta = self.covariance_type, self._beta()
        if ct in ("full", "tied"):
            Winv, nu = self._scale_inv(), self._nu()
            covs = np.empty((n, M, d, d))
            for j in range(M if ct == "full" else 1):
                # Sigma ~ InvWishart(W^{-1}, nu)  <=>  Lambda ~ Wishart(W, nu)
                covs[:, j] = stats.invwishart(df=nu[j], scale=Winv[j]).rvs(size=n, random_state=rng).reshape(n, d, d)
            if ct == "tied":
                covs[:] = covs[:, :1]
        else:
            _, _, a, b = self._marginal_params()
            if ct == "diag":
                var = stats.invgamma(a, scale=b).rvs(size=(n, M, d), random_state=rng)
            else:
                var = np.repeat(
                    stats.invgamma(a[:, 0], scale=b[:, 0]).rvs(size=(n, M), random_state=rng)[..., None], d, axis=2
                )
            covs = var[..., None] * np.eye(d)
        L = np.linalg.cholesky(covs / beta[None, :, None, None])
        mus = self.means + np.einsum("nmij,nmj->nmi", L, rng.standard_normal((n, M, d)))
        return mus, covs

    def global_posterior(self, *, n: int = 4000, seed: int = 0) -> SamplePosterior:
        """q(means, variances) as exact draws (the common posterior API: intervals, hdi, prob, ArviZ)."""
        mus, covs = self.sample_components(n, seed)
        var = np.diagonal(covs, axis1=2, axis2=3)
        M, d = self.means.shape
        names = [f"mean[{j}][{f}]" for j in range(M) for f in self.feature_names] + [
            f"var[{j}][{f}]" for j in range(M) for f in self.feature_names
        ]
        return SamplePosterior(np.c_[mus.reshape(n, -1), var.reshape(n, -1)], names=names)

    def client_posterior(self, client: Hashable, *, n: int = 4000, seed: int = 0) -> SamplePosterior:
        """q(pi_c) = Dirichlet(alpha_c) as exact draws."""
        self._check_client(client)
        a = self.weight_concentration[client]
        draws = np.random.default_rng(seed).dirichlet(a, n)
        return SamplePosterior(draws, names=[f"weight[{j}]" for j in range(len(a))])

    def elbo_trace(self) -> np.ndarray:
        """The evidence lower bound after every round (scikit-learn's, constants dropped)."""
        return np.array([r.metrics["elbo"] for r in self.history])
