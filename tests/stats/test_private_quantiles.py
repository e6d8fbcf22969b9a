"""quantiles(dp=...): differentially private quantiles by a noisy search, their epsilon from an
independent accountant, and their error against the pooled rows."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from fedstats import FederatedData
from fedstats.privacy import DifferentialPrivacy
from fedstats.stats import quantiles

Q = [0.1, 0.5, 0.9]


@pytest.fixture(scope="module")
def federation():
    rng = np.random.default_rng(3)
    Xs = [rng.normal(50 + 2 * k, 10, size=(n, 1)) for k, n in enumerate((300, 500, 800, 400))]
    return FederatedData.from_arrays(Xs), np.concatenate(Xs)[:, 0]


def test_without_noise_the_search_brackets_the_order_statistic(federation):
    data, pooled = federation
    res = quantiles(data, "x0", Q, dp=DifferentialPrivacy(noise_multiplier=0.0, clip=1.0), bounds=(0, 100))
    assert res.n == len(pooled) and res.rounds == 9 and res.privacy.epsilon == np.inf
    half = 100 / 16**8 / 2
    for q, v in zip(Q, res.values, strict=True):
        target = q * len(pooled)
        assert np.sum(pooled <= v + half) >= target > np.sum(pooled <= v - half)


def test_the_epsilon_is_the_gaussian_mechanisms_composed_over_every_release(federation):
    data, _ = federation
    z = 3.0
    dp = DifferentialPrivacy(noise_multiplier=z, clip=1.0, placement="central", delta=1e-6)
    res = quantiles(data, "x0", Q, dp=dp, bounds=(0, 100), rounds=6, seed=2)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), 7)  # the count and 6 rounds, each at sensitivity 1 / z
    assert res.privacy.epsilon == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)
    assert res.to_dict()["epsilon"] == res.privacy.epsilon


def test_the_noisy_quantiles_stay_close_to_the_pooled_ones(federation):
    data, pooled = federation
    # each noisy count has sd z * sqrt(15 * 3) (= 13.4 rows at z = 2) of 2,000: a rank error of a
    # few tenths of a percent; the test allows 3%
    for seed in range(3):
        dp = DifferentialPrivacy(noise_multiplier=2.0, clip=1.0, placement="central")
        res = quantiles(data, "x0", Q, dp=dp, bounds=(0, 100), seed=seed)
        ranks = np.array([np.mean(pooled <= v) for v in res.values])
        np.testing.assert_allclose(ranks, Q, atol=0.03)


def test_bad_options_are_refused(federation):
    data, _ = federation
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip=1.0)
    with pytest.raises(ValueError, match="bounds=\\(low, high\\)"):
        quantiles(data, "x0", Q, dp=dp)
    with pytest.raises(TypeError, match="DifferentialPrivacy"):
        quantiles(data, "x0", Q, dp=1.0, bounds=(0, 1))
