"""What a run shows while it runs: a tqdm bar over rounds, or, inside a :func:`round_lines`
block, one plain line per round."""

from __future__ import annotations

import math
import numbers
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO

import numpy as np

from .records import RoundRecord


def scalar(v: Any) -> float | None:
    """``v`` as a float if it is one real number (a metric worth showing), else ``None``."""
    if isinstance(v, (numbers.Real, np.generic)) and not isinstance(v, (bool, np.bool_)):
        return float(v)
    if isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind in "iuf":
        return float(v.reshape(()))
    return None


_ROUND_LINES: ContextVar[Any] = ContextVar("fedstats_round_lines", default=None)


@contextmanager
def round_lines(stream: TextIO | None = None, *, label: str = "", min_interval: float = 1.0) -> Iterator[None]:
    """Within the block, every run left to decide its own progress display (``progress=None``)
    prints one plain line per round to ``stream`` (default ``sys.stderr``) instead of a tqdm
    bar: round, seconds, clients that answered, the server's change metrics, at most how long
    the rounds left may take (:class:`TimeLeft`), and a last line saying whether the run
    converged. Runs with ``progress=False`` (one-off exchanges) stay
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


def duration(seconds: float) -> str:
    """A number of seconds as people read it: ``"<1 s"``, ``"42 s"``, ``"3 min 5 s"``, ``"2 h 4 min"``."""
    s = int(round(seconds))
    if seconds < 1:
        return "<1 s"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class TimeLeft:
    """An upper estimate of a run's time left: the mean time of its last ``window`` rounds
    times the rounds left before its limit (a run that converges stops earlier, hence "at
    most"; the last rounds rather than all, because a run's first round may include
    compilation, and a staged run's rounds change cost with the stage)."""

    def __init__(self, rounds: int, window: int = 3) -> None:
        self.rounds, self.window = int(rounds), int(window)
        self.recent: list[float] = []

    def add(self, rec: RoundRecord) -> float | None:
        """Record a finished round; the estimate after it (None when no round is left)."""
        self.recent = (self.recent + [float(rec.seconds)])[-self.window :]
        left = self.rounds - (rec.round + 1)
        if left <= 0 or not self.recent:
            return None
        return left * sum(self.recent) / len(self.recent)


class _LinePrinter:
    """The plain lines of a run inside a :func:`round_lines` block."""

    def __init__(self, cfg: dict[str, Any], name: str, rounds: int) -> None:
        self.stream = cfg["stream"] if cfg["stream"] is not None else sys.stderr
        self.prefix = f"{cfg['label'] or name}: "
        self.min_interval, self.rounds, self.last = cfg["min_interval"], rounds, -math.inf
        self.time_left = TimeLeft(rounds)

    def _print(self, text: str) -> None:
        print(self.prefix + text, file=self.stream, flush=True)
        self.last = time.perf_counter()

    def round(self, rec: RoundRecord, final: bool) -> None:
        left = self.time_left.add(rec)  # every round counts, printed or not
        if not (final or rec.round == 0 or time.perf_counter() - self.last >= self.min_interval):
            return
        parts = [
            f"round {rec.round + 1}/{self.rounds}",
            f"{rec.seconds:.2f} s",
            f"{len(rec.answered)}/{len(rec.participants)} answered",
        ]
        if rec.failed:
            parts.append(f"{len(rec.failed)} failed")
        shown = 0
        for k, v in rec.metrics.items():
            x = scalar(v)
            if x is not None and shown < 2:
                parts.append(f"{k} {x:.4g}")
                shown += 1
        if left is not None and not final:
            parts.append(f"at most {duration(left)} left")
        self._print(", ".join(parts))

    def end(self, done: int, converged: bool, seconds: float) -> None:
        if converged:
            self._print(f"converged after {done} round(s), {seconds:.1f} s")
        else:
            self._print(
                f"stopped after {done} round(s) (the limit) without meeting its convergence rule, {seconds:.1f} s"
            )


def progress_bar(progress: bool | None, *, total: int, desc: str, unit: str, initial: int = 0) -> Any:
    """A tqdm bar on stderr when ``progress`` is True, or None with stderr a terminal; else None."""
    show = progress if progress is not None else bool(getattr(sys.stderr, "isatty", lambda: False)())
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


class RoundDisplay:
    """A run's progress display: plain lines inside a :func:`round_lines` block (when the run
    left ``progress`` to ``None``), else a tqdm bar (``progress=True``, or ``None`` with stderr
    a terminal), else nothing. Both say how long the run may still take: the lines "at most
    ... left" (:class:`TimeLeft`), the bar tqdm's own estimate of the time to its last round."""

    def __init__(
        self, progress: bool | None, *, name: str, rounds: int, start: int, active: bool, failed_so_far: int
    ) -> None:
        cfg = _ROUND_LINES.get() if progress is None else None
        self.lines = _LinePrinter(cfg, name, rounds) if cfg is not None else None
        self.n_failed = failed_so_far
        self.bar = (
            progress_bar(progress, total=rounds, initial=start, desc=name, unit="round")
            if self.lines is None and active
            else None
        )

    def round(self, rec: RoundRecord, final: bool) -> None:
        """Show a completed round (``final``: the run stops after it)."""
        if self.lines is not None:
            self.lines.round(rec, final=final)
        if self.bar is not None:
            self.n_failed += len(rec.failed)
            post: dict[str, Any] = {}
            for k, v in rec.metrics.items():
                s = scalar(v)
                if s is not None:
                    post[str(k)] = f"{s:.4g}"
                    if len(post) == 2:
                        break
            post["failed"] = self.n_failed
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """Close the bar (also when the run raised)."""
        if self.bar is not None:
            self.bar.close()

    def end(self, done: int, converged: bool, seconds: float) -> None:
        """The last line: how the run ended."""
        if self.lines is not None:
            self.lines.end(done, converged, seconds)
