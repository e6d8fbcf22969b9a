"""FGPR against independent oracles (spec fgpr.md §9): GPyTorch's ExactGP and
ExactMarginalLogLikelihood with torch.optim, closed-form numpy GP formulas, and
batched = looped; communication content, participation, bad input, the GPU path."""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch

from fedstats.data import DataError, FederatedData
from fedstats.data.disclosure import NO_RULES
from fedstats.federation import Replies
from fedstats.gp import FGPR, FGPRResult
from fedstats.gp._core import HyperSpec
from fedstats.gp.fgpr import FGPRAlgorithm, average_hypers, draw_participants
from fedstats.gp.fgpr_algorithm import PART, adam_update
from fedstats.results import UnknownClientError

LOG2 = math.log(2.0)


# --------------------------------------------------------------------------- oracles


class OracleGP(gpytorch.models.ExactGP):
    """A plain GPyTorch ExactGP with the constraints FGPR uses (softplus + floor)."""

    def __init__(self, X, y, kernel="rbf", ard=False, nu=1.5):
        lik = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-4))
        super().__init__(X, y, lik)
        lc = gpytorch.constraints.GreaterThan(1e-6)
        d = X.shape[-1] if ard else None
        base = (
            gpytorch.kernels.RBFKernel(ard_num_dims=d, lengthscale_constraint=lc)
            if kernel == "rbf"
            else gpytorch.kernels.MaternKernel(nu=nu, ard_num_dims=d, lengthscale_constraint=lc)
        )
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            base, outputscale_constraint=gpytorch.constraints.GreaterThan(1e-6)
        )
        self.double()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def set_values(self, ls, os_, noise):
        self.covar_module.base_kernel.lengthscale = torch.as_tensor(ls, dtype=torch.float64)
        self.covar_module.outputscale = torch.as_tensor(os_, dtype=torch.float64)
        self.likelihood.noise = torch.as_tensor(noise, dtype=torch.float64)

    def values(self):
        return {
            "lengthscale": self.covar_module.base_kernel.lengthscale.detach().numpy().ravel(),
            "outputscale": self.covar_module.outputscale.detach().numpy().ravel(),
            "noise": self.likelihood.noise.detach().numpy().ravel(),
        }


def oracle_loss(model):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with gpytorch.settings.max_cholesky_size(10**9):
        return -mll(model(*model.train_inputs), model.train_targets)  # per-point mean NLL


def rbf(A, B, ls, os_):
    d2 = ((A[:, None, :] - B[None, :, :]) / ls) ** 2
    return os_ * np.exp(-0.5 * d2.sum(-1))


def gp_draw(X, ls, os_, noise, rng):
    K = rbf(X, X, ls, os_) + 1e-10 * np.eye(len(X))
    f = np.linalg.cholesky(K) @ rng.standard_normal(len(X))
    return f, f + math.sqrt(noise) * rng.standard_normal(len(X))


def toy(K=3, n=(30, 30, 45), d=1, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.uniform(0, 1, (m, d)) for m in n[:K]]
    ys = [gp_draw(X, 0.3, 1.0, 0.05, rng)[1] for X in Xs]
    return FederatedData.from_arrays(Xs, ys, **NO_RULES)


def hyper_close(a, b, rtol):
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=0, err_msg=k)


# --------------------------------------------------------------------------- §9 (1)-(3)


def test_single_client_full_batch_sgd_equals_centralised_gradient_descent():
    data = toy(K=1, n=(40,))
    X, y = (torch.as_tensor(np.array(a)) for a in (data[0].X, data[0].y))
    R, E, lr = 6, 4, 0.05
    # the rounds alone (no Newton steps after them): their arithmetic is what is compared
    res = FGPR(rounds=R, local_steps=E, batch_size=1000, optimizer="sgd", lr=lr, standardize=False, newton_steps=0).fit(
        data
    )
    oracle = OracleGP(X, y)
    oracle.set_values(LOG2, LOG2, LOG2)
    opt = torch.optim.SGD(oracle.parameters(), lr=lr)
    for _ in range(R * E):
        opt.zero_grad()
        oracle_loss(oracle).backward()
        opt.step()
    hyper_close(res.hyperparameters, oracle.values(), 1e-10)


def test_single_client_fresh_adam_equals_centralised_adam_restarted_every_round():
    data = toy(K=1, n=(40,))
    X, y = (torch.as_tensor(np.array(a)) for a in (data[0].X, data[0].y))
    R, E, lr = 5, 3, 0.05
    res = FGPR(
        rounds=R, local_steps=E, batch_size=1000, optimizer="adam", lr=lr, standardize=False, newton_steps=0
    ).fit(data)
    oracle = OracleGP(X, y)
    oracle.set_values(LOG2, LOG2, LOG2)
    for _ in range(R):
        opt = torch.optim.Adam(oracle.parameters(), lr=lr)
        for _ in range(E):
            opt.zero_grad()
            oracle_loss(oracle).backward()
            opt.step()
    hyper_close(res.hyperparameters, oracle.values(), 1e-10)


