"""Bayesian GLMs by federated EP: :class:`BayesianGLM` (coefficients shared by every client)
and :class:`HierarchicalGLM` (each client's own coefficients around a population).

Both standardise the predictors with federated moments first (two summed rounds; 0/1
columns keep their coding), put their priors on that scale and report on the data's own
scale. Each EP site is one client's full likelihood; the tilted moments come from
Laplace-corrected importance sampling (:class:`~fedstats.inference.tilted.ImportanceTilted`),
one compiled kernel for every client. A client's rows never leave it and are not kept in its
EP state.

* ``BayesianGLM``: ``beta ~ N(0, prior_scale^2)`` per standardised predictor, the intercept
  ``~ N(g(mean outcome), intercept_scale^2)``; gaussian adds ``log sigma`` and gamma ``log
  shape`` as shared parameters.
* ``HierarchicalGLM``: ``theta_k ~ N(mu, diag(tau))``, ``mu ~ N(0, I)``, ``log tau ~ N(0, I)``
  on the standardised scale (HM2's structure), the intercept one of the coefficients with
  its own random effect. ``theta_k`` is integrated out in each site by a Laplace
  approximation; client posteriors come from one more counted round in which every client
  combines its likelihood with its cavity and sends the mean and covariance of its
  coefficients.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .. import streams
from ..data import FederatedData, require_target
from ..estimator import BOOL, NONE, Int, OneOf, Real
from ..federation import Communication, History
from ..federation.scaling import LinearScaling, federated_scaling
from ..fitting import RunOptions, federated_fit
from ..inference.elpd import PointwiseLikelihood, stream
from ..inference.ep import PosteriorRound, RowsEP, posterior_round
from ..inference.ep_checks import check_run
from ..inference.gaussian import NaturalGaussian
from ..inference.posterior import GaussianPosterior, SamplePosterior
from ..inference.posterior.tables import log_scale_rows, no_p_value
from ..inference.tilted import ImportanceTilted, LaplaceTilted
from ..result_file import register
from ..results import FederatedResult, check_level, prediction_frame
from ._design import SPECIAL, GLMDesign, GLMOptions, GLMSetup, frame_rows, prediction_rows
from ._irls import design_check
from .families import Family, family_of
from .hypotheses import posterior_ratios
from .sites import AUTO_QUADRATURE, BAYES_LINKS, DISPERSION, HierarchicalSite, SharedSite, n_pad, pointwise_rows

__all__ = ["BayesianGLM", "HierarchicalGLM", "BayesianGLMResult", "HierarchicalGLMResult"]


@dataclass(eq=False, repr=False, kw_only=True)
class _BayesBase(GLMOptions):
    """The parameters both Bayesian GLMs have beyond every GLM's (their defaults are the
    shared-coefficient model's; the hierarchical one changes some)."""

    _families = tuple(BAYES_LINKS)

    family: str = field(default="binomial", kw_only=False)
    standardize: bool = True
    rounds: int = 15
    tol: float = 0.05
    damping: float = 1.0
    num_draws: int = 4000
    tilted: str = "importance"

    def _fitted(self, fam, design, roles, n_rows, out, history, scaling, seed: int) -> dict[str, Any]:
        """What both results hold of an EP fit (the keyword arguments of their constructors)."""
        return dict(
            model=type(self).__name__,
            family=fam.name,
            link=fam.link.name,
            alpha=float(self.alpha),
            names=design.names,
            predictors=design.predictors,
            roles=roles,
            fit_intercept=bool(self.fit_intercept),
            clients=list(design.clients),
            n_obs=n_rows,
            q=(out.server_state.q.r, out.server_state.q.Q),
            scaling=scaling,
            history=History(history),
            rounds=len(history),
            converged=bool(out.converged),
            communication=out.communication,
            seed=seed,
        )

    def _family(self) -> Family:
        self._validate_params()
        name = type(self).__name__
        fam = family_of(self.family, self.link, self.alpha) if self.family in BAYES_LINKS else None
        if fam is None or fam.link.name not in BAYES_LINKS[self.family] or self.family not in self._families:
            allowed = {f: BAYES_LINKS[f] for f in self._families}
            raise ValueError(f"{name}: family/link must be one of {allowed}, got {self.family!r}/{self.link!r}")
        if self.trials is not None and fam.name != "binomial":
            raise ValueError(f"{name}: trials= is for the binomial family, not {fam.name}")
        return fam

    def _setup(self, data: Any, seed: int) -> GLMSetup:
        """Checks (one counted round), the federated scaling of the predictors (two more) and
        the design every client reads its standardised rows through."""
        require_target(data, type(self).__name__)
        fam = self._family()
        roles = {r: getattr(self, r) for r in SPECIAL}
        raw = GLMDesign(data, self.fit_intercept, roles)
        chk = design_check(fam, raw, self.trials is not None, seed, mle=False)
        n_rows, ybar = chk["n_obs"], chk["ybar"]
        scaling = None
        if self.standardize:
            full = federated_scaling(data, self.fit_intercept, seed=seed)
            k = raw.keep
            scaling = LinearScaling(
                x_mean=full.x_mean[k],
                x_sd=full.x_sd[k],
                y_mean=0.0,
                y_sd=1.0,
                binary=full.binary[k],
                fit_intercept=bool(self.fit_intercept),
            )
            y_sd = full.y_sd
        else:
            y_sd = 1.0
        design = GLMDesign(data, self.fit_intercept, roles, scaling=scaling, family=fam)
        return GLMSetup(fam, roles, design, scaling, n_rows, ybar, y_sd)

    def _run_ep(self, site: Any, prior: NaturalGaussian, design: GLMDesign, run: RunOptions) -> tuple:
        draws = ImportanceTilted(num_draws=int(self.num_draws), qmc=True)
        stages = {"importance": (draws,), "laplace": (LaplaceTilted(),), "laplace+importance": (LaplaceTilted(), draws)}
        alg = RowsEP(site, prior, stages[self.tilted], damping=float(self.damping), tol=float(self.tol))
        out = run.run(alg, design, kind="EP rounds", rounds=int(self.rounds), min_rounds=min(2, int(self.rounds)))
        check_run(out, alg, list(design.clients), int(self.rounds))
        return alg, out, list(out.history)


