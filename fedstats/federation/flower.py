"""Run fedstats on Flower: the simulation engine (Ray) and real deployments (SuperLink, SuperNodes).

Needs the extra ``fedstats[flower]`` (tested with ``flwr[simulation]==1.41.0``).

Every model runs its rounds through :func:`fedstats.federation.run`, a server loop over a
*client side* that holds the clients' data and private states. This module provides a
client side made of Flower SuperNodes, so that no model is rewritten:

* :func:`make_client_app` builds the ``ClientApp``. Each SuperNode serves one client. The
  node keeps, in its own ``context.state``, everything that is the client's: the algorithm it
  was sent, its data (in a simulation; in a deployment it reads its own file), and its
  private state (EP site, mixture weights, optimiser moments), and it runs the very
  ``init_client`` / ``client_step`` that the in-process runner runs, with the same random
  streams (:func:`fedstats.federation.runner.client_rng`). During a run only the reply
  arrays leave it; at the end its final private state goes to the server once (below).
* :class:`FlowerSession` is the server side. As a *simulation* it starts Flower's simulation
  engine in a background thread with one SuperNode per client (``fit(..., backend="flower")``
  does it for one call; keep a session open over many calls with ``with FlowerSession() as
  s: ... backend=s``). In a *deployment* it wraps the ``Grid`` of a ``ServerApp``'s
  ``@app.main()``: :meth:`FlowerSession.from_grid`, then :meth:`FlowerSession.remote_data`
  stands in for the data the server does not have.

The loop that decides what happens next (EP's damping back-off, EM to convergence, the
inner rounds of an online time step) is fedstats's own server loop, run where the fit runs:
inside ``@app.main()`` in a deployment. Flower only moves the messages, one type
(``train.fedstats``) whose config may carry:

* a start: the algorithm (pickled), the client's id, its position and the run's seed, and in
  a simulation its data (in a deployment the server's view of the data, no rows, which the
  node applies to its own file). The node calls ``init_client``. It rides on the client's
  first step of the run;
* a step: the round and the broadcast arrays (an ``ArrayRecord``). The node runs
  ``client_step``, checks its reply against the protocol and commits its new state only if
  the reply is valid; it answers with the reply arrays, or with ``skipped`` / ``failed``;
* a request for the node's private state: at the end of a run (so that the fit returns the
  same result object as in-process, the *final* state of each client goes to the server once,
  as with the in-process simulator's ``RunResult.client_states``), or for a checkpoint;
* ``drop``: forget the run (with the final state request).

Pickles: the server sends the algorithm and the client sends its state as pickles. Both
sides load them with a restricted unpickler that resolves only classes and registered client
functions defined in trusted packages (by their own module, no dotted names), numpy arrays
and a few builtins, so a peer cannot make the other side run arbitrary code through them.
Each node gets the algorithm as :meth:`~fedstats.federation.FederatedAlgorithm.for_client`
makes it for its client: no other client's entries (starting weights, previous states).
Not defended: a hostile *server* choosing the parameters of fedstats's own client steps
(nodes run what they are sent), and the content of the final states (see the README:
EP's and HM1's include the client's sufficient statistics X'X, X'y).

Failures: a client whose step raises is recorded as failed for that round, exactly as
in-process. A node that stops answering (no reply within ``timeout`` seconds, or the
SuperLink reports it unavailable) is *lost*: with ``on_disconnect="continue"`` it is recorded
as failed in that round and every later one and the run completes with the others
(``RunResult.lost``); with ``"raise"`` the run stops with :class:`ClientDisconnected` before
the server step of that round, so the server state is that of the last completed round.

Size: one module for now (about 820 lines): safe serialisation of messages, the node side,
the server-side proxies and the session share the wire format defined here; splitting them along
those four lines is issue 20's next step (tests/test_layout.py holds it at its current size).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..data import DataError, FederatedData
from .protocol import ClientDisconnected, ClientId, FederatedAlgorithm, ProtocolError, SkipRound, validate_message
from .runner import Outcome, checked_step, client_rng, describe_exc

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("fedstats.federation.flower needs Flower: pip install 'fedstats[flower]'") from exc

__all__ = ["FlowerSession", "ClientDisconnected", "RemoteFederatedData", "RemoteDataError", "make_client_app",
           "read_node_csv", "dumps", "loads"]

#: Flower error codes that mean the node (or its reply) is gone, not that the step failed
_LOST_CODES = {3, 4, 5}  # MESSAGE_UNAVAILABLE, REPLY_MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE
_RUN, _HELLO = "train.fedstats", "query.fedstats_hello"


class RemoteDataError(DataError):
    """The server tried to read rows that only a client holds (deployment mode)."""


# --------------------------------------------------------------------------- pickles

_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "slice", "range", "complex", "float", "int", "bool",
             "str", "bytes", "bytearray", "object"}
_NUMPY = {
    "numpy": {"ndarray", "dtype"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.numeric": {"_frombuffer"},
    "numpy.core.numeric": {"_frombuffer"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy.random._pickle": {"__generator_ctor", "__bit_generator_ctor", "__randomstate_ctor"},
    "numpy.random._pcg64": {"PCG64", "PCG64DXSM"},
    "numpy.random._philox": {"Philox"},
    "numpy.random._mt19937": {"MT19937"},
    "numpy.random._sfc64": {"SFC64"},
    "numpy.random.bit_generator": {"SeedSequence", "__pyx_unpickle_SeedSequence"},
}
_OTHER = {("copyreg", "_reconstructor"), ("collections", "OrderedDict"), ("collections", "defaultdict"),
          ("_codecs", "encode")}
_TORCH = {"device", "float64", "float32", "float16", "bfloat16", "int64", "int32"}


class _Pickler(pickle.Pickler):
    """Pickles a :class:`RemoteFederatedData` as a reference to 'the node's own data'."""

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.saw_remote = False

    def persistent_id(self, obj):
        if isinstance(obj, RemoteFederatedData):
            self.saw_remote = True
            return "fedstats.node-data"
        return None


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, file, trust: Sequence[str], local: FederatedData | None = None):
        super().__init__(file)
        self.trust = tuple(trust)
        self.local = local

    def _trusted(self, module: str) -> bool:
        return any(module == t or module.startswith(t + ".") for t in self.trust)

    def persistent_load(self, pid):
        if pid == "fedstats.node-data" and self.local is not None:
            return self.local
        raise pickle.UnpicklingError(f"this payload refers to node data ({pid!r}) that is not available here")

    def find_class(self, module: str, name: str):
        ok = ((module == "builtins" and name in _BUILTINS) or name in _NUMPY.get(module, ())
              or (module, name) in _OTHER or (module == "numpy.dtypes" and name.endswith("DType"))
              or (module == "torch" and name in _TORCH))
        if ok:
            return super().find_class(module, name)
        # a dotted name would walk attributes (fedstats.data -> np -> ... -> subprocess.Popen):
        # only a name defined in a trusted module itself is looked at
        if "." not in name and self._trusted(module):
            try:
                obj = super().find_class(module, name)
            except AttributeError:  # not a name of that module: refused below like any other
                obj = None
            # a class may be rebuilt (or constructed); a function is loaded only if registered
            if (self._trusted(getattr(obj, "__module__", "") or "")
                    and (isinstance(obj, type) or getattr(obj, "__fedstats_client_function__", False))):
                return obj
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not a class or registered client "
                                     f"function of {', '.join(self.trust)}, nor a numpy array")


