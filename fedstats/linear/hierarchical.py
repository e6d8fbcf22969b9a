"""HM2: hierarchical Bayesian linear regression fitted by federated EP.

Model (Example 4.1 of the linear-models paper, generalised)::

    y_k | theta_k, sigma_k ~ N(X_k theta_k, sigma_k^2 I)        on client k
    theta_k | mu, tau      ~ N(mu, diag(tau))  (or tau * I)
    mu ~ N(m0, s0^2 I),    log tau ~ N(l0, t0^2)
    sigma_k known, or log sigma_k ~ N(a0, b0^2), a local nuisance that never leaves client k

The global ``phi = (mu, log tau)`` is fitted by federated EP
(:class:`fedstats.inference.ep.FederatedEP`); client posteriors come from each client's
*cavity* (Section 4.2.1 of the linear-models paper; ``q`` itself would count the client's data twice).

Example
-------
>>> import numpy as np
>>> from fedstats import FederatedData
>>> from fedstats.linear import HierarchicalLinearModel
>>> rng = np.random.default_rng(0)
>>> Xs = [rng.normal(size=(30, 2)) for _ in range(5)]
>>> ys = [X @ np.array([1.0, -0.5]) + 0.1 * rng.normal(size=30) for X in Xs]
>>> data = FederatedData.from_arrays(Xs, ys)
>>> res = HierarchicalLinearModel(fit_intercept=False, sigma=0.1, tau=0.1).fit(data, seed=1)
>>> res.global_posterior().mean.round(1)
array([ 1. , -0.5])
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .. import streams
from .._deprecation import renamed_parameters
from ..data import FederatedData, require_target
from ..estimator import BOOL, MAPPING, NONE, Constraint, Estimator, Int, OneOf, Pair, Real
from ..fitting import RunOptions, federated_fit, fit_rounds
from ..inference.ep import EPClientState
from ..inference.gaussian import NaturalGaussian
from ..inference.posterior import GaussianPosterior, SamplePosterior
from ..inference.posterior.tables import log_scale_rows, no_p_value
from ..inference.tilted import TiltedEstimator, make_estimator
from ..result_file import register
from ..results import NoPosteriorError
from ._hm2_site import HM2Site
from .ep_model import EPLinearResult, ParticipationSpec, coefficient_posterior, fit_ep
from .ep_model import normal_pair as _normal_pair

if TYPE_CHECKING:
    pass


def _positive(v: Any) -> bool:
    try:
        a = np.asarray(v, dtype=float)
    except (TypeError, ValueError):
        return False
    return bool(a.size and np.all(np.isfinite(a)) and np.all(a > 0))


_POSITIVE = Constraint(_positive, "positive numbers")


@register
class HierarchicalLinearModel(Estimator):
    """Hierarchical Bayesian linear regression (HM2) fitted by federated EP.

    Parameters
    ----------
    tau : {"diag", "iso"} or float or array
        Prior covariance of theta_k around mu: one unknown variance per coefficient
        (``"diag"``), one shared unknown variance (``"iso"``), or known variances.
    sigma : None, float, or dict
        Noise sd: ``None`` (unknown, sampled on each client with a log-normal prior), a
        known value for all clients, or a dict ``{client: sd}``.
    fit_intercept : bool
        Prepend a column of ones (coefficient ``"intercept"``) on every client.
    prior_mu, prior_log_tau, prior_log_sigma : (mean, sd)
        Normal priors on each component of mu, of log tau, and of log sigma_k.
    estimator : str or TiltedEstimator
        ``"auto"``: ``exact`` when tau and sigma are known; else mu is integrated in closed
        form and, when log tau and log sigma_k have at most 8 coordinates, ``rao_blackwell``
        (they are importance-sampled, 256 draws), beyond ``rao_blackwell_laplace`` (their
        Laplace approximation corrected to second order, with no draws; a client whose
        corrections are large is sampled instead). With 16 predictors and 50 clients a
        sampled round cost 1 s and its Monte-Carlo noise kept the fit from converging in 15
        rounds; the expanded rounds cost 0.25 s and converged in 10 (both within 0.1
        posterior sd of pooled NUTS), 40 predictors in 11 rounds of 3 s. Nothing is
        compiled. Or ``"exact"``, ``"rao_blackwell"``, ``"rao_blackwell_laplace"``,
        ``"laplace"``, ``"importance"``, ``"nuts"``, or an instance.
    estimator_options : dict
        Passed to the estimator when given by name (e.g. ``{"num_samples": 2000}``).
    damping : float in (0, 1] or None
        EP damping delta; ``None`` means 1 (the paper) for the exact estimator and 0.5
        otherwise: on 16 simulated federations (K = 10 to 100) damping 0.5 converged every
        time in 6 to 12 rounds, damping 1 diverged in 3 (importance) and on the K = 100
        example with NUTS. The server's PD back-off handles the remaining unstable steps.
    rounds : int
        Maximum number of EP rounds.
    tol : float
        Stop when no global mean moves by more than ``tol`` posterior sd (and no log sd
        by more than ``tol``) in a round. With damping ``delta`` a round moves about
        ``delta`` times the remaining distance to EP's fixed point, so the fit stops about
        ``tol / delta`` short of it: at the former default 0.1 (damping 0.5) the K = 100
        example ended 0.10-0.13 posterior sd from a long pooled NUTS run (seeds 1-3), at
        0.05 0.04-0.07, and run to 0.01 with 8,192 draws per client 0.01-0.03 (EP itself).
    participation : float, int or callable
        Clients per round (see :func:`fedstats.federation.run`).
    standardize : bool, default True
        Fit on predictors and target standardised with federated moments (one counted round
        of per-client sums; 0/1 predictors keep their coding; without an intercept nothing is
        centred) and report every output on the data's own scale by the exact transformation
        (:mod:`fedstats.federation.scaling`). The priors ``prior_mu``, ``prior_log_tau``,
        ``prior_log_sigma`` and a known ``tau`` then act on the standardised scale, where
        N(0, 1) and LogNormal(0, 1) are weakly informative whatever the data's units; a known
        ``sigma`` is given in the data's units. ``False``: fit the data as given, the priors
        acting on its own units (the seed paper's setting, on data of unit scale).
    """

    _constraints = {
        "tau": OneOf("diag", "iso") | _POSITIVE,
        "sigma": NONE | MAPPING | _POSITIVE,
        "fit_intercept": BOOL,
        "prior_mu": Pair(),
        "prior_log_tau": Pair(),
        "prior_log_sigma": Pair(),
        # a name is checked by make_estimator, which says which estimators exist and why one does not apply
        "estimator": Constraint(lambda v: isinstance(v, str) or hasattr(v, "estimate"), "a name or a TiltedEstimator"),
        "estimator_options": NONE | MAPPING,
        "damping": NONE | Real(0, 1, closed=(False, True)),
        "rounds": Int(1),
        "tol": Real(0),
        "participation": Real(0, 1, closed=(False, True)) | Int(1) | Constraint(callable, "a callable"),
        "standardize": BOOL,
    }

    def __init__(
        self,
        *,
        tau: str | ArrayLike = "diag",
        sigma: float | Mapping[Hashable, float] | None = None,
        fit_intercept: bool = True,
        prior_mu: tuple[float, float] = (0.0, 1.0),
        prior_log_tau: tuple[float, float] = (0.0, 1.0),
        prior_log_sigma: tuple[float, float] = (0.0, 1.0),
        estimator: str | TiltedEstimator = "auto",
        estimator_options: Mapping[str, Any] | None = None,
        damping: float | None = None,
        rounds: int = 15,
        tol: float = 0.05,
        participation: ParticipationSpec = 1.0,
        standardize: bool = True,
    ) -> None:
        self.tau, self.sigma, self.fit_intercept = tau, sigma, fit_intercept
        self.prior_mu, self.prior_log_tau, self.prior_log_sigma = prior_mu, prior_log_tau, prior_log_sigma
        self.estimator, self.estimator_options = estimator, estimator_options
        self.damping, self.rounds, self.tol, self.participation = damping, rounds, tol, participation
        self.standardize = standardize

    #: ``estimator="auto"`` samples log tau and log sigma_k (``rao_blackwell``) when they have
    #: at most this many coordinates, and expands their Laplace approximation beyond
    MAX_SAMPLED = 8

    # ------------------------------------------------------------------ set-up
    def _site(self, d: int) -> HM2Site:
        known: tuple[float, ...] | None
        if isinstance(self.tau, str):
            if self.tau not in ("diag", "iso"):
                raise ValueError(f"tau must be 'diag', 'iso' or known variances, not {self.tau!r}")
            kind, known = self.tau, None
        else:
            variances = np.broadcast_to(np.asarray(self.tau, dtype=float), (d,))
            if not np.all(np.isfinite(variances) & (variances > 0)):
                raise ValueError(f"known tau must be positive, got {self.tau!r}")
            kind, known = "known", tuple(float(v) for v in variances)
        return HM2Site(
            d=d,
            tau_kind=kind,
            tau_known=known,
            sigma_known=self.sigma is not None,
            log_sigma_prior=_normal_pair(self.prior_log_sigma, "prior_log_sigma"),
        )

    def _prior(self, site: HM2Site) -> NaturalGaussian:
        m0, s0 = _normal_pair(self.prior_mu, "prior_mu")
        l0, t0 = _normal_pair(self.prior_log_tau, "prior_log_tau")
        mean = np.r_[np.full(site.d, m0), np.full(site.n_log_tau, l0)]
        sd = np.r_[np.full(site.d, s0), np.full(site.n_log_tau, t0)]
        return NaturalGaussian.from_moments(mean, np.diag(sd**2))

    def _estimator(self, site: HM2Site) -> TiltedEstimator:
        spec = self.estimator
        if spec == "auto":
            if site.tau_kind == "known" and site.sigma_known:
                spec = "exact"
            else:  # mu integrated exactly; log tau's and log sigma_k sampled when few, else expanded
                spec = (
                    "rao_blackwell" if site.n_log_tau + site.local_dim <= self.MAX_SAMPLED else "rao_blackwell_laplace"
                )
        if spec == "exact" and not (site.tau_kind == "known" and site.sigma_known):
            raise ValueError(
                "estimator='exact' needs known tau and sigma (the site is Gaussian in mu only "
                "then); use 'rao_blackwell', 'importance', 'nuts' or 'laplace'"
            )
        return make_estimator(spec, **(self.estimator_options or {}))

    # ------------------------------------------------------------------ fit
    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions, *, rounds: int | None = None) -> HierarchicalResult:
        """Fit by federated EP; returns a :class:`HierarchicalResult`.

        ``data`` is a :class:`fedstats.FederatedData`; raw rows stay with their client
        (each client reduces them to sufficient statistics locally). ``rounds`` here is
        deprecated: set it on the model (its one home).
        """
        require_target(data, "HierarchicalLinearModel")
        names = (["intercept"] if self.fit_intercept else []) + list(data.feature_names)
        site = self._site(len(names))
        est = self._estimator(site)
        # Parallel EP from flat sites overshoots when the first tilteds are far from Gaussian;
        # only exact (Gaussian) sites are safe undamped.
        damping = (1.0 if est.name == "exact" else 0.5) if self.damping is None else float(self.damping)
        return fit_ep(
            HierarchicalResult,
            self,
            data,
            site,
            self._prior(site),
            est,
            names=names,
            sigma=_client_sigmas(self.sigma, data.clients),
            damping=damping,
            tol=self.tol,
            rounds=fit_rounds(self, rounds),
            participation=self.participation,
            run=run,
        )


def _client_sigmas(sigma: float | Mapping[Hashable, float] | None, clients: Sequence[Hashable]) -> dict | None:
    if sigma is None:
        return None
    if isinstance(sigma, Mapping):
        missing = [c for c in clients if c not in sigma]
        if missing:
            raise ValueError(f"sigma is missing for clients {missing[:5]}")
        return {c: float(sigma[c]) for c in clients}
    return {c: float(sigma) for c in clients}


# ---------------------------------------------------------------------------- result
@register
@dataclass(repr=False)
class HierarchicalResult(EPLinearResult):
    """A fitted HM2: global and client posteriors, predictions, fast adaptation, history,
    communication (see :class:`fedstats.linear.ep_model.EPLinearResult`)."""

    @property
    def phi_names(self) -> list[str]:
        names = [f"mu[{n}]" for n in self.feature_names]
        if self.site.tau_kind == "diag":
            names += [f"log_tau[{n}]" for n in self.feature_names]
        elif self.site.tau_kind == "iso":
            names += ["log_tau"]
        return names

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        """``mu`` and ``log_tau``, plus tau on its own scale. ``p_value`` (two-sided posterior
        tail probability of 0) is given for the coefficient means ``mu`` only: no one tests
        ``log tau = 0`` (tau = 1), so those rows hold NaN."""
        g = self.global_posterior()
        df = no_p_value(g.summary(level=level, kind=kind), "log_")
        if any(n.startswith("log_tau") for n in g.names):
            df = pd.concat([df, log_scale_rows(g, "log_tau", level, "tau")])
        return df

    def _global_original(self) -> GaussianPosterior | SamplePosterior:
        """q(mu, log tau) on the data's scale. mu is an affine map of the fitted mu (a Gaussian
        when tau is known); tau, the population variance of each coefficient, is the diagonal
        of ``A diag(tau') A'``, a nonlinear map once an intercept absorbs the centring: then
        the posterior is 20,000 seeded transformed draws of q, with ``log_tau[name]`` per
        coefficient (also for ``tau="iso"``, which is isotropic on the standardised scale only)."""
        assert self.scaling is not None  # called by global_posterior only with a scaling
        q, d = self._q(), self.site.d
        A, c = self.scaling.coef_map()
        names = [f"mu[{n}]" for n in self.feature_names]
        if self.site.tau_kind == "known":
            return q.affine(A, c, names=names)
        phi = q.sample(20000, seed=streams.stream(self.seed, "scale map"))
        mu = phi[:, :d] @ A.T + c
        tau = np.exp(phi[:, d:])
        tau = np.broadcast_to(tau, (len(phi), d)) @ (A**2).T
        return SamplePosterior(
            np.column_stack([mu, np.log(tau)]), names=names + [f"log_tau[{n}]" for n in self.feature_names]
        )

    def _population_draws(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        post = self._prior_predictive(n, int(rng.integers(2**31)))
        return post.draws, self._population_noise(rng, n)

    def _population_noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Noise sd of a new client: the fitted clients' sigma posteriors, mixed in equal
        parts (each resampled by its weights). Known noise: the root mean known variance."""
        if self.site.sigma_known:
            states = list(self.client_states.values())
            if not all(isinstance(st, EPClientState) for st in states):  # a fit on Flower: the known sds
                assert self.noise_sd is not None  # a known noise is the user's noise_sd
                return np.full(n, np.sqrt(float(np.mean(np.square(list(self.noise_sd.values()))))))
            s = 1.0 if self.scaling is None else self.scaling.y_sd
            return np.full(n, s * np.sqrt(float(np.mean([st.stats["sigma2"] for st in states]))))
        which = rng.integers(0, len(self.clients), size=n)
        out = np.empty(n)
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            try:
                noise = self.client_noise(self.clients[j])
            except NoPosteriorError as exc:
                raise NoPosteriorError(
                    "a new client's noise sd mixes the fitted clients' noise posteriors, and " + str(exc)
                ) from None
            # a client whose noise draws all coincide has a float noise sd (client_noise)
            out[at] = noise if isinstance(noise, float) else noise.sample(len(at), seed=rng)[:, 0]
        return out

    @renamed_parameters(level="method")
    def new_client_posterior(
        self,
        X: ArrayLike | None = None,
        y: ArrayLike | None = None,
        *,
        method: str | int | None = None,
        sigma: float | None = None,
        n: int = 4000,
        seed: int = 0,
    ) -> np.ndarray | GaussianPosterior | SamplePosterior:
        """Fast adaptation to a client that took no part in the fit (the paper seeds a new client
        with the posterior mean of mu; its "levels" 2 and 3 of adaptation go further; they are
        also accepted here as ``method=1``, ``2`` and ``3``):

        ``method="mean"``: plug-in ``theta_new = E_q[mu]``, returned as an array (a point, no
        posterior).
        ``method="prior"``: prior predictive ``theta_new ~ int N(mu, diag tau) q(phi) dphi`` (no
        data), a :class:`SamplePosterior` of ``n`` draws.
        ``method="data"``: with a few data points ``(X, y)`` (and ``sigma`` when the noise is
        known): the client's tilted distribution with cavity q (it has no site yet).
        Default: ``"data"`` when data are given, else ``"prior"``. (``level=`` is the former
        name of ``method=``.)
        """
        if isinstance(method, int) and not isinstance(method, bool):
            method = {1: "mean", 2: "prior", 3: "data"}.get(method, method)
        method = method or ("data" if X is not None else "prior")
        q = self._q()
        d = self.site.d
        sc = self.scaling
        if method == "mean":
            return q.mean[:d].copy() if sc is None else sc.coef_back(q.mean[:d])
        if method == "prior":
            return self._prior_predictive(n, seed)
        if method != "data":
            raise ValueError(f"method must be 'mean', 'prior' or 'data', got {method!r}")
        if X is None or y is None:
            raise ValueError("method='data' needs the new client's X and y")
        Xd = self._design(X)
        y = np.asarray(y, dtype=float).reshape(-1)
        if len(Xd) != len(y) or not np.all(np.isfinite(y)):
            raise ValueError("X and y must be finite with the same number of rows")
        if self.site.sigma_known and sigma is None:
            raise ValueError("this model has a known noise sd: pass sigma for the new client")
        if sc is not None:  # the new client scales its rows as the fitted ones did
            Xd = self._design(sc.transform_X(X))
            y = sc.transform_y(y)
            sigma = None if sigma is None else sigma / sc.y_sd
        stats = self.site.stats_from(Xd, y, sigma)
        m, c = self.server.q.moments()
        tilted = self.algorithm.estimator.estimate(
            self.algorithm.model, m[None], c[None], [stats], np.array([seed]), keep_draws=True
        )[0]
        if not tilted.ok:
            raise FloatingPointError(f"adaptation failed: {tilted.message}")
        return self._coef_back(
            coefficient_posterior(self.site, tilted, stats, self.feature_names, np.random.default_rng(seed))
        )

    def _prior_predictive(self, n: int, seed: int) -> SamplePosterior:
        """Level 2 of :meth:`new_client_posterior`: ``n`` draws of a new client's coefficients."""
        q, d, sc = self._q(), self.site.d, self.scaling
        rng = np.random.default_rng(seed)
        phi = q.sample(n, seed=rng)
        import jax

        with jax.enable_x64(True):
            mu, tau = jax.vmap(self.site.split_phi)(jax.numpy.asarray(phi))
        theta = np.asarray(mu) + np.sqrt(np.asarray(tau)) * rng.standard_normal((n, d))
        return SamplePosterior(theta if sc is None else sc.coef_back(theta), names=self.feature_names)