def _intercept_mean(fam, ybar: float) -> float:
    lo, hi = (0.01, 0.99) if fam.name == "binomial" else (1e-3, np.inf)
    v = ybar if fam.name == "gaussian" else float(np.clip(ybar, lo, hi))
    return float(fam.link(np.array(v)))


_COMMON = {
    **GLMOptions._constraints,
    "link": NONE | OneOf("identity", "log", "logit", "probit", "cloglog"),
    "standardize": BOOL,
    "rounds": Int(1),
    "tol": Real(0, closed=(False, True)),
    "damping": Real(0, 1, closed=(False, True)),
    "num_draws": Int(100),
    "tilted": OneOf("importance", "laplace", "laplace+importance"),
}


@dataclass(eq=False, repr=False, kw_only=True)
class BayesianGLM(_BayesBase):
    """GLM with coefficients shared by every client and a Normal prior, by federated EP.

    Parameters
    ----------
    family, link, alpha, fit_intercept, offset, exposure, weights, trials
        As :class:`~fedstats.glm.FederatedGLM`. Families and links: binomial (logit, probit,
        cloglog), poisson (log), negative_binomial (log), gaussian (identity; ``log sigma``
        shared), gamma (log; ``log shape`` shared).
    prior_scale : float, default 2.5
        Prior sd of each coefficient of a standardised predictor (gaussian: times the
        outcome's federated sd).
    intercept_scale : float, default 10
        Prior sd of the intercept, centred at the link of the mean outcome.
    standardize : bool, default True
    rounds, tol, damping, num_draws
        EP rounds (at most); stop when no posterior mean moves by ``tol`` sds and no sd by a
        factor ``exp(tol)``; damping (1: the sites of log-concave likelihoods need none; a
        damped site reaches only ``1 - (1 - damping)^r`` of its precision in ``r`` rounds);
        importance draws per client and round.
    tilted : {"importance", "laplace", "laplace+importance"}, default "importance"
        How a client computes its tilted moments: importance sampling from a Laplace-based
        proposal (with control variates), the Laplace approximation alone (deterministic and
        fastest, but it matches modes, not means), or Laplace rounds until EP has converged,
        then importance rounds from there (the importance answer at a fraction of its cost).
    """

    _constraints = {
        "family": OneOf(*BAYES_LINKS),
        **_COMMON,
        "prior_scale": Real(0, closed=(False, True)),
        "intercept_scale": Real(0, closed=(False, True)),
    }

    prior_scale: float = 2.5
    intercept_scale: float = 10.0

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> BayesianGLMResult:
        """Fit by federated EP; returns a :class:`BayesianGLMResult`. ``batched``: one
        vectorised tilted-moment call for all clients (False: one per client, as on Flower)."""
        seed = run.seed
        fam, roles, design, scaling, n_rows, ybar, y_sd = self._setup(data, seed)
        p = len(design.names)
        site = SharedSite(fam.name, fam.link.name, float(self.alpha), p, n_pad(max(n_rows.values())))
        s = self.prior_scale * (y_sd if fam.name == "gaussian" else 1.0)
        mean, sd = np.zeros(p), np.full(p, s)
        if self.fit_intercept:
            mean[0], sd[0] = _intercept_mean(fam, ybar), self.intercept_scale * (y_sd if fam.name == "gaussian" else 1)
        if fam.name in DISPERSION:
            mean = np.r_[mean, np.log(y_sd) if fam.name == "gaussian" else 0.0]
            sd = np.r_[sd, 1.0 if fam.name == "gaussian" else 2.0]
        alg, out, history = self._run_ep(site, NaturalGaussian.from_moments(mean, np.diag(sd**2)), design, run)
        return BayesianGLMResult(**self._fitted(fam, design, roles, n_rows, out, history, scaling, seed))


