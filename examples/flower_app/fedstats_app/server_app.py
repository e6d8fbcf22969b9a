"""The ServerApp: fedstats's own server loop, over the nodes that connect.

The server never sees a row: ``session.remote_data()`` is built from what each node reports
(its client name, row count and column names), and every computation on rows runs on the
nodes. The fitted result (shared parameters, and each client's final private state, which
the in-process simulator returns too) is saved to the run config's ``output``.
"""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedstats import HierarchicalLinearModel
from fedstats.federation.flower import FlowerSession
from fedstats.mixture import FederatedGaussianMixture

app = ServerApp()


def build(cfg):
    model = str(cfg["model"])
    if model in ("gmm", "gmm-bayes"):
        return FederatedGaussianMixture(int(cfg["components"]), covariance_type=str(cfg["covariance-type"]),
                                        max_rounds=int(cfg["max-rounds"]), tol=float(cfg["tol"]),
                                        bayesian=model == "gmm-bayes")
    if model == "hm2":
        return HierarchicalLinearModel(rounds=int(cfg["max-rounds"]), tol=float(cfg["tol"]))
    raise ValueError(f"unknown model {model!r} (gmm, gmm-bayes, hm2)")


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    timeout = float(cfg["timeout"]) or None
    session = FlowerSession.from_grid(grid, min_nodes=int(cfg["min-nodes"]), wait=float(cfg["wait"]),
                                      timeout=timeout, on_disconnect=str(cfg["on-disconnect"]))
    data = session.remote_data()
    print(f"fedstats: {data}")
    result = build(cfg).fit(data, seed=int(cfg["seed"]), backend=session)
    result.save(str(cfg["output"]))
    print(f"fedstats: fitted in {len(result.history)} rounds; saved to {cfg['output']}")
