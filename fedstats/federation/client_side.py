"""The client side of a run: where each client's data and private state live, declared as
the :class:`ClientSide` protocol that every backend implements, and its in-process
implementation (:class:`InProcessClients`). Nothing here is ever handed to the server side;
what leaves it is the validated reply of :meth:`ClientSide.run_round`."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .. import streams
from .protocol import (
    ClientId,
    FederatedAlgorithm,
    Message,
    ProtocolError,
    SkipRound,
    describe_exc,
    validate_message,
    validate_messages,
)


class Outcome:
    """What one client's step gave the server side: a validated ``reply``, or why it
    ``failed``, or that it ``skipped`` the round (:class:`SkipRound`; ``skipped`` is then its
    message, the reason the client gave, ``""`` if none)."""

    __slots__ = ("reply", "failed", "skipped")

    def __init__(self, reply: Message | None = None, failed: str | None = None, skipped: str | None = None) -> None:
        self.reply, self.failed, self.skipped = reply, failed, skipped


class ClientSide(Protocol):
    """The client side of one run, as the round loop of :func:`~fedstats.federation.run` uses
    it. The in-process simulation (:class:`InProcessClients`) and every backend (a backend's
    ``client_side(algorithm, ids, data, seed)`` returns one) implement it."""

    #: clients whose node stopped answering (client -> why); empty in process
    lost: dict[ClientId, str]

    def init_states(self, skip: frozenset = frozenset()) -> None:
        """Run ``init_client`` on every client but those of ``skip``, which the run never asks
        (a fresh run)."""

    def load_states(self, states: Mapping[ClientId, Any]) -> None:
        """Give every client its private state back (a run resumed from a checkpoint)."""

    def states(self) -> dict[ClientId, Any]:
        """Every client's private state now (for a checkpoint)."""

    def final_states(self, final: Mapping[ClientId, Message | None] | None = None) -> dict[ClientId, Any]:
        """Every client's private state at the end of the run (remote backends fetch them once:
        each client gets its ``final`` message, from which a client with a result computes it
        on its node, see :meth:`FederatedAlgorithm.client_result`; in process the states
        stay whole and ``final`` is not used)."""

    def run_round(
        self, rnd: int, idx: list[int], messages: Mapping[int, Message], batched: bool
    ) -> tuple[list[Outcome], str | None]:
        """Run the clients of indices ``idx`` on their broadcasts ``messages``: one
        :class:`Outcome` per client, in ``idx`` order, and the error of a batched call that
        fell back to one step per client (``None`` if none did)."""

    def close(self) -> None:
        """Release what the client side holds (processes, connections)."""

    # A backend with secure aggregation also has ``summed_securely = True`` and
    # ``secure_sums(round, clients) -> (sums, dropped, bytes per client)``: its replies then
    # lack the algorithm's summed keys, whose sum over ``clients`` it gives (see
    # :mod:`fedstats.federation.flower.secure`).


def client_rng(seed: int, rnd: int, index: int, init: bool = False) -> np.random.Generator:
    """The random stream of client number ``index`` at round ``rnd`` (or at ``init_client``).

    Every backend derives a client's randomness from this function alone, which is what
    makes a run on Flower equal the in-process run.
    """
    return streams.stream(seed, "client init", index) if init else streams.stream(seed, "client step", rnd, index)


def _check_pair(client: ClientId, result: Any) -> None:
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ProtocolError(f"client {client!r}: client_step returned {type(result).__name__}, not (reply, state)")


def checked_step(algorithm: FederatedAlgorithm, client: ClientId, result: Any) -> tuple[Message, Any]:
    """``(validated reply, new state)`` from what ``client_step`` returned for ``client``;
    raises :class:`ProtocolError` if it is not a valid ``(reply, state)`` pair. Every backend
    commits a client's new state only after this check."""
    _check_pair(client, result)
    return validate_message(result[0], algorithm.reply_keys, who=f"client {client!r}"), result[1]


