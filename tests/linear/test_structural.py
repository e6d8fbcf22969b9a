"""HM1 (Algorithm 1): exact fixed points (spec A2), the Omega update (A3), participation and
what a device receives (A4), batched = looped, options and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.linear import StructuralCovarianceModel
from fedstats.linear.structural import HM1Algorithm, aggregates, jittered_cholesky, omega_update


def random_spd(K, rng, lo=1.0, hi=10.0):
    Q, _ = np.linalg.qr(rng.standard_normal((K, K)))
    return (Q * rng.uniform(lo, hi, K)) @ Q.T


def simulate(K=4, d=3, n=25, sigma=0.3, seed=0, omega=None):
    rng = np.random.default_rng(seed)
    omega = random_spd(K, rng) if omega is None else omega
    theta = np.linalg.cholesky(omega) @ rng.standard_normal((K, d))  # (K, d): rows of Theta ~ N(0, Omega)
    ns = [n] * K if np.isscalar(n) else n
    Xs = [rng.standard_normal((m, d)) for m in ns]
    ys = [X @ theta[k] + sigma * rng.standard_normal(len(X)) for k, X in enumerate(Xs)]
    return FederatedData.from_arrays(Xs, ys), theta.T, omega


def fixed_point(data, omega, lr, T, s=1.0):
    """Solution of (I - M_k)(theta_k - theta_k^OLS) + 2 lr s (Theta Omega^-1)[:, k] = 0 for all k."""
    K, d = data.n_clients, data.n_features
    Oinv = np.linalg.inv(omega)
    A = np.zeros((K * d, K * d))
    b = np.zeros(K * d)
    for k, c in enumerate(data.clients):
        X, y = data[c].X, data[c].y
        M = np.linalg.matrix_power(np.eye(d) - 2 * lr * X.T @ X, T)
        ols = np.linalg.solve(X.T @ X, X.T @ y)
        for i in range(K):
            A[k * d:(k + 1) * d, i * d:(i + 1) * d] = 2 * lr * s * Oinv[i, k] * np.eye(d)
        A[k * d:(k + 1) * d, k * d:(k + 1) * d] += np.eye(d) - M
        b[k * d:(k + 1) * d] = (np.eye(d) - M) @ ols
    return np.linalg.solve(A, b).reshape(K, d).T


def oracle_mean(data, omega, sigma2):
    K, d = data.n_clients, data.n_features
    P = np.kron(np.linalg.inv(omega), np.eye(d))
    r = np.zeros(K * d)
    for k, c in enumerate(data.clients):
        X, y = data[c].X, data[c].y
        P[k * d:(k + 1) * d, k * d:(k + 1) * d] += X.T @ X / sigma2
        r[k * d:(k + 1) * d] = X.T @ y / sigma2
    return np.linalg.solve(P, r).reshape(K, d).T


def frozen(omega, lr, T=5, rounds=4000, s=1.0, **kw):
    return StructuralCovarianceModel(rounds=rounds, local_steps=T, lr=lr, alpha=0.0, omega_init=omega,
                                     shrink_scale=s, init="zeros", tol=1e-13, **kw)


def test_frozen_omega_converges_to_the_linear_system_solution():
    data, _, omega = simulate(seed=1)
    lr = 0.004
    res = frozen(omega, lr).fit(data)
    assert res.converged
    np.testing.assert_allclose(res.theta, fixed_point(data, omega, lr, 5), atol=1e-8)


def test_identity_omega_tends_to_ridge_as_lr_goes_to_zero():
    data, _, _ = simulate(seed=2)
    T, K = 5, data.n_clients
    ridge = np.column_stack([np.linalg.solve(T * data[c].X.T @ data[c].X + np.eye(3), T * data[c].X.T @ data[c].y)
                             for c in data.clients])
    errs = []
    for lr in (2e-3, 5e-4):
        res = frozen(np.eye(K), lr, T=T, rounds=20000).fit(data)
        assert res.converged
        errs.append(np.abs(res.theta - ridge).max())
    # O(lr): a quarter of the step size gives about a quarter of the error
    assert errs[1] < errs[0] / 3 and errs[1] < 5e-3


def test_true_omega_and_matched_shrink_scale_tend_to_the_oracle_posterior_mean():
    sigma = 0.3
    data, _, omega = simulate(seed=3, sigma=sigma)
    T = 5
    target = oracle_mean(data, omega, sigma**2)
    errs = []
    for lr in (2e-3, 5e-4):
        res = frozen(omega, lr, T=T, rounds=20000, s=T * sigma**2).fit(data)
        assert res.converged
        errs.append(np.abs(res.theta - target).max())
    assert errs[1] < errs[0] / 3 and errs[1] < 1e-3


def test_omega_update_invariants():
    data, _, _ = simulate(K=5, d=3, seed=4)
    # alpha = 1, one round: Omega = Theta^T Theta / d with the Theta after the round
    res = StructuralCovarianceModel(rounds=1, alpha=1.0, lr=1e-3, eig_floor=0.0).fit(data, seed=1)
    np.testing.assert_allclose(res.omega_, res.theta.T @ res.theta / 3, rtol=0, atol=1e-14)
    # alpha in (0, 1) from the identity: symmetric, lambda_min >= (1 - alpha)^c
    alpha = 0.3
    res = StructuralCovarianceModel(rounds=8, alpha=alpha, lr=1e-3).fit(data, seed=1)
    lam = np.array(res.history.metric("omega_min_eig"))
    assert np.all(lam >= (1 - alpha) ** np.arange(1, 9) * (1 - 1e-12))
    np.testing.assert_array_equal(res.omega_, res.omega_.T)


def test_jittered_solve_is_finite_on_a_singular_omega():
    rng = np.random.default_rng(5)
    theta = rng.standard_normal((3, 6))
    omega = theta.T @ theta / 3  # rank 3 < K = 6: singular
    assert np.linalg.eigvalsh(omega)[0] < 1e-12
    G = aggregates(theta, omega)
    assert np.all(np.isfinite(G))
    L, eps = jittered_cholesky(np.zeros((4, 4)) - np.eye(4) * 1e-14)
    assert np.all(np.isfinite(L)) and eps > 0


def test_omega_update_formula():
    rng = np.random.default_rng(6)
    theta, omega = rng.standard_normal((4, 3)), random_spd(3, rng)
    np.testing.assert_allclose(omega_update(omega, theta, 0.25), 0.75 * omega + 0.25 / 4 * theta.T @ theta)


class Spy(HM1Algorithm):
    """Records what each device receives and the server state at each broadcast."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.received, self.starts = [], []

    def broadcast(self, server_state, client, round):
        self.starts.append((round, client, server_state.theta.copy(), server_state.omega.copy()))
        return super().broadcast(server_state, client, round)

    def client_step(self, message, state, data, rng):
        self.received.append(dict(message))
        return super().client_step(message, state, data, rng)


