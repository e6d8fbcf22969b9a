"""Statistical checks of HM2 by federated EP: coverage of phi, and every estimator against pooled NUTS."""

import numpy as np
import pytest

from fedstats.datasets.synthetic import hm2_federation
from fedstats.linear import HierarchicalLinearModel


def _coverage(reps, K=10, n=30, level=0.9, seed0=0):
    """Coverage of phi's intervals when the truth is drawn from the prior (exact calibration)."""
    rng = np.random.default_rng(seed0)
    hits = []
    for r in range(reps):
        mu = rng.normal(size=2)
        log_tau = rng.normal(size=2)
        data, _ = hm2_federation(n_clients=K, n_obs=n, mu=mu, tau=np.exp(log_tau), sigma=0.5, seed=1000 + r)
        res = HierarchicalLinearModel(
            standardize=False, fit_intercept=False, estimator_options={"num_draws": 4000}
        ).fit(data, seed=r)
        lo, hi = res.global_posterior().credible_interval(level)
        truth = np.r_[mu, log_tau]
        hits.append((lo <= truth) & (truth <= hi))
    return np.array(hits)


def test_coverage_of_phi_20_replicates():
    hits = _coverage(20)
    # 80 interval checks; at nominal 0.9 the binomial sd is 0.034: a 3.5 sd band.
    assert 0.78 <= hits.mean() <= 1.0, hits.mean(axis=0)


@pytest.mark.slow
def test_coverage_of_phi_100_replicates():
    hits = _coverage(100, seed0=1)
    assert abs(hits.mean() - 0.90) <= 0.07, hits.mean(axis=0)


@pytest.mark.slow  # 3.5 min; the default run keeps test_nuts_mode_matches_exact_posterior_small_federation
def test_nuts_mode_on_the_uncertainty_example_matches_pooled_nuts():
    """Issue acceptance: K = 100, d = 4, phi = (mu, log tau_1..4), NUTS over the augmented target."""
    from fedstats.reference.hierarchical import pooled_nuts

    data, truth = hm2_federation(seed=1, sigma=0.05)
    res = HierarchicalLinearModel(
        standardize=False,
        fit_intercept=False,
        sigma=0.05,
        estimator="nuts",
        rounds=10,
        estimator_options=dict(num_warmup=200, num_samples=500, num_chains=2, target="augmented"),
    ).fit(data, seed=0)
    ref = pooled_nuts(data, sigma=0.05, fit_intercept=False, num_warmup=500, num_samples=1000, num_chains=2)
    g = res.global_posterior()
    rm, rs = ref["phi"].mean(0), ref["phi"].std(0)
    assert np.all(np.abs(g.mean - rm) / rs < 0.25), np.abs(g.mean - rm) / rs
    assert np.all((g.sd / rs > 0.75) & (g.sd / rs < 1.33)), g.sd / rs
    # The truth lies in EP's 90% intervals wherever it lies in the gold standard's (in this
    # data set mu[x3]'s sample of theta_k sits outside both; 7 of 8 are covered).
    tv = np.r_[truth["mu"], truth["log_tau"]]
    lo, hi = g.credible_interval(0.9)
    rlo, rhi = np.quantile(ref["phi"], [0.05, 0.95], axis=0)
    gold = (rlo <= tv) & (tv <= rhi)
    assert gold.sum() >= 7
    assert np.all(((lo <= tv) & (tv <= hi))[gold])
    assert all(st.diagnostics["rhat_max"] < 1.1 for st in res.client_states.values())


def test_default_fit_of_the_uncertainty_example_matches_pooled_nuts_many_times_faster():
    """Issue 22's EP item on the paper's K = 100 example with the defaults (Rao-Blackwellised
    moments, 256 quasi-random draws of log tau per client, no compilation): within 0.1
    posterior sd of pooled NUTS and sd ratios in [0.9, 1.1], and many times faster. The
    benchmark (benchmarks/results/ep_vs_pooled.md) measures the ratio against 4 x (1000 +
    1000) draws; here 2 x (1000 + 1000), so the ratio is about half the benchmark's, asserted
    with room for a busy machine. NUTS's own Monte Carlo error (about 0.02-0.03 sd) is part of
    the measured difference."""
    import time

    import jax

    from fedstats.reference.hierarchical import pooled_nuts

    jax.jit(lambda x: x + 1)(jax.numpy.zeros(1)).block_until_ready()  # jax's start-up, paid by neither side
    data, truth = hm2_federation(seed=1, sigma=0.05)
    t0 = time.perf_counter()
    res = HierarchicalLinearModel(standardize=False, fit_intercept=False, sigma=0.05).fit(data, seed=1, progress=False)
    t_ep = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = pooled_nuts(data, sigma=0.05, fit_intercept=False, num_warmup=1000, num_samples=1000, num_chains=2, seed=1)
    t_nuts = time.perf_counter() - t0
    assert res.converged and type(res.algorithm.estimator).__name__ == "RaoBlackwellTilted"
    g = res.global_posterior()
    rm, rs = ref["phi"].mean(0), ref["phi"].std(0)
    assert np.max(np.abs(g.mean - rm) / rs) < 0.1, np.abs(g.mean - rm) / rs
    assert np.all((g.sd / rs > 0.9) & (g.sd / rs < 1.1)), g.sd / rs
    assert t_nuts / t_ep > 5.0, (t_ep, t_nuts)


