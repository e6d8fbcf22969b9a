"""The Rao-Blackwellised Laplace moments (HM2's default with many predictors): the site's
convolved likelihood and its exact derivatives, the second-order expansion against known
moments and against importance sampling with many draws, and the fallback to sampling."""

import numpy as np
import pytest
from scipy.special import polygamma, psi
from scipy.stats import multivariate_normal, norm

from fedstats.inference.tilted import RaoBlackwellLaplaceTilted, RaoBlackwellTilted, make_estimator
from fedstats.inference.tilted import rao_blackwell as rb
from fedstats.inference.tilted.kernels import stack_stats
from fedstats.linear._hm2_site import HM2Site

KINDS = [("diag", False), ("diag", True), ("iso", False), ("known", False)]


def _site(kind, sigma_known, d=3):
    known = tuple(np.linspace(0.5, 2.0, d)) if kind == "known" else None
    return HM2Site(d=d, tau_kind=kind, tau_known=known, sigma_known=sigma_known)


def _client(site, rng, n=12):
    X = rng.normal(size=(n, site.d))
    y = X @ rng.normal(size=site.d) + 0.5 * rng.normal(size=n)
    return X, y, site.stats_from(X, y, 0.4 if site.sigma_known else None)


@pytest.mark.parametrize("kind, sigma_known", KINDS)
def test_convolved_is_the_gaussian_density_of_the_rows(kind, sigma_known):
    """The oracle: y ~ N(X a, s2 I + X (C + diag tau) X') written out with all n rows."""
    rng = np.random.default_rng(1)
    site = _site(kind, sigma_known)
    X, y, stats = _client(site, rng)
    D = site.n_log_tau + site.local_dim
    a = rng.normal(size=(1, 4, site.d))
    M = rng.normal(size=(site.d, site.d))
    C = (0.2 * M @ M.T + 0.05 * np.eye(site.d))[None]
    x = 0.5 * rng.normal(size=(1, 4, D))
    value = site.convolved(a, C, x, stack_stats([stats], 1), order=0)[0]
    for m in range(4):
        tau = np.exp(x[0, m, 0]) * np.ones(site.d) if kind == "iso" else np.exp(x[0, m, : site.d])
        if kind == "known":
            tau = np.asarray(site.tau_known)
        s2 = 0.4**2 if sigma_known else np.exp(2 * x[0, m, -1])
        want = multivariate_normal(X @ a[0, m], s2 * np.eye(len(y)) + X @ (C[0] + np.diag(tau)) @ X.T).logpdf(y)
        if not sigma_known:
            want += norm(0, 1).logpdf(x[0, m, -1])
        assert value[0, m] == pytest.approx(want, rel=1e-11, abs=1e-10)