class _GLMPosteriorMixin(PointwiseLikelihood):
    """Predictions on the response scale from draws of the coefficients, and the rows'
    pointwise log-likelihood (:mod:`fedstats.inference.elpd`); with the attributes both
    Bayesian GLM results are given by their fit (keyword arguments)."""

    model: str
    family: str
    link: str
    alpha: float
    names: list[str]
    predictors: list[str]
    roles: dict[str, str | None]
    fit_intercept: bool
    clients: list[Hashable]
    n_obs: dict[Hashable, int]
    q: tuple[np.ndarray, np.ndarray]  # natural parameters (r, Q) of q on the standardised scale
    scaling: LinearScaling | None
    history: History
    rounds: int
    converged: bool
    communication: Communication
    seed: int
    seconds: float

    def _coefficient_draws(self, client: Hashable, i: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def ratios(self, level: float = 0.95) -> pd.DataFrame:
        """The shared coefficients (``HierarchicalGLM``: their population means ``mu``) on the
        ratio scale: odds ratios under the logit link, risk or rate ratios under the log link,
        with their credible intervals (:func:`~fedstats.glm.hypotheses.posterior_ratios`)."""
        table = self.summary(level)  # type: ignore[attr-defined]
        rows = [r for r in table.index if r in self.names or (r.startswith("mu[") and r[3:-1] in self.names)]
        return posterior_ratios(table, rows, self.family, self.link)

    def _loglik_specs(self, data: Any, n: int, seed: int) -> dict[Hashable, dict[str, Any]]:
        """Each client's draws of the coefficients its rows depend on (and the log dispersion),
        with the columns of its predictors and special columns."""
        if self.roles.get("weights") is not None:
            raise ValueError(
                "the pointwise log-likelihood counts rows, and a fit with frequency weights makes a row several "
                "observations: expand the rows (one per unit of weight) to compare such models by LOO or WAIC"
            )
        names = list(data.feature_names)
        missing = [c for c in [*self.predictors, *(v for v in self.roles.values() if v)] if c not in names]
        if missing:
            raise ValueError(f"data lacks the fit's columns {missing}: pass the data the model was fitted to")
        cols = {role: None if col is None else names.index(col) for role, col in self.roles.items()}
        fixed = {"loglik": pointwise_rows, "family": self.family, "link": self.link, "alpha": self.alpha}
        fixed |= {"intercept": self.fit_intercept, "keep": [names.index(p) for p in self.predictors]}
        fixed |= {r: cols.get(r) for r in ("offset", "exposure", "trials")}
        specs = {}
        for i, c in enumerate(self._fitted_clients()):  # type: ignore[attr-defined]
            coef, disp = self._coefficient_draws(c, i, n, seed)
            specs[c] = {**fixed, "coef": coef, "disp": disp}
        return specs

    def _eta_draws(
        self, X: ArrayLike, beta: np.ndarray, offset: ArrayLike | None, exposure: ArrayLike | None
    ) -> np.ndarray:
        X, offset, exposure = frame_rows(self, X, offset, exposure)
        D, off = prediction_rows(X, self.predictors, self.fit_intercept, self.roles, offset, exposure)
        return beta @ D.T + off

    def _prediction(
        self, eta: np.ndarray, disp: np.ndarray, level: float, rng: np.random.Generator, predicted_for: str
    ) -> pd.DataFrame:
        fam = family_of(self.family, self.link, self.alpha)
        mu = fam.fitted(eta)
        a = (1 - level) / 2
        lo, hi = np.quantile(mu, [a, 1 - a], axis=0)
        if fam.name == "binomial":
            y = rng.binomial(1, mu)
        elif fam.name == "poisson":
            y = rng.poisson(mu)
        elif fam.name == "negative_binomial":
            y = rng.negative_binomial(1 / self.alpha, 1 / (1 + self.alpha * mu))
        elif fam.name == "gaussian":
            y = mu + np.exp(disp)[:, None] * rng.standard_normal(mu.shape)
        else:
            k = np.exp(disp)[:, None]
            y = rng.gamma(k, mu / k)
        plo, phi_ = np.quantile(y, [a, 1 - a], axis=0)
        return prediction_frame(mu.mean(axis=0), lo, hi, plo, phi_, predicted_for=predicted_for)


@register
class BayesianGLMResult(_GLMPosteriorMixin, FederatedResult):
    """A :class:`BayesianGLM` fit: the Gaussian EP posterior of the shared coefficients (and
    the dispersion), on the data's scale; no per-client parameters."""

    def __init__(self, **state: Any) -> None:
        self.__dict__.update(state)
        self.seconds = 0.0

    @property
    def phi_names(self) -> list[str]:
        return list(self.names) + ([DISPERSION[self.family]] if self.family in DISPERSION else [])

    def _fitted_q(self) -> GaussianPosterior:
        return GaussianPosterior.from_natural(*self.q, names=self.phi_names)

    def global_posterior(self) -> GaussianPosterior:
        """The Gaussian EP posterior of the coefficients (then the log dispersion) on the data's
        scale (an exact affine map of the standardised fit)."""
        q = self._fitted_q()
        if self.scaling is None:
            return q
        A, c = self.scaling.coef_map()
        k = q.dim - len(c)
        A = np.block([[A, np.zeros((len(c), k))], [np.zeros((k, len(c))), np.eye(k)]])
        return q.affine(A, np.r_[c, np.zeros(k)], names=self.phi_names)

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        return no_p_value(self.global_posterior().summary(level=level, kind=kind), "log_")

    def _coefficient_draws(self, client: Hashable, i: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        # the shared coefficients: the same draws at every client
        draws = self.global_posterior().sample(n, seed=stream(seed))
        p = len(self.names)
        return draws[:, :p], (draws[:, p] if draws.shape[1] > p else None)

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        # the coefficients are shared by every client: a client has none of its own
        return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))

    def _no_posterior(self, what: str) -> str:
        return f"BayesianGLM has no {what} posterior: its coefficients are shared (HierarchicalGLM has per-client ones)"

    def predict(
        self,
        X: ArrayLike,
        client: Hashable | None = None,
        *,
        level: float = 0.95,
        offset: ArrayLike | None = None,
        exposure: ArrayLike | None = None,
        n: int = 4000,
        seed: int = 0,
    ) -> pd.DataFrame:
        """Mean response (probabilities, rates, ...) with its credible band and the predictive
        band of a new observation, from ``n`` seeded posterior draws. ``client`` does not
        change the prediction (shared coefficients)."""
        level = check_level(level)
        if client is not None:
            self._check_client(client)
        rng = np.random.default_rng(seed)
        draws = self.global_posterior().sample(n, seed=rng)
        p = len(self.names)
        eta = self._eta_draws(X, draws[:, :p], offset, exposure)
        disp = draws[:, p] if draws.shape[1] > p else np.zeros(n)
        return self._prediction(eta, disp, level, rng, "client" if client is not None else "new client")


