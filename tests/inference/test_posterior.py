"""Oracle tests of fedstats.inference.posterior.

Exact quantities are checked against scipy / closed forms; Monte-Carlo quantities
against the exact ones with tolerances of several Monte-Carlo standard errors (all
seeds fixed, so the tests are deterministic).
"""

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats

from fedstats.inference.posterior import (
    GaussianPosterior,
    Posterior,
    SamplePosterior,
    mvn_sample,
    tail_probability_from_prob_positive,
)

LEVELS = [0.5, 0.8, 0.9, 0.95, 0.99]


def random_spd(rng, p, scale=1.0):
    a = rng.normal(size=(p, p))
    return scale * (a @ a.T / p + 0.5 * np.eye(p))


def arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # ArviZ 0.x refactor notice
        import arviz as az
    return az


def gamma_hdi(shape, level):
    """Exact HDI of a Gamma(shape, 1): equal densities at both ends, mass `level`."""

    def width(lo):
        return stats.gamma.ppf(stats.gamma.cdf(lo, shape) + level, shape) - lo

    res = optimize.minimize_scalar(
        width, bounds=(0.0, stats.gamma.ppf(1 - level, shape)), method="bounded", options={"xatol": 1e-10}
    )
    lo = res.x
    return lo, lo + width(lo)


# --------------------------------------------------------------------------------------
# Gaussian: exact intervals and probabilities
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_gaussian_eti_equals_normal_quantiles(level):
    rng = np.random.default_rng(0)
    mean, cov = rng.normal(size=4) * 3, random_spd(rng, 4, scale=2.0)
    lower, upper = GaussianPosterior(mean, cov).credible_interval(level)
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_allclose(lower, stats.norm.ppf((1 - level) / 2, loc=mean, scale=sd), rtol=0, atol=1e-12)
    np.testing.assert_allclose(upper, stats.norm.ppf((1 + level) / 2, loc=mean, scale=sd), rtol=0, atol=1e-12)


@pytest.mark.parametrize("level", LEVELS)
def test_gaussian_hdi_equals_eti(level):
    rng = np.random.default_rng(1)
    post = GaussianPosterior(rng.normal(size=3), random_spd(rng, 3))
    eti, hdi = post.credible_interval(level, "eti"), post.credible_interval(level, "hdi")
    np.testing.assert_array_equal(eti[0], hdi[0])
    np.testing.assert_array_equal(eti[1], hdi[1])


def test_gaussian_moments_and_names():
    cov = np.array([[4.0, 1.0], [1.0, 9.0]])
    post = GaussianPosterior([1.0, -2.0], cov)
    assert post.names == ["theta[0]", "theta[1]"]
    assert post.dim == 2
    np.testing.assert_array_equal(post.mean, [1.0, -2.0])
    np.testing.assert_array_equal(post.cov, cov)
    np.testing.assert_array_equal(post.var, [4.0, 9.0])
    np.testing.assert_array_equal(post.sd, [2.0, 3.0])
    # returned arrays are copies: mutating them does not change the posterior
    m = post.mean
    m[0] = 99.0
    assert post.mean[0] == 1.0


def test_gaussian_prob_positive_and_tail_probability_exact():
    mean = np.array([0.3, -1.5, 4.0, 0.0])
    sd = np.array([1.0, 0.5, 2.0, 3.0])
    post = GaussianPosterior(mean, np.diag(sd**2))
    np.testing.assert_allclose(post.prob_positive(), stats.norm.cdf(mean / sd), atol=1e-15)
    np.testing.assert_allclose(post.tail_probability(), 2 * stats.norm.sf(np.abs(mean) / sd), atol=1e-15)
    assert post.tail_probability()[3] == 1.0


def test_gaussian_tail_probability_far_tail_no_cancellation():
    post = GaussianPosterior([12.0], [[1.0]])
    # 1 - cdf would round to 0; the exact value is 2 * sf(12) ~ 3.6e-33
    np.testing.assert_allclose(post.tail_probability(), 2 * stats.norm.sf(12.0), rtol=1e-12)
    assert post.tail_probability()[0] > 0


def test_gaussian_degenerate_component():
    # singular covariance: third component is exactly theta_0 + theta_1, fourth is fixed
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    post = GaussianPosterior([1.0, -1.0, 0.0, 0.0], a @ a.T)
    # the point mass at 0 counts half: P(>0) = 1/2, p_B = 1
    assert post.prob_positive()[3] == 0.5
    assert post.tail_probability()[3] == 1.0
    lo, hi = post.credible_interval(0.9)
    assert lo[3] == hi[3] == 0.0
    draws = post.sample(20_000, seed=3)
    # up to the Cholesky jitter (at most 1e-8 x the mean variance)
    np.testing.assert_allclose(draws[:, 2], draws[:, 0] + draws[:, 1], atol=1e-3)
    np.testing.assert_allclose(draws[:, 3], 0.0, atol=1e-3)
    np.testing.assert_allclose(np.cov(draws.T), a @ a.T, atol=0.05)
    fixed = GaussianPosterior([2.0, -3.0], np.zeros((2, 2)))
    np.testing.assert_array_equal(fixed.prob_positive(), [1.0, 0.0])
    np.testing.assert_array_equal(fixed.tail_probability(), [0.0, 0.0])


