"""The federated protocol: an algorithm is a client step and a server step over named arrays.

Every federated algorithm of fedstats is a :class:`FederatedAlgorithm`. The runtime
(:func:`fedstats.federation.run`) only moves :data:`Message` objects between the server
and the clients; it never hands client data, or a client's private state, to the server.

* ``broadcast(server_state, client, round)`` -> the message the server sends that client;
* ``client_step(message, private_state, data, rng)`` -> ``(reply, new_private_state)``,
  run on the client; ``data`` never leaves it, neither does ``private_state``;
* ``server_step(server_state, replies, round)`` -> ``(new_server_state, metrics)``, where
  ``replies`` maps the ids of the clients that answered to their replies.

A reply must hold exactly the arrays named in :attr:`FederatedAlgorithm.reply_keys`,
each a numeric numpy array; the runtime rejects anything else before the server sees it.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..result_file import register

Message = dict[str, np.ndarray]
"""A message: plain named numeric numpy arrays, nothing else."""

ClientId = Hashable

_F = TypeVar("_F", bound=Callable[..., Any])


def describe_exc(exc: BaseException) -> str:
    """``"ExcType: message"``: how a failure is recorded and reported."""
    return f"{type(exc).__name__}: {exc}"


class SkipRound(Exception):
    """Raised by a client step that declines to update this round (e.g. a non-PD cavity).

    The runtime records the client as *skipped* (not failed) and leaves its state unchanged.
    """


class ClientDisconnected(RuntimeError):
    """A client's node stopped answering (remote backends), and the run or the model needs it."""