@pytest.mark.parametrize("K, seed", [(10, 0), (10, 1), (20, 1), (20, 3), (50, 2)])
def test_default_fit_converges_across_federations(K, seed):
    """Regression: with defaults EP converges (no lock-up where every client skips, no divergence).

    (20, 1) once locked up (every client's importance sampler failed after a bad first round)
    and (50, 2) diverged with damping 1; both converge with the saddle-free Newton proposal
    and the default damping.
    """
    data, truth = hm2_federation(n_clients=K, n_obs=100, sigma=0.05, seed=seed)
    res = HierarchicalLinearModel(standardize=False, fit_intercept=False, sigma=0.05).fit(data, seed=seed)
    assert res.converged
    last = res.history[-1]
    assert not last.skipped and not last.failed
    g = res.global_posterior()
    assert np.all(np.abs(g.mean - np.r_[truth["mu"], truth["log_tau"]]) / g.sd < 3.5)


@pytest.fixture(scope="module")
def iso_federation():
    """K = 8 clients, d = 2 plus intercept, unknown noise, one shared tau; pooled NUTS reference."""
    from fedstats.reference.hierarchical import pooled_nuts

    data, truth = hm2_federation(
        n_clients=8, n_obs=[15, 30, 60, 20, 40, 25, 50, 35], mu=[0.5, -1.0], tau=[0.4, 0.4], sigma=0.7, seed=21
    )
    ref = pooled_nuts(
        data, tau="iso", sigma=None, fit_intercept=True, num_warmup=1000, num_samples=2000, num_chains=2, seed=3
    )
    return data, ref


@pytest.mark.parametrize(
    "estimator, options",
    [
        ("rao_blackwell", {}),
        ("rao_blackwell_laplace", {}),
        ("importance", {}),
        ("laplace", {}),
        ("nuts", dict(num_warmup=300, num_samples=1000, num_chains=2, target="augmented")),
        ("nuts", dict(num_warmup=300, num_samples=1000, num_chains=2, target="collapsed")),
    ],
)
def test_every_estimator_matches_pooled_nuts_unknown_noise_iso_tau(iso_federation, estimator, options):
    """The shared battery: each tilted estimator, unknown sigma_k, tau = tau I, intercept."""
    data, ref = iso_federation
    res = HierarchicalLinearModel(standardize=False, tau="iso", estimator=estimator, estimator_options=options).fit(
        data, seed=2
    )
    g = res.global_posterior()
    assert g.names == ["mu[intercept]", "mu[x1]", "mu[x2]", "log_tau"]
    rm, rs = ref["phi"].mean(0), ref["phi"].std(0)
    # Laplace matches modes, not means: on the skewed log tau it lands about 0.5 sd off
    # (measured 0.53 here), which is why it is not the default.
    tol, band = (0.6, (0.7, 1.4)) if estimator == "laplace" else (0.2, (0.8, 1.25))
    assert np.all(np.abs(g.mean - rm) / rs < tol), np.abs(g.mean - rm) / rs
    assert np.all((g.sd / rs > band[0]) & (g.sd / rs < band[1])), g.sd / rs
    # client posteriors against the pooled marginals of theta_k
    for k, c in enumerate(data.clients):
        post = res.client_posterior(c)
        th = ref["theta"][:, k, :]
        assert np.all(np.abs(post.mean - th.mean(0)) / th.std(0) < 0.3)
        assert np.all(np.abs(post.sd / th.std(0) - 1) < 0.3)
    pred = res.predict(data[data.clients[0]].X[:4], client=data.clients[0], level=0.9)
    assert np.all(pred["pred_upper"] - pred["pred_lower"] > pred["upper"] - pred["lower"])