def test_adam_update_is_torch_adam():
    rng = np.random.default_rng(1)
    p0 = torch.as_tensor(rng.standard_normal((1, 3)))
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Adam([p], lr=0.03)
    q, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    for t in range(1, 8):
        g = torch.as_tensor(rng.standard_normal((1, 3)))
        p.grad = g.clone()
        opt.step()
        q, m, v = adam_update(q, g, m, v, torch.tensor([t]), 0.03)
    np.testing.assert_allclose(q.numpy(), p.detach().numpy(), rtol=1e-14, atol=1e-15)
    # members at different step numbers (the general path) step as each would on its own
    p2, g2 = torch.as_tensor(rng.standard_normal((2, 3))), torch.as_tensor(rng.standard_normal((2, 3)))
    m2, v2 = torch.as_tensor(rng.random((2, 3))), torch.as_tensor(rng.random((2, 3)))
    both = adam_update(p2, g2, m2, v2, torch.tensor([3, 9]), 0.03)
    for i, t in enumerate((3, 9)):
        alone = adam_update(p2[i : i + 1], g2[i : i + 1], m2[i : i + 1], v2[i : i + 1], torch.tensor([t]), 0.03)
        for a, b in zip(both, alone):
            np.testing.assert_allclose(a[i : i + 1].numpy(), b.numpy(), rtol=1e-13, atol=1e-15)


def test_single_client_converges_to_exact_gp_maximum_likelihood():
    data = toy(K=1, n=(50,), seed=3)
    X, y = (torch.as_tensor(np.array(a)) for a in (data[0].X, data[0].y))
    res = FGPR(rounds=300, local_steps=10, batch_size=1000, optimizer="sgd", lr=0.5, standardize=False).fit(data)
    oracle = OracleGP(X, y)
    oracle.set_values(LOG2, LOG2, LOG2)
    opt = torch.optim.LBFGS(
        oracle.parameters(),
        lr=1,
        max_iter=500,
        tolerance_grad=1e-12,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = oracle_loss(oracle)
        loss.backward()
        return loss

    opt.step(closure)
    hyper_close(res.hyperparameters, oracle.values(), 1e-3)
    nll_fed = res.objective()
    nll_mle = float(oracle_loss(oracle).detach())
    assert abs(nll_fed - nll_mle) <= 1e-6 * abs(nll_mle)
    # ... and then predicts as GPyTorch's ExactGP with the same hyperparameters
    oracle.set_values(*(res.hyperparameters[k] for k in ("lengthscale", "outputscale", "noise")))
    oracle.eval()
    xs = torch.linspace(0, 1, 37, dtype=torch.float64)[:, None]
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**9), gpytorch.settings.fast_pred_var(False):
        f = oracle(xs)
        yv = oracle.likelihood(f)
    pred = res.predict(xs.numpy(), client=0)
    np.testing.assert_allclose(pred["mean"], f.mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(pred["sd"] ** 2, f.variance.numpy(), atol=1e-6)
    np.testing.assert_allclose(pred["pred_sd"] ** 2, yv.variance.numpy(), atol=1e-6)


def test_one_full_batch_round_is_a_gradient_step_on_the_weighted_objective():
    data = toy(K=3, n=(20, 35, 50), d=2)
    eta = 0.1
    res = FGPR(
        rounds=1,
        local_steps=1,
        batch_size=1000,
        optimizer="sgd",
        lr=eta,
        average_space="raw",
        standardize=False,
        newton_steps=0,  # the round alone
    ).fit(data)
    N = sum(data.n_obs.values())
    total = {}
    for c in data.clients:
        X, y = (torch.as_tensor(np.array(a)) for a in (data[c].X, data[c].y))
        oracle = OracleGP(X, y)
        oracle.set_values(LOG2, LOG2, LOG2)
        oracle.zero_grad()
        oracle_loss(oracle).backward()
        for n, p in oracle.named_parameters():
            total[n] = total.get(n, 0) + data.n_obs[c] / N * p.grad.clone()
    with torch.no_grad():
        for n, p in oracle.named_parameters():
            p.copy_(p - eta * total[n])  # raw parameters start at the same values on every client
    hyper_close(res.hyperparameters, oracle.values(), 1e-12)


# --------------------------------------------------------------------------- (14), (16)


def test_prediction_equals_closed_form_cholesky():
    data = toy(K=2, n=(25, 40), d=2, seed=5)
    hyper = {"lengthscale": np.array([0.4]), "outputscale": np.array([1.7]), "noise": np.array([0.03])}
    res = FGPRResult(
        spec=HyperSpec(d=2),
        hyperparameters=hyper,
        feature_names=data.feature_names,
        clients=data.clients,
        n_obs=data.n_obs,
        options={"standardize": False},
        data=data,
    )
    X, y = np.asarray(data[1].X), np.asarray(data[1].y)
    Xs = np.random.default_rng(0).uniform(0, 1, (50, 2))
    C = rbf(X, X, 0.4, 1.7) + 0.03 * np.eye(len(X))
    L = np.linalg.cholesky(C)
    Ks = rbf(X, Xs, 0.4, 1.7)
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y))
    V = np.linalg.solve(L, Ks)
    mean, var = Ks.T @ alpha, 1.7 - (V * V).sum(0)
    pred = res.predict(Xs, client=1)
    np.testing.assert_allclose(pred["mean"], mean, atol=1e-8)
    np.testing.assert_allclose(pred["sd"] ** 2, var, atol=1e-8)
    np.testing.assert_allclose(pred["pred_sd"] ** 2, var + 0.03, atol=1e-8)
    z = 1.959963984540054
    np.testing.assert_allclose(pred["upper"] - pred["mean"], z * np.sqrt(var), atol=1e-8)


