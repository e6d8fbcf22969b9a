"""Who takes part in each round of a run: a fraction, a count, a callable or a schedule of
client ids, turned into sorted client indices (:class:`Participation`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import streams
from ..estimator import is_int
from .protocol import ClientId


def qualname(obj: Any) -> str:
    """``module.qualified.name`` of a function, class or instance (for fingerprints)."""
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"{module}.{name}"


def round_rng(seed: int, rnd: int) -> np.random.Generator:
    """The stream that draws the participants of round ``rnd``."""
    return streams.stream(seed, "participants", rnd)


class Participation:
    """Who takes part in each round, as sorted client indices."""

    def __init__(self, spec: Any, ids: list[ClientId], rounds: int) -> None:
        self.ids = ids
        self.index = {c: i for i, c in enumerate(ids)}
        n = len(ids)
        self.kind: str
        self.k: int
        self.fn: Callable[[int, np.random.Generator], Iterable[ClientId]]
        self.desc: tuple[str, Any]  # for fingerprints
        self.schedule: list[list[int]] | None = None
        if isinstance(spec, (bool, np.bool_)):
            raise TypeError("participation must be a fraction, a count, a callable or a schedule, not a bool")
        if is_int(spec):
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
            self.kind, self.fn, self.desc = "callable", spec, ("callable", qualname(spec))
        elif isinstance(spec, (list, tuple, np.ndarray)):
            entries = list(spec)
            if len(entries) < rounds:
                raise ValueError(f"participation schedule has {len(entries)} rounds, fewer than rounds={rounds}")
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
            dups = sorted({self.ids[i] for i in out if out.count(i) > 1}, key=self.index.__getitem__)
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


def everyone_first(fraction: float, clients: Sequence[ClientId]) -> Any:
    """The participation of incremental EM: every client in round 0, then ``fraction`` of
    them in each later round, drawn as :class:`Participation` draws a fraction (``1.0`` when
    ``fraction`` is 1: every client in every round)."""
    if fraction >= 1:
        return 1.0
    later = Participation(fraction, list(clients), 0)

    def choose(rnd: int, rng: np.random.Generator) -> list[ClientId]:
        return list(clients) if rnd == 0 else [later.ids[i] for i in later.select(rnd, rng)]

    return choose
