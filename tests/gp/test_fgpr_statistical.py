"""FGPR's statistical behaviour on simulated GP data (spec fgpr.md §9 items 7, 8, 11) and the
case studies on the real data (skipped when the files are absent)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.gp import FGPR
from fedstats.gp._core import HyperSpec, fit_mle
from fedstats.gp.fgpr import FGPRResult

DATA = Path(os.environ.get("FEDSTATS_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")


def rbf(A, B, ls, os_):
    d2 = ((A[:, None, :] - B[None, :, :]) / ls) ** 2
    return os_ * np.exp(-0.5 * d2.sum(-1))


def gp_clients(K, n, seed, ls=0.3, os_=1.0, noise=0.05, d=2):
    """K independent GP draws (one per client) on uniform inputs in [0, 1]^d."""
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for _ in range(K):
        X = rng.uniform(0, 1, (n, d))
        Xs.append(X)
        ys.append(np.linalg.cholesky(rbf(X, X, ls, os_) + noise * np.eye(n)) @ rng.standard_normal(n))
    return FederatedData.from_arrays(Xs, ys)


def test_recovers_the_generating_hyperparameters_at_rate():
    # spec §9 item 7 (d = 2, K = 20, N = 5000, M = 64, E = 5, R = 100)
    truth = np.array([0.3, 1.0, 0.05])
    errs = []
    for seed in range(2):
        res = FGPR(rounds=100, local_steps=5, batch_size=64, lr=0.01, standardize=False).fit(
            gp_clients(20, 250, seed), seed=seed
        )
        h = res.hyperparameters
        assert abs(h["noise"][0] / 0.05 - 1) < 0.2 and abs(h["outputscale"][0] - 1) < 0.5, h
        path = np.array([[r.metrics["lengthscale"], r.metrics["outputscale"], r.metrics["noise"]] for r in res.history])
        errs.append(((path - truth) ** 2).sum(1))
    e = np.mean(errs, 0)
    rounds = np.arange(1, 101)
    slope = np.polyfit(np.log(rounds[4:50]), np.log(e[4:50]), 1)[0]
    assert slope < -0.5, slope


def test_close_to_the_centralised_exact_gp_on_an_iid_split():
    # spec §9 item 8, with N = 1000 (the centralised exact fit factorises 1000 x 1000)
    rng = np.random.default_rng(5)
    X = rng.uniform(0, 1, (1200, 2))
    y = np.linalg.cholesky(rbf(X, X, 0.3, 1.0) + 0.05 * np.eye(1200)) @ rng.standard_normal(1200)
    tr, te = np.arange(1000), np.arange(1000, 1200)
    parts, tparts = np.array_split(tr, 10), np.array_split(te, 10)
    data = FederatedData.from_arrays([X[p] for p in parts], [y[p] for p in parts])
    test = FederatedData.from_arrays([X[p] for p in tparts], [y[p] for p in tparts])
    fed = FGPR(rounds=100, batch_size=64, lr=0.02, standardize=False).fit(data)
    cen_h, _, _ = fit_mle(HyperSpec(d=2), X[tr], y[tr], restarts=2)
    h = fed.hyperparameters
    assert abs(h["noise"][0] / cen_h["noise"][0] - 1) <= 0.25, (h, cen_h)
    for k in ("outputscale", "lengthscale"):
        assert abs(h[k][0] / cen_h[k][0] - 1) <= 0.5, (k, h, cen_h)
    cen = FGPRResult(
        spec=HyperSpec(d=2),
        hyperparameters=cen_h,
        feature_names=data.feature_names,
        clients=data.clients,
        n_obs=data.n_obs,
        options={"standardize": False},
        data=data,
    )
    a, b = fed.rmse(test).mean(), cen.rmse(test).mean()
    assert abs(a / b - 1) <= 0.05, (a, b)


def test_recovers_from_a_bad_start():
    # spec §9 item 11: from (outputscale, noise, lengthscale) = (1, 10, 1), where the fit is a flat
    # line, the test RMSE (against the noise-free sin) halves within 20 rounds
    rng = np.random.default_rng(0)
    Xs = [rng.uniform(0, 1, (100, 1)) for _ in range(2)]
    Xt = [rng.uniform(0, 1, (1000, 1)) for _ in range(2)]
    data = FederatedData.from_arrays(Xs, [np.sin(X[:, 0]) + np.sqrt(0.2) * rng.standard_normal(100) for X in Xs])
    test = FederatedData.from_arrays(Xt, [np.sin(X[:, 0]) for X in Xt])
    init = {"outputscale": 1.0, "noise": 10.0, "lengthscale": 1.0}
    start = FGPRResult(
        spec=HyperSpec(d=1),
        hyperparameters=HyperSpec(d=1).check(init),
        feature_names=["x0"],
        clients=data.clients,
        n_obs=data.n_obs,
        options={"standardize": False},
        data=data,
    )
    first = start.rmse(test).mean()
    # E and the lr are not given by the paper; with Adam (steps of about lr in the raw parameter) the noise
    # needs about 115 steps of 0.1 to come down from 10: E = 10 gives 200 steps in 20 rounds (E = 5: 40 rounds)
    res = FGPR(rounds=20, lr=0.1, local_steps=10, batch_size=64, init=init, standardize=False).fit(data)
    assert res.rmse(test).mean() <= 0.5 * first, (first, res.rmse(test).mean())


# --------------------------------------------------------------------------- real data


def _need(folder):
    if not (DATA / folder).is_dir():
        pytest.skip(f"real data not found under {DATA / folder} (set FEDSTATS_DATA)")


def test_cmapss_sensor_7_fgpr_matches_the_centralised_fit():
    _need("cmapss")
    from fedstats.experiments.fgpr_case_studies import cmapss_study

    tab, _ = cmapss_study(DATA, sensor=7, seed=0, restarts=1)
    fgpr, cen = tab.loc["FGPR", "avg_rmse"], tab.loc["Centralised (same objective)", "avg_rmse"]
    assert abs(fgpr / cen - 1) < 0.03, tab
    assert fgpr < 0.655  # the paper's polynomial baseline (x10: 6.55); its FGPR is 0.576


@pytest.mark.slow
def test_sarcos_output_1_fgpr_close_to_the_centralised_fit():
    _need("sarcos")
    from fedstats.experiments.fgpr_case_studies import sarcos_study

    tab, _ = sarcos_study(DATA, output=1, seed=0, restarts=1)
    fgpr, cen = tab.loc["FGPR", "avg_rmse"], tab.loc["Centralised (same objective)", "avg_rmse"]
    assert fgpr / cen < 1.1, tab


def test_cmapss_gp_loader_refuses_a_constant_sensor():
    _need("cmapss")
    from fedstats.datasets import load_cmapss_gp

    with pytest.raises(ValueError, match="sensor 1 is constant"):
        load_cmapss_gp(DATA, sensor=1)
