"""The lasso/ridge site against direct computations: collapsed likelihood, conditionals, prior."""

import jax
import numpy as np
import pytest
from scipy import stats as st

from fedstats.linear._shrinkage_site import ShrinkageSite


def design(n=25, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, d))])
    y = X @ np.r_[0.5, rng.normal(size=d)] + 0.3 * rng.normal(size=n)
    return X, y


@pytest.mark.parametrize(
    "penalty, scale, noise",
    [
        ("ridge", "sd", "shared"),
        ("ridge", "sd", "client"),
        ("lasso", "sd", "shared"),
        ("lasso", "variance", "shared"),
        ("lasso", "sd", "client"),
    ],
)
def test_collapsed_likelihood_equals_the_multivariate_normal(penalty, scale, noise):
    X, y = design()
    site = ShrinkageSite(d=4, penalty=penalty, scale=scale, noise=noise, intercept_sd=3.0)
    rng = np.random.default_rng(1)
    phi = rng.normal(size=site.phi_dim) * 0.5
    z = rng.normal(size=site.local_dim) * 0.5
    with jax.enable_x64(True):
        got = float(site.log_collapsed(jax.numpy.asarray(phi), jax.numpy.asarray(z), site.stats_from(X, y)))
    log_lam = phi[0]
    log_s2 = phi[1] if noise == "shared" else z[0]
    u = z[int(noise == "client") :]
    s2 = np.exp(log_s2)
    lp_z = st.norm.logpdf(z[0]) if noise == "client" else 0.0
    if penalty == "ridge":
        D = np.full(4, s2 / np.exp(log_lam))
    else:
        b = (np.sqrt(s2) if scale == "sd" else s2) / np.exp(log_lam)
        D = b**2 * np.exp(u)
        lp_z += np.sum(st.expon(scale=2.0).logpdf(np.exp(u)) + u)  # density of u = log e
    D = np.r_[9.0, D]
    ref = st.multivariate_normal(np.zeros(len(y)), s2 * np.eye(len(y)) + X @ np.diag(D) @ X.T).logpdf(y) + lp_z
    np.testing.assert_allclose(got, ref, rtol=1e-10)


