"""The ServerApp: fedstats's own server loop, over the nodes that connect.

The server never sees a row: ``session.remote_data()`` is built from what each node reports
(its client name, row count and column names), and every computation on rows runs on the
nodes. The fitted result (shared parameters, and each client's final private state, which
the in-process simulator returns too) is saved to the run config's ``output``.

What it prints reaches the terminal of ``flwr run ... --stream`` (Flower mirrors the
ServerApp's stdout and stderr to the SuperLink, which streams them): the data it found, one
line per federated round (the fit's EM or EP rounds, and the one-off rounds of its start and
scoring) with the round's metrics and seconds, and where the result went.
"""

import time

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedstats import HierarchicalLinearModel
from fedstats.federation.flower import FlowerSession
from fedstats.glm import FederatedGLM
from fedstats.linear import StructuralCovarianceModel
from fedstats.mixture import FederatedGaussianMixture, VariationalGaussianMixture

app = ServerApp()

#: the models' own stopping rules and round budgets, used where the run config says -1
DEFAULTS = {
    "gmm": {"tol": 1e-6, "max-rounds": 100},
    "gmm-bayes": {"tol": 1e-6, "max-rounds": 100},
    "hm2": {"tol": 0.1, "max-rounds": 15},
    "hm2-exact": {"tol": 0.1, "max-rounds": 15},
    "glm": {"tol": 1e-8, "max-rounds": 25},
    "hm1": {"tol": 1e-4, "max-rounds": 50},
}


def settings(cfg) -> dict:
    """The run config's model, ``tol`` and ``max-rounds`` (-1: the model's default)."""
    model = str(cfg["model"])
    if model not in DEFAULTS:
        raise ValueError(f"unknown model {model!r} ({', '.join(DEFAULTS)})")
    tol, rounds = float(cfg["tol"]), int(cfg["max-rounds"])
    return {
        "model": model,
        "tol": DEFAULTS[model]["tol"] if tol < 0 else tol,
        "max-rounds": DEFAULTS[model]["max-rounds"] if rounds < 0 else rounds,
    }


def build(cfg):
    s = settings(cfg)
    if s["model"] in ("gmm", "gmm-bayes"):
        cls = VariationalGaussianMixture if s["model"] == "gmm-bayes" else FederatedGaussianMixture
        return cls(
            int(cfg["components"]), covariance_type=str(cfg["covariance-type"]), rounds=s["max-rounds"], tol=s["tol"]
        )
    if s["model"] == "glm":  # a Gaussian GLM (least squares with its standard errors) by federated IRLS
        return FederatedGLM("gaussian", rounds=s["max-rounds"], tol=s["tol"])
    if s["model"] == "hm1":  # per-client regressions that learn the covariance between clients
        return StructuralCovarianceModel(rounds=s["max-rounds"], tol=s["tol"])
    if s["model"] == "hm2-exact":  # known tau and sigma: EP's tilted moments are exact (no sampling)
        return HierarchicalLinearModel(
            rounds=s["max-rounds"], tol=s["tol"], tau=1.0, sigma=1.0, fit_intercept=False, estimator="exact"
        )
    return HierarchicalLinearModel(rounds=s["max-rounds"], tol=s["tol"])


def say(text: str) -> None:
    print(f"fedstats: {text}", flush=True)


def _number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class RoundReport:
    """One line per federated round of one run (the client side of ``fedstats.federation.run``).

    It wraps the run's client side (to know the round and time it) and the algorithm's
    ``converged`` hook, which the runner calls once per round with the round's metrics, right
    after the server step; the hook is restored when the run closes its client side.
    """

    def __init__(self, clients, algorithm, ids, started: float):
        self._clients, self._algorithm, self._ids, self._started = clients, algorithm, list(ids), started
        fn = getattr(algorithm, "client_fn", None)  # a one-off round (a start, a design check, a score)
        if fn is not None:
            self._label = fn.__name__.strip("_").replace("_", " ")
            self._name = f"one-off round ({self._label})"
        else:
            self._label = type(algorithm).__name__.removesuffix("Algorithm")
            self._name = self._label + " round {}"
        self._round, self._t0, self._previous, self._failed = None, time.perf_counter(), None, []
        self._hook, self._own = algorithm.converged, vars(algorithm).get("converged")
        algorithm.converged = self._converged  # after the client side has pickled the algorithm for the nodes

    def __getattr__(self, name):
        return getattr(self._clients, name)

    def run_round(self, rnd, idx, messages, batched):
        self._round, self._t0 = rnd, time.perf_counter()
        outcomes, fallback = self._clients.run_round(rnd, idx, messages, batched)
        self._failed = [self._ids[i] for i, out in zip(idx, outcomes) if getattr(out, "failed", None)]
        return outcomes, fallback

    def _converged(self, state, metrics):
        done = bool(self._hook(state, metrics))
        now = time.perf_counter()
        parts = []
        per_row = _number(metrics.get("mean_loglik"))
        if per_row is not None:  # FedEM: the log-likelihood, and its change per row since the last round
            parts.append(f"loglik {float(metrics['loglik']):.2f} ({per_row:.6f} per row")
            parts[-1] += ")" if self._previous is None else f", change {per_row - self._previous:+.2e})"
            self._previous = per_row
        else:
            for k, v in metrics.items():
                x = _number(v)
                if x is not None:
                    parts.append(f"{k} {x:.4g}")
        if self._failed:
            parts.append(f"failed: {', '.join(map(str, self._failed))}")
        parts.append(f"{now - self._t0:.1f} s (fit {now - self._started:.0f} s)")
        say(self._name.format(self._round + 1) + ": " + ", ".join(parts) + (", converged" if done else ""))
        return done

    def final_states(self, final=None):
        # one more exchange with the nodes at the end of every run (a deployed round trip)
        t0 = time.perf_counter()
        states = self._clients.final_states(final)
        now = time.perf_counter()
        say(f"{self._label}: final client states, {now - t0:.1f} s (fit {now - self._started:.0f} s)")
        return states

    def close(self):
        try:
            self._clients.close()
        finally:
            if self._own is None:  # the algorithm goes back as it was (results keep it, and pickle it)
                del self._algorithm.converged
            else:
                self._algorithm.converged = self._own


