"""What a run records and returns: one :class:`RoundRecord` per round in a :class:`History`,
the bytes moved (:class:`Communication`), the :class:`RunResult`, and the ledgers that add up
every run of a fit (:func:`counting`, :func:`record`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..results import register
from .protocol import ClientId

if TYPE_CHECKING:
    import pandas as pd


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
    every client (client-list order) -- what stays on the devices during the run; a remote
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

    def __repr__(self) -> str:
        return (
            f"RunResult(rounds={self.rounds}, converged={self.converged}, "
            f"clients={len(self.client_states)}, bytes_up={self.communication.bytes_up}, "
            f"bytes_down={self.communication.bytes_down}, seconds={self.seconds:.3g})"
        )


_LEDGERS: ContextVar[tuple[Ledger, ...]] = ContextVar("fedstats_ledgers", default=())


class Ledger:
    """The exchanges of every :func:`run` inside a :func:`counting` block, in order:
    ``parts`` is a list of :class:`Communication` (each with its ``by_kind``)."""

    def __init__(self) -> None:
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