class PolicyRefusal(RuntimeError):
    """A node refused a run: ``rule`` is the policy's rule that the run breaks."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"refused by the node's policy (rule {rule}): {message}")
        self.rule = rule


class ProtocolError(RuntimeError):
    """A message that breaks the protocol (undeclared key, non-numeric array, ...)."""


class FederatedAlgorithm(ABC):
    """Base class of a federated algorithm: a client step and a server step.

    Subclasses declare :attr:`reply_keys` (the names of the arrays a client sends up) and
    implement the five methods below. All randomness comes from the ``rng`` arguments.
    """

    #: names of the arrays every client reply must contain (and nothing else)
    reply_keys: tuple[str, ...] = ()
    #: the reply arrays the server uses only through their sum over the clients that answered:
    #: the runtime sums them and :meth:`server_step` receives the sums only (``replies.sums``;
    #: they are removed from each client's reply), so no server code can depend on one
    #: client's value
    summed_keys: tuple[str, ...] = ()
    #: a :class:`~fedstats.privacy.DifferentialPrivacy` when the algorithm's releases are
    #: differentially private (``None``: they are not). Its client step then clips each row's
    #: contributions and adds its share of the noise (:meth:`DifferentialPrivacy.client_sums`);
    #: the runtime checks that every reply array is a declared sum and that every client takes
    #: part in every round, adds the central noise to the sums (``placement="central"``) and
    #: records each round in the run's :class:`~fedstats.privacy.PrivacyLedger`
    privacy: Any = None
    #: ``True`` when each reply is the change since the client's previous reply (the server
    #: keeps running totals): a client's influence then subtracts all it ever sent
    cumulative_replies: bool = False
    #: reply arrays that are cross-products of the client's rows (``X'WX`` with weights >= 0):
    #: the runtime refuses a copy that is not symmetric positive semi-definite, blaming its
    #: sender (not under secure aggregation, where no copy is seen)
    psd_keys: tuple[str, ...] = ()
    #: reply arrays that are symmetric in their last two axes (a change of a precision matrix):
    #: a copy that is not is refused the same way
    symmetric_keys: tuple[str, ...] = ()
    #: reply arrays whose entries add up to the client's number of rows (FedEM's soft counts
    #: ``N``: each row's responsibilities sum to one; for cumulative replies, all it sent so
    #: far): a client whose do not add up to the rows it declared (``data.n_obs``) is refused
    #: as broken, e.g. one that scales its statistics (checked where :meth:`leave_one_out` is)
    row_count_keys: tuple[str, ...] = ()
    #: the unit of :meth:`leave_one_out`'s shift in the influence report and its warning
    influence_unit: str = "se"
    #: ``True`` for an exchange whose replies are a client's sufficient statistics themselves
    #: (HM1's opt-in information share: ``X'X / s^2``, ``X'y / s^2``): a node runs it only
    #: where its policy says ``release_statistics = true``
    releases_statistics: bool = False
    #: ``False`` for an algorithm whose client steps draw no random numbers: the in-process
    #: runtime then passes ``None`` as each client's ``rng`` instead of deriving a stream per
    #: client and round (which costs more than a small client's whole step)
    random_client_steps: bool = True
    #: attributes that map client ids to values (per-client starts, the states a previous
    #: time step left): a remote client receives only its own entry (see :meth:`for_client`)
    per_client_fields: tuple[str, ...] = ()
    #: attributes only the server uses (its start, a callback): not sent to remote clients
    server_only_fields: tuple[str, ...] = ()

    def for_client(self, client: ClientId) -> "FederatedAlgorithm":
        """The algorithm as sent to ``client`` by a remote backend (Flower).

        No node may receive what belongs to another client: the copy keeps only ``client``'s
        entry of each :attr:`per_client_fields` mapping and drops the
        :attr:`server_only_fields`. Without either, the object itself.
        """
        if not (self.per_client_fields or self.server_only_fields):
            return self
        out = copy.copy(self)
        for name in self.per_client_fields:
            value = getattr(self, name)
            if isinstance(value, Mapping):
                setattr(out, name, {client: value[client]} if client in value else {})
        for name in self.server_only_fields:
            setattr(out, name, None)
        return out

    @abstractmethod
    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> Any:
        """Initial server state (never contains client data)."""

    @abstractmethod
    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> Any:
        """Initial private state of a client, computed on the client from its own data."""

    @abstractmethod
    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        """The message the server sends to ``client`` at the start of ``round``."""

    @abstractmethod
    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        """One round on one client: returns ``(reply, new_private_state)``."""

    def client_steps(
        self,
        messages: Sequence[Message],
        states: Sequence[Any],
        datas: Sequence[Any],
        rngs: Sequence[np.random.Generator],
    ) -> list[tuple[Message, Any] | BaseException]:
        """Run :meth:`client_step` for several clients at once (in-process simulation only).

        The result for each client must be what :meth:`client_step` would give on that
        client's own inputs; subclasses override this to vectorise across clients (one
        compiled kernel for all of them). An entry may be an exception: that client failed
        (or raised :class:`SkipRound`) and the others go on. The default loops.
        """
        out: list[tuple[Message, Any] | BaseException] = []
        for m, s, d, r in zip(messages, states, datas, rngs):
            try:
                out.append(self.client_step(m, s, d, r))
            except Exception as exc:  # noqa: BLE001 - the runtime records it
                out.append(exc)
        return out

    @abstractmethod
    def server_step(
        self, server_state: Any, replies: Mapping[ClientId, Message], round: int
    ) -> tuple[Any, dict[str, float]]:
        """Aggregate the replies of the clients that answered: ``(new_state, metrics)``.

        ``replies`` is a :class:`Replies`: each answering client's reply without the
        :attr:`summed_keys`, whose sums over those clients are in ``replies.sums``."""

    def final_state(self, state: Any) -> Any:
        """What of a client's private ``state`` leaves the client at the end of a run: a remote
        backend sends it to the server so that the fit returns its result (checkpoints keep
        the whole state, to resume). Default: the state; an algorithm overrides this to keep
        what the result does not need on the client."""
        return state

    def final_message(self, server_state: Any, client: ClientId) -> Message | None:
        """What the server sends ``client`` with the end of a run on a remote backend, so that
        the client can compute its own result where its data are (:meth:`client_result`).
        Default ``None``: nothing (the algorithm has no client result)."""
        return None

    def client_result(self, message: Message, state: Any, data: Any, index: int, seed: int) -> Any:
        """The client's own result (e.g. its posterior), computed on its node at the end of a
        run on a remote backend, from :meth:`final_message` and the client's final ``state``.

        ``index`` and ``seed`` are the client's position and the run's seed, for its random
        streams (the result must equal what the in-process result computes from the state).
        The node writes it to its owner's file and sends the server a :class:`ClientRelease`
        in place of :meth:`final_state`: holding this result only where the node's policy says
        ``release = "posterior"``. Only called when :meth:`final_message` gives a message.
        """
        raise NotImplementedError(f"{type(self).__name__} has a final_message but no client_result")

    def converged(self, server_state: Any, metrics: Mapping[str, float]) -> bool:
        """Whether the run may stop after this round (default: never before the cap)."""
        return False

    def leave_one_out(
        self, totals: Mapping[str, np.ndarray], own: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Optional: how far the estimate the server forms from the summed replies ``totals``
        moves when one client's contribution is taken out, for several clients at once: ``own``
        holds each client's contribution stacked along a first axis (one row per client).
        Returns two arrays of one value per row: the largest shift of an estimated quantity in
        its standard errors, and that shift over what a client with its share of the information
        would typically cause (``inf`` where a part of the estimate rests on that client alone,
        ``NaN`` where it cannot be measured); ``None``: not defined (the default). The runtime
        reports it as each client's influence (:mod:`fedstats.federation.influence`)."""
        return None


