"""In-process runtime: simulate the server and every client of a :class:`FederatedAlgorithm`.

:func:`run` plays both sides in one Python process, but keeps them apart the way a real
deployment would:

* the *client side* (:class:`_Devices`) holds each client's data and private state; they
  are only ever handed to ``init_client`` and ``client_step(s)``;
* the *server side* (the loop in :func:`run`) only ever sees the server state, the client
  ids and the replies that passed :func:`~fedstats.federation.protocol.validate_message`
  (exactly the declared ``reply_keys``, numeric, finite, read-only copies);
* broadcasts are validated too (any keys, numeric finite arrays only), so a client never
  holds a reference into server memory.

Decisions a caller must know
----------------------------
* Rounds are numbered from 0; ``rounds`` is the *total* number of rounds (a resumed run
  continues up to it).
* Randomness: round ``r`` samples its participants with ``default_rng([seed, r, 0])`` and
  client number ``i`` (its position in the client list) runs with
  ``default_rng([seed, r, 1, i])``; ``init_server`` gets ``default_rng([seed, 2**31 - 1])``
  and ``init_client`` of client ``i`` gets ``default_rng([seed, 2**31 - 1, 1, i])``.
  Results therefore do not depend on the order participants are listed in, on
  ``batched``, or on whether the run was resumed from a checkpoint.
* Participants are always processed, recorded and handed to ``server_step`` in the order
  of the client list, whatever order a callable or schedule gives them in.
* A float participation ``p`` selects ``max(1, ceil(p * n_clients))`` clients (``p * n``
  rounded to 9 decimals first, so ``0.3 * 10`` is 3, not 4). An int ``k`` selects ``k``
  clients: ``1.0`` means *all* clients, ``1`` means *one*.
* A client whose step raises, or whose reply breaks the protocol, *fails*: it is recorded
  in ``RoundRecord.failed``, its reply is dropped before the server, and its private state
  is left as it was (the runner keeps the old state object; an algorithm that mutates its
  state in place before raising is on its own). :class:`SkipRound` is recorded in
  ``RoundRecord.skipped`` instead. Errors on the server side (``init_server``,
  ``broadcast``, an invalid broadcast, ``server_step``, ``converged``) propagate.
* ``server_step`` is called every round, also when no client answered (with an empty
  mapping), so that every round has its metrics.
* Communication: ``bytes_down`` counts the broadcast sent to every participant (failed
  ones included); ``bytes_up`` counts accepted replies only. A rejected reply is modelled
  as caught by the protocol check on the device before it is sent, so it costs nothing
  (its size is not even defined when it holds non-arrays).
* Checkpoints are pickles (only resume from files you trust). The data is not in them
  and is not fingerprinted; the algorithm is fingerprinted by class name only (not its
  hyper-parameters), a callable participation by its qualified name only.

Size: one module for now (about 990 lines): the round loop, participation, checkpoints, byte
counting and progress lines share the run's state; splitting them by responsibility
(participation, checkpoints, accounting, display) is issue 20, scheduled after the result contract.
"""

from __future__ import annotations

