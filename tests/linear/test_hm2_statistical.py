"""Statistical checks of HM2 by federated EP: NUTS tilted moments, coverage of phi."""

import numpy as np
import pytest

from fedstats.datasets.synthetic import hm2_federation
from fedstats.linear import HierarchicalLinearModel

from test_hierarchical import SIGMA, TAU, exact_model, make_data, pooled_exact  # noqa: E402


def test_nuts_mode_matches_exact_posterior_small_federation():
    """Spec A5 with sampled tilted moments: K <= 10, mean within 0.1 sd, sd within 10%."""
    data = make_data(n=[40, 40, 40, 40, 40])
    sig = {f"c{k}": s for k, s in enumerate(SIGMA)}
    res = HierarchicalLinearModel(tau=TAU, sigma=sig, fit_intercept=False, estimator="nuts", rounds=3, tol=0,
                                  damping=0.7, estimator_options=dict(num_warmup=300, num_samples=2000,
                                                                      num_chains=4)).fit(data, seed=0)
    mean, cov = pooled_exact(data, TAU, SIGMA)
    sd = np.sqrt(np.diag(cov)[:3])
    g = res.global_posterior
    assert np.all(np.abs(g.mean - mean[:3]) / sd < 0.1)
    assert np.all(np.abs(g.sd / sd - 1) < 0.1)
    for h in res.history:
        assert not h.failed
    diag = [st.diagnostics for st in res.client_states.values()]
    assert all(d["rhat_max"] < 1.05 and d["ess_min"] > 400 for d in diag)
    # Device posteriors (Rao-Blackwellised over the NUTS draws) match the exact marginals.
    for k, c in enumerate(data.clients):
        i = slice((k + 1) * 3, (k + 2) * 3)
        post = res.client_posterior(c)
        assert np.all(np.abs(post.mean - mean[i]) / np.sqrt(np.diag(cov)[i]) < 0.15)


def _coverage(reps, K=10, n=30, level=0.9, seed0=0):
    """Coverage of phi's intervals when the truth is drawn from the prior (exact calibration)."""
    rng = np.random.default_rng(seed0)
    hits = []
    for r in range(reps):
        mu = rng.normal(size=2)
        log_tau = rng.normal(size=2)
        data, _ = hm2_federation(n_clients=K, n_obs=n, mu=mu, tau=np.exp(log_tau), sigma=0.5, seed=1000 + r)
        res = HierarchicalLinearModel(fit_intercept=False, estimator_options={"num_draws": 4000}).fit(data, seed=r)
        lo, hi = res.global_posterior.credible_interval(level)
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
