"""Your own likelihood, fitted across clients by federated EP: :func:`federated_ep`.

Write one client's model as a NumPyro function ``model(X, y)`` that samples the global
parameters by name and observes ``y`` in *one* site with one entry per row, for example a
robust regression with a shared degrees-of-freedom parameter::

    def student_t(X, y=None):
        beta = numpyro.sample("beta", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
        log_sigma = numpyro.sample("log_sigma", dist.Normal(0, 1))
        log_nu = numpyro.sample("log_nu", dist.Normal(2, 1))
        numpyro.sample("y", dist.StudentT(jnp.exp(log_nu), X @ beta, jnp.exp(log_sigma)), obs=y)

Global parameters are real-valued (EP's approximation is Gaussian): put a positive one on
the log scale, as ``log_nu`` above. Their prior is the Gaussian ``prior={name: (mean, sd)}``
given to :func:`federated_ep` (the distributions written in the model only fix their names
and shapes). Every client's site is its rows' log-likelihood, with tilted moments by
Laplace-corrected importance sampling (or NUTS, or Laplace alone: ``tilted=``); rows are
padded to a common length (padding masked out) so that one compiled kernel serves every
client, and are rebuilt from the client's data at every step, never kept in its EP state.

*Local latent variables*: with ``global_sites=[...]`` every other latent site of the model is
the client's own (for example a random intercept ``b ~ N(0, exp(log_sd))`` with ``log_sd``
global). Its prior is the distribution written in the model (which may depend on the global
parameters), its values are real, with a shape that does not depend on the client's number
of rows, and it is integrated out inside the client's tilted distribution; after the fit one
more counted round gives each client's posterior of its own latents (``client_posterior``).

The fit runs in process only (a Flower node loads code from trusted packages only, and the
model is your function). :func:`fedstats.reference.custom.pooled_nuts` samples the same model with every row pooled
(and every client's local latents), the reference to check a federated fit against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from ..data.validation import ClientId
from ..result_file import register
from ..results import FederatedResult, NoPosteriorError
from .ep import PosteriorRound
from .gaussian import NaturalGaussian
from .posterior import GaussianPosterior

if TYPE_CHECKING:
    import pandas as pd

    from ..data import DataLike
    from .tilted import TiltedEstimator

__all__ = ["federated_ep", "CustomEPResult"]


def _latent_sites(model, X, y) -> dict[str, tuple]:
    """Names and shapes of the model's latent sample sites, from one trace; checks that y is
    observed in exactly one site and that every latent site is real-valued."""
    import jax
    from numpyro import handlers
    from numpyro.distributions import constraints

    with handlers.seed(rng_seed=0):
        tr = handlers.trace(model).get_trace(X, y)
    obs = [n for n, s in tr.items() if s["type"] == "sample" and s["is_observed"]]
    if len(obs) != 1:
        raise ValueError(f"the model must observe y in exactly one sample site, it observes {obs}")
    latent = {n: s for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}
    for n, site in latent.items():
        support = site["fn"].support
        while isinstance(support, constraints.independent):
            support = support.base_constraint
        if support is not constraints.real:
            raise ValueError(
                f"latent site {n!r} must be real-valued (EP's approximation is Gaussian): put a "
                f"positive one on the log scale"
            )
    return {n: tuple(jax.numpy.shape(s["value"])) for n, s in latent.items()}


def split_sites(model, X, y, n_pad, global_sites):
    """(global shapes, local shapes) of the model's latent sites; local shapes must not
    change with the number of rows (traced at the client's rows and at ``n_pad`` rows)."""
    shapes = _latent_sites(model, X, y)
    if not shapes:
        raise ValueError("the model samples no latent parameter")
    names = list(shapes) if global_sites is None else list(global_sites)
    unknown = [n for n in names if n not in shapes]
    if unknown:
        raise ValueError(f"global_sites {unknown} are not latent sample sites of the model; it has {list(shapes)}")
    if not names:
        raise ValueError("global_sites= names no site: EP needs at least one global parameter")
    padded = _latent_sites(model, np.resize(X, (n_pad, *np.shape(X)[1:])), np.resize(y, n_pad))
    per_row = [n for n in shapes if padded[n] != shapes[n]]
    if per_row:
        raise ValueError(
            f"latent site(s) {per_row} have one value per row: only global parameters and per-client "
            f"latents (a shape that does not depend on the rows) are supported"
        )
    return ({n: shapes[n] for n in names}, {n: sh for n, sh in shapes.items() if n not in names})


def _names(shapes) -> list[str]:
    out = []
    for n, sh in shapes.items():
        size = int(np.prod(sh)) if sh else 1
        out += [n] if not sh else [f"{n}[{i}]" for i in range(size)]
    return out


def _unflatten(phi, shapes):
    out, i = {}, 0
    for n, sh in shapes.items():
        size = int(np.prod(sh)) if sh else 1
        out[n] = phi[i : i + size].reshape(sh)
        i += size
    return out


def site_size(shapes) -> int:
    return int(sum(int(np.prod(sh)) if sh else 1 for sh in shapes.values()))


def client_logp(model, shapes, local, phi, z, X, y, mask):
    """One client's ``log p(y | phi, z) + log p(z | phi)``: the observed site's per-row
    log-likelihood (rows with ``mask`` 0 left out) and its local latents' prior log density,
    at the global values ``phi`` and local values ``z`` (flat)."""
    import jax.numpy as jnp
    from numpyro import handlers

    params = {**_unflatten(phi, shapes), **_unflatten(z, local)}
    with handlers.block():  # inside a pooled NUTS model the user's sites must stay hidden
        tr = handlers.trace(handlers.substitute(model, data=params)).get_trace(X, y)
    obs = next(s for s in tr.values() if s["type"] == "sample" and s["is_observed"])
    ll = jnp.sum(jnp.where(mask > 0, obs["fn"].log_prob(obs["value"]), 0.0))
    return ll + sum(jnp.sum(tr[n]["fn"].log_prob(tr[n]["value"])) for n in local)


@dataclass(frozen=True, eq=False)
class CustomSite:
    """The EP site of a user model: the log-likelihood of one client's padded rows, its
    local latents (if any) the nuisance ``z`` of the tilted estimators."""

    model: Any
    shapes: dict
    local: dict
    n_pad: int
    d: int

    theta_dim = 0

    @property
    def phi_dim(self) -> int:
        return site_size(self.shapes)

    @property
    def local_dim(self) -> int:
        return site_size(self.local)

    def cache_key(self) -> tuple:
        return ("custom", id(self.model), tuple(self.shapes.items()), tuple(self.local.items()), self.n_pad, self.d)

    def client_stats(self, data) -> dict[str, np.ndarray]:
        X, y = np.asarray(data[0], dtype=float), np.asarray(data[1], dtype=float)
        m = len(y)
        if m > self.n_pad:
            raise ValueError(f"a client has {m} rows, more than the {self.n_pad} the fit was set up for")
        Xp, yp, mask = np.zeros((self.n_pad, self.d)), np.zeros(self.n_pad), np.zeros(self.n_pad)
        Xp[:m], yp[:m], mask[:m] = X, y, 1.0
        yp[m:] = y[0]  # padding: a value inside the outcome's support, masked out
        return {"X": Xp, "y": yp, "mask": mask}

    def init_local(self, stats):
        return np.zeros(0), np.zeros(self.local_dim)

    def log_collapsed(self, phi, z, stats):
        return client_logp(self.model, self.shapes, self.local, phi, z, stats["X"], stats["y"], stats["mask"])


class _Rows:
    """The runtime's view for a custom model: ``[client] -> (X, y)`` (intercept as the user
    put it in X)."""

    def __init__(self, data):
        self.data, self.clients = data, list(data.clients)

    def __getitem__(self, client):
        cd = self.data[client]
        return np.asarray(cd.X), np.asarray(cd.y)


@register
class CustomEPResult(FederatedResult):
    """A user model fitted by :func:`federated_ep`: the Gaussian EP posterior of its global
    parameters (``summary``, ``global_posterior``), each client's posterior of its local
    latents where the model has any (``client_posterior``, ``client_summary``), history and
    communication."""

    names: list[str]
    clients: list[ClientId]
    q: tuple[np.ndarray, np.ndarray]
    local_names: list[str]
    local: dict[ClientId, tuple[np.ndarray, np.ndarray]]

    def __init__(self, **state: Any) -> None:
        state.setdefault("local_names", [])
        state.setdefault("local", {})
        self.__dict__.update(state)
        self.seconds = 0.0

    def global_posterior(self) -> GaussianPosterior:
        return GaussianPosterior.from_natural(*self.q, names=self.names)

    def client_posterior(self, client: ClientId) -> GaussianPosterior:
        """Client ``client``'s local latents: the Gaussian with the mean and covariance its own
        round sent (its tilted distribution at the fitted ``q``)."""
        self._check_client(client)
        if not self.local_names:
            raise NoPosteriorError(self._no_posterior("client"))  # as the base class does
        m, C = self.local[client]
        return GaussianPosterior(np.asarray(m), np.asarray(C), names=list(self.local_names))

    def _client_table(self, client: ClientId, level: float, kind: str) -> pd.DataFrame:
        import pandas as pd

        if self.local_names:
            return super()._client_table(client, level, kind)
        # the parameters are global: a client has none of its own
        return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))

    def _no_posterior(self, what: str) -> str:
        return (
            f"a custom model by federated_ep has no {what} posterior (its parameters are global; name the global "
            f"ones with global_sites= to give clients latents of their own)"
        )


