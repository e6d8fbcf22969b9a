"""D-FedEM: equals FedEM with W = 11^T/C, gossip contracts disagreement like SLEM^G,
and every mixing matrix is a valid doubly stochastic matrix on the graph."""

import numpy as np
import pytest

from fedstats.datasets.synthetic import gmm_federation
from fedstats.mixture import (
    DecentralizedGaussianMixture,
    FederatedGaussianMixture,
    erdos_renyi_graph,
    fast_mixing_weights,
    metropolis_weights,
    ring_graph,
    slem,
)


@pytest.fixture(scope="module")
def fed():
    data, truth = gmm_federation(n_clients=12, d=3, min_separation=4.0, seed=0)
    return data, truth["means"] + 0.5, np.stack([np.eye(3)] * 3)


def _valid(W, A):
    assert np.allclose(W, W.T)
    assert np.allclose(W.sum(0), 1) and np.allclose(W.sum(1), 1)
    assert np.all(W >= -1e-15)
    off = ~np.eye(len(A), dtype=bool)
    assert not np.any((W[off] > 1e-15) & ~A[off])  # supported on the graph


@pytest.mark.parametrize("ct", ["full", "diag"])
def test_complete_graph_equals_fedem(fed, ct, server_steps):
    """The network mixes each node's statistics with its neighbours': they stay per client;
    the log-likelihood and entropy, only added up, are declared summed."""
    from fedstats.mixture.decentralized import DFedEMAlgorithm

    data, m0, c0 = fed
    c0 = c0 if ct == "full" else np.ones((3, 3))
    kw = dict(covariance_type=ct, rounds=25, means_init=m0, covariances_init=c0)
    f = FederatedGaussianMixture(3, tol=0, **kw).fit(data, seed=0)
    seen = server_steps(DFedEMAlgorithm)
    d = DecentralizedGaussianMixture(3, graph="complete", **kw).fit(data, seed=0)
    assert len(seen) == 25
    for _, _, _, per_client, sums in seen:
        assert len(per_client) == 12 and all(k == {"N", "S1", "S2"} for k in per_client)
        assert sums == {"loglik", "entropy"}
    np.testing.assert_allclose(d.mixing_matrix, np.full((12, 12), 1 / 12), atol=1e-15)
    for c in data.clients:
        np.testing.assert_allclose(d.client_means[c], f.means, atol=1e-10, rtol=0)
        np.testing.assert_allclose(d.client_covariances[c], f.covariances, atol=1e-10, rtol=0)
        np.testing.assert_allclose(d.weights[c], f.weights[c], atol=1e-10, rtol=0)
    assert d.disagreement()[-1] < 1e-10


def test_ring_gossip_contracts_geometrically(fed):
    data, m0, c0 = fed
    A = ring_graph(12)
    W = metropolis_weights(A)
    _valid(W, A)
    rho = slem(W)
    assert 0.8 < rho < 1
    dis, con = [], []
    for G in (1, 2, 4, 8, 16, 32):
        d = DecentralizedGaussianMixture(
            3, graph="ring", gossip_steps=G, rounds=10, means_init=m0, covariances_init=c0
        ).fit(data, seed=0)
        c = np.array([r.metrics["contraction"] for r in d.history])
        assert np.all(c <= rho**G * (1 + 1e-9))  # every round, the SLEM bound
        con.append(c.max())
        dis.append(d.disagreement()[-1])
    assert np.all(np.diff(dis) < 0)  # more gossip, more agreement between the nodes
    assert con[-1] < 0.05 * con[0]
    assert dis[-1] < 0.05 * dis[0]


def test_mixing_matrices():
    A = erdos_renyi_graph(15, 0.3, seed=2)
    Wm, Wf = metropolis_weights(A), fast_mixing_weights(A)
    _valid(Wm, A)
    _valid(Wf, A)
    assert slem(Wf) <= slem(Wm) + 1e-12
    assert slem(Wf) < slem(Wm) - 0.01  # the optimisation does something on this graph
    with pytest.raises(ValueError, match="not connected"):
        metropolis_weights(np.kron(np.eye(2), np.ones((3, 3))))
    with pytest.raises(ValueError, match="symmetric"):
        metropolis_weights(np.triu(np.ones((4, 4)), 1))


def test_fast_mixing_run_and_private_predictions(fed):
    data, m0, c0 = fed
    A = erdos_renyi_graph(12, 0.5, seed=1)
    d = DecentralizedGaussianMixture(
        3, graph=A, mixing="fast", gossip_steps=2, rounds=15, means_init=m0, covariances_init=c0
    ).fit(data, seed=0)
    f = FederatedGaussianMixture(3, rounds=15, tol=0, means_init=m0, covariances_init=c0).fit(data, seed=0)
    assert np.abs(d.means - f.means).max() < 0.05
    X = data[3].X
    # a client predicts with its own copy of the components
    own = d.score(X, 3)
    assert np.isfinite(own) and abs(own - f.score(X, 3)) < 0.05
    with pytest.raises(TypeError, match="participation"):
        DecentralizedGaussianMixture(3, participation=0.5)
    with pytest.raises(ValueError, match="12 x 12"):
        DecentralizedGaussianMixture(3, graph=np.ones((3, 3))).fit(data)


def test_weights_init_applies_and_a_bad_tol_is_refused(fed):
    data = fed[0]
    M = 3
    w0 = {c: np.roll([0.8, 0.1, 0.1], k) for k, c in enumerate(data.clients)}
    one = DecentralizedGaussianMixture(M, graph="ring", rounds=1, n_init=2, weights_init=w0).fit(data, seed=0)
    uni = DecentralizedGaussianMixture(M, graph="ring", rounds=1, n_init=2).fit(data, seed=0)
    assert any(not np.allclose(one.weights[c], uni.weights[c]) for c in data.clients)
    # tol is D-FedEM's convergence criterion since issue 40 (before, it had none and refused tol)
    with pytest.raises(ValueError, match="tol"):
        DecentralizedGaussianMixture(M, tol=-1.0).fit(data, seed=0)
    with pytest.raises(ValueError, match="weights_init"):
        DecentralizedGaussianMixture(M, rounds=1, n_init=2, weights_init=np.ones(M)).fit(data, seed=0)


def test_d_fedem_that_stops_unconverged_says_so():
    """D-FedEM runs every round; converged says whether the log-likelihood per point changed by
    less than tol in the last one, and a fit that did not warns, naming the change and tol."""
    import warnings

    from fedstats.mixture import DecentralizedGaussianMixture

    rng = np.random.default_rng(0)
    Xs = [np.r_[rng.normal(0, 1, (30, 2)), rng.normal(3, 1, (30, 2))] for _ in range(4)]
    with pytest.warns(RuntimeWarning, match=r"D-FedEM did not converge in 2 rounds: .*changed by .*tol=1e-10"):
        res = DecentralizedGaussianMixture(2, graph="ring", rounds=2, n_init=2, tol=1e-10).fit(Xs, seed=0)
    assert res.converged is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert DecentralizedGaussianMixture(2, graph="ring", rounds=200, n_init=2, tol=1e-3).fit(Xs, seed=0).converged