import math
import numbers
import os
import pickle
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import streams
from ..results import register
from .protocol import (
    ClientId,
    FederatedAlgorithm,
    Message,
    ProtocolError,
    SkipRound,
    message_nbytes,
    validate_message,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["run", "RunResult", "History", "RoundRecord", "Communication"]

#: version of the checkpoint layout written by :func:`run`
CHECKPOINT_FORMAT = 1

#: the backend that runs the client side of :func:`run` (``None``: this process); set by
#: :func:`fedstats.federation.use_backend`
BACKEND: ContextVar[Any] = ContextVar("fedstats_backend", default=None)



# --------------------------------------------------------------------------- records


@register
@dataclass
class RoundRecord:
    """What happened in one round (0-based ``round``).

    ``participants`` were sent the broadcast; ``answered`` had their reply accepted and
    handed to ``server_step``; ``failed`` maps a client to ``"ExcType: message"``;
    ``skipped`` raised :class:`SkipRound`. All lists follow the client-list order.
    ``batch_fallback`` is ``"ExcType: message"`` when the batched ``client_steps`` call
    failed as a whole and the round fell back to one ``client_step`` per client.
    ``seconds`` (wall time) is excluded from equality comparisons.
    """

    round: int
    participants: list[ClientId]
    answered: list[ClientId]
    failed: dict[ClientId, str]
    skipped: list[ClientId]
    bytes_up: int
    bytes_down: int
    metrics: dict[str, Any]
    converged: bool = False
    batch_fallback: str | None = None
    seconds: float = field(default=0.0, compare=False)


@register
class History(Sequence):
    """The rounds of a run, in order: a read-only list of :class:`RoundRecord`."""

    def __init__(self, records: Iterable[RoundRecord] = ()):
        self._records: list[RoundRecord] = list(records)

    def _append(self, record: RoundRecord) -> None:
        self._records.append(record)

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return History(self._records[i])
        return self._records[i]

    def __iter__(self) -> Iterator[RoundRecord]:
        return iter(self._records)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History):
            return self._records == other._records
        if isinstance(other, list):
            return self._records == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"History({len(self)} rounds)"

    def metric(self, name: str) -> list[Any]:
        """The values of metric ``name`` over the rounds (``None`` where it is absent)."""
        return [r.metrics.get(name) for r in self._records]

    def to_dataframe(self):
        """One row per round (indexed by ``round``), as a :class:`pandas.DataFrame`.

        Columns: ``participants``, ``answered``, ``failed``, ``skipped`` (the lists/dict),
        their counts ``n_participants``, ``n_answered``, ``n_failed``, ``n_skipped``,
        ``bytes_up``, ``bytes_down``, ``converged``, ``batch_fallback``, ``seconds``,
        then one column per metric (prefixed ``metric:`` if its name clashes).
        """
        import pandas as pd

        fixed = [
            "round", "participants", "answered", "failed", "skipped", "n_participants",
            "n_answered", "n_failed", "n_skipped", "bytes_up", "bytes_down", "converged",
            "batch_fallback", "seconds",
        ]
        metric_names: list[str] = []
        for r in self._records:
            for k in r.metrics:
                if k not in metric_names:
                    metric_names.append(k)
        rows = []
        for r in self._records:
            row = {
                "round": r.round,
                "participants": list(r.participants),
                "answered": list(r.answered),
                "failed": dict(r.failed),
                "skipped": list(r.skipped),
                "n_participants": len(r.participants),
                "n_answered": len(r.answered),
                "n_failed": len(r.failed),
                "n_skipped": len(r.skipped),
                "bytes_up": r.bytes_up,
                "bytes_down": r.bytes_down,
                "converged": r.converged,
                "batch_fallback": r.batch_fallback,
                "seconds": r.seconds,
            }
            for k in metric_names:
                col = f"metric:{k}" if k in fixed else k
                row[col] = r.metrics.get(k, np.nan)
            rows.append(row)
        columns = fixed + [f"metric:{k}" if k in fixed else k for k in metric_names]
        return pd.DataFrame(rows, columns=columns).set_index("round")


@register
@dataclass
class Communication:
    """Bytes moved by a run (payload only: the ``nbytes`` of the arrays).

    ``per_client`` maps every client to ``{"bytes_up": ..., "bytes_down": ...}``;
    ``rounds`` is the number of rounds accounted for. Per-round figures are in the
    :class:`History`.
    """

    bytes_up: int = 0
    bytes_down: int = 0
    per_client: dict[ClientId, dict[str, int]] = field(default_factory=dict)
    rounds: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def combine(cls, parts: Iterable[Communication]) -> Communication:
        """The sum of several exchanges: bytes, rounds and per-client bytes added up, and
        ``by_kind`` (kind -> ``{"bytes_up", "bytes_down", "rounds", "runs"}``) merged."""
        total = cls()
        for c in parts:
            if c is None:  # a part that did not communicate
                continue
            total.bytes_up += int(c.bytes_up)
            total.bytes_down += int(c.bytes_down)
            total.rounds += int(c.rounds)
            for client, b in c.per_client.items():
                acc = total.per_client.setdefault(client, {"bytes_up": 0, "bytes_down": 0})
                acc["bytes_up"] += int(b["bytes_up"])
                acc["bytes_down"] += int(b["bytes_down"])
            kinds = c.by_kind or {"unlabelled": {"bytes_up": c.bytes_up, "bytes_down": c.bytes_down,
                                                 "rounds": c.rounds, "runs": 1}}
            for kind, b in kinds.items():
                acc = total.by_kind.setdefault(kind, {"bytes_up": 0, "bytes_down": 0, "rounds": 0, "runs": 0})
                for k in acc:
                    acc[k] += int(b.get(k, 0))
        return total

    def breakdown(self) -> pd.DataFrame:
        """``by_kind`` as a table: one row per kind of exchange (bytes up and down, rounds, runs)."""
        import pandas as pd

        return pd.DataFrame.from_dict(self.by_kind, orient="index",
                                      columns=["bytes_up", "bytes_down", "rounds", "runs"]).rename_axis("kind")

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


