"""In-process runtime: simulate the server and every client of a :class:`FederatedAlgorithm`.

:func:`run` plays both sides in one Python process, but keeps them apart the way a real
deployment would:

* the *client side* (:class:`~fedstats.federation.client_side.ClientSide`) holds each client's data and private state; they
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
* Randomness (:mod:`fedstats.streams`): a run draws under its own seed
  ``s = run_seed(seed, kind, occurrence)`` (``kind=None``: the empty kind); round ``r`` samples its participants from the stream
  ``participants`` of ``r``, client number ``i`` (its position in the client list) steps with
  ``client step`` of ``(r, i)``, ``init_server`` gets ``server init`` and ``init_client`` of
  client ``i`` ``client init`` of ``i``. Results therefore do not depend on the order
  participants are listed in, on ``batched``, or on whether the run was resumed from a
  checkpoint, and two runs of different kinds in one fit share no stream.
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
* Inside a model's fit (a :func:`~fedstats.federation.records.counting` ledger is open), a
  client that answers no round of a run, or whose node is lost, drops out of the fit: the
  ledger records it with the reason (:func:`~fedstats.federation.records.not_in_fit`), the
  fit's later runs do not ask it, and the result names it (``FederatedResult.excluded``).
  A differentially private run still asks every client (its noise shares count on them).
* ``server_step`` is called every round, also when no client answered (with an empty
  mapping), so that every round has its metrics.
* Communication: ``bytes_down`` counts the broadcast sent to every participant (failed
  ones included); ``bytes_up`` counts accepted replies only. A rejected reply is modelled
  as caught by the protocol check on the client before it is sent, so it costs nothing
  (its size is not even defined when it holds non-arrays).
* Checkpoints are pickles (only resume from files you trust). The data is not in them
  and is not fingerprinted; the algorithm is fingerprinted by class name only (not its
  hyper-parameters), a callable participation by its qualified name only.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .. import streams
from ..estimator import is_int
from .checkpoints import CHECKPOINT_FORMAT, fingerprint, fingerprint_diff, read_checkpoint, write_atomic
from .client_side import ClientSide, InProcessClients, client_list
from .influence import Influence, checked_sums
from .participation import Participation, round_rng
from .progress import RoundDisplay
from .protocol import ClientId, FederatedAlgorithm, Message, ProtocolError, Replies, message_nbytes, validate_message
from .records import (
    Communication,
    History,
    RoundRecord,
    RunResult,
    exclude,
    excluded_now,
    in_fit,
    not_in_fit,
    record,
    record_influence,
    run_occurrence,
)

__all__ = ["run", "RunResult", "History", "RoundRecord", "Communication"]

#: the backend that runs the client side of :func:`run` (``None``: this process); set by
#: :func:`fedstats.federation.use_backend`
BACKEND: ContextVar[Any] = ContextVar("fedstats_backend", default=None)


def run(
    algorithm: FederatedAlgorithm,
    data: Any,
    *,
    rounds: int,
    participation: float
    | int
    | Callable[[int, np.random.Generator], Sequence[ClientId]]
    | Sequence[Sequence[ClientId]] = 1.0,
    seed: int = 0,
    progress: bool | None = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    resume: bool = False,
    batched: bool = True,
    min_rounds: int = 1,
    kind: str | None = None,
    privacy_ledger: Any = None,
    drop_silent: bool = True,
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
        if ``checkpoint`` is a path, a checkpoint (the safe result format, never a pickle) is
        written there atomically every
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
    privacy_ledger:
        a :class:`~fedstats.privacy.PrivacyLedger` that collects the releases of this run
        when ``algorithm.privacy`` is set (a fit passes one ledger to all its runs); the
        run's own releases are also in ``RunResult.privacy``.
    drop_silent:
        inside a model's fit, whether a client that answers none of this run's rounds drops
        out of the fit (``False`` for an exchange whose failures say nothing about the client,
        e.g. a candidate point at which its computation breaks); a lost node always does.
    """
    t_start = time.perf_counter()

    # ---- arguments
    if not isinstance(algorithm, FederatedAlgorithm):
        raise TypeError(f"algorithm must be a FederatedAlgorithm, got {type(algorithm).__name__}")
    if not is_int(rounds) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    rounds = int(rounds)
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    seed = int(seed)
    if not is_int(min_rounds) or min_rounds < 1:
        raise ValueError(f"min_rounds must be an int >= 1, got {min_rounds!r}")
    min_rounds = int(min_rounds)
    if min_rounds > rounds:
        raise ValueError(f"min_rounds={min_rounds} is more than rounds={rounds}")
    if not is_int(checkpoint_every) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an int >= 1, got {checkpoint_every!r}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {progress!r}")
    if checkpoint is not None:
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise TypeError(f"checkpoint must be a path, got {type(checkpoint).__name__}")
        checkpoint = os.fspath(checkpoint)
    if resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    dp = algorithm.privacy
    if dp is not None:
        from ..privacy import DifferentialPrivacy, PrivacyLedger

        if not isinstance(dp, DifferentialPrivacy):
            raise TypeError(
                f"{type(algorithm).__name__}.privacy must be a DifferentialPrivacy, got {type(dp).__name__}"
            )
        if set(algorithm.reply_keys) != set(algorithm.summed_keys):
            raise TypeError(
                f"{type(algorithm).__name__} releases {sorted(set(algorithm.reply_keys) - set(algorithm.summed_keys))} "
                "per client: under differential privacy every reply array must be a declared sum"
            )
        if privacy_ledger is not None and not isinstance(privacy_ledger, PrivacyLedger):
            raise TypeError(f"privacy_ledger must be a PrivacyLedger, got {type(privacy_ledger).__name__}")
        if privacy_ledger is not None and not resume:
            privacy_ledger.claim(seed)  # a run of the same fit with the same seed would repeat the noise
    if not isinstance(algorithm.reply_keys, (tuple, list)) or not all(isinstance(k, str) for k in algorithm.reply_keys):
        raise TypeError(f"{type(algorithm).__name__}.reply_keys must be a tuple of str")
    extra = [k for k in algorithm.summed_keys if k not in algorithm.reply_keys]
    if extra:
        raise TypeError(f"{type(algorithm).__name__}.summed_keys names arrays that are not reply_keys: {extra}")

    # this run's own streams: its kind (a run without one: the empty kind, whatever its
    # algorithm, so that two implementations of one protocol draw alike) and occurrence
    own = streams.run_seed(seed, kind or "", run_occurrence(kind or ""))
    ids, get = client_list(data)
    plan = Participation(participation, ids, rounds)
    if dp is not None and not (plan.kind in ("count", "fraction") and plan.k == len(ids)):
        raise ValueError(
            "differential privacy needs every client in every round (participation=1.0): each "
            "client adds 1/n of the noise, and the privacy accounting assumes no subsampling"
        )
    backend = BACKEND.get()
    client_side: ClientSide = (
        InProcessClients(algorithm, ids, get, own)
        if backend is None
        else backend.client_side(algorithm, ids, data, own)
    )
    plan_rounds = getattr(client_side, "plan_rounds", None)  # a remote client side tells its nodes the budget
    if callable(plan_rounds):
        plan_rounds(rounds)
    try:
        out = _run(
            _Run(
                algorithm=algorithm,
                client_side=client_side,
                ids=ids,
                plan=plan,
                seed=seed,
                own_seed=own,
                rounds=rounds,
                min_rounds=min_rounds,
                batched=batched,
                progress=progress,
                checkpoint=checkpoint,
                checkpoint_every=checkpoint_every,
                resume=resume,
                t_start=t_start,
                kind=kind or type(algorithm).__name__,
                # clients that dropped out of the fit in progress are not asked again (a
                # differentially private run asks everyone: its noise shares count on it)
                skip=frozenset() if dp is not None else frozenset(excluded_now()) & frozenset(ids),
                rows=getattr(data, "n_obs", None),
            )
        )
        if in_fit():  # who is not in this exchange drops out of the fit, with the reason
            gone = not_in_fit(out.history, [c for c in ids if c not in excluded_now()], out.lost)
            exclude(gone if drop_silent else {c: why for c, why in gone.items() if c in out.lost})
        if privacy_ledger is not None and out.privacy is not None:
            privacy_ledger.extend(out.privacy)
        if out.influence:  # the fit's result reports it (fedstats.results.counted)
            record_influence(out.influence, algorithm.influence_unit)
    finally:
        client_side.close()
    c = out.communication
    c.by_kind = {
        kind or type(algorithm).__name__: {
            "bytes_up": int(c.bytes_up),
            "bytes_down": int(c.bytes_down),
            "rounds": int(c.rounds),
            "runs": 1,
        }
    }
    record(c)
    return out


