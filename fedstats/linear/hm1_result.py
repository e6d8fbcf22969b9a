"""The result of an HM1 fit (:class:`StructuralResult`): Algorithm 1's point estimates, the learned
Omega, and, when the clients shared their information, the posteriors given Omega."""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats as sst

from .._deprecation import renamed_attributes
from ..federation import Communication, run
from ..federation.records import excluded_now, record
from ..federation.scaling import LinearScaling
from ..inference.posterior import GaussianPosterior
from ..result_file import register
from ..results import NoPosteriorError, check_level, prediction_frame
from .hm1_algorithm import CannotShareError, InformationShare
from .hm1_posterior import conditional_posterior, em_omega, exchangeable_target, integrate_noise, noise_vars
from .local import PointResult

# --------------------------------------------------------------------------- result


@register
@renamed_attributes(omega_="omega_array", posterior_omega_="posterior_omega_array")
@dataclass(repr=False)
class StructuralResult(PointResult):
    """An HM1 fit: per-client coefficients (``coef``, ``coefficients``), the learned
    client covariance (``omega``, ``correlation``), predictions, and, after
    ``fit(..., uncertainty=True)``, Gaussian posteriors of each client's coefficients given
    an estimate of Omega (``client_posterior``, ``posterior_omega``) with credible and
    predictive intervals.

    Two points per coefficient, never mixed up:

    * Algorithm 1's estimate: ``theta``, ``coef(client)``, ``coefficients``, ``predict(X,
      client)`` without ``level``, and the column ``estimate`` of ``summary`` and of
      ``predict(..., level=...)``;
    * the posterior mean ``posterior_mean`` (with ``uncertainty=True``): the column ``mean`` of
      ``summary`` and of ``predict(..., level=...)``, the centre of their intervals.

    They differ because Algorithm 1 assumes noise variance ``1 / local_steps`` (with
    ``shrink_scale=1``), runs a finite number of gradient steps and uses its own Omega, while
    the posterior uses each client's noise variance and the EM estimate of Omega.

    ``converged``: whether the last round's relative changes of Theta and Omega were both
    below the model's ``tol`` (see :class:`StructuralCovarianceModel`); the changes of every
    round are in ``history`` (metrics ``theta_rel_change``, ``omega_rel_change``).

    Scales: coefficients, posteriors, ``noise_var`` (with estimated noise variances integrated
    out, their posterior means) and predictions are on the data's scale; ``scaling`` is the
    standardisation the fit ran on (``None``: the data's own units), on whose scale ``omega``,
    ``posterior_omega`` and ``lr`` are. A client not in the fit (``excluded``) has NaN throughout.
    """

    def _estimates(self) -> str:
        return "posterior" if self.has_uncertainty else "estimate"

    omega_array: np.ndarray | None = None
    lr: float = 0.0
    posterior_mean: np.ndarray | None = None
    posterior_cov: np.ndarray | None = None
    noise_var: np.ndarray | None = None
    posterior_omega_array: np.ndarray | None = None
    posterior_info: dict = field(default_factory=dict)
    scaling: LinearScaling | None = None  # the standardisation the iteration ran on (None: the data's own scale)

    @property
    def omega(self) -> pd.DataFrame:
        """Algorithm 1's learned K x K covariance between clients, labelled by client."""
        return pd.DataFrame(self.omega_array, index=self.clients, columns=self.clients)

    @property
    def correlation(self) -> pd.DataFrame:
        """Omega scaled to a correlation matrix."""
        assert self.omega_array is not None  # both fits set it
        s = np.sqrt(np.clip(np.diag(self.omega_array), 1e-300, None))
        return pd.DataFrame(self.omega_array / np.outer(s, s), index=self.clients, columns=self.clients)

    @property
    def posterior_omega(self) -> pd.DataFrame:
        """The Omega the posteriors condition on (needs ``uncertainty=True``): the EM
        estimate (default) or Algorithm 1's ``omega`` (``posterior_omega="learned"``)."""
        self._need_posterior()
        return pd.DataFrame(self.posterior_omega_array, index=self.clients, columns=self.clients)

    # ------------------------------------------------------------ uncertainty
    @property
    def has_uncertainty(self) -> bool:
        return self.posterior_mean is not None

    def _no_posterior(self, what: str) -> str:
        if what == "global":
            return (
                "HM1 has no global parameters with a posterior (summary() lists the estimated Omega); client "
                "posteriors need fit(..., uncertainty=True)"
            )
        return "no client posterior: fit with uncertainty=True (each client then shares its information matrix once)"

    def _need_posterior(self) -> None:
        if not self.has_uncertainty:
            raise NoPosteriorError(self._no_posterior("client"))

    def client_posterior(self, client: Hashable) -> GaussianPosterior:
        """Gaussian posterior of client ``client``'s coefficients given ``posterior_omega`` and
        the clients' noise variances (needs ``fit(..., uncertainty=True)``). Its mean
        (``posterior_mean``) is the centre of every interval this result reports; Algorithm
        1's estimate (``coef``) is a different point (see the class docs)."""
        k = self._k(client)
        self._need_posterior()
        # add_posteriors sets the mean and the covariance together
        assert self.posterior_mean is not None and self.posterior_cov is not None
        return GaussianPosterior(self.posterior_mean[k], self.posterior_cov[k], names=self.feature_names)

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        """The clients' covariance, one row per distinct entry ``omega[a, b]`` (a <= b): the
        Omega the posteriors condition on (``posterior_omega``) with uncertainty, else
        Algorithm 1's (``omega``). Estimates only: no distribution."""
        om = self.posterior_omega_array if self.has_uncertainty else self.omega_array
        assert om is not None  # both fits set omega_array, add_posteriors posterior_omega_array with the posteriors
        a, b = np.triu_indices(len(self.clients))
        names = [f"omega[{self.clients[i]}, {self.clients[j]}]" for i, j in zip(a, b)]
        return pd.DataFrame({"mean": om[a, b]}, index=pd.Index(names, name="parameter"))

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        """Client ``client``'s coefficients: with uncertainty the posterior ``mean``, ``sd``,
        credible interval and ``p_value`` (one distribution, centred at ``mean``), else
        Algorithm 1's estimate in ``mean``; always ``estimate`` = Algorithm 1's estimate
        (``coef``), which is not the posterior's centre and may lie outside the interval."""
        est = self.coef(client)
        if self.has_uncertainty:
            t = self.client_posterior(client).summary(level=level, kind=kind)
        else:
            t = pd.DataFrame({"mean": est}, index=pd.Index(self.feature_names, name="parameter"))
        t["estimate"] = est
        return t

    # ------------------------------------------------------------ prediction
    def predict(self, X: ArrayLike, client: Hashable | None = None, *, level: float = 0.95) -> pd.DataFrame:
        """Predictions of client ``client`` for the rows of ``X`` (HM1 has no model of a new
        client: ``client`` must be a fitted one).

        With ``uncertainty=True`` the table describes the posterior of the mean response
        ``x' theta_k``, as :meth:`client_summary` does for the coefficients: ``mean`` (the
        posterior mean, centre of both intervals), ``lower``, ``upper`` (credible interval
        of the mean response), ``pred_lower``, ``pred_upper`` (predictive interval of a new
        observation: the client's noise variance added), then ``sd`` and ``estimate``,
        Algorithm 1's point prediction (what ``rmse`` scores; it need not lie inside the
        intervals). Without uncertainty, ``mean`` and ``estimate`` are Algorithm 1's point
        prediction and the intervals are NaN."""
        level = check_level(level)
        if client is None:
            raise ValueError("HM1 has no model for a client that took no part in the fit: give a fitted client")
        Xd = self._design(X)
        k = self._k(client)
        point = Xd @ self.theta[:, k]
        if not self.has_uncertainty:
            return prediction_frame(point, estimate=point)
        # add_posteriors sets them all (has_uncertainty: posterior_mean is set)
        assert self.posterior_mean is not None and self.posterior_cov is not None and self.noise_var is not None
        m = Xd @ self.posterior_mean[k]
        v = np.einsum("ij,jk,ik->i", Xd, self.posterior_cov[k], Xd)
        z = sst.norm.ppf(0.5 + level / 2)
        sd, psd = np.sqrt(v), np.sqrt(v + self.noise_var[k])
        return prediction_frame(m, m - z * sd, m + z * sd, m - z * psd, m + z * psd, sd=sd, estimate=point)