def test_partial_participation_and_what_a_device_receives():
    from fedstats.federation import run
    from fedstats.linear._local import DeviceDesign

    data, _, _ = simulate(K=5, d=3, seed=7)
    alg = Spy(3, local_steps=4, lr=2e-3, alpha=0.2, batch_size=None, grad_reduction="sum", shrink_scale=1.0,
              init="normal")
    schedule = [[0, 2], [1, 3, 4], [2]]
    out = run(alg, DeviceDesign(data, False), rounds=3, participation=schedule, seed=0, batched=False)
    # a device receives exactly its own theta_k and g_k = (Theta Omega^-1)[:, k] at the start of the round
    for msg, (rnd, client, theta0, omega0) in zip(alg.received, alg.starts):
        assert set(msg) == {"theta", "aggregate"}
        assert msg["theta"].shape == (3,) and msg["aggregate"].shape == (3,)
        np.testing.assert_array_equal(msg["theta"], theta0[:, client])
        np.testing.assert_allclose(msg["aggregate"], (theta0 @ np.linalg.inv(omega0))[:, client], rtol=1e-7)  # jitter 1e-8
    # columns of non-participants do not change in that round
    thetas = [s[2] for s in alg.starts if s[1] == schedule[s[0]][0]] + [out.server_state.theta]
    for rnd, chosen in enumerate(schedule):
        others = [k for k in range(5) if k not in chosen]
        np.testing.assert_array_equal(thetas[rnd + 1][:, others], thetas[rnd][:, others])
        assert not np.allclose(thetas[rnd + 1][:, chosen], thetas[rnd][:, chosen])