@dataclass(repr=False)
class RunResult:
    """The outcome of :func:`run`.

    ``server_state``: the final server state. ``client_states``: the final private state of
    every client (client-list order) -- what stays on the devices during the run; a remote
    backend (Flower) fetches each client's final state once, at the end. ``history``: one :class:`RoundRecord` per completed round
    (including rounds loaded from a checkpoint). ``communication``: byte counters.
    ``rounds``: rounds completed in total. ``converged``: the run stopped because
    ``algorithm.converged`` said so (after at least ``min_rounds``). ``seconds``: wall time
    of this call. ``resumed_from``: rounds loaded from a checkpoint (0 for a fresh run).
    ``lost``: clients whose node stopped answering (remote backends only; client -> why):
    they are recorded as failed in every round after, and their private state, which never
    left them, is missing from ``client_states``.
    """

    server_state: Any
    client_states: dict[ClientId, Any]
    history: History
    communication: Communication
    rounds: int
    converged: bool
    seconds: float
    resumed_from: int = 0
    lost: dict[ClientId, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"RunResult(rounds={self.rounds}, converged={self.converged}, "
            f"clients={len(self.client_states)}, bytes_up={self.communication.bytes_up}, "
            f"bytes_down={self.communication.bytes_down}, seconds={self.seconds:.3g})"
        )


# --------------------------------------------------------------------------- helpers