class ReportingSession(FlowerSession):
    """A deployment session that prints a line per federated round."""

    started = None

    def client_side(self, algorithm, ids, data, seed):
        clients = super().client_side(algorithm, ids, data, seed)
        return RoundReport(clients, algorithm, ids, self.started or time.perf_counter())


def record_received(grid: Grid, path: str) -> None:
    """Write every array the ServerApp receives (replies and SecAgg+'s masked vectors, each
    flattened: keys ``a0, a1, ...``) and every bytes value (the nodes' final states: ``b0, b1,
    ...``, as uint8) to ``path`` (an .npz), rewritten after every pull: what an
    honest-but-curious server holds, for an audit (the deployment tests compare it with the
    clients' values)."""
    import numpy as np
    from flwr.common import bytes_to_ndarray

    seen: list = []
    blobs: list = []
    pull = grid.pull_messages

    def pulling(ids):
        got = list(pull(ids))
        for m in got:
            if m.has_error():
                continue
            for rec in m.content.array_records.values():
                seen.extend(np.asarray(a.numpy(), float).ravel() for a in rec.values())
            for rec in m.content.config_records.values():
                for key, value in rec.items():
                    if key == "masked_params":
                        seen.extend(np.asarray(bytes_to_ndarray(b), float).ravel() for b in value)
                    else:
                        values = value if isinstance(value, list) else [value]
                        blobs.extend(np.frombuffer(b, np.uint8) for b in values if isinstance(b, bytes))
        if got:
            np.savez(path, **{f"a{i}": a for i, a in enumerate(seen)}, **{f"b{i}": b for i, b in enumerate(blobs)})
        return got

    grid.pull_messages = pulling


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    if str(cfg.get("record", "")):
        record_received(grid, str(cfg["record"]))
    s = settings(cfg)
    timeout = float(cfg["timeout"]) or None
    expected = str(cfg.get("clients", "")).strip()
    say(f"waiting for clients {expected}" if expected else f"waiting for {int(cfg['min-nodes'])} SuperNodes")
    session = ReportingSession.from_grid(
        grid,
        expected=expected or None,
        min_nodes=int(cfg["min-nodes"]),
        wait=float(cfg["wait"]),
        timeout=timeout,
        on_disconnect=str(cfg["on-disconnect"]),
        secure_aggregation=bool(cfg["secure-aggregation"]),
    )
    for node, why in session.refused.items():
        say(f"refused SuperNode {node}: {why}")
    data = session.remote_data()
    say(f"{data}; clients {dict(data.n_obs)}, features {list(data.feature_names)}")
    what = f"{cfg['components']} components" if s["model"].startswith("gmm") else f"target {data.target_name!r}"
    say(f"fitting {s['model']} ({what}), at most {s['max-rounds']} rounds, tol {s['tol']:g}")
    session.started = time.perf_counter()
    # progress=False: no tqdm bar (the ServerApp inherits the SuperLink's terminal, and Flower mirrors
    # its stderr to the stream); the session prints the round lines
    result = build(cfg).fit(data, seed=int(cfg["seed"]), backend=session, progress=False)
    result.save(str(cfg["output"]))
    converged = getattr(result, "converged", None)
    say(
        f"fitted in {len(result.history)} rounds ({'converged' if converged else 'not converged'}) and "
        f"{time.perf_counter() - session.started:.0f} s; saved to {cfg['output']}"
    )