def add_posteriors(
    res: StructuralResult,
    design: Any,
    noise_sd,
    *,
    seed: int,
    jitter: float,
    how: str = "em",
    prior_rows=None,
    y_scale: float = 1.0,
    noise: str = "integrate",
) -> None:
    """Run the one-off information share on ``clients`` and set ``res``'s posteriors given
    Omega (``how``: the EM estimate or Algorithm 1's Omega). ``clients`` and ``res`` are on
    the scale the iteration ran on, where the target is the data's divided by ``y_scale``
    (known noise sds, given on the data's scale, are divided by it too). ``noise``:
    ``"integrate"`` integrates each estimated noise variance out of its client's posterior
    (:func:`~fedstats.linear.hm1_posterior.integrate_noise`, with the row counts the server
    knows), ``"plug-in"`` conditions on the estimates."""
    known = noise_vars(noise_sd, res.clients)
    if known is not None:
        known = {c: v / y_scale**2 for c, v in known.items()}
    # the clients that dropped out of the fit have no posterior: the others' is that of the
    # clients in the fit (the runtime asks only them)
    gone = excluded_now()
    inside = [k for k, c in enumerate(res.clients) if c not in gone]
    alg = InformationShare(known)
    out = run(alg, design, kind="information share", rounds=1, seed=seed, progress=False)
    replies = out.server_state
    missing = [res.clients[k] for k in inside if res.clients[k] not in replies]
    if missing:
        why = out.history[0].failed
        c = missing[0]
        raise CannotShareError(f"client {c!r} could not share its information matrix: {why.get(c, 'no reply')}")
    ids = [res.clients[k] for k in inside]
    info = np.stack([replies[c]["information"] for c in ids])
    score = np.stack([replies[c]["score"] for c in ids])
    noise_var = np.array([float(replies[c]["noise_var"]) for c in ids])
    K, d = len(ids), len(res.feature_names)
    if how == "learned":
        assert res.omega_array is not None  # both fits set it
        omega, details = res.omega_array[np.ix_(inside, inside)], {"omega": "learned"}
    else:
        nu = float(K if prior_rows is None else prior_rows)
        # start from Algorithm 1's Theta, shrunk as in the M-step (positive definite)
        S0 = res.theta[:, inside].T @ res.theta[:, inside]
        w = max(nu, 1.0)
        start = (S0 + w * exchangeable_target(S0 / d)[2]) / (d + w)
        if np.linalg.eigvalsh(start)[0] <= 0:
            start = exchangeable_target(S0 / d)[0] * np.eye(K)
        omega, details = em_omega(info, score, prior_rows=nu, start=start, jitter=jitter, max_iter=2000)
        details = {"omega": "em", **details}
        if not details["converged"]:
            warnings.warn(
                f"the EM estimate of Omega for the intervals did not converge in "
                f"{details['iterations']} iterations (last relative change "
                f"{details['last_change']:.2g}); omega_prior_rows={nu:g}",
                RuntimeWarning,
                stacklevel=4,
            )
    mean, cov = conditional_posterior(omega, info, score, jitter)
    if noise == "integrate":
        estimated = np.array([known is None or c not in known for c in ids])
        n_obs = np.array([design.data.n_obs[c] for c in ids], dtype=float)
        mean, cov, noise_var = integrate_noise(mean, cov, info, score, noise_var, n_obs, estimated)
    # every client's row; NaN for those not in the fit
    n_all = len(res.clients)
    res.posterior_omega_array = np.full((n_all, n_all), np.nan)
    res.posterior_omega_array[np.ix_(inside, inside)] = omega
    res.posterior_mean, res.posterior_cov = np.full((n_all, d), np.nan), np.full((n_all, d, d), np.nan)
    res.posterior_mean[inside], res.posterior_cov[inside] = mean, cov
    res.noise_var = np.full(n_all, np.nan)
    res.noise_var[inside] = noise_var
    res.posterior_info = {**details, "noise": noise}
    # the server returns each client the mean and covariance of its own block
    back = {c: {"bytes_up": 0, "bytes_down": 8 * (d + d * d)} for c in ids}
    record(
        Communication(
            bytes_down=8 * (d + d * d) * K,
            per_client=back,
            by_kind={"posterior blocks": {"bytes_up": 0, "bytes_down": 8 * (d + d * d) * K, "rounds": 0, "runs": 1}},
        )
    )