@register
@dataclass(frozen=True)
class ClientRelease:
    """What a node sends the server at the end of a run of an algorithm with a client result
    (:meth:`FederatedAlgorithm.client_result`), in place of the client's final state.

    ``result``: the client's result where the node's policy releases it (``release =
    "posterior"``), else ``None``: it stayed on the node. ``file``: the name of the file the
    node wrote it to for its owner (``None``: the policy names no directory).
    """

    client: Any
    result: Any = None
    file: str | None = None

    @property
    def kept(self) -> bool:
        """Whether the result stayed on the node."""
        return self.result is None

    def unavailable(self, what: str = "posterior") -> str:
        """The message a result gives for this client's kept ``what``."""
        where = f" (its owner finds it in {self.file!r} on the node)" if self.file else ""
        return (
            f"client {self.client!r}'s {what} was computed on its node and stayed there{where}: the node's "
            'policy releases only the algorithm\'s messages (release = "posterior" in its policy releases it)'
        )


@register
@dataclass(frozen=True)
class ClientResultFile:
    """A client's own result as its node writes it for its owner (a fedstats result file, read
    with :func:`fedstats.results.load_result`): the client, the algorithm that computed it,
    the run, when (UTC), and the result itself (for EP models and HM1: the client's posterior)."""

    client: Any
    algorithm: str
    run: str
    written: str
    result: Any


def _check_keys(message: Any, keys: Sequence[str], who: str) -> None:
    if not isinstance(message, Mapping):
        raise ProtocolError(f"{who} sent a {type(message).__name__}, not a mapping of arrays")
    if message.keys() != set(keys):
        got, want = set(message), set(keys)
        extra, missing = sorted(map(str, got - want)), sorted(map(str, want - got))
        raise ProtocolError(f"{who} sent keys {sorted(map(str, got))}: undeclared {extra}, missing {missing}")


def _check_array(v: Any, k: str, who: str) -> None:
    if not isinstance(v, (np.ndarray, np.generic)):
        raise ProtocolError(f"{who} sent {k!r} as {type(v).__name__}, not a numpy array")
    if v.dtype.kind not in "biuf":
        raise ProtocolError(f"{who} sent {k!r} with dtype {v.dtype}, not numeric")


def validate_message(
    message: Any, keys: Sequence[str], *, who: str = "client", seen: dict[int, tuple[Any, np.ndarray]] | None = None
) -> Message:
    """Check that ``message`` holds exactly the arrays named ``keys``, numeric and finite.

    Returns a new dict of read-only numpy arrays (copies), so that neither side can keep a
    reference into the other's memory. Raises :class:`ProtocolError` otherwise. ``seen``
    (``id(array) -> (array, checked copy)``, filled here) lets messages that share an array
    object (one broadcast to many clients) share its one checked copy.
    """
    _check_keys(message, keys, who)
    out: Message = {}
    for k in keys:
        v = message[k]
        hit = seen.get(id(v)) if seen is not None else None
        if hit is not None and hit[0] is v:
            out[k] = hit[1]
            continue
        _check_array(v, k, who)
        arr = np.array(v, copy=True)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ProtocolError(f"{who} sent {k!r} with NaN or inf")
        arr.setflags(write=False)
        out[k] = arr
        if seen is not None:
            seen[id(v)] = (v, arr)
    return out