@pytest.mark.parametrize(
    "opts",
    [
        dict(sampler="uniform", batch_size=16),
        dict(sampler="nearest", batch_size=16, local_steps="epoch"),
        dict(sampler="uniform", batch_size=16, optimizer_state="persistent", participation=3),
        dict(
            sampler="uniform",
            batch_size=16,
            optimizer="sgd",
            lr=0.05,
            lr_decay=10.0,
            kernel="matern",
            ard=True,
            mean="constant",
        ),
    ],
)
def test_batched_equals_looped(opts):
    data = toy(K=5, n=(16, 30, 30, 45, 12), d=2)
    model = FGPR(rounds=6, **{"local_steps": 3, "lr": 0.05, **opts})
    a, b = model.fit(data, seed=4), model.fit(data, seed=4, batched=False)
    hyper_close(a.hyperparameters, b.hyperparameters, 1e-10)
    assert not any(r.failed for r in a.history)


def test_uniform_batches_are_drawn_uniformly_without_replacement():
    # every local step's batch: M_k distinct rows of the client's own (in increasing order),
    # each row with probability M_k / N_k; all E steps of all clients drawn at once
    data = toy(K=2, n=(30, 45))
    alg = uniform_adam(HyperSpec(d=1), data, participants=None, seed=0, local_steps=4)
    states = [alg.init_client(c, data[c], None) for c in data.clients]
    views = alg._views(states, [data[c] for c in data.clients])
    rngs = [np.random.default_rng(k) for k in range(2)]
    hits = [np.zeros(s.n) for s in states]
    for _ in range(1000):
        idx = alg._draws(states, views, rngs, 4)
        assert idx.shape == (4, 2, 10)
        for g, s in enumerate(states):
            assert np.all(np.diff(idx[:, g], axis=-1) > 0) and idx[:, g].max() < s.n
            np.add.at(hits[g], idx[:, g].ravel(), 1)
    for h, s in zip(hits, states):
        expected = 4000 * 10 / s.n  # binomial sd below sqrt(expected): 5 sd at most
        assert np.max(np.abs(h - expected)) < 5 * np.sqrt(expected), (h, expected)


def test_many_clients_share_threads_with_the_same_result_as_one(monkeypatch):
    rng = np.random.default_rng(3)
    Xs = [rng.uniform(0, 1, (12, 1)) for _ in range(2 * PART)]
    data = FederatedData.from_arrays(Xs, [np.sin(6 * X[:, 0]) + 0.1 * rng.standard_normal(12) for X in Xs], **NO_RULES)
    sizes = []
    orig = FGPRAlgorithm._update
    monkeypatch.setattr(
        FGPRAlgorithm, "_update", lambda self, m, s, d, r: sizes.append(len(s)) or orig(self, m, s, d, r)
    )
    model = FGPR(rounds=3, batch_size=8)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        a = model.fit(data)
        torch.set_num_threads(1)
        b = model.fit(data)
    finally:
        torch.set_num_threads(threads)
    assert sizes == [PART, PART] * 3 + [2 * PART] * 3  # two parts on two threads, then one batch
    hyper_close(a.hyperparameters, b.hyperparameters, 0)


def test_clients_with_equal_batches_run_as_one_batched_gp(monkeypatch):
    data = toy(K=4, n=(30, 30, 30, 12), d=1)
    sizes = []
    orig = FGPRAlgorithm._update
    monkeypatch.setattr(
        FGPRAlgorithm, "_update", lambda self, m, s, d, r: sizes.append(len(s)) or orig(self, m, s, d, r)
    )
    FGPR(rounds=2, batch_size=16).fit(data)
    assert sorted(sizes) == [1, 1, 3, 3]  # three clients with M_k = 16, one with M_k = N_k = 12


# --------------------------------------------------------------------------- (4)-(6), (15)


def test_identical_clients_equal_a_single_client():
    one = toy(K=1, n=(40,))
    X, y = np.asarray(one[0].X), np.asarray(one[0].y)
    copies = FederatedData.from_arrays([X, X, X], [y, y, y], **NO_RULES)
    a = FGPR(rounds=5, batch_size=1000).fit(one)
    b = FGPR(rounds=5, batch_size=1000).fit(copies)
    hyper_close(a.hyperparameters, b.hyperparameters, 1e-12)


