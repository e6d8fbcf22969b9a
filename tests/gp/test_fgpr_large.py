"""FGPR for large clients (issue 22, item 3): predictions from all of a client's rows.

The tiled Cholesky path (``fedstats.gp._tiled``) against the dense Cholesky path and an
independent numpy closed form; a client above the old 2,000-row default predicts from all
rows without a warning; ``condition_limit`` as an explicit opt-in (kept by saved results);
jitter, NaN and memory guards; the progress bar.

Tolerances: the acceptance asks for 1e-4 relative (mean, ``var_f``, ``var_y``) against the
exact Cholesky answer. The tiled path is the same exact arithmetic in another order, so it
agrees to rounding (about 1e-11 measured); the tests assert 1e-8: the mean relative to its
largest absolute value, the variances point by point relative to their own value.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from linear_operator import settings as lo_settings
from linear_operator.utils.errors import NanError, NotPSDError
from linear_operator.utils.warnings import NumericalWarning

from fedstats.data import FederatedData
from fedstats.gp import FGPR, FGPRResult, _tiled
from fedstats.gp._core import HyperSpec, posterior
from fedstats.gp._tiled import TiledCholesky, tile_bounds

RTOL = 1e-8
HYPER = {"lengthscale": np.array([0.2]), "outputscale": np.array([1.3]), "noise": np.array([0.01])}


def rbf(A, B, ls, os_):
    d2 = ((A[:, None, :] - B[None, :, :]) / ls) ** 2
    return os_ * np.exp(-0.5 * d2.sum(-1))


def numpy_posterior(X, y, Xs, ls, os_, noise):
    """The closed form by numpy's Cholesky (independent of torch and GPyTorch)."""
    L = np.linalg.cholesky(rbf(X, X, ls, os_) + noise * np.eye(len(X)))
    Ks = rbf(X, Xs, ls, os_)
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y))
    V = np.linalg.solve(L, Ks)
    return Ks.T @ alpha, os_ - (V * V).sum(0)


def client(n, seed=0, d=2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, d))
    y = np.sin(6 * X[:, 0]) * np.cos(4 * X[:, -1]) + X[:, 0] + 0.1 * rng.standard_normal(n)
    return X, y


def assert_close(mean, var_f, ref_mean, ref_var_f, noise, rtol=RTOL):
    err_mean = np.max(np.abs(mean - ref_mean)) / np.max(np.abs(ref_mean))
    err_f = np.max(np.abs(var_f - ref_var_f) / ref_var_f)
    err_y = np.max(np.abs(var_f - ref_var_f) / (ref_var_f + noise))
    assert err_mean < rtol and err_f < rtol and err_y < rtol, (err_mean, err_f, err_y)


@pytest.fixture
def tiled_calls(monkeypatch):
    """Counts the predictions that took the tiled path."""
    calls = []
    orig = _tiled.tiled_posterior

    def spy(*args, **kwargs):
        calls.append(len(args[1]))
        return orig(*args, **kwargs)

    monkeypatch.setattr(_tiled, "tiled_posterior", spy)
    return calls


def result(options, d=2, hyper=HYPER):
    return FGPRResult(
        spec=HyperSpec(d=d),
        hyperparameters=hyper,
        feature_names=[f"x{j}" for j in range(d)],
        clients=[],
        n_obs={},
        options=options,
    )


# --------------------------------------------------------------------------- the tiles