class _LocalPosteriors(PosteriorRound):
    """One round after EP: each client forms its tilted distribution (cavity times its
    likelihood) with draws and sends the weighted mean and covariance of its local latents
    (every participating client in one estimator call)."""

    def __init__(self, site, estimator, q, sites):
        super().__init__(site, q, sites)
        self.estimator = estimator

    def client_steps(self, messages, states, datas, rngs):
        seeds = np.array([r.integers(2**63 - 1) for r in rngs])
        stats = [self.site.client_stats(d) for d in datas]
        out = []
        for t, state in zip(
            self.estimator.estimate(self.site, *self.cavities(messages, states), stats, seeds, keep_draws=True), states
        ):
            z = np.asarray(t.draws["z"])
            w = t.weights if t.weights is not None else np.full(len(z), 1.0 / len(z))
            mean = w @ z
            d = z - mean
            out.append(({"mean": mean, "cov": d.T @ (d * w[:, None])}, state))
        return out


def _estimator(tilted, num_draws):
    from .tilted import ImportanceTilted, LaplaceTilted, NUTSTilted, TiltedEstimator

    if isinstance(tilted, TiltedEstimator):
        return tilted
    options = {
        "importance": lambda: ImportanceTilted(num_draws=num_draws, qmc=True),
        "laplace": lambda: LaplaceTilted(num_draws=num_draws),
        "nuts": lambda: NUTSTilted(num_warmup=300, num_samples=500, num_chains=2, target="collapsed"),
    }
    if tilted not in options:
        raise ValueError(f"tilted must be one of {list(options)} or a TiltedEstimator, got {tilted!r}")
    return options[tilted]()


