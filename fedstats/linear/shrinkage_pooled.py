"""Pooled NUTS of the Bayesian lasso and ridge, the reference of
:class:`~fedstats.linear.BayesianShrinkage` (:meth:`~fedstats.linear.BayesianShrinkage.fit_centralized`;
:mod:`fedstats.reference.shrinkage` gives it with the other pooled references)."""

from __future__ import annotations

import numpy as np

from ..federation.scaling import federated_scaling
from ..inference.posterior import SamplePosterior
from .ep_model import normal_pair
from .shrinkage import BayesianShrinkage, CentralizedShrinkageResult, sigma2_back


def pooled_nuts(
    model: BayesianShrinkage, data, names, *, seed, num_warmup, num_samples, num_chains, per_client
) -> CentralizedShrinkageResult:
    """NUTS on the pooled rows of ``data`` under ``model``'s prior (the Laplace or normal prior
    written directly, not the scale mixture), for
    :meth:`~fedstats.linear.BayesianShrinkage.fit_centralized` (see there)."""
    import time

    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.diagnostics import summary as mcmc_summary
    from numpyro.infer import MCMC, NUTS

    t0 = time.perf_counter()
    clients = list(data.clients)
    X = np.concatenate([np.asarray(data[c].X) for c in clients])
    y = np.concatenate([np.asarray(data[c].y) for c in clients])
    # the federated fit's standardisation (the same moments, here from the pooled rows)
    scaling = federated_scaling(data, model.fit_intercept, seed=seed) if model.standardize else None
    if scaling is not None:
        X, y = scaling.transform_X(X), scaling.transform_y(y)
    group = np.repeat(np.arange(len(clients)), [data[c].n for c in clients]) if per_client else np.zeros(len(y), int)
    G = len(clients) if per_client else 1
    (l0, t0_), (s0, u0) = (
        normal_pair(model.prior_log_lambda, "prior_log_lambda"),
        normal_pair(model.prior_log_sigma2, "prior_log_sigma2"),
    )
    d = X.shape[1]

    def numpyro_model(X, y, group):
        log_lam = numpyro.sample("log_lambda", dist.Normal(l0, t0_))
        log_s2 = numpyro.sample("log_sigma2", dist.Normal(s0, u0))
        if model.penalty == "lasso":
            log_b = (0.5 if model.scale == "sd" else 1.0) * log_s2 - log_lam
            prior = dist.Laplace(0.0, jnp.exp(log_b))
        else:
            prior = dist.Normal(0.0, jnp.exp(0.5 * (log_s2 - log_lam)))
        beta = numpyro.sample("beta", prior.expand([G, d]).to_event(2))
        mean = jnp.sum(X * beta[group], axis=1)
        if model.fit_intercept:
            mean = (
                mean + numpyro.sample("intercept", dist.Normal(0.0, model.intercept_sd).expand([G]).to_event(1))[group]
            )
        numpyro.sample("y", dist.Normal(mean, jnp.exp(0.5 * log_s2)), obs=y)

    with jax.enable_x64(True):
        mcmc = MCMC(
            NUTS(numpyro_model, target_accept_prob=0.9),
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            chain_method="sequential",
            progress_bar=False,
        )
        mcmc.run(jax.random.PRNGKey(seed), X, y, group)
        s = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
        grouped = mcmc.get_samples(group_by_chain=True)
        summ = mcmc_summary({k: np.asarray(v) for k, v in grouped.items()}, prob=0.9)
    rhat = max(float(np.max(v["r_hat"])) for v in summ.values())
    ess = min(float(np.min(v["n_eff"])) for v in summ.values())

    def coefficients(g):
        b = s["beta"][:, g]
        theta = np.column_stack([s["intercept"][:, g], b]) if model.fit_intercept else b
        return SamplePosterior(theta if scaling is None else scaling.coef_back(theta), names=names)

    beta = {c: coefficients(g) for g, c in enumerate(clients)} if per_client else {"pooled": coefficients(0)}
    phi = SamplePosterior(np.column_stack([s["log_lambda"], s["log_sigma2"]]), names=["log_lambda", "log_sigma2"])
    y_sd = 1.0 if scaling is None else scaling.y_sd
    return CentralizedShrinkageResult(
        model=model,
        feature_names=names,
        fitted_clients=clients,
        beta=beta,
        phi=phi if scaling is None else sigma2_back(phi, y_sd),
        sigma=y_sd * np.exp(0.5 * s["log_sigma2"]),
        diagnostics={"rhat_max": rhat, "ess_min": ess},
        seconds=time.perf_counter() - t0,
        scaling=scaling,
    )