def describe_exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _qualname(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"{module}.{name}"


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _client_list(data: Any) -> tuple[list[ClientId], Callable[[ClientId], Any]]:
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


def _round_rng(seed: int, rnd: int) -> np.random.Generator:
    return streams.stream(seed, rnd, streams.PARTICIPATION)


# --------------------------------------------------------------------------- participation


class _Participation:
    """Who takes part in each round, as sorted client indices."""

    def __init__(self, spec: Any, ids: list[ClientId], rounds: int):
        self.ids = ids
        self.index = {c: i for i, c in enumerate(ids)}
        n = len(ids)
        self.kind: str
        self.schedule: list[list[int]] | None = None
        if isinstance(spec, (bool, np.bool_)):
            raise TypeError("participation must be a fraction, a count, a callable or a schedule, not a bool")
        if _is_int(spec):
            k = int(spec)
            if not 1 <= k <= n:
                raise ValueError(f"participation count must be between 1 and the {n} clients, got {k}")
            self.kind, self.k, self.desc = "count", k, ("count", k)
        elif isinstance(spec, numbers.Real):
            p = float(spec)
            if not (math.isfinite(p) and 0.0 < p <= 1.0):
                raise ValueError(f"participation fraction must be in (0, 1], got {spec!r}")
            k = min(n, max(1, math.ceil(round(p * n, 9))))
            self.kind, self.k, self.desc = "fraction", k, ("fraction", p)
        elif callable(spec):
            self.kind, self.fn, self.desc = "callable", spec, ("callable", _qualname(spec))
        elif isinstance(spec, (list, tuple, np.ndarray)):
            entries = list(spec)
            if len(entries) < rounds:
                raise ValueError(
                    f"participation schedule has {len(entries)} rounds, fewer than rounds={rounds}"
                )
            self.schedule = [self._canonical(e, f"participation schedule round {r}") for r, e in enumerate(entries)]
            self.kind = "schedule"
            self.desc = ("schedule", tuple(tuple(e) for e in self.schedule))
        else:
            raise TypeError(
                "participation must be a fraction in (0, 1], a count >= 1, a callable "
                f"(round, rng) -> client ids, or a list of lists of client ids (got {type(spec).__name__})"
            )

    def _canonical(self, entry: Any, what: str) -> list[int]:
        if isinstance(entry, (str, bytes, Mapping)) or not isinstance(entry, Iterable):
            raise TypeError(f"{what}: expected a sequence of client ids, got {type(entry).__name__}")
        out: list[int] = []
        unknown = []
        for c in entry:
            if isinstance(c, np.generic):
                c = c.item()
            try:
                i = self.index.get(c)
            except TypeError:
                i = None
            if i is None:
                unknown.append(c)
            else:
                out.append(i)
        if unknown:
            raise ValueError(f"{what}: unknown client id(s) {unknown!r}")
        if len(set(out)) != len(out):
            dups = sorted({self.ids[i] for i in out if out.count(i) > 1}, key=self.index.get)
            raise ValueError(f"{what}: client id(s) listed twice {dups!r}")
        return sorted(out)

    def select(self, rnd: int, rng: np.random.Generator) -> list[int]:
        if self.kind in ("count", "fraction"):
            n = len(self.ids)
            if self.k == n:
                return list(range(n))
            return sorted(int(i) for i in rng.choice(n, size=self.k, replace=False))
        if self.kind == "callable":
            return self._canonical(self.fn(rnd, rng), f"participation callable at round {rnd}")
        assert self.schedule is not None
        return list(self.schedule[rnd])


# --------------------------------------------------------------------------- client side


class Outcome:
    __slots__ = ("reply", "failed", "skipped")

    def __init__(self, reply: Message | None = None, failed: str | None = None, skipped: bool = False):
        self.reply, self.failed, self.skipped = reply, failed, skipped


def client_rng(seed: int, rnd: int, index: int, init: bool = False) -> np.random.Generator:
    """The random stream of client number ``index`` at round ``rnd`` (or at ``init_client``).

    Every backend derives a client's randomness from this function alone, which is what
    makes a run on Flower equal the in-process run.
    """
    return streams.stream(seed, *((streams.INIT, streams.CLIENT, index) if init else (rnd, streams.CLIENT, index)))


def checked_step(algorithm: FederatedAlgorithm, client: ClientId, result: Any) -> tuple[Message, Any]:
    """``(validated reply, new state)`` from what ``client_step`` returned for ``client``;
    raises :class:`ProtocolError` if it is not a valid ``(reply, state)`` pair. Every backend
    commits a client's new state only after this check."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ProtocolError(f"client {client!r}: client_step returned {type(result).__name__}, not (reply, state)")
    return validate_message(result[0], algorithm.reply_keys, who=f"client {client!r}"), result[1]


class _Devices:
    """The client side of the simulation: data and private states live here only.

    Nothing in this object is ever passed to the server side; what leaves it is the
    validated reply of :meth:`run_round`. Other backends (Flower) provide an object with
    the same interface: ``init_states``, ``load_states``, ``states``, ``final_states``,
    ``run_round``, ``close`` and ``lost`` (clients whose node stopped answering).
    """

    lost: dict = {}  # a client in this process never stops answering

    def __init__(self, algorithm: FederatedAlgorithm, ids: list[ClientId], get: Callable[[ClientId], Any], seed: int):
        self.algorithm = algorithm
        self.ids = ids
        self.seed = seed
        self._data = {c: get(c) for c in ids}
        self._states: dict[ClientId, Any] = {}

    def init_states(self) -> None:
        for i, c in enumerate(self.ids):
            self._states[c] = self.algorithm.init_client(c, self._data[c], client_rng(self.seed, 0, i, init=True))

    def close(self) -> None:
        pass

    def load_states(self, states: Mapping[ClientId, Any]) -> None:
        self._states = {c: states[c] for c in self.ids}

    def states(self) -> dict[ClientId, Any]:
        return dict(self._states)

    final_states = states

    def _accept(self, i: int, result: Any) -> Outcome:
        """Check one client's result; commit its new state only if the reply is valid."""
        c = self.ids[i]
        if isinstance(result, BaseException):
            if isinstance(result, SkipRound):
                return Outcome(skipped=True)
            return Outcome(failed=describe_exc(result))
        try:
            clean, new_state = checked_step(self.algorithm, c, result)
        except ProtocolError as exc:
            return Outcome(failed=describe_exc(exc))
        self._states[c] = new_state
        return Outcome(reply=clean)

    def _loop(self, rnd: int, idx: list[int], messages: Mapping[int, Message]) -> list[Any]:
        out: list[Any] = []
        for i in idx:
            c = self.ids[i]
            try:
                out.append(self.algorithm.client_step(
                    messages[i], self._states[c], self._data[c], client_rng(self.seed, rnd, i)
                ))
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
                    [client_rng(self.seed, rnd, i) for i in idx],
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
        return [self._accept(i, r) for i, r in zip(idx, results)], fallback


# --------------------------------------------------------------------------- checkpoints


def _fingerprint(algorithm: FederatedAlgorithm, ids: list[ClientId], seed: int, plan: _Participation) -> dict:
    return {
        "algorithm": _qualname(type(algorithm)),
        "clients": [repr(c) for c in ids],
        "seed": seed,
        "participation": plan.desc,
    }


def _fingerprint_diff(saved: dict, now: dict, completed: int) -> list[str]:
    diffs = []
    if saved.get("algorithm") != now["algorithm"]:
        diffs.append(f"algorithm: checkpoint {saved.get('algorithm')}, this run {now['algorithm']}")
    if saved.get("clients") != now["clients"]:
        a, b = saved.get("clients") or [], now["clients"]
        if set(a) == set(b):
            diffs.append("clients: same clients in a different order")
        else:
            missing = [c for c in a if c not in set(b)]
            extra = [c for c in b if c not in set(a)]
            diffs.append(
                f"clients: checkpoint has {len(a)}, this run {len(b)}; "
                f"missing here {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"new here {extra[:5]}{'...' if len(extra) > 5 else ''}"
            )
    if saved.get("seed") != now["seed"]:
        diffs.append(f"seed: checkpoint {saved.get('seed')}, this run {now['seed']}")
    sp, np_ = saved.get("participation"), now["participation"]
    if sp is None or sp[0] != np_[0]:
        diffs.append(f"participation: checkpoint {sp!r}, this run {np_!r}")
    elif sp[0] == "schedule":
        # only the rounds already run must agree; the schedule may be extended
        a, b = sp[1][:completed], np_[1][:completed]
        if a != b:
            r = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
            diffs.append(f"participation: schedule differs at round {r}")
    elif sp != np_:
        diffs.append(f"participation: checkpoint {sp[0]} {sp[1]!r}, this run {np_[0]} {np_[1]!r}")
    return diffs


def _write_atomic(path: str, payload: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_checkpoint(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            payload = pickle.load(f)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"could not read checkpoint {path!r}: {describe_exc(exc)}") from exc
    if not isinstance(payload, dict) or "format" not in payload:
        raise ValueError(f"{path!r} is not a fedstats checkpoint")
    if payload["format"] != CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {path!r} has format {payload['format']}, this version reads {CHECKPOINT_FORMAT}"
        )
    return payload


# --------------------------------------------------------------------------- round lines
_ROUND_LINES: ContextVar[Any] = ContextVar("fedstats_round_lines", default=None)


@contextmanager
def round_lines(stream=None, *, label: str = "", min_interval: float = 1.0):
    """Within the block, every run left to decide its own progress display (``progress=None``)
    prints one plain line per round to ``stream`` (default ``sys.stderr``) instead of a tqdm
    bar: round, seconds, clients that answered, the server's change metrics, and a last line
    saying whether the run converged. Runs with ``progress=False`` (one-off exchanges) stay
    quiet. Rounds that end less than ``min_interval`` seconds after the last printed line are
    not printed (the first and the last always are), so fast fits do not flood the terminal.
    The command line uses it; a script can too::

        with round_lines(label="hm2"):
            res = HierarchicalLinearModel().fit(data)
    """
    token = _ROUND_LINES.set({"stream": stream, "label": label, "min_interval": float(min_interval)})
    try:
        yield
    finally:
        _ROUND_LINES.reset(token)


class _LinePrinter:
    def __init__(self, cfg, name: str, rounds: int):
        self.stream = cfg["stream"] if cfg["stream"] is not None else sys.stderr
        self.prefix = f"{cfg['label'] or name}: "
        self.min_interval, self.rounds, self.last = cfg["min_interval"], rounds, -math.inf

    def _print(self, text: str) -> None:
        print(self.prefix + text, file=self.stream, flush=True)
        self.last = time.perf_counter()

    def round(self, rec: "RoundRecord", final: bool) -> None:
        if not (final or rec.round == 0 or time.perf_counter() - self.last >= self.min_interval):
            return
        parts = [f"round {rec.round + 1}/{self.rounds}", f"{rec.seconds:.2f} s",
                 f"{len(rec.answered)}/{len(rec.participants)} answered"]
        if rec.failed:
            parts.append(f"{len(rec.failed)} failed")
        shown = 0
        for k, v in rec.metrics.items():
            x = _scalar(v)
            if x is not None and shown < 2:
                parts.append(f"{k} {x:.4g}")
                shown += 1
        self._print(", ".join(parts))

    def end(self, done: int, converged: bool, seconds: float) -> None:
        if converged:
            self._print(f"converged after {done} round(s), {seconds:.1f} s")
        else:
            self._print(f"stopped after {done} round(s) (the limit) without meeting its convergence rule, "
                        f"{seconds:.1f} s")


# --------------------------------------------------------------------------- counting
_LEDGERS: ContextVar[tuple] = ContextVar("fedstats_ledgers", default=())


class Ledger:
    """The exchanges of every :func:`run` inside a :func:`counting` block, in order:
    ``parts`` is a list of :class:`Communication` (each with its ``by_kind``)."""

    def __init__(self):
        self.parts: list[Communication] = []

    def communication(self) -> Communication:
        """Everything counted so far, as one :class:`Communication`."""
        return Communication.combine(self.parts)


def record(communication: Communication) -> None:
    """Add an exchange that happens outside :func:`run` (e.g. a server's reply computed from
    shared statistics) to every open :func:`counting` ledger."""
    for ledger in _LEDGERS.get():
        ledger.parts.append(communication)


@contextmanager
def counting():
    """Count every exchange of the runs inside the block (also those of nested blocks)::

        with counting() as ledger:
            ...  # any number of run() calls: rounds, one-off starts, scoring rounds
        ledger.communication().by_kind

    Models use it so that a result's ``communication`` covers the whole fit."""
    ledger = Ledger()
    token = _LEDGERS.set(_LEDGERS.get() + (ledger,))
    try:
        yield ledger
    finally:
        _LEDGERS.reset(token)


# --------------------------------------------------------------------------- run


def _scalar(v: Any) -> float | None:
    if isinstance(v, (numbers.Real, np.generic)) and not isinstance(v, (bool, np.bool_)):
        return float(v)
    if isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind in "iuf":
        return float(v.reshape(()))
    return None


def run(
    algorithm: FederatedAlgorithm,
    data: Any,
    *,
    rounds: int,
    participation: float | int | Callable[[int, np.random.Generator], Sequence[ClientId]] | Sequence[Sequence[ClientId]] = 1.0,
    seed: int = 0,
    progress: bool | None = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    resume: bool = False,
    batched: bool = True,
    min_rounds: int = 1,
    kind: str | None = None,
) -> RunResult:
    """Run ``algorithm`` over the clients of ``data`` for up to ``rounds`` rounds.

    Parameters
    ----------
    algorithm:
        the :class:`FederatedAlgorithm`.
    data:
        a mapping client id -> that client's data (opaque to the runner), or an object with
        a ``clients`` list and ``__getitem__(client)`` (e.g. ``FederatedData``). The client
        order is kept; a client's position in it is its *index* (used for seeding).
    rounds:
        the total number of rounds (0-based numbering; a resumed run continues up to it).
    participation:
        who takes part in each round: a fraction ``p`` in (0, 1] (``max(1, ceil(p * n))``
        clients drawn uniformly without replacement), an int count ``k >= 1`` (``1.0`` is
        everyone, ``1`` is one client), a callable ``(round, rng) -> client ids``, or a
        schedule: one list of client ids per round (at least ``rounds`` of them). A
        callable or schedule may give an empty list (the round then has no participants).
    seed:
        non-negative int; all randomness of the run derives from it (see module docs).
    progress:
        tqdm bar over rounds: ``True`` shown, ``False`` hidden, ``None`` shown when stderr
        is a terminal.
    checkpoint, checkpoint_every, resume:
        if ``checkpoint`` is a path, a pickle is written there atomically every
        ``checkpoint_every`` completed rounds and at the end (an existing file is
        overwritten unless ``resume``). With ``resume=True`` an existing checkpoint is
        continued from its last completed round (after checking that algorithm class,
        clients, seed and participation match); with no file there, the run starts fresh.
    batched:
        ``True``: one ``algorithm.client_steps`` call per round for all participants (if
        that call raises, the round falls back to ``client_step`` per client and a
        :class:`RuntimeWarning` is issued once); ``False``: ``client_step`` per client.
    min_rounds:
        ``algorithm.converged`` may only stop the run once this many rounds are complete.
    kind:
        the label of this exchange in ``communication.by_kind`` (default: the algorithm's
        class name); every run inside a :func:`counting` block is added to its ledger.
    """
    t_start = time.perf_counter()

    # ---- arguments
    if not isinstance(algorithm, FederatedAlgorithm):
        raise TypeError(f"algorithm must be a FederatedAlgorithm, got {type(algorithm).__name__}")
    if not _is_int(rounds) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    rounds = int(rounds)
    if rounds >= streams.INIT:
        raise ValueError(f"rounds must be below {streams.INIT}")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    seed = int(seed)
    if not _is_int(min_rounds) or min_rounds < 1:
        raise ValueError(f"min_rounds must be an int >= 1, got {min_rounds!r}")
    min_rounds = int(min_rounds)
    if min_rounds > rounds:
        raise ValueError(f"min_rounds={min_rounds} is more than rounds={rounds}")
    if not _is_int(checkpoint_every) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an int >= 1, got {checkpoint_every!r}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {progress!r}")
    if checkpoint is not None:
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise TypeError(f"checkpoint must be a path, got {type(checkpoint).__name__}")
        checkpoint = os.fspath(checkpoint)
    if resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    if not isinstance(algorithm.reply_keys, (tuple, list)) or not all(isinstance(k, str) for k in algorithm.reply_keys):
        raise TypeError(f"{type(algorithm).__name__}.reply_keys must be a tuple of str")

    ids, get = _client_list(data)
    plan = _Participation(participation, ids, rounds)
    fingerprint = _fingerprint(algorithm, ids, seed, plan)
    backend = BACKEND.get()
    devices = _Devices(algorithm, ids, get, seed) if backend is None else backend.client_side(algorithm, ids, data, seed)
    try:
        out = _run(algorithm, devices, ids, plan, fingerprint, seed, rounds, progress, checkpoint,
                   checkpoint_every, resume, batched, min_rounds, t_start)
    finally:
        devices.close()
    c = out.communication
    c.by_kind = {kind or type(algorithm).__name__: {"bytes_up": int(c.bytes_up), "bytes_down": int(c.bytes_down),
                                                     "rounds": int(c.rounds), "runs": 1}}
    record(c)
    return out


def _run(algorithm, devices, ids, plan, fingerprint, seed, rounds, progress, checkpoint, checkpoint_every,
         resume, batched, min_rounds, t_start) -> RunResult:
    # ---- initial or resumed state
    saved = None
    if resume and os.path.exists(checkpoint):
        saved = _read_checkpoint(checkpoint)
        completed = int(saved["completed"])
        diffs = _fingerprint_diff(saved.get("fingerprint", {}), fingerprint, completed)
        if diffs:
            raise ValueError(
                f"checkpoint {checkpoint!r} was written by a different run configuration: "
                + "; ".join(diffs)
                + ". Use resume=False or another checkpoint path to start over."
            )
        if completed > rounds:
            raise ValueError(
                f"checkpoint {checkpoint!r} already holds {completed} rounds, more than rounds={rounds}"
            )
    if saved is not None:
        server_state = saved["server_state"]
        devices.load_states(saved["client_states"])
        history: History = saved["history"]
        comm: Communication = saved["communication"]
        start = completed
    else:
        server_state = algorithm.init_server(list(ids), streams.stream(seed, streams.INIT))
        devices.init_states()
        history = History()
        comm = Communication(per_client={c: {"bytes_up": 0, "bytes_down": 0} for c in ids})
        start = 0
    resumed_from = start

    stopped = bool(history and history[-1].converged and start >= min_rounds)
    done = start
    last_written = start if saved is not None else None

    def write_checkpoint() -> None:
        _write_atomic(checkpoint, {
            "format": CHECKPOINT_FORMAT,
            "completed": done,
            "seed": seed,
            "fingerprint": fingerprint,
            "server_state": server_state,
            "client_states": devices.states(),
            "history": history,
            "communication": comm,
        })

    # ---- rounds
    lines_cfg = _ROUND_LINES.get() if progress is None else None
    lines = _LinePrinter(lines_cfg, type(algorithm).__name__, rounds) if lines_cfg is not None else None
    show = progress if progress is not None else bool(getattr(sys.stderr, "isatty", lambda: False)())
    bar = None
    if lines is None and show and not stopped and start < rounds:
        from tqdm import tqdm

        bar = tqdm(total=rounds, initial=start, desc=f"{type(algorithm).__name__}", unit="round",
                   file=sys.stderr, dynamic_ncols=True)
    n_failed_total = sum(len(r.failed) for r in history)
    warned = False
    try:
        rnd = start
        while not stopped and rnd < rounds:
            t0 = time.perf_counter()
            idx = plan.select(rnd, _round_rng(seed, rnd))

            # server -> clients
            messages: dict[int, Message] = {}
            bytes_down = 0
            for i in idx:
                c = ids[i]
                msg = algorithm.broadcast(server_state, c, rnd)
                if not isinstance(msg, Mapping):
                    raise ProtocolError(
                        f"broadcast to client {c!r} at round {rnd} is a {type(msg).__name__}, not a mapping of arrays"
                    )
                msg = validate_message(msg, tuple(msg.keys()), who=f"server (broadcast to {c!r}, round {rnd})")
                messages[i] = msg
                nb = message_nbytes(msg)
                bytes_down += nb
                comm.per_client[c]["bytes_down"] += nb

            # clients (the only place data and private states are touched)
            outcomes, fallback = devices.run_round(rnd, idx, messages, batched)
            if fallback is not None and not warned:
                warnings.warn(
                    f"{type(algorithm).__name__}.client_steps failed at round {rnd} ({fallback}); "
                    "falling back to client_step per client",
                    RuntimeWarning,
                    stacklevel=2,
                )
                warned = True

            # clients -> server: validated replies only
            replies: dict[ClientId, Message] = {}
            failed: dict[ClientId, str] = {}
            skipped: list[ClientId] = []
            bytes_up = 0
            for i, out in zip(idx, outcomes):
                c = ids[i]
                if out.reply is not None:
                    replies[c] = out.reply
                    nb = message_nbytes(out.reply)
                    bytes_up += nb
                    comm.per_client[c]["bytes_up"] += nb
                elif out.skipped:
                    skipped.append(c)
                else:
                    failed[c] = out.failed or "unknown failure"
            answered = list(replies)

            step = algorithm.server_step(server_state, replies, rnd)
            if not (isinstance(step, tuple) and len(step) == 2):
                raise TypeError(
                    f"{type(algorithm).__name__}.server_step must return (server_state, metrics), "
                    f"got {type(step).__name__}"
                )
            server_state, metrics = step
            if metrics is None:
                metrics = {}
            if not isinstance(metrics, Mapping):
                raise TypeError(
                    f"{type(algorithm).__name__}.server_step metrics must be a mapping, got {type(metrics).__name__}"
                )
            metrics = dict(metrics)
            is_converged = bool(algorithm.converged(server_state, metrics))

            comm.bytes_up += bytes_up
            comm.bytes_down += bytes_down
            comm.rounds += 1
            history._append(RoundRecord(
                round=rnd,
                participants=[ids[i] for i in idx],
                answered=answered,
                failed=failed,
                skipped=skipped,
                bytes_up=bytes_up,
                bytes_down=bytes_down,
                metrics=metrics,
                converged=is_converged,
                batch_fallback=fallback,
                seconds=time.perf_counter() - t0,
            ))
            done = rnd + 1
            stopped = is_converged and done >= min_rounds

            if checkpoint is not None and done % checkpoint_every == 0:
                write_checkpoint()
                last_written = done

            if lines is not None:
                lines.round(history[-1], final=stopped or done >= rounds)
            if bar is not None:
                n_failed_total += len(failed)
                post: dict[str, Any] = {}
                for k, v in metrics.items():
                    s = _scalar(v)
                    if s is not None:
                        post[str(k)] = f"{s:.4g}"
                        if len(post) == 2:
                            break
                post["failed"] = n_failed_total
                bar.set_postfix(post, refresh=False)
                bar.update(1)
            rnd += 1
    finally:
        if bar is not None:
            bar.close()

    if checkpoint is not None and last_written != done:
        write_checkpoint()
    if lines is not None:
        lines.end(done, stopped, time.perf_counter() - t_start)

    return RunResult(
        server_state=server_state,
        client_states=devices.final_states(),
        history=history,
        communication=comm,
        rounds=done,
        converged=stopped,
        seconds=time.perf_counter() - t_start,
        resumed_from=resumed_from,
        lost=dict(devices.lost),
    )
