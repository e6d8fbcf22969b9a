"""The server-side proxies of the nodes: the client side of one run on Flower
(:class:`FlowerClients`, what a :class:`~fedstats.federation.flower.FlowerSession` gives
:func:`~fedstats.federation.run`), which sends each node its start, steps and state requests
and turns the nodes' answers into the runtime's outcomes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from ..client_side import Outcome
from ..protocol import ClientDisconnected, ClientId, FederatedAlgorithm, ProtocolError, describe_exc, validate_message
from .secure import SecureAggregationError, decode, secure_sum
from .wire import HELLO, LOST_CODES, RUN, dumps, loads, to_arrays, to_record

if TYPE_CHECKING:
    from .session import FlowerSession


class _States(dict):
    """Final client states; a lost client's raises :class:`ClientDisconnected` with the reason."""

    def __init__(self, states, lost):
        super().__init__(states)
        self.lost = dict(lost)

    def __missing__(self, client):
        if client in self.lost:
            raise ClientDisconnected(
                f"client {client!r} was lost during the run ({self.lost[client]}); its private state stayed on its node"
            )
        raise KeyError(client)


class FlowerClients:
    """The client side of one :func:`~fedstats.federation.run`, on Flower nodes."""

    def __init__(
        self, session: FlowerSession, algorithm: FederatedAlgorithm, ids: list[ClientId], data: Any, seed: int
    ) -> None:
        self.session, self.algorithm, self.ids, self.seed = session, algorithm, ids, seed
        self.key = uuid.uuid4().hex
        self.nodes = session.assign(ids)
        self.index = {c: i for i, c in enumerate(ids)}
        self.data = data
        self.rounds = 1  # the run's round budget (plan_rounds)
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
        # secure aggregation of the algorithm's declared sums (only when it declares some)
        self.secure = session.secure_aggregation if algorithm.summed_keys else None
        self._shapes: dict[ClientId, str] = {}  # this round: each client's summed arrays' shapes
        self._pending: dict[ClientId, bytes | None] = {}  # not started on its node yet (-> resume state)
        self._skip: frozenset = frozenset()  # never asked in this run (they dropped out of the fit before it)
        self._started: set = set()
        self._dropped = False
        # clients whose last step the secure sum left out: their node undoes it at the next message
        self._rollback: set = set()

    def reject(self, clients) -> None:
        """The runtime refused these clients' replies of the last round: each node undoes that
        step at its next message (as for a secure sum that left it out)."""
        self._rollback.update(clients)

    def plan_rounds(self, rounds: int) -> None:
        """The run's round budget (:func:`~fedstats.federation.run` tells it before the first
        round): sent with each start, so that a node with a privacy budget plans that many
        releases."""
        self.rounds = int(rounds)

    # ---- messages
    def _start_config(self, c) -> dict:
        cfg = dict(
            algorithm=self._algorithm[c],
            client=dumps(c),
            local=self._local,
            data=self._shared if self._local else dumps(self.data[c]),
            index=self.index[c],
            seed=self.seed,
            # for the node's rules: secure aggregation, and the releases a privacy budget plans for
            secure=self.secure is not None,
            rounds=int(self.rounds),
        )
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
            if c in self.lost:
                out[c] = f"ClientDisconnected: {self.lost[c]}"
                continue
            cfg = {"run": self.key, **config, **(self._start_config(c) if c in self._pending else {})}
            if c in self._rollback:
                cfg["rollback"] = True
                self._rollback.discard(c)
            content = RecordDict({"fedstats": ConfigRecord(cfg)})
            if arrays is not None:
                content["broadcast"] = to_record(arrays)
            messages.append(
                Message(content, dst_node_id=node, message_type=RUN, group_id="" if rnd is None else str(rnd))
            )
            by_node[node] = c
        if messages:
            for reply in self.session.send_and_receive(messages):
                c = by_node.pop(reply.metadata.src_node_id, None)
                if c is None:
                    continue
                if reply.has_error():
                    why = f"Flower error {reply.error.code}: {reply.error.reason}"
                    if reply.error.code in LOST_CODES:
                        self._lose(c, why, rnd)
                        out[c] = f"ClientDisconnected: {why}"
                    else:
                        out[c] = why
                    continue
                try:  # a node's answer is not trusted to be well formed
                    cfg = dict(reply.content["fedstats"])
                    status = cfg["status"]
                    if status == "ok" and "round" in config:
                        cfg["reply"] = to_arrays(reply.content.array_records["reply"])
                        if self.secure is not None:
                            cfg["shapes"] = str(cfg["shapes"])
                    if status == "ok" and config.get("send", False):
                        cfg["state"] = bytes(cfg["state"])
                except Exception as exc:  # noqa: BLE001
                    out[c] = f"ProtocolError: malformed answer from the node ({describe_exc(exc)})"
                    continue
                if status == "refused":  # the node's policy: the client sits the run out
                    self._lose(c, str(cfg.get("error")), rnd, node_lost=False)
                    out[c] = f"ClientDisconnected: {self.lost[c]}"
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

    def _lose(self, client, why: str, rnd, node_lost: bool = True) -> None:
        """Mark ``client`` lost for this run (and its node for the session, unless it only
        refused this run)."""
        node = self.nodes[client]
        where = "" if rnd is None else f" at round {rnd}"
        if node_lost:
            self.session.lost.setdefault(node, why)
        self.lost.setdefault(client, why + where)
        if self.session.on_disconnect == "raise":
            what = "stopped answering" if node_lost else "sits the run out"
            raise ClientDisconnected(
                f"client {client!r} (node {node}) {what}{where}: {why}. The run "
                "stopped before this round's server step (on_disconnect='raise')."
            )

    # ---- the client side of run()
    def init_states(self, skip: frozenset = frozenset()) -> None:
        self._skip = frozenset(skip)
        self._pending = {c: None for c in self.ids if c not in skip}

    def load_states(self, states: Mapping) -> None:
        self._pending = {c: dumps(states[c]) for c in self.ids}

    def _states(self, drop: bool, final: Mapping | None = None, got: dict | None = None) -> dict:
        clients = [c for c in self.ids if c not in self.lost and c not in self._skip]
        final = final or {}
        if got is None:
            got = self._exchange({c: ({"send": True, "drop": drop}, final.get(c)) for c in clients})
        states = {}
        for c in clients:
            reply = got[c]
            if isinstance(reply, str) or reply["status"] != "ok":
                self.lost.setdefault(c, reply if isinstance(reply, str) else str(reply.get("error")))
                continue
            states[c] = loads(reply["state"], self.session.trust)
        return _States({c: states[c] for c in self.ids if c in states}, self.lost)

    def states(self) -> dict:
        """The states now, for a checkpoint (a node sends its client's only where its policy
        says ``release_statistics = true``; else the checkpoint fails with the node's reason)."""
        clients = [c for c in self.ids if c not in self.lost and c not in self._skip]
        got = self._exchange({c: ({"send": True, "drop": False}, None) for c in clients})
        refused = {c: r["error"] for c, r in got.items() if isinstance(r, dict) and r["status"] != "ok"}
        if refused:
            c, why = next(iter(refused.items()))
            raise RuntimeError(f"cannot write the checkpoint: client {c!r}'s node answered {why}")
        return self._states(drop=False, got=got)

    def final_states(self, final: Mapping | None = None) -> dict:
        """The states at the end of the run; the nodes then forget the run. A client with a
        ``final`` message computes its own result on its node from it and sends a
        :class:`~fedstats.federation.ClientRelease` instead (see :meth:`FederatedAlgorithm.client_result`)."""
        out = self._states(drop=True, final=final)
        self._dropped = True
        return out

    @property
    def summed_securely(self) -> bool:
        """Whether the declared sums travel through secure aggregation (not in the replies)."""
        return self.secure is not None

    def run_round(
        self, rnd: int, idx: list[int], messages: Mapping[int, dict], batched: bool
    ) -> tuple[list[Outcome], str | None]:
        config: dict[str, Any] = {"round": rnd}
        keys = tuple(self.algorithm.reply_keys)
        if self.secure is not None:
            config.update({"secure-bound": float(self.secure.bound), "secure-limbs": int(self.secure.limbs)})
            keys = tuple(k for k in keys if k not in self.algorithm.summed_keys)
        self._shapes = {}
        got = self._exchange({self.ids[i]: (config, messages[i]) for i in idx}, rnd)
        outcomes = []
        for i in idx:
            c = self.ids[i]
            reply = got[c]
            if isinstance(reply, str):
                outcomes.append(Outcome(failed=reply))
            elif reply["status"] == "skipped":
                outcomes.append(Outcome(skipped=str(reply.get("error", ""))))
            elif reply["status"] != "ok":
                outcomes.append(Outcome(failed=str(reply.get("error", "failed"))))
            else:
                try:  # the server checks again: it does not trust the node's check
                    outcomes.append(Outcome(reply=validate_message(reply["reply"], keys, who=f"client {c!r}")))
                    if self.secure is not None:
                        self._shapes[c] = reply["shapes"]
                except ProtocolError as exc:
                    outcomes.append(Outcome(failed=describe_exc(exc)))
        return outcomes, None

    def secure_sums(self, rnd: int, clients: list[ClientId]) -> tuple[dict, dict[ClientId, str], int]:
        """The declared sums over ``clients`` (who answered round ``rnd``) by Flower's SecAgg+:
        ``(sums, clients that dropped out of it -> why, bytes each node sent up)``."""
        shapes = {self._shapes[c] for c in clients}
        if len(shapes) > 1:
            raise ProtocolError(f"summed reply arrays have different shapes across clients: {sorted(shapes)}")
        declared = {k: tuple(v) for k, v in json.loads(shapes.pop()).items()}
        if list(declared) != list(self.algorithm.summed_keys):
            raise ProtocolError(
                f"the nodes hold sums {list(declared)}, the algorithm declares {self.algorithm.summed_keys}"
            )
        secure = self.secure
        assert secure is not None
        nodes = {self.nodes[c]: c for c in clients}
        dropped: dict[ClientId, str] = {}
        try:
            mean, summed = secure_sum(self.session.grid, list(nodes), secure, rnd, self.session.timeout)
        except SecureAggregationError:
            # SecAgg+ halts when a node drops out before its masked vector is in; the others
            # still hold their sums: once more without the nodes that no longer answer
            alive = self._answering(list(nodes))
            if len(alive) == len(nodes) or len(alive) < secure.min_nodes:
                raise
            for n in set(nodes) - alive:
                c = nodes.pop(n)
                why = "stopped answering during secure aggregation"
                self._lose(c, why, rnd)
                dropped[c] = f"ClientDisconnected: {why}"
            mean, summed = secure_sum(self.session.grid, list(nodes), secure, rnd, self.session.timeout)
        dropped.update({nodes[n]: "dropped out of secure aggregation" for n in nodes if n not in summed})
        self._rollback.update(dropped)  # their steps ran on their nodes but are not in the sum
        sums = decode(mean, len(summed), declared, secure)
        for v in sums.values():
            v.setflags(write=False)
        size = sum(int(np.prod(s, dtype=int)) for s in declared.values())
        return sums, dropped, 4 * (secure.limbs * size + 1)

    def _answering(self, nodes: list[int]) -> set[int]:
        """The nodes among ``nodes`` that answer a hello within the session's timeout."""
        msgs = [Message(RecordDict({}), dst_node_id=n, message_type=HELLO) for n in nodes]
        return {r.metadata.src_node_id for r in self.session.send_and_receive(msgs) if not r.has_error()}

    def close(self) -> None:
        if self._dropped or not self.session.connected:
            return
        started = [c for c in self.ids if c in self._started and c not in self.lost]
        try:  # drop this run's records on the nodes (the run failed, or stopped early)
            self._exchange({c: ({"drop": True}, None) for c in started})
        except Exception:  # noqa: BLE001 - best effort; a raise here would hide the run's own error
            pass