@pytest.mark.parametrize("n, tile", [(1, 5), (10, 3), (2500, 700), (20000, 2048), (4096, 4096)])
def test_tile_bounds_are_balanced_and_cover_the_rows(n, tile):
    b = tile_bounds(n, tile)
    assert b[0][0] == 0 and b[-1][1] == n and all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1))
    sizes = [e - s for s, e in b]
    assert max(sizes) <= tile and max(sizes) - min(sizes) <= 1 and len(b) == -(-n // tile)


def test_tiled_factor_and_solve_equal_the_dense_cholesky():
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.uniform(0, 1, (300, 2)))
    kernel = lambda A, B: torch.exp(-0.5 * torch.cdist(A, B) ** 2 / 0.3**2)  # noqa: E731
    chol = TiledCholesky(kernel, X, 0.01, tile=70)
    assert len(chol.bounds) == 5 and len(chol.L) == 15  # only the tiles on and below the diagonal
    A = kernel(X, X) + 0.01 * torch.eye(300, dtype=torch.float64)
    Ld = torch.linalg.cholesky(A)
    for (i, j), Lij in chol.L.items():
        (r0, r1), (c0, c1) = chol.bounds[i], chol.bounds[j]
        torch.testing.assert_close(Lij if i != j else Lij.tril(), Ld[r0:r1, c0:c1], rtol=0, atol=1e-10)
    r = torch.as_tensor(rng.standard_normal((300, 2)))
    torch.testing.assert_close(torch.cat(chol.solve(r)), torch.cholesky_solve(r, Ld), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "spec, hyper",
    [
        (HyperSpec(d=2), HYPER),
        (
            HyperSpec(d=2, kernel="matern", nu=1.5, ard=True, mean="constant"),
            {
                "lengthscale": np.array([0.25, 0.4]),
                "outputscale": np.array([0.8]),
                "noise": np.array([0.02]),
                "mean": np.array([0.3]),
            },
        ),
    ],
)
def test_tiled_posterior_equals_the_dense_cholesky_at_2500_rows(spec, hyper):
    X, y = client(2500, seed=1)
    Xs = np.random.default_rng(2).uniform(-0.1, 1.1, (600, 2))  # some outside the data: var_f near the prior
    kw = dict(device=torch.device("cpu"), dtype=torch.float64)
    dense = posterior(spec, hyper, X, y, Xs, **kw)
    tiled = posterior(spec, hyper, X, y, Xs, dense_max=0, tile=700, **kw)  # 4 x 4 tiles of 625 rows
    assert_close(*tiled, *dense, float(hyper["noise"][0]))
    assert dense[1].min() < 1e-2 * dense[1].max()  # the small variances, where cancellation bites, are tested


# --------------------------------------------------------------------------- predict


def test_condition_limit_is_off_by_default():
    assert FGPR().get_params()["condition_limit"] is None


