"""A node's privacy budget across runs: :class:`NodeBudget`, the ledger a node keeps of the
epsilon spent on its data.

Each fit reports the epsilon it spent (``result.privacy``), but a node's rows can be analysed
by many fits, and their epsilons add up (composition). A node whose policy sets
``epsilon_budget`` keeps every release it made in a JSON file (the policy's
``privacy_ledger``), composes them with dp-accounting, and refuses a run whose planned
releases would take the total past its budget; it also refuses, at each step, a release that
would (a server that plans fewer rounds than it runs is stopped there).

The noise a node counts is the noise in what leaves it (:func:`node_noise_multiplier`): with
``placement="client"`` and no secure aggregation only its own share (``z / sqrt(n_clients)``);
under secure aggregation the sum of every asked client's share (``z``, assuming the others add
theirs); with ``placement="central"`` none (the node sends exact sums: an infinite epsilon
against the server). A run without differential privacy releases exact statistics: a node
with a budget refuses it.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import Any

from .checkpoints import replace_atomically
from .protocol import PolicyRefusal

#: the format name of a node's privacy ledger file
LEDGER_FORMAT = "fedstats-node-privacy"
#: the largest ledger file a node reads (one entry per run and kind of release: about 200 bytes)
MAX_LEDGER_BYTES = 16 * 2**20


def node_noise_multiplier(algorithm: Any, secure: bool) -> float:
    """The noise multiplier of one release of ``algorithm``, as the node sees what leaves it
    (see the module docs); ``0.0`` for an algorithm without differential privacy."""
    dp = getattr(algorithm, "privacy", None)
    if dp is None or dp.placement == "central":
        return 0.0
    n = getattr(algorithm, "n_clients", None)
    if not isinstance(n, int) or n < 1:
        raise PolicyRefusal(
            "epsilon_budget",
            f"{type(algorithm).__name__} does not say among how many clients its noise is shared: "
            "the node cannot count what it releases",
        )
    z = float(dp.noise_multiplier)
    return z if secure else z / math.sqrt(n)


class NodeBudget:
    """The releases a node made across runs (a JSON file at ``path``) against its ``budget``
    of epsilon at ``delta``."""

    def __init__(self, path: str | os.PathLike, budget: float, delta: float, accountant: str = "rdp") -> None:
        self.path, self.budget, self.delta, self.accountant = os.fspath(path), float(budget), float(delta), accountant

    def releases(self) -> list[dict[str, Any]]:
        """Every release recorded so far (``[]`` before the first); a ledger the node cannot
        read refuses every run (it could not tell what was spent)."""
        if not os.path.exists(self.path):
            return []
        try:
            if os.path.getsize(self.path) > MAX_LEDGER_BYTES:
                raise ValueError(f"larger than {MAX_LEDGER_BYTES} bytes")
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
            if not isinstance(doc, dict) or doc.get("format") != LEDGER_FORMAT:
                raise ValueError("not a fedstats node privacy ledger")
            out = doc["releases"]
            if not isinstance(out, list) or not all(
                isinstance(r, dict) and float(r["noise_multiplier"]) >= 0 and int(r["count"]) >= 1 for r in out
            ):
                raise ValueError("malformed releases")
            return out
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise PolicyRefusal(
                "epsilon_budget", f"cannot read the node's privacy ledger {self.path!r} ({exc}): refusing to release"
            ) from None

    def epsilon(self, extra: tuple[float, int] | None = None) -> float:
        """The epsilon spent at ``delta`` by every recorded release (and ``extra``:
        ``(noise_multiplier, count)`` releases more)."""
        from ..privacy import PrivacyLedger

        ledger = PrivacyLedger(self.accountant)
        for r in self.releases():
            ledger.record(str(r.get("name") or "release"), float(r["noise_multiplier"]), int(r["count"]))
        if extra is not None and extra[1] > 0:
            ledger.record("planned", extra[0], extra[1])
        return ledger.epsilon(self.delta)

    def check(self, z: float, count: int, what: str) -> None:
        """Refuse (:class:`PolicyRefusal`, rule ``epsilon_budget``) when ``count`` more releases
        at noise multiplier ``z`` would take the total past the budget."""
        spent = self.epsilon()
        after = self.epsilon((z, count))
        if after > self.budget:
            shown = "inf (it releases exact statistics)" if math.isinf(after) else f"{after:.3g}"
            raise PolicyRefusal(
                "epsilon_budget",
                f"{what} would take the epsilon spent on this node's data from {spent:.3g} to {shown} "
                f"(delta {self.delta:g}); its budget is {self.budget:g}",
            )

    def record(self, run: str, algorithm: str, name: str, z: float, count: int = 1) -> None:
        """Add ``count`` releases at ``z`` to the file (atomically: a crash leaves the previous
        ledger whole)."""
        rows = self.releases()
        when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        rows.append(
            {"run": run, "algorithm": algorithm, "name": name, "noise_multiplier": z, "count": count, "at": when}
        )
        doc = {
            "format": LEDGER_FORMAT,
            "version": 1,
            "accountant": self.accountant,
            "delta": self.delta,
            "releases": rows,
        }

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)

        replace_atomically(self.path, write)
