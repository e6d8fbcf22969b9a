"""Dishonest and broken clients in a round (the runtime's checks before the server step):
replies whose summed arrays do not have the others' shapes, or whose values make a sum
overflow, are blamed on their sender (who then sits the round out, as a failed client, with
the reason ``BrokenReply: ...``); and each client's influence: how far the estimate moves
without it.

The influence is exact leave-one-client-out where sums make it cheap: an algorithm that can
form its estimate from the sums of the replies defines
:meth:`~fedstats.federation.FederatedAlgorithm.leave_one_out`, and the runtime calls it with
the round's totals and one client's own contribution (its reply, or the sum of all its replies
for an algorithm whose replies are changes, ``cumulative_replies``). It runs where the runtime
holds each reply: not under secure aggregation (the server never sees one client's arrays)
and not under differential privacy (a per-client number would be released without noise).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .protocol import ClientId, Message, Replies

#: a client whose influence passes this many times what a client of its size would typically
#: cause (its ``relative`` influence), and three times the median client's, is named in a warning
INFLUENCE_WARNING = 5.0
#: a reply whose relative influence passes this is refused as broken before the server step
#: (values no data of its size can produce, e.g. 1e300): its sender sits the round out
INFLUENCE_REFUSE = 1e6


def shape_outliers(keys: Sequence[str], replies: Mapping[ClientId, Message]) -> dict[ClientId, str]:
    """The clients whose summed arrays ``keys`` do not have the shape most clients sent, with
    the reason (a tie between shapes blames every client of the tie: nobody can tell which
    shape is right)."""
    out: dict[ClientId, str] = {}
    for k in keys:
        shapes = {c: np.shape(r[k]) for c, r in replies.items() if c not in out and k in r}
        if len(set(shapes.values())) <= 1:
            continue
        counts = Counter(shapes.values()).most_common()
        top = counts[0][0] if counts[0][1] > counts[1][1] else None
        for c, shape in shapes.items():
            if shape != top:
                others = "the other clients'" if top is not None else "no shape most clients'"
                out[c] = f"BrokenReply: sent {k!r} of shape {shape}; {others} is {top}"
    return out


def not_cross_products(
    keys: Sequence[str], replies: Mapping[ClientId, Message], symmetric: Sequence[str] = ()
) -> dict[ClientId, str]:
    """The clients whose arrays ``keys`` (declared cross-products such as ``X'WX``, square in
    their last two axes) no rows can produce: not symmetric, or not positive semi-definite
    (an eigenvalue below ``-1e-8`` times the largest), or whose arrays ``symmetric`` are not
    symmetric, with the reason."""
    out: dict[ClientId, str] = {}
    for c, r in replies.items():
        for k in (*keys, *symmetric):
            a = np.asarray(r.get(k), dtype=float)
            if a.ndim < 2 or a.shape[-1] != a.shape[-2] or not np.isfinite(a).all():
                continue  # another check's (shape, overflow)
            scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-300)
            if float(np.max(np.abs(a - np.swapaxes(a, -1, -2)), initial=0.0)) > 1e-8 * scale:
                out[c] = f"BrokenReply: its {k!r} is not symmetric, as it must be"
                break
            if k not in keys:
                continue
            low = float(np.min(np.linalg.eigvalsh(a), initial=0.0))
            if low < -1e-8 * scale:
                out[c] = (
                    f"BrokenReply: its {k!r} has a negative eigenvalue ({low:.3g}): no rows give such a cross-product"
                )
                break
    return out


def checked_sums(
    keys: Sequence[str], replies: dict[ClientId, Message], psd: Sequence[str] = (), symmetric: Sequence[str] = ()
) -> tuple[Replies, dict[ClientId, str]]:
    """:meth:`Replies.summing` of ``replies`` with the clients that break it taken out first
    (``replies`` is changed): a summed array of another shape than the others', a declared
    cross-product (``psd``) no rows can produce or a declared symmetric array that is not
    (:func:`not_cross_products`), or values so
    large that the sum overflows (the client with the largest magnitude is taken out until the
    sum is finite). ``(the replies summed, {client: why})``."""
    bad = shape_outliers(keys, replies)
    bad.update(not_cross_products(psd, {c: r for c, r in replies.items() if c not in bad}, symmetric))
    for c in bad:
        del replies[c]
    while True:
        summed = Replies.summing(keys, replies)
        key = next((k for k, v in summed.sums.items() if not np.isfinite(v).all()), None)
        if key is None:
            return summed, bad
        # a NaN counts as the largest value: its sender is the one to blame
        size = {c: float(np.max(np.nan_to_num(np.abs(r[key]), nan=np.inf), initial=0.0)) for c, r in replies.items()}
        worst = max(size, key=lambda c: size[c])
        finite = bool(np.isfinite(np.asarray(replies[worst][key], dtype=float)).all())
        bad[worst] = (
            f"BrokenReply: its {key!r} (values up to {size[worst]:.3g}) makes the sum over the clients overflow"
            if finite
            else f"BrokenReply: its {key!r} holds values that are not finite"
        )
        del replies[worst]


class Influence:
    """Each client's latest leave-one-client-out influence over a run (see the module docs)."""

    def __init__(self, algorithm: Any, rows: Mapping[ClientId, int] | None = None) -> None:
        self.algorithm = algorithm
        self.keys = tuple(algorithm.summed_keys)
        #: each client's declared rows, and the replies that must add up to them
        self.rows = dict(rows or {})
        self.count_keys = tuple(getattr(algorithm, "row_count_keys", ()))
        self.cumulative = bool(getattr(algorithm, "cumulative_replies", False))
        #: for cumulative replies: all each client sent so far, stacked (``row``: its row),
        #: and their totals
        self.row: dict[ClientId, int] = {}
        self.stacked: dict[str, np.ndarray] = {}
        self.totals: dict[str, np.ndarray] = {}
        #: client -> (shift in standard errors, relative to a client of its size)
        self.values: dict[ClientId, tuple[float, float]] = {}

    @property
    def own(self) -> dict[ClientId, dict[str, np.ndarray]]:
        """For cumulative replies: all each client sent so far (its replies summed)."""
        return {c: {k: v[i].copy() for k, v in self.stacked.items()} for c, i in self.row.items()}

    def update(self, replies: Mapping[ClientId, Message], sums: Mapping[str, np.ndarray]) -> dict[ClientId, str]:
        """After a round's replies are summed, before the server step: each answering client's
        influence on the estimate from the totals. Returns the clients whose reply is refused
        as broken (relative influence past :data:`INFLUENCE_REFUSE`, or counts that do not add
        up to its declared rows) with the reason; their contributions are not kept, and the
        caller sums the round again without them."""
        if not replies:
            return {}
        clients = list(replies)
        # each client's contribution, stacked (one row per client)
        own = {k: np.stack([replies[c][k] for c in clients]).astype(float, copy=False) for k in self.keys}
        totals = {k: np.asarray(v, dtype=float) for k, v in sums.items()}
        if self.cumulative:  # replies are changes: add what each sent before, and the totals so far
            rows = np.array([self.row.get(c, -1) for c in clients])
            seen = rows >= 0
            if seen.any():
                for k in self.keys:
                    own[k][seen] += self.stacked[k][rows[seen]]
            totals = {k: self.totals[k] + v for k, v in totals.items()} if self.totals else totals
        miscounted = self._miscounted(clients, own)
        if miscounted:
            return miscounted
        found = self._measure(totals, clients, own)
        worst = max(found, key=lambda c: found[c][1], default=None)
        if worst is not None and INFLUENCE_REFUSE < found[worst][1] < np.inf:  # inf: the estimate rests on it
            # only the most influential: without it, the others' influence is measured again
            shift, rel = found[worst]
            return {
                worst: f"BrokenReply: its reply alone moves the estimate by {shift:.3g} standard errors, "
                f"{rel:.3g} times what a client of its size could: refused as broken"
            }
        self.values.update(found)
        if self.cumulative:
            self.totals = totals
            self._keep(clients, own)
        return {}

    def _keep(self, clients: list[ClientId], own: Mapping[str, np.ndarray]) -> None:
        """Store ``own`` (all ``clients`` sent so far, stacked) as their rows."""
        for c in clients:
            self.row.setdefault(c, len(self.row))
        n, at = len(self.row), [self.row[c] for c in clients]
        for k, v in own.items():
            old = self.stacked.get(k)
            if old is None or len(old) < n:
                grown = np.zeros((max(n, 2 * (0 if old is None else len(old))), *v.shape[1:]))
                if old is not None:
                    grown[: len(old)] = old
                self.stacked[k] = grown
            self.stacked[k][at] = v

    def _miscounted(self, clients: list[ClientId], own: Mapping[str, np.ndarray]) -> dict[ClientId, str]:
        """The clients whose :attr:`count_keys` (all they sent so far) do not add up to the
        rows they declared, with the reason."""
        out: dict[ClientId, str] = {}
        if not self.rows:
            return out
        declared = np.array([self.rows.get(c, np.nan) for c in clients], dtype=float)
        for k in self.count_keys:
            got = own[k].reshape(len(clients), -1).sum(axis=1)
            for i in np.flatnonzero(np.abs(got - declared) > 1e-6 * np.maximum(declared, 1.0)):
                out.setdefault(
                    clients[i],
                    f"BrokenReply: its {k!r} adds up to {got[i]:.6g} rows; it declared {declared[i]:.0f}: "
                    "refused as inconsistent",
                )
        return out

    def _measure(
        self, totals: Mapping[str, np.ndarray], clients: list[ClientId], own: Mapping[str, np.ndarray]
    ) -> dict[ClientId, tuple[float, float]]:
        """The algorithm's leave-one-out for ``clients`` (``own``: their rows) in one stacked
        call; where that fails (one client's removal leaves a singular system), one client at
        a time, skipping those whose removal cannot be measured."""
        try:
            with np.errstate(all="ignore"):
                got = self.algorithm.leave_one_out(totals, own)
        except (np.linalg.LinAlgError, ValueError, ZeroDivisionError, FloatingPointError):
            if len(clients) == 1:
                return {}
            found: dict[ClientId, tuple[float, float]] = {}
            for i, c in enumerate(clients):
                found.update(self._measure(totals, [c], {k: v[i : i + 1] for k, v in own.items()}))
            return found
        if got is None:
            return {}
        shift, rel = (np.asarray(g, dtype=float).reshape(len(clients)) for g in got)
        return {c: (float(s), float(r)) for c, s, r in zip(clients, shift, rel) if not np.isnan(r)}