@dataclass
class _Run:
    """One run's checked arguments and its client side."""

    algorithm: FederatedAlgorithm
    client_side: ClientSide
    ids: list[ClientId]
    plan: Participation
    seed: int
    rounds: int
    min_rounds: int
    batched: bool
    progress: bool | None
    checkpoint: str | None
    checkpoint_every: int
    resume: bool
    t_start: float
    #: the exchange's label in ``communication.by_kind``
    kind: str
    #: clients never asked in this run (they dropped out of the fit before it)
    skip: frozenset = frozenset()
    #: the run's own seed (:func:`fedstats.streams.run_seed`): every stream of the run derives
    #: from it; ``seed`` is the one given (checkpoints record it)
    own_seed: int = 0
    #: each client's declared number of rows (``data.n_obs``), where the data say
    rows: Mapping[ClientId, int] | None = None

    @cached_property
    def fingerprint(self) -> dict:
        """The run's configuration as a checkpoint records it (computed once per run)."""
        return fingerprint(self.algorithm, self.ids, self.seed, self.plan)

    @property
    def name(self) -> str:
        return type(self.algorithm).__name__


@dataclass
class _State:
    """Where a run stands: the server state, the history and byte counters so far, and the
    number of completed rounds."""

    server: Any
    history: History
    comm: Communication
    done: int
    resumed_from: int
    from_checkpoint: bool = False
    stopped: bool = False
    #: the releases of this run (when the algorithm is differentially private)
    privacy: Any = None
    #: each client's influence (when the algorithm defines leave_one_out; not under secure
    #: aggregation or differential privacy)
    influence: Influence | None = None