@dataclass(eq=False, repr=False, kw_only=True)
class HierarchicalGLM(_BayesBase):
    """GLM with each client's own coefficients ``theta_k ~ N(mu, diag(tau))``, by federated EP.

    ``phi = (mu, log tau)`` with ``mu ~ N(0, prior_mu_sd^2)``, ``log tau ~ N(0, prior_log_tau_sd^2)``
    (default 1 each) on the standardised scale; the intercept is a coefficient with its own
    random effect. Families: binomial (logit, probit, cloglog), poisson (log), negative
    binomial (log). Other parameters as :class:`BayesianGLM`; the defaults differ: damping
    0.5 (every client's site moves at once from the prior, and the sites of tau interact),
    512 importance draws, and ``tilted="laplace+importance"`` (``benchmarks/glm_hierarchical.py``:
    the importance answer in about half its time).
    ``quadrature``: nodes per coefficient of the adaptive Gauss-Hermite rule that integrates a
    client's coefficients out of its site (lme4's ``nAGQ``); ``"auto"``: 7 for one coefficient, 3
    for two, 1 (Laplace) for more. On 15 clients of 1-20 Bernoulli rows Laplace puts ``log tau``
    0.13-0.17 posterior sd below the exact posterior, 7 nodes 0.03-0.07 (0.01-0.02 at tol 0.01).
    """

    _families = ("binomial", "poisson", "negative_binomial")
    _constraints = {
        "family": OneOf("binomial", "poisson", "negative_binomial"),
        **_COMMON,
        "prior_mu_sd": Real(0, closed=(False, True)),
        "prior_log_tau_sd": Real(0, closed=(False, True)),
        "quadrature": OneOf("auto") | Int(1),
    }

    prior_mu_sd: float = 1.0
    prior_log_tau_sd: float = 1.0
    rounds: int = 30
    damping: float = 0.5
    num_draws: int = 512
    tilted: str = "laplace+importance"
    quadrature: int | str = "auto"

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> HierarchicalGLMResult:
        """Fit by federated EP, then one counted round of client posteriors; returns a
        :class:`HierarchicalGLMResult`. ``batched`` as :meth:`BayesianGLM.fit`."""
        return HierarchicalGLMResult(**self._ep_fit(self._setup(data, run.seed), run))

    def _ep_fit(self, setup: GLMSetup, run: RunOptions) -> dict[str, Any]:
        """The EP rounds and the round of client posteriors on a prepared design: the result's
        state (also the fit of :class:`~fedstats.survival.HierarchicalCox`, whose design
        expands each client's rows into pieces)."""
        seed = run.seed
        fam, roles, design, scaling, n_rows, ybar, _ = setup
        p = len(design.names)
        nodes = AUTO_QUADRATURE.get(p, 1) if self.quadrature == "auto" else int(self.quadrature)
        site = HierarchicalSite(
            fam.name, fam.link.name, float(self.alpha), p, n_pad(max(n_rows.values())), quadrature=nodes
        )
        sd = np.r_[np.full(p, self.prior_mu_sd), np.full(p, self.prior_log_tau_sd)]
        prior = NaturalGaussian.from_moments(np.zeros(2 * p), np.diag(sd**2))
        alg, out, history = self._run_ep(site, prior, design, run)
        sites = alg.committed_sites(out.server_state, out.client_states)
        theta = posterior_round(
            _ClientPosteriors(site, out.server_state.q, sites, int(self.num_draws)),
            design,
            seed=seed,
            batched=run.batched,
            who="HierarchicalGLM",
        )
        return {**self._fitted(fam, design, roles, n_rows, out, history, scaling, seed), "theta": theta}