def test_permutation_invariance_with_full_batches():
    data = toy(K=3, n=(20, 30, 25))
    Xs = [np.asarray(data[c].X) for c in data.clients]
    ys = [np.asarray(data[c].y) for c in data.clients]
    perm = FederatedData.from_arrays([Xs[2], Xs[0], Xs[1]], [ys[2], ys[0], ys[1]], **NO_RULES)
    a = FGPR(rounds=4, batch_size=100).fit(data)
    b = FGPR(rounds=4, batch_size=100).fit(perm)
    hyper_close(a.hyperparameters, b.hyperparameters, 1e-12)


def test_partial_participation_draws_are_unbiased():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    theta = [
        {"lengthscale": np.array([v]), "outputscale": np.array([1.0]), "noise": np.array([0.1])}
        for v in (0.5, 1.0, 2.0, 4.0)
    ]
    spec = HyperSpec(d=1)
    est = []
    for r in range(10_000):
        mult = draw_participants(7, r, p, 3)
        assert mult.sum() == 3
        keep = mult > 0
        est.append(
            average_hypers(spec, [t for t, k in zip(theta, keep) if k], mult[keep], "constrained")["lengthscale"][0]
        )
    est = np.array(est)
    target = p @ np.array([0.5, 1.0, 2.0, 4.0])
    assert abs(est.mean() - target) < 3 * est.std() / math.sqrt(len(est))


def uniform_adam(spec, data, **options):
    """An FGPRAlgorithm with Adam, uniform batches of 10 and one local step (overridable)."""
    opts = dict(
        init=spec.default(),
        counts=data.n_obs,
        local_steps=1,
        batch_size=10,
        sampler="uniform",
        optimizer="adam",
        lr=0.01,
        lr_decay=None,
        betas=(0.9, 0.999),
        optimizer_state="fresh",
        loss_normalization="mean",
        average_space="constrained",
        standardize=True,
        device="cpu",
        dtype=torch.float64,
    )
    return FGPRAlgorithm(spec, **{**opts, **options})


def test_partial_participation_counts_duplicates():
    data = toy(K=4, n=(20, 20, 20, 20))
    res = FGPR(rounds=30, participation=2, batch_size=100).fit(data, seed=2)
    assert all(1 <= len(r.participants) <= 2 for r in res.history)
    alg = uniform_adam(HyperSpec(d=1), data, participants=2, seed=2)
    dup = [r for r in range(30) if alg.multiplicity(r).max() == 2]
    assert dup and all(len(res.history[r].participants) == 1 for r in dup)


def test_server_weights_duplicates_by_their_multiplicity():
    data = toy(K=4, n=(20, 20, 20, 20))
    spec = HyperSpec(d=1)
    alg = uniform_adam(spec, data, participants=3, seed=5)
    r = next(r for r in range(200) if sorted(alg.multiplicity(r)) == [0, 0, 1, 2])
    mult = alg.multiplicity(r)
    twice, once = int(np.argmax(mult)), int(np.flatnonzero(mult == 1)[0])
    hypers = {
        c: {"lengthscale": np.array([1.0 + c]), "outputscale": np.array([1.0]), "noise": np.array([0.1])}
        for c in (twice, once)
    }
    start = alg.init_server(data.clients, None)
    # each client weights its own hyperparameters by the multiplicity broadcast to it
    messages = {c: alg.broadcast(start, c, r) for c in (twice, once)}
    assert [float(messages[c]["weight"][0]) for c in (twice, once)] == [2.0, 1.0]
    replies = {c: alg.weighted_term(hypers[c], messages[c], 20) for c in (twice, once)}
    state, _ = alg.server_step(start, Replies.summing(alg.summed_keys, replies), r)
    assert state.hyper["lengthscale"][0] == pytest.approx((2 * (1.0 + twice) + (1.0 + once)) / 3, rel=1e-14)


