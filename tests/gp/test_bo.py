"""FGPR's personal predictor, AR1 co-kriging and the federated AR1 as BoTorch models (issue 23,
item 1): equal to an independently built SingleTaskGP and to fedstats's own predictions, and
optimisable by ``optimize_acqf``."""

from __future__ import annotations

import numpy as np
import pytest

botorch = pytest.importorskip("botorch")
import gpytorch  # noqa: E402
import torch  # noqa: E402
from botorch.acquisition import LogExpectedImprovement, qLogExpectedImprovement  # noqa: E402
from botorch.models import SingleTaskGP  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402

from fedstats.data import FederatedData  # noqa: E402
from fedstats.gp import FGPR  # noqa: E402
from fedstats.gp.multifidelity import AR1CoKriging, FederatedAR1, fidelity_data  # noqa: E402

F64 = torch.float64


def federation(d: int, seed: int = 0) -> FederatedData:
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for k, n in enumerate((25, 40, 30)):
        X = rng.uniform(size=(n, d))
        ys.append(50 + 10 * k + 8 * np.sin(5 * X.sum(1)) + 0.5 * rng.standard_normal(n))
        Xs.append(X)
    return FederatedData.from_arrays(Xs, ys)


def reference_gp(res, X, y) -> SingleTaskGP:
    """BoTorch's SingleTaskGP on the client's raw targets with the fit's hyperparameters, written
    from the FGPR model's definition (y = mu + sd z, z a GP with outputscale s and noise v), not
    with fedstats.gp.bo."""
    h, spec = res.hyperparameters, res.spec
    if res.options["standardize"]:
        mu, sd = float(np.mean(y)), float(np.std(y))
    else:
        mu, sd = 0.0, 1.0
    dims = spec.d if spec.ard else None
    base = (
        gpytorch.kernels.RBFKernel(ard_num_dims=dims)
        if spec.kernel == "rbf"
        else gpytorch.kernels.MaternKernel(nu=spec.nu, ard_num_dims=dims)
    )
    model = SingleTaskGP(
        torch.tensor(X),
        torch.tensor(y)[:, None],
        covar_module=gpytorch.kernels.ScaleKernel(base),
        outcome_transform=None,
    ).to(F64)  # its mean and likelihood are made in torch's default dtype
    model.covar_module.base_kernel.lengthscale = torch.tensor(h["lengthscale"], dtype=F64)
    model.covar_module.outputscale = torch.tensor(sd**2 * h["outputscale"][0], dtype=F64)
    model.likelihood.noise = torch.tensor(sd**2 * h["noise"][0], dtype=F64)
    model.mean_module.constant = torch.tensor(mu + sd * (h["mean"][0] if "mean" in h else 0.0), dtype=F64)
    return model.eval()