def test_theta_conditional_is_the_gaussian_posterior():
    X, y = design()
    site = ShrinkageSite(d=4, penalty="lasso")
    rng = np.random.default_rng(2)
    phi, z = rng.normal(size=(3, 2)) * 0.3, rng.normal(size=(3, 4))
    m, V = site.theta_conditional(phi, z, site.stats_from(X, y))
    for i in range(3):
        s2 = np.exp(phi[i, 1])
        D = np.r_[100.0, (np.sqrt(s2) / np.exp(phi[i, 0])) ** 2 * np.exp(z[i])]
        P = X.T @ X / s2 + np.diag(1 / D)
        np.testing.assert_allclose(V[i], np.linalg.inv(P), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(m[i], np.linalg.solve(P, X.T @ y / s2), rtol=1e-9, atol=1e-12)


def test_scale_mixture_prior_is_laplace():
    site = ShrinkageSite(d=3, penalty="lasso", intercept=False)
    phi = np.tile([np.log(2.0), np.log(0.25)], (40000, 1))  # b = 0.5 / 2 = 0.25
    beta, sig = site.prior_draws(phi, np.random.default_rng(0))
    np.testing.assert_allclose(sig, 0.5)
    assert st.kstest(beta[:, 0], st.laplace(scale=0.25).cdf).pvalue > 0.01
    ridge = ShrinkageSite(d=3, penalty="ridge", intercept=False)
    beta, _ = ridge.prior_draws(phi, np.random.default_rng(0))
    assert st.kstest(beta[:, 1], st.norm(scale=np.sqrt(0.25 / 2.0)).cdf).pvalue > 0.01


def test_bad_options():
    with pytest.raises(ValueError, match="penalty"):
        ShrinkageSite(d=2, penalty="elastic")
    with pytest.raises(ValueError, match="noise"):
        ShrinkageSite(d=2, noise="none")


def test_gibbs_conditional_draws():
    # draw_theta: the Gaussian conditional; draw_locals: 1/e ~ inverse Gaussian(b/|beta|, 1)
    X, y = design()
    site = ShrinkageSite(d=4, penalty="lasso")
    stats = site.stats_from(X, y)
    phi, z = np.array([0.3, np.log(0.2)]), np.array([0.1, -0.4, 0.7, 0.0])
    m, V = site.theta_conditional(phi[None], z[None], stats)
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.PRNGKey(0), 20000)
        args = {k: jax.numpy.asarray(v) for k, v in stats.items()}
        th = np.asarray(
            jax.vmap(
                lambda k: site.draw_theta(
                    site.collapsed_factor(jax.numpy.asarray(phi), jax.numpy.asarray(z), args)[1], k
                )
            )(keys)
        )
        beta = np.array([0.0, 1e-8, 0.05, -0.4, 2.0])  # intercept first; includes beta ~ 0
        u = np.asarray(
            jax.vmap(
                lambda k: site.draw_locals(
                    jax.numpy.asarray(phi), jax.numpy.asarray(beta), jax.numpy.asarray(z), args, k
                )
            )(keys)
        )
    se = np.sqrt(np.diag(V[0]) / len(th))
    np.testing.assert_array_less(np.abs(th.mean(axis=0) - m[0]), 5 * se)
    np.testing.assert_allclose(np.cov(th.T), V[0], atol=5 * np.sqrt(2 / len(th)) * np.diag(V[0]).max())
    assert np.all(np.isfinite(u))
    b = np.sqrt(0.2) / np.exp(0.3)
    for j, bj in enumerate(beta[1:]):
        if bj == 0.0:  # mean b / |beta| infinite: e -> 0 but finite
            continue
        mu = b / abs(bj)
        assert st.kstest(np.exp(-u[:, j]), st.invgauss(mu).cdf).pvalue > 1e-3, (j, mu)


@pytest.mark.parametrize("noise", ["shared", "client"])
def test_gibbs_tilted_moments_equal_nuts(noise):
    # Two samplers of the same tilted target (Metropolis-within-Gibbs, NUTS on the collapsed
    # target): their phi moments must agree to Monte-Carlo error.
    from fedstats.inference.tilted import GibbsTilted, NUTSTilted

    site = ShrinkageSite(d=4, penalty="lasso", noise=noise)
    stats = [site.stats_from(*design(seed=s)) for s in (0, 1)]
    p = site.phi_dim
    cm, cc = np.tile([0.5, np.log(0.1)][:p], (2, 1)), np.tile(np.eye(p) * 0.5, (2, 1, 1))
    g = GibbsTilted(num_warmup=400, num_samples=1500).estimate(site, cm, cc, stats, np.array([3, 4]))
    n = NUTSTilted(num_warmup=400, num_samples=1500, target="collapsed").estimate(site, cm, cc, stats, np.array([5, 6]))
    for a, b in zip(g, n):
        assert a.ok and a.diagnostics["rhat_max"] < 1.05 and a.diagnostics["ess_min"] > 300
        sd = np.sqrt(np.diag(b.cov))
        np.testing.assert_array_less(np.abs(a.mean - b.mean) / sd, 0.05)
        np.testing.assert_allclose(np.sqrt(np.diag(a.cov)) / sd, 1, atol=0.05)