def test_gaussian_prob_monte_carlo_against_exact():
    cov = np.array([[1.0, 0.3], [0.3, 2.0]])
    post = GaussianPosterior([0.5, 0.0], cov)
    exact = stats.norm.cdf(0.5 / np.sqrt(1.0 + 2.0 - 2 * 0.3))  # P(theta0 > theta1)
    est = post.prob(lambda t: t[:, 0] > t[:, 1])
    assert abs(est - exact) < 5 * np.sqrt(exact * (1 - exact) / 100_000)
    # default seed is fixed, another seed gives another (close) estimate
    assert est == post.prob(lambda t: t[:, 0] > t[:, 1])
    other = post.prob(lambda t: t[:, 0] > t[:, 1], n=50_000, seed=7)
    assert other != est and abs(other - exact) < 5 * np.sqrt(exact * (1 - exact) / 50_000)
    # 0/1 integers are accepted as booleans
    assert post.prob(lambda t: (t[:, 0] > t[:, 1]).astype(int)) == est


def test_gaussian_sample_moments_and_seeding():
    rng = np.random.default_rng(4)
    mean, cov = rng.normal(size=3), random_spd(rng, 3)
    post = GaussianPosterior(mean, cov)
    draws = post.sample(200_000, seed=11)
    assert draws.shape == (200_000, 3)
    np.testing.assert_array_less(np.abs(draws.mean(axis=0) - mean), 5 * np.sqrt(cov.diagonal() / 2e5))
    np.testing.assert_allclose(np.cov(draws.T), cov, atol=0.03)
    np.testing.assert_array_equal(post.sample(5, seed=1), post.sample(5, seed=1))
    np.testing.assert_array_equal(post.sample(5, seed=np.random.default_rng(1)), post.sample(5, seed=1))
    assert not np.array_equal(post.sample(5, seed=1), post.sample(5, seed=2))


def test_no_global_rng_used():
    np.random.seed(123)
    expected = np.random.random()
    np.random.seed(123)
    GaussianPosterior([0.0], [[1.0]]).sample(10)
    SamplePosterior(np.arange(10.0), weights=np.ones(10)).sample(10)
    mvn_sample([0.0], [[1.0]], 10)
    assert np.random.random() == expected


# --------------------------------------------------------------------------------------
# information form
# --------------------------------------------------------------------------------------


