"""The EP sites of the Bayesian GLMs: closed-form derivatives against automatic
differentiation, the inner Laplace mode of the hierarchical site against a long Newton run,
and the staged tilted estimators of HierarchicalGLM."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.glm import HierarchicalGLM
from fedstats.glm._design import Rows
from fedstats.glm.sites import HierarchicalSite, eta_derivatives, loglik_rows

CASES = [
    ("binomial", "logit", 1.0),
    ("binomial", "probit", 1.0),
    ("poisson", "log", 1.0),
    ("negative_binomial", "log", 0.7),
]


def outcome(family, rng, n):
    if family == "binomial":
        return rng.binomial(20, 0.3, n) / 20.0, np.full(n, 20.0)  # proportions of 20 trials
    return rng.poisson(3.0, n).astype(float), np.ones(n)


@pytest.mark.parametrize("family, link, alpha", CASES)
def test_eta_derivatives_equal_automatic_differentiation(family, link, alpha):
    rng = np.random.default_rng(0)
    eta = rng.normal(0, 1.5, 50)
    y, n = outcome(family, rng, 50)
    with jax.enable_x64(True):
        d1, d2 = eta_derivatives(family, link, alpha, jnp.asarray(eta), y, n)
        g = jax.grad(lambda e: jnp.sum(loglik_rows(family, link, alpha, e, y, n, 0.0)))
        h = jax.grad(lambda e: jnp.sum(g(e)))
        np.testing.assert_allclose(d1, g(jnp.asarray(eta)), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(d2, h(jnp.asarray(eta)), rtol=1e-10, atol=1e-10)


def client_rows(family, rng, n, p, separated=False):
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1))])
    y, trials = outcome(family, rng, n)
    if separated:  # the first predictor separates the 0/1 outcome: no finite MLE
        y, trials = (X[:, 1] > 0).astype(float), np.ones(n)
    return Rows(X=X, y=y, n=trials, f=np.ones(n), offset=np.zeros(n), client="c", target="y", columns=())


@pytest.mark.parametrize("family, link, alpha", [c for c in CASES if c[1] != "probit"])
def test_the_inner_mode_from_the_anchor_is_the_mode(family, link, alpha):
    """A few capped Newton steps from the anchor reach the mode of theta given (mu, log tau)
    that 40 steps reach, over a spread of (mu, log tau) around the client's estimate, also for
    a separated client; the gradient in theta vanishes there."""
    rng = np.random.default_rng(1)
    p = 3
    for separated in [False, True] if family == "binomial" else [False]:
        site = HierarchicalSite(family, link, alpha, p, 96)
        long = HierarchicalSite(family, link, alpha, p, 96, max_steps=60)
        stats = site.client_stats(client_rows(family, rng, 80, p, separated))
        mus = rng.normal(0, 1.0, (200, p))
        log_taus = rng.uniform(-4, 1.5, (200, p))
        with jax.enable_x64(True):
            mode = jax.jit(jax.vmap(site.theta_mode, in_axes=(0, 0, None)))
            t, negH = mode(mus, log_taus, stats)
            t40, negH40 = jax.jit(jax.vmap(long.theta_mode, in_axes=(0, 0, None)))(mus, log_taus, stats)
            grad = jax.vmap(jax.grad(site._joint), in_axes=(0, 0, 0, None))(t, mus, log_taus, stats)
        np.testing.assert_allclose(t, t40, atol=1e-6, rtol=0)
        np.testing.assert_allclose(negH, negH40, rtol=1e-6, atol=1e-8)
        assert np.max(np.abs(grad)) < 1e-5 * max(1.0, float(np.max(np.abs(negH))))


def test_both_forms_of_the_curvature_agree(monkeypatch):
    """X' diag(c) X from the rows' outer products (few rows x coefficients^2) and as
    X' (X * c) (the form for clients too large to keep the outer products): equal modes,
    curvatures and collapsed log-likelihoods."""
    import fedstats.glm.sites as sites

    rng = np.random.default_rng(4)
    p = 4
    stats_rows = client_rows("poisson", rng, 120, p)
    mus, log_taus = rng.normal(0, 1.0, (50, p)), rng.uniform(-3, 1, (50, p))

    def evaluate():
        site = HierarchicalSite("poisson", "log", 1.0, p, 128)
        stats = site.client_stats(stats_rows)
        with jax.enable_x64(True):
            t, negH = jax.vmap(site.theta_mode, in_axes=(0, 0, None))(mus, log_taus, stats)
            ll = jax.vmap(site.log_collapsed, in_axes=(0, None, None))(np.hstack([mus, log_taus]), None, stats)
        return np.asarray(t), np.asarray(negH), np.asarray(ll)

    assert 128 * p * p <= sites._OUTER_LIMIT
    outer = evaluate()
    monkeypatch.setattr(sites, "_OUTER_LIMIT", 0)
    for a, b in zip(outer, evaluate()):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def hierarchical_clients(K=8, seed=3):
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for n in rng.integers(40, 120, K):
        X = rng.normal(size=(n, 1))
        th = np.array([-0.2, 0.8]) + np.sqrt([0.3, 0.1]) * rng.normal(size=2)
        Xs.append(X)
        ys.append(rng.binomial(1, 1 / (1 + np.exp(-(th[0] + X @ th[1:])))).astype(float))
    return FederatedData.from_arrays(Xs, ys)


def test_staged_tilted_moments_run_laplace_then_importance():
    """``tilted="laplace+importance"`` (the default): Laplace rounds until converged, then
    importance rounds from there; the stage travels in the broadcast and history shows it.
    It reaches the EP fixed point that importance sampling alone reaches (both within 0.1
    posterior sd of a long importance run: 2,048 draws, tolerance 0.01; the two stop on
    either side of it, 0.09 to 0.13 sd apart on log tau over seeds), and the Laplace stage
    alone does not (0.33 sd away): the importance stage is what corrects it."""
    data = hierarchical_clients()
    staged = HierarchicalGLM("binomial", standardize=False).fit(data, seed=0)
    stages = [rec.metrics["stage"] for rec in staged.history]
    assert stages[0] == 0 and stages[-1] == 1 and stages == sorted(stages) and staged.converged
    alone = HierarchicalGLM("binomial", standardize=False, tilted="importance").fit(data, seed=0)
    assert all("stage" not in rec.metrics for rec in alone.history)
    laplace = HierarchicalGLM("binomial", standardize=False, tilted="laplace").fit(data, seed=0)
    ref = HierarchicalGLM("binomial", standardize=False, tilted="importance", num_draws=2048, tol=0.01, rounds=60).fit(
        data, seed=1
    )
    assert ref.converged
    r = ref._fitted_q()

    def gap(res):
        q = res._fitted_q()
        return np.max(np.abs(q.mean - r.mean) / r.sd), np.max(np.abs(np.log(q.sd / r.sd)))

    for res in (staged, alone):
        assert gap(res)[0] < 0.1 and gap(res)[1] < 0.1
    assert gap(laplace)[0] > 0.2
    with pytest.raises(ValueError, match="tilted"):
        HierarchicalGLM("binomial", tilted="nuts").fit(data)