@pytest.mark.parametrize(
    "opts",
    [
        dict(kernel="rbf"),
        dict(kernel="matern", nu=2.5, ard=True, mean="constant"),
        dict(kernel="matern", nu=1.5, standardize=False),
    ],
    ids=["rbf", "matern52-ard-mean", "matern32-raw"],
)
def test_fgpr_personal_model_is_botorchs_single_task_gp_and_fedstats_prediction(opts):
    d = 3
    data = federation(d)
    res = FGPR(rounds=15, batch_size=16, lr=0.05, **opts).fit(data, seed=0, progress=False)
    client = data.clients[1]
    X, y = np.asarray(data[client].X), np.asarray(data[client].y)
    model, ref = res.to_botorch(client), reference_gp(res, X, y)
    Xq = torch.as_tensor(np.random.default_rng(1).uniform(size=(6, 4, d)))  # 6 batches of q = 4
    with torch.no_grad():
        got, want = model.posterior(Xq), ref.posterior(Xq)
        torch.testing.assert_close(got.mean, want.mean, rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(
            got.distribution.covariance_matrix, want.distribution.covariance_matrix, rtol=1e-8, atol=1e-8
        )
        noisy, noisy_ref = model.posterior(Xq, observation_noise=True), ref.posterior(Xq, observation_noise=True)
        torch.testing.assert_close(noisy.variance, noisy_ref.variance, rtol=1e-8, atol=1e-8)
        # fedstats's own Cholesky prediction of the same client
        pred = res.predict(Xq.reshape(-1, d).numpy(), client)
        np.testing.assert_allclose(got.mean.reshape(-1).numpy(), pred["mean"], rtol=1e-8)
        np.testing.assert_allclose(got.variance.reshape(-1).numpy(), pred["sd"] ** 2, rtol=1e-8)
        # acquisition values: analytic and Monte-Carlo (the same quasi-random base samples)
        best = float(y.max())
        a, b = LogExpectedImprovement(model, best), LogExpectedImprovement(ref, best)
        torch.testing.assert_close(a(Xq[:, :1]), b(Xq[:, :1]), rtol=1e-8, atol=1e-8)
        qa = qLogExpectedImprovement(model, best, sampler=SobolQMCNormalSampler(torch.Size([256]), seed=0))
        qb = qLogExpectedImprovement(ref, best, sampler=SobolQMCNormalSampler(torch.Size([256]), seed=0))
        torch.testing.assert_close(qa(Xq), qb(Xq), rtol=1e-8, atol=1e-8)


def test_fgpr_to_botorch_for_a_new_client_and_the_errors():
    data = federation(2)
    res = FGPR(rounds=5, batch_size=16).fit(data, seed=0, progress=False)
    rng = np.random.default_rng(3)
    Xn, yn = rng.uniform(size=(12, 2)), rng.normal(100, 5, 12)
    model = res.to_botorch(data=(Xn, yn))
    Xq = rng.uniform(size=(5, 2))
    with torch.no_grad():
        post = model.posterior(torch.as_tensor(Xq))
    pred = res.predict(Xq, data=(Xn, yn))
    np.testing.assert_allclose(post.mean.reshape(-1).numpy(), pred["mean"], rtol=1e-8)
    with pytest.raises(ValueError, match="give a fitted client"):
        res.to_botorch()
    with pytest.raises(Exception, match="unknown client"):
        res.to_botorch("nobody")


# the defaults, and the options of the MF-BO study (Matern-5/2, a noise floor for noise-free simulators)
AR1_OPTIONS = [{}, {"kernel": "matern", "nu": 2.5, "ard": True, "noise_floor": 1e-6}]


def fitted_ar1(**options):
    mf = fidelity_data("branin", seed=1, sizes={"LF": 40, "MF": 25, "HF": 12})
    order = ["LF", "MF", "HF"]
    cen = AR1CoKriging(restarts=1, **options).fit([mf.fidelity_data(lv) for lv in order], seed=3)
    fed = FederatedAR1(restarts=1, **options).fit(mf.train, order=order, seed=3)
    return mf, cen, fed


@pytest.mark.parametrize("options", AR1_OPTIONS)
def test_ar1_models_equal_predict_and_each_other_with_gradients_through_the_federated_chain(options):
    mf, cen, fed = fitted_ar1(**options)
    spec = cen.fidelities[-1].spec
    assert (spec.kernel, spec.nu, spec.ard, spec.noise_floor) == (
        options.get("kernel", "rbf"),
        options.get("nu", 1.5),
        options.get("ard", False),
        options.get("noise_floor", 1e-4),
    )
    m_cen, m_fed = cen.to_botorch(), fed.to_botorch()
    Xq = torch.as_tensor(mf.X_test[:12].reshape(3, 4, 2))
    with torch.no_grad():
        a, b = m_cen.posterior(Xq), m_fed.posterior(Xq)
    pred = cen.predict(Xq.reshape(-1, 2).numpy(), scale="original")
    np.testing.assert_allclose(a.mean.reshape(-1).numpy(), pred["mean"], rtol=1e-8)
    np.testing.assert_allclose(a.variance.reshape(-1).numpy(), pred["sd"] ** 2, rtol=1e-8)
    torch.testing.assert_close(b.mean, a.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(
        b.distribution.covariance_matrix, a.distribution.covariance_matrix, rtol=1e-10, atol=1e-10
    )
    # the joint covariance over a batch is a covariance: symmetric, positive definite
    S = a.distribution.covariance_matrix
    torch.testing.assert_close(S, S.mT)
    assert bool((torch.linalg.eigvalsh(S) > 0).all())
    # observation noise: the highest fidelity's, on its original scale
    with torch.no_grad():
        extra = m_cen.posterior(Xq, observation_noise=True).variance - a.variance
    top_sd = cen.fidelities[-1].sd
    torch.testing.assert_close(extra, torch.full_like(extra, top_sd**2 * float(cen.fidelities[-1].hyper["noise"][0])))
    # gradients of a Monte-Carlo acquisition with respect to the queries, through every fidelity
    best = float(np.max(mf.train["HF"].y))
    grads = []
    for model in (m_cen, m_fed):
        X = Xq.clone().requires_grad_(True)
        acq = qLogExpectedImprovement(model, best, sampler=SobolQMCNormalSampler(torch.Size([128]), seed=0))
        acq(X).sum().backward()
        grads.append(X.grad)
    assert float(grads[0].abs().max()) > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-8, atol=1e-10)


def test_federated_ar1_model_sends_query_sized_arrays_only():
    mf, _, fed = fitted_ar1()
    model = fed.to_botorch()
    before = {"bytes_down": fed.query_communication.bytes_down, "bytes_up": fed.query_communication.bytes_up}
    b, q, d, fidelities = 3, 4, 2, 3
    X = torch.as_tensor(mf.X_test[: b * q].reshape(b, q, d)).requires_grad_(True)
    post = model.posterior(X)
    fwd_down = fidelities * b * q * d * 8 + (fidelities - 1) * (b * q + b * q * q) * 8
    fwd_up = fidelities * (b * q + b * q * q) * 8
    assert fed.query_communication.bytes_down - before["bytes_down"] == fwd_down
    assert fed.query_communication.bytes_up - before["bytes_up"] == fwd_up
    post.mean.sum().backward()  # the gradients go down the chain and the queries' come up
    assert fed.query_communication.bytes_down - before["bytes_down"] == fwd_down + fidelities * (b * q + b * q * q) * 8
    # up: dX from every fidelity, and the lower answer's gradients from the fidelities above the lowest
    assert fed.query_communication.bytes_up - before["bytes_up"] == fwd_up + fwd_down
    assert X.grad is not None and bool(torch.isfinite(X.grad).all())


@pytest.mark.parametrize("which", ["fgpr", "ar1", "federated_ar1"])
def test_optimize_acqf_runs_on_each_model(which):
    torch.manual_seed(0)
    if which == "fgpr":
        data = federation(2)
        res = FGPR(rounds=10, batch_size=16, lr=0.05).fit(data, seed=0, progress=False)
        model, best = res.to_botorch(data.clients[0]), float(np.max(data[data.clients[0]].y))
    else:
        mf, cen, fed = fitted_ar1()
        model, best = (cen if which == "ar1" else fed).to_botorch(), float(np.max(mf.train["HF"].y))
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    for acq, q in (
        (LogExpectedImprovement(model, best), 1),
        (qLogExpectedImprovement(model, best, sampler=SobolQMCNormalSampler(torch.Size([64]), seed=0)), 2),
    ):
        # from 4 random starts: the gradient-based optimiser climbs above the best of them (it
        # would stop where it started if the gradients with respect to X did not flow)
        starts = torch.rand(4, q, 2, generator=torch.Generator().manual_seed(q), dtype=F64)
        cand, value = optimize_acqf(acq, bounds=bounds, q=q, num_restarts=4, batch_initial_conditions=starts)
        assert cand.shape == (q, 2) and bool(((cand >= 0) & (cand <= 1)).all())
        with torch.no_grad():
            assert float(value) > float(acq(starts).max()) + 1e-6


def test_ar1_models_take_batches_that_repeat_a_point_and_a_second_backward_pass():
    # a q-batch that repeats a point has a singular joint covariance: GPyTorch's jittered
    # factorisation handles it, as it does for a SingleTaskGP; so do candidates on the baseline
    from botorch.acquisition import qLogNoisyExpectedImprovement

    mf, cen, fed = fitted_ar1()
    best = float(np.max(mf.train["HF"].y))
    X = torch.as_tensor(mf.X_test[:3])
    Xrep = torch.stack([X[[0, 0, 1]], X[[1, 2, 2]]])  # 2 batches of q = 3, each with a repeat
    for model in (cen.to_botorch(), fed.to_botorch()):
        sampler = SobolQMCNormalSampler(torch.Size([64]), seed=0)
        with torch.no_grad():
            assert bool(torch.isfinite(qLogExpectedImprovement(model, best, sampler=sampler)(Xrep)).all())
            nei = qLogNoisyExpectedImprovement(model, X_baseline=X, sampler=sampler, prune_baseline=False)
            assert bool(torch.isfinite(nei(Xrep)).all())
    # the federated model differentiates the same posterior twice, as the centralised one does
    Xg = X[None].clone().requires_grad_(True)
    post = fed.to_botorch().posterior(Xg)
    post.mean.sum().backward(retain_graph=True)
    first = Xg.grad.clone()
    post.mean.sum().backward()
    torch.testing.assert_close(Xg.grad, 2 * first)