def test_from_natural_matches_moment_form():
    rng = np.random.default_rng(5)
    Q = random_spd(rng, 5, scale=3.0)
    r = rng.normal(size=5)
    post = GaussianPosterior.from_natural(r, Q, names=list("abcde"))
    np.testing.assert_allclose(post.mean, np.linalg.solve(Q, r), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(post.cov, np.linalg.inv(Q), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(post.cov, post.cov.T)
    assert post.names == list("abcde")
    # sampling uses the precision's factor: the sample covariance still matches
    draws = post.sample(200_000, seed=0)
    np.testing.assert_allclose(np.cov(draws.T), np.linalg.inv(Q), atol=0.01)
    r2, Q2 = post.to_natural()
    np.testing.assert_allclose(Q2, Q, rtol=1e-12)
    np.testing.assert_allclose(r2, r, rtol=1e-10, atol=1e-12)


def test_to_natural_from_moment_form_round_trip():
    rng = np.random.default_rng(6)
    mean, cov = rng.normal(size=3), random_spd(rng, 3)
    r, Q = GaussianPosterior(mean, cov).to_natural()
    np.testing.assert_allclose(Q, np.linalg.inv(cov), rtol=1e-10)
    np.testing.assert_allclose(r, np.linalg.solve(cov, mean), rtol=1e-10)
    back = GaussianPosterior.from_natural(r, Q)
    np.testing.assert_allclose(back.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(back.cov, cov, rtol=1e-10)


def test_natural_form_errors():
    with pytest.raises(ValueError, match="not positive definite"):
        GaussianPosterior.from_natural([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="not positive definite"):
        GaussianPosterior.from_natural([0.0, 0.0], [[1.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="not symmetric"):
        GaussianPosterior.from_natural([0.0, 0.0], [[2.0, 1.0], [0.0, 2.0]])
    with pytest.raises(ValueError, match="shape"):
        GaussianPosterior.from_natural([0.0, 0.0], np.eye(3))
    with pytest.raises(ValueError, match="NaN"):
        GaussianPosterior.from_natural([np.nan, 0.0], np.eye(2))
    with pytest.raises(ValueError, match="singular"):
        GaussianPosterior([0.0, 0.0], [[1.0, 1.0], [1.0, 1.0]]).to_natural()


# --------------------------------------------------------------------------------------
# samples: intervals against exact answers
# --------------------------------------------------------------------------------------


def test_sample_eti_within_monte_carlo_error():
    n = 200_000
    mean, cov = np.array([1.0, -2.0]), np.array([[1.0, 0.6], [0.6, 4.0]])
    draws = np.random.default_rng(7).multivariate_normal(mean, cov, size=n)
    post = SamplePosterior(draws)
    sd = np.sqrt(np.diag(cov))
    for level in (0.8, 0.95):
        q = (1 - level) / 2
        # Monte-Carlo sd of a sample q-quantile: sqrt(q (1 - q) / n) / density
        mc_se = np.sqrt(q * (1 - q) / n) / stats.norm.pdf(stats.norm.ppf(q)) * sd
        lo, hi = post.credible_interval(level)
        np.testing.assert_array_less(np.abs(lo - stats.norm.ppf(q, mean, sd)), 5 * mc_se)
        np.testing.assert_array_less(np.abs(hi - stats.norm.ppf(1 - q, mean, sd)), 5 * mc_se)
        hlo, hhi = post.credible_interval(level, kind="hdi")
        np.testing.assert_array_less(np.abs(hlo - stats.norm.ppf(q, mean, sd)), 10 * mc_se)
        np.testing.assert_array_less(np.abs(hhi - stats.norm.ppf(1 - q, mean, sd)), 10 * mc_se)
    np.testing.assert_array_less(np.abs(post.mean - mean), 5 * sd / np.sqrt(n))
    np.testing.assert_allclose(post.cov, np.cov(draws.T), rtol=1e-10)
    np.testing.assert_allclose(post.sd, sd, rtol=0.01)


def test_sample_eti_definition_on_small_sample():
    post = SamplePosterior(np.arange(1.0, 101.0))
    lo, hi = post.credible_interval(0.9)
    # less than 5% of the draws lie strictly outside each end, endpoints are draws
    assert (lo[0], hi[0]) == (5.0, 96.0)
    lo, hi = post.credible_interval(0.5)
    assert (lo[0], hi[0]) == (25.0, 76.0)
    # the interval is symmetric under reflection theta -> -theta
    neg = SamplePosterior(-np.arange(1.0, 101.0)).credible_interval(0.9)
    assert (neg[0][0], neg[1][0]) == (-96.0, -5.0)


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95])
def test_hdi_of_skewed_sample(level):
    shape, n = 2.0, 200_000
    x = np.random.default_rng(8).gamma(shape, size=n)
    post = SamplePosterior(x)
    hlo, hhi = post.credible_interval(level, kind="hdi")
    elo, ehi = post.credible_interval(level, kind="eti")
    assert hhi[0] - hlo[0] < ehi[0] - elo[0]
    inside = np.mean((x >= hlo[0]) & (x <= hhi[0]))
    assert level <= inside <= level + 2.0 / n
    exact_lo, exact_hi = gamma_hdi(shape, level)
    assert abs(hlo[0] - exact_lo) < 0.03 and abs(hhi[0] - exact_hi) < 0.03
    # the exact HDI is shorter than the exact ETI, and the sample HDI tracks its width
    exact_eti = stats.gamma.ppf([(1 - level) / 2, (1 + level) / 2], shape)
    assert exact_hi - exact_lo < np.diff(exact_eti)[0]
    assert abs((hhi[0] - hlo[0]) - (exact_hi - exact_lo)) < 0.03


def test_hdi_is_shortest_on_small_sample():
    x = np.array([0.0, 0.1, 0.2, 0.3, 5.0, 9.0, 20.0])
    lo, hi = SamplePosterior(x).credible_interval(0.5, kind="hdi")  # 4 of 7 draws
    assert (lo[0], hi[0]) == (0.0, 0.3)
    lo, hi = SamplePosterior(x).credible_interval(0.7, kind="hdi")  # 5 of 7 draws
    assert (lo[0], hi[0]) == (0.0, 5.0)


def test_sample_moments_cov_matches_numpy():
    rng = np.random.default_rng(9)
    draws = rng.normal(size=(500, 3))
    post = SamplePosterior(draws)
    np.testing.assert_allclose(post.mean, draws.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(post.cov, np.cov(draws.T), rtol=1e-12)
    np.testing.assert_allclose(post.sd, draws.std(axis=0, ddof=1), rtol=1e-12)


# --------------------------------------------------------------------------------------
# importance weights
# --------------------------------------------------------------------------------------


def test_importance_weights_reproduce_target():
    n = 200_000
    rng = np.random.default_rng(10)
    x = rng.normal(0.0, 2.0, size=n)  # proposal N(0, 2^2)
    w = stats.norm.pdf(x, 1.0, 0.5) / stats.norm.pdf(x, 0.0, 2.0)  # target N(1, 0.5^2)
    post = SamplePosterior(x, weights=w)
    # a weighted estimate's error is ~ sd / sqrt(ESS); here ESS is ~ n / 2.3
    ess = w.sum() ** 2 / np.sum(w**2)
    assert abs(post.mean[0] - 1.0) < 5 * 0.5 / np.sqrt(ess)
    assert abs(post.sd[0] - 0.5) < 0.01
    lo, hi = post.credible_interval(0.9)
    assert abs(lo[0] - stats.norm.ppf(0.05, 1.0, 0.5)) < 0.02
    assert abs(hi[0] - stats.norm.ppf(0.95, 1.0, 0.5)) < 0.02
    assert abs(post.prob_positive()[0] - stats.norm.sf(0.0, 1.0, 0.5)) < 0.005
    # the unweighted draws are far from the target: the weights matter
    assert abs(SamplePosterior(x).mean[0] - 1.0) > 0.5
    # resampling by weight gives draws from the target
    res = post.sample(100_000, seed=1)
    assert abs(res.mean() - 1.0) < 0.01 and abs(res.std() - 0.5) < 0.01


def test_weights_are_normalised_and_scale_free():
    rng = np.random.default_rng(11)
    x, w = rng.normal(size=(1000, 2)), rng.uniform(size=1000)
    a, b = SamplePosterior(x, weights=w), SamplePosterior(x, weights=1e6 * w)
    np.testing.assert_allclose(a.weights.sum(), 1.0)
    np.testing.assert_allclose(a.weights, w / w.sum())
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12)
    np.testing.assert_allclose(a.cov, b.cov, rtol=1e-10)
    np.testing.assert_array_equal(a.credible_interval(0.9)[0], b.credible_interval(0.9)[0])


def test_unit_weights_equal_unweighted():
    x = np.random.default_rng(12).normal(size=(999, 2))
    a, b = SamplePosterior(x), SamplePosterior(x, weights=np.ones(999))
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12)
    np.testing.assert_allclose(a.cov, b.cov, rtol=1e-10)
    for kind in ("eti", "hdi"):
        for level in LEVELS:
            np.testing.assert_array_equal(a.credible_interval(level, kind), b.credible_interval(level, kind))
    np.testing.assert_allclose(a.prob_positive(), b.prob_positive(), rtol=1e-12)


def test_integer_weights_equal_replicated_draws():
    rng = np.random.default_rng(13)
    x = rng.normal(size=(200, 2))
    counts = rng.integers(0, 4, size=200)
    weighted = SamplePosterior(x, weights=counts)
    replicated = SamplePosterior(np.repeat(x, counts, axis=0))
    np.testing.assert_allclose(weighted.mean, replicated.mean, rtol=1e-12)
    for kind in ("eti", "hdi"):
        for level in (0.5, 0.9):
            np.testing.assert_allclose(
                weighted.credible_interval(level, kind), replicated.credible_interval(level, kind), rtol=1e-12
            )
    np.testing.assert_allclose(weighted.prob_positive(), replicated.prob_positive(), rtol=1e-12)
    pred = lambda t: t[:, 0] + t[:, 1] > 0.3  # noqa: E731
    assert abs(weighted.prob(pred) - replicated.prob(pred)) < 1e-12


def test_weighted_covariance_formula():
    x = np.array([[0.0], [1.0], [3.0]])
    w = np.array([0.2, 0.3, 0.5])
    post = SamplePosterior(x, weights=w)
    m = 0.2 * 0 + 0.3 * 1 + 0.5 * 3
    var = (0.2 * m**2 + 0.3 * (1 - m) ** 2 + 0.5 * (3 - m) ** 2) / (1 - 0.04 - 0.09 - 0.25)
    np.testing.assert_allclose(post.mean, [m])
    np.testing.assert_allclose(post.var, [var])
    # all weight on one draw: a variance cannot be estimated
    assert np.isnan(SamplePosterior(x, weights=[0.0, 1.0, 0.0]).var[0])


def test_weighted_sample_resamples_by_weight():
    post = SamplePosterior([[0.0], [1.0]], weights=[0.1, 0.9])
    draws = post.sample(100_000, seed=2)
    assert abs(draws.mean() - 0.9) < 5 * np.sqrt(0.09 / 100_000)
    assert set(np.unique(draws)) == {0.0, 1.0}


def test_zero_weight_draw_is_never_an_endpoint():
    x = np.array([-100.0, 1.0, 2.0, 3.0, 4.0, 100.0])
    post = SamplePosterior(x, weights=[0, 1, 1, 1, 1, 0])
    for kind in ("eti", "hdi"):
        lo, hi = post.credible_interval(0.95, kind)
        assert lo[0] == 1.0 and hi[0] == 4.0


# --------------------------------------------------------------------------------------
# tail probability and its identity with the equal-tailed interval
# --------------------------------------------------------------------------------------


def test_tail_identity_on_random_gaussians():
    rng = np.random.default_rng(14)
    excluded_seen = included_seen = 0
    for _ in range(300):
        p = 5
        post = GaussianPosterior(rng.normal(0, 2, size=p), random_spd(rng, p))
        pb = post.tail_probability()
        for a in rng.uniform(0.001, 0.5, size=5):
            lo, hi = post.credible_interval(1 - a, "eti")
            excludes = (lo > 0) | (hi < 0)
            np.testing.assert_array_equal(excludes, pb < a)
            excluded_seen += excludes.sum()
            included_seen += (~excludes).sum()
    assert excluded_seen > 100 and included_seen > 100  # both branches exercised


@pytest.mark.parametrize("weighted", [False, True])
def test_tail_identity_on_random_samples(weighted):
    rng = np.random.default_rng(15)
    excluded_seen = included_seen = 0
    for _ in range(300):
        n = int(rng.integers(20, 400))
        x = rng.normal(rng.normal(0, 2, size=3), 1.0, size=(n, 3))
        w = rng.exponential(size=n) if weighted else None
        post = SamplePosterior(x, weights=w)
        pb = post.tail_probability()
        for a in rng.uniform(0.01, 0.5, size=5):
            lo, hi = post.credible_interval(1 - a, "eti")
            excludes = (lo > 0) | (hi < 0)
            np.testing.assert_array_equal(excludes, pb < a)
            excluded_seen += excludes.sum()
            included_seen += (~excludes).sum()
    assert excluded_seen > 100 and included_seen > 100


@pytest.mark.parametrize("level", [0.8, 0.9, 0.95])
def test_tail_identity_at_exact_boundaries(level):
    # n * (1 - level) / 2 negative draws puts p_B exactly at 1 - level (up to rounding):
    # the identity must still hold draw-for-draw, on both sides
    n = 200
    for k in range(0, 40):
        x = np.concatenate((-np.arange(1.0, k + 1), np.arange(1.0, n - k + 1)))
        post = SamplePosterior(x)
        lo, hi = post.credible_interval(level)
        assert (lo[0] > 0 or hi[0] < 0) == (post.tail_probability()[0] < 1 - level), k
        post = SamplePosterior(-x)
        lo, hi = post.credible_interval(level)
        assert (lo[0] > 0 or hi[0] < 0) == (post.tail_probability()[0] < 1 - level), k


def test_sample_tail_probability_ties_count_half():
    post = SamplePosterior([[-1.0], [0.0], [0.0], [2.0], [3.0]])
    # P(>0) = (2 + 0.5 * 2) / 5 = 0.6, P(<0) = 0.4
    np.testing.assert_allclose(post.prob_positive(), [0.6])
    np.testing.assert_allclose(post.tail_probability(), [0.8])
    weighted = SamplePosterior([[-1.0], [0.0], [2.0]], weights=[0.1, 0.2, 0.7])
    np.testing.assert_allclose(weighted.prob_positive(), [0.8])
    np.testing.assert_allclose(weighted.tail_probability(), [0.4])


def test_tail_probability_helper():
    np.testing.assert_allclose(tail_probability_from_prob_positive([0.0, 0.2, 0.5, 0.975, 1.0]), [0, 0.4, 1, 0.05, 0])


def test_sample_prob():
    post = SamplePosterior([[1.0, 0.0], [2.0, 3.0], [0.0, -1.0], [5.0, 5.5]])
    assert post.prob(lambda t: t[:, 0] > t[:, 1]) == 0.5
    weighted = SamplePosterior(post.draws, weights=[1.0, 2.0, 3.0, 4.0])
    assert weighted.prob(lambda t: t[:, 0] > t[:, 1]) == pytest.approx(0.4)


# --------------------------------------------------------------------------------------
# marginal and affine
# --------------------------------------------------------------------------------------


def test_gaussian_marginal():
    mean = np.array([1.0, 2.0, 3.0])
    cov = np.array([[4.0, 1.0, 0.5], [1.0, 9.0, 2.0], [0.5, 2.0, 16.0]])
    post = GaussianPosterior(mean, cov, names=["a", "b", "c"])
    sub = post.marginal(["c", "a"])
    assert isinstance(sub, GaussianPosterior) and sub.names == ["c", "a"]
    np.testing.assert_array_equal(sub.mean, [3.0, 1.0])
    np.testing.assert_array_equal(sub.cov, [[16.0, 0.5], [0.5, 4.0]])
    assert post.marginal(1).names == ["b"]
    assert post.marginal(-1).names == ["c"]
    assert post.marginal(slice(0, 2)).names == ["a", "b"]
    assert post.marginal(np.array([2, 0])).names == ["c", "a"]
    np.testing.assert_array_equal(post.marginal("b").credible_interval(0.9)[0], post.credible_interval(0.9)[0][[1]])


def test_sample_marginal_keeps_chains_and_weights():
    rng = np.random.default_rng(16)
    chains = rng.normal(size=(3, 100, 4))
    post = SamplePosterior(chains, names=list("abcd"))
    sub = post.marginal(["d", "b"])
    assert isinstance(sub, SamplePosterior) and sub.names == ["d", "b"]
    assert sub.n_chains == 3 and sub.n_draws == 300
    np.testing.assert_array_equal(sub.draws, chains[..., [3, 1]].reshape(-1, 2))
    w = rng.uniform(size=(3, 100))
    wsub = SamplePosterior(chains, weights=w).marginal(0)
    np.testing.assert_allclose(wsub.weights, w.ravel() / w.sum())
    np.testing.assert_allclose(wsub.mean, [w.ravel() / w.sum() @ chains[..., 0].ravel()])
    # the marginal's intervals are exactly the parent's (weights reused bit for bit)
    parent = SamplePosterior(chains, weights=w)
    for kind in ("eti", "hdi"):
        np.testing.assert_array_equal(
            parent.marginal([2, 0]).credible_interval(0.9, kind),
            np.asarray(parent.credible_interval(0.9, kind))[:, [2, 0]],
        )


@pytest.mark.parametrize(
    "selector, error",
    [
        ("z", KeyError),
        (3, IndexError),
        (-4, IndexError),
        ([0, 0], ValueError),
        ([], ValueError),
        (True, TypeError),
        (1.5, TypeError),
    ],
)
def test_marginal_errors(selector, error):
    post = GaussianPosterior(np.zeros(3), np.eye(3), names=["a", "b", "c"])
    with pytest.raises(error):
        post.marginal(selector)
    with pytest.raises(error):
        SamplePosterior(np.zeros((5, 3)), names=["a", "b", "c"]).marginal(selector)


def test_gaussian_affine_exact():
    post = GaussianPosterior([1.0, 2.0], [[2.0, 0.5], [0.5, 1.0]])
    A = np.array([[1.0, 1.0], [2.0, -1.0], [0.0, 3.0]])
    out = post.affine(A, b=[1.0, 0.0, -1.0], names=["s", "d", "t"])
    # by hand: means 1+2+1, 2*1-2, 3*2-1
    np.testing.assert_allclose(out.mean, [4.0, 0.0, 5.0])
    # var(t0+t1) = 2+1+2*0.5; var(2t0-t1) = 8+1-2*2*0.5; var(3t1) = 9;
    # cov(s, d) = 2*2 - 0.5 + 2*0.5 - 1 = 3.5; cov(s, t) = 3*0.5 + 3*1 = 4.5;
    # cov(d, t) = 2*3*0.5 - 3*1 = 0
    np.testing.assert_allclose(out.cov, [[4.0, 3.5, 4.5], [3.5, 7.0, 0.0], [4.5, 0.0, 9.0]], atol=1e-14)
    assert out.names == ["s", "d", "t"] and isinstance(out, GaussianPosterior)
    # a vector A is a single linear combination; a scalar b is broadcast
    one = post.affine([1.0, -1.0], b=3.0)
    np.testing.assert_allclose(one.mean, [2.0])
    np.testing.assert_allclose(one.cov, [[2.0]])
    assert one.names == ["theta[0]"]


def test_sample_affine_drawwise():
    rng = np.random.default_rng(17)
    chains = rng.normal(size=(2, 50, 3))
    w = rng.uniform(size=(2, 50))
    post = SamplePosterior(chains, weights=w)
    A, b = rng.normal(size=(2, 3)), np.array([1.0, -1.0])
    out = post.affine(A, b)
    assert out.n_chains == 2
    np.testing.assert_allclose(out.draws, chains.reshape(-1, 3) @ A.T + b, rtol=1e-12)
    np.testing.assert_allclose(out.mean, A @ post.mean + b, rtol=1e-10)
    np.testing.assert_allclose(out.cov, A @ post.cov @ A.T, rtol=1e-10)
    np.testing.assert_array_equal(out.weights, post.weights)


def test_affine_errors():
    post = GaussianPosterior(np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="shape"):
        post.affine(np.ones((2, 3)))
    with pytest.raises(ValueError, match="shape"):
        post.affine(np.ones((2, 2)), b=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="names"):
        post.affine(np.ones((2, 2)), names=["only one"])


# --------------------------------------------------------------------------------------
# summary and ArviZ
# --------------------------------------------------------------------------------------


def test_gaussian_summary():
    post = GaussianPosterior([1.0, -0.2], np.diag([0.25, 1.0]), names=["a", "b"])
    table = post.summary(level=0.9)
    assert isinstance(table, pd.DataFrame)
    assert list(table.index) == ["a", "b"]
    assert list(table.columns) == ["mean", "sd", "lower", "upper", "p_value"]
    np.testing.assert_allclose(table["lower"], stats.norm.ppf(0.05, [1.0, -0.2], [0.5, 1.0]))
    np.testing.assert_allclose(table["p_value"], post.tail_probability())
    np.testing.assert_allclose(table["sd"], [0.5, 1.0])


def test_sample_summary_without_chains_has_no_diagnostics():
    table = SamplePosterior(np.random.default_rng(0).normal(size=(100, 2))).summary(kind="hdi")
    assert list(table.columns) == ["mean", "sd", "lower", "upper", "p_value"]


def test_sample_summary_diagnostics_match_arviz():
    az = arviz()
    rng = np.random.default_rng(18)
    c, n, p = 4, 400, 3
    x = np.zeros((c, n, p))
    for t in range(1, n):  # autocorrelated chains, one shifted: ESS < n, R-hat > 1
        x[:, t] = 0.7 * x[:, t - 1] + rng.normal(size=(c, p))
    x[2, :, 0] += 1.0  # location shift: caught by the bulk R-hat
    x[3, :, 1] *= 3.0  # scale difference: caught by the folded (tail) R-hat only
    post = SamplePosterior(x, names=["a", "b", "c"])
    table = post.summary()
    idata = post.to_arviz()
    np.testing.assert_allclose(table["ess"], az.ess(idata, method="bulk")["theta"].values, rtol=1e-8)
    np.testing.assert_allclose(table["r_hat"], az.rhat(idata)["theta"].values, rtol=1e-10)
    assert table["r_hat"]["a"] > 1.05 and table["r_hat"]["b"] > 1.05
    assert table["r_hat"]["c"] < 1.02 and table["ess"]["c"] < c * n / 2
    # one chain: R-hat is undefined
    single = SamplePosterior(x[:1]).summary()
    assert np.isnan(single["r_hat"]).all() and np.isfinite(single["ess"]).all()


def test_gaussian_to_arviz():
    az = arviz()
    mean, cov = np.array([1.0, -1.0, 0.5]), np.diag([1.0, 4.0, 0.25])
    post = GaussianPosterior(mean, cov, names=["a", "b", "c"])
    idata = post.to_arviz()
    assert isinstance(idata, az.InferenceData)
    theta = idata.posterior["theta"]
    assert theta.shape == (4, 1000, 3)
    assert theta.dims == ("chain", "draw", "theta_dim_0")
    assert list(theta["theta_dim_0"].values) == ["a", "b", "c"]
    summ = az.summary(idata, round_to="none", kind="stats")
    stored_mean = theta.values.reshape(-1, 3).mean(axis=0)
    np.testing.assert_allclose(summ["mean"].values, stored_mean, rtol=1e-12)
    np.testing.assert_allclose(summ["mean"].values, mean, atol=5 * np.sqrt(4.0 / 4000))
    # seeded, and the arguments are honoured
    np.testing.assert_array_equal(post.to_arviz().posterior["theta"].values, theta.values)
    other = post.to_arviz(var_name="beta", n=600, seed=3, n_chains=2)
    assert other.posterior["beta"].shape == (2, 300, 3)
    assert not np.array_equal(other.posterior["beta"].values[0], theta.values[0, :300])
    with pytest.raises(ValueError, match="multiple"):
        post.to_arviz(n=1001)


def test_sample_to_arviz_keeps_chains():
    az = arviz()
    chains = np.random.default_rng(19).normal(size=(3, 200, 2))
    post = SamplePosterior(chains, names=["x", "y"])
    idata = post.to_arviz(var_name="beta")
    np.testing.assert_array_equal(idata.posterior["beta"].values, chains)
    assert list(idata.posterior["beta_dim_0"].values) == ["x", "y"]
    summ = az.summary(idata, round_to="none")
    np.testing.assert_allclose(summ["mean"].values, post.mean, rtol=1e-12)
    np.testing.assert_allclose(summ["sd"].values, post.sd, rtol=1e-12)
    flat = SamplePosterior(chains[0]).to_arviz()
    assert flat.posterior["theta"].shape == (1, 200, 2)


def test_weighted_to_arviz_resamples():
    x = np.array([[0.0], [1.0]])
    idata = SamplePosterior(x, weights=[0.0, 1.0]).to_arviz(n=50)
    assert idata.posterior["theta"].shape == (1, 50, 1)
    assert np.all(idata.posterior["theta"].values == 1.0)


# --------------------------------------------------------------------------------------
# mvn_sample
# --------------------------------------------------------------------------------------


def test_mvn_sample_singular_covariance():
    a = np.array([[1.0, 0.0], [1.0, 0.0], [0.5, 2.0]])
    cov = a @ a.T  # rank 2 in dimension 3
    x = mvn_sample([1.0, 2.0, 3.0], cov, 100_000, rng=0)
    assert x.shape == (100_000, 3)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.05)
    np.testing.assert_allclose(x[:, 0] - x[:, 1], -1.0, atol=1e-3)  # the null direction
    np.testing.assert_array_equal(x, mvn_sample([1.0, 2.0, 3.0], cov, 100_000, rng=0))


def test_mvn_sample_errors():
    with pytest.raises(ValueError, match="positive semi-definite"):
        mvn_sample([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]], 10, rng=0)
    with pytest.raises(ValueError, match="positive integer"):
        mvn_sample([0.0], [[1.0]], 0, rng=0)


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [0.0, 1.0, -0.5, 1.5, "0.95", None, True, np.nan])
def test_invalid_level(level):
    for post in (GaussianPosterior([0.0], [[1.0]]), SamplePosterior(np.arange(10.0))):
        with pytest.raises(ValueError, match="level"):
            post.credible_interval(level)


