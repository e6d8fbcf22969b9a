"""Pooled NUTS of the hierarchical linear model (HM2), the reference of
:class:`~fedstats.linear.HierarchicalLinearModel`."""

from __future__ import annotations

import numpy as np


def pooled_nuts(
    data,
    *,
    tau="diag",
    sigma=None,
    fit_intercept=True,
    prior_mu=(0.0, 1.0),
    prior_log_tau=(0.0, 1.0),
    prior_log_sigma=(0.0, 1.0),
    num_warmup=1000,
    num_samples=1000,
    num_chains=4,
    seed=0,
) -> dict[str, np.ndarray]:
    """The gold standard: NumPyro NUTS on the full hierarchical model with all rows pooled.

    Same model and priors as :class:`HierarchicalLinearModel` (unknown tau only), written
    the way a statistician holding all the data would write it: a row-level likelihood over
    the concatenated data with a client index. Returns draws ``{"phi": (S, p), "theta":
    (S, K, d)}`` with phi ordered as in the federated fit (mu, then log tau).
    This function pools rows: it is a reference for tests and benchmarks, not a federated
    method.
    """
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    if tau not in ("diag", "iso"):
        raise ValueError("pooled_nuts supports tau='diag' or 'iso'")
    Xs = [
        np.column_stack([np.ones(data[c].n), data[c].X]) if fit_intercept else np.asarray(data[c].X)
        for c in data.clients
    ]
    X = np.concatenate(Xs)
    y = np.concatenate([np.asarray(data[c].y) for c in data.clients])
    idx = np.repeat(np.arange(data.n_clients), [len(x) for x in Xs])
    K, d = data.n_clients, X.shape[1]
    (m0, s0), (l0, t0), (a0, b0) = prior_mu, prior_log_tau, prior_log_sigma
    sig = (
        None
        if sigma is None
        else np.broadcast_to(
            np.asarray([sigma[c] for c in data.clients] if isinstance(sigma, dict) else sigma, dtype=float), (K,)
        )
    )

    def model(X, y, idx):
        mu = numpyro.sample("mu", dist.Normal(m0, s0).expand([d]).to_event(1))
        lt = numpyro.sample("log_tau", dist.Normal(l0, t0).expand([d if tau == "diag" else 1]).to_event(1))
        theta = numpyro.sample("theta", dist.Normal(mu, jnp.exp(lt / 2)).expand([K, d]).to_event(2))
        if sig is None:
            ls = numpyro.sample("log_sigma", dist.Normal(a0, b0).expand([K]).to_event(1))
            s = jnp.exp(ls)
        else:
            s = jnp.asarray(sig)
        numpyro.sample("y", dist.Normal(jnp.sum(X * theta[idx], axis=1), s[idx]), obs=y)

    with jax.enable_x64(True):
        mcmc = MCMC(
            NUTS(model),
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            chain_method="sequential",
            progress_bar=False,
        )
        mcmc.run(jax.random.PRNGKey(seed), X, y, idx)
        s = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
    return {"phi": np.column_stack([s["mu"], s["log_tau"]]), "theta": s["theta"]}
