"""Federated runtime of fedstats: the protocol every algorithm speaks, and a simulator.

* :mod:`~fedstats.federation.protocol` -- :class:`FederatedAlgorithm` (a client step and a
  server step over named numeric arrays), :data:`Message`, :class:`SkipRound`,
  :class:`ProtocolError`, :func:`validate_message`, :func:`message_nbytes`;
* :mod:`~fedstats.federation.runner` -- :func:`run`, which simulates the server and all
  clients in one process (keeping client data and private states on the client side; the
  server only ever receives validated reply arrays) and returns a :class:`RunResult` with
  the final states, a per-round :class:`History` of :class:`RoundRecord` and the
  :class:`Communication` counters. It supports partial participation, client failures,
  vectorised (batched) client steps, progress bars and checkpoint/resume;
* :mod:`~fedstats.federation.backend` -- :func:`use_backend`: where the client side of every
  run executes (this process, or Flower: :mod:`fedstats.federation.flower`, extra
  ``fedstats[flower]``). Every model's ``fit`` takes ``backend=`` too;
* :mod:`~fedstats.federation.policy` -- :class:`NodePolicy`: what a node's owner lets it
  compute and release (minimum rows, rows per parameter, algorithms and option ranges).

What the server receives in every exchange of every model is declared with the model
(:mod:`fedstats.registry`), and shown on the threat-model page.
"""

from .backend import current_backend, use_backend
from .moments import federated_moments
from .policy import NodePolicy, PolicyRefusal
from .progress import round_lines
from .protocol import (
    ClientDisconnected,
    ClientRelease,
    FederatedAlgorithm,
    Message,
    ProtocolError,
    Replies,
    SkipRound,
    client_function,
    message_nbytes,
    validate_message,
)
from .records import Communication, History, Ledger, RoundRecord, RunResult, counting, not_in_fit
from .runner import run

__all__ = [
    "federated_moments",
    "FederatedAlgorithm",
    "ClientDisconnected",
    "ClientRelease",
    "Message",
    "SkipRound",
    "ProtocolError",
    "Replies",
    "validate_message",
    "message_nbytes",
    "client_function",
    "use_backend",
    "current_backend",
    "run",
    "round_lines",
    "counting",
    "not_in_fit",
    "Ledger",
    "RunResult",
    "History",
    "RoundRecord",
    "Communication",
    "NodePolicy",
    "PolicyRefusal",
]
