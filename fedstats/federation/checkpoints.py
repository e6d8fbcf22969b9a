"""Checkpoints of a run: an atomically written file of the server state, every client's
private state, the history and the byte counters, with a fingerprint of the run's
configuration that a resumed run must match. The file is a fedstats result file
(:mod:`fedstats.result_file`: JSON and arrays, no pickle), so reading a crafted checkpoint
runs nothing and is bounded like loading a result."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from ..result_file import ResultFileError, load_result, register, save_result
from .participation import Participation, qualname
from .protocol import ClientId, FederatedAlgorithm

#: version of the checkpoint layout written by :func:`~fedstats.federation.run` (1: a pickle)
CHECKPOINT_FORMAT = 2


@register
class Checkpoint:
    """What a checkpoint file holds: the run's payload (plain data, written by
    :func:`write_atomic`)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload


def fingerprint(algorithm: FederatedAlgorithm, ids: list[ClientId], seed: int, plan: Participation) -> dict:
    return {
        "algorithm": qualname(type(algorithm)),
        "clients": [repr(c) for c in ids],
        "seed": seed,
        "participation": plan.desc,
    }


def fingerprint_diff(saved: dict, now: dict, completed: int) -> list[str]:
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


def replace_atomically(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """``write(tmp)`` a temporary file beside ``path``, sync it and rename it over ``path``: a
    crash leaves the previous file whole (checkpoints, a node's privacy ledger)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomic(path: str, payload: dict) -> None:
    """Write ``payload`` to the checkpoint ``path`` atomically (:func:`replace_atomically`)."""

    def write(tmp: str) -> None:
        try:
            save_result(Checkpoint(payload), tmp)
        except TypeError as exc:
            raise TypeError(f"cannot checkpoint this run: {exc}") from None

    replace_atomically(path, write)


def read_checkpoint(path: str) -> dict:
    try:
        payload = load_result(path, Checkpoint).payload
    except ResultFileError as exc:
        raise ValueError(f"could not read checkpoint {path!r}: {exc}") from None
    if not isinstance(payload, dict) or "format" not in payload:
        raise ValueError(f"{path!r} is not a fedstats checkpoint")
    if payload["format"] != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path!r} has format {payload['format']}, this version reads {CHECKPOINT_FORMAT}")
    return payload
