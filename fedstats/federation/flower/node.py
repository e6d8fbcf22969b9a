"""The node side: the ``ClientApp`` that serves one client on a SuperNode (:func:`make_client_app`).
The node keeps everything that is the client's (its data, the algorithm it was sent, its
private state) and runs the very ``init_client`` / ``client_step`` that the in-process runtime
runs, with the same random streams; only the reply arrays leave it during a run."""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp

from ...data import DataError, FederatedData
from ...result_file import save_result
from ..client_side import checked_step, client_rng
from ..policy import NodePolicy, PolicyRefusal, check_run, check_step, policy_of
from ..protocol import ClientRelease, ClientResultFile, SkipRound, describe_exc
from .secure import SecureAggregation, encode
from .wire import dumps, loads, to_arrays, to_record

#: where a node keeps its encoded sums between its step and the secure aggregation
SECURE_STASH = "fedstats.secure"

_log = logging.getLogger("fedstats.node")

#: where a deployed node writes its clients' results when its policy names no directory
DEFAULT_POSTERIOR_DIR = "fedstats-posteriors"


def _keep(folder: str, client: Any, run: str, algorithm: str, result: Any) -> str:
    """Write ``result`` to ``folder`` (created if needed); the file's name."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(client)) or "client"
    name = f"{stem}-{run[:12]}.fedstats"
    os.makedirs(folder, exist_ok=True)
    written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    save_result(ClientResultFile(client, algorithm, run, written, result), os.path.join(folder, name))
    return name


class _Node:
    """The ClientApp's handlers (a module-level class, so Ray ships them by reference).

    One message type, ``train.fedstats``, whose config may carry, in this order: a start
    (the algorithm, the client's id, position and seed, its data or the server's view of it,
    optionally a state to resume from), a step (``round`` and the broadcast arrays), a request
    for the state (``send``) and ``drop`` (forget the run). Each Flower message costs a round
    trip and, on a deployed SuperNode, a fresh ClientApp process, so a run's start rides on
    its first step and its final state request on the drop.
    """

    def __init__(
        self,
        local_data: Callable[[Context], FederatedData] | None,
        trust: Sequence[str],
        policy: NodePolicy | str | os.PathLike | None,
    ):
        self.local_data = local_data
        self.trust = tuple(trust)
        if policy is not None:
            policy_of(policy)  # a bad policy fails here, not at the first message
        # a file is read again at every message: its owner may change it without a restart
        self.policy = os.fspath(policy) if isinstance(policy, (str, os.PathLike)) else policy

    def _policy(self, context: Context) -> NodePolicy:
        """The policy given to :func:`make_client_app`, else the TOML file at the node config's
        ``policy`` key, else the defaults."""
        if self.policy is not None:
            return policy_of(self.policy)
        path = str(context.node_config.get("policy", "")).strip()
        return policy_of(path or None)

    def _local(self, context: Context) -> FederatedData:
        if self.local_data is None:
            raise DataError("this ClientApp holds no data of its own (simulation nodes receive theirs)")
        return self.local_data(context)

    @staticmethod
    def _answer(message: Message, config: dict, arrays: Mapping[str, np.ndarray] | None = None) -> Message:
        content = RecordDict({"fedstats": ConfigRecord(config)})
        if arrays is not None:
            content["reply"] = to_record(arrays)
        return Message(content, reply_to=message)

    def hello(self, message: Message, context: Context) -> Message:
        info: dict[str, Any] = {"partition": int(context.node_config.get("partition-id", -1))}
        if self.local_data is not None:
            fd = self._local(context)
            c = fd.clients[0]
            n, least = int(fd.n_obs[c]), self._policy(context).min_rows
            info.update(client=str(c), n=n, features=list(fd.feature_names), target=fd.target_name or "")
            if n < least:  # not even the row count leaves a node under its minimum
                info.update(
                    n=-1,
                    withheld=f"refused by the node's policy (rule min_rows): the node releases nothing from "
                    f"fewer than {least} rows, its row count included",
                )
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
        cfg: Mapping[str, Any] = message.content["fedstats"]  # the server's values, checked as they are used
        key = "fedstats." + str(cfg["run"])
        loaded = None
        if "algorithm" in cfg:  # start (or resume) the run on this node
            start = {k: cfg[k] for k in ("algorithm", "client", "local", "index", "seed", "data")}
            try:
                algorithm, client, data = loaded = self._load(start, context)
                policy = self._policy(context)
                policy.check(algorithm, data)
                rounds = cfg.get("rounds")
                check_run(policy, algorithm, client, secure=bool(cfg.get("secure", False)), rounds=rounds)
                if "state" in cfg:
                    state = loads(cfg["state"], self.trust)
                else:
                    state = algorithm.init_client(
                        client, data, client_rng(int(start["seed"]), 0, int(start["index"]), init=True)
                    )
                start["state"] = dumps(state)
            except PolicyRefusal as exc:  # the client sits the run out; the server is told why
                _log.warning("fedstats: client %r %s", context.node_config.get("client", ""), exc)
                return self._answer(message, {"status": "refused", "error": str(exc)})
            except Exception as exc:  # noqa: BLE001 - reported to the server, which stops the run
                return self._answer(message, {"status": "init-failed", "error": describe_exc(exc)})
            context.state[key] = ConfigRecord(start)
        if key not in context.state:
            return self._answer(
                message,
                {
                    "status": "failed",
                    "error": "ProtocolError: this node holds no state for the run (it restarted, or was never started)",
                },
            )
        rec = context.state.config_records[key]
        if cfg.get("rollback", False) and "secure-before" in rec:
            # the server could not sum this client's last step securely: as if it had not run
            rec["state"] = rec["secure-before"]
            del rec["secure-before"]
            context.state[key] = rec
        out: dict[str, Any] = {"status": "ok"}
        reply = None
        if "round" in cfg:
            before = rec["state"]
            status, error, reply, algorithm = self._step(cfg, message.content["broadcast"], rec, loaded, context)
            if status == "ok" and "secure-bound" in cfg:
                status, error, reply, out["shapes"] = self._hold_sums(cfg, reply, tuple(algorithm.summed_keys), context)
            if status == "ok":  # until the server says whether its sum included the reply
                rec["secure-before"] = before
            out["status"], out["error"] = status, error
            if status == "ok":
                context.state[key] = rec
            else:  # a failed step leaves the client's state as it was
                rec["state"] = before
        if cfg.get("send", False) and not cfg.get("drop", False) and not self._policy(context).release_statistics:
            # a checkpoint: the server would hold the client's private state (its statistics)
            out = {
                "status": "failed",
                "error": "refused by the node's policy (rule release_statistics): a checkpoint on the server "
                "needs the client's private state, which the node sends only with release_statistics = true",
            }
        elif cfg.get("send", False):
            out["state"] = rec["state"]
            if cfg.get("drop", False):  # the end of the run: only what the algorithm and the policy let leave
                try:
                    out["state"] = self._final(message, rec, loaded, context)
                except Exception as exc:  # noqa: BLE001 - reported to the server
                    out = {"status": "failed", "error": describe_exc(exc)}
        if cfg.get("drop", False):
            del context.state[key]
        return self._answer(message, out, reply)

    def _final(self, message: Message, rec, loaded, context: Context) -> bytes:
        """What leaves the node at the end of a run: the algorithm's ``final_state``, or, for an
        algorithm with a client result (a client posterior), a ClientRelease: the result is
        computed here, written for the node's owner, and released only if the policy says so."""
        algorithm, client, data = loaded or self._load(rec, context)
        state = loads(cast(bytes, rec["state"]), self.trust)
        if "broadcast" not in message.content.array_records:
            return dumps(algorithm.final_state(state))
        final = to_arrays(message.content.array_records["broadcast"])
        result = algorithm.client_result(final, state, data, int(rec["index"]), int(rec["seed"]))
        policy = self._policy(context)
        name = None
        folder = str(context.node_config.get("posterior-dir", "")).strip() or policy.posterior_dir
        if folder is None and self.local_data is not None:
            folder = DEFAULT_POSTERIOR_DIR
        if folder is not None:
            name = _keep(folder, client, str(message.content["fedstats"]["run"]), type(algorithm).__name__, result)
            _log.info("fedstats: client %r wrote its result to %s", client, os.path.join(folder, name))
        released = result if policy.release == "posterior" else None
        return dumps(ClientRelease(client=client, result=released, file=name))

    def _hold_sums(self, cfg, reply, keys, context):
        """Secure aggregation: keep the reply's declared sums ``keys`` on the node, encoded for
        Flower's SecAgg+ (:func:`~fedstats.federation.flower.secure.encode`), and reply
        without them (and their shapes, which the server needs to split the sum)."""
        options = SecureAggregation(bound=float(cfg["secure-bound"]), limbs=int(cfg["secure-limbs"]))
        try:
            vector = encode(reply, keys, options)
        except ValueError as exc:
            return "failed", describe_exc(exc), None, ""
        context.state[SECURE_STASH] = ArrayRecord({"sums": Array(vector)})
        shapes = json.dumps({k: list(np.shape(reply[k])) for k in keys})
        return "ok", "", {k: v for k, v in reply.items() if k not in keys}, shapes

    def secure(self, message: Message, context: Context) -> Message:
        """Flower's plain ``train`` message, under ``secaggplus_mod``: the encoded sums this node
        keeps for the round, as the FitRes the mod masks (weight 1)."""
        from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
        from flwr.compat.common import recorddict_compat as compat

        if SECURE_STASH not in context.state.array_records:
            raise RuntimeError("secure aggregation: this node holds no sums for the round")
        vector = context.state.array_records[SECURE_STASH]["sums"].numpy()
        del context.state[SECURE_STASH]
        fitres = FitRes(
            status=Status(Code.OK, ""), parameters=ndarrays_to_parameters([vector]), num_examples=1, metrics={}
        )
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=message)

    def _step(self, cfg, broadcast_record, rec, loaded, context):
        """``(status, error, reply arrays, the algorithm)``; commits the new state into ``rec``
        only if valid."""
        try:
            algorithm, client, data = loaded or self._load(rec, context)
            name = type(algorithm).__name__
            spend = check_step(
                self._policy(context),
                algorithm,
                client,
                secure="secure-bound" in cfg,
                what=f"round {cfg['round']} of {name}",
            )
            state = loads(rec["state"], self.trust)
            broadcast = to_arrays(broadcast_record)
            for v in broadcast.values():
                v.setflags(write=False)
            out = algorithm.client_step(
                broadcast, state, data, client_rng(int(rec["seed"]), int(cfg["round"]), int(rec["index"]))
            )
            reply, new_state = checked_step(algorithm, client, out)
            new_state = dumps(new_state)
            if spend is not None:  # the release is made: on the node's ledger before it leaves
                spend[0].record(str(cfg["run"]), name, name, spend[1])
        except SkipRound as exc:  # its message is the reason the server records
            return "skipped", str(exc), None, None
        except Exception as exc:  # noqa: BLE001 - a failing client is recorded, its state unchanged
            return "failed", describe_exc(exc), None, None
        rec["state"] = new_state
        return "ok", "", reply, algorithm


def make_client_app(
    local_data: Callable[[Context], FederatedData] | None = None,
    *,
    trust: Sequence[str] = ("fedstats",),
    policy: NodePolicy | str | os.PathLike | None = None,
) -> ClientApp:
    """The fedstats ``ClientApp``.

    ``local_data``: in a deployment, a function ``context -> FederatedData`` (one client)
    that loads the node's own data, e.g. :func:`read_node_csv`; ``None`` in a simulation,
    where each node receives its client's data when a run starts. ``trust``: the packages
    whose classes the node will load from the server's pickles (see :func:`loads`).
    ``policy``: the node's release policy (:class:`~fedstats.federation.policy.NodePolicy`, or
    the path of its TOML file, read again at every message); ``None``: the TOML file named by
    the node config's ``policy`` key, else the defaults (at least 5 rows, 3 rows per column of a regression). The server
    cannot change it: a run that breaks it is refused before anything is computed.
    """
    node = _Node(local_data, trust, policy)
    app = ClientApp()
    app.query("fedstats_hello")(node.hello)
    app.train("fedstats")(node.handle)
    app.train(mods=[secaggplus_mod])(node.secure)  # what Flower's SecAggPlusWorkflow sends
    return app
