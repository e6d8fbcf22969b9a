"""The Rao-Blackwellised tilted moments (HM2's default): the small-matrix linear algebra, the
site's Gaussian form in mu, and the estimator against importance sampling with many draws."""

import jax
import numpy as np
import pytest

from fedstats.inference.tilted import ImportanceTilted, RaoBlackwellTilted, make_estimator
from fedstats.inference.tilted import batched as bt
from fedstats.inference.tilted.kernels import normal_draws, stack_stats
from fedstats.linear._hm2_site import HM2Site


def _spd(rng, n, d):
    A = rng.normal(size=(n, d, d))
    return A @ np.swapaxes(A, 1, 2) + 0.3 * np.eye(d)


@pytest.mark.parametrize("d", [1, 3, 6])
def test_batched_linear_algebra_equals_numpy(d):
    rng = np.random.default_rng(d)
    A = _spd(rng, 50, d)
    b = rng.normal(size=(50, d))
    lead = lambda a: np.moveaxis(a, 0, -1)  # noqa: E731
    back = lambda a: np.moveaxis(a, -1, 0)  # noqa: E731
    L = bt.cholesky(lead(A))
    np.testing.assert_allclose(back(L), np.linalg.cholesky(A), rtol=1e-12, atol=1e-12)
    x = bt.solve_upper_t(L, bt.solve_lower(L, lead(b)))
    np.testing.assert_allclose(back(x), np.linalg.solve(A, b[..., None])[..., 0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(back(bt.inv_from_cholesky(L)), np.linalg.inv(A), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(bt.logdet_from_cholesky(L), np.linalg.slogdet(A)[1], rtol=1e-12)
    np.testing.assert_allclose(back(bt.matvec(lead(A), lead(b))), (A @ b[..., None])[..., 0], rtol=1e-12)
    np.testing.assert_allclose(bt.quad(lead(b), lead(A)), np.einsum("ni,nij,nj->n", b, A, b), rtol=1e-12)
    # a matrix that is not positive definite gets NaN in its factor, the others are untouched
    A[3] = -np.eye(d)
    L = bt.cholesky(lead(A))
    assert np.isnan(L[..., 3]).any() and np.isfinite(np.delete(L, 3, axis=-1)).all()


@pytest.mark.parametrize("kind, sigma_known", [("diag", True), ("diag", False), ("iso", False), ("known", False)])
def test_hm2_site_is_gaussian_in_mu_given_the_rest(kind, sigma_known):
    """``gaussian_given`` reproduces the site's collapsed likelihood (jax) at random points."""
    rng = np.random.default_rng(0)
    site = HM2Site(d=3, tau_kind=kind, tau_known=(0.5, 1.0, 2.0) if kind == "known" else None, sigma_known=sigma_known)
    stats = []
    for _ in range(2):
        X = rng.normal(size=(20, 3))
        stats.append(
            site.stats_from(X, X @ rng.normal(size=3) + 0.3 * rng.normal(size=20), 0.3 if sigma_known else None)
        )
    x = 0.5 * rng.normal(size=(site.n_log_tau + site.local_dim, 2, 5))
    P, h, c = site.gaussian_given(x, stack_stats(stats, 2))
    with jax.enable_x64(True):
        for b in range(2):
            for m in range(5):
                mu = rng.normal(size=3)
                phi, z = np.r_[mu, x[: site.n_log_tau, b, m]], x[site.n_log_tau :, b, m]
                want = float(site.log_collapsed(jax.numpy.asarray(phi), jax.numpy.asarray(z), stats[b]))
                got = -0.5 * mu @ P[:, :, b, m] @ mu + mu @ h[:, b, m] + c[b, m]
                assert abs(got - want) < 1e-9 * max(1.0, abs(want))


def _federation(kind, sigma_known, B=3, seed=1):
    rng = np.random.default_rng(seed)
    site = HM2Site(d=3, tau_kind=kind, sigma_known=sigma_known)
    p = site.phi_dim
    stats, means, covs = [], [], []
    for _ in range(B):
        X = rng.normal(size=(20, 3))
        stats.append(
            site.stats_from(X, X @ rng.normal(size=3) + 0.3 * rng.normal(size=20), 0.3 if sigma_known else None)
        )
        A = 0.3 * rng.normal(size=(p, p))
        means.append(0.5 * rng.normal(size=p))
        covs.append(A @ A.T + 0.5 * np.eye(p))
    return site, np.stack(means), np.stack(covs), stats


@pytest.mark.parametrize("kind, sigma_known", [("diag", True), ("diag", False), ("iso", False)])
def test_rao_blackwell_matches_importance_sampling_with_many_draws(kind, sigma_known):
    """The oracle: importance sampling of all of (phi, z) through the jax site with 200,000
    draws (an independent code path). Measured: means within 0.018 sd, sds within 1.5%."""
    site, m, c, stats = _federation(kind, sigma_known)
    ref = ImportanceTilted(num_draws=200_000).estimate(site, m, c, stats, np.arange(3))
    out = RaoBlackwellTilted(num_draws=4096).estimate(site, m, c, stats, np.arange(3), keep_draws=True)
    for r, o in zip(out, ref):
        sd = np.sqrt(np.diag(o.cov))
        assert r.ok and r.diagnostics["laplace_ok"] == 1.0
        assert np.max(np.abs(r.mean - o.mean) / sd) < 0.04
        assert np.max(np.abs(np.sqrt(np.diag(r.cov)) / sd - 1)) < 0.03
        corr = lambda C: C / np.sqrt(np.outer(np.diag(C), np.diag(C)))  # noqa: E731
        assert np.max(np.abs(corr(r.cov) - corr(o.cov))) < 0.03
        # the weighted draws (beta drawn from its conditional) describe the same distribution
        drawn = np.average(r.draws["phi"], axis=0, weights=r.weights)
        assert np.max(np.abs(drawn - r.mean) / sd) < 0.1
        assert r.draws["z"].shape == (4096, site.local_dim)


def test_rao_blackwell_client_results_do_not_depend_on_the_batch():
    site, m, c, stats = _federation("diag", False, B=4, seed=3)
    est, seeds = RaoBlackwellTilted(), np.array([11, 12, 13, 14])
    batch = est.estimate(site, m, c, stats, seeds)
    for b in range(4):
        alone = est.estimate(site, m[b : b + 1], c[b : b + 1], stats[b : b + 1], seeds[b : b + 1])[0]
        np.testing.assert_allclose(batch[b].mean, alone.mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch[b].cov, alone.cov, rtol=1e-10, atol=1e-12)


def test_rao_blackwell_memory_slices_give_the_same_answer(monkeypatch):
    """Clients are evaluated in slices that bound the arrays' size: the answer is the same."""
    from fedstats.inference.tilted import rao_blackwell

    site, m, c, stats = _federation("diag", True, B=5, seed=4)
    whole = RaoBlackwellTilted().estimate(site, m, c, stats, np.arange(5))
    monkeypatch.setattr(rao_blackwell._Target, "max_entries", 9 * 256 * 2)  # two clients per slice
    sliced = RaoBlackwellTilted().estimate(site, m, c, stats, np.arange(5))
    for a, b in zip(whole, sliced):
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a.cov, b.cov, rtol=1e-10, atol=1e-12)


def test_rao_blackwell_refuses_sites_without_a_gaussian_block():
    from fedstats.linear._shrinkage_site import ShrinkageSite

    with pytest.raises(ValueError, match="Gaussian in part of phi"):
        RaoBlackwellTilted().check_model(ShrinkageSite(d=3))
    with pytest.raises(ValueError, match="nothing to sample"):
        RaoBlackwellTilted().check_model(HM2Site(d=2, tau_kind="known", tau_known=(1.0, 1.0), sigma_known=True))
    assert isinstance(make_estimator("rao_blackwell", num_draws=100), RaoBlackwellTilted)


def test_a_client_with_degenerate_weights_reports_not_ok_instead_of_raising():
    """A cavity far from the client's likelihood (all weight on one draw) is a per-client
    ``ok=False``, not an exception that would fail the whole batch."""
    site, m, c, stats = _federation("diag", True, B=2, seed=5)
    m[1, 3:] = -60.0  # log tau far out: tau = e^-60
    c[1] = 1e-6 * np.eye(site.phi_dim)
    out = RaoBlackwellTilted().estimate(site, m, c, stats, np.arange(2))
    assert out[0].ok and not out[1].ok and "ESS" in out[1].message


def test_digitally_shifted_sobol_normals_are_standard_normal_and_cheap_to_vary():
    z = np.concatenate([normal_draws(np.random.default_rng(s), 256, 3, "shift") for s in range(40)])
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    a, b = (normal_draws(np.random.default_rng(s), 256, 3, "shift") for s in (1, 2))
    assert not np.allclose(a, b)
    # each sequence is balanced: its mean is much closer to 0 than pseudo-random draws' (~0.06)
    assert np.abs(a.mean(axis=0)).max() < 0.02