def dumps(obj: Any, *, remote: bool = False) -> bytes:
    """Pickle ``obj`` for the other side of a Flower run.

    A :class:`RemoteFederatedData` inside ``obj`` is written as a reference that the node
    replaces by its own data when it loads the pickle. ``remote=True`` requires one (a
    deployment's server must not send rows it might hold).
    """
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    if remote and not pickler.saw_remote:
        raise DataError("in a deployment the fit must be given session.remote_data() (or data built on it): the "
                        "server holds no rows and sends none")
    return buf.getvalue()


def loads(payload: bytes, trust: Sequence[str] = ("fedstats",), local: FederatedData | None = None) -> Any:
    """Load a pickle from the other side of a Flower run (restricted, see the module docs):
    classes and :func:`~fedstats.federation.client_function` functions of the packages in
    ``trust`` (your own :class:`~fedstats.federation.FederatedAlgorithm` lives in one), numpy
    arrays and plain builtins. ``local``: the node's own data, which stands in for the
    server's :class:`RemoteFederatedData`."""
    return _SafeUnpickler(io.BytesIO(payload), trust, local).load()


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def _record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.array(v, order="C")) for k, v in arrays.items()})  # keeps 0-d arrays 0-d


# --------------------------------------------------------------------------- data held by a node


class _RemoteRows:
    """Stands in, on the server, for rows that stay on a client: the shape is known, not the values."""

    dtype = np.dtype(float)

    def __init__(self, client: ClientId, shape: tuple[int, ...]):
        self.client, self.shape = client, tuple(shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def _refuse(self, *args, **kwargs):
        raise RemoteDataError(f"the rows of client {self.client!r} stay on its node; the server cannot read them "
                              "(this computation must run on the client)")

    __array__ = __getitem__ = __iter__ = _refuse


class RemoteFederatedData(FederatedData):
    """The server's view of a deployment's data: clients, row counts and schema, no rows.

    Built by :meth:`FlowerSession.remote_data` from what each node reports. Passing it to a
    model's ``fit`` works wherever the model touches rows only in its client steps; any
    server-side read of rows raises :class:`RemoteDataError` naming the client.
    """

    def __init__(self, n_obs: Mapping[ClientId, int], feature_names: Sequence[str], target_name: str | None):
        d = len(feature_names)
        self._X = {c: _RemoteRows(c, (int(n), d)) for c, n in n_obs.items()}
        self._y = {c: None if target_name is None else _RemoteRows(c, (int(n),)) for c, n in n_obs.items()}
        self._clients = list(n_obs)
        self._feature_names = list(feature_names)
        self._target_name = target_name

    def subset(self, clients) -> RemoteFederatedData:
        """The view of some clients only (no rows, as the whole)."""
        ids = list(clients)
        unknown = [c for c in ids if c not in self]
        if unknown:
            raise DataError(f"unknown client id(s) {unknown[:5]}")
        return RemoteFederatedData({c: self._X[c].shape[0] for c in ids}, self._feature_names, self._target_name)


def read_node_csv(context: Context) -> FederatedData:
    """A deployment node's own data: the CSV at its node config ``data-path``.

    Node config keys: ``data-path`` (required), ``client`` (its id; default the file name
    without extension), ``target`` (the response column; absent or empty for unsupervised
    models). Every other column must be numeric (categorical columns: encode them first).
    """
    import pandas as pd

    cfg = context.node_config
    if "data-path" not in cfg:
        raise DataError("this SuperNode has no data: start it with --node-config \"data-path='client.csv'\"")
    path = Path(str(cfg["data-path"]))
    name = str(cfg.get("client", "") or path.stem)
    target = str(cfg.get("target", "")) or None
    frame = pd.read_csv(path)
    return FederatedData.from_dataframe(frame.assign(__client__=name), by="__client__", target=target)


# --------------------------------------------------------------------------- the ClientApp


class _Node:
    """The ClientApp's handlers (a module-level class, so Ray ships them by reference).

    One message type, ``train.fedstats``, whose config may carry, in this order: a start
    (the algorithm, the client's id, position and seed, its data or the server's view of it,
    optionally a state to resume from), a step (``round`` and the broadcast arrays), a request
    for the state (``send``) and ``drop`` (forget the run). Each Flower message costs a round
    trip and, on a deployed SuperNode, a fresh ClientApp process, so a run's start rides on
    its first step and its final state request on the drop.
    """

    def __init__(self, local_data: Callable[[Context], FederatedData] | None, trust: Sequence[str]):
        self.local_data = local_data
        self.trust = tuple(trust)

    def _local(self, context: Context) -> FederatedData:
        if self.local_data is None:
            raise DataError("this ClientApp holds no data of its own (simulation nodes receive theirs)")
        return self.local_data(context)

    @staticmethod
    def _answer(message: Message, config: dict, arrays: Mapping[str, np.ndarray] | None = None) -> Message:
        content = RecordDict({"fedstats": ConfigRecord(config)})
        if arrays is not None:
            content["reply"] = _record(arrays)
        return Message(content, reply_to=message)

    def hello(self, message: Message, context: Context) -> Message:
        info: dict[str, Any] = {"partition": int(context.node_config.get("partition-id", -1))}
        if self.local_data is not None:
            fd = self._local(context)
            c = fd.clients[0]
            info.update(client=str(c), n=int(fd.n_obs[c]), features=list(fd.feature_names),
                        target=fd.target_name or "")
        return self._answer(message, info)

    def _load(self, rec, context: Context):
        algorithm = loads(rec["algorithm"], self.trust)
        client = loads(rec["client"], self.trust)
        if rec["local"]:
            # the server sent its view of everybody's data (no rows): the node's own rows
            # take the place of the server's RemoteFederatedData, and the view picks this client
            own = self._local(context)
            if own.clients != [client]:
                raise DataError(f"this node holds client {own.clients[0]!r}, the server asked for {client!r}")
            data = loads(rec["data"], self.trust, local=own)[client]
        else:
            data = loads(rec["data"], self.trust)
        return algorithm, client, data

    def handle(self, message: Message, context: Context) -> Message:
        cfg = message.content["fedstats"]
        key = "fedstats." + str(cfg["run"])
        loaded = None
        if "algorithm" in cfg:  # start (or resume) the run on this node
            rec = {k: cfg[k] for k in ("algorithm", "client", "local", "index", "seed", "data")}
            try:
                algorithm, client, data = loaded = self._load(rec, context)
                if "state" in cfg:
                    state = loads(cfg["state"], self.trust)
                else:
                    state = algorithm.init_client(client, data, client_rng(int(rec["seed"]), 0, int(rec["index"]),
                                                                           init=True))
                rec["state"] = dumps(state)
            except Exception as exc:  # noqa: BLE001 - reported to the server, which stops the run
                return self._answer(message, {"status": "init-failed", "error": describe_exc(exc)})
            context.state[key] = ConfigRecord(rec)
        if key not in context.state:
            return self._answer(message, {"status": "failed", "error": "ProtocolError: this node holds no state "
                                          "for the run (it restarted, or was never started)"})
        rec = context.state.config_records[key]
        out: dict[str, Any] = {"status": "ok"}
        reply = None
        if "round" in cfg:
            out["status"], out["error"], reply = self._step(cfg, message.content["broadcast"], rec, loaded, context)
            if out["status"] == "ok":
                context.state[key] = rec
        if cfg.get("send", False):
            out["state"] = rec["state"]
        if cfg.get("drop", False):
            del context.state[key]
        return self._answer(message, out, reply)

    def _step(self, cfg, broadcast_record, rec, loaded, context):
        """``(status, error, reply arrays)``; commits the new state into ``rec`` only if valid."""
        try:
            algorithm, client, data = loaded or self._load(rec, context)
            state = loads(rec["state"], self.trust)
            broadcast = _arrays(broadcast_record)
            for v in broadcast.values():
                v.setflags(write=False)
            out = algorithm.client_step(broadcast, state, data, client_rng(int(rec["seed"]), int(cfg["round"]),
                                                                           int(rec["index"])))
            reply, new_state = checked_step(algorithm, client, out)
            new_state = dumps(new_state)
        except SkipRound:
            return "skipped", "", None
        except Exception as exc:  # noqa: BLE001 - a failing client is recorded, its state unchanged
            return "failed", describe_exc(exc), None
        rec["state"] = new_state
        return "ok", "", reply


def make_client_app(local_data: Callable[[Context], FederatedData] | None = None, *,
                    trust: Sequence[str] = ("fedstats",)) -> ClientApp:
    """The fedstats ``ClientApp``.

    ``local_data``: in a deployment, a function ``context -> FederatedData`` (one client)
    that loads the node's own data, e.g. :func:`read_node_csv`; ``None`` in a simulation,
    where each node receives its client's data when a run starts. ``trust``: the packages
    whose classes the node will load from the server's pickles (see :func:`loads`).
    """
    node = _Node(local_data, trust)
    app = ClientApp()
    app.query("fedstats_hello")(node.hello)
    app.train("fedstats")(node.handle)
    return app


# --------------------------------------------------------------------------- the server side


class _States(dict):
    """Final client states; a lost client's raises :class:`ClientDisconnected` with the reason."""

    def __init__(self, states, lost):
        super().__init__(states)
        self.lost = dict(lost)

    def __missing__(self, client):
        if client in self.lost:
            raise ClientDisconnected(f"client {client!r} was lost during the run ({self.lost[client]}); its private "
                                     "state stayed on its node")
        raise KeyError(client)


class _FlowerClients:
    """The client side of one :func:`~fedstats.federation.run`, on Flower nodes."""

    def __init__(self, session: FlowerSession, algorithm: FederatedAlgorithm, ids: list, data, seed: int):
        self.session, self.algorithm, self.ids, self.seed = session, algorithm, ids, seed
        self.key = uuid.uuid4().hex
        self.nodes = session._assign(ids)
        self.index = {c: i for i, c in enumerate(ids)}
        self.data = data
        self.lost: dict[ClientId, str] = {}
        # each node gets the algorithm as it is for its client (no other client's entries);
        # one pickle serves every client the algorithm has nothing particular for
        whole = None
        self._algorithm = {}
        for c in ids:
            mine = algorithm.for_client(c)
            if mine is algorithm:
                whole = whole or dumps(algorithm)
            self._algorithm[c] = whole if mine is algorithm else dumps(mine)
        # a simulation sends each node its client's data; a deployment's server sends the view
        # of the data it was given (no rows), which the node applies to its own rows
        self._local = session.mode == "deployment"
        self._shared = dumps(data, remote=True) if self._local else None
        self._pending: dict[ClientId, bytes | None] = {}  # not started on its node yet (-> resume state)
        self._started: set = set()
        self._dropped = False

    # ---- messages
    def _start_config(self, c) -> dict:
        cfg = dict(algorithm=self._algorithm[c], client=dumps(c), local=self._local,
                   data=self._shared if self._local else dumps(self.data[c]), index=self.index[c], seed=self.seed)
        if self._pending[c] is not None:
            cfg["state"] = self._pending[c]
        return cfg

    def _exchange(self, contents: Mapping[ClientId, tuple[dict, Mapping | None]], rnd: int | None = None) -> dict:
        """One message per client (config, broadcast arrays); ``{client: reply config | error str}``.

        A client not yet started on its node gets its start with this message; lost ones are
        marked (and, with ``on_disconnect="raise"``, stop the run).
        """
        out: dict[ClientId, Any] = {}
        messages, by_node = [], {}
        for c, (config, arrays) in contents.items():
            node = self.nodes[c]
            if node in self.session.lost:
                self._lose(c, self.session.lost[node], rnd)
                out[c] = f"ClientDisconnected: {self.lost[c]}"
                continue
            cfg = {"run": self.key, **config, **(self._start_config(c) if c in self._pending else {})}
            content = RecordDict({"fedstats": ConfigRecord(cfg)})
            if arrays is not None:
                content["broadcast"] = _record(arrays)
            messages.append(Message(content, dst_node_id=node, message_type=_RUN,
                                    group_id="" if rnd is None else str(rnd)))
            by_node[node] = c
        if messages:
            for reply in self.session._send_and_receive(messages):
                c = by_node.pop(reply.metadata.src_node_id, None)
                if c is None:
                    continue
                if reply.has_error():
                    why = f"Flower error {reply.error.code}: {reply.error.reason}"
                    if reply.error.code in _LOST_CODES:
                        self._lose(c, why, rnd)
                        out[c] = f"ClientDisconnected: {why}"
                    else:
                        out[c] = why
                    continue
                try:  # a node's answer is not trusted to be well formed
                    cfg = dict(reply.content["fedstats"])
                    status = cfg["status"]
                    if status == "ok" and "round" in config:
                        cfg["reply"] = _arrays(reply.content["reply"])
                    if status == "ok" and config.get("send", False):
                        cfg["state"] = bytes(cfg["state"])
                except Exception as exc:  # noqa: BLE001
                    out[c] = f"ProtocolError: malformed answer from the node ({describe_exc(exc)})"
                    continue
                if status == "init-failed":
                    raise RuntimeError(f"client {c!r} could not start the run on its node: {cfg.get('error')}")
                self._pending.pop(c, None)
                self._started.add(c)
                out[c] = cfg
            for node, c in by_node.items():  # no reply in time
                why = f"no reply within {self.session.timeout} s"
                self._lose(c, why, rnd)
                out[c] = f"ClientDisconnected: {why}"
        return out

    def _lose(self, client, why: str, rnd) -> None:
        node = self.nodes[client]
        where = "" if rnd is None else f" at round {rnd}"
        self.session.lost.setdefault(node, why)
        self.lost.setdefault(client, why + where)
        if self.session.on_disconnect == "raise":
            raise ClientDisconnected(f"client {client!r} (node {node}) stopped answering{where}: {why}. The run "
                                     "stopped before this round's server step (on_disconnect='raise').")

    # ---- the client side of run()
    def init_states(self) -> None:
        self._pending = {c: None for c in self.ids}

    def load_states(self, states: Mapping) -> None:
        self._pending = {c: dumps(states[c]) for c in self.ids}

    def _states(self, drop: bool) -> dict:
        clients = [c for c in self.ids if c not in self.lost]
        got = self._exchange({c: ({"send": True, "drop": drop}, None) for c in clients})
        states = {}
        for c in clients:
            reply = got[c]
            if isinstance(reply, str) or reply["status"] != "ok":
                self.lost.setdefault(c, reply if isinstance(reply, str) else str(reply.get("error")))
                continue
            states[c] = loads(reply["state"], self.session.trust)
        return _States({c: states[c] for c in self.ids if c in states}, self.lost)

    def states(self) -> dict:
        return self._states(drop=False)

    def final_states(self) -> dict:
        """The states at the end of the run; the nodes then forget the run."""
        out = self._states(drop=True)
        self._dropped = True
        return out

    def run_round(self, rnd: int, idx: list[int], messages: Mapping[int, dict], batched: bool):
        got = self._exchange({self.ids[i]: ({"round": rnd}, messages[i]) for i in idx}, rnd)
        outcomes = []
        for i in idx:
            c = self.ids[i]
            reply = got[c]
            if isinstance(reply, str):
                outcomes.append(Outcome(failed=reply))
            elif reply["status"] == "skipped":
                outcomes.append(Outcome(skipped=True))
            elif reply["status"] != "ok":
                outcomes.append(Outcome(failed=str(reply.get("error", "failed"))))
            else:
                try:  # the server checks again: it does not trust the node's check
                    outcomes.append(Outcome(reply=validate_message(reply["reply"], self.algorithm.reply_keys,
                                                                    who=f"client {c!r}")))
                except ProtocolError as exc:
                    outcomes.append(Outcome(failed=describe_exc(exc)))
        return outcomes, None

    def close(self) -> None:
        if self._dropped or self.session._grid is None or self.session._closed:
            return
        started = [c for c in self.ids if c in self._started and c not in self.lost]
        try:  # drop this run's records on the nodes (the run failed, or stopped early)
            self._exchange({c: ({"drop": True}, None) for c in started})
        except Exception:  # noqa: BLE001 - best effort; a raise here would hide the run's own error
            pass


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

    Example
    -------
    >>> from fedstats.federation.flower import FlowerSession   # doctest: +SKIP
    >>> with FlowerSession(timeout=60) as s:                    # doctest: +SKIP
    ...     res = FederatedGaussianMixture(3).fit(data, backend=s)
    ...     ci = res.wald_intervals(data, backend=s)
    """

    def __init__(self, num_supernodes: int | None = None, *, timeout: float | None = None,
                 on_disconnect: str = "continue", backend_config: dict | None = None, verbose: bool = False,
                 trust: Sequence[str] = ("fedstats",)):
        if num_supernodes is not None and (isinstance(num_supernodes, bool) or not isinstance(num_supernodes, int)
                                           or num_supernodes < 1):
            raise ValueError(f"num_supernodes must be an int >= 1, got {num_supernodes!r}")
        self._setup(timeout, on_disconnect, trust)
        self.num_supernodes = num_supernodes
        self.backend_config = dict(backend_config or {})
        self.verbose = bool(verbose)
        self.mode = "simulation"

    def _setup(self, timeout, on_disconnect, trust) -> None:
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
        self._info: dict[int, dict] = {}

    @classmethod
    def from_grid(cls, grid: Grid, *, min_nodes: int = 1, wait: float = 60.0, timeout: float | None = None,
                  on_disconnect: str = "continue", trust: Sequence[str] = ("fedstats",)) -> FlowerSession:
        """A session over a deployment's ``Grid`` (inside ``@app.main()``).

        Waits up to ``wait`` seconds for ``min_nodes`` SuperNodes, then asks each one which
        client it is and what its data looks like (rows, column names; never the rows).
        """
        self = cls.__new__(cls)
        self._setup(timeout, on_disconnect, trust)
        self.mode, self.num_supernodes, self.backend_config, self.verbose = "deployment", None, {}, False
        self._grid = grid
        self._discover(min_nodes, wait)
        seen: dict[str, int] = {}
        for node, info in self._info.items():
            name = info.get("client", "")
            if not name:
                raise DataError(f"node {node} reports no data (its ClientApp needs make_client_app(read_node_csv))")
            if name in seen:
                raise DataError(f"nodes {seen[name]} and {node} both say they are client {name!r}")
            seen[name] = node
        self._names = dict(sorted(seen.items()))
        return self

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
                raise RuntimeError("another FlowerSession's simulation is running in this process; close it first "
                                   "(or pass that session as backend=)")
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
                run_simulation(server, make_client_app(trust=self.trust), num_supernodes=n, backend_config=self._backend_config(),
                               verbose_logging=self.verbose)
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
                warnings.warn("the Flower simulation did not stop within 120 s; it is left to end with the process",
                              RuntimeWarning, stacklevel=2)
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
    def _discover(self, n: int, wait: float) -> None:
        t0 = time.monotonic()
        nodes = list(self._grid.get_node_ids())
        while len(nodes) < n:
            if time.monotonic() - t0 > wait:
                raise ClientDisconnected(f"only {len(nodes)} of {n} SuperNodes connected within {wait:.0f} s")
            time.sleep(0.2)
            nodes = list(self._grid.get_node_ids())
        # a SuperLink still lists a node that died until its heartbeat expires: such nodes do
        # not answer (or answer with an error) and are left out, as long as n others answer
        replies = self._send_and_receive([Message(RecordDict({}), dst_node_id=node, message_type=_HELLO)
                                          for node in nodes], timeout=wait)
        for r in replies:
            if not r.has_error():
                self._info[r.metadata.src_node_id] = dict(r.content["fedstats"])
        missing = [node for node in nodes if node not in self._info]
        if len(self._info) < n:
            raise ClientDisconnected(f"only {len(self._info)} of the {len(nodes)} SuperNodes answered within "
                                     f"{wait:.0f} s (need {n}); silent: {missing[:10]}")
        if missing:
            warnings.warn(f"SuperNode(s) {missing[:10]} did not answer and are left out", RuntimeWarning, stacklevel=3)

    def _assign(self, ids: Sequence[ClientId]) -> dict[ClientId, int]:
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
                raise ValueError(f"this run has {len(ids)} clients but the Flower simulation has {len(live)} live "
                                 "SuperNodes; open a FlowerSession(num_supernodes=...)")
            return dict(zip(ids, live))
        unknown = [c for c in ids if str(c) not in self._names]
        if unknown:
            raise DataError(f"client(s) {unknown[:5]} have no SuperNode; connected: {list(self._names)[:10]}")
        return {c: self._names[str(c)] for c in ids}

    def _send_and_receive(self, messages: list[Message], timeout: float | None = None) -> list[Message]:
        """Grid.send_and_receive, but a simulation that died mid-call raises instead of hanging."""
        timeout = self.timeout if timeout is None else timeout
        pending = set(self._grid.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            got = list(self._grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending or (end is not None and time.monotonic() >= end):
                break
            if self._thread is not None and not self._thread.is_alive():
                raise RuntimeError(f"the Flower simulation stopped: {self._error!r}") from self._error
            time.sleep(getattr(self._grid, "pull_interval", 0.1))
        return replies

    def client_side(self, algorithm: FederatedAlgorithm, ids: list, data, seed: int) -> _FlowerClients:
        """The client side of one :func:`~fedstats.federation.run` over ``data`` (called by ``run``)."""
        return _FlowerClients(self, algorithm, ids, data, seed)

    def remote_data(self) -> RemoteFederatedData:
        """Deployment: the clients (sorted by name), their row counts and the common schema."""
        if self.mode != "deployment":
            raise RuntimeError("remote_data() is for deployments (FlowerSession.from_grid); a simulation is given "
                               "its data by the fit")
        infos = {name: self._info[node] for name, node in self._names.items()}
        first_name, first = next(iter(infos.items()))
        for name, info in infos.items():
            if list(info["features"]) != list(first["features"]) or info["target"] != first["target"]:
                raise DataError(f"client {name!r} has columns {list(info['features'])} (target {info['target']!r}), "
                                f"client {first_name!r} has {list(first['features'])} (target {first['target']!r})")
        return RemoteFederatedData({name: int(info["n"]) for name, info in infos.items()}, list(first["features"]),
                                   first["target"] or None)

    def __repr__(self) -> str:
        nodes = len(self._partitions or self._names)
        return (f"FlowerSession(mode={self.mode!r}, nodes={nodes}, timeout={self.timeout}, "
                f"on_disconnect={self.on_disconnect!r}, lost={len(self.lost)}, closed={self._closed})")
