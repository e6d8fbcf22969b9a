"""FGPR's hyperparameter uncertainty (fedstats.gp.laplace): the clients' closed-form curvature
against autograd on an independently written pooled objective, the federated Newton steps
against L-BFGS on pooled data, the result's tables, predictions and files, and the intervals'
coverage on simulated GPs with known hyperparameters."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fedstats import streams
from fedstats.data import FederatedData
from fedstats.gp import FGPR, laplace
from fedstats.gp._core import HyperSpec
from fedstats.gp.fgpr_result import FGPRResult
from fedstats.results import NoPosteriorError, load_result

SPECS = [
    HyperSpec(d=2),
    HyperSpec(d=2, ard=True),
    HyperSpec(d=2, kernel="matern", nu=0.5),
    HyperSpec(d=2, kernel="matern", nu=1.5, ard=True, mean="constant"),
    HyperSpec(d=2, kernel="matern", nu=2.5, mean="constant"),
]


def oracle_nll(spec: HyperSpec, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The negative log marginal likelihood written out from the kernels' textbook formulas
    (not GPyTorch's code), by a dense solve and slogdet."""
    p, i = {}, 0
    for n in spec.names:
        k = spec.size(n)
        p[n], i = theta[i : i + k], i + k
    Z = X / p["lengthscale"].exp()
    u = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)
    eye = torch.eye(len(y), dtype=torch.bool)
    r = torch.sqrt(torch.where(eye, 1.0, u))  # the diagonal's derivative is 0: B(0) = 1 fixed
    if spec.kernel == "rbf":
        B = torch.exp(-0.5 * u)
    else:
        S = math.sqrt(2 * spec.nu) * r
        poly = {0.5: 1.0, 1.5: 1 + S, 2.5: 1 + S + S**2 / 3}[spec.nu]
        B = torch.where(eye, 1.0, poly * torch.exp(-S))
    K = p["outputscale"].exp() * B + p["noise"].exp() * torch.eye(len(y), dtype=y.dtype)
    res = y - p["mean"] if "mean" in p else y
    return 0.5 * (res @ torch.linalg.solve(K, res) + torch.linalg.slogdet(K)[1] + len(y) * math.log(2 * math.pi))


def oracle_pooled(spec, hyper, Xs, ys):
    """Value, gradient and Hessian of ``sum_k L_k`` by autograd (torch.autograd.functional)."""
    theta = torch.as_tensor(laplace.to_theta(spec, hyper))
    data = [(torch.as_tensor(X), torch.as_tensor(y)) for X, y in zip(Xs, ys)]
    f = lambda t: sum(oracle_nll(spec, t, X, y) for X, y in data)  # noqa: E731
    t = theta.clone().requires_grad_(True)
    val = f(t)
    (g,) = torch.autograd.grad(val, t)
    return float(val), g.numpy(), torch.autograd.functional.hessian(f, theta).numpy()


def hyper_for(spec, rng):
    h = {
        "lengthscale": rng.uniform(0.3, 0.8, spec.size("lengthscale")),
        "outputscale": np.array([rng.uniform(0.5, 2)]),
        "noise": np.array([rng.uniform(0.02, 0.3)]),
    }
    if spec.mean == "constant":
        h["mean"] = np.array([rng.normal(0, 0.5)])
    return h


def toy(K=3, n=(30, 40, 25), d=2, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.uniform(0, 1, (m, d)) for m in n[:K]]
    ys = [np.sin(4 * X[:, 0]) * np.cos(3 * X[:, -1]) + 0.2 * rng.standard_normal(len(X)) + k for k, X in enumerate(Xs)]
    return FederatedData.from_arrays(Xs, ys)


def gp_federation(rng, K, n, ls=0.2, s=1.0, v=0.1):
    """K clients of n points each, drawn from the zero-mean RBF GP with the given hyperparameters."""
    Xs, ys = [], []
    for _ in range(K):
        X = rng.uniform(0, 1, (n, 1))
        C = s * np.exp(-0.5 * (X - X.T) ** 2 / ls**2) + v * np.eye(n)
        Xs.append(X)
        ys.append(np.linalg.cholesky(C) @ rng.standard_normal(n))
    return FederatedData.from_arrays(Xs, ys)


# --------------------------------------------------------------------------- the curvature


