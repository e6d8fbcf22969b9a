"""Variational FedEM: a Bayesian Gaussian mixture with private Dirichlet weights (beyond the thesis).

Model: ``pi_c ~ Dir(alpha_0)`` per client, ``(mu_j, Lambda_j) ~ NormalWishart(m_0, beta_0,
W_0, nu_0)`` per component, ``z ~ Cat(pi_c)``, ``x | z=j ~ N(mu_j, Lambda_j^{-1})``.
Mean-field VB (Bishop, PRML §10.2) with exactly scikit-learn's
``BayesianGaussianMixture(weight_concentration_prior_type="dirichlet_distribution")``
updates, split into a client and a server part:

* client: E-step with ``E[log pi_c]`` (from its own ``alpha_c``, which never leaves it) and
  the broadcast expected log-densities; ``alpha_c = alpha_0 + N_c``; replies with the same
  summed arrays as FedEM, its ``weight_term`` being its Dirichlet term ``log C(alpha_c)``
  of the ELBO (``log Gamma(sum_j alpha_cj) - sum_j log Gamma(alpha_cj)``);
* server: Normal-Wishart update from the summed statistics; the ELBO (scikit-learn's
  simplified lower bound, summed over clients' Dirichlet terms) is its convergence monitor.

It is the FedEM round with other E-step offsets and another server update, so it reuses
:class:`~fedstats.mixture.fedem_algorithm.FedEMAlgorithm` (every reply array summed, running totals
with changes for incremental participation, batched E-step).

Intervals (closed form): ``pi_cj ~ Beta(alpha_cj, alpha_c0 - alpha_cj)``; ``mu_j``'s
coordinates are Student-t with ``nu_j - d + 1`` degrees of freedom, location ``m_j`` and
scale ``sqrt([W_j^{-1}]_ll / (beta_j (nu_j - d + 1)))``; a variance ``[Sigma_j]_ll ~
InvGamma((nu_j - d + 1) / 2, [W_j^{-1}]_ll / 2)``. (scikit-learn's ``covariances_`` is
``W_j^{-1} / nu_j``.) For diag the coordinates are independent Normal-inverse-gammas
(``nu_j`` instead of ``nu_j - d + 1``); for spherical one variance is seen in all ``d``
coordinates (``nu_j d``), see :meth:`BayesianMixtureResult._marginal_params`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import digamma, gammaln

from ..data import FederatedData
from ..estimator import MAPPING, NONE, Real
from ..federation import client_function
from ..fitting import RunOptions, federated_fit
from ..result_file import register
from ._common import ServerMixture, check_failures, still_in_fit
from .bayes_result import BayesianMixtureResult
from .fedem_algorithm import FedEMAlgorithm, SentStatistics
from .gmm import cov_shape, m_step, precision_cholesky

_EPS10 = 10 * np.finfo(float).eps  # scikit-learn adds this to every soft count


@register
@dataclass
class VBClientState:
    """A client's variational Dirichlet ``alpha_c`` (private), its row count and what it last
    sent (see :class:`~fedstats.mixture.fedem_algorithm.SentStatistics`)."""

    alpha: np.ndarray
    n: int
    sent: SentStatistics | None = None

    @property
    def log_weights(self) -> np.ndarray:  # E[log pi_c]: the E-step's weight term
        return digamma(self.alpha) - digamma(self.alpha.sum())


def log_dirichlet_norm(alpha: np.ndarray) -> np.ndarray:
    """``log Gamma(sum a) - sum log Gamma(a)`` along the last axis."""
    return gammaln(alpha.sum(-1)) - gammaln(alpha).sum(-1)


def _log_det_chol(pc, cov_type, d):
    if cov_type == "full":
        return np.sum(np.log(np.diagonal(pc, axis1=1, axis2=2)), 1)
    if cov_type == "tied":
        return np.sum(np.log(np.diag(pc)))
    if cov_type == "diag":
        return np.sum(np.log(pc), 1)
    return d * np.log(pc)


class VBFedEMAlgorithm(FedEMAlgorithm):
    """Variational FedEM (one VB iteration per round). ``hyper``: the starting q(mu, Lambda)
    (``mean_precision``, ``means``, ``degrees_of_freedom``, ``covariances``) or ``None`` for
    an ML start (the first E-step uses ``means``/``covariances`` as plain Gaussians with
    uniform weights; scikit-learn starts from hard k-means responsibilities instead, so the
    parity tests give both the same q through ``vb_init``); ``prior``: ``alpha0``,
    ``beta0``, ``m0``, ``nu0``, ``cov0`` (scikit-learn's ``covariance_prior``)."""

    per_client_fields = ("weights_init", "alpha_init")

    def __init__(
        self,
        means,
        covariances,
        prior,
        *,
        hyper=None,
        alpha_init=None,
        covariance_type="full",
        reg_covar=1e-6,
        shared_weights=False,
        tol=1e-6,
    ):
        super().__init__(
            means,
            covariances,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            shared_weights=shared_weights,
            tol=tol,
        )
        self.prior = prior
        self.hyper0 = hyper
        self.alpha_init = alpha_init

    # ---------------------------------------------------------------- server side
    def init_server(self, clients, rng):
        st = super().init_server(clients, rng)
        st["hyper"] = self.hyper0
        st["alpha_shared"] = None
        if self.shared:
            a = self.alpha_init if self.alpha_init is not None else np.full(self.M, self.prior["alpha0"])
            st["alpha_shared"] = np.asarray(a, float)
        return st

    def offsets(self, hyper):
        """Per-component additive E-step term: ``-d/2 log nu + 1/2 (E log|Lambda| - d/beta)``."""
        d = self.d
        nu, beta = np.atleast_1d(hyper["degrees_of_freedom"]), hyper["mean_precision"]
        log_lambda = d * math.log(2.0) + np.sum(digamma(0.5 * (nu - np.arange(d)[:, None])), 0)
        return -0.5 * d * np.log(nu) + 0.5 * (log_lambda - d / beta)

    def broadcast(self, state, client, round):
        h = state["hyper"]
        if h is None:  # ML start: plain Gaussians, uniform weights
            msg = {
                "means": state["means"],
                "covariances": state["cov"],
                "offset": np.zeros(self.M),
                "ml_start": np.array([1]),
            }
        else:
            msg = {
                "means": h["means"],
                "covariances": h["covariances"],
                "offset": self.offsets(h),
                "ml_start": np.array([0]),
            }
        if self.shared:
            a = state["alpha_shared"]
            msg["log_weights"] = np.full(self.M, -math.log(self.M)) if h is None else digamma(a) - digamma(a.sum())
        return msg

    def vb_update(self, Nj, xk, sk):
        """scikit-learn's ``_estimate_means`` and ``_estimate_wishart_*`` from counts, means, covariances."""
        p, M = self.prior, self.M
        beta = p["beta0"] + Nj
        means = (p["beta0"] * p["m0"] + Nj[:, None] * xk) / beta[:, None]
        diff = xk - p["m0"]
        ct = self.cov_type
        if ct == "full":
            nu = p["nu0"] + Nj
            cov = (
                p["cov0"]
                + Nj[:, None, None] * sk
                + (Nj * p["beta0"] / beta)[:, None, None] * np.einsum("md,me->mde", diff, diff)
            )
            cov = cov / nu[:, None, None]
        elif ct == "tied":
            nu = p["nu0"] + Nj.sum() / M
            cov = p["cov0"] + sk * Nj.sum() / M + p["beta0"] / M * np.dot((Nj / beta) * diff.T, diff)
            cov = cov / nu
        elif ct == "diag":
            nu = p["nu0"] + Nj
            cov = (p["cov0"] + Nj[:, None] * (sk + (p["beta0"] / beta)[:, None] * diff**2)) / nu[:, None]
        else:
            nu = p["nu0"] + Nj
            cov = (p["cov0"] + Nj * (sk + p["beta0"] / beta * np.mean(diff**2, 1))) / nu
        return {"mean_precision": beta, "means": means, "degrees_of_freedom": nu, "covariances": cov}

    def server_step(self, state, replies, round):
        shift = self._ref_shift()
        st, metrics, stats = self.absorb(state, replies, shift)
        # the clients' log-sum-exp normalisers include the VB offsets: not a log-likelihood
        metrics["e_step_normaliser"] = metrics.pop("loglik")
        del metrics["mean_loglik"]
        if stats is None:
            metrics["elbo"] = float("nan")
            return st, metrics
        N, S1, S2 = stats
        Nj = N + _EPS10
        xk, sk, _ = m_step(Nj, S1, S2, shift, self.cov_type, self.reg_covar, min_count=0.0)
        h = self.vb_update(Nj, xk, sk)
        st["hyper"] = h
        st["means"], st["cov"] = h["means"], h["covariances"]
        if self.shared:
            st["alpha_shared"] = self.prior["alpha0"] + Nj
            dirichlet = float(log_dirichlet_norm(st["alpha_shared"]))
        else:  # sum_c log C(alpha_c), each client's term formed on the client
            dirichlet = st["weight_term"]
        elbo = self.elbo(h, dirichlet, st["H"])
        st["F_prev"], st["F"] = state["F"], elbo
        metrics["elbo"] = elbo
        return st, metrics

    def elbo(self, h, dirichlet, entropy):
        """scikit-learn's ``_compute_lower_bound`` (constants dropped), one Dirichlet per client:
        ``dirichlet`` is the sum of their ``log C(alpha_c)``, ``entropy`` that of the
        responsibilities' entropies."""
        d, M = self.d, self.M
        nu = h["degrees_of_freedom"]
        pc = precision_cholesky(h["covariances"], self.cov_type)
        logdet = _log_det_chol(pc, self.cov_type, d) - 0.5 * d * np.log(nu)
        lw = -(
            nu * logdet
            + nu * d * 0.5 * math.log(2.0)
            + np.sum(gammaln(0.5 * (np.atleast_1d(nu) - np.arange(d)[:, None])), 0)
        )
        log_wishart = M * float(np.squeeze(lw)) if self.cov_type == "tied" else float(np.sum(lw))
        return float(entropy - log_wishart - dirichlet - 0.5 * d * np.sum(np.log(h["mean_precision"])))

    # ---------------------------------------------------------------- client side
    def init_client(self, client, data, rng):
        a = self.alpha_init
        if isinstance(a, dict):
            a = a[client]
        a = np.full(self.M, self.prior["alpha0"]) if a is None else np.asarray(a, float)
        return VBClientState(alpha=a, n=int(data.n))

    def _estep_log_weights(self, message, states):
        # E[log pi_c] + offset is the per-row "log weight" of the FedEM E-step (uniform weights
        # at an ML start); with shared weights the broadcast E[log pi] (uniform at the start)
        if self.shared:
            return message["log_weights"] + message["offset"]
        uniform = np.full(self.M, -math.log(self.M))
        ml = bool(message["ml_start"][0])
        return np.stack([(uniform if ml else s.log_weights) + message["offset"] for s in states])

    def _updated_many(self, states, N):
        """Every client's new ``alpha_c = alpha_0 + N_c`` and its Dirichlet term ``log C(alpha_c)``
        of the ELBO (0 with shared weights: the server's), ``N`` stacked ``(C, M)``."""
        alpha = self.prior["alpha0"] + N + _EPS10
        terms = np.zeros(len(states)) if self.shared else log_dirichlet_norm(alpha)
        return [VBClientState(alpha=alpha[i].copy(), n=s.n) for i, s in enumerate(states)], terms


# ====================================================================== the model
@dataclass(eq=False, repr=False, kw_only=True)
class VariationalGaussianMixture(ServerMixture):
    """Variational FedEM: Dirichlet weights per client (private), Normal-Wishart components,
    closed-form credible intervals; the sibling of
    :class:`~fedstats.mixture.fedem.FederatedGaussianMixture` (maximum likelihood), with the
    same parameters plus the priors.

    Parameters
    ----------
    n_components, covariance_type, reg_covar, rounds, tol, shared_weights, n_init, means_init, covariances_init, participation
        As in :class:`~fedstats.mixture.fedem.FederatedGaussianMixture` (``tol`` applies to the
        ELBO per point).
    weight_concentration_prior, mean_precision_prior, mean_prior, degrees_of_freedom_prior, covariance_prior
        Priors (scikit-learn's names and layouts). Defaults as scikit-learn's:
        ``weight_concentration_prior = 1/M``, ``mean_precision_prior = 1``, ``mean_prior`` and
        ``covariance_prior`` the data mean and covariance, computed from federated sums (one
        counted round), ``degrees_of_freedom_prior = d``.
    vb_init : dict, optional
        Start from this q (keys ``mean_precision``, ``means``, ``degrees_of_freedom``,
        ``covariances`` and ``weight_concentration``, (M,) or a dict client -> (M,)) instead
        of the k-means start.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.mixture import VariationalGaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> Xs = [np.r_[rng.normal(0, 1, (40, 2)), rng.normal(6, 1, (30, 2))] for _ in range(3)]
    >>> res = VariationalGaussianMixture(2, n_init=2).fit(Xs, seed=0)
    >>> [round(float(v)) for v in np.sort(res.means[:, 0])]
    [0, 6]
    """

    _constraints = {
        **ServerMixture._constraints,
        "weight_concentration_prior": NONE | Real(0, closed=(False, True)),
        "mean_precision_prior": NONE | Real(0, closed=(False, True)),
        "degrees_of_freedom_prior": NONE | Real(),
        "vb_init": NONE | MAPPING,
    }

    weight_concentration_prior: float | None = None
    mean_precision_prior: float | None = None
    mean_prior: ArrayLike | None = None
    degrees_of_freedom_prior: float | None = None
    covariance_prior: ArrayLike | None = None
    vb_init: Mapping[str, ArrayLike | Mapping[Hashable, ArrayLike]] | None = None

    def _check(self, data):
        super()._check(data)
        if self.vb_init is not None:
            self._check_vb_init(data)

    def _check_vb_init(self, data):
        M, d, ct = self.n_components, data.n_features, self.covariance_type
        v = self.vb_init
        want = {
            "mean_precision": (M,),
            "means": (M, d),
            "degrees_of_freedom": () if ct == "tied" else (M,),
            "covariances": cov_shape(ct, M, d),
            "weight_concentration": (M,),
        }
        if set(v) != set(want):
            raise ValueError(f"vb_init must be a dict with exactly the keys {sorted(want)}")
        for k, shape in want.items():
            a = v[k]
            if k == "weight_concentration" and isinstance(a, Mapping):
                missing = [c for c in data.clients if c not in a]
                if missing:
                    raise ValueError(f"vb_init['weight_concentration'] has no entry for client(s) {missing[:5]}")
                arrays = [np.asarray(a[c], float) for c in data.clients]
            else:
                arrays = [np.asarray(a, float)]
            for arr in arrays:
                if arr.shape != shape or not np.all(np.isfinite(arr)):
                    raise ValueError(f"vb_init[{k!r}] must be finite with shape {shape}, got shape {arr.shape}")
                if k in ("mean_precision", "weight_concentration") and np.any(arr <= 0):
                    raise ValueError(f"vb_init[{k!r}] must be > 0")
                if k == "degrees_of_freedom" and np.any(arr <= d - 1):
                    raise ValueError(f"vb_init['degrees_of_freedom'] must be > d - 1 = {d - 1}")
        precision_cholesky(np.asarray(v["covariances"], float), ct)

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> BayesianMixtureResult:
        """Fit by variational FedEM. ``data``: FederatedData (``y`` ignored), or per-client
        arrays. Returns a :class:`BayesianMixtureResult`."""
        seed = run.seed
        self._check(data)
        M, d, ct = self.n_components, data.n_features, self.covariance_type
        m0, cov0 = federated_priors(data, ct, seed=seed)
        prior = check_prior(
            {
                "alpha0": 1.0 / M
                if self.weight_concentration_prior is None
                else float(self.weight_concentration_prior),
                "beta0": 1.0 if self.mean_precision_prior is None else float(self.mean_precision_prior),
                "m0": m0 if self.mean_prior is None else self.mean_prior,
                "nu0": float(d) if self.degrees_of_freedom_prior is None else float(self.degrees_of_freedom_prior),
                "cov0": cov0 if self.covariance_prior is None else self.covariance_prior,
            },
            d,
            M,
            ct,
        )
        if self.vb_init is not None:
            h = {
                k: np.array(self.vb_init[k], dtype=float)
                for k in ("mean_precision", "means", "degrees_of_freedom", "covariances")
            }
            a = self.vb_init["weight_concentration"]
            alpha = (
                {c: np.asarray(a[c], float) for c in data.clients} if isinstance(a, Mapping) else np.asarray(a, float)
            )
            means, cov, info = h["means"], h["covariances"], {}
        else:
            h, alpha = None, None
            means, cov, info = self._start(data, seed)
        algo = VBFedEMAlgorithm(
            means,
            cov,
            prior,
            hyper=h,
            alpha_init=alpha,
            covariance_type=ct,
            reg_covar=self.reg_covar,
            shared_weights=self.shared_weights,
            tol=self.tol or None,
        )
        res = run.run(
            algo,
            data,
            kind="variational rounds",
            rounds=self.rounds,
            participation=self._participation(data.clients),
            min_rounds=min(2, self.rounds),
        )
        st = res.server_state
        check_failures(res.history, st["seen"], st["clients"], "variational FedEM")
        data = still_in_fit(data)
        hy = st["hyper"]
        conc = (
            {c: st["alpha_shared"] for c in data.clients}
            if self.shared_weights
            else {c: s.alpha for c, s in res.client_states.items() if c in data.clients}
        )
        self._warn_unconverged(res, "variational FedEM")
        out = BayesianMixtureResult(
            means=hy["means"],
            covariances=hy["covariances"],
            weights={c: a / a.sum() for c, a in conc.items()},
            covariance_type=ct,
            **self._run_fields(data, res, info),
            shared_weights=self.shared_weights,
        )
        out.weight_concentration = conc
        out.mean_precision = hy["mean_precision"]
        out.degrees_of_freedom = hy["degrees_of_freedom"]
        out.prior = prior
        return out


# ====================================================================== the prior
@client_function
def _prior_moments(msg, X, rng, _private=None):
    """Client side of the prior round: count, sum and the scatter about the client's own mean
    (no cancellation). Module level, so that a remote client can load it by reference."""
    m = X.mean(0)
    return {"n": np.array([X.shape[0]], float), "s": X.sum(0), "ss": (X - m).T @ (X - m)}


def federated_priors(data, cov_type, *, seed=0):
    """scikit-learn's default priors from federated sums: ``m0`` = data mean, ``cov0`` =
    data covariance (``ddof=1``; diagonal / mean variance for diag / spherical). One round.

    The within-client scatters ``ss`` are declared summed; each client's count and sum stay
    per client: the between-client term ``sum_c n_c (m_c - m)(m_c - m)^T`` needs every
    client's mean ``m_c`` against the overall mean ``m``, which no client knows in this one
    round (raw second moments would be summable but lose digits to cancellation on data far
    from the origin; a second round with the broadcast mean would make it a sum)."""
    from ._init import one_shot_sums

    reps, _ = one_shot_sums(
        data, ("n", "s", "ss"), ("ss",), {"go": np.array([1])}, _prior_moments, seed=seed, what="the prior round"
    )
    answered = [c for c in data.clients if c in reps]  # in a fit, one that failed has dropped out
    n = sum(reps[c]["n"][0] for c in answered)
    mean = sum(reps[c]["s"] for c in answered) / n
    # Chan et al.'s parallel combination: within-client scatter + between-client term
    scatter = reps.sums["ss"] + sum(
        reps[c]["n"][0] * np.outer(reps[c]["s"] / reps[c]["n"][0] - mean, reps[c]["s"] / reps[c]["n"][0] - mean)
        for c in answered
    )
    cov = scatter / (n - 1)
    cov0 = {"full": cov, "tied": cov, "diag": np.diag(cov).copy(), "spherical": float(np.diag(cov).mean())}[cov_type]
    return mean, cov0


def check_prior(prior: dict, d: int, M: int, cov_type: str) -> dict:
    """Validated prior dict (keys alpha0, beta0, m0, nu0, cov0)."""
    p = dict(prior)
    if not p["alpha0"] > 0:
        raise ValueError(f"weight_concentration_prior must be > 0, got {p['alpha0']}")
    if not p["beta0"] > 0:
        raise ValueError(f"mean_precision_prior must be > 0, got {p['beta0']}")
    if not p["nu0"] > d - 1:
        raise ValueError(f"degrees_of_freedom_prior must be > d - 1 = {d - 1}, got {p['nu0']}")
    p["m0"] = np.asarray(p["m0"], float)
    if p["m0"].shape != (d,):
        raise ValueError(f"mean_prior must have shape ({d},), got {p['m0'].shape}")
    p["cov0"] = np.asarray(p["cov0"], float)
    want = {"full": (d, d), "tied": (d, d), "diag": (d,), "spherical": ()}[cov_type]
    if p["cov0"].shape != want:
        raise ValueError(f"covariance_prior must have shape {want} for {cov_type!r}, got {p['cov0'].shape}")
    return p