@pytest.mark.parametrize("dense_max", [None, 1000])  # the default (dense at 2,500 rows) and the tiled path
def test_a_client_above_the_old_limit_predicts_from_all_its_rows(monkeypatch, tiled_calls, dense_max):
    if dense_max is not None:
        monkeypatch.setattr(_tiled, "DENSE_MAX", dense_max)
        monkeypatch.setattr(_tiled, "TILE", 700)
    X, y = client(2500, seed=3)
    data = FederatedData.from_arrays([X, X[:50]], [y, y[:50]])
    res = FGPRResult(
        spec=HyperSpec(d=2),
        hyperparameters=HYPER,
        feature_names=data.feature_names,
        clients=data.clients,
        n_obs=data.n_obs,
        options=FGPR(standardize=False).get_params(),  # every option at its default
        data=data,
    )
    Xs = np.random.default_rng(4).uniform(0, 1, (200, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no subset warning, nor any other
        pred = res.predict(Xs, client=0)
    mean, var_f = numpy_posterior(X, y, Xs, 0.2, 1.3, 0.01)
    assert_close(pred["mean"].to_numpy(), pred["sd"].to_numpy() ** 2, mean, var_f, 0.01)
    np.testing.assert_allclose(pred["pred_sd"] ** 2, var_f + 0.01, rtol=RTOL)
    assert tiled_calls == ([] if dense_max is None else [2500])
    # every row counts: dropping one of them moves the prediction
    other = res.predict(Xs, data=(X[1:], y[1:]))
    assert np.max(np.abs(other["mean"] - pred["mean"])) > 1e-6


def test_5000_rows_are_within_1e_4_of_the_exact_cholesky_answer(tiled_calls):
    """The acceptance check: a 5,000-row client (the tiled path by default) against the
    dense exact Cholesky answer, on the standardised scale where the variances are small."""
    X, y = client(5000, seed=5)
    Xs = np.random.default_rng(6).uniform(0, 1, (300, 2))
    res = result(FGPR().get_params())  # standardize=True, condition_limit=None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred = res.predict(Xs, data=(X, y), scale="standardized")
    assert tiled_calls == [5000]  # the default path at this size
    ys = (y - y.mean()) / y.std()
    mean, var_f = posterior(HyperSpec(d=2), HYPER, X, ys, Xs, device="cpu", dtype=torch.float64, dense_max=10**9)
    assert var_f.max() < 1e-2  # 5,000 rows leave little latent variance: a hard relative test
    assert_close(pred["mean"].to_numpy(), pred["sd"].to_numpy() ** 2, mean, var_f, 0.01, rtol=1e-4)
    assert_close(pred["mean"].to_numpy(), pred["sd"].to_numpy() ** 2, mean, var_f, 0.01, rtol=RTOL)


def test_condition_limit_is_an_opt_in_kept_by_saved_results(tmp_path):
    X, y = client(2500, seed=7)
    Xs = np.random.default_rng(8).uniform(0, 1, (50, 2))
    # as an older version saved a fit with its then-default of 2000
    old = result({"standardize": False, "condition_limit": 2000})
    back = FGPRResult.load(old.save(tmp_path / "old.fedstats"))
    assert back.options["condition_limit"] == 2000
    with pytest.warns(UserWarning, match="random subset of 2000"):
        sub = back.predict(Xs, data=(X, y), seed=1)
    keep = np.sort(np.random.default_rng(1).choice(2500, size=2000, replace=False))
    mean, var_f = numpy_posterior(X[keep], y[keep], Xs, 0.2, 1.3, 0.01)
    assert_close(sub["mean"].to_numpy(), sub["sd"].to_numpy() ** 2, mean, var_f, 0.01)
    back.options["condition_limit"] = None  # the documented way back to all rows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        full = back.predict(Xs, data=(X, y))
    mean, var_f = numpy_posterior(X, y, Xs, 0.2, 1.3, 0.01)
    assert_close(full["mean"].to_numpy(), full["sd"].to_numpy() ** 2, mean, var_f, 0.01)


# --------------------------------------------------------------------------- guards


def test_jitter_is_added_as_gpytorch_does_and_failures_are_loud():
    X = torch.zeros(200, 1, dtype=torch.float64)
    ones = lambda A, B: torch.ones(len(A), len(B), dtype=torch.float64)  # noqa: E731 - rank one: not p.d.
    with pytest.warns(NumericalWarning, match="added jitter of 1.0e-08"):
        chol = TiledCholesky(ones, X, 0.0, tile=64)
    full = torch.zeros(200, 200, dtype=torch.float64)
    for (i, j), Lij in chol.L.items():
        (r0, r1), (c0, c1) = chol.bounds[i], chol.bounds[j]
        full[r0:r1, c0:c1] = Lij if i != j else Lij.tril()
    torch.testing.assert_close(full @ full.T, torch.ones(200, 200, dtype=torch.float64) + 1e-8 * torch.eye(200))
    # as many tries as linear_operator's setting says: 3 by default (importing BoTorch sets 6)
    for tries, top in ((3, "1.0e-06"), (6, "1.0e-03")):
        with lo_settings.cholesky_max_tries(tries), pytest.raises(NotPSDError, match=f"up to {top}"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NumericalWarning)
                TiledCholesky(ones, X, -1.0, tile=64)
    nan = lambda A, B: torch.full((len(A), len(B)), float("nan"), dtype=torch.float64)  # noqa: E731
    with pytest.raises(NanError):
        TiledCholesky(nan, X, 0.0, tile=64)


def test_host_memory_is_checked_before_the_tiled_factorisation(monkeypatch):
    monkeypatch.setattr(_tiled, "available_bytes", lambda: 10**6)
    X, y = client(300)
    with pytest.raises(MemoryError, match="condition_limit"):
        posterior(HyperSpec(d=2), HYPER, X, y, X[:5], device="cpu", dtype=torch.float64, dense_max=100, tile=100)
    posterior(HyperSpec(d=2), HYPER, X, y, X[:5], device="cpu", dtype=torch.float64)  # the dense path: no check


def test_progress_bar_when_asked_and_quiet_otherwise(capsys):
    X, y = client(300)
    kw = dict(device="cpu", dtype=torch.float64, dense_max=100, tile=100)
    posterior(HyperSpec(d=2), HYPER, X, y, X[:5], progress=True, **kw)
    assert "exact GP on 300 rows" in capsys.readouterr().err
    posterior(HyperSpec(d=2), HYPER, X, y, X[:5], **kw)  # None: stderr is not a terminal under pytest
    posterior(HyperSpec(d=2), HYPER, X, y, X[:5], progress=False, **kw)
    assert capsys.readouterr().err == ""
