"""One-off federated rounds: every client answers one question about its own data.

Used for the starts, checks and scores around the iterative algorithms (a federated
k-means start, a design check, the log-likelihood at the final parameters). The question is
a module-level function marked :func:`~fedstats.federation.protocol.client_function`, so a
remote backend can send it by reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .protocol import ClientId, FederatedAlgorithm, Message, Replies
from .records import RoundRecord, in_fit
from .runner import run

__all__ = ["OneShot", "OneShotSums", "one_shot", "one_shot_sums", "run_once", "raise_failures"]


class OneShot(FederatedAlgorithm):
    """A single round: broadcast ``payload``; each client answers ``client_fn(payload, X, rng, private)``.

    ``private`` maps a client to what it already holds (its weights, say; default
    ``None``); it stays on the client. ``client_fn`` returns its reply, or ``(reply,
    new_private)`` to keep something on the client after the round.
    """

    per_client_fields = ("private",)

    def __init__(
        self,
        keys: tuple[str, ...],
        payload: Message,
        client_fn: Callable[..., Any],
        private: Mapping[ClientId, Any] | None = None,
    ) -> None:
        self.reply_keys = keys
        self.payload = payload
        self.client_fn = client_fn
        self.private = private

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict[ClientId, Message]:
        return {}

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> Any:
        return None if self.private is None else self.private[client]

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        return self.payload

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        out = self.client_fn(message, np.asarray(data.X), rng, state)
        return out if isinstance(out, tuple) else (out, state)

    def server_step(
        self, server_state: Any, replies: Mapping[ClientId, Message], round: int
    ) -> tuple[dict[ClientId, Message], dict[str, float]]:
        # the replies as the runtime gave them (a Replies, with the sums of any summed keys)
        return Replies(dict(replies), getattr(replies, "sums", {})), {}


class OneShotSums(OneShot):
    """A :class:`OneShot` round whose reply arrays named in ``summed`` reach the server only as
    their sum over the clients (``replies.sums``); its server state is the
    :class:`~fedstats.federation.Replies` (the other arrays per client)."""

    def __init__(
        self,
        keys: Iterable[str],
        summed: Iterable[str],
        payload: Message,
        client_fn: Callable[..., Any],
        private: Mapping[ClientId, Any] | None = None,
    ) -> None:
        super().__init__(tuple(keys), payload, client_fn, private)
        self.summed_keys = tuple(summed)


def one_shot_sums(
    data: Any,
    keys: Iterable[str],
    summed: Iterable[str],
    payload: Message,
    client_fn: Callable[..., Any],
    *,
    seed: int,
    what: str,
    private: Mapping[ClientId, Any] | None = None,
) -> tuple[Replies, dict[ClientId, Any]]:
    """:func:`one_shot` with the ``summed`` keys declared summed: returns ``(replies,
    client_states)``, the sums in ``replies.sums``."""
    return run_once(OneShotSums(keys, summed, payload, client_fn, private), data, seed=seed, what=what)


def one_shot(
    data: Any,
    keys: Iterable[str],
    payload: Message,
    client_fn: Callable[..., Any],
    *,
    seed: int,
    what: str,
    private: Mapping[ClientId, Any] | None = None,
) -> tuple[Replies, dict[ClientId, Any]]:
    """Run a :class:`OneShot` round that every client of the fit must answer.

    Returns ``(replies, client_states)`` (its bytes are in the ledger of the fit, like every
    exchange). Inside a model's fit, a client that fails drops out of the fit (it is not asked
    again, and the result names it with the reason: :func:`~fedstats.federation.records.exclude`),
    so that the fit's aggregates all come from the same clients; outside a fit, or when no
    client answered, it raises ``RuntimeError`` naming the first client that failed.
    """
    return run_once(OneShot(tuple(keys), payload, client_fn, private), data, seed=seed, what=what)


def run_once(algorithm: OneShot, data: Any, *, seed: int, what: str) -> tuple[Replies, dict[ClientId, Any]]:
    """Run the one-off round ``algorithm`` (labelled ``what`` without a leading "the"), which
    every client must answer: ``(replies, client_states)``, as :func:`one_shot`."""
    r = run(algorithm, data, rounds=1, seed=seed, progress=False, batched=False, kind=what.removeprefix("the "))
    raise_failures(r.history, what)
    return r.server_state, r.client_states


def raise_failures(history: Iterable[RoundRecord], what: str) -> None:
    """Raise ``RuntimeError`` with the first client error recorded in ``history``, if any,
    unless a fit is in progress and some client answered: the failed clients have then
    dropped out of the fit (:func:`~fedstats.federation.run` recorded them)."""
    history = list(history)
    failed = {c: why for rec in history for c, why in rec.failed.items()}
    answered = any(rec.answered for rec in history)
    if failed and not (in_fit() and answered):
        c, why = next(iter(failed.items()))
        raise RuntimeError(f"{what}: {len(failed)} client(s) failed; client {c!r}: {why}")
