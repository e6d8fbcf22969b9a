"""A real Flower deployment on 127.0.0.1: a SuperLink and two SuperNodes as subprocesses, the
example app of ``examples/flower_app`` launched with ``flwr run``, each node reading its own CSV.

Marked slow (a deployed round costs seconds: each SuperNode polls every 3 s and starts a fresh
ClientApp process per message); CI runs this file in a step of its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr")

from fedstats import FederatedData, HierarchicalLinearModel  # noqa: E402
from fedstats.glm import FederatedGLM  # noqa: E402
from fedstats.linear import StructuralCovarianceModel  # noqa: E402
from fedstats.linear.hierarchical import HierarchicalResult  # noqa: E402
from fedstats.linear.hm1_result import StructuralResult  # noqa: E402
from fedstats.mixture import (
    FederatedGaussianMixture,  # noqa: E402
    GaussianMixtureResult,  # noqa: E402
)

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[2] / "examples" / "flower_app"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path: Path, text: str, seconds: float, after: int = 0) -> None:
    """Wait until ``text`` appears in the file ``path`` (beyond its first ``after`` characters)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if path.exists() and text in path.read_text(errors="replace")[after:]:
            return
        time.sleep(0.5)
    raise TimeoutError(
        f"{text!r} did not appear in {path.name} within {seconds} s:\n"
        + (path.read_text(errors="replace")[-3000:] if path.exists() else "(no file)")
    )


