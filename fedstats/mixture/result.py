"""The results of the federated Gaussian mixtures: :class:`MixtureResult` (what every mixture's result
offers: predictions per client, unseen clients, tables, save and load) and its maximum-likelihood
kind, :class:`GaussianMixtureResult`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy.special import logsumexp

from .._deprecation import renamed_attributes
from ..data import DataLike
from ..federation import Communication, RoundRecord
from ..federation.backend import accepts_backend
from ..result_file import register
from ..results import FederatedResult, check_level
from ._common import as_federated, log_weights, norm
from .gmm import e_step, full_covariances, log_gaussian, n_parameters, precision_cholesky

# helpers shared by the three mixtures (their names here are kept for the modules that import them)
_log_weights, _norm = log_weights, norm


#: the former (scikit-learn) names of the attributes, read for one release
_FORMER = {
    "means_": "means",
    "covariances_": "covariances",
    "weights_": "weights",
    "precisions_cholesky_": "precisions_cholesky",
}


@renamed_attributes(**_FORMER)
class MixtureResult(FederatedResult):
    """What every fitted federated Gaussian mixture has (the base of the maximum-likelihood
    :class:`GaussianMixtureResult` and its variational sibling
    :class:`~fedstats.mixture.BayesianMixtureResult`).

    Attributes (the models' names; scikit-learn's were ``means_`` and so on, still read for
    one release): ``means`` (M, d), ``covariances`` (layout of
    ``covariance_type``), ``weights`` (dict client -> (M,); the weights never move during
    the fit: each client returns its final ones once, at the end, for this object),
    ``history``, ``communication``, ``rounds``, ``converged`` (``None`` for FEM-OMD's online
    mixture, which has no stopping rule).

    A differentially private fit (``dp=``) also has ``privacy`` (the spent ``(epsilon, delta)``,
    :class:`~fedstats.privacy.PrivacySpent`), ``dp_noise_sd`` (the sd of the DP noise in the means,
    variances and shared weights, propagated through the final M-step) and ``dp_noise_included``
    (whether ``summary`` gives intervals of that noise); its tables carry ``attrs["privacy"]``.
    """

    #: differentially private fits only (None / False otherwise)
    dp_noise_sd: dict[str, Any] | None = None
    dp_noise_included: bool = False

    def __init__(
        self,
        *,
        means: ArrayLike,
        covariances: ArrayLike,
        weights: Mapping[Hashable, np.ndarray],
        covariance_type: str,
        feature_names: Sequence[str],
        n_obs: Mapping[Hashable, int],
        history: Sequence[RoundRecord],
        communication: Communication | None,
        rounds: int,
        converged: bool | None,
        shared_weights: bool,
        init_info: Mapping[str, Any],
        reg_covar: float,
        loglik: Mapping[Hashable, float] | None = None,
        seconds: float = 0.0,
    ) -> None:
        self.means = np.asarray(means)
        self.covariances = np.asarray(covariances)
        self.weights = dict(weights)
        self.covariance_type = covariance_type
        self.feature_names = list(feature_names)
        self.n_obs = dict(n_obs)
        self.history = history
        self.communication = communication
        self.rounds = rounds
        self.converged = converged
        self.shared_weights = shared_weights
        self.init_info = init_info
        self.reg_covar = reg_covar
        self.client_loglik = loglik  # dict client -> log-likelihood at the final parameters
        self.seconds = float(seconds)  # wall time of the fit (set by the fit itself)

    @property
    def n_components(self) -> int:
        return self.means.shape[0]

    @property
    def clients(self) -> list:
        return list(self.weights)

    @property
    def precisions_cholesky(self) -> np.ndarray:
        return precision_cholesky(self.covariances, self.covariance_type)

    def _weights_for(self, client: Hashable | None, weights: ArrayLike | None) -> np.ndarray:
        if weights is not None:
            w = np.asarray(weights, float)
            if w.shape != (self.n_components,) or np.any(w < 0) or not np.isclose(w.sum(), 1):
                raise ValueError(f"weights must be {self.n_components} non-negative numbers summing to 1")
            return w
        if client is None:
            raise ValueError("give client=<a fitted client> or weights=... (for a new client: new_client_weights(X))")
        if client in (self.excluded or {}):
            self._check_client(client)  # not in the fit: refused with the reason
        if client not in self.weights:
            raise KeyError(f"unknown client {client!r}; fitted clients: {self.clients[:10]}")
        return self.weights[client]

    def _X(self, X: ArrayLike) -> np.ndarray:
        X = np.asarray(self._feature_rows(X, self.feature_names), dtype=float)
        if X.ndim == 1:
            X = X[None, :] if self.means.shape[1] > 1 else X[:, None]
        if X.ndim != 2 or X.shape[1] != self.means.shape[1]:
            raise ValueError(f"X must have {self.means.shape[1]} columns, got shape {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X has NaN or inf")
        return X

    def _log_dens(self, X: ArrayLike, client: Hashable | None = None) -> np.ndarray:
        return log_gaussian(self._X(X), self.means, self.precisions_cholesky, self.covariance_type)

    def predict_proba(
        self, X: ArrayLike, client: Hashable | None = None, *, weights: ArrayLike | None = None
    ) -> np.ndarray:
        """Responsibilities ``P(z = j | x)`` under the client's weights: (n, M)."""
        return e_step(self._log_dens(X, client), _log_weights(self._weights_for(client, weights)))[0]

    def predict(self, X: ArrayLike, client: Hashable | None = None, *, weights: ArrayLike | None = None) -> np.ndarray:
        """Most probable component of each row for that client."""
        return np.argmax(self.predict_proba(X, client, weights=weights), axis=1)

    def score_samples(
        self, X: ArrayLike, client: Hashable | None = None, *, weights: ArrayLike | None = None
    ) -> np.ndarray:
        """Log-density of each row under the client's mixture."""
        return logsumexp(self._log_dens(X, client) + _log_weights(self._weights_for(client, weights)), axis=1)

    def score(self, X: ArrayLike, client: Hashable | None = None, *, weights: ArrayLike | None = None) -> float:
        """Mean log-likelihood per row (scikit-learn's ``score``)."""
        return float(np.mean(self.score_samples(X, client, weights=weights)))

    def new_client_weights(
        self, X: ArrayLike, *, n_iter: int | None = None, tol: float = 1e-10, max_iter: int = 1000
    ) -> np.ndarray:
        """Weights of an unseen client, fitted on its rows with the components frozen.

        ``pi <- mean_i r_i(pi)`` from uniform: monotone, and it converges to the global
        maximum (the log-likelihood is concave in ``pi``). ``n_iter=1`` is the thesis's
        single E-step and weight update.
        """
        ld = self._log_dens(X)
        M = self.n_components
        w = np.full(M, 1.0 / M)
        steps = max_iter if n_iter is None else int(n_iter)
        prev = -np.inf
        for _ in range(steps):
            r, ll, _ = e_step(ld, _log_weights(w))
            w = r.mean(0)
            cur = ll.sum()
            if n_iter is None and cur - prev <= tol * abs(cur):
                break
            prev = cur
        return w

    def component_table(self) -> pd.DataFrame:
        """Means and variances per component and feature."""
        M, d = self.means.shape
        covs = full_covariances(self.covariances, self.covariance_type, M, d)
        rows = []
        for j in range(M):
            for l, f in enumerate(self.feature_names):
                rows.append({"component": j, "feature": f, "mean": self.means[j, l], "variance": covs[j, l, l]})
        return pd.DataFrame(rows)

    def weights_table(self) -> pd.DataFrame:
        """Every client's weights, one row per client."""
        return pd.DataFrame(
            {c: w for c, w in self.weights.items()}, index=[f"weight[{j}]" for j in range(self.n_components)]
        ).T

    # ---------------------------------------------------------------- the result contract
    # (fedstats.results) for a maximum-likelihood fit: estimates in ``mean``, NaN elsewhere;
    # ``predict`` keeps scikit-learn's meaning (labels), ``predict_proba`` the responsibilities
    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        """Shared parameters, one row each: ``mean[j][feature]``, ``var[j][feature]`` (the
        diagonal of component j's covariance) and, with shared weights, ``weight[j]``; the
        estimate in the column ``mean``. After the Wald rounds (``fit(..., uncertainty=True)``
        or :meth:`wald_intervals`) the means and shared weights have ``sd`` and intervals at
        ``level``; the variances are point estimates (NaN)."""
        t = self.component_table()
        names = [f"mean[{r.component}][{r.feature}]" for r in t.itertuples()]
        names += [f"var[{r.component}][{r.feature}]" for r in t.itertuples()]
        values = [*t["mean"], *t["variance"]]
        if self.shared_weights and self.weights:
            names += [f"weight[{j}]" for j in range(self.n_components)]
            values += list(next(iter(self.weights.values())))
        t = pd.DataFrame({"mean": values}, index=pd.Index(names, name="parameter"))
        if self.privacy is not None and getattr(self, "dp_noise_included", False):
            return _with_dp_noise(t, self, level)
        wald = getattr(self, "wald_info", None)
        if wald is not None:
            from .wald import means_table, weights_table

            t = t.combine_first(means_table(self, wald["cov_means"], level)).loc[names]
            if self.shared_weights:
                c = self.clients[0]
                t.update(weights_table(self, c, wald["cov_eta"][c], level))
        return t

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        """The client's weights ``weight[j]`` (estimates in ``mean``; with the Wald rounds done
        also ``sd`` and logit-scale intervals at ``level``)."""
        if self.privacy is not None and getattr(self, "dp_noise_included", False):
            raise ValueError(
                "client_summary cannot include the DP noise of the per-client weights (each client's own "
                "noisy counts are not known to the result): fit with include_dp_noise=False for the weights"
            )
        wald = getattr(self, "wald_info", None)
        if wald is not None:
            from .wald import weights_table

            return weights_table(self, client, wald["cov_eta"][client], level)
        return pd.DataFrame(
            {"mean": self.weights[client]},
            index=pd.Index([f"weight[{j}]" for j in range(self.n_components)], name="parameter"),
        )

    def _privacy_note(self, frame: pd.DataFrame) -> pd.DataFrame:
        if self.privacy is not None:
            included = bool(getattr(self, "dp_noise_included", False))
            extra = (
                " (the DP noise of the final M-step only, propagated by simulation: no sampling error; a private "
                "fit makes no Wald rounds)"
                if included
                else " (a private fit has no sampling intervals: the tables give point estimates)"
            )
            frame.attrs["privacy"] = self.privacy.note(included=included) + extra
        return frame

    def summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        return self._privacy_note(super().summary(level, kind))

    def client_summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        return self._privacy_note(super().client_summary(level, kind))

    summary.__doc__ = FederatedResult.summary.__doc__
    client_summary.__doc__ = FederatedResult.client_summary.__doc__

    def _no_posterior(self, what: str) -> str:
        return (
            f"{type(self).__name__} is a maximum-likelihood fit, with no {what} posterior: fit "
            "VariationalGaussianMixture for one, or fit(..., uncertainty=True) for "
            "observed-information (Wald) intervals in summary()"
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(M={self.n_components}, covariance_type={self.covariance_type!r}, "
            f"clients={len(self.weights)}, rounds={self.rounds}, converged={self.converged})"
        )


@register
@renamed_attributes(loglik_="loglik", client_loglik_="client_loglik", wald_info_="wald_info")
class GaussianMixtureResult(MixtureResult):
    """A federated Gaussian mixture fitted by maximum likelihood (FedEM, D-FedEM, FEM-OMD's
    played mixture): :class:`MixtureResult` plus ``loglik`` (log-likelihood at the final
    parameters, from one scoring round after the last EM round; ``client_loglik`` per
    client), ``loglik_trace``, ``bic`` and observed-information ``wald_intervals``.
    """

    estimates = "estimate"  # maximum likelihood (with Wald errors when computed)

    @property
    def loglik(self) -> float:
        """Federated log-likelihood at the final parameters, each client with its weights."""
        if self.client_loglik is None:
            raise AttributeError(f"{type(self).__name__} has no final log-likelihood")
        return float(sum(self.client_loglik.values()))

    def loglik_trace(self) -> np.ndarray:
        """Federated log-likelihood at the parameters broadcast in each round (rounds where all answered)."""
        K = len(self.weights)
        return np.array([r.metrics["loglik"] for r in self.history if len(r.answered) == K])

    # ---------------------------------------------------------------- prediction
    @accepts_backend
    def wald_intervals(
        self, data: DataLike, level: float = 0.95, *, seed: int = 0
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Observed-information intervals for the means and every client's weights.

        The Wald rounds over ``data`` (the fitted clients, each holding its rows): each
        client sends a Schur complement of its information (its own weights eliminated from
        the arrowhead observed information); covariances are
        held at their estimate. The covariances are kept (``wald_info``), so ``summary``
        and ``client_summary`` carry the intervals from then on, at any level; the rounds
        join ``communication``. Returns ``(means_table, weights_table)`` at ``level``
        (the weights one row per client and component). Raises
        ``numpy.linalg.LinAlgError`` when the information is singular. See
        :mod:`fedstats.mixture.wald`.
        """
        from ..federation import counting
        from .wald import means_table, wald_covariances

        if self.privacy is not None:
            raise ValueError(
                "wald_intervals: the Wald rounds release the clients' information matrices without noise; "
                "a differentially private fit (dp=) does not make them"
            )
        level = check_level(level)
        with counting() as ledger:
            self.wald_info = wald_covariances(self, as_federated(data), seed=seed)
        # (combine skips a part that is None: a fit that did not communicate)
        parts = [c for c in (self.communication, ledger.communication()) if c is not None]
        self.communication = Communication.combine(parts)
        return (
            means_table(self, self.wald_info["cov_means"], level),
            self.client_summary(level).drop(columns="p_value"),
        )

    def bic(self) -> float:
        """Federated BIC ``-2 sum_c L_c + p log N`` at the final parameters (``loglik``)."""
        ll = self.loglik
        p = n_parameters(
            self.n_components, self.means.shape[1], self.covariance_type, len(self.n_obs), self.shared_weights
        )
        return float(-2 * ll + p * np.log(sum(self.n_obs.values())))


def _with_dp_noise(t: pd.DataFrame, result: MixtureResult, level: float) -> pd.DataFrame:
    """The global table with ``sd`` the DP noise of each estimate (``result.dp_noise_sd``) and
    normal intervals at ``level`` (the noise of the final M-step only)."""
    from scipy import stats

    noise = result.dp_noise_sd
    assert noise is not None
    sd = [*np.ravel(noise["means"]), *np.ravel(noise["var"])]
    if result.shared_weights and noise.get("weights") is not None:
        sd += list(noise["weights"])
    q = stats.norm.ppf(0.5 + level / 2)
    t = t.copy()
    t["sd"] = np.asarray(sd[: len(t)], dtype=float)
    t["lower"] = t["mean"] - q * t["sd"]
    t["upper"] = t["mean"] + q * t["sd"]
    return t
