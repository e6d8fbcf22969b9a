"""The server side of fedstats on Flower: :class:`FlowerSession`, a simulation it starts (Flower's
simulation engine in a background thread, one SuperNode per client) or a deployment's ``Grid``."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from ...data import DataError
from ..policy import NodePolicy, policy_of
from ..protocol import ClientDisconnected, ClientId, FederatedAlgorithm
from .clients import FlowerClients
from .node import make_client_app
from .remote import RemoteFederatedData
from .secure import SecureAggregation
from .wire import HELLO


def _expected(value: Mapping[str, int | None] | Sequence[str] | str | None) -> dict[str, int | None] | None:
    """``expected`` of :meth:`FlowerSession.from_grid` as ``{name: node id or None}``; also
    the run config's form ``"site_a=5821,site_b"`` (empty: none declared)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
        if not value:
            return None
    out: dict[str, int | None] = {}
    items = value.items() if isinstance(value, Mapping) else [(v.split("=", 1) + [None])[:2] for v in value]
    for name, node in items:
        name = str(name).strip()
        if not name:
            raise ValueError("an expected client needs a name")
        if name in out:
            raise ValueError(f"client {name!r} is expected twice")
        try:
            out[name] = None if node in (None, "") else int(node)
        except (TypeError, ValueError):
            raise ValueError(f"client {name!r}: node id {node!r} is not an integer") from None
    if not out:
        raise ValueError("expected names no client")
    return out