@pytest.mark.parametrize(
    "penalty, scale, noise, intercept",
    [
        ("lasso", "sd", "shared", True),
        ("lasso", "variance", "shared", True),
        ("lasso", "sd", "client", True),
        ("ridge", "sd", "shared", False),
    ],
)
def test_collapsed_gradient_is_that_of_the_dense_marginal(penalty, scale, noise, intercept):
    # log_collapsed's gradient is written out (gaussian_evidence); autodiff of the dense
    # N(y; 0, sigma^2 I + X D X^T) + log p(z) is the oracle, in (phi, z) and, against
    # autodiff of the plain Cholesky formula, in the statistics.
    from jax.scipy.linalg import solve_triangular
    from jax.scipy.stats import multivariate_normal

    X, y = design(d=6)
    X = X if intercept else X[:, 1:]
    site = ShrinkageSite(d=6, penalty=penalty, scale=scale, noise=noise, intercept=intercept, intercept_sd=2.0)
    rng = np.random.default_rng(4)
    jnp = jax.numpy
    with jax.enable_x64(True):
        stats = {k: jnp.asarray(v) for k, v in site.stats_from(X, y).items()}
        phi, z = jnp.asarray(0.5 * rng.normal(size=site.phi_dim)), jnp.asarray(0.5 * rng.normal(size=site.local_dim))

        def dense(phi, z):
            s2, D, lp = site._variances(phi, z)
            cov = s2 * jnp.eye(len(y)) + X @ (D[:, None] * X.T)
            return multivariate_normal.logpdf(jnp.asarray(y), jnp.zeros(len(y)), cov) + lp

        def plain(phi, z, A, b, c, n):
            s2, D, lp = site._variances(phi, z)
            r = jnp.sqrt(D)
            L = jnp.linalg.cholesky(jnp.eye(D.size) + r[:, None] * A * r[None, :] / s2)
            w = solve_triangular(L, r * b, lower=True) / s2
            return -0.5 * n * jnp.log(2 * jnp.pi * s2) - 0.5 * c / s2 - jnp.sum(jnp.log(jnp.diag(L))) + 0.5 * w @ w + lp

        def mine(phi, z, A, b, c, n):
            return site.log_collapsed(phi, z, {"A": A, "b": b, "c": c, "n": n})

        args = (phi, z, stats["A"], stats["b"], stats["c"], stats["n"])
        np.testing.assert_allclose(float(mine(*args)), float(dense(phi, z)), rtol=1e-11)
        argnums = (0, 1) if site.local_dim else (0,)
        for got, ref in zip(jax.grad(mine, argnums)(*args), jax.grad(dense, argnums)(phi, z)):
            np.testing.assert_allclose(got, ref, rtol=1e-8, atol=1e-9)
        for got, ref in zip(jax.grad(mine, (2, 3, 4, 5))(*args), jax.grad(plain, (2, 3, 4, 5))(*args)):
            np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
        # the score from a point's factor (the Gibbs sampler's control variates), without
        # factorising again; also at a point moved along the invariant direction, whose
        # factor is the same
        _, factor = site.collapsed_factor(phi, z, stats)
        v = site.invariant_direction()
        for t in [0.0] + ([0.3] if v is not None else []):
            x = jnp.concatenate([phi, z]) + t * (jnp.asarray(v) if v is not None else 0.0)
            ph, zz = x[: site.phi_dim], x[site.phi_dim :]
            got = site.collapsed_score(ph, zz, stats, factor)
            for g_, r_ in zip(got, jax.grad(dense, (0, 1))(ph, zz)):
                np.testing.assert_allclose(g_, r_, rtol=1e-8, atol=1e-9)
        # second derivatives (the Laplace estimator's Hessian) differentiate the written-out gradient
        x = jnp.concatenate([phi, z])
        f = lambda x: mine(x[: site.phi_dim], x[site.phi_dim :], *args[2:])  # noqa: E731
        g = lambda x: dense(x[: site.phi_dim], x[site.phi_dim :])  # noqa: E731
        np.testing.assert_allclose(jax.jacfwd(jax.grad(f))(x), jax.hessian(g)(x), rtol=1e-7, atol=1e-8)


