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
Laplace-corrected importance sampling; rows are padded to a common length (padding masked
out) so that one compiled kernel serves every client, and are rebuilt from the client's data
at every step, never kept in its EP state. Local latent variables (one per client) are not
supported yet, and the fit runs in process only (a Flower node loads code from trusted
packages only, and the model is your function). :func:`pooled_nuts` samples the same model
with every row pooled, the reference to check a federated fit against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..results import FederatedResult, register
from .gaussian import NaturalGaussian
from .posterior import GaussianPosterior

__all__ = ["federated_ep", "pooled_nuts", "CustomEPResult"]


def _global_shapes(model, X, y) -> dict[str, tuple]:
    """Names and shapes of the model's latent (global) sample sites, from one trace."""
    import jax
    from numpyro import handlers

    with handlers.seed(rng_seed=0):
        tr = handlers.trace(model).get_trace(X, y)
    obs = [n for n, s in tr.items() if s["type"] == "sample" and s["is_observed"]]
    if len(obs) != 1:
        raise ValueError(f"the model must observe y in exactly one sample site, it observes {obs}")
    shapes = {n: tuple(jax.numpy.shape(s["value"])) for n, s in tr.items()
              if s["type"] == "sample" and not s["is_observed"]}
    if not shapes:
        raise ValueError("the model samples no global parameter")
    return shapes


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
        out[n] = phi[i:i + size].reshape(sh)
        i += size
    return out


def _row_loglik(model, shapes, phi, X, y):
    """Per-row log-likelihood of the observed site at the global values ``phi``."""
    from numpyro import handlers

    params = _unflatten(phi, shapes)
    with handlers.block():  # inside a pooled NUTS model the user's sites must stay hidden
        tr = handlers.trace(handlers.substitute(model, data=params)).get_trace(X, y)
    site = next(s for s in tr.values() if s["type"] == "sample" and s["is_observed"])
    return site["fn"].log_prob(site["value"])


@dataclass(frozen=True, eq=False)
class CustomSite:
    """The EP site of a user model: the log-likelihood of one client's padded rows."""

    model: Any
    shapes: dict
    n_pad: int
    d: int

    theta_dim = 0
    local_dim = 0

    @property
    def phi_dim(self) -> int:
        return int(sum(int(np.prod(s)) if s else 1 for s in self.shapes.values()))

    def cache_key(self) -> tuple:
        return ("custom", id(self.model), tuple(self.shapes.items()), self.n_pad, self.d)

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
        return np.zeros(0), np.zeros(0)

    def log_collapsed(self, phi, z, stats):
        import jax.numpy as jnp

        ll = _row_loglik(self.model, self.shapes, phi, stats["X"], stats["y"])
        return jnp.sum(jnp.where(stats["mask"] > 0, ll, 0.0))


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
    parameters (``summary``, ``global_posterior``), history and communication."""

    def __init__(self, **state):
        self.__dict__.update(state)
        self.seconds = 0.0

    def global_posterior(self) -> GaussianPosterior:
        return GaussianPosterior.from_natural(*self.q, names=self.names)

    def _client_table(self, client, level: float, kind: str):
        import pandas as pd

        # the parameters are global: a client has none of its own
        return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))

    def _no_posterior(self, what: str) -> str:
        return f"a custom model by federated_ep has no {what} posterior (its parameters are global)"


def federated_ep(model: Callable, data, *, prior: dict, rounds: int = 15, damping: float = 1.0, tol: float = 0.05,
                 num_draws: int = 4000, seed: int = 0, progress=None, batched: bool = True) -> CustomEPResult:
    """Fit the NumPyro ``model(X, y)`` of one client's rows across the clients of ``data``.

    Parameters
    ----------
    model : callable
        ``model(X, y)``: samples the global parameters by name, observes ``y`` in one site
        with one entry per row (see the module docs).
    data : FederatedData
        Each client's ``X`` (as the model expects it: add an intercept column yourself) and
        ``y``.
    prior : dict
        ``{name: (mean, sd)}`` for every global parameter (scalars broadcast over its shape).
    rounds, damping, tol, num_draws, seed, progress, batched
        As the other EP models.

    Returns
    -------
    CustomEPResult
    """
    import time

    from ..data import as_federated, require_target
    from ..federation import run
    from ..federation.runner import counting
    from .ep import RowsEP, check_invariants
    from .tilted import ImportanceTilted

    data = as_federated(data)
    require_target(data, "federated_ep")
    t0 = time.perf_counter()
    first = data[data.clients[0]]
    shapes = _global_shapes(model, np.asarray(first.X), np.asarray(first.y))
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
    n_pad = -(-max(data.n_obs.values()) // 32) * 32
    site = CustomSite(model, shapes, n_pad, data.n_features)
    alg = RowsEP(site, NaturalGaussian.from_moments(mean, np.diag(sd**2)), ImportanceTilted(num_draws=num_draws),
                 damping=damping, tol=tol)
    with counting() as ledger:
        out = run(alg, _Rows(data), kind="EP rounds", rounds=int(rounds), seed=seed, progress=progress,
                  min_rounds=min(2, int(rounds)), batched=batched)
    check_invariants(out.server_state, list(alg.committed_sites(out.server_state, out.client_states).values()))
    res = CustomEPResult(model=getattr(model, "__name__", "custom"), names=_names(shapes), clients=list(data.clients),
                         q=(out.server_state.q.r, out.server_state.q.Q), history=out.history,
                         rounds=len(out.history), converged=bool(out.converged),
                         communication=ledger.communication())
    res.seconds = time.perf_counter() - t0
    return res


def pooled_nuts(model: Callable, data, *, prior: dict, num_warmup: int = 500, num_samples: int = 1000,
                num_chains: int = 2, seed: int = 0) -> np.ndarray:
    """Draws (S, dim) of the same model with every client's rows pooled, under the same
    Gaussian prior, by NumPyro's NUTS (the reference for :func:`federated_ep`)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    from ..data import as_federated

    data = as_federated(data)
    X = np.vstack([np.asarray(data[c].X) for c in data.clients])
    y = np.concatenate([np.asarray(data[c].y) for c in data.clients])
    shapes = _global_shapes(model, X, y)
    names = list(shapes)

    def pooled():
        flat = []
        for n in names:
            m, s = prior[n]
            v = numpyro.sample(n, dist.Normal(jnp.broadcast_to(m, shapes[n]), jnp.broadcast_to(s, shapes[n]))
                               .to_event(len(shapes[n])))
            flat.append(jnp.reshape(v, (-1,)))
        numpyro.factor("ll", jnp.sum(_row_loglik(model, shapes, jnp.concatenate(flat), X, y)))

    with jax.enable_x64(True):
        mc = MCMC(NUTS(pooled), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                  chain_method="sequential", progress_bar=False)
        mc.run(jax.random.PRNGKey(seed))
        s = mc.get_samples()
    return np.column_stack([np.asarray(s[n]).reshape(num_samples * num_chains, -1) for n in names])