class FlowerSession:
    """Flower as the client side of fedstats runs: a simulation, or a deployment's grid.

    Parameters
    ----------
    num_supernodes : int, optional
        Simulation only: the number of SuperNodes (one per client). Default: the number of
        clients of the first run. Runs with more clients than nodes are refused.
    timeout : float, optional
        Seconds to wait for the replies of a round; a node that has not answered by then is
        lost. ``None`` (default): wait for every reply (a deployment's SuperLink still reports
        a node it lost contact with, after its heartbeat timeout).
    on_disconnect : {"continue", "raise"}
        What a lost node does to the run (see the module docs).
    backend_config : dict, optional
        Simulation only: Flower's ``backend_config`` (e.g. ``{"client_resources": {"num_cpus":
        1, "num_gpus": 0.5}}`` to put FGPR clients on a GPU).
    verbose : bool
        Show Flower's and Ray's logs (quiet by default).
    trust : sequence of str
        Packages whose classes either side loads from the other's pickles (default
        ``("fedstats",)``; add the package of your own algorithms). A simulation's nodes also
        need to import them: put the package on ``PYTHONPATH`` or install it.
    secure_aggregation : bool or SecureAggregation
        Send every algorithm's declared sums through Flower's SecAgg+ (the server receives
        only their sum over the nodes of a round; at least 3 per round). ``True``: the
        defaults of :class:`~fedstats.federation.flower.secure.SecureAggregation` (values
        below ``2**40`` in absolute value, summed to within ``2**-44`` per node and value).
        Default ``False``.
    policy : NodePolicy or path, optional
        Simulation only: the release policy of every simulated node (default: the defaults of
        :class:`~fedstats.federation.policy.NodePolicy`, as a deployed node without a policy
        file; a TOML file is read again at every message). A deployed node's policy is its
        owner's (see :func:`make_client_app`).

    Example
    -------
    >>> from fedstats.federation.flower import FlowerSession   # doctest: +SKIP
    >>> with FlowerSession(timeout=60) as s:                    # doctest: +SKIP
    ...     res = FederatedGaussianMixture(3).fit(data, backend=s)
    ...     ci = res.wald_intervals(data, backend=s)
    """

    def __init__(
        self,
        num_supernodes: int | None = None,
        *,
        timeout: float | None = None,
        on_disconnect: str = "continue",
        backend_config: dict | None = None,
        verbose: bool = False,
        trust: Sequence[str] = ("fedstats",),
        secure_aggregation: bool | SecureAggregation = False,
        policy: NodePolicy | str | os.PathLike | None = None,
    ) -> None:
        if num_supernodes is not None and (
            isinstance(num_supernodes, bool) or not isinstance(num_supernodes, int) or num_supernodes < 1
        ):
            raise ValueError(f"num_supernodes must be an int >= 1, got {num_supernodes!r}")
        self._setup(timeout, on_disconnect, trust, secure_aggregation)
        self.num_supernodes = num_supernodes
        self.backend_config = dict(backend_config or {})
        self.verbose = bool(verbose)
        policy_of(policy)  # checked now; a file is read again by the nodes at every message
        self.policy = os.fspath(policy) if isinstance(policy, (str, os.PathLike)) else policy_of(policy)
        self.mode = "simulation"

    def _setup(self, timeout, on_disconnect, trust, secure_aggregation) -> None:
        if isinstance(secure_aggregation, bool):
            secure_aggregation = SecureAggregation() if secure_aggregation else None
        elif not isinstance(secure_aggregation, SecureAggregation):
            raise TypeError(f"secure_aggregation must be a bool or a SecureAggregation, got {secure_aggregation!r}")
        #: the options of secure aggregation, or None (the declared sums travel in the replies)
        self.secure_aggregation: SecureAggregation | None = secure_aggregation
        if isinstance(trust, str) or not all(isinstance(t, str) and t for t in trust):
            raise TypeError(f"trust must be a sequence of package names, got {trust!r}")
        self.trust = tuple(trust)
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
        if on_disconnect not in ("continue", "raise"):
            raise ValueError(f"on_disconnect must be 'continue' or 'raise', got {on_disconnect!r}")
        self.timeout = None if timeout is None else float(timeout)
        self.on_disconnect = on_disconnect
        self.lost: dict[int, str] = {}  # node id -> why
        self._grid: Grid | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._start_lock = threading.Lock()
        self._partitions: dict[int, int] = {}  # partition id -> node id (simulation)
        self._names: dict[str, int] = {}  # client name -> node id (deployment)
        #: deployment: nodes refused at discovery (node id -> why), see :meth:`from_grid`
        self.refused: dict[int, str] = {}
        self._info: dict[int, dict] = {}

    @classmethod
    def from_grid(
        cls,
        grid: Grid,
        *,
        min_nodes: int = 1,
        wait: float = 60.0,
        timeout: float | None = None,
        on_disconnect: str = "continue",
        trust: Sequence[str] = ("fedstats",),
        secure_aggregation: bool | SecureAggregation = False,
        expected: Mapping[str, int | None] | Sequence[str] | str | None = None,
    ) -> FlowerSession:
        """A session over a deployment's ``Grid`` (inside ``@app.main()``).

        Waits up to ``wait`` seconds for ``min_nodes`` SuperNodes, then asks each one which
        client it is and what its data looks like (rows, column names; never the rows).

        ``expected``: the clients the run expects, by name, each optionally with the node id
        its SuperNode was registered under (``{"site_a": 5821..., "site_b": None}``, or a list
        of names, or the run config's text ``"site_a=5821,site_b"``). The session then waits for every one of them (not ``min_nodes``) and
        refuses every other node: one whose client is not expected, one whose node id is not
        the declared one, and, when two nodes claim one expected name without a declared id,
        the run itself (it cannot tell which is genuine). Refused nodes are in ``refused``
        (node id -> why), never sent anything more, and named in a warning.
        """
        self = cls.__new__(cls)
        self._setup(timeout, on_disconnect, trust, secure_aggregation)
        self.mode, self.num_supernodes, self.backend_config, self.verbose = "deployment", None, {}, False
        self._grid = grid
        want = _expected(expected)
        if want is None:
            self._discover(min_nodes, wait)
        else:
            self._discover_expected(want, wait)
        for node, info in list(self._info.items()):  # a node under its policy's minimum withholds its rows' count
            if info.get("withheld"):
                self.refused[node] = f"client {info.get('client', '')!r}: {info['withheld']}"
                del self._info[node]
        if len(self._info) < (min_nodes if want is None else 1):
            raise ClientDisconnected(
                f"{len(self._info)} SuperNode(s) left to fit on; refused: "
                + "; ".join(f"node {n}: {why}" for n, why in self.refused.items())
            )
        seen: dict[str, int] = {}
        for node, info in self._info.items():
            name = info.get("client", "")
            if not name:
                raise DataError(f"node {node} reports no data (its ClientApp needs make_client_app(read_node_csv))")
            if name in seen:
                raise DataError(f"nodes {seen[name]} and {node} both say they are client {name!r}")
            seen[name] = node
        self._names = dict(sorted(seen.items()))
        if self.refused:
            warnings.warn(
                "refused SuperNode(s): " + "; ".join(f"node {n}: {why}" for n, why in self.refused.items()),
                RuntimeWarning,
                stacklevel=2,
            )
        return self

    def _discover_expected(self, want: dict[str, int | None], wait: float) -> None:
        """Discovery until every expected client has answered from an acceptable node; every
        other node is refused (see :meth:`from_grid`)."""
        grid = self._grid
        assert grid is not None
        t0 = time.monotonic()
        asked: set[int] = set()
        claims: dict[str, list[int]] = {}
        while True:
            nodes = [n for n in grid.get_node_ids() if n not in asked]
            if nodes:
                asked.update(nodes)
                left = max(1.0, wait - (time.monotonic() - t0))
                for node, info in self._hello(nodes, left).items():
                    name = str(info.get("client", ""))
                    if name not in want:
                        self.refused[node] = f"its client {name!r} is not one this run expects ({sorted(want)})"
                    elif want[name] is not None and want[name] != node:
                        self.refused[node] = f"it says it is client {name!r}, which was registered as node {want[name]}"
                    else:
                        claims.setdefault(name, []).append(node)
                        self._info[node] = info
            doubled = {c: n for c, n in claims.items() if len(n) > 1}
            if doubled:
                raise DataError(
                    "two SuperNodes claim one expected client: "
                    + "; ".join(f"{c!r}: nodes {n}" for c, n in doubled.items())
                    + " (declare each client's node id to tell them apart)"
                )
            missing = sorted(set(want) - set(claims))
            if not missing:
                return
            if time.monotonic() - t0 > wait:
                refused = "".join(f"; refused node {n}: {why}" for n, why in self.refused.items())
                raise ClientDisconnected(f"expected client(s) {missing} did not connect within {wait:.0f} s{refused}")
            time.sleep(0.5)

    # ---- lifecycle
    def __enter__(self) -> FlowerSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    #: the simulation running in this process (Ray serves one at a time: a second one would
    #: wait forever for CPUs the first one's actors hold)
    _running: FlowerSession | None = None
    _lock = threading.Lock()

    def _start(self, n: int) -> None:
        from flwr.simulation import run_simulation

        with FlowerSession._lock:
            if FlowerSession._running is not None:
                raise RuntimeError(
                    "another FlowerSession's simulation is running in this process; close it first "
                    "(or pass that session as backend=)"
                )
            FlowerSession._running = self

        ready, self._stop = threading.Event(), threading.Event()
        server = ServerApp()

        @server.main()
        def main(grid: Grid, context: Context) -> None:
            self._grid = grid
            ready.set()
            self._stop.wait()

        def simulate() -> None:
            try:
                run_simulation(
                    server,
                    make_client_app(trust=self.trust, policy=self.policy),
                    num_supernodes=n,
                    backend_config=self._backend_config(),
                    verbose_logging=self.verbose,
                )
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self._error = exc
            finally:
                ready.set()

        self._quiet()
        self._thread = threading.Thread(target=simulate, name="fedstats-flower-simulation", daemon=True)
        self._thread.start()
        try:
            if not ready.wait(timeout=300) or self._grid is None:
                raise RuntimeError(f"the Flower simulation did not start: {self._error!r}") from self._error
            self._discover(n, wait=120.0)
        except BaseException:
            self.close()  # stop what started, free the process for another session
            raise
        self._partitions = {int(info["partition"]): node for node, info in self._info.items()}

    def _backend_config(self) -> dict:
        cfg = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.backend_config.items()}
        if not self.verbose:  # Ray's own logs, and the nodes' logs forwarded to this process
            cfg.setdefault("init_args", {}).setdefault("logging_level", "ERROR")
            cfg["init_args"].setdefault("log_to_driver", False)
        return cfg

    def _quiet(self) -> None:
        """Flower's and Ray's logs off for this session (restored by :meth:`close`)."""
        self._saved_env = {k: os.environ.get(k) for k in ("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "RAY_DEDUP_LOGS")}
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        logger = logging.getLogger("flwr")
        self._saved_level = logger.level
        if not self.verbose:
            logger.setLevel(logging.ERROR)

    def close(self) -> None:
        """Stop the simulation (simulation mode); the session cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=120)
            if self._thread.is_alive():
                warnings.warn(
                    "the Flower simulation did not stop within 120 s; it is left to end with the process",
                    RuntimeWarning,
                    stacklevel=2,
                )
            with FlowerSession._lock:
                if FlowerSession._running is self and not self._thread.is_alive():
                    FlowerSession._running = None
            logging.getLogger("flwr").setLevel(self._saved_level)
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    # ---- nodes
    def _hello(self, nodes: list[int], timeout: float) -> dict[int, dict]:
        """Ask ``nodes`` which client each serves and what its data look like: node -> its
        answer (nodes that do not answer, or answer with an error, are left out)."""
        replies = self.send_and_receive(
            [Message(RecordDict({}), dst_node_id=n, message_type=HELLO) for n in nodes], timeout=timeout
        )
        return {r.metadata.src_node_id: dict(r.content["fedstats"]) for r in replies if not r.has_error()}

    def _discover(self, n: int, wait: float) -> None:
        t0 = time.monotonic()
        grid = self._grid
        assert grid is not None  # set by from_grid or the started simulation before discovery
        nodes = list(grid.get_node_ids())
        while len(nodes) < n:
            if time.monotonic() - t0 > wait:
                raise ClientDisconnected(f"only {len(nodes)} of {n} SuperNodes connected within {wait:.0f} s")
            time.sleep(0.2)
            nodes = list(grid.get_node_ids())
        # a SuperLink still lists a node that died until its heartbeat expires: such nodes do
        # not answer (or answer with an error) and are left out, as long as n others answer
        self._info.update(self._hello(nodes, wait))
        missing = [node for node in nodes if node not in self._info]
        if len(self._info) < n:
            raise ClientDisconnected(
                f"only {len(self._info)} of the {len(nodes)} SuperNodes answered within "
                f"{wait:.0f} s (need {n}); silent: {missing[:10]}"
            )
        if missing:
            warnings.warn(f"SuperNode(s) {missing[:10]} did not answer and are left out", RuntimeWarning, stacklevel=3)

    def assign(self, ids: Sequence[ClientId]) -> dict[ClientId, int]:
        """The node that serves each client of ``ids`` (a simulation starts its nodes on the first call)."""
        if self._closed:
            raise RuntimeError("this FlowerSession is closed")
        if self.mode == "simulation":
            with self._start_lock:  # two threads sharing a fresh session start it once
                if self._grid is None:
                    self._start(self.num_supernodes or len(ids))
            # each run sends every client its data and state, so any live node can serve any
            # client: clients take the live nodes in order (never a lost one)
            live = [node for _, node in sorted(self._partitions.items()) if node not in self.lost]
            if len(ids) > len(live):
                raise ValueError(
                    f"this run has {len(ids)} clients but the Flower simulation has {len(live)} live "
                    "SuperNodes; open a FlowerSession(num_supernodes=...)"
                )
            return dict(zip(ids, live))
        unknown = [c for c in ids if str(c) not in self._names]
        if unknown:
            raise DataError(f"client(s) {unknown[:5]} have no SuperNode; connected: {list(self._names)[:10]}")
        return {c: self._names[str(c)] for c in ids}

    def send_and_receive(self, messages: list[Message], timeout: float | None = None) -> list[Message]:
        """Grid.send_and_receive, but a simulation that died mid-call raises instead of hanging."""
        timeout = self.timeout if timeout is None else timeout
        grid = self._grid
        if grid is None:
            raise RuntimeError("this FlowerSession has not started: it has no nodes to send to yet")
        pending = set(grid.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            got = list(grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending or (end is not None and time.monotonic() >= end):
                break
            if self._thread is not None and not self._thread.is_alive():
                raise RuntimeError(f"the Flower simulation stopped: {self._error!r}") from self._error
            time.sleep(getattr(grid, "pull_interval", 0.1))
        return replies

    @property
    def grid(self) -> Grid:
        """The Flower ``Grid`` the session sends through (started)."""
        if self._grid is None:
            raise RuntimeError("this FlowerSession has not started: it has no nodes to send to yet")
        return self._grid

    @property
    def connected(self) -> bool:
        """Whether the session can still reach nodes (started and not closed)."""
        return self._grid is not None and not self._closed

    def client_side(self, algorithm: FederatedAlgorithm, ids: list[ClientId], data: Any, seed: int) -> FlowerClients:
        """The client side of one :func:`~fedstats.federation.run` over ``data`` (called by ``run``)."""
        return FlowerClients(self, algorithm, ids, data, seed)

    def remote_data(self) -> RemoteFederatedData:
        """Deployment: the clients (sorted by name), their row counts and the common schema."""
        if self.mode != "deployment":
            raise RuntimeError(
                "remote_data() is for deployments (FlowerSession.from_grid); a simulation is given its data by the fit"
            )
        infos = {name: self._info[node] for name, node in self._names.items()}
        first_name, first = next(iter(infos.items()))
        for name, info in infos.items():
            if list(info["features"]) != list(first["features"]) or info["target"] != first["target"]:
                raise DataError(
                    f"client {name!r} has columns {list(info['features'])} (target {info['target']!r}), "
                    f"client {first_name!r} has {list(first['features'])} (target {first['target']!r})"
                )
        return RemoteFederatedData(
            {name: int(info["n"]) for name, info in infos.items()}, list(first["features"]), first["target"] or None
        )

    def __repr__(self) -> str:
        nodes = len(self._partitions or self._names)
        return (
            f"FlowerSession(mode={self.mode!r}, nodes={nodes}, timeout={self.timeout}, "
            f"on_disconnect={self.on_disconnect!r}, lost={len(self.lost)}, closed={self._closed})"
        )
