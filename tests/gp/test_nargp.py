"""NARGP (issue 23, item 3): beats AR1 where the fidelities are related nonlinearly, the federated
model equals the centralised one and sends no outputs, and the sampling propagation matches its
closed form where there is one."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.experiments.multifidelity_paper import mf_run
from fedstats.gp._core import HyperSpec, posterior
from fedstats.gp.chain_fit import ChainFit
from fedstats.gp.chain_result import Wire
from fedstats.gp.multifidelity import fidelity_data
from fedstats.gp.nargp import NARGP, FederatedNARGP, mixture
from fedstats.gp.nargp_result import NARGPFidelity


def test_nargp_is_at_least_3x_better_than_ar1_on_the_nonlinear_pair():
    # HF(x) = x exp(LF(2x - 0.2)) - 1 with LF(x) = cos(15 x): AR1's linear link cannot express it
    # (its RMSE is about 0.65 sd of HF); NARGP's GP on (x, LF's prediction) can (about 0.12)
    r = mf_run("nonlinear_1d", seed=0, methods=("AR1", "NARGP"))
    assert r["NARGP"] * 3 <= r["AR1"], r
    assert r["NARGP"] < 0.2, r


def test_federated_nargp_equals_centralised_and_sends_only_queries_and_moments(monkeypatch):
    mf = fidelity_data("branin", seed=1, sizes={"LF": 40, "MF": 25, "HF": 12})
    order = ["LF", "MF", "HF"]
    sent: list[np.ndarray] = []
    send = Wire.send
    monkeypatch.setattr(
        Wire, "send", lambda self, c, d, w, a, k: (sent.append(np.array(a, copy=True)), send(self, c, d, w, a, k))
    )
    # the fit's messages, both ways: every broadcast and every reply of the run
    broadcast, client_step = ChainFit.broadcast, ChainFit.client_step

    def spy_broadcast(self, *a):
        out = broadcast(self, *a)
        sent.extend(np.array(v, copy=True) for v in out.values())
        return out

    def spy_step(self, *a):
        reply, state = client_step(self, *a)
        sent.extend(np.array(v, copy=True) for v in reply.values())
        return reply, state

    monkeypatch.setattr(ChainFit, "broadcast", spy_broadcast)
    monkeypatch.setattr(ChainFit, "client_step", spy_step)
    cen = NARGP(restarts=1, samples=50).fit([mf.fidelity_data(lv) for lv in order], seed=3)
    fed = FederatedNARGP(restarts=1, samples=50).fit(mf.train, order=order, seed=3)
    for a, b in zip(cen.fidelities, fed.fidelities):
        for k in a.hyper:
            np.testing.assert_allclose(b.hyper[k], a.hyper[k], rtol=1e-10)
    Xs = mf.X_test[:100]
    p, q = cen.predict(Xs, scale="original"), fed.predict(Xs, scale="original")
    np.testing.assert_allclose(q["mean"], p["mean"], rtol=1e-8)
    np.testing.assert_allclose(q["sd"], p["sd"], rtol=1e-8)
    # a prediction of 100 points: the two lower fidelities get the queries, the middle one fidelity 1's
    # moments too (1 path), and each answers with its moments (1 path, then 50 paths); before
    # it, each fidelity rebuilt its GP from its rows and its release (the fit's chain again)
    q = fed.query_communication.by_kind
    assert set(q) == {"rebuild", "predict"}
    assert q["predict"]["bytes_up"] + q["predict"]["bytes_down"] == (2 * 100 * 2 + 2 * 100 + 2 * 100 + 2 * 50 * 100) * 8
    # what crossed in the queries: queries down, moments up and down
    assert {w for _, _, w, _ in fed.messages} == {"queries", "moments", "moments from below"}
    # the fit's release: each fidelity's hyperparameters (three lengthscales above LF), row count,
    # and its outputs' mean and sd; no row of any array, in the fit or the queries, is a
    # client's outputs
    outputs = [np.asarray(mf.train[c].y) for c in order]
    outputs += [(y - y.mean()) / y.std() for y in outputs]
    rows = [r for a in sent for r in np.atleast_2d(a)] + [a.reshape(-1) for a in sent]
    assert not any(len(r) == len(y) and np.allclose(r, y) for r in rows for y in outputs)


def test_the_paths_give_the_mixture_that_quadrature_gives():
    # two fidelities: the prediction at x is the mixture over f_1 ~ N(m_1(x), v_1(x)) of fidelity 2's
    # predictive normal at (x, f_1); Gauss-Hermite quadrature in f_1 is the deterministic oracle
    # of its mean and variance, which 4,000 paths match within Monte-Carlo error
    import torch

    X1 = np.linspace(0, 1, 30)[:, None]
    lo = NARGPFidelity(X1, np.sin(6 * X1[:, 0]), 0, HyperSpec(d=1, ard=True))
    lo.fit(None)
    X2 = np.linspace(0, 1, 12)[:, None]
    hi = NARGPFidelity(X2, np.exp(np.sin(6 * X2[:, 0])), 1, HyperSpec(d=2, ard=True))
    hi.fit(lo.answer(X2, None, 2, 0)[0][0])
    Xq = np.random.default_rng(0).uniform(size=(15, 1))
    m1, v1 = lo.answer(Xq, None, 4000, 0)
    assert m1.shape == v1.shape == (1, 15)
    M, V = hi.answer(Xq, (m1, v1), 4000, 0)
    assert M.shape == V.shape == (4000, 15)
    mean, var = mixture((M, V))
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    weights = weights / weights.sum()
    f = m1[0][None, :] + np.sqrt(v1[0])[None, :] * nodes[:, None]  # (40, 15)
    Z = np.column_stack([np.tile(Xq, (40, 1)), f.reshape(-1)])
    m, v = posterior(hi.spec, hi.hyper, hi.Z, hi.z, Z, device=torch.device("cpu"), dtype=torch.float64)
    m, v = m.reshape(40, 15), v.reshape(40, 15)
    q_mean = weights @ m
    q_var = weights @ v + weights @ (m - q_mean) ** 2
    se = np.sqrt(weights @ (m - q_mean) ** 2 / 4000)  # the mixture mean's Monte-Carlo error
    assert np.all(np.abs(mean - q_mean) < 5 * se), np.max(np.abs(mean - q_mean) / se)
    np.testing.assert_allclose(var, q_var, rtol=0.1)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="^NARGP: samples must be an int >= 2, got 1$"):
        NARGP(samples=1).fit([(np.zeros((3, 1)), np.arange(3.0))] * 2)
    with pytest.raises(ValueError, match="two fidelities"):
        NARGP().fit([(np.zeros((3, 1)), np.zeros(3))])
    mf = fidelity_data("nonlinear_1d", seed=0)
    with pytest.raises(ValueError, match="order"):
        FederatedNARGP().fit(mf.train, order=["HF"])
    na = NARGP(restarts=1, samples=10).fit([mf.fidelity_data("LF"), mf.fidelity_data("HF")])
    with pytest.raises(ValueError, match="column"):
        na.predict(np.zeros((3, 2)))


def test_a_points_prediction_does_not_depend_on_the_rest_of_its_batch():
    mf = fidelity_data("nonlinear_1d", seed=0)
    na = NARGP(restarts=3, samples=50).fit([mf.fidelity_data("LF"), mf.fidelity_data("HF")])
    whole = na.predict(mf.X_test[:40])
    part = na.predict(mf.X_test[:7])
    np.testing.assert_allclose(part["mean"], whole["mean"][:7], rtol=1e-12)
    np.testing.assert_allclose(part["sd"], whole["sd"][:7], rtol=1e-12)
