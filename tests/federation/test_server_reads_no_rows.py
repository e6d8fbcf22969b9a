"""Every model can be fitted by a server that holds no rows, as in a real Flower deployment.

``NodeLocal`` plays a deployment in this process: the model's ``fit`` gets the server's view
of the data (:class:`RemoteFederatedData`: clients, row counts, column names; any read of a
row raises), and each client's side gets, as a deployed node does, the server's view with
that client's own rows put in (through the same pickling as on Flower). A fit that passes
here reads no row on the server; and it must equal the ordinary in-process fit.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedstats import FederatedData, HierarchicalLinearModel  # noqa: E402
from fedstats.datasets.synthetic import gmm_federation, hm2_federation  # noqa: E402
from fedstats.federation.client_side import InProcessClients  # noqa: E402
from fedstats.federation.flower import RemoteDataError, RemoteFederatedData, dumps, loads  # noqa: E402
from fedstats.glm import FederatedGLM  # noqa: E402
from fedstats.gp import FGPR  # noqa: E402
from fedstats.linear import BayesianRidge, StructuralCovarianceModel  # noqa: E402
from fedstats.linear.baselines import DistributedRidge, Ditto, FedAvg, Separate  # noqa: E402
from fedstats.mixture import DecentralizedGaussianMixture, FederatedGaussianMixture, VariationalGaussianMixture  # noqa: E402


class NodeLocal:
    """A backend whose clients are deployed nodes simulated in this process."""

    def __init__(self, real):
        self.real = real

    def client_side(self, algorithm, ids, data, seed):
        payload = dumps(data, remote=True)  # refuses a view with rows in it

        def node_data(c):
            return loads(payload, local=self.real.subset([c]))[c]

        return InProcessClients(algorithm, ids, node_data, seed)


def remote(data):
    return RemoteFederatedData(data.n_obs, data.feature_names, data.target_name)


def same(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=tol, atol=tol)


REG, _ = hm2_federation(n_clients=4, n_obs=25, seed=3)
REG_W = FederatedData.from_arrays(
    [np.column_stack([REG[c].X, np.arange(REG[c].n) % 3]) for c in REG.clients],
    [REG[c].y for c in REG.clients],
    clients=REG.clients,
)
MIX, _ = gmm_federation(n_clients=4, n_components=2, d=2, n_obs=(30, 50), seed=3)

CASES = [
    (
        "HM2 exact",
        lambda: HierarchicalLinearModel(tau=[1.0] * 4, sigma=0.05, fit_intercept=False, estimator="exact"),
        REG,
        lambda r: r.global_posterior().mean,
    ),
    (
        "HM2 importance",
        lambda: HierarchicalLinearModel(rounds=2, estimator_options={"num_draws": 200}),
        REG,
        lambda r: r.summary()["mean"],
    ),
    (
        "ridge",
        lambda: BayesianRidge(rounds=1, estimator_options={"num_draws": 200}),
        REG,
        lambda r: r.summary()["mean"],
    ),
    ("HM1", lambda: StructuralCovarianceModel(rounds=3), REG, lambda r: r.theta),
    ("Separate", lambda: Separate(rounds=3), REG, lambda r: r.theta),
    ("FedAvg", lambda: FedAvg(rounds=3), REG, lambda r: r.theta),
    ("Ditto", lambda: Ditto(rounds=3), REG, lambda r: r.theta),
    ("distributed ridge", lambda: DistributedRidge(), REG, lambda r: r.theta),
    ("FGPR", lambda: FGPR(rounds=2, local_steps=2), REG, lambda r: r.summary()["mean"]),
    # the offset and weights are columns the nodes take out of their own rows
    (
        "GLM",
        lambda: FederatedGLM("gaussian", offset="x3", weights="x4", cov_type="HC0"),
        REG_W,
        lambda r: np.r_[r.params, r.bse, r.llf],
    ),
    ("FedEM", lambda: FederatedGaussianMixture(2), MIX, lambda r: r.means),
    ("variational FedEM", lambda: VariationalGaussianMixture(2, rounds=10), MIX, lambda r: r.summary(0.9)["mean"]),
    ("D-FedEM", lambda: DecentralizedGaussianMixture(2, rounds=3), MIX, lambda r: r.means),
]


@pytest.mark.parametrize("name,make,data,param", CASES, ids=[c[0] for c in CASES])
def test_fit_reads_no_row_on_the_server(name, make, data, param):
    inproc = make().fit(data, seed=1)
    deployed = make().fit(remote(data), seed=1, backend=NodeLocal(data))
    same(param(inproc), param(deployed))


def test_wald_intervals_read_no_row_on_the_server():
    res = FederatedGaussianMixture(2).fit(MIX, seed=1)
    a = res.wald_intervals(MIX, 0.9)
    b = res.wald_intervals(remote(MIX), 0.9, backend=NodeLocal(MIX))
    for fa, fb in zip(a, b):
        same(fa.select_dtypes("number").to_numpy(), fb.select_dtypes("number").to_numpy())


def test_the_harness_catches_a_server_side_read():
    with pytest.raises(RemoteDataError, match="stay on its node"):
        np.asarray(remote(REG)[0].X).sum()