class Federation:
    """A secure federation on 127.0.0.1, as the README sets it up: a SuperLink with TLS and
    SuperNode authentication, and SuperNodes started with ``fedstats-supernode`` (each runs
    only the approved example app), each with its own registered key and its own CSV."""

    def __init__(self, root: Path, n_nodes: int = 2, target: bool = False, policy: Path | None = None):
        from fedstats.federation.flower.certificates import federation_keys

        sys.path.insert(0, str(APP))
        try:
            import make_data
        finally:
            sys.path.remove(str(APP))
        self.root = root
        self.target = target
        self.policy = policy
        self.csvs = make_data.write(root / "data", clients=n_nodes, target=target, seed=3)
        self.certs = root / "certs"
        federation_keys(self.certs, [p.stem for p in self.csvs])
        home = root / "flwrhome"
        home.mkdir()
        self.port = free_port()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{(self.certs / "ca.crt").as_posix()}"\n'
        )
        self.env = dict(
            os.environ,
            FLWR_HOME=str(home),
            FLWR_TELEMETRY_ENABLED="0",
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        self.procs: dict[str, subprocess.Popen] = {}
        self.node_ids: dict[str, int] = {}
        self._start(
            "link",
            [
                BIN / "flower-superlink",
                "--ssl-ca-certfile",
                self.certs / "ca.crt",
                "--ssl-certfile",
                self.certs / "server.pem",
                "--ssl-keyfile",
                self.certs / "server.key",
                "--enable-supernode-auth",
                "--disable-runtime-dependency-installation",
                "--port",
                str(self.port),
            ],
        )
        wait_for(root / "link.log", "Uvicorn running", 60)
        for i, csv in enumerate(self.csvs):
            self.register(csv.stem)
            self.start_node(f"node{i}", csv.stem, csv, approve=APP)

    def register(self, name: str) -> int:
        """Register the node key ``certs/name.pub`` (made if missing) with the SuperLink; its node id."""
        from fedstats.federation.flower.certificates import node_keys

        if not (self.certs / f"{name}.pub").exists():
            node_keys(self.certs, name)
        done = subprocess.run(
            [str(BIN / "flwr"), "supernode", "register", str(self.certs / f"{name}.pub"), "local", "--format", "json"],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.root,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        self.node_ids[name] = int(json.loads(done.stdout)["node-id"])
        return self.node_ids[name]

    def start_node(self, label: str, name: str, csv: Path, approve: Path | None = None, wait: bool = True) -> None:
        """A SuperNode through ``fedstats-supernode``: TLS, the key ``certs/name``, its own list
        of approved apps ``approved-<label>.txt`` (``approve``: add an app to it first)."""
        from fedstats.federation.flower.certificates import node_keys

        if not (self.certs / name).exists():
            node_keys(self.certs, name)
        self._start(
            label,
            [
                BIN / "fedstats-supernode",
                "--approved-apps",
                self.root / f"approved-{label}.txt",
                *(["--approve", approve] if approve else []),
                "--",
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--root-certificates",
                self.certs / "ca.crt",
                "--auth-supernode-private-key",
                self.certs / name,
                "--port",
                str(free_port()),
                "--node-config",
                f"data-path='{csv}' client='{name}'"
                + (" target='y'" if self.target else "")
                + (f" policy='{self.policy}'" if self.policy else ""),
            ],
        )
        if wait:
            wait_for(self.root / f"{label}.log", "SuperNode ID", 60)

    def _start(self, name, cmd):
        log = open(self.root / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(
            [str(c) for c in cmd],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.root,
            start_new_session=True,
        )

    def kill(self, name):
        p = self.procs.pop(name)
        os.killpg(p.pid, signal.SIGKILL)  # the node and the ClientApp processes it started
        p.wait()

    def expected(self) -> str:
        """The run config's ``clients``: every node's client with its registered node id."""
        return ",".join(f"{p.stem}={self.node_ids[p.stem]}" for p in self.csvs)

    def flwr_run(self, overrides: str, background: bool = False, app: Path = APP):
        if "clients=" not in overrides and app == APP:
            overrides += f" clients='{self.expected()}'"
        cmd = [str(BIN / "flwr"), "run", str(app), "local", "--stream", "-c", overrides]
        if background:
            log = open(self.root / "run.log", "w")
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root)
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=self.root, timeout=600)

    def pooled(self) -> FederatedData:
        # make_data's CSVs name their site in a column: the nodes take it as the client id, never a feature
        frame = pd.concat([pd.read_csv(p) for p in sorted(self.csvs)])
        assert sorted(frame["site"].unique()) == sorted(p.stem for p in self.csvs)
        return FederatedData.from_dataframe(frame, by="site", target="y" if self.target else None)

    def close(self):
        for name in list(self.procs):
            self.kill(name)


@pytest.fixture
def federation(tmp_path):
    fed = Federation(tmp_path)
    try:
        yield fed
    finally:
        fed.close()


def arrays_in(obj, out=None) -> list:
    """Every numpy array inside ``obj`` (dataclasses, dicts, lists)."""
    out = [] if out is None else out
    if isinstance(obj, np.ndarray):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            arrays_in(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            arrays_in(v, out)
    elif hasattr(obj, "__dict__"):
        arrays_in(vars(obj), out)
    return out


def test_deployed_hm2_equals_inprocess_and_its_client_posteriors_stay_on_the_nodes(tmp_path):
    """Issue 21: under the nodes' default policy the deployed server receives no client's
    ``X'X``, ``X'y`` or ``y'y`` (the record of every array and every pickled state it received),
    each node writes its client's posterior for its owner (equal to the in-process one to
    1e-10), and the server's result says where it stayed."""
    from fedstats.federation.flower import loads
    from fedstats.results import NoPosteriorError, load_result

    fed = Federation(tmp_path, target=True)
    try:
        out, record = tmp_path / "result.fedstats", tmp_path / "received.npz"
        done = fed.flwr_run(f"output='{out}' model='hm2' max-rounds=3 seed=2 record='{record}'")
        assert out.exists(), done.stdout[-4000:] + done.stderr[-2000:]
        deployed = HierarchicalResult.load(out)
        # each node runs its client alone: the in-process reference steps client by client
        local = HierarchicalLinearModel(rounds=3).fit(fed.pooled(), seed=2, batched=False)
        # HM1: coefficients go up, nothing at the end; its posteriors would need the nodes'
        # X'X / s^2 and X'y / s^2, which the default policy keeps: points only, with the rule named
        hm1_out, hm1_record = tmp_path / "hm1.fedstats", tmp_path / "hm1.npz"
        done = fed.flwr_run(f"output='{hm1_out}' model='hm1' max-rounds=4 tol=0.0 seed=2 record='{hm1_record}'")
        log = done.stdout + done.stderr
        assert hm1_out.exists() and "rule release_statistics" in log, log[-4000:]
        hm1 = StructuralResult.load(hm1_out)
        hm1_local = StructuralCovarianceModel(rounds=4, tol=0.0).fit(fed.pooled(), seed=2, uncertainty=False)
    finally:
        fed.close()
    cols = ["mean", "sd", "lower", "upper"]
    np.testing.assert_allclose(
        deployed.summary()[cols].to_numpy(), local.summary()[cols].to_numpy(), rtol=1e-10, atol=1e-10
    )
    received = np.load(record)
    states = [loads(received[k].tobytes(), ("fedstats",)) for k in received if k.startswith("b")]
    got = [np.asarray(a, float).ravel() for a in arrays_in(states)]
    got += [received[k] for k in received if k.startswith("a")]
    secrets = [
        np.ravel(v) for c in ("site_a", "site_b") for v in local.client_states[c].stats.values() if np.size(v) > 1
    ]
    assert states and secrets and arrays_in(local.client_states["site_a"])
    for a in got:
        assert not any(a.size == v.size and np.allclose(a, v, rtol=1e-9) for v in secrets), "a client's statistics"
    np.testing.assert_allclose(hm1.theta, hm1_local.theta, rtol=1e-10, atol=1e-10)
    design = StructuralCovarianceModel()._prepare(fed.pooled())[2]
    received = np.load(hm1_record)
    got = [received[k] for k in received if k.startswith("a")]
    got += [
        np.asarray(a, float).ravel()
        for k in received
        if k.startswith("b")
        for a in arrays_in(loads(received[k].tobytes(), ("fedstats",)))
    ]
    assert got
    for c in ("site_a", "site_b"):
        X, y = design[c]
        for v in (X.T @ X, X.T @ y):
            assert not any(a.size == v.size and np.allclose(a, v.ravel(), rtol=1e-9) for a in got), (
                "HM1 sent X'X or X'y"
            )
    for c in ("site_a", "site_b"):
        with pytest.raises(NoPosteriorError, match="stayed there"):
            deployed.client_posterior(c)
        kept = deployed.client_states[c].file
        on_node = load_result(tmp_path / "fedstats-posteriors" / kept).result.coefficients
        np.testing.assert_allclose(on_node.mean, local.client_posterior(c).mean, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(on_node.draws, local.client_posterior(c).draws, rtol=1e-10, atol=1e-10)


ROGUE_SERVER = """
import time
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    t0, nodes = time.time(), []
    while len(nodes) < 2 and time.time() - t0 < 60:
        nodes = list(grid.get_node_ids())
        time.sleep(1)
    asks = [Message(RecordDict({"q": ConfigRecord({"x": 1})}), dst_node_id=n, message_type="query") for n in nodes]
    for r in grid.send_and_receive(asks, timeout=120):
        if r.has_error():
            print("ROGUE ERROR", r.error.code, r.error.reason, flush=True)
        else:
            print("ROGUE ROWS", r.content["rows"]["csv"], flush=True)
"""

ROGUE_CLIENT = """
from pathlib import Path
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

Path({marker!r}).write_text("the rogue ClientApp ran on a node")
app = ClientApp()


@app.query()
def steal(msg: Message, context: Context) -> Message:
    rows = Path(str(context.node_config["data-path"])).read_text()
    return Message(RecordDict({{"rows": ConfigRecord({{"csv": rows}})}}), reply_to=msg)
"""

ROGUE_PROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedstats-app"
version = "0.1.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedstats"

[tool.flwr.app.components]
serverapp = "rogue.server_app:app"
clientapp = "rogue.client_app:app"

[tool.flwr.app.config]
x = 1
"""


def test_a_node_runs_only_approved_apps_registered_nodes_and_expected_clients(tmp_path):
    """Issue 41, the attacker's three ways in, on the secure setup (TLS, registered node keys,
    fedstats-supernode): (1) an app that is not the approved one (its ClientApp would read the
    node's CSV and return it) is refused by every node before any of its code runs, and no row
    reaches the server; (2) a SuperNode whose key nobody registered cannot connect; (3) a
    registered node whose client the run does not expect is refused by the ServerApp, and the
    GLM of the expected clients equals its in-process fit to 1e-10."""
    fed = Federation(tmp_path, target=True)
    try:
        rogue = tmp_path / "rogue_app"
        (rogue / "rogue").mkdir(parents=True)
        marker = tmp_path / "rogue-ran"
        (rogue / "pyproject.toml").write_text(ROGUE_PROJECT)
        (rogue / "rogue" / "__init__.py").write_text("")
        (rogue / "rogue" / "server_app.py").write_text(ROGUE_SERVER)
        (rogue / "rogue" / "client_app.py").write_text(ROGUE_CLIENT.format(marker=str(marker)))
        t0 = time.monotonic()
        done = fed.flwr_run("x=1", app=rogue)
        took = time.monotonic() - t0
        log = done.stdout + done.stderr
        assert log.count("ROGUE ERROR") == 2 and "ROGUE ROWS" not in log, log[-4000:]
        assert not marker.exists()  # no line of the app's code ran on a node
        first_row = fed.csvs[0].read_text().splitlines()[1]
        assert first_row not in log
        for i in range(2):
            assert "not on this node's list of approved apps" in (tmp_path / f"node{i}.log").read_text()
        print(f"unapproved app refused by both nodes in {took:.1f} s")

        # (2) an unregistered key: the SuperLink refuses it and the SuperNode exits
        fed.start_node("stranger", "site_stranger", fed.csvs[0], approve=APP, wait=False)
        code = fed.procs["stranger"].wait(timeout=120)
        text = (tmp_path / "stranger.log").read_text()
        assert code != 0 and "[code: 2004] Failed to activate SuperNode" in text, text[-3000:]
        assert "No SuperNode found with the given public key" in (tmp_path / "link.log").read_text()
        fed.procs.pop("stranger")

        # (3) a registered node the run does not expect
        extra = tmp_path / "data" / "site_extra.csv"
        frame = pd.read_csv(fed.csvs[0])
        frame.assign(site="site_extra", y=frame["y"] * 100).to_csv(extra, index=False)
        extra_id = fed.register("site_extra")
        fed.start_node("extra", "site_extra", extra, approve=APP)
        out = tmp_path / "glm.fedstats"
        done = fed.flwr_run(f"output='{out}' model='glm' seed=0")
        log = done.stdout + done.stderr
        assert out.exists(), log[-4000:]
        assert f"refused SuperNode {extra_id}: its client 'site_extra' is not one this run expects" in log, log[-4000:]
        deployed = type(FederatedGLM("gaussian").fit(fed.pooled())).load(out)
        local = FederatedGLM("gaussian").fit(fed.pooled())
        np.testing.assert_allclose(deployed.params, local.params, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(deployed.bse, local.bse, rtol=1e-10, atol=1e-10)
        # a node that claims an expected client under another registered key is refused too
        wrong = f"site_a={fed.node_ids['site_a']},site_b={extra_id}"
        done = fed.flwr_run(f"output='{tmp_path / 'no.fedstats'}' model='glm' wait=20.0 clients='{wrong}'")
        log = done.stdout + done.stderr
        assert "which was registered as node" in log and "did not connect" in log, log[-4000:]
    finally:
        fed.close()


def test_deployed_fedem_equals_inprocess(federation):
    out = federation.root / "result.fedstats"
    done = federation.flwr_run(f"output='{out}' max-rounds=4 seed=2")
    assert out.exists(), done.stdout[-4000:] + done.stderr[-2000:]
    deployed = GaussianMixtureResult.load(out)
    assert deployed.feature_names == ["x1", "x2"]  # not the site column
    # the ServerApp prints a line per round, which reaches the `flwr run --stream` terminal
    assert "fedstats: FedEM round 1: loglik" in done.stdout, done.stdout[-4000:]
    local = FederatedGaussianMixture(3, rounds=4).fit(federation.pooled(), seed=2)
    np.testing.assert_allclose(deployed.means, local.means, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(deployed.covariances, local.covariances, rtol=1e-10, atol=1e-10)
    assert sorted(deployed.weights) == ["site_a", "site_b"]
    for c in deployed.weights:
        np.testing.assert_allclose(deployed.weights[c], local.weights[c], rtol=1e-10, atol=1e-10)
    assert deployed.loglik == pytest.approx(local.loglik, rel=1e-12)
    assert deployed.communication.bytes_up == local.communication.bytes_up


@pytest.mark.parametrize("mode", ["raise", "continue"])
def test_a_node_that_disconnects_mid_run(federation, mode):
    out = federation.root / "result.fedstats"
    run = federation.flwr_run(
        f"output='{out}' max-rounds=10 tol=0.0 seed=1 timeout=20.0 on-disconnect='{mode}'", background=True
    )
    try:
        wait_for(federation.root / "node1.log", "ROUND 3]", 400)  # the EM rounds are under way
        federation.kill("node1")  # site_b's SuperNode dies mid-run
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    log = (federation.root / "run.log").read_text(errors="replace")
    if mode == "raise":
        assert not out.exists()
        assert "ClientDisconnected: client 'site_b'" in log and "stopped answering" in log, log[-4000:]
    else:
        assert out.exists(), log[-4000:]
        res = GaussianMixtureResult.load(out)
        assert list(res.weights) == ["site_a"]  # the lost client's weights stayed with it
        failed = [r.failed for r in res.history if r.failed]
        assert failed and all(list(f) == ["site_b"] for f in failed)
        assert "no reply within 20.0 s" in str(failed[0])
        assert all(np.isfinite(res.means).ravel()) and res.rounds > len(failed)


class ClientSums:
    """Each client's declared-sum arrays (and its openly sent arrays) in the in-process fits
    made inside ``with ClientSums() as sums:``."""

    def __enter__(self):
        from fedstats.federation import Replies

        self.sums, self.plain, self._summing = [], [], Replies.summing
        real = Replies.summing.__func__

        def spy(cls, keys, replies):
            for r in replies.values():
                self.sums += [np.asarray(r[k], float).ravel() for k in keys]
                self.plain += [np.asarray(v, float).ravel() for k, v in r.items() if k not in keys]
            return real(cls, keys, replies)

        Replies.summing = classmethod(spy)
        return self

    def __exit__(self, *exc):
        from fedstats.federation import Replies

        Replies.summing = self._summing

    def check_hidden(self, record: Path) -> None:
        """No array the deployed server received equals a client's declared sum (unless the
        client sends the same values openly)."""
        got = [v for k, v in np.load(record).items() if k.startswith("a")]
        assert got

        def same(a, v):
            return a.size == v.size and np.allclose(a, v, rtol=1e-9, atol=1e-12)

        secret = [v for v in self.sums if v.size and not any(same(v, w) for w in self.plain)]
        assert secret
        for a in got:
            assert not any(same(a, v) for v in secret), "the server received a client's summed array"


SECURE_RUNS = {
    # few rounds each: a deployed round under SecAgg+ is 5 round trips of seconds each
    "glm": (lambda: FederatedGLM("gaussian", rounds=3), {}),
    "hm2-exact": (
        lambda: HierarchicalLinearModel(rounds=1, tol=0.1, tau=1.0, sigma=1.0, fit_intercept=False, estimator="exact"),
        {},
    ),
    "hm2": (lambda: HierarchicalLinearModel(rounds=1, tol=0.1), {"batched": False}),
    "gmm": (lambda: FederatedGaussianMixture(3, rounds=2), {}),
}


def secure_fit_equals_inprocess(fed: Federation, model: str) -> None:
    """``model`` deployed with secure aggregation equals its in-process fit within 1e-6
    relative, and the server received no client's summed array."""
    make, kw = SECURE_RUNS[model]
    out, record = fed.root / f"{model}.fedstats", fed.root / f"{model}.npz"
    done = fed.flwr_run(
        f"output='{out}' model='{model}' max-rounds={make().rounds} seed=2 min-nodes=4 "
        f"secure-aggregation=true record='{record}'"
    )
    assert out.exists(), done.stdout[-4000:] + done.stderr[-2000:]
    with ClientSums() as sums:
        local = make().fit(fed.pooled(), seed=2, **kw)
    sums.check_hidden(record)
    deployed = type(local).load(out)
    if model == "glm":
        pairs = [(deployed.params, local.params), (deployed.bse, local.bse)]
    elif model == "gmm":
        pairs = [(deployed.means, local.means), (deployed.covariances, local.covariances)]
    else:
        pairs = [
            (deployed.global_posterior().mean, local.global_posterior().mean),
            (deployed.global_posterior().sd, local.global_posterior().sd),
        ]
    for a, b in pairs:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, err_msg=model)


def kill_mid_run(fed: Federation, node: str, overrides: str):
    """Start a FedEM run, kill ``node`` once it is in its third round; the run's log."""
    seen = len((fed.root / f"{node}.log").read_text(errors="replace"))
    run = fed.flwr_run(overrides, background=True)
    try:
        wait_for(fed.root / f"{node}.log", "ROUND 3]", 400, after=seen)
        fed.kill(node)
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    return (fed.root / "run.log").read_text(errors="replace")


def test_deployed_policy_secure_glm_and_a_node_lost(tmp_path):
    """Four SuperNodes, each with a policy file (read at every message). The policy: a run
    asking for an option outside the nodes' range, and one on clients under the minimum rows,
    are refused naming the rule. Secure aggregation: the GLM equals its in-process fit and the
    server received no client's summed array; a node killed mid-run under SecAgg+: FedEM goes on
    with the three others."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[options.FedEMAlgorithm]\nM = [1, 2]\n")
    fed = Federation(tmp_path, n_nodes=4, target=True, policy=policy)
    try:
        done = fed.flwr_run("output='x.fedstats' model='gmm' components=3 min-nodes=4 on-disconnect='raise'")
        log = done.stdout + done.stderr
        assert "rule options" in log and "FedEMAlgorithm.M = 3" in log, log[-4000:]
        assert any("refused by the node's policy" in (tmp_path / f"node{i}.log").read_text() for i in range(4))
        policy.write_text("min_rows = 100000\n")
        done = fed.flwr_run("output='x.fedstats' model='glm' min-nodes=4")
        log = done.stdout + done.stderr
        assert "rule min_rows" in log and "the node releases nothing from fewer than 100000" in log, log[-4000:]
        assert not (tmp_path / "x.fedstats").exists()
        policy.write_text("")  # the defaults
        secure_fit_equals_inprocess(fed, "glm")
        out = tmp_path / "lost.fedstats"
        # a generous timeout: the others must get through SecAgg+'s stages in time on a busy machine
        log = kill_mid_run(
            fed, "node3", f"output='{out}' max-rounds=5 tol=0.0 seed=1 timeout=60.0 min-nodes=4 secure-aggregation=true"
        )
        # wherever in the round it died (its step, SecAgg+'s key sharing, after its masked
        # vector), the round is summed over the other three (threshold 3 of 4)
        assert out.exists(), log[-4000:]
        res = GaussianMixtureResult.load(out)
        failed = [r.failed for r in res.history if r.failed]
        assert failed and all(list(f) == ["site_d"] for f in failed), failed
        assert all(np.isfinite(res.means).ravel()) and res.rounds > len(failed)
    finally:
        fed.close()


@pytest.mark.full_deployment
def test_deployed_secure_aggregation_every_model(tmp_path):
    """FedEM and HM2 (exact and importance-sampled EP) under SecAgg+ equal their in-process
    fits; then with three nodes, one killed mid-run: two nodes cannot hide each other's values,
    and the run stops with a clear error. ``make test-deployment-full`` (about 15 minutes)."""
    fed = Federation(tmp_path, n_nodes=4, target=True)
    try:
        for model in ("hm2-exact", "hm2", "gmm"):
            secure_fit_equals_inprocess(fed, model)
        fed.kill("node3")
        out = tmp_path / "two.fedstats"
        log = kill_mid_run(
            fed, "node2", f"output='{out}' max-rounds=5 tol=0.0 seed=1 timeout=60.0 min-nodes=3 secure-aggregation=true"
        )
        assert not out.exists()
        # (the node dies before or during a round's secure sum: either way no sum over 2 nodes)
        assert "SecureAggregationError" in log, log[-4000:]
        assert "at least 3 nodes in a round, this round has 2" in log or "halted" in log, log[-4000:]
    finally:
        fed.close()
