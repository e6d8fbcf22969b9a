"""Tilted-moment estimators against exact oracles (a Gaussian tilted in the conjugate case)."""

import numpy as np
import pytest

from fedstats.inference.gaussian import NaturalGaussian
from fedstats.inference.tilted import ImportanceTilted, LaplaceTilted, NUTSTilted, make_estimator, zero_variance_moments
from fedstats.linear._hm2_site import HM2Site


def conjugate_case(B=3, seed=0):
    """phi = mu with tau and sigma known: the tilted cavity x f_k is exactly Gaussian."""
    rng = np.random.default_rng(seed)
    site = HM2Site(d=3, tau_kind="known", tau_known=(0.5, 1.0, 2.0), sigma_known=True)
    stats, means, covs, exact = [], [], [], []
    for _ in range(B):
        X = rng.normal(size=(15, 3))
        y = X @ rng.normal(size=3) + 0.4 * rng.normal(size=15)
        s = site.stats_from(X, y, 0.4)
        A = rng.normal(size=(3, 3))
        cav = NaturalGaussian.from_moments(rng.normal(size=3), A @ A.T + np.eye(3))
        m, c = cav.moments()
        stats.append(s)
        means.append(m)
        covs.append(c)
        exact.append((cav * site.exact_site(s)).moments())
    return site, np.stack(means), np.stack(covs), stats, exact


@pytest.mark.parametrize(
    "est, tol",
    [
        (LaplaceTilted(), 1e-7),
        (NUTSTilted(num_warmup=200, num_samples=300, num_chains=2), 1e-5),  # zero-variance CVs: exact
    ],
)
def test_estimators_exact_on_gaussian_tilted(est, tol):
    site, m, c, stats, exact = conjugate_case()
    out = est.estimate(site, m, c, stats, np.arange(3))
    for r, (em, ec) in zip(out, exact):
        assert r.ok
        np.testing.assert_allclose(r.mean, em, atol=tol, rtol=0)
        np.testing.assert_allclose(r.cov, ec, atol=tol, rtol=0)


def test_importance_consistent_on_gaussian_tilted():
    # Here the cavity overlaps the tilted, so the weights vary inside both strata of the
    # defensive proposal: the estimate is consistent, with error shrinking with the draws
    # (measured: variance errors up to 0.26 at 1000 draws, 0.03 at 16000).
    site, m, c, stats, exact = conjugate_case()
    errs = {}
    for n in (1000, 16000):
        out = ImportanceTilted(num_draws=n).estimate(site, m, c, stats, np.arange(3))
        errs[n] = max(np.max(np.abs(np.diag(r.cov) / np.diag(ec) - 1)) for r, (_, ec) in zip(out, exact))
        for r, (em, ec) in zip(out, exact):
            assert r.ok and r.diagnostics["ess"] > 0.3 * n
            assert np.all(np.abs(r.mean - em) / np.sqrt(np.diag(ec)) < 0.06)
    assert errs[1000] < 0.4 and errs[16000] < 0.06 and errs[16000] < errs[1000] / 2


@pytest.mark.parametrize("defensive", [0.0, 0.2, 0.8])
def test_importance_consistent_for_any_defensive_weight(defensive):
    # The strata are sampled in proportion to their weights and the proposal density uses the
    # realised fractions: a mismatch between the two biases every weight.
    site, m, c, stats, exact = conjugate_case()
    est = ImportanceTilted(num_draws=16000, defensive=defensive)
    for r, (em, ec) in zip(est.estimate(site, m, c, stats, np.arange(3)), exact):
        assert r.ok and r.diagnostics["laplace_ok"] == 1.0
        assert np.all(np.abs(r.mean - em) / np.sqrt(np.diag(ec)) < 0.03)
        # measured: variance errors <= 0.03 at defensive 0.2-0.5, <= 0.08 at 0.8 (ESS ~4500)
        assert np.max(np.abs(np.diag(r.cov) / np.diag(ec) - 1)) < 0.12


def test_importance_stratum_sizes():
    from fedstats.inference.tilted.importance import stratum_sizes

    assert stratum_sizes([0.2, 0.8], 1000) == [200, 800]
    assert stratum_sizes([1.0], 1000) == [1000]
    assert stratum_sizes([0.001, 0.999], 1000) == [2, 998]


def test_importance_exact_when_cavity_is_broad():
    # The first-round regime (cavity = a broad prior): the Laplace stratum carries the weight
    # with nearly uniform weights, and the stratum control variate returns its exact moments.
    site, m, c, stats, exact = conjugate_case()
    c = c * 1e4
    exact = [(NaturalGaussian.from_moments(mi, ci) * site.exact_site(s)).moments() for mi, ci, s in zip(m, c, stats)]
    out = ImportanceTilted(num_draws=1000).estimate(site, m, c, stats, np.arange(3))
    for r, (em, ec) in zip(out, exact):
        np.testing.assert_allclose(r.cov, ec, rtol=2e-3, atol=1e-4 * np.max(np.diag(ec)))
        assert np.all(np.abs(r.mean - em) / np.sqrt(np.diag(ec)) < 0.01)