@pytest.mark.parametrize(
    "spec", SPECS, ids=lambda s: f"{s.kernel}{s.nu if s.kernel == 'matern' else ''}-ard{s.ard}-{s.mean}"
)
def test_closed_form_curvature_equals_autograd_on_an_independent_objective(spec):
    rng = np.random.default_rng(1)
    X, y = rng.uniform(0, 1, (40, 2)), rng.standard_normal(40)
    hyper = hyper_for(spec, rng)
    f, g, H = laplace.curvature(spec, hyper, X, y)
    f0, g0, H0 = oracle_pooled(spec, hyper, [X], [y])
    assert f == pytest.approx(f0, rel=1e-10)
    np.testing.assert_allclose(g, g0, rtol=1e-8, atol=1e-8 * np.abs(g0).max())
    np.testing.assert_allclose(H, H0, rtol=1e-6, atol=1e-8 * np.abs(H0).max())
    assert np.allclose(H, H.T)


def test_the_server_gets_the_sum_of_the_clients_curvatures():
    data = toy()
    spec = HyperSpec(d=2, kernel="matern", nu=2.5, ard=True)
    hyper = hyper_for(spec, np.random.default_rng(2))
    Xs = [np.asarray(data[c].X) for c in data.clients]
    ys = [np.asarray(data[c].y) for c in data.clients]
    _, curv = laplace.federated_curvature(spec, hyper, data, standardize=False, seed=0)
    f0, g0, H0 = oracle_pooled(spec, hyper, Xs, ys)
    assert curv["nll"][0] == pytest.approx(f0, rel=1e-10)
    np.testing.assert_allclose(curv["gradient"], g0, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(curv["hessian"], H0, rtol=1e-6)


@pytest.mark.parametrize("K", [1, 3])
def test_the_fits_laplace_approximation_equals_autograd_on_the_pooled_objective(K):
    data = toy(K=K)
    res = FGPR(rounds=30, lr=0.05, batch_size=64, standardize=False, newton_steps=10).fit(data, seed=0)
    spec = res.spec
    Xs = [np.asarray(data[c].X) for c in data.clients]
    ys = [np.asarray(data[c].y) for c in data.clients]
    _, g0, H0 = oracle_pooled(spec, res.hyperparameters, Xs, ys)
    post = res.global_posterior()
    np.testing.assert_allclose(post.mean, np.log(np.concatenate([res.hyperparameters[n] for n in spec.names])))
    np.testing.assert_allclose(post.cov, np.linalg.inv(H0), rtol=1e-6)
    assert post.names == ["log_lengthscale", "log_outputscale", "log_noise"]
    # the Newton steps reached the maximum: the gradient is 0 within 1e-3 posterior sd
    assert np.max(np.abs(np.linalg.solve(H0, g0)) / np.sqrt(np.diag(np.linalg.inv(H0)))) < 1e-3
    assert res.newton_step().abs().max() < 1e-3


def test_newton_steps_reach_the_pooled_maximum_and_short_rounds_warn():
    data = toy()
    model = FGPR(rounds=3, lr=0.05, batch_size=64, ard=True, newton_steps=0)
    with pytest.warns(RuntimeWarning, match="posterior sd from the likelihood's maximum|not at a maximum"):
        short = model.fit(data, seed=0)
    assert not short.newton_step().abs().max() <= 1
    # the default takes 5 Newton steps: the same short rounds, intervals without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        default = model.set_params(newton_steps=None).fit(data, seed=0)
    assert default.newton_step().abs().max() <= 1
    model.set_params(newton_steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        polished = model.fit(data, seed=0)
    central = model.fit_centralized(data)
    for n in polished.spec.names:
        np.testing.assert_allclose(polished.hyperparameters[n], central.hyperparameters[n], rtol=2e-3)
    # the same intervals, the federated ones from summed client Hessians, the centralised pooled
    fs, cs = polished.summary(level=0.9), central.summary(level=0.9)
    np.testing.assert_allclose(fs[["lower", "upper"]], cs[["lower", "upper"]], rtol=5e-3)
    assert polished.communication.by_kind["hyperparameter curvature"]["runs"] >= 2
    with pytest.raises(ValueError, match="laplace=False"):
        FGPR(newton_steps=3, laplace=False).fit(data)


# --------------------------------------------------------------------------- the result


def test_summary_gives_natural_scale_intervals_around_the_estimate():
    data = toy()
    res = FGPR(rounds=30, lr=0.05, newton_steps=10, mean="constant").fit(data, seed=0)
    t = res.summary(level=0.9)
    assert list(t.index) == ["lengthscale", "outputscale", "noise", "mean"]
    assert list(t.columns[:6]) == ["mean", "sd", "lower", "upper", "p_value", "estimate"]
    est = np.concatenate([res.hyperparameters[n] for n in res.spec.names])
    np.testing.assert_allclose(t["estimate"], est)
    assert np.all((t["lower"] < t["estimate"]) & (t["estimate"] < t["upper"]))
    g = res.global_posterior()
    lo, hi = g.credible_interval(0.9)
    np.testing.assert_allclose(t["lower"].iloc[:3], np.exp(lo[:3]))  # log-normal: the interval mapped
    np.testing.assert_allclose(t.loc["mean", ["lower", "upper"]], [lo[3], hi[3]])  # the mean: normal
    s = np.sqrt(np.diag(g.cov))[:3]
    np.testing.assert_allclose(t["mean"].iloc[:3], np.exp(g.mean[:3] + s**2 / 2))
    assert t["p_value"].iloc[:3].isna().all() and np.isfinite(t.loc["mean", "p_value"])
    ds = res.to_arviz(n=200)
    assert ds.posterior["global"].shape == (4, 50, 4)  # 4 chains of 50


def test_without_the_approximation_the_tables_keep_the_estimate_and_say_why(tmp_path):
    data = toy()
    res = FGPR(rounds=5, laplace=False).fit(data, seed=0)
    t = res.summary()
    assert t["sd"].isna().all() and np.allclose(t["mean"], t["estimate"])
    with pytest.raises(NoPosteriorError, match="laplace=False"):
        res.global_posterior()
    with pytest.raises(NoPosteriorError, match="laplace=False"):
        res.predict(np.zeros((1, 2)), client=0, hyper_draws=5)
    old = FGPRResult.__new__(FGPRResult)  # a result saved before the approximation existed
    old.__dict__.update({k: v for k, v in res.__dict__.items() if k != "laplace"})
    with pytest.raises(NoPosteriorError, match="fit it again"):
        old.global_posterior()


def test_the_approximation_survives_save_and_load(tmp_path):
    res = FGPR(rounds=30, lr=0.05, newton_steps=5).fit(toy(), seed=0)
    res.save(tmp_path / "r.fedstats")
    back = load_result(tmp_path / "r.fedstats")
    np.testing.assert_allclose(back.global_posterior().cov, res.global_posterior().cov)
    assert back.summary().equals(res.summary())


def test_a_client_that_fails_its_curvature_leaves_the_fit_without_intervals(monkeypatch):
    data = toy()
    real = laplace.curvature

    def flaky(spec, hyper, X, y):
        if len(y) == 40:
            raise np.linalg.LinAlgError("broken factor")
        return real(spec, hyper, X, y)

    monkeypatch.setattr(laplace, "curvature", flaky)
    with pytest.warns(RuntimeWarning, match="client 1 did not send its curvature"):
        res = FGPR(rounds=5).fit(data, seed=0)
    assert res.summary()["sd"].isna().all()
    with pytest.raises(NoPosteriorError, match="client 1"):
        res.global_posterior()


def test_big_clients_skip_the_curvature_by_default_unless_asked(monkeypatch):
    one, ard = HyperSpec(d=20), HyperSpec(d=20, ard=True)
    assert laplace.wanted(None, {"a": 10, "b": 5400}, one) is None
    assert "laplace=True" in laplace.wanted(None, {"a": 10, "b": 5500}, one)
    assert laplace.wanted(None, {"b": 2900}, ard) is None and laplace.wanted(None, {"b": 3100}, ard)
    assert laplace.wanted(True, {"a": 10**6}, one) is None
    assert "laplace=False" in laplace.wanted(False, {"a": 10}, one)
    # a fit that skips it says so, and that its Newton steps were not taken
    monkeypatch.setattr(laplace, "LAPLACE_BYTES", laplace.memory(HyperSpec(d=2), 30))
    with pytest.warns(RuntimeWarning, match="newton_steps=3 not taken: a client has 40 rows"):
        res = FGPR(rounds=3, newton_steps=3).fit(toy(), seed=0)
    with pytest.raises(NoPosteriorError, match="laplace=True"):
        res.global_posterior()


def test_a_boundary_maximum_gives_no_intervals_and_asks_the_clients_nothing():
    rng = np.random.default_rng(5)
    Xs = [rng.uniform(0, 1, (30, 1)) for _ in range(3)]
    data = FederatedData.from_arrays(Xs, [2 * X[:, 0] + 1 for X in Xs])  # noiseless and linear
    cen = FGPR().fit_centralized(data)
    assert "noise is at its floor" in cen.laplace
    hyper = {**cen.hyperparameters, "noise": np.array([cen.spec.noise_floor])}
    out, why = laplace.federated_curvature(cen.spec, hyper, data, standardize=True, seed=0)
    assert "noise is at its floor" in why and out is not None


def test_predictions_mix_over_hyperparameter_draws():
    data = toy()
    res = FGPR(rounds=30, lr=0.05, newton_steps=5).fit(data, seed=0)
    Xq = np.random.default_rng(3).uniform(0, 1, (7, 2))
    plug = res.predict(Xq, client=1)
    assert plug.equals(res.predict(Xq, client=1, hyper_draws=0))
    mix = res.predict(Xq, client=1, hyper_draws=3, seed=4)
    # the mixture by hand: the same three draws, one plug-in prediction each
    draws = res.global_posterior().sample(3, seed=streams.stream(4, "hyper draws"))  # its documented stream
    parts = []
    for t in draws:
        one = FGPRResult(**{**_init_args(res), "hyperparameters": laplace.from_theta(res.spec, t)})
        parts.append(one.predict(Xq, client=1))
    m = np.array([p["mean"] for p in parts])
    np.testing.assert_allclose(mix["mean"], m.mean(0), rtol=1e-10)
    np.testing.assert_allclose(mix["sd"] ** 2, np.mean([p["sd"] ** 2 for p in parts], 0) + m.var(0), rtol=1e-8)
    pv = np.mean([p["pred_sd"] ** 2 for p in parts], 0) + m.var(0)
    np.testing.assert_allclose(mix["pred_sd"] ** 2, pv, rtol=1e-8)
    # a very sharp approximation gives the plug-in prediction back
    sharp = FGPRResult(**{**_init_args(res), "laplace": {**res.laplace, "hessian": res.laplace["hessian"] * 1e14}})
    np.testing.assert_allclose(sharp.predict(Xq, client=1, hyper_draws=4)["sd"], plug["sd"], rtol=1e-5)
    with pytest.raises(ValueError, match="hyper_draws"):
        res.predict(Xq, client=1, hyper_draws=-1)


def _init_args(res: FGPRResult) -> dict:
    keys = ("spec", "hyperparameters", "feature_names", "clients", "n_obs", "options", "seed", "laplace")
    return {k: getattr(res, k) for k in keys} | {"data": res._data}


# --------------------------------------------------------------------------- coverage


def coverage(reps: int, K: int, n: int, seed0: int) -> tuple[np.ndarray, int]:
    """Whether each 90% interval covers the true log hyperparameter (one row per simulated
    federation with intervals), and how many federations got none (a maximum on the boundary)."""
    truth = np.log([0.2, 1.0, 0.1])
    hits, none = [], 0
    for rep in range(reps):
        data = gp_federation(np.random.default_rng(seed0 + rep), K, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = FGPR(standardize=False, batch_size=n, lr=0.05, rounds=30, newton_steps=10).fit(data, seed=rep)
        try:
            lo, hi = res.global_posterior().credible_interval(0.9)
        except NoPosteriorError:
            none += 1
            continue
        assert res.newton_step().abs().max() < 1e-3  # at the maximum
        hits.append((lo <= truth) & (truth <= hi))
    return np.array(hits), none


def test_intervals_cover_known_hyperparameters_short():
    hits, none = coverage(reps=60, K=5, n=60, seed0=1000)
    # 180 intervals: binomial sd 0.022 at 0.9; the tolerance is 0.1 (the slow study's is 0.07)
    assert none <= 2 and abs(hits.mean() - 0.9) <= 0.1, (none, hits.mean(0))


@pytest.mark.slow
def test_intervals_cover_known_hyperparameters():
    hits, none = coverage(reps=400, K=5, n=60, seed0=5000)
    assert none <= 8, none
    assert abs(hits.mean() - 0.9) <= 0.07, hits.mean(0)
    assert np.all(np.abs(hits.mean(0) - 0.9) <= 0.07), hits.mean(0)
