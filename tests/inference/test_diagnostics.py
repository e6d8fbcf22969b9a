"""MCMC diagnostics (fedstats.inference.diagnostics) against ArviZ, their reference: equal
on chains of even and odd length, few and many draws, well and badly mixed."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.inference import diagnostics


def ar1_chains(C, N, rho, offset, seed):
    rng = np.random.default_rng(seed)
    x = np.zeros((C, N))
    e = rng.normal(size=(C, N))
    for t in range(1, N):
        x[:, t] = rho * x[:, t - 1] + e[:, t]
    return x + offset * rng.normal(size=(C, 1))


@pytest.mark.parametrize(
    "C, N, rho, offset",
    [(2, 100, 0.8, 0.3), (4, 501, 0.8, 0.3), (3, 37, 0.5, 0.0), (2, 8, 0.2, 0.0), (4, 2000, 0.95, 2.0)],
)
def test_rhat_and_bulk_ess_equal_arviz(C, N, rho, offset):
    az = pytest.importorskip("arviz")
    x = ar1_chains(C, N, rho, offset, seed=C * N)
    np.testing.assert_allclose(diagnostics.rhat_rank(x), float(az.rhat(x, method="rank")), rtol=1e-10)
    np.testing.assert_allclose(diagnostics.ess_bulk(x), float(az.ess(x, method="bulk")), rtol=1e-10)


def test_badly_mixed_chains_are_flagged_and_constant_chains_do_not_crash():
    stuck = ar1_chains(4, 400, 0.5, 0.0, seed=1) + np.array([[0.0], [0.0], [0.0], [5.0]])
    assert diagnostics.rhat_rank(stuck) > 1.5
    assert diagnostics.ess_bulk(stuck) < 0.1 * stuck.size
    assert np.isnan(diagnostics.rhat_rank(np.ones((2, 50))))
    assert np.isnan(diagnostics.rhat_rank(np.zeros((1, 50)))) and np.isnan(diagnostics.ess_bulk(np.zeros((2, 3))))