def test_gibbs_keeps_its_coefficient_draws_for_the_client_posterior():
    # draws["theta_draw"]: the coefficients step 2 drew, one per kept (phi, z), and their
    # reflections through the conditional mean (antithetic pairs, each with its (phi, z)):
    # each pair averages to the Gaussian conditional's mean at its draw (numpy's
    # theta_conditional, the oracle), so the draws' mean is the Rao-Blackwellised mean
    # exactly, and their sd is that of the mixture of conditionals, to Monte-Carlo error
    from fedstats.inference.tilted import GibbsTilted

    site = ShrinkageSite(d=4, penalty="lasso")
    stats = [site.stats_from(*design(seed=s)) for s in (0, 1)]
    cm, cc = np.tile([0.5, np.log(0.1)], (2, 1)), np.tile(np.eye(2) * 0.5, (2, 1, 1))
    res = GibbsTilted().estimate(site, cm, cc, stats, np.array([7, 8]), keep_draws=True)
    for r, s in zip(res, stats):
        th = r.draws["theta_draw"]
        n = len(th) // 2
        assert th.shape == (len(r.draws["phi"]), site.theta_dim) and np.all(np.isfinite(th))
        np.testing.assert_array_equal(r.draws["phi"][:n], r.draws["phi"][n:])
        m, V = site.theta_conditional(r.draws["phi"][:n], r.draws["z"][:n], s)
        np.testing.assert_allclose((th[:n] + th[n:]) / 2, m, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(th.mean(axis=0), m.mean(axis=0), rtol=1e-8, atol=1e-10)
        sd = np.sqrt(m.var(axis=0) + np.diagonal(V, axis1=1, axis2=2).mean(axis=0))
        np.testing.assert_allclose(th.std(axis=0) / sd, 1.0, atol=0.1)


def test_gibbs_resumes_each_client_from_where_its_chains_stopped():
    # A client's result carries its chains' end state; given back (``resume``) its chains
    # continue from there with resume_warmup adaptation iterations (the same compiled
    # kernel), and its moments agree with a cold start's. A state that does not fit (other
    # chain count or dimensions), or none, starts that client cold, in the same call.
    from fedstats.inference.tilted import GibbsTilted

    site = ShrinkageSite(d=4, penalty="lasso")
    stats = [site.stats_from(*design(seed=s)) for s in (0, 1, 2)]
    cm, cc = np.tile([0.5, np.log(0.1)], (3, 1)), np.tile(np.eye(2) * 0.5, (3, 1, 1))
    est = GibbsTilted(num_samples=1000)
    cold = est.estimate(site, cm, cc, stats, np.array([7, 8, 9]))
    for r in cold:
        assert r.diagnostics["warmup"] == est.num_warmup
        assert r.state["x"].shape == (est.num_chains, site.phi_dim + site.local_dim)
        assert r.state["L"].shape == (est.num_chains, site.phi_dim, site.phi_dim)
    bad = {k: v[:2] for k, v in cold[2].state.items()}  # two chains' state for a four-chain estimator
    warm = est.estimate(site, cm, cc, stats, np.array([4, 5, 6]), resume=[cold[0].state, cold[1].state, bad])
    assert [r.diagnostics["warmup"] for r in warm] == [est.resume_warmup, est.resume_warmup, est.num_warmup]
    for a, b in zip(cold, warm):
        sd = np.sqrt(np.diag(a.cov))
        np.testing.assert_array_less(np.abs(a.mean - b.mean) / sd, 0.1)
        np.testing.assert_allclose(np.sqrt(np.diag(b.cov)) / sd, 1.0, atol=0.1)
    # the chains really continue: the first kept draw follows the end state
    again = est.estimate(site, cm, cc, stats[:1], np.array([3]), resume=[warm[0].state], keep_draws=True)
    assert np.all(np.isfinite(again[0].draws["phi"]))
    with pytest.raises(ValueError, match="resume_warmup"):
        GibbsTilted(resume_warmup=-1)