@pytest.mark.parametrize("kind", ["ETI", "hpd", "", None])
def test_invalid_kind(kind):
    for post in (GaussianPosterior([0.0], [[1.0]]), SamplePosterior(np.arange(10.0))):
        with pytest.raises(ValueError, match="kind"):
            post.credible_interval(0.9, kind=kind)
        with pytest.raises(ValueError, match="kind"):
            post.summary(kind=kind)


def test_gaussian_validation():
    with pytest.raises(ValueError, match="NaN"):
        GaussianPosterior([np.nan, 0.0], np.eye(2))
    with pytest.raises(ValueError, match="NaN"):
        GaussianPosterior([0.0, 0.0], [[1.0, np.inf], [np.inf, 1.0]])
    with pytest.raises(ValueError, match="shape"):
        GaussianPosterior([0.0, 0.0], np.eye(3))
    with pytest.raises(ValueError, match="diag"):
        GaussianPosterior([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="not symmetric"):
        GaussianPosterior([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]])
    with pytest.raises(ValueError, match="positive semi-definite"):
        GaussianPosterior([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="positive semi-definite"):
        GaussianPosterior([0.0], [[-1.0]])
    with pytest.raises(ValueError, match="vector"):
        GaussianPosterior(np.zeros((2, 2)), np.eye(2))
    with pytest.raises(ValueError, match="names"):
        GaussianPosterior([0.0, 0.0], np.eye(2), names=["a"])
    with pytest.raises(ValueError, match="unique"):
        GaussianPosterior([0.0, 0.0], np.eye(2), names=["a", "a"])
    with pytest.raises(TypeError, match="strings"):
        GaussianPosterior([0.0, 0.0], np.eye(2), names=["a", 1])


def test_gaussian_small_asymmetry_is_symmetrised():
    cov = np.array([[2.0, 0.5 + 1e-13], [0.5, 1.0]])
    post = GaussianPosterior([0.0, 0.0], cov)
    np.testing.assert_array_equal(post.cov, post.cov.T)
    np.testing.assert_allclose(post.cov[0, 1], 0.5, rtol=1e-12)


def test_scalar_inputs_for_one_component():
    post = GaussianPosterior(2.0, 4.0)
    assert post.dim == 1 and post.sd[0] == 2.0


def test_sample_validation():
    with pytest.raises(ValueError, match="NaN"):
        SamplePosterior([[0.0, np.nan], [1.0, 2.0]])
    with pytest.raises(ValueError, match="shape"):
        SamplePosterior(np.zeros((2, 3, 4, 5)))
    with pytest.raises(ValueError, match="non-empty"):
        SamplePosterior(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="non-negative"):
        SamplePosterior(np.zeros((3, 1)), weights=[1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="positive sum"):
        SamplePosterior(np.zeros((3, 1)), weights=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="shape"):
        SamplePosterior(np.zeros((3, 1)), weights=[1.0, 1.0])
    with pytest.raises(ValueError, match="NaN"):
        SamplePosterior(np.zeros((3, 1)), weights=[1.0, np.nan, 1.0])
    with pytest.raises(ValueError, match="names"):
        SamplePosterior(np.zeros((3, 2)), names=["a"])
    # weights may be given per chain and draw, or flattened
    chains = np.random.default_rng(0).normal(size=(2, 5, 1))
    w = np.arange(1.0, 11.0)
    np.testing.assert_allclose(
        SamplePosterior(chains, weights=w.reshape(2, 5)).mean, SamplePosterior(chains, weights=w).mean
    )


def test_sample_draws_are_read_only_copies():
    x = np.arange(6.0).reshape(3, 2)
    post = SamplePosterior(x)
    x[0, 0] = 100.0  # the caller's array is copied
    assert post.draws[0, 0] == 0.0
    with pytest.raises(ValueError):
        post.draws[0, 0] = 5.0


def test_pred_validation():
    for post in (GaussianPosterior([0.0, 0.0], np.eye(2)), SamplePosterior(np.zeros((10, 2)))):
        with pytest.raises(ValueError, match="one boolean per draw"):
            post.prob(lambda t: t > 0)  # (n, p), not (n,)
        with pytest.raises(ValueError, match="booleans"):
            post.prob(lambda t: t[:, 0] + 0.5)
        with pytest.raises(TypeError, match="callable"):
            post.prob(0.5)


@pytest.mark.parametrize("seed", [1.5, "0", np.random.RandomState(0)])
def test_invalid_seed(seed):
    with pytest.raises(TypeError, match="seed"):
        GaussianPosterior([0.0], [[1.0]]).sample(3, seed=seed)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_invalid_n(n):
    with pytest.raises(ValueError, match="positive integer"):
        GaussianPosterior([0.0], [[1.0]]).sample(n, seed=0)
    with pytest.raises(ValueError, match="positive integer"):
        SamplePosterior(np.arange(3.0)).sample(n, seed=0)


def test_repr_and_base_class():
    g = GaussianPosterior(np.zeros(2), np.eye(2), names=["a", "b"])
    assert repr(g) == "GaussianPosterior(dim=2, names=['a', 'b'])"
    s = SamplePosterior(np.zeros((2, 10, 8)))
    assert repr(s) == (
        "SamplePosterior(dim=8, names=['theta[0]', 'theta[1]', 'theta[2]', ..., 'theta[7]'], "
        "n_draws=20, n_chains=2, weighted=False)"
    )
    assert isinstance(g, Posterior) and isinstance(s, Posterior)
    with pytest.raises(TypeError):
        Posterior()