class _ClientPosteriors(PosteriorRound):
    """One round after EP: each client combines its likelihood with its cavity ``q / site_k``
    (importance draws of phi), and for each draw the Laplace posterior of its coefficients
    given phi; it sends the mean and covariance of that mixture (standardised scale)."""

    def __init__(self, site, q, sites, num_draws):
        super().__init__(site, q, sites)
        self.num_draws = num_draws

    def _tilted(self, means, covs, stats, seeds):
        """Importance draws of every client's tilted at once; a client whose proposal fails
        (a numerically singular cavity covariance) alone, falling back to Laplace draws."""
        est = ImportanceTilted(num_draws=self.num_draws, qmc=True)
        try:
            return est.estimate(self.site, means, covs, stats, seeds, keep_draws=True)
        except (np.linalg.LinAlgError, FloatingPointError):
            out = []
            for k in range(len(stats)):
                args = (self.site, means[k : k + 1], covs[k : k + 1], stats[k : k + 1], seeds[k : k + 1])
                try:
                    out.append(est.estimate(*args, keep_draws=True)[0])
                except (np.linalg.LinAlgError, FloatingPointError):
                    out.append(LaplaceTilted(num_draws=self.num_draws).estimate(*args, keep_draws=True)[0])
            return out

    def client_steps(self, messages, states, datas, rngs):
        """Every participating client at once (in process): one importance call, one
        vectorised pass of Laplace modes over clients and draws."""
        import jax

        from ..inference.tilted.kernels import stack_stats

        p = self.site.p
        stats = [self.site.client_stats(d) for d in datas]
        seeds = np.array([r.integers(2**63 - 1) for r in rngs])
        tilted = self._tilted(*self.cavities(messages, states), stats, seeds)
        m = min(500, self.num_draws)
        phis = []
        for t, r in zip(tilted, rngs):
            phi = t.draws["phi"]
            w = t.weights if t.weights is not None else np.full(len(phi), 1 / len(phi))
            if not np.all(np.isfinite(w)):
                raise FloatingPointError("the importance weights of the client's posterior are not finite")
            phis.append(phi[r.choice(len(phi), size=m, p=w)])
        phis = np.stack(phis)
        with jax.enable_x64(True):
            modes, negH = _theta_modes(self.site)(phis[..., :p], phis[..., p:], stack_stats(stats, len(stats)))
        out = []
        for k in range(len(stats)):
            mk = np.asarray(modes[k])
            cov = np.linalg.inv(np.asarray(negH[k])).mean(axis=0) + np.cov(mk.T, bias=True).reshape(p, p)
            out.append(({"mean": mk.mean(axis=0), "cov": 0.5 * (cov + cov.T)}, states[k]))
        return out


