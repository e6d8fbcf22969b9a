"""Pooled NUTS of the Bayesian GLMs: the gold standard the federated fits are tested against.

The rows of every client are pooled in this process (no federation) and NumPyro's NUTS
samples the very model the federated fit approximates, with the same likelihood code
(:func:`fedstats.glm.sites.loglik_rows`) and priors. For tests, notebooks and benchmarks.
"""

from __future__ import annotations

import numpy as np

from ..glm.sites import DISPERSION, loglik_rows


def _pooled(design):
    rows = [design[c] for c in design.clients]
    return (
        np.vstack([r.X for r in rows]),
        np.concatenate([r.y for r in rows]),
        np.concatenate([r.n for r in rows]),
        np.concatenate([r.f for r in rows]),
        np.concatenate([r.offset for r in rows]),
        np.concatenate([np.full(len(r.y), k) for k, r in enumerate(rows)]),
    )


def pooled_nuts(
    design,
    family: str,
    link: str,
    *,
    alpha: float = 1.0,
    hierarchical: bool = False,
    prior_mean=None,
    prior_sd=None,
    num_warmup: int = 500,
    num_samples: int = 1000,
    num_chains: int = 2,
    seed: int = 0,
):
    """Draws of the pooled posterior on the design's scale (a ``GLMDesign``; with binomial
    trials, built with ``family=`` so that its rows hold proportions, as the fits see them).

    Shared (``hierarchical=False``): ``phi = beta`` (then the log dispersion) with the
    Normal prior ``prior_mean``, ``prior_sd``; returns ``{"phi": (S, dim)}``. Hierarchical:
    ``theta_k = mu + sqrt(tau) z_k`` with ``mu ~ N(0, prior_sd[0]^2)``, ``log tau ~
    N(0, prior_sd[1]^2)`` (defaults 1); returns ``{"phi": (S, 2p), "theta": (S, K, p)}``.
    """
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    X, y, n, f, off, idx = _pooled(design)
    p, K = X.shape[1], len(design.clients)

    def shared():
        dim = p + (family in DISPERSION)
        phi = numpyro.sample("phi", dist.Normal(jnp.asarray(prior_mean), jnp.asarray(prior_sd)).to_event(1))
        assert phi.shape[-1] == dim
        disp = phi[p] if family in DISPERSION else 0.0
        ll = loglik_rows(family, link, alpha, X @ phi[:p] + off, y, n, disp)
        numpyro.factor("ll", jnp.sum(f * ll))

    def hier():
        sm, st = (1.0, 1.0) if prior_sd is None else prior_sd
        mu = numpyro.sample("mu", dist.Normal(0.0, sm).expand([p]).to_event(1))
        lt = numpyro.sample("log_tau", dist.Normal(0.0, st).expand([p]).to_event(1))
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([K, p]).to_event(2))
        theta = numpyro.deterministic("theta", mu + jnp.exp(0.5 * lt) * z)
        ll = loglik_rows(family, link, alpha, jnp.sum(X * theta[idx], axis=1) + off, y, n, 0.0)
        numpyro.factor("ll", jnp.sum(f * ll))

    with jax.enable_x64(True):
        mc = MCMC(
            NUTS(hier if hierarchical else shared),
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            chain_method="sequential",
            progress_bar=False,
        )
        mc.run(jax.random.PRNGKey(seed))
        s = {k: np.asarray(v) for k, v in mc.get_samples().items()}
    if hierarchical:
        return {"phi": np.column_stack([s["mu"], s["log_tau"]]), "theta": s["theta"]}
    return {"phi": s["phi"]}