def _start(r: _Run) -> _State:
    """A fresh state, or the one of the checkpoint a resumed run continues."""
    if r.resume and r.checkpoint is not None and os.path.exists(r.checkpoint):  # run() checks resume needs a path
        saved = read_checkpoint(r.checkpoint)
        completed = int(saved["completed"])
        diffs = fingerprint_diff(saved.get("fingerprint", {}), r.fingerprint, completed)
        if diffs:
            raise ValueError(
                f"checkpoint {r.checkpoint!r} was written by a different run configuration: "
                + "; ".join(diffs)
                + ". Use resume=False or another checkpoint path to start over."
            )
        if completed > r.rounds:
            raise ValueError(
                f"checkpoint {r.checkpoint!r} already holds {completed} rounds, more than rounds={r.rounds}"
            )
        r.client_side.load_states(saved["client_states"])
        history: History = saved["history"]
        state = _State(saved["server_state"], history, saved["communication"], completed, completed, True)
        state.privacy = saved.get("privacy", _new_ledger(r))
        # a client's replies before the checkpoint are not kept: changes (cumulative replies) cannot be measured
        state.influence = None if r.algorithm.cumulative_replies else _new_influence(r)
        state.stopped = bool(history and history[-1].converged and completed >= r.min_rounds)
        return state
    server = r.algorithm.init_server(list(r.ids), streams.stream(r.own_seed, "server init"))
    r.client_side.init_states(r.skip)
    comm = Communication(per_client={c: {"bytes_up": 0, "bytes_down": 0} for c in r.ids})
    return _State(server, History(), comm, 0, 0, privacy=_new_ledger(r), influence=_new_influence(r))


def _new_influence(r: _Run) -> Influence | None:
    alg = r.algorithm
    defined = type(alg).leave_one_out is not FederatedAlgorithm.leave_one_out
    if not defined or alg.privacy is not None or getattr(r.client_side, "summed_securely", False):
        return None
    return Influence(alg, r.rows)


