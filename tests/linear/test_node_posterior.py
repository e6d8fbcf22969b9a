"""Issue 21: an EP model's client posterior computed as a node computes it at the end of a run
on Flower (``LinearEP.final_message`` -> ``client_result``, from the client's final state
alone) equals the in-process result's, for HM2 (exact and sampled, with and without
standardisation) and the lasso; and a result whose clients' posteriors stayed on their nodes
says so. (The Flower runs themselves are in tests/federation.)"""

from __future__ import annotations

import numpy as np
import pytest

from fedstats import HierarchicalLinearModel
from fedstats.datasets.synthetic import hm2_federation
from fedstats.federation import ClientRelease
from fedstats.linear import BayesianLasso
from fedstats.linear.ep_model import LinearEP
from fedstats.results import NoPosteriorError

MODELS = {
    "hm2-exact": lambda: HierarchicalLinearModel(rounds=4, estimator="exact", sigma=0.5, tau=1.0),
    "hm2-raw-scale": lambda: HierarchicalLinearModel(rounds=2, standardize=False, estimator_options={"num_draws": 200}),
    "hm2": lambda: HierarchicalLinearModel(rounds=2, estimator_options={"num_draws": 200}),
    "lasso": lambda: BayesianLasso(rounds=2),
}


def as_on_nodes(res, release: bool):
    """``res`` with every client's final state replaced by what its node would send."""
    alg = res.algorithm
    assert isinstance(alg, LinearEP)
    states = {}
    for i, c in enumerate(res.clients):
        # a node gets the EP run's own seed (fedstats.streams.run_seed), kept as the result's run_seed
        post = alg.client_result(alg.final_message(res.server, c), res.client_states[c], None, i, res.run_seed)
        states[c] = ClientRelease(c, post if release else None, f"{c}.fedstats")
    fields = {k: v for k, v in vars(res).items() if k != "influence"}  # set by the fit after construction
    out = type(res)(**{**fields, "client_states": states, "_client_cache": {}, "_global_cache": {}})
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_a_node_computes_the_in_process_client_posterior(name):
    data, _ = hm2_federation(n_clients=3, n_obs=25, seed=11)
    res = MODELS[name]().fit(data, seed=5, progress=False)
    node = as_on_nodes(res, release=True)
    X = np.asarray(data[data.clients[0]].X)[:4]
    for c in res.clients:
        a, b = res.client_posterior(c), node.client_posterior(c)
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a.sd, b.sd, rtol=1e-10, atol=1e-12)
        na, nb = res.client_noise(c), node.client_noise(c)
        np.testing.assert_allclose(getattr(na, "mean", na), getattr(nb, "mean", nb), rtol=1e-10)
        np.testing.assert_allclose(res.predict(X, client=c).to_numpy(), node.predict(X, client=c).to_numpy(), rtol=1e-9)
    np.testing.assert_allclose(
        res.client_summary()[["mean", "sd"]].to_numpy(), node.client_summary()[["mean", "sd"]].to_numpy(), rtol=1e-10
    )
    diag = node.sampler_diagnostics()
    assert len(diag) == len(res.sampler_diagnostics()) == 2 * len(res.clients)
    # the population (a new client) needs no client's state
    np.testing.assert_allclose(res.predict(X).to_numpy(), node.predict(X).to_numpy(), rtol=1e-9)


def test_a_posterior_kept_on_its_node_is_a_clear_error():
    data, _ = hm2_federation(n_clients=3, n_obs=25, seed=11)
    res = MODELS["hm2-exact"]().fit(data, seed=5, progress=False)
    kept = as_on_nodes(res, release=False)
    c = res.clients[1]
    with pytest.raises(NoPosteriorError, match=rf"client {c!r}'s posterior .* stayed there .*'{c}.fedstats'"):
        kept.client_posterior(c)
    with pytest.raises(NoPosteriorError, match='release = "posterior"'):
        kept.predict(np.ones((1, 4)), client=c)
    np.testing.assert_allclose(kept.summary().to_numpy(float), res.summary().to_numpy(float))
    sampled = as_on_nodes(MODELS["hm2"]().fit(data, seed=5, progress=False), release=False)
    with pytest.raises(NoPosteriorError, match="a new client's noise sd mixes the fitted clients'"):
        sampled.predict(np.ones((1, 4)))
