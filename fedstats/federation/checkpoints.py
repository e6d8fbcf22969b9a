"""Checkpoints of a run: an atomically written pickle of the server state, every client's
private state, the history and the byte counters, with a fingerprint of the run's
configuration that a resumed run must match. Only resume from files you trust."""

from __future__ import annotations

import os
import pickle
import tempfile

from .participation import Participation, qualname
from .protocol import ClientId, FederatedAlgorithm, describe_exc

#: version of the checkpoint layout written by :func:`~fedstats.federation.run`
CHECKPOINT_FORMAT = 1


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


def write_atomic(path: str, payload: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_checkpoint(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            payload = pickle.load(f)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"could not read checkpoint {path!r}: {describe_exc(exc)}") from exc
    if not isinstance(payload, dict) or "format" not in payload:
        raise ValueError(f"{path!r} is not a fedstats checkpoint")
    if payload["format"] != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path!r} has format {payload['format']}, this version reads {CHECKPOINT_FORMAT}")
    return payload
