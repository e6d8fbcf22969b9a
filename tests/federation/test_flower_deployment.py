"""A real Flower deployment on 127.0.0.1: a SuperLink and two SuperNodes as subprocesses, the
example app of ``examples/flower_app`` launched with ``flwr run``, each node reading its own CSV.

Marked slow (a deployed round costs seconds: each SuperNode polls every 3 s and starts a fresh
ClientApp process per message); CI runs this file in a step of its own.
"""

from __future__ import annotations

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
from fedstats.linear.hierarchical import HierarchicalResult  # noqa: E402
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


def wait_for(path: Path, text: str, seconds: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise TimeoutError(
        f"{text!r} did not appear in {path.name} within {seconds} s:\n"
        + (path.read_text(errors="replace")[-3000:] if path.exists() else "(no file)")
    )


class Federation:
    """A SuperLink and SuperNodes on 127.0.0.1, each node with its own CSV."""

    def __init__(self, root: Path, n_nodes: int = 2, target: bool = False):
        sys.path.insert(0, str(APP))
        try:
            import make_data
        finally:
            sys.path.remove(str(APP))
        self.root = root
        self.target = target
        self.csvs = make_data.write(root / "data", clients=n_nodes, target=target, seed=3)
        home = root / "flwrhome"
        home.mkdir()
        self.port = free_port()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.env = dict(
            os.environ,
            FLWR_HOME=str(home),
            FLWR_TELEMETRY_ENABLED="0",
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        self.procs: dict[str, subprocess.Popen] = {}
        self._start(
            "link",
            [
                BIN / "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--port",
                str(self.port),
            ],
        )
        wait_for(root / "link.log", "Uvicorn running", 60)
        for i, csv in enumerate(self.csvs):
            self._start(
                f"node{i}",
                [
                    BIN / "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"data-path='{csv}' client='{csv.stem}'" + (" target='y'" if target else ""),
                ],
            )
            wait_for(root / f"node{i}.log", "SuperNode ID", 60)

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

    def flwr_run(self, overrides: str, background: bool = False):
        cmd = [str(BIN / "flwr"), "run", str(APP), "local", "--stream", "-c", overrides]
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


def test_deployed_hm2_equals_inprocess(tmp_path):
    fed = Federation(tmp_path, target=True)
    try:
        out = tmp_path / "result.fedstats"
        done = fed.flwr_run(f"output='{out}' model='hm2' max-rounds=3 seed=2")
        assert out.exists(), done.stdout[-4000:] + done.stderr[-2000:]
        deployed = HierarchicalResult.load(out)
        # each node runs its client alone: the in-process reference steps client by client
        local = HierarchicalLinearModel(rounds=3).fit(fed.pooled(), seed=2, batched=False)
    finally:
        fed.close()
    cols = ["mean", "sd", "lower", "upper"]
    np.testing.assert_allclose(
        deployed.summary()[cols].to_numpy(), local.summary()[cols].to_numpy(), rtol=1e-10, atol=1e-10
    )
    for c in ("site_a", "site_b"):
        np.testing.assert_allclose(
            deployed.client_posterior(c).mean, local.client_posterior(c).mean, rtol=1e-10, atol=1e-10
        )


def test_deployed_fedem_equals_inprocess(federation):
    out = federation.root / "result.fedstats"
    done = federation.flwr_run(f"output='{out}' max-rounds=4 seed=2")
    assert out.exists(), done.stdout[-4000:] + done.stderr[-2000:]
    deployed = GaussianMixtureResult.load(out)
    assert deployed.feature_names == ["x1", "x2"]  # not the site column
    # the ServerApp prints a line per round, which reaches the `flwr run --stream` terminal
    assert "fedstats: FedEM round 1: loglik" in done.stdout, done.stdout[-4000:]
    local = FederatedGaussianMixture(3, rounds=4).fit(federation.pooled(), seed=2)
    np.testing.assert_allclose(deployed.means_, local.means_, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(deployed.covariances_, local.covariances_, rtol=1e-10, atol=1e-10)
    assert sorted(deployed.weights_) == ["site_a", "site_b"]
    for c in deployed.weights_:
        np.testing.assert_allclose(deployed.weights_[c], local.weights_[c], rtol=1e-10, atol=1e-10)
    assert deployed.loglik_ == pytest.approx(local.loglik_, rel=1e-12)
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
        assert list(res.weights_) == ["site_a"]  # the lost client's weights stayed with it
        failed = [r.failed for r in res.history if r.failed]
        assert failed and all(list(f) == ["site_b"] for f in failed)
        assert "no reply within 20.0 s" in str(failed[0])
        assert all(np.isfinite(res.means_).ravel()) and res.rounds > len(failed)
