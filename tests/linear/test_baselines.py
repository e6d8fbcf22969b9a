"""Baselines of HM1: each against a direct computation of what it is defined to be."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.linear.baselines import DistributedRidge, Ditto, FedAvg, PooledOracle, Separate


def federation(K=4, d=3, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.standard_normal((15 + 5 * k, d)) for k in range(K)]
    ys = [X @ rng.standard_normal(d) + 0.1 * rng.standard_normal(len(X)) for X in Xs]
    return FederatedData.from_arrays(Xs, ys)


def gd(theta, X, y, steps, lr, anchor=None, lam=0.0):
    for _ in range(steps):
        g = X.T @ (X @ theta - y) + (0 if anchor is None else lam / 2 * (theta - anchor))
        theta = theta - 2 * lr * g
    return theta


def test_fedavg_is_the_unweighted_average_of_local_steps():
    data = federation()
    res = FedAvg(rounds=3, local_steps=5, lr=2e-3, init="zeros", fit_intercept=False).fit(data)
    g = np.zeros(3)
    for _ in range(3):
        g = np.mean([gd(g, data[c].X, data[c].y, 5, 2e-3) for c in data.clients], axis=0)
    for c in data.clients:
        np.testing.assert_allclose(res.coef(c), g, atol=1e-12)
    assert res.communication.by_kind["rounds"]["bytes_up"] == 3 * 4 * 3 * 8  # (and the design check before)


def test_ditto_personal_models_follow_the_proximal_steps():
    data = federation(seed=1)
    lam, lr = 0.5, 2e-3
    res = Ditto(rounds=3, local_steps=5, lr=lr, init="zeros", lam=lam, fit_intercept=False).fit(data)
    g = np.zeros(3)
    v = {c: None for c in data.clients}
    for _ in range(3):
        for c in data.clients:
            v[c] = gd(g if v[c] is None else v[c], data[c].X, data[c].y, 5, lr, anchor=g, lam=lam)
        g = np.mean([gd(g, data[c].X, data[c].y, 5, lr) for c in data.clients], axis=0)
    for c in data.clients:
        np.testing.assert_allclose(res.coef(c), v[c], atol=1e-12)


def test_distributed_ridge_and_separate_ols_and_pooled_oracle():
    data = federation(seed=2)
    lam = 0.1
    sols = [
        np.linalg.solve(data[c].X.T @ data[c].X / data[c].n + lam * np.eye(3), data[c].X.T @ data[c].y / data[c].n)
        for c in data.clients
    ]
    res = DistributedRidge(lam=lam, fit_intercept=False).fit(data)
    np.testing.assert_allclose(res.coef(0), np.mean(sols, axis=0), atol=1e-12)
    ols = Separate(method="ols", fit_intercept=False).fit(data)
    np.testing.assert_allclose(ols.coef(1), np.linalg.lstsq(data[1].X, data[1].y, rcond=None)[0], atol=1e-12)
    # the oracle with a huge prior variance is least squares, with a tiny one it is zero
    big = PooledOracle(omega=1e8 * np.eye(4), noise_var=0.01).fit(data)
    np.testing.assert_allclose(big.theta, ols.theta, atol=1e-5)
    tiny = PooledOracle(omega=1e-10 * np.eye(4), noise_var=0.01).fit(data)
    assert np.abs(tiny.theta).max() < 1e-5
    rm = ols.rmse(data)
    assert list(rm.index) == data.clients and (rm < 0.2).all()


def test_separate_gd_converges_to_least_squares_and_rejects_bad_options():
    data = federation(seed=3)
    sep = Separate(rounds=200, local_steps=20, fit_intercept=False).fit(data)
    ols = Separate(method="ols", fit_intercept=False).fit(data)
    np.testing.assert_allclose(sep.theta, ols.theta, atol=1e-8)
    with pytest.raises(ValueError, match="method"):
        Separate(method="svd").fit(data)
    with pytest.raises(FloatingPointError, match="lower lr"):
        Separate(lr=1.0).fit(data)
    with pytest.raises(FloatingPointError, match="lower lr"):
        FedAvg(lr=1.0, rounds=40).fit(data)
    with pytest.raises(ValueError, match="lam"):
        Ditto(lam=-1).fit(data)
    with pytest.raises(ValueError, match="lam"):
        DistributedRidge(lam=0).fit(data)
    with pytest.raises(ValueError, match="omega"):
        PooledOracle(omega=np.eye(2), noise_var=1).fit(data)


def test_averaging_servers_see_only_sums_of_the_coefficients(monkeypatch):
    """FedAvg, Ditto and distributed ridge declare the coefficients summed: their server steps
    hold no client's ``theta``, only the sum over the clients that answered (the average is
    that sum over their number). Separate keeps each client's coefficients: they are its fit."""
    from fedstats.linear import baselines

    seen = []
    for cls in (baselines._Averaging, baselines._OneShotRidge, baselines._SeparateFit):
        real = cls.server_step

        def spy(self, state, replies, round, real=real):
            seen.append((type(self).__name__, [set(r) for r in replies.values()], set(replies.sums)))
            return real(self, state, replies, round)

        monkeypatch.setattr(cls, "server_step", spy)
    data = federation(seed=3)
    lr = 2e-3
    res = FedAvg(rounds=4, local_steps=5, lr=lr, init="zeros", participation=2, fit_intercept=False).fit(data, seed=1)
    ditto = Ditto(rounds=2, local_steps=5, lr=lr, init="zeros", lam=0.5, fit_intercept=False).fit(data)
    ridge = DistributedRidge(lam=0.1, fit_intercept=False).fit(data)
    Separate(method="ols", fit_intercept=False).fit(data)
    monkeypatch.undo()
    # the oracle: the plain average of the participants' local steps, round by round
    g = np.zeros(3)
    for rec in res.history:
        assert len(rec.answered) == 2
        g = np.mean([gd(g, data[c].X, data[c].y, 5, lr) for c in rec.answered], axis=0)
    np.testing.assert_allclose(res.coef(0), g, atol=1e-12)
    assert ditto.theta.shape == (3, 4) and ridge.theta.shape == (3, 4)
    names = [name for name, _, _ in seen]
    assert names == ["_Averaging"] * 6 + ["_OneShotRidge", "_SeparateFit"]
    for name, per_client, sums in seen:
        if name == "_SeparateFit":
            assert per_client == [{"theta"}] * 4 and sums == set()
        else:
            assert len(per_client) in (2, 4) and all(keys == set() for keys in per_client) and sums == {"theta"}


def test_averaging_that_stops_unconverged_says_so():
    """FedAvg and Ditto report converged (the global coefficients moved by less than tol,
    relative, in the last round) and warn, naming the change and tol, when they did not."""
    data = federation(seed=4)
    with pytest.warns(RuntimeWarning, match=r"FedAvg did not converge in 2 rounds: .* of their norm \(tol=0.0001\)"):
        short = FedAvg(rounds=2, lr=2e-3).fit(data)
    assert short.converged is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        long = Ditto(rounds=400, lr=2e-3).fit(data)
    assert long.converged is True