def _theta_modes(site):
    """The Laplace modes of theta over (clients, draws), compiled once per site structure (in
    the estimators' shared cache of kernels)."""
    import jax

    from ..inference.tilted.kernels import KERNELS

    key = ("theta modes", site.cache_key())
    if key not in KERNELS:
        over_draws = jax.vmap(site.theta_mode, in_axes=(0, 0, None))  # one client's draws
        # clients one after another (as the importance weights: each stops when its own draws converge)
        KERNELS[key] = jax.jit(lambda *args: jax.lax.map(lambda a: over_draws(a[0], a[1], site.prepare(a[2])), args))
    return KERNELS[key]


@register
class HierarchicalGLMResult(_GLMPosteriorMixin, FederatedResult):
    """A :class:`HierarchicalGLM` fit: the EP posterior of ``(mu, log tau)`` and every client's
    coefficient posterior (Gaussian), on the data's scale."""

    theta: dict[Hashable, tuple[np.ndarray, np.ndarray]]  # client -> (mean, cov), standardised scale

    def __init__(self, **state: Any) -> None:
        self.__dict__.update(state)
        self.seconds = 0.0

    @property
    def phi_names(self) -> list[str]:
        return [f"mu[{n}]" for n in self.names] + [f"log_tau[{n}]" for n in self.names]

    def _fitted_q(self) -> GaussianPosterior:
        """q(mu, log tau) on the standardised scale the fit ran on."""
        return GaussianPosterior.from_natural(*self.q, names=self.phi_names)

    def global_posterior(self) -> GaussianPosterior | SamplePosterior:
        """q(mu, log tau) on the data's scale: the fitted Gaussian without standardisation,
        else 20,000 seeded draws of it mapped exactly (mu affinely; tau, the population
        variance of each coefficient, as the diagonal of ``A diag(tau) A'``)."""
        q = self._fitted_q()
        if self.scaling is None:
            return q
        p = len(self.names)
        A, c = self.scaling.coef_map()
        phi = q.sample(20000, seed=streams.stream(self.seed, "scale map"))
        tau = np.exp(phi[:, p:]) @ (A**2).T
        return SamplePosterior(np.column_stack([phi[:, :p] @ A.T + c, np.log(tau)]), names=self.phi_names)

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        g = self.global_posterior()
        return pd.concat(
            [no_p_value(g.summary(level=level, kind=kind), "log_"), log_scale_rows(g, "log_tau", level, "tau")]
        )

    def client_posterior(self, client: Hashable) -> GaussianPosterior:
        """Client ``client``'s coefficients: the Gaussian with the mean and covariance its own
        round sent (its likelihood times its cavity), on the data's scale."""
        self._check_client(client)
        m, C = self.theta[client]
        post = GaussianPosterior(m, C, names=list(self.names))
        if self.scaling is None:
            return post
        A, c = self.scaling.coef_map()
        return post.affine(A, c, names=list(self.names))

    def _coefficient_draws(self, client: Hashable, i: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        # the client's own coefficients (the hierarchical families have no dispersion)
        return self.client_posterior(client).sample(n, seed=stream(seed, i)), None

    def predict(
        self,
        X: ArrayLike,
        client: Hashable | None = None,
        *,
        level: float = 0.95,
        offset: ArrayLike | None = None,
        exposure: ArrayLike | None = None,
        n: int = 4000,
        seed: int = 0,
    ) -> pd.DataFrame:
        """Mean response with its credible band and the predictive band of a new observation,
        from ``n`` seeded draws: of the client's coefficients, or for ``client=None`` (a new
        client) of ``theta ~ N(mu, diag tau)`` with ``(mu, log tau)`` from the posterior."""
        level = check_level(level)
        rng = np.random.default_rng(seed)
        if client is not None:
            self._check_client(client)
            beta = self.client_posterior(client).sample(n, seed=rng)
        else:
            p = len(self.names)
            phi = self._fitted_q().sample(n, seed=rng)
            beta = phi[:, :p] + np.exp(0.5 * phi[:, p:]) * rng.standard_normal((n, p))
            if self.scaling is not None:
                beta = self.scaling.coef_back(beta)
        eta = self._eta_draws(X, beta, offset, exposure)
        return self._prediction(eta, np.zeros(n), level, rng, "client" if client is not None else "new client")