class _PerClientReference(FGPRAlgorithm):
    """The averaging as it was before it was declared a sum: each client sends its constrained
    hyperparameters and the server takes the normalised weighted mean of them in the space."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.summed_keys = ()

    def weighted_term(self, hyper, message, n):
        return hyper

    def server_step(self, server_state, replies, round):
        old = server_state.hyper
        if not replies:
            return server_state, self._metrics(old, old)
        w = np.array([self._weight(server_state, c, round) for c in replies])
        w = w / w.sum()
        new = {}
        for n in self.spec.names:
            V = np.stack([r[n] for r in replies.values()])
            if n == "mean" or self.average_space == "constrained":
                new[n] = w @ V
            elif self.average_space == "log":
                new[n] = np.exp(w @ np.log(V))
            else:
                raw = self.spec.to_raw(n, torch.as_tensor(V, dtype=torch.float64)).numpy()
                new[n] = self.spec.from_raw(n, torch.as_tensor(w @ raw, dtype=torch.float64)).numpy()
        return type(server_state)(new, server_state.weights), self._metrics(old, new)


@pytest.mark.parametrize("space", ["constrained", "raw", "log"])
@pytest.mark.parametrize("participation", [1.0, 2])
def test_the_server_sees_only_sums_of_the_weighted_hyperparameters(monkeypatch, space, participation):
    """Each client sends ``w_k g(h_k)``, declared summed: the server step holds no client's
    hyperparameters, only their sum; the fit equals the per-client weighted average of before
    (to rounding), with N_k weights or the multiplicities of the draws."""
    from fedstats.gp import fgpr

    data = toy(K=4, n=(20, 30, 25, 41), d=2)
    model = FGPR(rounds=6, batch_size=16, average_space=space, participation=participation, ard=True, mean="constant")
    seen = []
    real = FGPRAlgorithm.server_step

    def spy(self, state, replies, round):
        seen.append(([set(r) for r in replies.values()], set(replies.sums)))
        return real(self, state, replies, round)

    monkeypatch.setattr(FGPRAlgorithm, "server_step", spy)
    res = model.fit(data, seed=3)
    monkeypatch.setattr(fgpr, "FGPRAlgorithm", _PerClientReference)
    ref = model.fit(data, seed=3)
    monkeypatch.undo()
    assert len(seen) == 6
    names = {"lengthscale", "outputscale", "noise", "mean"}
    for (per_client, sums), rec in zip(seen, res.history):
        assert per_client == [set()] * len(rec.answered) and sums == names
    hyper_close(res.hyperparameters, ref.hyperparameters, 1e-12)
    start = HyperSpec(d=2, ard=True, mean="constant").default()
    assert all(np.all(np.abs(res.hyperparameters[n] - start[n]) > 1e-3) for n in names)  # it learned


def test_a_count_of_every_client_is_full_participation():
    data = toy(K=3, n=(20, 30, 25))
    a = FGPR(rounds=3, participation=3).fit(data)
    b = FGPR(rounds=3).fit(data)
    hyper_close(a.hyperparameters, b.hyperparameters, 0)


def test_checkpoints_hold_no_client_data_and_resume_exactly(tmp_path):
    import io
    import zipfile

    from fedstats.federation.checkpoints import read_checkpoint

    data = toy(K=3, n=(20, 30, 25))
    model = FGPR(rounds=6, batch_size=16, optimizer_state="persistent")
    full = model.fit(data, seed=1)
    FGPR(rounds=3, batch_size=16, optimizer_state="persistent").fit(data, seed=1, checkpoint=tmp_path / "c.ckpt")
    # the checkpoint is a result file (JSON and arrays): every byte of its arrays, uncompressed
    with zipfile.ZipFile(tmp_path / "c.ckpt") as z, np.load(io.BytesIO(z.read("arrays.npz"))) as npz:
        blob = b"".join(npz[k].tobytes() for k in npz.files) + z.read("fedstats.json")
    for c in data.clients:  # no training row appears in the checkpoint
        assert np.asarray(data[c].X).tobytes()[:64] not in blob and np.asarray(data[c].y).tobytes()[:64] not in blob
    assert read_checkpoint(str(tmp_path / "c.ckpt"))["completed"] == 3  # readable
    resumed = model.fit(data, seed=1, checkpoint=tmp_path / "c.ckpt", resume=True)
    hyper_close(resumed.hyperparameters, full.hyperparameters, 0)


def test_rmse_on_the_standardised_scale_uses_the_clients_own_scale():
    rng = np.random.default_rng(4)
    X = rng.uniform(0, 1, (60, 1))
    y = 100 + 5 * np.sin(6 * X[:, 0])
    data = FederatedData.from_arrays([X[:40], X[:40]], [y[:40], y[:40] + 1], **NO_RULES)
    test = FederatedData.from_arrays([X[40:], X[40:]], [y[40:], y[40:] + 1], **NO_RULES)
    res = FGPR(rounds=20, lr=0.05).fit(data)
    orig, std = res.rmse(test), res.rmse(test, scale="standardized")
    np.testing.assert_allclose(std, orig / np.std(y[:40]), rtol=1e-10)


def test_only_hyperparameters_counts_and_curvature_cross_the_network():
    data = toy(K=3, n=(20, 25, 30), d=2)
    for ard, per in ((False, 3), (True, 4)):
        res = FGPR(rounds=4, ard=ard, batch_size=16, newton_steps=0).fit(data)  # one curvature exchange
        kinds = res.communication.by_kind
        assert kinds["row counts"]["bytes_up"] == 3 * 8  # N_k once
        assert kinds["FGPR rounds"]["bytes_up"] == kinds["FGPR rounds"]["bytes_down"] == 4 * 3 * per * 8
        # once after the rounds: the hyperparameters down, value + gradient + Hessian up
        assert kinds["hyperparameter curvature"]["bytes_down"] == 3 * per * 8
        assert kinds["hyperparameter curvature"]["bytes_up"] == 3 * (1 + per + per * per) * 8
        assert res.communication.bytes_up == 3 * 8 + 4 * 3 * per * 8 + 3 * (1 + per + per * per) * 8
        off = FGPR(rounds=4, ard=ard, batch_size=16, laplace=False).fit(data).communication
        assert "hyperparameter curvature" not in off.by_kind
        assert off.bytes_up == 3 * 8 + 4 * 3 * per * 8


# --------------------------------------------------------------------------- (9), (10)


def calibration_data(rng, K=10, n=100, ls=0.25, os_=1.0, noise=0.1):
    Xs, ys, Xt, ft, yt = [], [], [], [], []
    for _ in range(K):
        X = rng.uniform(0, 1, (2 * n, 1))
        f, y = gp_draw(X, ls, os_, noise, rng)
        Xs.append(X[:n])
        ys.append(y[:n])
        Xt.append(X[n:])
        ft.append(f[n:])
        yt.append(y[n:])
    return FederatedData.from_arrays(Xs, ys, **NO_RULES), Xt, ft, yt


def coverage(res, Xt, ft, yt, level):
    cy, cf = [], []
    for c, (X, f, y) in enumerate(zip(Xt, ft, yt)):
        p = res.predict(X, client=c, level=level)
        cy.append((y >= p["pred_lower"]) & (y <= p["pred_upper"]))
        cf.append((f >= p["lower"]) & (f <= p["upper"]))
    return np.concatenate(cy), np.concatenate(cf)


def test_intervals_are_calibrated_with_known_and_fitted_hyperparameters():
    rng = np.random.default_rng(11)
    truth = {"lengthscale": np.array([0.25]), "outputscale": np.array([1.0]), "noise": np.array([0.1])}
    known = {0.95: ([], []), 0.5: ([], [])}
    fitted = ([], [])
    for rep in range(10):  # 10 replicates x 10 clients x 100 held-out points = 10^4
        data, Xt, ft, yt = calibration_data(rng)
        res = FGPRResult(
            spec=HyperSpec(d=1),
            hyperparameters=truth,
            feature_names=data.feature_names,
            clients=data.clients,
            n_obs=data.n_obs,
            options={"standardize": False},
            data=data,
        )
        for level, (cy, cf) in known.items():
            y_, f_ = coverage(res, Xt, ft, yt, level)
            cy.append(y_)
            cf.append(f_)
        if rep < 4:
            fit = FGPR(rounds=40, lr=0.05, batch_size=64, standardize=False).fit(data, seed=rep)
            y_, f_ = coverage(fit, Xt, ft, yt, 0.95)
            fitted[0].append(y_)
            fitted[1].append(f_)
    cy95, cf95 = (np.concatenate(a).mean() for a in known[0.95])
    cy50, cf50 = (np.concatenate(a).mean() for a in known[0.5])
    assert 0.93 <= cy95 <= 0.97 and 0.93 <= cf95 <= 0.97, (cy95, cf95)
    assert 0.48 <= cy50 <= 0.52 and 0.48 <= cf50 <= 0.52, (cy50, cf50)
    fy, ff = (np.concatenate(a).mean() for a in fitted)
    assert 0.90 <= fy <= 0.98 and 0.90 <= ff <= 0.98, (fy, ff)


def test_sin_and_minus_sin_are_both_fitted_by_one_shared_prior():
    x = np.linspace(0.01, 10, 100)[:, None]
    data = FederatedData.from_arrays([x, x], [np.sin(x[:, 0]), -np.sin(x[:, 0])], **NO_RULES)
    res = FGPR(rounds=60, lr=0.1, batch_size=20, local_steps=5).fit(data)
    grid = np.linspace(0.01, 10, 1000)[:, None]
    rmse = [
        np.sqrt(np.mean((res.predict(grid, client=c)["mean"] - s * np.sin(grid[:, 0])) ** 2))
        for c, s in ((0, 1), (1, -1))
    ]
    assert max(rmse) < 0.05, rmse
    # one global regressor (the average of the two targets, what FedAvg's least squares reaches) fits neither
    assert np.sqrt(np.mean(np.sin(grid[:, 0]) ** 2)) > 0.65


def test_new_client_predicts_from_its_own_data_without_training():
    x = np.linspace(0, 10, 80)[:, None]
    data = FederatedData.from_arrays([x, x], [np.sin(x[:, 0]), np.cos(x[:, 0])], **NO_RULES)
    res = FGPR(rounds=30, lr=0.1, batch_size=20).fit(data)
    xn = np.linspace(0, 10, 40)[:, None]
    pred = res.predict(np.array([[3.3]]), data=(xn, 2 * np.sin(xn[:, 0]) + 5))
    assert abs(pred["mean"][0] - (2 * np.sin(3.3) + 5)) < 0.05
    with pytest.raises(UnknownClientError, match="unknown client 'new'.*data=\\(X, y\\)"):
        res.predict(xn, client="new")


# --------------------------------------------------------------------------- bad input, options


def test_malformed_client_rejected_before_training(monkeypatch):
    calls = []
    monkeypatch.setattr(FGPRAlgorithm, "_update", lambda *a: calls.append(1))
    rng = np.random.default_rng(0)
    Xs = [rng.uniform(size=(10, 2)) for _ in range(3)]
    ys = [rng.standard_normal(10) for _ in range(3)]
    # NaN and a wrong number of columns: refused when the federation is built
    bad_y = [y.copy() for y in ys]
    bad_y[1][4] = np.nan
    with pytest.raises(DataError, match="NaN"):
        FederatedData.from_arrays(Xs, bad_y, **NO_RULES)
    with pytest.raises(DataError, match="columns"):
        FederatedData.from_arrays(Xs[:2] + [rng.uniform(size=(10, 3))], ys, **NO_RULES)
    # a single point: refused by FGPR.fit before any local step
    data = FederatedData.from_arrays([Xs[0], Xs[1][:1], Xs[2]], [ys[0], ys[1][:1], ys[2]], **NO_RULES)
    with pytest.raises(DataError, match="client 1 has 1 point"):
        FGPR(rounds=2).fit(data)
    assert not calls


@pytest.mark.parametrize(
    "opts, match",
    [
        (dict(kernel="linear"), "kernel"),
        (dict(nu=1.0, kernel="matern"), "nu"),
        (dict(rounds=0), "rounds"),
        (dict(local_steps=0), "local_steps"),
        (dict(sampler="grid"), "sampler"),
        (dict(lr=-1), "lr"),
        (dict(lr_decay=5.0), "sgd"),
        (dict(participation=1.5), "participation"),
        (dict(participation=0), "participation must be an int >= 1 or a number > 0"),
        (dict(init={"lengthscale": 1.0}), "init"),
        (dict(init={"lengthscale": 1, "outputscale": 1, "noise": 1e-5}), "floor"),
        (dict(device="tpu"), "device"),
        (dict(batch_size=1), "batch_size"),
        (dict(betas=0.9), "betas"),
        (dict(dtype="float16"), "dtype"),
        (dict(average_space="median"), "average_space"),
    ],
)
def test_bad_options_are_refused(opts, match):
    with pytest.raises((ValueError, RuntimeError), match=match):
        FGPR(**opts).fit(toy(K=2, n=(10, 10)))


def test_save_load_keeps_hyperparameters_but_no_data(tmp_path):
    data = toy(K=2, n=(20, 20))
    res = FGPR(rounds=3).fit(data)
    res.save(tmp_path / "m.fedstats")
    back = FGPRResult.load(tmp_path / "m.fedstats")
    hyper_close(back.hyperparameters, res.hyperparameters, 0)
    assert len(back.history) == 3
    with pytest.raises(ValueError, match="no client data"):
        back.predict(np.zeros((1, 1)), client=0)
    X, y = np.asarray(data[0].X), np.asarray(data[0].y)
    np.testing.assert_allclose(back.predict(X[:5], data=(X, y))["mean"], res.predict(X[:5], client=0)["mean"])


def test_float32_runs_and_stays_close_to_float64():
    data = toy(K=2, n=(30, 30))
    a = FGPR(rounds=5, dtype="float64").fit(data)
    b = FGPR(rounds=5, dtype="float32").fit(data)
    hyper_close(a.hyperparameters, b.hyperparameters, 1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_run_matches_cpu():
    data = toy(K=4, n=(30, 30, 45, 60), d=2)
    a = FGPR(rounds=5, batch_size=16, device="cpu").fit(data)
    b = FGPR(rounds=5, batch_size=16, device="cuda").fit(data)
    hyper_close(a.hyperparameters, b.hyperparameters, 1e-8)
    X = np.asarray(data[1].X)
    np.testing.assert_allclose(a.predict(X, client=1)["mean"], b.predict(X, client=1)["mean"], atol=1e-8)


def test_large_clients_condition_on_a_subset_with_a_warning():
    data = toy(K=2, n=(300, 40), d=1)
    res = FGPR(rounds=3, condition_limit=100).fit(data)
    xs = np.linspace(0, 1, 50)[:, None]
    with pytest.warns(UserWarning, match="random subset of 100"):
        sub = res.predict(xs, client=0)
    exact = FGPR(rounds=3, condition_limit=None).fit(data).predict(xs, client=0)
    assert np.max(np.abs(sub["mean"] - exact["mean"])) < 0.3  # a smooth GP: 100 of 300 points carry it
    assert np.all(sub["sd"] >= exact["sd"] - 1e-9)  # fewer points, no smaller uncertainty


def test_a_failing_client_is_left_out_of_that_rounds_average(monkeypatch):
    data = toy(K=3, n=(30, 30, 30))
    orig = FGPRAlgorithm._update
    bad_x = np.asarray(data[1].X)[0, 0]

    def flaky(self, messages, states, datas, rngs):
        if any(np.asarray(d.X)[0, 0] == bad_x for d in datas):
            raise RuntimeError("disk on fire")
        return orig(self, messages, states, datas, rngs)

    monkeypatch.setattr(FGPRAlgorithm, "_update", flaky)
    with pytest.warns(RuntimeWarning, match="1 client"):
        res = FGPR(rounds=3, batch_size=100).fit(data)  # full batches: no draws, so comparable below
    assert all(r.answered == [0, 2] and list(r.failed) == [1] for r in res.history)
    ref = FGPR(rounds=3, batch_size=100).fit(
        FederatedData.from_arrays(
            [np.asarray(data[c].X) for c in (0, 2)], [np.asarray(data[c].y) for c in (0, 2)], clients=[0, 2], **NO_RULES
        )
    )
    hyper_close(res.hyperparameters, ref.hyperparameters, 1e-12)


def test_docstring_example():
    x = np.linspace(0, 10, 60)[:, None]
    data = FederatedData.from_arrays([x, x], [np.sin(x[:, 0]), -np.sin(x[:, 0])], **NO_RULES)
    res = FGPR(rounds=30, lr=0.1, batch_size=20).fit(data)
    assert abs(res.predict(np.array([[2.5]]), client=1)["mean"][0] + np.sin(2.5)) < 0.05


def test_algorithm_pickles_without_its_caches_of_client_data():
    # the batched rounds cache each client's data views, stacked tensors and local steps'
    # buffers in the algorithm object; a pickled copy (a checkpoint, a process boundary) must
    # carry none of them
    import pickle

    data = toy(K=3, n=(20, 20, 20))
    spec = HyperSpec(d=1)
    alg = uniform_adam(spec, data, participants=None, seed=1, local_steps=2, optimizer_state="persistent")
    rng = np.random.default_rng(0)
    clients = list(data.clients)
    states = [alg.init_client(c, data[c], rng) for c in clients]
    msgs = [alg.broadcast(alg.init_server(clients, rng), c, 0) for c in clients]
    first = alg.client_steps(msgs, states, [data[c] for c in clients], [np.random.default_rng(k) for k in range(3)])
    assert all(not isinstance(o, BaseException) for o in first)
    assert alg.__dict__.get("_view_cache") and alg.__dict__.get("_stack_cache")
    copy = pickle.loads(pickle.dumps(alg))
    assert not {"_view_cache", "_stack_cache"} & set(copy.__dict__)
    # the copy rebuilds what it needs: the same round gives the same replies
    again = copy.client_steps(msgs, states, [data[c] for c in clients], [np.random.default_rng(k) for k in range(3)])
    for (a, _), (b, _) in zip(first, again):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-12)


@pytest.mark.parametrize(
    "spec",
    [HyperSpec(d=2), HyperSpec(d=3, ard=True, mean="constant")]
    + [
        HyperSpec(d=3, kernel="matern", nu=nu, ard=ard, mean="constant")
        for nu in (0.5, 1.5, 2.5)
        for ard in (False, True)
    ],
    ids=["rbf", "rbf-ard"] + [f"matern{nu}{'-ard' if ard else ''}" for nu in (0.5, 1.5, 2.5) for ard in (False, True)],
)
def test_batched_nll_and_its_written_out_gradients_equal_autodiff_through_cholesky(spec):
    # BatchGP.nll's backward is the closed form dL/dK = (K^-1 - a a^T) / 2, and nll_grad (the local
    # steps') the whole gradient with respect to the raw hyperparameters written out, without an
    # autograd graph, its buffers reused from one call to the next; the oracle is autodiff through
    # torch's Cholesky factorisation of the dense K = s B + v I on GPyTorch's kernel. Equal to
    # rounding, except that GPyTorch's ARD Matern kernel leaves distances of about 1e-8 (roots of
    # rounding errors) on its diagonal (nll_grad: 0), whose derivative is large for nu = 0.5:
    # there the gradients agree to 1e-7 of their largest component (and nll_grad's value to 1e-9)
    from fedstats.gp._core import BatchGP
    from fedstats.gp._local import nll_grad

    G, M = 3, 30
    gen = torch.Generator().manual_seed(0)
    loose = spec.kernel == "matern" and spec.nu == 0.5 and spec.ard
    work: dict = {}
    for _ in range(2):
        X = torch.rand(G, M, spec.d, generator=gen, dtype=torch.float64)
        y = torch.sin(4 * X.sum(-1)) + 0.1 * torch.randn(G, M, generator=gen, dtype=torch.float64)
        model = BatchGP(spec, G, "cpu", torch.float64)
        with torch.no_grad():
            for p in model.leaves().values():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        leaves = list(model.leaves().values())
        got = model.nll(X, y)
        g_got = torch.autograd.grad(got.sum(), leaves)
        K = model.covariance(X) + model.spec.from_raw("noise", model.raw_noise)[:, None, None] * torch.eye(M)
        r = y if model.raw_mean is None else y - model.raw_mean[:, None]
        L = torch.linalg.cholesky(K)
        ref = (
            0.5 * (r * torch.cholesky_solve(r[..., None], L)[..., 0]).sum(-1)
            + torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
            + 0.5 * M * math.log(2 * math.pi)
        )
        g_ref = torch.cat([g.reshape(G, -1) for g in torch.autograd.grad(ref.sum(), leaves)], dim=1)
        atol = (1e-7 if loose else 1e-12) * g_ref.abs().max().item()
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.cat([g.reshape(G, -1) for g in g_got], dim=1), g_ref, rtol=1e-10, atol=atol)
        value, grad = nll_grad(spec, torch.cat([p.detach().reshape(G, -1) for p in leaves], dim=1), X, y, work)
        torch.testing.assert_close(value, ref.detach(), rtol=1e-8, atol=0)
        torch.testing.assert_close(grad, g_ref, rtol=1e-8, atol=atol)