class InProcessClients:
    """The client side of the simulation: data and private states live here only.

    Nothing in this object is ever passed to the server side; what leaves it is the
    validated reply of :meth:`run_round`. It implements :class:`ClientSide`.
    """

    lost: dict = {}  # a client in this process never stops answering

    def __init__(
        self, algorithm: FederatedAlgorithm, ids: list[ClientId], get: Callable[[ClientId], Any], seed: int
    ) -> None:
        self.algorithm = algorithm
        self.ids = ids
        self.seed = seed
        self._data = {c: get(c) for c in ids}
        self._states: dict[ClientId, Any] = {}
        self._before: dict[ClientId, Any] = {}  # the last round's states before its steps (reject)

    def init_states(self, skip: frozenset = frozenset()) -> None:
        for i, c in enumerate(self.ids):
            if c not in skip:
                self._states[c] = self.algorithm.init_client(c, self._data[c], client_rng(self.seed, 0, i, init=True))

    def close(self) -> None:
        pass

    def load_states(self, states: Mapping[ClientId, Any]) -> None:
        self._states = {c: states[c] for c in self.ids}

    def states(self) -> dict[ClientId, Any]:
        return dict(self._states)

    def final_states(self, final: Mapping[ClientId, Message | None] | None = None) -> dict[ClientId, Any]:
        return {c: self.algorithm.final_state(s) for c, s in self._states.items()}

    def _accept(self, idx: list[int], results: Sequence[Any]) -> list[Outcome]:
        """Check the clients' results (every reply at once, :func:`validate_messages`); commit
        a client's new state only if its reply is valid."""
        outcomes: list[Outcome | None] = [None] * len(idx)
        pairs: list[int] = []
        for j, (i, result) in enumerate(zip(idx, results)):
            if isinstance(result, BaseException):
                outcomes[j] = (
                    Outcome(skipped=str(result))
                    if isinstance(result, SkipRound)
                    else Outcome(failed=describe_exc(result))
                )
                continue
            try:
                _check_pair(self.ids[i], result)
            except ProtocolError as exc:
                outcomes[j] = Outcome(failed=describe_exc(exc))
                continue
            pairs.append(j)
        who = [f"client {self.ids[idx[j]]!r}" for j in pairs]
        checked = validate_messages([results[j][0] for j in pairs], self.algorithm.reply_keys, who)
        self._before.clear()
        for j, clean in zip(pairs, checked):
            if isinstance(clean, ProtocolError):
                outcomes[j] = Outcome(failed=describe_exc(clean))
            else:
                c = self.ids[idx[j]]
                self._before[c] = self._states[c]
                self._states[c] = results[j][1]
                outcomes[j] = Outcome(reply=clean)
        return outcomes  # type: ignore[return-value]  # every entry is set above

    def reject(self, clients: Sequence[ClientId]) -> None:
        """The runtime refused these clients' replies of the last round (they broke the sum):
        each gets back its state from before that step."""
        for c in clients:
            if c in self._before:
                self._states[c] = self._before.pop(c)

    def _rng(self, rnd: int, i: int) -> Any:
        """Client ``i``'s stream at round ``rnd``; ``None`` for an algorithm whose steps draw
        nothing (:attr:`FederatedAlgorithm.random_client_steps`)."""
        return client_rng(self.seed, rnd, i) if self.algorithm.random_client_steps else None

    def _loop(self, rnd: int, idx: list[int], messages: Mapping[int, Message]) -> list[Any]:
        out: list[Any] = []
        for i in idx:
            c = self.ids[i]
            try:
                out.append(self.algorithm.client_step(messages[i], self._states[c], self._data[c], self._rng(rnd, i)))
            except Exception as exc:  # noqa: BLE001 - a failing client is recorded
                out.append(exc)
        return out

    def run_round(
        self, rnd: int, idx: list[int], messages: Mapping[int, Message], batched: bool
    ) -> tuple[list[Outcome], str | None]:
        if not idx:
            return [], None
        fallback = None
        results: Any = None
        if batched:
            try:
                results = self.algorithm.client_steps(
                    [messages[i] for i in idx],
                    [self._states[self.ids[i]] for i in idx],
                    [self._data[self.ids[i]] for i in idx],
                    [self._rng(rnd, i) for i in idx],
                )
                if not isinstance(results, Sequence) or len(results) != len(idx):
                    got = len(results) if isinstance(results, Sequence) else type(results).__name__
                    raise ProtocolError(f"client_steps returned {got} results for {len(idx)} clients")
            except Exception as exc:  # noqa: BLE001 - fall back to one client at a time
                fallback = describe_exc(exc)
                results = None
        if results is None:
            # fresh rngs: the failed batched call may have consumed the ones it was given
            results = self._loop(rnd, idx, messages)
        return self._accept(idx, results), fallback


def client_list(data: Any) -> tuple[list[ClientId], Callable[[ClientId], Any]]:
    """The client ids of ``data`` (a mapping, or an object with ``clients`` and
    ``__getitem__``), checked, and the function that gets one client's data."""
    if isinstance(data, Mapping):
        ids = list(data.keys())
    elif hasattr(data, "clients") and hasattr(data, "__getitem__"):
        ids = list(data.clients)
    else:
        raise TypeError(
            "data must be a mapping client id -> client data, or an object with a "
            f"`clients` list and `__getitem__(client)` (got {type(data).__name__})"
        )
    if not ids:
        raise ValueError("data has no clients")
    seen: set = set()
    for c in ids:
        if not isinstance(c, Hashable):
            raise TypeError(f"client id {c!r} is not hashable")
        if c in seen:
            raise ValueError(f"client id {c!r} appears twice in data")
        seen.add(c)
    return ids, data.__getitem__