def flagged(values: Mapping[ClientId, tuple[float, float]]) -> dict[ClientId, tuple[float, float]]:
    """The clients whose relative influence passes :data:`INFLUENCE_WARNING` and three times
    the median client's (a client that pulls the estimate away moves the others' influence up
    too): the ones the warning names and ``robust=True`` leaves out."""
    if not values:
        return {}
    typical = float(np.median([min(v[1], 1e300) for v in values.values()]))
    return {c: v for c, v in values.items() if v[1] > max(INFLUENCE_WARNING, 3.0 * typical)}


def to_leave_out(
    values: Mapping[ClientId, tuple[float, float]], clients: Sequence[ClientId], out: Collection[ClientId]
) -> dict[ClientId, str]:
    """With ``robust=True``: the clients to leave out of the next fit (those :func:`flagged`,
    while at least half of ``clients`` stay in; ``out``: those already out), with the reason."""
    far = flagged(values)
    if not far or len(clients) - len(out) - len(far) < (len(clients) + 1) // 2:
        return {}
    return {
        c: f"left out by robust=True: without it the estimate moves by {v[0]:.3g} standard errors, "
        f"{v[1]:.3g} times what a client of its size moves it"
        for c, v in far.items()
    }


def influence_warning(model: str, values: Mapping[ClientId, tuple[float, float]], unit: str) -> str | None:
    """The warning naming the clients whose relative influence passes :data:`INFLUENCE_WARNING`."""
    big = flagged(values)
    if not big:
        return None
    others = [v[0] for c, v in values.items() if c not in big]
    named = ", ".join(
        f"{c!r} (a part of the estimate rests on it alone)"
        if np.isinf(v[0])
        else f"{c!r} ({v[0]:.3g} {unit}, {v[1]:.3g}x a client of its size)"
        for c, v in big.items()
    )
    rest = f"; the other clients at most {max(others):.3g} {unit}" if others else ""
    return (
        f"{model}: without client(s) {named} the estimate moves by far more than a client of its size "
        f"moves it{rest}. Its data differ from the others' or it sends wrong statistics: check it, "
        "or fit without it. See result.influence."
    )


def report_influence(result: Any, values: Mapping[ClientId, tuple[float, float]], unit: str, *, model: str) -> None:
    """Put ``values`` (a run's influence) on ``result.influence`` (a data frame) and warn
    (:func:`influence_warning`, at the caller's caller) when a client passes the threshold."""
    if not values:
        return
    result.influence = pd.DataFrame(
        [(c, v[0], v[1]) for c, v in values.items()], columns=["client", "shift", "relative"]
    ).set_index("client")
    message = influence_warning(model, values, unit)
    if message:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
