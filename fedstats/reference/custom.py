"""Pooled NUTS of your own NumPyro model, the reference of
:func:`~fedstats.inference.custom.federated_ep` (the same model and Gaussian prior)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..inference.custom import client_logp, prior_moments, site_size, split_sites


def pooled_nuts(
    model: Callable,
    data,
    *,
    prior: dict,
    global_sites=None,
    num_warmup: int = 500,
    num_samples: int = 1000,
    num_chains: int = 2,
    seed: int = 0,
    return_local: bool = False,
):
    """Draws (S, dim) of the global parameters of the same model with every client's rows
    pooled in this process, under the same Gaussian prior, by NumPyro's NUTS (the reference
    for :func:`federated_ep`). With local latents (``global_sites=``), each client's are
    sampled with them; ``return_local=True`` also returns their draws, (S, K, local dim)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    from ..data import as_federated

    data = as_federated(data)
    rows = [(np.asarray(data[c].X, dtype=float), np.asarray(data[c].y, dtype=float)) for c in data.clients]
    n_pad = -(-max(len(y) for _, y in rows) // 32) * 32
    shapes, local = split_sites(model, *rows[0], n_pad, global_sites)
    mean, sd = prior_moments(prior, shapes)
    dz, K = site_size(local), len(rows)
    if local:  # every client's padded rows, its log density vectorised over clients
        X = np.stack([np.resize(X, (n_pad, *X.shape[1:])) for X, _ in rows])
        y = np.stack([np.resize(y, n_pad) for _, y in rows])
        mask = np.stack([np.arange(n_pad) < len(r[1]) for r in rows]).astype(float)
    else:  # one likelihood over every row
        X, y = np.vstack([X for X, _ in rows]), np.concatenate([y for _, y in rows])

    def pooled():
        phi = numpyro.sample("phi", dist.Normal(jnp.asarray(mean), jnp.asarray(sd)).to_event(1))
        if not local:
            numpyro.factor("ll", client_logp(model, shapes, local, phi, jnp.zeros(0), X, y, np.ones(len(y))))
            return
        z = numpyro.sample("z", dist.ImproperUniform(dist.constraints.real_vector, (), (K, dz)))
        one = lambda zk, Xk, yk, mk: client_logp(model, shapes, local, phi, zk, Xk, yk, mk)  # noqa: E731
        numpyro.factor("ll", jnp.sum(jax.vmap(one)(z, X, y, mask)))

    with jax.enable_x64(True):
        mc = MCMC(
            NUTS(pooled),
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            chain_method="sequential",
            progress_bar=False,
        )
        mc.run(jax.random.PRNGKey(seed))
        s = {k: np.asarray(v) for k, v in mc.get_samples().items()}
    if not return_local:
        return s["phi"]
    return s["phi"], (s["z"] if local else None)