def to_data_scale(res: StructuralResult, scaling: LinearScaling | None) -> None:
    """Map a result fitted on the standardised scale of ``scaling`` to the data's scale, in
    place and exactly: coefficient vectors by the affine map ``theta = A theta' + c``
    (:meth:`~fedstats.federation.scaling.LinearScaling.coef_map`; Algorithm 1's estimate and the
    posterior means), the posterior covariances by ``A Sigma A'``, the noise variances by
    ``y_sd^2``. Omega (Algorithm 1's and the posteriors') stays the covariance between
    clients of the standardised coefficients (on the data's scale the prior covariance of
    ``vec(Theta)`` is ``Omega kron A A'``: no K x K matrix alone). ``None``: nothing to map."""
    res.scaling = scaling
    if scaling is None:
        return
    A, c = scaling.coef_map()
    res.theta = A @ res.theta + c[:, None]
    if res.posterior_mean is not None:
        assert res.posterior_cov is not None and res.noise_var is not None  # set together
        res.posterior_mean = res.posterior_mean @ A.T + c
        cov = np.einsum("ij,kjl,ml->kim", A, res.posterior_cov, A)
        res.posterior_cov = (cov + np.swapaxes(cov, 1, 2)) / 2
        res.noise_var = res.noise_var * scaling.y_sd**2