def validate_messages(
    messages: Sequence[Any], keys: Sequence[str], who: Sequence[str]
) -> list[Message | ProtocolError]:
    """:func:`validate_message` on each of ``messages`` (the replies of one batched round),
    vectorised: the arrays of one key, of one shape and dtype across messages, are copied into
    one read-only stacked array and checked for NaN and inf at once (each message gets its row,
    a view; :meth:`Replies.summing` sums such rows from their stack). Returns each message's
    checked copy, or the :class:`ProtocolError` that :func:`validate_message` raises for it."""
    out: list[Message | ProtocolError] = [ProtocolError("unchecked")] * len(messages)
    want = set(keys)
    ok = [i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.keys() == want]
    columns = [[messages[i][k] for i in ok] for k in keys]
    common = all(
        all(type(a) is np.ndarray for a in arrays)
        and len({(a.shape, a.dtype) for a in arrays}) == 1
        and arrays[0].dtype.kind in "biuf"
        for arrays in columns
    )
    if not ok or not common or len(ok) < len(messages):  # some message is odd: one at a time, for its error
        for i, m in enumerate(messages):
            try:
                out[i] = validate_message(m, keys, who=who[i])
            except ProtocolError as exc:
                out[i] = exc
        return out
    rows = []
    bad: dict[int, str] = {}
    for k, arrays in zip(keys, columns):
        stack = np.stack(arrays)
        if stack.dtype.kind == "f":
            for j in np.flatnonzero(~np.isfinite(stack.reshape(len(ok), -1)).all(axis=1)).tolist():
                bad.setdefault(ok[j], k)
        stack.setflags(write=False)
        rows.append(list(stack) if stack.ndim > 1 else [stack[j, ...] for j in range(len(ok))])
    for j, i in enumerate(ok):
        out[i] = (
            ProtocolError(f"{who[i]} sent {bad[i]!r} with NaN or inf")
            if i in bad
            else {k: r[j] for k, r in zip(keys, rows)}
        )
    return out


def _sum_rows(key: str, arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    """The sum of ``arrays`` (all of one shape); when they are all the rows of one stack
    (:func:`validate_messages`), from the stack itself."""
    base = arrays[0].base
    if (
        isinstance(base, np.ndarray)
        and base.ndim == arrays[0].ndim + 1
        and base.shape[0] == len(arrays)
        and all(a.base is base for a in arrays)
        and len({id(a) for a in arrays}) == len(arrays)  # its rows are distinct views
    ):
        return np.sum(base, axis=0, dtype=dtype)
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ProtocolError(f"summed reply array {key!r} has different shapes across clients: {sorted(shapes)}")
    return np.sum(np.stack(arrays), axis=0, dtype=dtype)


def message_nbytes(message: Mapping[str, np.ndarray]) -> int:
    """Payload size of a message in bytes (sum of the arrays' ``nbytes``)."""
    return int(sum(np.asarray(v).nbytes for v in message.values()))


def client_function(fn: _F) -> _F:
    """Mark a module-level function as code a client may be asked to run (a one-off round's
    reply function, say). Remote backends load a function sent by reference only if it
    carries this mark; nothing else changes."""
    setattr(fn, "__fedstats_client_function__", True)
    return fn


class Replies(dict):
    """The replies a server step receives: client id -> that client's reply, less the
    algorithm's :attr:`~FederatedAlgorithm.summed_keys`, whose sums over the clients that
    answered are in :attr:`sums` (empty when no client answered).

    Example
    -------
    >>> import numpy as np
    >>> r = Replies.summing(("n",), {"a": {"n": np.array([2.0]), "m": np.array([1.0])},
    ...                              "b": {"n": np.array([3.0]), "m": np.array([0.0])}})
    >>> r.sums["n"], sorted(r["a"])
    (array([5.]), ['m'])
    """

    def __init__(
        self, replies: Mapping[ClientId, Message] | None = None, sums: Mapping[str, np.ndarray] | None = None
    ) -> None:
        super().__init__(replies or {})
        #: key -> the sum of that array over the clients that answered
        self.sums: dict[str, np.ndarray] = dict(sums or {})
        #: the clients asked this round that did not answer (client -> why: they skipped it,
        #: failed or were lost); the runtime fills it in
        self.declined: dict[ClientId, str] = {}

    @classmethod
    def summing(cls, keys: Sequence[str], replies: Mapping[ClientId, Message]) -> Replies:
        """``replies`` with ``keys`` summed over the clients (every client's array of a key
        must have the same shape) and removed from each client's reply."""
        if not keys:
            return cls(replies)
        sums: dict[str, np.ndarray] = {}
        for k in keys:
            arrays = [r[k] for r in replies.values()]
            if not arrays:
                continue
            total = _sum_rows(k, arrays, np.result_type(arrays[0], np.float64))
            total.setflags(write=False)
            sums[k] = total
        summed = set(keys)
        kept = {
            c: {k: v for k, v in r.items() if k not in summed} if r.keys() - summed else {} for c, r in replies.items()
        }
        return cls(kept, sums)
