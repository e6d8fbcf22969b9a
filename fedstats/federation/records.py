"""What a run records and returns: one :class:`RoundRecord` per round in a :class:`History`,
the bytes moved (:class:`Communication`), the :class:`RunResult`, and the ledgers that add up
every run of a fit (:func:`counting`, :func:`record`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..result_file import register
from .protocol import ClientId

if TYPE_CHECKING:
    import pandas as pd


@register
@dataclass
class RoundRecord:
    """What happened in one round (0-based ``round``).

    ``participants`` were sent the broadcast; ``answered`` had their reply accepted and
    handed to ``server_step``; ``failed`` maps a client to ``"ExcType: message"``;
    ``skipped`` raised :class:`SkipRound`, with the reason each gave in ``skip_reasons``
    (client -> message). All lists follow the client-list order.
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
    skip_reasons: dict[ClientId, str] = field(default_factory=dict)


@register
class History(Sequence[RoundRecord]):
    """The rounds of a run, in order: a read-only list of :class:`RoundRecord`."""

    def __init__(self, records: Iterable[RoundRecord] = ()) -> None:
        self._records: list[RoundRecord] = list(records)

    def append(self, record: RoundRecord) -> None:
        """Add the record of a completed round (the runtime does, once per round)."""
        self._records.append(record)

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, i: int) -> RoundRecord: ...

    @overload
    def __getitem__(self, i: slice) -> History: ...

    def __getitem__(self, i: int | slice) -> RoundRecord | History:
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

    def to_dataframe(self) -> pd.DataFrame:
        """One row per round (indexed by ``round``), as a :class:`pandas.DataFrame`.

        Columns: ``participants``, ``answered``, ``failed``, ``skipped`` (the lists/dict),
        ``skip_reasons`` (skipped client -> its reason),
        their counts ``n_participants``, ``n_answered``, ``n_failed``, ``n_skipped``,
        ``bytes_up``, ``bytes_down``, ``converged``, ``batch_fallback``, ``seconds``,
        then one column per metric (prefixed ``metric:`` if its name clashes).
        """
        import pandas as pd

        fixed = [
            "round",
            "participants",
            "answered",
            "failed",
            "skipped",
            "skip_reasons",
            "n_participants",
            "n_answered",
            "n_failed",
            "n_skipped",
            "bytes_up",
            "bytes_down",
            "converged",
            "batch_fallback",
            "seconds",
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
                "skip_reasons": dict(getattr(r, "skip_reasons", {})),
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
            kinds = c.by_kind or {
                "unlabelled": {"bytes_up": c.bytes_up, "bytes_down": c.bytes_down, "rounds": c.rounds, "runs": 1}
            }
            for kind, b in kinds.items():
                acc = total.by_kind.setdefault(kind, {"bytes_up": 0, "bytes_down": 0, "rounds": 0, "runs": 0})
                for k in acc:
                    acc[k] += int(b.get(k, 0))
        return total

    def breakdown(self) -> pd.DataFrame:
        """``by_kind`` as a table: one row per kind of exchange (bytes up and down, rounds, runs)."""
        import pandas as pd

        return pd.DataFrame.from_dict(
            self.by_kind, orient="index", columns=["bytes_up", "bytes_down", "rounds", "runs"]
        ).rename_axis("kind")

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


@dataclass(repr=False)
class RunResult:
    """The outcome of :func:`run`.

    ``server_state``: the final server state. ``client_states``: the final private state of
    every client (client-list order) -- what stays on the clients during the run; a remote
    backend (Flower) fetches each client's final state once, at the end. ``history``: one :class:`RoundRecord` per completed round
    (including rounds loaded from a checkpoint). ``communication``: byte counters.
    ``rounds``: rounds completed in total. ``converged``: the run stopped because
    ``algorithm.converged`` said so (after at least ``min_rounds``). ``seconds``: wall time
    of this call. ``resumed_from``: rounds loaded from a checkpoint (0 for a fresh run).
    ``lost``: clients whose node stopped answering (remote backends only; client -> why):
    they are recorded as failed in every round after, and their private state, which never
    left them, is missing from ``client_states``. ``privacy``: the rounds' releases when the
    algorithm is differentially private (:attr:`FederatedAlgorithm.privacy`).
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
    #: the run's :class:`~fedstats.privacy.PrivacyLedger` (one release per round) when the
    #: algorithm is differentially private, else ``None``
    privacy: Any = None
    #: each client's influence at the last round it answered: ``(shift in standard errors,
    #: relative to a client of its size)`` (:mod:`fedstats.federation.influence`; empty when
    #: the algorithm defines none, under secure aggregation and under differential privacy)
    influence: dict[ClientId, tuple[float, float]] = field(default_factory=dict)
    #: for an algorithm whose replies are changes (``cumulative_replies``), the sum of every
    #: reply the server summed from each client, where it saw them (as ``influence``)
    sent: dict[ClientId, dict[str, np.ndarray]] = field(default_factory=dict)
    #: the run's own seed (:func:`fedstats.streams.run_seed` of the fit's seed, the run's kind and
    #: occurrence): its clients' streams, and a client result computed on a node, derive from it
    seed: int = 0

    def __repr__(self) -> str:
        return (
            f"RunResult(rounds={self.rounds}, converged={self.converged}, "
            f"clients={len(self.client_states)}, bytes_up={self.communication.bytes_up}, "
            f"bytes_down={self.communication.bytes_down}, seconds={self.seconds:.3g})"
        )


def not_in_fit(
    history: Iterable[RoundRecord], clients: Iterable[ClientId], lost: Mapping[ClientId, str] | None = None
) -> dict[ClientId, str]:
    """The clients of ``clients`` that are not in a run's fit, each with the reason: its node
    left the run (``lost``, also a node whose policy refused the run), or it never answered a
    round of ``history`` (every step it was asked for failed or was skipped, or it was never
    asked). Models report these clients without numbers (``FederatedResult.excluded``)."""
    lost = dict(lost or {})
    answered: set[ClientId] = set()
    asked: dict[ClientId, int] = {}
    last: dict[ClientId, str] = {}
    for rec in history:
        answered.update(rec.answered)
        for c in rec.participants:
            asked[c] = asked.get(c, 0) + 1
        reasons = getattr(rec, "skip_reasons", {})  # records written before reasons were kept have none
        for c in rec.skipped:
            last[c] = f"its step was skipped ({reasons.get(c) or 'no reason given'})"
        for c, why in rec.failed.items():
            last[c] = f"its step failed ({why})"
    out: dict[ClientId, str] = {}
    for c in clients:
        if c in lost:
            out[c] = f"its node left the run ({lost[c]})"
        elif c not in answered:
            n = asked.get(c, 0)
            if not n:
                out[c] = "it was never asked to take part"
            else:
                rounds = "the one round" if n == 1 else f"the {n} rounds"
                out[c] = f"it answered none of {rounds} it was asked to take part in: {last.get(c, 'no answer')}"
    return out


_LEDGERS: ContextVar[tuple[Ledger, ...]] = ContextVar("fedstats_ledgers", default=())


class Ledger:
    """The exchanges of every :func:`run` inside a :func:`counting` block, in order:
    ``parts`` is a list of :class:`Communication` (each with its ``by_kind``); and the clients
    that dropped out of the fit so far, ``excluded`` (client -> reason, see :func:`exclude`)."""

    def __init__(self) -> None:
        self.parts: list[Communication] = []
        self.excluded: dict[ClientId, str] = {}
        #: the clients' influence in the last run that measured it, and its unit
        #: (:mod:`fedstats.federation.influence`; the model's result reports it)
        self.influence: tuple[dict[ClientId, tuple[float, float]], str] | None = None
        #: how many runs of each kind the fit has started (each run's streams: its occurrence)
        self.runs: dict[str, int] = {}

    def communication(self) -> Communication:
        """Everything counted so far, as one :class:`Communication`."""
        return Communication.combine(self.parts)


def record(communication: Communication) -> None:
    """Add an exchange that happens outside :func:`run` (e.g. a server's reply computed from
    shared statistics) to every open :func:`counting` ledger."""
    for ledger in _LEDGERS.get():
        ledger.parts.append(communication)


def record_influence(values: Mapping[ClientId, tuple[float, float]], unit: str) -> None:
    """Keep a run's measured influence of each client on every open :func:`counting` ledger
    (a later run of the fit replaces it: a refit's is the one that counts)."""
    for ledger in _LEDGERS.get():
        ledger.influence = (dict(values), unit)


def exclude(clients: Mapping[ClientId, str]) -> None:
    """Record that the clients of ``clients`` (client -> reason) dropped out of the fit in
    progress: every open :func:`counting` ledger keeps them, and the later exchanges of the
    fit do not ask them again (:func:`excluded_now`). Outside a fit this does nothing."""
    for ledger in _LEDGERS.get():
        for c, why in clients.items():
            ledger.excluded.setdefault(c, why)


def run_occurrence(kind: str) -> int:
    """How many runs of kind ``kind`` the fit in progress started before this one (the
    outermost open :func:`counting` ledger counts them; 0 outside a fit): the runs of one kind
    in one fit draw from different streams (:func:`fedstats.streams.run_seed`)."""
    ledgers = _LEDGERS.get()
    if not ledgers:
        return 0
    n = ledgers[0].runs.get(kind, 0)
    ledgers[0].runs[kind] = n + 1
    return n


def excluded_now() -> dict[ClientId, str]:
    """The clients that dropped out of the fit in progress (the innermost open
    :func:`counting` ledger), each with its reason; empty outside a fit."""
    ledgers = _LEDGERS.get()
    return dict(ledgers[-1].excluded) if ledgers else {}


def in_fit() -> bool:
    """Whether a fit's ledger is open (:func:`counting`): failed clients then drop out of the
    fit with a reason instead of stopping it."""
    return bool(_LEDGERS.get())


@contextmanager
def counting() -> Iterator[Ledger]:
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