def _new_ledger(r: _Run) -> Any:
    dp = r.algorithm.privacy
    if dp is None:
        return None
    from ..privacy import PrivacyLedger

    return PrivacyLedger(dp.accountant)


def _write_checkpoint(r: _Run, s: _State) -> None:
    assert r.checkpoint is not None  # only called with a checkpoint path
    write_atomic(
        r.checkpoint,
        {
            "format": CHECKPOINT_FORMAT,
            "completed": s.done,
            "seed": r.seed,
            "fingerprint": r.fingerprint,
            "server_state": s.server,
            "client_states": r.client_side.states(),
            "history": s.history,
            "communication": s.comm,
            "privacy": s.privacy,
        },
    )


def _broadcast(r: _Run, s: _State, rnd: int, idx: list[int]) -> tuple[dict[int, Message], int]:
    """The validated broadcast to every participant, and the bytes sent down."""
    messages: dict[int, Message] = {}
    bytes_down = 0
    seen: dict[int, tuple[Any, np.ndarray]] = {}  # one checked copy of an array broadcast to many
    for i in idx:
        c = r.ids[i]
        msg = r.algorithm.broadcast(s.server, c, rnd)
        if not isinstance(msg, Mapping):
            raise ProtocolError(
                f"broadcast to client {c!r} at round {rnd} is a {type(msg).__name__}, not a mapping of arrays"
            )
        msg = validate_message(msg, tuple(msg.keys()), who=f"server (broadcast to {c!r}, round {rnd})", seen=seen)
        messages[i] = msg
        nb = message_nbytes(msg)
        bytes_down += nb
        s.comm.per_client[c]["bytes_down"] += nb
    return messages, bytes_down


