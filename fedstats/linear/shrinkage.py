"""Federated Bayesian lasso and ridge with variable selection and posterior tests (Section 4.3
of the linear-models paper).

Each client has its own coefficients beta_k with i.i.d. shrinkage priors whose strength
lambda (and, by default, the noise variance sigma^2) is shared: ``phi = (log lambda,
log sigma^2)`` is fitted by federated EP, and each client's posterior of beta_k comes from
its cavity. Predictor i is selected on client k when its credible interval excludes 0.

>>> import numpy as np
>>> from fedstats import FederatedData
>>> from fedstats.linear import BayesianRidge
>>> rng = np.random.default_rng(0)
>>> Xs = [rng.normal(size=(60, 3)) for _ in range(3)]
>>> ys = [X @ [2.0, 0.0, -1.0] + 0.3 * rng.normal(size=60) for X in Xs]
>>> res = BayesianRidge().fit(FederatedData.from_arrays(Xs, ys), seed=0, progress=False)
>>> res.selected(0.9).groupby("parameter")["selected"].sum().to_dict()
{'x0': 3, 'x1': 0, 'x2': 3}
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .._deprecation import renamed_value
from ..data import DataLike, FederatedData, as_federated
from ..estimator import BOOL, MAPPING, NONE, Constraint, Estimator, Int, OneOf, Pair, Real, subclass_init
from ..federation.oneshot import one_shot
from ..federation.protocol import client_function
from ..fitting import RunOptions, federated_fit, fit_rounds
from ..inference.gaussian import NaturalGaussian
from ..inference.posterior import GaussianPosterior, SamplePosterior
from ..inference.posterior.tables import log_scale_rows, no_p_value
from ..inference.tilted import LaplaceTilted, TiltedEstimator, make_estimator
from ..result_file import register
from ..results import FederatedResult, NoPosteriorError, check_level
from ._selection import _Selection
from ._shrinkage_site import ShrinkageSite
from .ep_model import EPLinearResult, ParticipationSpec, design_matrix, draws_prediction, fit_ep, normal_pair


@register
class BayesianShrinkage(Estimator):
    """Hierarchical shrinkage regression (Bayesian lasso or ridge) fitted by federated EP.

    Parameters
    ----------
    penalty : {"lasso", "ridge"}
        Laplace(0, b) or N(0, sigma^2 / lambda) priors on each penalised coefficient.
    scale : {"sd", "variance"}
        Lasso scale b = sigma / lambda (Park-Casella, default) or sigma^2 / lambda (the
        journal version of the paper).
    noise : {"shared", "client"}
        One noise variance sigma^2 in phi (default), or one per client, sampled locally
        with a normal prior on log sigma_k^2 (then phi = log lambda and the lasso scale
        uses sigma_k).
    fit_intercept : bool
        An unpenalised per-client intercept with a N(0, intercept_sd^2) prior.
    prior_log_lambda, prior_log_sigma2 : (mean, sd)
        Normal priors on log lambda and log sigma^2 (LogNormal(0, 1) by default).
    estimator : str or TiltedEstimator
        ``"auto"``: Metropolis-within-Gibbs for the lasso (:class:`~fedstats.inference.tilted.GibbsTilted`:
        exact conditionals for the coefficients and scales, Metropolis for phi, 4 chains;
        faster than NUTS on the same collapsed target, with the same moments); with 16 or
        more predictors after a warm-up stage of Laplace rounds (cheap and deterministic;
        at most ``rounds // 3`` and 8 rounds, ended once no global mean moves by 0.5 sd)
        that brings EP near its fixed point, which the Gibbs rounds then reach (a Gibbs
        round's cost grows with the cube of the predictors, the Laplace kernel's
        compilation, about 1.5 s, does not: Table 2's Case III, 30 predictors, 45 s -> 15 s;
        Case I, 8 predictors, would take 1 s longer). Importance sampling for the ridge
        (whose coefficients integrate out exactly).
        ``"nuts"`` samples the collapsed target with NUTS.
    estimator_options : dict
        Passed to the estimator when given by name.
    damping, rounds, tol, participation
        As in :class:`fedstats.linear.HierarchicalLinearModel`. Damping 0.5 leaves a residual
        about equal to the last round's change, hence ``tol = 0.05`` by default.
    standardize : bool, default True
        Fit on predictors and target standardised with federated moments (one counted round
        of per-client sums; 0/1 predictors keep their coding) and report every output on the
        data's own scale (:mod:`fedstats.federation.scaling`). The priors then act on the
        standardised scale: ``lambda`` penalises standardised coefficients (and is reported
        as such), ``intercept_sd`` and the prior of ``log sigma^2`` are in standardised
        units; ``sigma2`` is reported on the data's scale. ``False``: fit the data as given,
        so that the priors act on its own units.
    """

    def __init__(
        self,
        penalty: str = "lasso",
        *,
        scale: str = "sd",
        noise: str = "shared",
        fit_intercept: bool = True,
        intercept_sd: float = 10.0,
        prior_log_lambda: tuple[float, float] = (0.0, 1.0),
        prior_log_sigma2: tuple[float, float] = (0.0, 1.0),
        estimator: str | TiltedEstimator = "auto",
        estimator_options: Mapping[str, Any] | None = None,
        damping: float = 0.5,
        rounds: int = 25,
        tol: float = 0.05,
        participation: ParticipationSpec = 1.0,
        standardize: bool = True,
    ) -> None:
        self.penalty, self.scale = penalty, scale
        self.noise = renamed_value("noise", noise, {"device": "client"})
        self.fit_intercept, self.intercept_sd = fit_intercept, intercept_sd
        self.prior_log_lambda, self.prior_log_sigma2 = prior_log_lambda, prior_log_sigma2
        self.estimator, self.estimator_options = estimator, estimator_options
        self.damping, self.rounds, self.tol, self.participation = damping, rounds, tol, participation
        self.standardize = standardize

    def __repr__(self) -> str:
        return f"{type(self).__name__}(penalty={self.penalty!r}, scale={self.scale!r}, noise={self.noise!r})"

    # ------------------------------------------------------------------ set-up
    def _site(self, d: int) -> ShrinkageSite:
        if not (np.isfinite(self.intercept_sd) and self.intercept_sd > 0):
            raise ValueError(f"intercept_sd must be positive, got {self.intercept_sd}")
        return ShrinkageSite(
            d=d,
            penalty=self.penalty,
            scale=self.scale,
            noise=self.noise,
            intercept=self.fit_intercept,
            intercept_sd=float(self.intercept_sd),
            log_sigma2_prior=normal_pair(self.prior_log_sigma2, "prior_log_sigma2"),
        )

    def _prior(self, site: ShrinkageSite) -> NaturalGaussian:
        pairs = [normal_pair(self.prior_log_lambda, "prior_log_lambda")]
        if site.noise == "shared":
            pairs.append(normal_pair(self.prior_log_sigma2, "prior_log_sigma2"))
        m, s = np.array(pairs).T
        return NaturalGaussian.from_moments(m, np.diag(s**2))

    #: the lasso's Laplace warm-up stage ("auto"): from this many predictors; ends when no
    #: global mean moves by WARMUP_TOL sd
    WARMUP_MIN_PREDICTORS, WARMUP_TOL = 16, 0.5

    def _warmup_rounds(self, site: ShrinkageSite, rounds: int) -> int:
        """Rounds of the Laplace warm-up stage (0: none) of a fit of at most ``rounds``."""
        if self.estimator != "auto" or site.penalty != "lasso" or site.d < self.WARMUP_MIN_PREDICTORS:
            return 0
        return min(8, rounds // 3)

    def _estimator(self, site: ShrinkageSite) -> TiltedEstimator:
        spec, opts = self.estimator, dict(self.estimator_options or {})
        if spec == "auto":
            spec = "gibbs" if site.penalty == "lasso" else "importance"
        if spec == "exact":
            raise ValueError("the shrinkage model has no exact Gaussian site; use 'nuts' or 'importance'")
        if spec == "nuts":
            opts.setdefault("target", "collapsed")
            opts.setdefault("vectorize", "chains")  # per-client trajectories differ widely in length
            if opts["target"] != "collapsed":
                raise ValueError("the shrinkage model is sampled on its collapsed target (target='collapsed')")
        if spec in ("importance", "laplace") and site.penalty == "lasso":
            raise ValueError(f"estimator {spec!r} is not reliable for the lasso's {site.d} local scales; use 'nuts'")
        return make_estimator(spec, **opts)

    #: predictors that no client's data can tell apart are refused, not only warned about:
    #: selecting between them would be meaningless (:mod:`fedstats.linear.design`)
    strict_design = True

    _constraints = {
        "penalty": OneOf("lasso", "ridge"),
        "scale": OneOf("sd", "variance"),
        "noise": OneOf("shared", "client"),
        "fit_intercept": BOOL,
        "intercept_sd": Real(0, closed=(False, True)),
        "prior_log_lambda": Pair(),
        "prior_log_sigma2": Pair(),
        "estimator": Constraint(lambda v: isinstance(v, str) or hasattr(v, "estimate"), "a name or a TiltedEstimator"),
        "estimator_options": NONE | MAPPING,
        "damping": Real(0, 1, closed=(False, True)),
        "rounds": Int(1),
        "tol": Real(0),
        "participation": Real(0, 1, closed=(False, True)) | Int(1) | Constraint(callable, "a callable"),
        "standardize": BOOL,
    }

    def _check(self, data: FederatedData) -> list[str]:
        from ..data import require_target

        self._validate_params()
        require_target(data, type(self).__name__)
        _check_design(data)
        return (["intercept"] if self.fit_intercept else []) + list(data.feature_names)

    # ------------------------------------------------------------------ fit
    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions, *, rounds: int | None = None) -> ShrinkageResult:
        """Fit by federated EP; returns a :class:`ShrinkageResult`. Raw rows stay on their
        client, which shares only the changes of its EP site for (log lambda, log sigma^2).
        ``rounds`` here is deprecated: set it on the model (its one home)."""
        names = self._check(data)
        site = self._site(len(names) - int(self.fit_intercept))
        rounds = fit_rounds(self, rounds)
        est, warmup = self._estimator(site), self._warmup_rounds(site, rounds)
        return fit_ep(
            ShrinkageResult,
            self,
            data,
            site,
            self._prior(site),
            (LaplaceTilted(), est) if warmup else est,
            names=names,
            damping=float(self.damping),
            tol=self.tol,
            stage_tol=self.WARMUP_TOL,
            stage_rounds=warmup or None,
            rounds=rounds,
            participation=self.participation,
            run=run,
        )

    def fit_centralized(
        self,
        data: DataLike,
        *,
        seed: int = 0,
        num_warmup: int = 1000,
        num_samples: int = 2000,
        num_chains: int = 4,
        per_client: bool = False,
    ) -> CentralizedShrinkageResult:
        """The same Bayesian prior on the pooled rows, by NumPyro NUTS with the Laplace or
        normal prior written directly (not the scale mixture): a reference for tests,
        notebooks and benchmarks, not a federated method.

        ``per_client=False`` (the paper's centralised comparison): one coefficient vector
        and one intercept for all rows. ``per_client=True``: the federated model itself, one
        coefficient vector and intercept per client with (lambda, sigma^2) shared, which is
        the exact posterior that federated EP approximates.
        """
        data = as_federated(data)
        names = self._check(data)
        if self.noise != "shared":
            raise ValueError("the centralised reference pools all rows: use noise='shared'")
        from .shrinkage_pooled import pooled_nuts

        return pooled_nuts(
            self,
            data,
            names,
            seed=seed,
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            per_client=bool(per_client),
        )


@register
class BayesianLasso(BayesianShrinkage):
    """Federated Bayesian lasso: :class:`BayesianShrinkage` with ``penalty="lasso"``."""

    __init__ = subclass_init(BayesianShrinkage, {"penalty": "lasso"})


@register
class BayesianRidge(BayesianShrinkage):
    """Federated Bayesian ridge: :class:`BayesianShrinkage` with ``penalty="ridge"``."""

    __init__ = subclass_init(BayesianShrinkage, {"penalty": "ridge"})


@client_function
def _design_report(msg, X, rng, _private=None):
    """Client side of the design check: row count, constant columns, centred rank and the
    number of varying columns (a few integers; never a row)."""
    n, d = X.shape
    const = np.ptp(X, axis=0) == 0 if n > 1 else np.zeros(d, bool)
    rank = np.linalg.matrix_rank(X - X.mean(axis=0)) if n else 0
    return {
        "n": np.array([n]),
        "const": const.astype(np.int8),
        "rank": np.array([rank]),
        "varying": np.array([int(np.sum(np.ptp(X, axis=0) > 0)) if n else 0]),
    }


def _check_design(data: FederatedData) -> None:
    """Warn about weak designs, client by client. Each client reports a few integers about its
    design in one federated round (predictors the data cannot tell apart at all, or within
    every client, are refused by the models' shared design check, :mod:`fedstats.linear.design`).

    The replies stay per client (no sum over clients would do): every check is a statement
    about one client, which the warnings name (its constant columns, its few rows, its
    dependent columns: ``rank < varying`` at that client)."""
    import warnings

    d = data.n_features
    reps, _ = one_shot(
        data, ("n", "const", "rank", "varying"), {}, _design_report, seed=0, what="the per-client design report"
    )
    for c in reps:  # the clients that answered (one that failed has dropped out of the fit)
        n = int(reps[c]["n"][0])
        const = [data.feature_names[j] for j in np.flatnonzero(reps[c]["const"])]
        if const:
            warnings.warn(
                f"client {c!r}: predictor(s) {const[:5]} are constant; the prior alone decides "
                "their coefficients at this site (their intervals reflect shrinkage, not data)",
                RuntimeWarning,
                stacklevel=4,
            )
        if n < d + 1:
            warnings.warn(
                f"client {c!r} has {n} rows for {d} predictors: its coefficients are identified "
                "only through the shrinkage prior",
                RuntimeWarning,
                stacklevel=4,
            )

    # (a constant column is reported above; here only dependence among the varying ones)
    ranks = {c: int(reps[c]["rank"][0]) for c in reps}
    deficient = [c for c, r in ranks.items() if r < int(reps[c]["varying"][0]) and data.n_obs[c] > d]
    if deficient:
        warnings.warn(
            f"client(s) {deficient[:5]}: predictors are linearly dependent there; their split of the "
            "effect between those columns is decided by the prior",
            RuntimeWarning,
            stacklevel=4,
        )


@register
@dataclass(repr=False)
class ShrinkageResult(_Selection, EPLinearResult):
    """A fitted federated lasso or ridge (see :class:`EPLinearResult` for the common API)."""

    @property
    def phi_names(self) -> list[str]:
        return ["log_lambda", "log_sigma2"] if self.site.noise == "shared" else ["log_lambda"]

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        return _scale_rows(self.global_posterior(), level, kind)

    def _population_draws(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        phi = self._q().sample(n, seed=rng)
        theta, sig = self.site.prior_draws(phi, rng)
        if self.scaling is None:
            return theta, sig
        return self.scaling.coef_back(theta), sig * self.scaling.y_sd

    def _global_original(self) -> GaussianPosterior:
        """q(log lambda, log sigma^2) with sigma^2 on the data's scale (log sigma^2 + 2 log s_y,
        an affine map: still Gaussian); lambda penalises the standardised coefficients."""
        assert self.scaling is not None  # called by global_posterior only with a scaling
        return sigma2_back(self._q(), self.scaling.y_sd)

    def predict_selected(self, X: ArrayLike, client: Hashable, level: float = 0.9) -> np.ndarray:
        """Point predictions with the posterior means of the selected predictors and the
        excluded ones set to 0 (the linear-models paper's rule, Section 6.1; the intercept is always kept)."""
        return _predict_selected(self, X, client, level)


_Post = TypeVar("_Post", GaussianPosterior, SamplePosterior)


def sigma2_back(g: _Post, y_sd: float) -> _Post:
    """``g`` over (log lambda[, log sigma^2]) with log sigma^2 shifted by ``2 log y_sd``."""
    b = np.array([2 * np.log(y_sd) if n == "log_sigma2" else 0.0 for n in g.names])
    return g.affine(np.eye(g.dim), b, names=list(g.names))


def _scale_rows(g: GaussianPosterior | SamplePosterior, level: float, kind: str) -> pd.DataFrame:
    """log lambda (and log sigma^2), then lambda (sigma^2) on their own scale. ``p_value`` is
    NaN throughout: these are scale parameters, with no null value to test."""
    out = [no_p_value(g.summary(level=level, kind=kind), "log_"), log_scale_rows(g, "log_lambda", level, "lambda")]
    if "log_sigma2" in g.names:
        out.append(log_scale_rows(g, "log_sigma2", level, "sigma2"))
    return pd.concat(out)


def _predict_selected(
    res: ShrinkageResult | CentralizedShrinkageResult, X: ArrayLike, client: Hashable, level: float
) -> np.ndarray:
    Xd = res._design(X)
    post = res.client_posterior(client)
    lo, hi = post.credible_interval(level)
    keep = (lo > 0) | (hi < 0) | (np.array(post.names) == "intercept")
    return Xd @ np.where(keep, post.mean, 0.0)


# ---------------------------------------------------------------------------- centralised reference
@register
@dataclass(repr=False)
class CentralizedShrinkageResult(_Selection, FederatedResult):
    """The fit on pooled rows, by NUTS, with the result API of the federated fit.

    ``beta`` maps ``"pooled"`` to the one coefficient posterior of the pooled model (then
    ``client_posterior(c)`` returns it for every fitted client), or each client to its own
    posterior (``per_client=True``).
    """

    model: BayesianShrinkage
    feature_names: list[str]
    fitted_clients: list
    beta: dict
    phi: SamplePosterior
    sigma: np.ndarray
    diagnostics: dict
    seconds: float
    scaling: Any = None  # the standardisation of the fit (outputs are on the data's scale)
    # the facts of the result contract for one NUTS run on pooled rows: no rounds, nothing
    # exchanged; "converged" means every R-hat is below 1.05
    history = None
    communication = None
    rounds = 0

    @property
    def converged(self) -> bool:
        return bool(self.diagnostics.get("rhat_max", np.inf) < 1.05)

    @property
    def clients(self) -> list:
        return list(self.beta)

    def global_posterior(self) -> SamplePosterior:
        """NUTS draws of (log lambda, log sigma^2)."""
        return self.phi

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        return _scale_rows(self.phi, level, kind)

    def _check_client(self, client: Hashable) -> None:
        if client not in self.beta and not ("pooled" in self.beta and client in self.fitted_clients):
            super()._check_client(client)

    def client_posterior(self, client: Hashable = "pooled") -> SamplePosterior:
        """The coefficients' draws of ``client`` (``"pooled"``, or any fitted client, for the
        one pooled posterior; each client's own with ``per_client=True``)."""
        self._check_client(client)
        return self.beta[client] if client in self.beta else self.beta["pooled"]

    def _design(self, X: ArrayLike) -> np.ndarray:
        X = self._feature_rows(X, self.feature_names[int(self.model.fit_intercept) :])
        return design_matrix(X, self.feature_names, self.model.fit_intercept)

    def predict(
        self, X: ArrayLike, client: Hashable | None = "pooled", *, level: float = 0.95, n: int = 4000, seed: int = 0
    ) -> pd.DataFrame:
        """As :meth:`EPLinearResult.predict`, from ``client``'s posterior (the pooled one
        unless the fit was per client). ``client=None`` (a new client) uses the pooled
        posterior; with ``per_client=True`` a new client has none and is refused."""
        level = check_level(level)
        Xd = self._design(X)
        if client is None:
            if "pooled" not in self.beta:
                raise NoPosteriorError(
                    "a per-client centralised fit has no posterior for a new client: give a "
                    "fitted client, or fit with per_client=False"
                )
            post, what = self.beta["pooled"], "new client"
        else:
            post, what = self.client_posterior(client), "client"
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, post.n_draws, size=n)
        return draws_prediction(Xd, Xd @ post.mean, post.draws[idx], self.sigma[idx], level, rng, what)

    def predict_selected(self, X: ArrayLike, client: Hashable = "pooled", level: float = 0.9) -> np.ndarray:
        return _predict_selected(self, X, client, level)