@pytest.mark.parametrize("kind, sigma_known", KINDS)
def test_convolved_derivatives_equal_differences_of_its_value(kind, sigma_known):
    rng = np.random.default_rng(2)
    site = _site(kind, sigma_known)
    stats = stack_stats([_client(site, rng)[2] for _ in range(2)], 2)
    D = site.n_log_tau + site.local_dim
    P = site.d + D
    M = rng.normal(size=(2, site.d, site.d))
    C = 0.2 * M @ np.swapaxes(M, 1, 2) + 0.05 * np.eye(site.d)
    y0 = np.concatenate([rng.normal(size=(2, 3, site.d)), 0.4 * rng.normal(size=(2, 3, D))], axis=-1)

    def at(y, order):
        return site.convolved(y[..., : site.d], C, y[..., site.d :], stats, order=order)

    _, grad, hess = at(y0, 2)
    h = 1e-5
    for i in range(P):
        e = np.zeros(P)
        e[i] = h
        np.testing.assert_allclose(grad[..., i], (at(y0 + e, 0)[0] - at(y0 - e, 0)[0]) / (2 * h), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(hess[..., i, :], (at(y0 + e, 1)[1] - at(y0 - e, 1)[1]) / (2 * h), atol=2e-6)
    np.testing.assert_allclose(hess, np.swapaxes(hess, -1, -2))


def _federation(kind="diag", sigma_known=False, B=3, seed=1, d=3, n=60, cavity_sd=0.15):
    """Clients whose cavities are tight (as with many clients): the tilteds are near Gaussian."""
    rng = np.random.default_rng(seed)
    site = _site(kind, sigma_known, d)
    p = site.phi_dim
    stats, means, covs = [], [], []
    for _ in range(B):
        stats.append(_client(site, rng, n)[2])
        A = rng.normal(size=(p, p)) / np.sqrt(p)
        means.append(np.r_[rng.normal(size=site.d), -0.7 + 0.2 * rng.normal(size=site.n_log_tau)])
        covs.append(cavity_sd**2 * (A @ A.T + 0.5 * np.eye(p)))
    return site, np.stack(means), np.stack(covs), stats


def test_target_value_and_the_sampled_estimator_s_log_density_differ_by_a_constant():
    """Two code paths to log p(x): the site's closed form (``value``, Newton's) and its
    Gaussian form in mu (``logp``, the importance weights')."""
    site, m, c, stats = _federation(B=3)
    target = rb._Target(site, m, c, stack_stats(stats, 3), site.gaussian_dim)
    x = -0.5 + 0.5 * np.random.default_rng(0).normal(size=(3, site.n_log_tau + site.local_dim, 7))
    diff = target.value(x) - target.logp(x)
    assert np.all(np.ptp(diff, axis=1) < 1e-9)


def test_newton_with_exact_derivatives_reaches_the_finite_difference_mode():
    site, m, c, stats = _federation(B=3, cavity_sd=0.5)
    g = site.gaussian_dim
    target = rb._Target(site, m, c, stack_stats(stats, 3), g)
    x0 = np.concatenate([m[:, g:], np.stack([site.init_local(s)[1] for s in stats])], axis=1)
    scale = np.full_like(x0, 0.3)
    fd_mode, fd_negH = rb._newton(target.logp, x0, scale, 30)
    mode, negH = rb._newton(target.value, x0, scale, 30, derivatives=target.derivatives)
    _, grad, exact_negH = target.derivatives(mode)
    assert np.max(np.abs(grad)) < 1e-6  # a stationary point of the exact gradient
    np.testing.assert_allclose(mode, fd_mode, atol=1e-3)  # the differences' O(h^2) error
    np.testing.assert_allclose(negH, exact_negH, rtol=1e-6)
    np.testing.assert_allclose(negH, fd_negH, rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("a", [(8.0, 30.0), (30.0, 100.0)])
def test_second_order_moments_of_rotated_log_gamma_variables(a):
    """The oracle: x = L y with independent y_i = log Gamma(a_i, 1), whose mean psi(a_i) and
    variance psi'(a_i) are known; the expansion's errors are O(a^-2) in the mean and O(a^-3)
    in the variance, the Laplace approximation's O(a^-1) and O(a^-2)."""
    a = np.asarray(a)
    L = np.array([[1.0, 0.0], [0.6, 0.8]])
    Linv = np.linalg.inv(L)
    mode = (L @ np.log(a))[None]

    def hess(x):  # (K, 2) -> the Hessians of log p at each point (K, 2, 2)
        y = x @ Linv.T
        return np.einsum("ji,kj,jl->kil", Linv, -np.exp(y), Linv)

    negH = -hess(mode)
    Sig, Sd, pts = rb.principal_points(mode, negH, 1.0)
    delta, cov, size = rb.second_order(Sig, Sd, hess(pts[0])[None], 1.0)
    mean, true_cov = L @ psi(a), L @ np.diag(polygamma(1, a)) @ L.T
    sd = np.sqrt(np.diag(true_cov))
    laplace_err = np.max(np.abs(mode[0] - mean) / sd)
    err = np.max(np.abs(mode[0] + delta[0] - mean) / sd)
    assert err < 0.01 * laplace_err and err < 0.1 / a.min() ** 2
    assert np.max(np.abs(cov[0] - true_cov) / np.outer(sd, sd)) < 0.15 / a.min() ** 2
    assert np.max(np.abs(Sig[0] - true_cov) / np.outer(sd, sd)) > 0.3 / a.min()
    assert 0.5 / a.max() ** 0.5 < size[0] < 2.0 / a.min() ** 0.5  # the shift, sqrt(a)/(2a) sds


@pytest.mark.parametrize("kind, sigma_known", [("diag", False), ("diag", True), ("iso", False)])
def test_expanded_moments_match_importance_sampling_with_many_draws(kind, sigma_known):
    """The oracle: the sampled estimator with 2^17 draws from the Laplace proposal (its own
    error below 0.001 sd). A loose cavity (sd 0.4) and 20 rows per client: Laplace's mode is
    0.02-0.04 sd from the means (measured), the expansion 0.001-0.004 sd."""
    site, m, c, stats = _federation(kind, sigma_known, B=3, n=20, cavity_sd=0.4)
    ref = RaoBlackwellTilted(num_draws=2**17, defensive=0.0).estimate(site, m, c, stats, np.arange(3))
    out = RaoBlackwellLaplaceTilted().estimate(site, m, c, stats, np.arange(3))
    g = site.gaussian_dim
    errs, lap_errs = [], []
    for r, o in zip(out, ref):
        sd = np.sqrt(np.diag(o.cov))
        assert r.ok and r.diagnostics["fallback"] == 0.0 and 0 < r.diagnostics["correction"] < 0.25
        errs.append(np.max(np.abs(r.mean - o.mean) / sd))
        assert np.max(np.abs(np.sqrt(np.diag(r.cov)) / sd - 1)) < 0.012
        corr = lambda C: C / np.sqrt(np.outer(np.diag(C), np.diag(C)))  # noqa: E731
        assert np.max(np.abs(corr(r.cov) - corr(o.cov))) < 0.012
    assert max(errs) < 0.006, errs
    # without the corrections (the mode of x, its conditional mean of mu): farther off
    target = rb._Target(site, m, c, stack_stats(stats, 3), g)
    x0 = np.concatenate([m[:, g:], np.stack([site.init_local(s)[1] for s in stats])], axis=1)
    mode, _ = rb._newton(target.value, x0, np.full_like(x0, 0.3), 30, derivatives=target.derivatives)
    for b, o in enumerate(ref):
        sd = np.sqrt(np.diag(o.cov))[g:]
        lap_errs.append(np.max(np.abs(mode[b, : site.n_log_tau] - o.mean[g:]) / sd))
    assert max(lap_errs) > 4 * max(errs), (lap_errs, errs)


def test_results_do_not_depend_on_the_batch_or_its_memory_slices(monkeypatch):
    site, m, c, stats = _federation(B=4, seed=3)
    est = RaoBlackwellLaplaceTilted()
    batch = est.estimate(site, m, c, stats, np.arange(4))
    for b in range(4):
        alone = est.estimate(site, m[b : b + 1], c[b : b + 1], stats[b : b + 1], np.arange(1))[0]
        np.testing.assert_allclose(batch[b].mean, alone.mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(batch[b].cov, alone.cov, rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(rb._Target, "max_entries", 9 * 11**2 * 2)  # two clients per slice of Hessians
    sliced = est.estimate(site, m, c, stats, np.arange(4))
    for a, b in zip(batch, sliced):
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(a.cov, b.cov, rtol=1e-12, atol=1e-14)


def test_a_client_with_large_corrections_is_sampled_instead():
    """A weak cavity and few rows: a skewed tilted. With ``max_correction=0`` every client
    falls back, and gets exactly the sampled estimator's moments (same seeds); with no
    limit none does."""
    site, m, c, stats = _federation(B=3, n=6, cavity_sd=1.0, seed=5)
    seeds = np.array([4, 5, 6])
    sampled = RaoBlackwellTilted().estimate(site, m, c, stats, seeds)
    forced = RaoBlackwellLaplaceTilted(max_correction=0.0).estimate(site, m, c, stats, seeds)
    for f, s in zip(forced, sampled):
        assert f.diagnostics["fallback"] == 1.0 and f.diagnostics["correction"] > 0.0
        np.testing.assert_array_equal(f.mean, s.mean)
        np.testing.assert_array_equal(f.cov, s.cov)
    never = RaoBlackwellLaplaceTilted(max_correction=np.inf).estimate(site, m, c, stats, seeds)
    assert all(r.diagnostics["fallback"] == 0.0 for r in never)
    # with the default limit (0.25) these are sampled (their corrections: 0.38-0.40), where
    # the tight cavities of the test above are not (0.09-0.19)
    default = RaoBlackwellLaplaceTilted().estimate(site, m, c, stats, seeds)
    assert all(r.diagnostics["fallback"] == 1.0 and r.diagnostics["correction"] > 0.3 for r in default)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the broken client's NaNs
def test_a_client_without_a_laplace_approximation_is_sampled_and_others_are_unaffected():
    site, m, c, stats = _federation(B=3, seed=6)
    alone = RaoBlackwellLaplaceTilted().estimate(site, m[:1], c[:1], stats[:1], np.arange(1))[0]
    stats[1] = dict(stats[1], c=np.array(np.nan))  # a broken client: no finite density anywhere
    out = RaoBlackwellLaplaceTilted().estimate(site, m, c, stats, np.arange(3))
    assert out[1].diagnostics["fallback"] == 1.0 and not out[1].ok  # sampled, and reported, not raised
    assert out[0].ok and out[2].ok and out[0].diagnostics["fallback"] == 0.0
    np.testing.assert_allclose(out[0].mean, alone.mean, rtol=1e-12)


def test_client_posterior_draws_are_the_sampled_estimator_s():
    site, m, c, stats = _federation(B=2, seed=7)
    got = RaoBlackwellLaplaceTilted(num_draws=128).estimate(site, m, c, stats, np.arange(2), keep_draws=True)
    want = RaoBlackwellTilted(num_draws=128).estimate(site, m, c, stats, np.arange(2), keep_draws=True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.draws["phi"], b.draws["phi"])
        np.testing.assert_array_equal(a.weights, b.weights)


def test_refuses_sites_without_the_convolved_likelihood_and_bad_options():
    class Plain:  # a conditionally Gaussian site without ``convolved``
        def __init__(self, site):
            self._site = site

        def __getattr__(self, name):
            if name == "convolved":
                raise AttributeError(name)
            return getattr(self._site, name)

    with pytest.raises(ValueError, match="convolved"):
        RaoBlackwellLaplaceTilted().check_model(Plain(HM2Site(d=2)))
    with pytest.raises(ValueError, match="step"):
        RaoBlackwellLaplaceTilted(step=0.0)
    with pytest.raises(ValueError, match="max_correction"):
        RaoBlackwellLaplaceTilted(max_correction=-1.0)
    assert isinstance(make_estimator("rao_blackwell_laplace"), RaoBlackwellLaplaceTilted)
