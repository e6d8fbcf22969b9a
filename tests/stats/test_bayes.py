"""The Bayesian comparison beside the tests: posteriors of a mean, a difference of means and a
log odds ratio, against independent computations (adaptive quadrature, Monte Carlo draws,
closed forms)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, special, stats

from fedstats import FederatedData
from fedstats.data.disclosure import NO_RULES
from fedstats.stats import fisher_exact, paired_ttest, proportions_test, ttest
from fedstats.stats.bayes import difference_posterior, log_odds_ratio_posterior, mean_posterior

from .test_tests import frame


def quad_cdf_difference(x, m1, s1, n1, m2, s2, n2):
    t1, t2 = stats.t(n1 - 1, m1, s1 / np.sqrt(n1)), stats.t(n2 - 1, m2, s2 / np.sqrt(n2))
    return integrate.quad(lambda u: t1.cdf(x + u) * t2.pdf(u), -np.inf, np.inf, epsabs=1e-13, epsrel=1e-12)[0]


@pytest.mark.parametrize("args", [(1.0, 1.2, 30, 0.4, 2.5, 12), (-3.0, 0.5, 6, -2.0, 4.0, 200)])
def test_behrens_fisher_equals_adaptive_quadrature_and_draws(args):
    post = difference_posterior(*args, level=0.9, equal_var=False)
    for q, x in ((0.05, post["lower"]), (0.95, post["upper"])):
        assert quad_cdf_difference(x, *args) == pytest.approx(q, abs=1e-8)
    assert 1 - quad_cdf_difference(0.0, *args) == pytest.approx(post["prob_above_null"], abs=1e-8)
    m1, s1, n1, m2, s2, n2 = args
    rng = np.random.default_rng(0)
    d = m1 + s1 / np.sqrt(n1) * rng.standard_t(n1 - 1, 10**6) - m2 - s2 / np.sqrt(n2) * rng.standard_t(n2 - 1, 10**6)
    assert (d > 0).mean() == pytest.approx(post["prob_above_null"], abs=3e-3)


def test_equal_variances_and_one_mean_are_the_t_intervals():
    post = difference_posterior(1.0, 1.2, 30, 0.4, 2.5, 12, level=0.95, equal_var=True)
    sp = np.sqrt((29 * 1.2**2 + 11 * 2.5**2) / 40 * (1 / 30 + 1 / 12))
    lo, hi = stats.t(40, 0.6, sp).interval(0.95)
    np.testing.assert_allclose([post["lower"], post["upper"]], [lo, hi], rtol=1e-9)
    post = mean_posterior(2.0, 1.5, 10, 0.8, null=1.0)
    np.testing.assert_allclose([post["lower"], post["upper"]], stats.t(9, 2.0, 1.5 / np.sqrt(10)).interval(0.8))
    assert post["prob_above_null"] == pytest.approx(stats.t(9, 2.0, 1.5 / np.sqrt(10)).sf(1.0), abs=1e-12)


def test_log_odds_ratio_equals_adaptive_quadrature_and_its_mean_is_exact():
    c1, n1, c2, n2 = 3, 20, 10, 25
    post = log_odds_ratio_posterior(c1, n1, c2, n2, level=0.9)
    b1, b2 = stats.beta(c1 + 0.5, n1 - c1 + 0.5), stats.beta(c2 + 0.5, n2 - c2 + 0.5)

    def cdf(x):  # P(L1 - L2 <= x), integrating over p2 directly
        return integrate.quad(lambda p: b1.cdf(special.expit(x + special.logit(p))) * b2.pdf(p), 0, 1, epsabs=1e-13)[0]

    assert cdf(post["lower"]) == pytest.approx(0.05, abs=1e-8)
    assert cdf(post["upper"]) == pytest.approx(0.95, abs=1e-8)
    rng = np.random.default_rng(1)
    p1, p2 = b1.rvs(10**6, random_state=rng), b2.rvs(10**6, random_state=rng)
    draws = special.logit(p1) - special.logit(p2)
    assert draws.mean() == pytest.approx(post["mean"], abs=5e-3)
    assert (draws > 0).mean() == pytest.approx(post["prob_above_null"], abs=2e-3)


def test_the_tests_carry_their_bayesian_comparison():
    df = frame(0)
    data = FederatedData.from_dataframe(df, by="site", missing="keep", **NO_RULES)
    res = ttest(data, "y", "arm")
    b = res.details["bayes"]
    c, t = df.y[df.arm == "c"].dropna(), df.y[df.arm == "t"].dropna()
    ref = difference_posterior(c.mean(), c.std(), len(c), t.mean(), t.std(), len(t), 0.95, False)
    np.testing.assert_allclose([b["lower"], b["upper"], b["prob_above_null"]], [ref["lower"], ref["upper"], ref["prob_above_null"]], rtol=1e-9, atol=1e-12)  # fmt: skip
    assert b["lower"] < res.estimate < b["upper"]
    assert paired_ttest(data, "y", "y2").details["bayes"]["effect"].startswith("mean difference")
    sub = data.subset(["s0", "s1", "s2"])
    part = df[df.site.isin(["s0", "s1", "s2"])]
    f = fisher_exact(sub, "arm", "event").details["bayes"]
    tab = np.array([[((part.arm == a) & (part.event == e)).sum() for e in (0, 1)] for a in ("c", "t")])
    ref = log_odds_ratio_posterior(tab[1, 1], tab[1].sum(), tab[0, 1], tab[0].sum(), 0.95)
    np.testing.assert_allclose([f["lower"], f["upper"]], [ref["lower"], ref["upper"]], rtol=1e-12)
    assert proportions_test(data, "event", "arm").details["bayes"]["effect"] == "log odds ratio"