@pytest.mark.parametrize("batch_size,reduction", [(None, "sum"), (None, "mean"), (8, "sum"), (8, "mean")])
def test_batched_equals_looped_and_runs_are_seeded(batch_size, reduction):
    data, _, _ = simulate(K=6, d=3, n=[20, 30, 25, 40, 12, 50], seed=8)
    model = StructuralCovarianceModel(rounds=10, batch_size=batch_size, grad_reduction=reduction)
    a, b = model.fit(data, seed=3, batched=True), model.fit(data, seed=3, batched=False)
    np.testing.assert_allclose(a.theta, b.theta, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.omega_, b.omega_, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(a.theta))
    c = model.fit(data, seed=4)
    assert not np.allclose(c.theta, a.theta)  # the seed drives the initialisation (and batches)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_borrowing_strength_beats_separate_fits_when_devices_are_alike(seed):
    # spec §9 item 6: where borrowing should help -- few rows per device (8 for 10
    # coefficients), strongly correlated devices (0.95), noise variance 1/T as Algorithm 1
    # assumes -- HM1 must beat the same gradient budget without shrinkage by a wide margin
    from fedstats.linear.baselines import Separate

    K, d, T = 5, 10, 20
    omega = 0.95 * np.ones((K, K)) + 0.05 * np.eye(K)
    data, truth, _ = simulate(K=K, d=d, n=8, sigma=np.sqrt(1 / T), seed=seed, omega=omega)
    hm1 = StructuralCovarianceModel(rounds=30, local_steps=T, init="zeros").fit(data, seed=0)
    sep = Separate(rounds=30, local_steps=T, init="zeros", lr=hm1.lr).fit(data, seed=0)
    err_hm1, err_sep = np.linalg.norm(hm1.theta - truth), np.linalg.norm(sep.theta - truth)
    assert err_hm1 < 0.75 * err_sep


def test_uncertainty_intervals_and_prediction():
    data, _, _ = simulate(K=4, d=3, seed=10)
    res = StructuralCovarianceModel(rounds=20).fit(data, uncertainty=True)
    post = res.client_posterior(2)
    assert post.mean.shape == (3,) and np.all(post.sd > 0)
    X = np.random.default_rng(0).standard_normal((5, 3))
    p = res.predict(X, 2, level=0.9)
    assert np.all(p["lower"] < p["posterior_mean"]) and np.all(p["pred_lower"] < p["lower"])
    np.testing.assert_allclose(p["posterior_mean"], X @ post.mean)
    assert res.extra_communication["bytes_up"] == 4 * 8 * (9 + 3 + 1)
    s = res.summary(0.9)
    assert list(s.columns) == ["client", "name", "estimate", "mean", "sd", "lower", "upper", "p_value"]
    with pytest.raises(RuntimeError, match="uncertainty=True"):
        StructuralCovarianceModel(rounds=2).fit(data).client_posterior(0)


def test_conditional_posterior_equals_the_dense_oracle():
    from fedstats.linear.structural import conditional_posterior

    data, _, omega = simulate(K=3, d=2, seed=11)
    sigma2 = 0.09
    info = np.stack([data[c].X.T @ data[c].X / sigma2 for c in data.clients])
    score = np.stack([data[c].X.T @ data[c].y / sigma2 for c in data.clients])
    mean, cov = conditional_posterior(omega, info, score)
    np.testing.assert_allclose(mean.T, oracle_mean(data, omega, sigma2), atol=1e-10)
    P = np.kron(np.linalg.inv(omega), np.eye(2)) + np.block(
        [[info[i] if i == j else np.zeros((2, 2)) for j in range(3)] for i in range(3)])
    full = np.linalg.inv(P)
    for k in range(3):
        np.testing.assert_allclose(cov[k], full[2 * k:2 * k + 2, 2 * k:2 * k + 2], atol=1e-12)


def test_save_load_roundtrip(tmp_path):
    data, _, _ = simulate(seed=12)
    res = StructuralCovarianceModel(rounds=3).fit(data, uncertainty=True)
    res.save(tmp_path / "hm1.pkl")
    back = type(res).load(tmp_path / "hm1.pkl")
    np.testing.assert_array_equal(back.theta, res.theta)
    np.testing.assert_array_equal(back.posterior_cov, res.posterior_cov)