def test_plain_nuts_is_noisy_but_unbiased_and_diagnosed():
    site, m, c, stats, exact = conjugate_case()
    out = NUTSTilted(num_warmup=300, num_samples=1000, num_chains=4, control_variates=False).estimate(
        site, m, c, stats, np.arange(3), keep_draws=True
    )
    for r, (em, ec) in zip(out, exact):
        sd = np.sqrt(np.diag(ec))
        assert np.all(np.abs(r.mean - em) / sd < 0.15)
        assert np.all(np.abs(np.sqrt(np.diag(r.cov)) / sd - 1) < 0.1)
        assert r.diagnostics["rhat_max"] < 1.05 and r.diagnostics["ess_min"] > 300
        assert r.draws["phi"].shape == (4000, 3) and r.draws["theta"].shape == (4000, 3)


def test_zero_variance_moments_exact_for_gaussian_and_less_noisy_for_gamma():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(5, 5))
    S = A @ A.T + np.eye(5)
    mu = rng.normal(size=5)
    x = rng.multivariate_normal(mu, S, size=2000)
    m, C = zero_variance_moments(x, -(x - mu) @ np.linalg.inv(S), 3)
    np.testing.assert_allclose(m, mu[:3], atol=1e-10)
    np.testing.assert_allclose(C, S[:3, :3], atol=1e-10)
    # 32 dimensions, 600 draws: too few for all D^2 products, the reduced set stays exact
    A = rng.normal(size=(32, 32))
    S32 = A @ A.T / 32 + np.eye(32)
    mu32 = rng.normal(size=32)
    x = rng.multivariate_normal(mu32, S32, size=600)
    m, C = zero_variance_moments(x, -(x - mu32) @ np.linalg.inv(S32), 2)
    np.testing.assert_allclose(m, mu32[:2], atol=1e-8)
    np.testing.assert_allclose(C, S32[:2, :2], atol=1e-8)
    assert zero_variance_moments(x[:200], -(x[:200] - mu32) @ np.linalg.inv(S32), 2) is None
    zv, plain = [], []
    for _ in range(100):
        g = rng.gamma(5.0, 1.0, size=(1000, 1))
        zv.append(zero_variance_moments(g, (5.0 - 1) / g - 1, 1)[1][0, 0])
        plain.append(g.var(ddof=1))
    assert abs(np.mean(zv) - 5) < 0.1 and np.std(zv) < 0.85 * np.std(plain)


def test_make_estimator():
    assert make_estimator("nuts", num_samples=10).num_samples == 10
    e = LaplaceTilted()
    assert make_estimator(e) is e
    with pytest.raises(ValueError, match="unknown tilted estimator"):
        make_estimator("metropolis")
    assert make_estimator("gibbs", thin=2).thin == 2
    with pytest.raises(ValueError, match="thin"):
        make_estimator("gibbs", thin=0)
    with pytest.raises(ValueError, match="options"):
        make_estimator(e, newton_steps=3)
    with pytest.raises(ValueError, match="target"):
        NUTSTilted(target="full")


