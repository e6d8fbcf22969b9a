"""Wall time and peak resident memory of a block of code, and the machine: the benchmarks' helper.

The scripts in ``benchmarks/`` run as ``python benchmarks/x.py``, so this directory is on
``sys.path`` and they import it as ``from _measure import measure``::

    with measure() as m:
        fit()
    m.seconds, m.peak_rss_mib, m.scope

``peak_rss_mib`` is the peak resident set size (RSS) of the whole process while the block ran,
in MiB, everything already resident included (interpreter, libraries, data, compiled kernels).
On Linux the peak is reset at the start of the block (``5`` written to ``/proc/self/clear_refs``)
and read after it (``VmHWM`` of ``/proc/self/status``): ``scope == "block"``. Where that is not
possible (another system, an old kernel, a read-only ``/proc``) it is the peak since the process
started (``resource.getrusage``): ``scope == "process"``. Blocks may nest: a block's peak
includes that of the blocks inside it. Memory of other processes (workers, Ray actors) and of
accelerators is not counted.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@dataclass
class Measurement:
    """One block: wall seconds, the peak RSS in MiB, and its scope ("block" or "process")."""

    seconds: float = float("nan")
    peak_rss_mib: float = float("nan")
    scope: str = "block"
    _seen_kib: int = field(default=0, repr=False)  # the peak before a nested block reset it


_open: list[Measurement] = []  # the blocks being measured, outermost first
_scope: str | None = None  # "block" once a reset worked, "process" once one failed


def _status_kib(key: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (VmHWM, VmRSS), or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak() -> bool:
    """Reset the process's peak RSS to its current RSS (Linux >= 4.0); False where not possible."""
    global _scope
    if _scope == "process":
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        ok = _status_kib("VmHWM") is not None
    except OSError:
        ok = False
    _scope = "block" if ok else "process"
    return ok


def _process_peak_kib() -> int | None:
    """The peak RSS since the process started (getrusage), in KiB; None where unavailable."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # macOS: bytes; elsewhere KiB


def peak_scope() -> str:
    """The scope of the peaks this process measures: "block" or "process"."""
    if _open:
        return _open[-1].scope
    if _scope is None:
        _reset_peak()  # no block is open: resetting the peak disturbs nothing
    return _scope or "process"


@contextmanager
def measure() -> Iterator[Measurement]:
    """Time the block and record its peak resident memory (see the module's docstring)."""
    m = Measurement()
    if _open and _open[-1].scope == "block":
        hwm = _status_kib("VmHWM") or 0  # the outer blocks' peak so far, before the reset
        for outer in _open:
            outer._seen_kib = max(outer._seen_kib, hwm)
    m.scope = "block" if (not _open or _open[-1].scope == "block") and _reset_peak() else "process"
    _open.append(m)
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        m.seconds = time.perf_counter() - t0
        _open.pop()
        kib = _status_kib("VmHWM") if m.scope == "block" else _process_peak_kib()
        if kib is not None:
            kib = max(kib, m._seen_kib)
            m.peak_rss_mib = kib / 1024
            for outer in _open:
                outer._seen_kib = max(outer._seen_kib, kib)


def _best(runs: list[Measurement]) -> Measurement:
    """The best time and the largest peak of ``runs``."""
    peaks = [r.peak_rss_mib for r in runs]
    return Measurement(
        seconds=min(r.seconds for r in runs),
        peak_rss_mib=max(peaks) if all(p == p for p in peaks) else float("nan"),
        scope=runs[-1].scope,
    )


def measured(f: Callable[[], T], repeats: int = 1) -> tuple[T, Measurement]:
    """Run ``f`` ``repeats`` times: its last result, the best time and the largest peak."""
    runs, out = [], None
    for _ in range(max(1, repeats)):
        with measure() as m:
            out = f()
        runs.append(m)
    return out, _best(runs)  # type: ignore[return-value]


def interleaved(fs: dict[str, Callable[[], object]], repeats: int = 3) -> tuple[dict, dict, dict]:
    """Run the functions of ``fs`` in turn, ``repeats`` rounds of all of them (a slow spell of a
    shared machine then touches every one, not only the one that happened to run in it): each
    one's last result, its best time with its largest peak, and every run's seconds."""
    out: dict = {}
    runs: dict[str, list[Measurement]] = {k: [] for k in fs}
    for _ in range(max(1, repeats)):
        for k, f in fs.items():
            with measure() as m:
                out[k] = f()
            runs[k].append(m)
    return out, {k: _best(r) for k, r in runs.items()}, {k: [r.seconds for r in v] for k, v in runs.items()}


def start_jax() -> None:
    """Pay the process's jax start-up (its CPU client, numpyro's import) before the first
    timed block, which would otherwise carry it alone (about 2 s here): the comparisons are
    of fits, each with its own compilation, not of process starts."""
    import jax
    import numpyro  # noqa: F401

    jax.jit(lambda x: x + 1)(jax.numpy.zeros(1)).block_until_ready()


def mib(m: Measurement | float) -> float | None:
    """A peak for a JSON file: MiB to 0.1, None where it could not be measured."""
    v = m.peak_rss_mib if isinstance(m, Measurement) else m
    return None if v != v else round(float(v), 1)


def _total_memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (AttributeError, ValueError, OSError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor()


def machine() -> str:
    """The machine in words: system, CPU, cores, memory, Python and numpy versions.

    No host name, user or path.
    """
    import numpy as np

    cores = f"{os.cpu_count()} cores"
    if hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
        if usable != os.cpu_count():
            cores += f" ({usable} usable)"
    gib = _total_memory_gib()
    parts = [
        f"{platform.system()} {platform.machine()}",
        _cpu_model(),
        cores,
        f"{gib:.1f} GiB memory" if gib else "memory unknown",
        f"Python {platform.python_version()}",
        f"numpy {np.__version__}",
    ]
    text = ", ".join(p for p in parts if p)
    for sep in {os.sep, os.altsep or os.sep, "/", "\\"}:
        text = text.replace(sep, " ")
    return text


def written() -> str:
    """Now, in UTC, to the second (ISO 8601): when a result file was written."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def record(scope: str | None = None) -> dict:
    """The fields every result file gets: when it was written, the machine, the peaks' scope."""
    return {"written": written(), "machine_details": machine(), "peak_rss_scope": scope or peak_scope()}


def rss_note(scope: str | None = None) -> str:
    """A sentence for a table: what the peak RSS columns are."""
    if (scope or peak_scope()) == "block":
        what = "during each timed block (Linux VmHWM, reset at the start of the block)"
    else:
        what = "since the process started (getrusage: no per-block reset on this system)"
    return (
        f"Peak RSS: the peak resident memory of the benchmark's process {what}, in MiB, everything "
        "already resident (interpreter, libraries, data) included; other processes and accelerators "
        "are not counted."
    )


def fmt_mib(v: float | None) -> str:
    """A peak for a table: whole MiB, or "not recorded"."""
    return "not recorded" if v is None or v != v else f"{v:.0f}"
