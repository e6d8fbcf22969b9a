"""Natural-parameter Gaussians (spec A1): products, quotients, moments, PD guards."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from fedstats.inference.gaussian import NaturalGaussian, NotPositiveDefinite, is_pd


def rand_gauss(rng, p=3):
    A = rng.normal(size=(p, p))
    return NaturalGaussian.from_moments(rng.normal(size=p), A @ A.T + p * np.eye(p))


@pytest.mark.parametrize("op", ["mul", "div"])
def test_product_and_ratio_match_log_density_differences(op):
    rng = np.random.default_rng(0)
    a, b = rand_gauss(rng), rand_gauss(rng)
    x = rng.normal(size=(10, 3))
    la = multivariate_normal(a.mean, a.cov).logpdf(x)
    lb = multivariate_normal(b.mean, b.cov).logpdf(x)
    combo = a * b if op == "mul" else a / b
    direct = la + lb if op == "mul" else la - lb
    diff = combo.logpdf_unnormalized(x) - direct
    assert np.ptp(diff) < 1e-10  # equal up to a constant


def test_moments_roundtrip_and_message():
    rng = np.random.default_rng(1)
    g = rand_gauss(rng)
    m, C = g.moments()
    back = NaturalGaussian.from_moments(m, C)
    np.testing.assert_allclose(back.Q, g.Q, atol=1e-12)
    np.testing.assert_allclose(back.r, g.r, atol=1e-12)
    np.testing.assert_allclose(g.logpdf(m[None]), multivariate_normal(m, C).logpdf(m), atol=1e-12)
    np.testing.assert_allclose(NaturalGaussian.from_message(g.to_message()).Q, g.Q)


def test_interpolate_power_flat_and_guards():
    rng = np.random.default_rng(2)
    a, b = rand_gauss(rng), rand_gauss(rng)
    np.testing.assert_allclose(a.interpolate(b, 0.0).Q, a.Q)
    np.testing.assert_allclose(a.interpolate(b, 1.0).r, b.r)
    np.testing.assert_allclose((a**0.5 * a**0.5).Q, a.Q)
    flat = NaturalGaussian.flat(3)
    assert not flat.is_proper()
    with pytest.raises(NotPositiveDefinite):
        flat.mean
    improper = a / (a**2)
    assert not improper.is_proper() and not is_pd(improper.Q)
    with pytest.raises(ValueError, match="NaN"):
        NaturalGaussian(np.array([np.nan]), np.eye(1))
    with pytest.raises(ValueError, match="shape"):
        NaturalGaussian(np.zeros(2), np.eye(3))