def test_importance_falls_back_to_laplace_where_weights_degenerate():
    # 40 predictors (phi of dimension 80), the prior as cavity: the importance weights of every
    # client collapse (measured ESS 2-50 of 4,000). Without the fallback no client answers and
    # an EP fit stays at the prior; with it each sends its Laplace moments, flagged.
    rng = np.random.default_rng(0)
    d = 40
    site = HM2Site(d=d)
    stats = []
    for _ in range(2):
        X = rng.normal(size=(200, d))
        stats.append(site.stats_from(X, X @ np.ones(d) + 0.05 * rng.normal(size=200)))
    p = site.phi_dim
    m, c = np.zeros((2, p)), np.broadcast_to(np.eye(p), (2, p, p)).copy()
    without = ImportanceTilted(fallback=None).estimate(site, m, c, stats, np.arange(2))
    assert not any(r.ok for r in without) and all("ESS" in r.message for r in without)
    lap = LaplaceTilted().estimate(site, m, c, stats, np.arange(2))
    out = ImportanceTilted().estimate(site, m, c, stats, np.arange(2))
    for r, ref in zip(out, lap):
        assert r.ok and r.diagnostics["laplace_fallback"] == 1.0
        np.testing.assert_allclose(r.mean, ref.mean, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(r.cov, ref.cov, rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match="fallback"):
        ImportanceTilted(fallback="nuts")


def test_quasi_monte_carlo_draws_are_unbiased_and_less_noisy():
    """``qmc=True``: scrambled Sobol draws. Over seeds, the estimated tilted means and
    variances scatter less than with pseudo-random draws, and their average is the exact
    answer within that scatter (randomised QMC is unbiased). Also any number of draws works
    (a prefix of a base-2 sequence, no balance warning)."""
    site, m, c, stats, exact = conjugate_case()
    em, ec = exact[0]
    err = {}
    for qmc in (False, True):
        est = ImportanceTilted(num_draws=1000, qmc=qmc)
        runs = [est.estimate(site, m[:1], c[:1], stats[:1], np.array([s]))[0] for s in range(12)]
        means = np.array([r.mean for r in runs])
        variances = np.array([np.diag(r.cov) for r in runs])
        err[qmc] = np.mean(np.abs(means - em) / np.sqrt(np.diag(ec))) + np.mean(np.abs(variances / np.diag(ec) - 1))
        if qmc:
            se = means.std(0) / np.sqrt(len(runs))
            assert np.all(np.abs(means.mean(0) - em) < 4 * se + 1e-3 * np.sqrt(np.diag(ec)))
    assert err[True] < err[False] / 2
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from fedstats.inference.tilted.kernels import normal_draws

        z = normal_draws(np.random.default_rng(0), 250, 3, True)
    assert z.shape == (250, 3) and abs(z.mean()) < 0.05


def test_every_site_of_the_package_meets_the_site_protocol():
    """The sites fedstats's models hand to the estimators provide every member of
    ``SiteModel`` that the estimators and the EP engine call, and the optional capabilities
    their estimators use (runtime protocol checks: member presence)."""
    from fedstats.glm.sites import HierarchicalSite, SharedSite
    from fedstats.inference.tilted import (
        AugmentedSite,
        ConditionallyGaussianSite,
        ExactSite,
        GibbsSite,
        PreparedSite,
        SiteModel,
    )
    from fedstats.linear._hm2_site import HM2Site
    from fedstats.linear._shrinkage_site import ShrinkageSite

    hm2, lasso = HM2Site(d=3), ShrinkageSite(d=3)
    glm, hier = SharedSite("binomial", "logit", 1.0, 3, 16), HierarchicalSite("binomial", "logit", 1.0, 3, 16)
    assert all(isinstance(s, SiteModel) for s in (hm2, lasso, glm, hier))
    assert isinstance(hm2, ExactSite) and isinstance(hm2, AugmentedSite)  # exact, NUTS on (phi, theta)
    assert isinstance(hm2, ConditionallyGaussianSite)  # the Rao-Blackwellised moments
    assert not any(isinstance(s, ConditionallyGaussianSite) for s in (lasso, glm, hier))
    assert isinstance(lasso, GibbsSite) and isinstance(lasso, AugmentedSite)
    assert isinstance(hier, PreparedSite) and not isinstance(glm, PreparedSite)
    assert not isinstance(glm, ExactSite) and not isinstance(object(), SiteModel)


def test_importance_batch_equals_each_client_alone_with_an_unusable_laplace():
    """Clients are sampled as batches grouped by proposal (defensive mixture, or the cavity
    alone where the Laplace mode is unusable): each client's estimate is the one it gets
    alone, whatever the others in its batch."""
    site, m, c, stats, exact = conjugate_case(B=4, seed=3)
    est = ImportanceTilted(num_draws=2000)
    real_modes = est._modes

    def modes(model, cm, cc, st):  # client 2's Newton solve "fails" (as a NaN mode would)
        x, negH, g = (a.copy() for a in real_modes(model, cm, cc, st))
        bad = [i for i, s in enumerate(st) if s is stats[2]]
        x[bad] = np.nan
        return x, negH, g

    est._modes = modes
    seeds = np.array([11, 12, 13, 14])
    batch = est.estimate(site, m, c, stats, seeds, keep_draws=True)
    assert [r.diagnostics["laplace_ok"] for r in batch] == [1.0, 1.0, 0.0, 1.0]
    for b in range(4):
        alone = est.estimate(site, m[b : b + 1], c[b : b + 1], stats[b : b + 1], seeds[b : b + 1], keep_draws=True)[0]
        np.testing.assert_allclose(batch[b].mean, alone.mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch[b].cov, alone.cov, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(batch[b].draws["phi"], alone.draws["phi"])
    # the cavity-only client is still consistent (its tilted is Gaussian here)
    em, ec = exact[2]
    assert np.all(np.abs(batch[2].mean - em) / np.sqrt(np.diag(ec)) < 0.1)


def test_least_squares_equals_lstsq_also_when_rank_deficient():
    from fedstats.inference.tilted.chains import least_squares

    rng = np.random.default_rng(0)
    H, Y = rng.normal(size=(500, 20)) * np.logspace(-3, 3, 20), rng.normal(size=(500, 3))
    np.testing.assert_allclose(least_squares(H, Y), np.linalg.lstsq(H, Y, rcond=None)[0], rtol=1e-9)
    H[:, 5] = H[:, 4]  # collinear: the minimum-norm solution, as lstsq
    np.testing.assert_allclose(least_squares(H, Y), np.linalg.lstsq(H, Y, rcond=None)[0], rtol=1e-9, atol=1e-12)
    H[:, 6] = 0.0
    np.testing.assert_allclose(least_squares(H, Y), np.linalg.lstsq(H, Y, rcond=None)[0], rtol=1e-9, atol=1e-12)