def federated_ep(
    model: Callable[..., Any],
    data: DataLike,
    *,
    prior: Mapping[str, tuple[ArrayLike, ArrayLike]],
    global_sites: Sequence[str] | None = None,
    tilted: str | TiltedEstimator = "importance",
    rounds: int = 15,
    damping: float = 1.0,
    tol: float = 0.05,
    num_draws: int = 4000,
    seed: int = 0,
    progress: bool | None = None,
    batched: bool = True,
) -> CustomEPResult:
    """Fit the NumPyro ``model(X, y)`` of one client's rows across the clients of ``data``.

    Parameters
    ----------
    model : callable
        ``model(X, y)``: samples its parameters by name, observes ``y`` in one site with one
        entry per row (see the module docs).
    data : FederatedData
        Each client's ``X`` (as the model expects it: add an intercept column yourself) and
        ``y``.
    prior : dict
        ``{name: (mean, sd)}`` for every global parameter (scalars broadcast over its shape).
    global_sites : list of str, optional
        The global parameters; every other latent site is each client's own (local latents,
        with the model's own prior). Default: every latent site is global.
    tilted : {"importance", "nuts", "laplace"} or a TiltedEstimator
        The clients' tilted moments: importance sampling from a Laplace-based proposal
        (quasi-Monte Carlo draws, control variates), NumPyro NUTS on the tilted target (2
        chains of 300 warm-up and 500 draws per client and round, vectorised over clients),
        or the Laplace approximation alone.
    rounds, damping, tol, num_draws, seed, progress, batched
        As the other EP models.

    Returns
    -------
    CustomEPResult
    """
    import time

    from ..data import as_federated, require_target
    from ..federation import counting, run
    from ..results import warn_excluded
    from .ep import RowsEP, posterior_round
    from .ep_checks import check_run

    data = as_federated(data)
    require_target(data, "federated_ep")
    estimator = _estimator(tilted, int(num_draws))
    t0 = time.perf_counter()
    first = data[data.clients[0]]
    n_pad = -(-max(data.n_obs.values()) // 32) * 32
    shapes, local = split_sites(model, np.asarray(first.X), np.asarray(first.y), n_pad, global_sites)
    mean, sd = prior_moments(prior, shapes)
    site = CustomSite(model, shapes, local, n_pad, data.n_features)
    alg = RowsEP(site, NaturalGaussian.from_moments(mean, np.diag(sd**2)), estimator, damping=damping, tol=tol)
    rows = _Rows(data)
    with counting() as ledger:
        out = run(
            alg,
            rows,
            kind="EP rounds",
            rounds=int(rounds),
            seed=seed,
            progress=progress,
            min_rounds=min(2, int(rounds)),
            batched=batched,
        )
        check_run(out, alg, list(data.clients), int(rounds), what="federated_ep")
        sites = alg.committed_sites(out.server_state, out.client_states)
        posts = {}
        if local:
            posts = posterior_round(
                _LocalPosteriors(site, estimator, out.server_state.q, sites),
                rows,
                seed=seed,
                batched=batched,
                who="federated_ep",
            )
    res = CustomEPResult(
        model=getattr(model, "__name__", "custom"),
        names=_names(shapes),
        clients=list(data.clients),
        q=(out.server_state.q.r, out.server_state.q.Q),
        history=out.history,
        rounds=len(out.history),
        converged=bool(out.converged),
        communication=ledger.communication(),
        local_names=_names(local),
        local=posts,
    )
    res.excluded = dict(ledger.excluded)
    warn_excluded(res.excluded, stacklevel=3)
    res.seconds = time.perf_counter() - t0
    return res


def prior_moments(prior, shapes):
    """The flat prior mean and sd of the global parameters from ``{name: (mean, sd)}``."""
    missing = [n for n in shapes if n not in prior]
    if missing:
        raise ValueError(f"prior= needs a (mean, sd) for every global parameter; missing {missing}")
    mean, sd = [], []
    for n, sh in shapes.items():
        size = int(np.prod(sh)) if sh else 1
        m, s = prior[n]
        mean.append(np.broadcast_to(np.asarray(m, dtype=float), (size,)))
        sd.append(np.broadcast_to(np.asarray(s, dtype=float), (size,)))
    mean, sd = np.concatenate(mean), np.concatenate(sd)
    if not np.all(np.isfinite(mean) & np.isfinite(sd) & (sd > 0)):
        raise ValueError("prior= must give finite means and positive sds")
    return mean, sd
