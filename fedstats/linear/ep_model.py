"""What every linear model fitted by federated EP shares: the fit loop, client views, and a
result with global and client posteriors, predictions and persistence.

A model supplies a *site* (``fedstats.inference.tilted.SiteModel``) that also gives, in
numpy and for a batch of tilted draws ``(phi, z)``:

* ``theta_conditional(phi, z, stats)``: mean and covariance of the client's coefficients
  given them (Gaussian, so client posteriors are Rao-Blackwellised);
* ``noise_variance(phi, z, stats)``: the client's noise variance at each draw.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .. import streams
from ..federation import ClientRelease
from ..federation.scaling import LinearScaling, federated_scaling
from ..fitting import RunOptions
from ..inference.elpd import PointwiseLikelihood, normal_rows, stream
from ..inference.ep import EPClientState, FederatedEP
from ..inference.ep_checks import check_run
from ..inference.gaussian import NaturalGaussian
from ..inference.posterior import GaussianPosterior, SamplePosterior
from ..inference.tilted import TiltedEstimator, TiltedResult
from ..result_file import register
from ..results import FederatedResult, NoPosteriorError, check_level, prediction_frame
from .design import check_design

#: who takes part in each round: a fraction of the clients, a count or a callable
#: ``(round, rng) -> client ids`` (see :func:`fedstats.federation.run`)
ParticipationSpec: TypeAlias = float | Callable[[int, np.random.Generator], Sequence[Hashable]]


def normal_pair(value, name) -> tuple[float, float]:
    """A validated (mean, sd) pair of a normal prior."""
    try:
        m, s = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (mean, sd) pair, got {value!r}") from None
    if not (np.isfinite(m) and np.isfinite(s) and s > 0):
        raise ValueError(f"{name} must have a finite mean and a positive sd, got {value!r}")
    return m, s


class ClientRows:
    """The per-client view of the data the runtime hands to each client step:
    ``(X, y, known noise sd or None)`` with the intercept column prepended if asked, on the
    standardised scale of ``scaling`` when given (each client scales its own rows)."""

    def __init__(self, data, intercept: bool, sigma: dict | None = None, scaling=None):
        self.data, self.intercept, self.sigma, self.scaling = data, intercept, sigma, scaling
        self.clients = list(data.clients)

    def __getitem__(self, client):
        cd = self.data[client]
        X, y = np.asarray(cd.X), np.asarray(cd.y)
        sig = None if self.sigma is None else self.sigma[client]
        if self.scaling is not None:
            X, y = self.scaling.transform_X(X), self.scaling.transform_y(y)
            sig = None if sig is None else sig / self.scaling.y_sd
        X = np.column_stack([np.ones(len(y)), X]) if self.intercept else X
        return (X, y, sig)


def fit_ep(
    result_cls,
    model,
    data,
    site,
    prior: NaturalGaussian,
    est: TiltedEstimator | tuple[TiltedEstimator, ...],
    *,
    names,
    sigma=None,
    damping: float,
    tol: float,
    rounds: int,
    participation,
    run: RunOptions,
    stage_tol: float | None = None,
    stage_rounds: int | None = None,
):
    """Run federated EP for ``site`` on ``data`` and wrap the outcome in ``result_cls``; with
    ``model.standardize`` on the standardised scale (:mod:`fedstats.federation.scaling`), after
    one counted round of federated moments."""
    for stage in est if isinstance(est, tuple) else (est,):
        stage.check_model(site)
    # predictors the data cannot tell apart are named and refused before anything is fitted
    seed = run.seed
    check_design(
        data, data.feature_names, model.fit_intercept, seed=seed, strict=getattr(model, "strict_design", False)
    )
    scaling = federated_scaling(data, model.fit_intercept, seed=seed) if model.standardize else None
    design = ClientRows(data, model.fit_intercept, sigma, scaling)
    alg = LinearEP(
        site,
        prior,
        est,
        damping=damping,
        tol=float(tol),
        stage_tol=stage_tol,
        stage_rounds=stage_rounds,
        names=list(names),
        scaling=scaling,
    )
    t0 = time.perf_counter()
    out = run.run(
        alg, design, kind="EP rounds", rounds=int(rounds), participation=participation, min_rounds=min(2, int(rounds))
    )
    excluded = check_run(out, alg, list(data.clients), int(rounds))
    return result_cls(
        excluded=excluded,
        model=model,
        site=site,
        algorithm=alg,
        feature_names=list(names),
        clients=list(data.clients),
        server=out.server_state,
        client_states=out.client_states,
        history=out.history,
        communication=out.communication,
        converged=out.converged,
        seconds=time.perf_counter() - t0,
        seed=seed,
        run_seed=out.seed,
        scaling=scaling,
        noise_sd=None if sigma is None else {c: float(sigma[c]) for c in data.clients},
    )


@register
@dataclass(frozen=True)
class ClientPosterior:
    """A client's posterior at the end of an EP fit, on the data's scale: its coefficients, its
    noise sd (a float when known or constant, else draws aligned with the coefficients'), and
    the diagnostics of its estimator in the last EP round (``last_round``) and in the run behind
    this posterior (``diagnostics``). What a node computes for its client (:class:`LinearEP`)."""

    coefficients: GaussianPosterior | SamplePosterior
    noise: SamplePosterior | float
    diagnostics: dict
    last_round: dict


def final_tilted_seed(seed: int, index: int) -> int:
    """The seed of client ``index``'s final tilted run (the stream ``final tilted`` of ``index``, :mod:`fedstats.streams`)."""
    return int(streams.stream(seed, "final tilted", index).integers(2**62))


def final_client_posterior(
    site, tilted: TiltedResult, stats, names, scaling: LinearScaling | None, rng: np.random.Generator
) -> tuple[GaussianPosterior | SamplePosterior, SamplePosterior | float]:
    """A client's (coefficients, noise sd) posterior on the data's scale from its final tilted
    result (:func:`coefficient_posterior`, :func:`noise_posterior`)."""
    post = coefficient_posterior(site, tilted, stats, names, rng)
    if scaling is not None:
        A, c = scaling.coef_map()
        post = post.affine(A, c, names=list(post.names))
    return post, noise_posterior(site, tilted, stats, scaling)


def noise_posterior(site, tilted: TiltedResult, stats, scaling: LinearScaling | None) -> SamplePosterior | float:
    """A client's noise sd on the data's scale: a float when it is known (or its draws all
    coincide), else a :class:`SamplePosterior` aligned with the tilted draws (same weights)."""
    s = 1.0 if scaling is None else scaling.y_sd
    if tilted.draws is None:
        return s * float(np.sqrt(site.noise_variance(tilted.mean[None], np.zeros((1, 0)), stats)[0]))
    var = site.noise_variance(tilted.draws["phi"], tilted.draws["z"], stats)
    if np.ptp(var) == 0:
        return s * float(np.sqrt(var[0]))
    return SamplePosterior(s * np.sqrt(var)[:, None], names=["sigma"], weights=tilted.weights)


@register
class LinearEP(FederatedEP):
    """:class:`~fedstats.inference.ep.FederatedEP` for the linear models, whose clients form
    their own posterior where their data are at the end of a run on a remote backend: the
    server sends each the final ``q`` (:meth:`final_message`), the node runs the client's final
    tilted distribution from its cavity and its sufficient statistics and returns a
    :class:`ClientPosterior` (:meth:`client_result`), released or kept on the node by its
    policy. Its statistics (``X'X``, ``X'y``, ``y'y``) never leave it. In process the result
    computes the same posteriors from the final states, with the same seeds."""

    def __init__(self, *args: Any, names: Sequence[str], scaling: LinearScaling | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.names, self.scaling = list(names), scaling

    def final_message(self, server_state: Any, client: Any) -> dict[str, np.ndarray]:
        q = server_state.q
        return {"r": q.r, "Q": q.Q, "accept": np.array(server_state.accept.get(client, 1.0))}

    def client_result(self, message: Any, state: Any, data: Any, index: int, seed: int) -> ClientPosterior:
        committed = self._commit(message, state)
        q = NaturalGaussian(np.asarray(message["r"]), np.asarray(message["Q"]))
        tilted = self.local_tilted(
            q,
            [committed.site],
            [committed.stats],
            [final_tilted_seed(seed, index)],
            resume=[getattr(committed, "tilted_state", None)],
        )[0]
        rng = streams.stream(seed, "client posterior", index)
        coef, noise = final_client_posterior(self.model, tilted, committed.stats, self.names, self.scaling, rng)
        return ClientPosterior(coef, noise, dict(tilted.diagnostics), dict(state.diagnostics))


def coefficient_posterior(site, tilted: TiltedResult, stats, names, rng) -> GaussianPosterior | SamplePosterior:
    """A client's coefficient posterior from its tilted result: exact Gaussian when the
    estimator is exact, else one draw of the Gaussian conditional ``site.theta_conditional``
    per tilted draw (Rao-Blackwellised), with the tilted draws' weights."""
    if tilted.draws is None:  # exact estimator: the site is Gaussian, the coefficients linear in phi
        m, C = site.theta_given_gaussian_mu(tilted.mean, tilted.cov, stats)
        return GaussianPosterior(m, C, names=names)
    theta = tilted.draws.get("theta_draw")  # the sampler's own draws of the conditional, when it kept them
    if theta is None:
        m, V = site.theta_conditional(tilted.draws["phi"], tilted.draws["z"], stats)
        theta = m + np.einsum("mij,mj->mi", np.linalg.cholesky(V), rng.standard_normal(m.shape))
    return SamplePosterior(theta, names=names, weights=tilted.weights)


def design_matrix(X, feature_names, fit_intercept: bool) -> np.ndarray:
    """Validated rows of ``X`` with the intercept column prepended when the model has one."""
    X = np.atleast_2d(np.asarray(X, dtype=float))
    k = len(feature_names) - int(fit_intercept)
    if X.shape[1] != k:
        raise ValueError(f"X has {X.shape[1]} columns, the model was fitted on {k} features")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or inf")
    return np.column_stack([np.ones(len(X)), X]) if fit_intercept else X


def draws_prediction(Xd, mean, theta, sig, level: float, rng, predicted_for: str = "client") -> pd.DataFrame:
    """mean, credible (lower, upper) and predictive (pred_lower, pred_upper) intervals of
    the rows of ``Xd`` from joint draws of coefficients ``theta`` and noise sd ``sig``."""
    mean_draws = theta @ Xd.T  # (n, rows)
    noisy = mean_draws + sig[:, None] * rng.standard_normal(mean_draws.shape)
    a = (1 - level) / 2
    lo, hi = np.quantile(mean_draws, [a, 1 - a], axis=0)
    plo, phi_ = np.quantile(noisy, [a, 1 - a], axis=0)
    return prediction_frame(mean, lo, hi, plo, phi_, predicted_for=predicted_for)


@dataclass(repr=False)
class EPLinearResult(PointwiseLikelihood, FederatedResult):
    """A linear model fitted by federated EP: global and client posteriors, predictions,
    round history and communication. Subclasses name phi's components (``phi_names``)
    and say what a client that took no part in the fit looks like (``_population_draws``)."""

    _transient = {"_client_cache": {}, "_global_cache": {}, "_posterior_cache": {}}

    model: Any
    site: Any
    algorithm: Any
    feature_names: list[str]
    clients: list
    server: Any
    client_states: dict
    history: Any
    communication: Any
    converged: bool
    seconds: float
    seed: int = 0
    #: the EP run's own seed: each client's final tilted distribution and coefficient draws
    #: derive from it, as on a node (``None`` in files written before it was kept: ``seed``)
    run_seed: int | None = None
    excluded: dict = field(default_factory=dict)  # client -> why it is not in the fit
    encoding: dict | None = None  # how the fit's columns were encoded (predict reads frames by name)
    scaling: LinearScaling | None = None  # the standardisation the fit ran on (None: the data's own scale)
    noise_sd: dict | None = None  # the known noise sd of each client (data scale), if given
    _client_cache: dict = field(default_factory=dict, repr=False)
    _global_cache: dict = field(default_factory=dict, repr=False)
    _posterior_cache: dict = field(
        default_factory=dict, repr=False
    )  # client -> its posterior (seeded: the same every call)

    @property
    def phi_names(self) -> list[str]:
        raise NotImplementedError

    @property
    def _client_seed(self) -> int:
        """The seed the clients' posteriors derive from (the EP run's, as on a node)."""
        return self.seed if self.run_seed is None else self.run_seed

    def _q(self) -> GaussianPosterior:
        """The Gaussian EP approximation q(phi) on the scale the fit ran on."""
        return GaussianPosterior.from_natural(self.server.q.r, self.server.q.Q, names=self.phi_names)

    def global_posterior(self) -> GaussianPosterior | SamplePosterior:
        """Posterior of the global parameters on the data's own scale: the Gaussian EP
        approximation q(phi) itself without standardisation, else its exact transformation
        (a Gaussian where the map is affine, seeded transformed draws where it is not)."""
        if self.scaling is None:
            return self._q()
        if "q" not in self._global_cache:
            self._global_cache["q"] = self._global_original()
        return self._global_cache["q"]

    def _global_original(self) -> GaussianPosterior | SamplePosterior:
        raise NotImplementedError

    @property
    def rounds(self) -> int:
        return len(self.history)

    # -------------------------------------------------------------- clients
    def _client_results(self) -> dict[Any, TiltedResult]:
        """Each client's tilted distribution at the final q, from its cavity and its final
        state (in-process; on Flower from the state each client returned at the end of the fit)."""
        if not self._client_cache:
            alg = self.algorithm
            here = [c for c in self._fitted_clients() if isinstance(self.client_states[c], EPClientState)]
            if not here:
                return self._client_cache
            sites = alg.committed_sites(self.server, {c: self.client_states[c] for c in here})
            res = alg.local_tilted(
                self.server.q,
                [sites[c] for c in here],
                [self.client_states[c].stats for c in here],
                [final_tilted_seed(self._client_seed, self.clients.index(c)) for c in here],
                resume=[getattr(self.client_states[c], "tilted_state", None) for c in here],
            )
            self._client_cache.update(zip(here, res))
            bad = [
                c
                for c, r in self._client_cache.items()
                if r.diagnostics.get("rhat_max", 1.0) > 1.05 or r.diagnostics.get("ess_min", np.inf) < 100
            ]
            if bad:
                warnings.warn(
                    f"the sampler behind the client posteriors of {len(bad)} client(s) (e.g. {bad[:3]}) "
                    "mixed poorly (R-hat > 1.05 or ESS < 100): see sampler_diagnostics() and raise "
                    "num_samples (or thin) in estimator_options",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self._client_cache

    def sampler_diagnostics(self) -> pd.DataFrame:
        """Diagnostics of every client's tilted estimator (R-hat, ESS, acceptance or
        divergences, whether control variates were used): one row per client for the last
        EP round (``stage="last round"``) and one for the run behind its client posterior
        (``stage="client posterior"``). Empty columns for exact estimators."""
        rows, final = [], []
        for c in self._fitted_clients():
            st = self.client_states[c]
            if isinstance(st, EPClientState):
                rows.append({"client": c, "stage": "last round", **st.diagnostics})
                final.append({"client": c, "stage": "client posterior", **self._client_results()[c].diagnostics})
            elif isinstance(st, ClientRelease) and st.result is not None:
                rows.append({"client": c, "stage": "last round", **st.result.last_round})
                final.append({"client": c, "stage": "client posterior", **st.result.diagnostics})
        return pd.DataFrame(rows + final)

    def _released(self, client: Hashable) -> ClientPosterior | None:
        """The posterior client ``client``'s node computed and released (a fit on Flower);
        ``None`` when its final state is here; :class:`NoPosteriorError` when it stayed on the node."""
        st = self.client_states[client]
        if not isinstance(st, ClientRelease):
            return None
        if st.result is None:
            raise NoPosteriorError(st.unavailable())
        return st.result

    def client_posterior(self, client: Hashable) -> GaussianPosterior | SamplePosterior:
        """Posterior of client ``client``'s coefficients, from its cavity (Section 4.2.1 of the linear-models paper).

        Exact (Gaussian) when the estimator is exact; otherwise a weighted or MCMC sample of
        the coefficients, Rao-Blackwellised over the global and local parameters.
        """
        self._check_client(client)
        released = self._released(client)
        if released is not None:
            return released.coefficients
        if client not in self._posterior_cache:
            # Each client draws its own normals (the seed folds in the client's index).
            rng = streams.stream(self._client_seed, "client posterior", self.clients.index(client))
            post = coefficient_posterior(
                self.site, self._client_results()[client], self.client_states[client].stats, self.feature_names, rng
            )
            self._posterior_cache[client] = self._coef_back(post)
        return self._posterior_cache[client]

    def _coef_back(self, post: GaussianPosterior | SamplePosterior) -> GaussianPosterior | SamplePosterior:
        """A coefficient posterior on the fit's scale -> the data's scale (exact affine map)."""
        if self.scaling is None:
            return post
        A, c = self.scaling.coef_map()
        return post.affine(A, c, names=list(post.names))

    def client_noise(self, client: Hashable) -> SamplePosterior | float:
        """Posterior of client ``client``'s noise sd: a float when it is known, else a
        :class:`SamplePosterior` aligned with the tilted draws (same weights)."""
        self._check_client(client)
        released = self._released(client)
        if released is not None:
            return released.noise
        return noise_posterior(
            self.site, self._client_results()[client], self.client_states[client].stats, self.scaling
        )

    def _loglik_specs(self, data: Any, n: int, seed: int) -> dict[Hashable, dict[str, Any]]:
        """Each client's joint draws of its coefficients and noise sd (:mod:`fedstats.inference.elpd`)."""
        specs = {}
        for i, c in enumerate(self._fitted_clients()):
            coef, sigma = self._joint_draws(c, n, stream(seed, i))
            intercept = coef.shape[1] == data[c].X.shape[1] + 1
            specs[c] = {"loglik": normal_rows, "coef": coef, "sigma": sigma, "intercept": intercept}
        return specs

    def _joint_draws(self, client: Hashable, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` joint draws of (coefficients, noise sd) from the client's posterior:
        resampled by the importance weights, each with the noise of the same tilted draw."""
        post, noise = self.client_posterior(client), self.client_noise(client)
        if isinstance(post, GaussianPosterior):
            return post.sample(n, seed=rng), np.full(n, noise)
        w = post.weights
        idx = rng.integers(0, post.n_draws, size=n) if w is None else rng.choice(post.n_draws, size=n, p=w)
        sig = noise.draws[idx, 0] if isinstance(noise, SamplePosterior) else np.full(n, noise)
        return post.draws[idx], sig

    def _population_draws(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(coefficients, noise sd) of a client that took no part in the fit."""
        raise NotImplementedError

    # -------------------------------------------------------------- prediction
    def _design(self, X: ArrayLike) -> np.ndarray:
        X = self._feature_rows(X, self.feature_names[int(self.model.fit_intercept) :])
        return design_matrix(X, self.feature_names, self.model.fit_intercept)

    def predict(
        self, X: ArrayLike, client: Hashable | None = None, *, level: float = 0.95, n: int = 4000, seed: int = 0
    ) -> pd.DataFrame:
        """Predictions for the rows of ``X``: a data frame (read by column name, categories
        encoded as in the fit) or an array of the features in the fit's order.

        With ``client`` one of the fitted clients, its posterior is used; with
        ``client=None``, the population-level predictive of a new client
        (``attrs["predicted_for"]`` says which). A client name the fit has not seen is
        refused (:class:`~fedstats.results.UnknownClientError`). Columns: mean, lower, upper
        (credible interval of the mean response), pred_lower, pred_upper (predictive
        interval, noise included), from ``n`` joint draws.
        """
        level = check_level(level)
        Xd = self._design(X)
        rng = np.random.default_rng(seed)
        if client is not None:
            self._check_client(client)
            mean = Xd @ self.client_posterior(client).mean
            theta, sig = self._joint_draws(client, n, rng)
        else:
            theta, sig = self._population_draws(n, rng)
            mean = Xd @ theta.mean(axis=0)
        return draws_prediction(Xd, mean, theta, sig, level, rng, "client" if client is not None else "new client")