def test_bad_input_and_options():
    data, _, _ = simulate(K=3, seed=13)
    with pytest.raises(ValueError, match="at least 2 clients"):
        StructuralCovarianceModel().fit(data.subset([0]))
    with pytest.raises(ValueError, match="omega_init"):
        StructuralCovarianceModel(omega_init=np.eye(2)).fit(data)
    with pytest.raises(ValueError, match="positive definite"):
        StructuralCovarianceModel(omega_init=-np.eye(3)).fit(data)
    with pytest.raises(ValueError, match="grad_reduction"):
        StructuralCovarianceModel(grad_reduction="avg").fit(data)
    with pytest.raises(ValueError, match="alpha"):
        StructuralCovarianceModel(alpha=1.5).fit(data)
    with pytest.raises(ValueError, match="shrink_scale"):
        StructuralCovarianceModel(shrink_scale="big").fit(data)
    with pytest.raises(ValueError, match="lr"):
        StructuralCovarianceModel(lr=-1).fit(data)
    with pytest.raises(FloatingPointError, match="lower lr"):
        StructuralCovarianceModel(lr=10.0, rounds=50).fit(data)
    small = FederatedData.from_arrays([np.ones((2, 3)) * [[1, 2, 3]], np.eye(3)], [np.ones(2), np.ones(3)])
    with pytest.raises(ValueError, match="noise_sd"):
        StructuralCovarianceModel(rounds=2).fit(small, uncertainty=True)
    res = StructuralCovarianceModel(rounds=2).fit(small, uncertainty=True, noise_sd=0.5)
    assert np.all(np.isfinite(res.posterior_mean))
    with pytest.raises(KeyError, match="unknown client"):
        res.coef("nope")
    with pytest.raises(ValueError, match="columns"):
        res.predict(np.ones((2, 4)), 0)


def test_separate_gd_starts_where_hm1_starts():
    from fedstats.linear.baselines import Separate

    data, _, _ = simulate(K=3, d=3, seed=14)
    # with no shrinkage (shrink_scale=0) HM1 is exactly the separate fits with the same budget
    hm1 = StructuralCovarianceModel(rounds=5, local_steps=4, lr=1e-3, shrink_scale=0.0).fit(data, seed=2)
    sep = Separate(rounds=5, local_steps=4, lr=1e-3).fit(data, seed=2)
    np.testing.assert_allclose(hm1.theta, sep.theta, rtol=0, atol=1e-12)


def test_conditional_intervals_cover_at_the_nominal_level_where_omega_is_learnable():
    # The model holds (rows of Theta ~ N(0, Omega)), d = 30 coefficients inform the 4 x 4
    # Omega, 100 rows per device estimate each noise variance, and the prior matters (the
    # posterior mean beats least squares). 30 seeded replicates, 3600 intervals at 90%.
    from fedstats.linear.baselines import Separate

    K, d, hits, err_post, err_ols = 4, 30, [], [], []
    for r in range(30):
        omega = random_spd(K, np.random.default_rng(100 + r), 0.05, 1.0)
        data, truth, _ = simulate(K=K, d=d, n=100, sigma=3.0, seed=100 + r, omega=omega)
        res = StructuralCovarianceModel(rounds=30).fit(data, seed=r, uncertainty=True)
        for k, c in enumerate(data.clients):
            lo, hi = res.client_posterior(c).credible_interval(0.9)
            hits.extend((lo <= truth[:, k]) & (truth[:, k] <= hi))
        err_post.append(np.sqrt(np.mean((res.posterior_mean.T - truth) ** 2)))
        err_ols.append(np.sqrt(np.mean((Separate(method="ols").fit(data).theta - truth) ** 2)))
    assert abs(np.mean(hits) - 0.9) <= 0.07, np.mean(hits)  # measured 0.891
    assert np.mean(err_post) < 0.95 * np.mean(err_ols)  # measured 0.313 vs 0.363


@pytest.mark.parametrize("opts", [{}, {"grad_reduction": "mean", "lr": 0.01}, {"shrink_scale": "noise", "alpha": 0.5},
                                  {"eig_floor": 1e-2, "alpha": 0.9, "init": "zeros"}])
def test_federated_equals_centralised(opts):
    data, _, _ = simulate(K=7, d=3, n=[20, 30, 25, 40, 12, 50, 9], seed=15)
    model = StructuralCovarianceModel(rounds=25, **opts)
    fed, cen = model.fit(data, seed=5), model.fit_centralised(data, seed=5)
    np.testing.assert_allclose(fed.theta, cen.theta, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fed.omega_, cen.omega_, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="full-batch"):
        StructuralCovarianceModel(batch_size=4).fit_centralised(data)


def test_noise_estimates_need_residual_degrees_of_freedom():
    X = np.random.default_rng(0).standard_normal((5, 2))
    exact = FederatedData.from_arrays([X, X], [X @ [1.0, 2.0], X @ [1.0, 2.0] + 0.1])
    with pytest.raises(ValueError, match="fits its data exactly"):
        StructuralCovarianceModel(rounds=2, shrink_scale="noise").fit(exact)
    with pytest.raises(ValueError, match="fits its data exactly.*noise_sd"):
        StructuralCovarianceModel(rounds=2).fit(exact, uncertainty=True)