def _server_step(r: _Run, s: _State, replies: Replies, rnd: int) -> dict[str, Any]:
    """Run ``server_step`` on the accepted replies; returns its metrics (checked)."""
    step = r.algorithm.server_step(s.server, replies, rnd)
    if not (isinstance(step, tuple) and len(step) == 2):
        raise TypeError(f"{r.name}.server_step must return (server_state, metrics), got {type(step).__name__}")
    s.server, metrics = step
    if metrics is None:
        metrics = {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{r.name}.server_step metrics must be a mapping, got {type(metrics).__name__}")
    return dict(metrics)


def _round(r: _Run, s: _State, rnd: int) -> tuple[RoundRecord, str | None]:
    """One round: broadcast, client steps, validated replies to the server step."""
    t0 = time.perf_counter()
    idx = r.plan.select(rnd, round_rng(r.own_seed, rnd))
    if r.skip:
        idx = [i for i in idx if r.ids[i] not in r.skip]
    messages, bytes_down = _broadcast(r, s, rnd, idx)
    # clients (the only place data and private states are touched)
    outcomes, fallback = r.client_side.run_round(rnd, idx, messages, r.batched)
    # clients -> server: validated replies only
    replies: dict[ClientId, Message] = {}
    failed: dict[ClientId, str] = {}
    skipped: list[ClientId] = []
    skip_reasons: dict[ClientId, str] = {}
    bytes_up = 0
    for i, out in zip(idx, outcomes):
        c = r.ids[i]
        if out.reply is not None:
            replies[c] = out.reply
            nb = message_nbytes(out.reply)
            bytes_up += nb
            s.comm.per_client[c]["bytes_up"] += nb
        elif out.skipped is not None:
            skipped.append(c)
            skip_reasons[c] = out.skipped
        else:
            failed[c] = out.failed or "unknown failure"
    secure_sums = (
        getattr(r.client_side, "secure_sums", None) if getattr(r.client_side, "summed_securely", False) else None
    )
    if secure_sums is not None and replies:
        # the declared sums reach the server only as a sum (secure aggregation on the backend)
        sums, dropped, nbytes = secure_sums(rnd, list(replies))
        for c, why in dropped.items():
            del replies[c]
            failed[c] = why
        for c in replies:
            s.comm.per_client[c]["bytes_up"] += nbytes
        bytes_up += nbytes * len(replies)
        summed = Replies(replies, sums)
    else:
        # blamed on their senders: a wrong shape, a cross-product no rows give, an overflow
        summed, broken = checked_sums(
            r.algorithm.summed_keys, replies, r.algorithm.psd_keys, r.algorithm.symmetric_keys
        )
        while s.influence is not None:  # a reply no data could produce: refused, the most absurd first
            absurd = s.influence.update(replies, summed.sums)
            if not absurd:
                break
            for c in absurd:
                del replies[c]
            summed = checked_sums(r.algorithm.summed_keys, replies, r.algorithm.psd_keys, r.algorithm.symmetric_keys)[0]
            broken.update(absurd)
        if broken:
            failed.update(broken)
            reject = getattr(r.client_side, "reject", None)
            if callable(reject):  # their steps did not count: their states go back
                reject(list(broken))
    summed.declined = {**{c: f"skipped: {skip_reasons[c]}" for c in skipped}, **failed}
    dp = r.algorithm.privacy
    if dp is not None and replies:
        # the Gaussian mechanism on this round's sums: central noise added here, and the noise
        # the release actually carries recorded (fewer answers, or no secure aggregation, with
        # client-side noise: less)
        summed.sums = dp.server_sums(summed.sums, streams.stream(r.own_seed, "dp noise", rnd))
        secure = bool(getattr(r.client_side, "summed_securely", False))
        z = dp.effective_noise_multiplier(n_clients=len(idx), n_answered=len(replies), secure_aggregation=secure)
        s.privacy.record(r.kind, z)
    metrics = _server_step(r, s, summed, rnd)
    is_converged = bool(r.algorithm.converged(s.server, metrics))
    s.comm.bytes_up += bytes_up
    s.comm.bytes_down += bytes_down
    s.comm.rounds += 1
    rec = RoundRecord(
        round=rnd,
        participants=[r.ids[i] for i in idx],
        answered=list(replies),
        failed=failed,
        skipped=skipped,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        metrics=metrics,
        converged=is_converged,
        batch_fallback=fallback,
        seconds=time.perf_counter() - t0,
        skip_reasons=skip_reasons,
    )
    return rec, fallback


def _run(r: _Run) -> RunResult:
    s = _start(r)
    last_written = s.done if s.from_checkpoint else None
    display = RoundDisplay(
        r.progress,
        name=r.name,
        rounds=r.rounds,
        start=s.done,
        active=not s.stopped and s.done < r.rounds,
        failed_so_far=sum(len(rec.failed) for rec in s.history),
    )
    warned = False
    try:
        rnd = s.done
        while not s.stopped and rnd < r.rounds:
            rec, fallback = _round(r, s, rnd)
            if fallback is not None and not warned:
                warnings.warn(
                    f"{r.name}.client_steps failed at round {rnd} ({fallback}); falling back to client_step per client",
                    RuntimeWarning,
                    stacklevel=3,
                )
                warned = True
            s.history.append(rec)
            s.done = rnd + 1
            s.stopped = rec.converged and s.done >= r.min_rounds
            if r.checkpoint is not None and s.done % r.checkpoint_every == 0:
                _write_checkpoint(r, s)
                last_written = s.done
            display.round(rec, final=s.stopped or s.done >= r.rounds)
            rnd += 1
    finally:
        display.close()
    if r.checkpoint is not None and last_written != s.done:
        _write_checkpoint(r, s)
    display.end(s.done, s.stopped, time.perf_counter() - r.t_start)
    return RunResult(
        server_state=s.server,
        client_states=r.client_side.final_states({c: r.algorithm.final_message(s.server, c) for c in r.ids}),
        history=s.history,
        communication=s.comm,
        rounds=s.done,
        converged=s.stopped,
        seconds=time.perf_counter() - r.t_start,
        resumed_from=s.resumed_from,
        lost=dict(r.client_side.lost),
        privacy=s.privacy,
        influence=dict(s.influence.values) if s.influence is not None else {},
        sent=dict(s.influence.own) if s.influence is not None else {},
        seed=r.own_seed,
    )
