"""A node's release policy: what the owner of a node lets it compute and release.

The node owner writes it (a TOML file, or a :class:`NodePolicy` given to
:func:`~fedstats.federation.flower.make_client_app`); the node reads it and checks every run the
server starts before it computes anything, so the server cannot change it. A run that breaks
a rule is refused with a :class:`PolicyRefusal` that names the rule; the server records the
client as lost (the fit goes on without it, or stops, per ``on_disconnect``) and the node logs
the refusal.

Rules (the disclosure defaults of :mod:`fedstats.data.disclosure`, the same in Python and on
the command line; they follow DataSHIELD's disclosure filters):

* ``min_rows`` (default 10): no release computed from fewer rows (1: no row rules);
* ``min_rows_per_parameter`` (default 3, DataSHIELD's ``nfilter.glm`` of 0.33 parameters per
  row): for a regression (data with a target), rows / columns of the design must reach it;
* ``min_cell_count`` (default 5): in a 0/1 column (a category's dummy, a binary outcome),
  a column that varies at the client has at least this many 1s and 0s (1: off);
* ``algorithms``: the algorithm classes (by name) the node runs; default every fedstats
  algorithm its unpickler admits;
* ``options``: per algorithm class, ranges of its options (attributes): ``[low, high]`` for a
  number, a list of allowed values for a string or a client function (by name), ``true`` /
  ``false`` for a flag. An option the algorithm does not have is refused too (the policy
  names something the node owner expected to be there);
* ``release`` (default ``"messages"``): what the node sends at the end of a run of a model
  whose clients have a result of their own (the client posteriors of EP models and HM1,
  computed on the node): ``"messages"``: nothing beyond the algorithm's messages, the result
  stays on the node; ``"posterior"``: that result too (never the client's data or its
  sufficient statistics);
* ``release_statistics`` (default ``false``): whether the node runs an exchange whose replies
  are its sufficient statistics themselves (HM1's opt-in information share, ``X'X / s^2`` and
  ``X'y / s^2``, which HM1's posteriors need: they couple every client through Omega);
* ``require_secure_aggregation`` (default ``false``): run only exchanges whose every reply
  array is summed by secure aggregation (refuses per-client replies and runs without it);
* ``min_noise_multiplier``: run only differentially private exchanges whose noise, in what
  leaves the node, has at least this multiplier (see :mod:`fedstats.federation.budget`);
* ``epsilon_budget``: the epsilon (at ``budget_delta``, default 1e-6) that all runs together
  may spend on this node's data. The node records every release in ``privacy_ledger`` (a JSON
  file; default ``fedstats-privacy-ledger.json`` in its working directory; ``{client}`` in the
  path stands for the client's name, for a node that serves several) and refuses a run
  whose planned releases would exceed the budget, and any step that would; a run without
  differential privacy releases exact statistics and is refused;
* ``posterior_dir``: the directory where the node writes each such result for its owner (a
  fedstats result file per client and run, read with :func:`fedstats.results.load_result`);
  default: none, except on a deployed node (one that reads its own data), which writes to
  ``fedstats-posteriors`` in its working directory. The node config's ``posterior-dir`` key
  overrides it.

Example
-------
>>> p = NodePolicy.from_toml('min_rows = 10\\n[options.FedEMAlgorithm]\\nM = [1, 4]\\n')
>>> p.min_rows, p.options["FedEMAlgorithm"]["M"]
(10, [1, 4])
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..data.disclosure import MIN_CELL_COUNT, MIN_ROWS, MIN_ROWS_PER_PARAMETER, breach
from .budget import NodeBudget, node_noise_multiplier
from .protocol import PolicyRefusal

__all__ = ["NodePolicy", "PolicyRefusal", "data_shape"]


def data_shape(data: Any) -> tuple[int, int, bool] | None:
    """``(rows, columns, has_target)`` of what the runtime hands a client step, or ``None``
    when it cannot tell (a policy then refuses: it cannot check its rules)."""
    X, y = _rows_of(data)
    if X is None:
        return None
    cols = int(X.shape[1]) if X.ndim > 1 else 1
    return int(X.shape[0]), cols, y is not None


def _allowed(value: Any, allowed: Any) -> bool:
    if callable(value) and not isinstance(value, type):
        value = getattr(value, "__name__", repr(value))
    if isinstance(allowed, bool) or isinstance(value, (bool, np.bool_)):
        return isinstance(allowed, bool) and bool(value) is allowed
    if isinstance(allowed, list) and len(allowed) == 2 and all(isinstance(a, (int, float)) for a in allowed):
        try:
            v = float(value)
        except (TypeError, ValueError):
            return False
        return math.isfinite(v) and allowed[0] <= v <= allowed[1]
    if isinstance(allowed, list):
        return value in allowed
    return bool(value == allowed)


@dataclass(frozen=True)
class NodePolicy:
    """A node's release policy (see the module docs for the rules)."""

    min_rows: int = MIN_ROWS
    min_rows_per_parameter: float = MIN_ROWS_PER_PARAMETER
    min_cell_count: int = MIN_CELL_COUNT
    algorithms: tuple[str, ...] | None = None
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    release: str = "messages"
    release_statistics: bool = False
    posterior_dir: str | None = None
    require_secure_aggregation: bool = False
    min_noise_multiplier: float | None = None
    epsilon_budget: float | None = None
    budget_delta: float = 1e-6
    privacy_ledger: str = "fedstats-privacy-ledger.json"

    def __post_init__(self) -> None:
        if self.release not in ("messages", "posterior"):
            raise ValueError(f"release must be 'messages' or 'posterior', got {self.release!r}")
        if not isinstance(self.release_statistics, bool):
            raise ValueError(f"release_statistics must be true or false, got {self.release_statistics!r}")
        if self.posterior_dir is not None and (not isinstance(self.posterior_dir, str) or not self.posterior_dir):
            raise ValueError(f"posterior_dir must be a directory path, got {self.posterior_dir!r}")
        if not isinstance(self.min_rows, int) or isinstance(self.min_rows, bool) or self.min_rows < 1:
            raise ValueError(f"min_rows must be an int >= 1, got {self.min_rows!r}")
        if not isinstance(self.min_cell_count, int) or isinstance(self.min_cell_count, bool) or self.min_cell_count < 1:
            raise ValueError(f"min_cell_count must be an int >= 1, got {self.min_cell_count!r}")
        if not (isinstance(self.min_rows_per_parameter, (int, float)) and self.min_rows_per_parameter >= 0):
            raise ValueError(f"min_rows_per_parameter must be a number >= 0, got {self.min_rows_per_parameter!r}")
        if self.algorithms is not None:
            if isinstance(self.algorithms, str) or not all(isinstance(a, str) for a in self.algorithms):
                raise ValueError("algorithms must be a list of algorithm class names")
            object.__setattr__(self, "algorithms", tuple(self.algorithms))
        if not isinstance(self.require_secure_aggregation, bool):
            raise ValueError(
                f"require_secure_aggregation must be true or false, got {self.require_secure_aggregation!r}"
            )
        for key in ("min_noise_multiplier", "epsilon_budget"):
            v = getattr(self, key)
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0):
                raise ValueError(f"{key} must be a number >= 0, got {v!r}")
        if not (isinstance(self.budget_delta, float) and 0.0 < self.budget_delta < 1.0):
            raise ValueError(f"budget_delta must be a number in (0, 1), got {self.budget_delta!r}")
        if not isinstance(self.privacy_ledger, str) or not self.privacy_ledger:
            raise ValueError(f"privacy_ledger must be a file path, got {self.privacy_ledger!r}")
        if not isinstance(self.options, Mapping) or not all(isinstance(v, Mapping) for v in self.options.values()):
            raise ValueError("options must map algorithm class names to tables of option ranges")

    @classmethod
    def from_toml(cls, text: str) -> NodePolicy:
        """The policy a TOML document states (unknown keys are an error, not ignored)."""
        doc = tomllib.loads(text)
        unknown = set(doc) - {
            "min_rows",
            "min_rows_per_parameter",
            "min_cell_count",
            "algorithms",
            "options",
            "release",
            "release_statistics",
            "posterior_dir",
            "require_secure_aggregation",
            "min_noise_multiplier",
            "epsilon_budget",
            "budget_delta",
            "privacy_ledger",
        }
        if unknown:
            raise ValueError(f"unknown policy keys {sorted(unknown)}")
        if isinstance(doc.get("algorithms"), list):
            doc["algorithms"] = tuple(doc["algorithms"])
        return cls(**doc)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> NodePolicy:
        """The policy in the TOML file at ``path``."""
        with open(path, encoding="utf-8") as f:
            return cls.from_toml(f.read())

    def check(self, algorithm: Any, data: Any) -> None:
        """Raise :class:`PolicyRefusal` if running ``algorithm`` on ``data`` breaks a rule."""
        name = type(algorithm).__name__
        if self.algorithms is not None and name not in self.algorithms:
            raise PolicyRefusal("algorithms", f"this node does not run {name} (it accepts {list(self.algorithms)})")
        if getattr(algorithm, "releases_statistics", False) and not self.release_statistics:
            raise PolicyRefusal(
                "release_statistics",
                f"{name} would send this client's sufficient statistics; the node releases them only "
                "with release_statistics = true in its policy",
            )
        for option, allowed in self.options.get(name, {}).items():
            if not hasattr(algorithm, option):
                raise PolicyRefusal("options", f"{name} has no option {option!r} for the policy to check")
            value = getattr(algorithm, option)
            if not _allowed(value, allowed):
                shown = getattr(value, "__name__", value) if callable(value) else value
                raise PolicyRefusal("options", f"{name}.{option} = {shown!r} is outside this node's range {allowed!r}")
        X, y = _rows_of(data)
        if X is None:
            raise PolicyRefusal("min_rows", f"cannot count the rows of a {type(data).__name__} to check the policy")
        found = breach(
            X,
            y,
            min_rows=self.min_rows,
            min_rows_per_parameter=self.min_rows_per_parameter,
            min_cell_count=self.min_cell_count,
        )
        if found is not None:
            rule, why, _ = found
            raise PolicyRefusal(rule, f"this client's data break it: {why}")


def _rows_of(data: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(X, y)`` of what the runtime hands a client step (``(None, None)``: cannot tell)."""
    if isinstance(data, tuple) and data and isinstance(data[0], np.ndarray):
        return data[0], (data[1] if len(data) > 1 and isinstance(data[1], np.ndarray) else None)
    if hasattr(data, "X") and isinstance(data.X, np.ndarray):
        return data.X, getattr(data, "y", None)
    if isinstance(data, np.ndarray):
        return data, None
    return None, None


def _run_rules(policy: NodePolicy, algorithm: Any, secure: bool) -> float | None:
    """The checks of secure aggregation and noise; the noise multiplier of one release as the
    node counts it (``None`` when the policy sets no noise or budget rule)."""
    name = type(algorithm).__name__
    if policy.require_secure_aggregation:
        per_client = [k for k in getattr(algorithm, "reply_keys", ()) if k not in getattr(algorithm, "summed_keys", ())]
        if per_client:
            raise PolicyRefusal(
                "require_secure_aggregation",
                f"{name} replies {per_client} per client, which secure aggregation cannot sum",
            )
        if not secure:
            raise PolicyRefusal("require_secure_aggregation", f"this run of {name} is not under secure aggregation")
    if policy.min_noise_multiplier is None and policy.epsilon_budget is None:
        return None

    z = node_noise_multiplier(algorithm, secure)
    if policy.min_noise_multiplier is not None and z < policy.min_noise_multiplier:
        raise PolicyRefusal(
            "min_noise_multiplier",
            f"{name}'s releases would leave this node with noise multiplier {z:.3g}; the node requires "
            f"at least {policy.min_noise_multiplier:g}"
            + (" (without differential privacy: exact statistics)" if z == 0 else ""),
        )
    return z


def check_run(policy: NodePolicy, algorithm: Any, client: Any, *, secure: bool, rounds: int | None) -> None:
    """Refuse (:class:`PolicyRefusal`) a run that breaks the policy's rules on secure
    aggregation, noise and privacy budget: its ``rounds`` releases are planned against the
    node's ledger (:mod:`fedstats.federation.budget`)."""
    z = _run_rules(policy, algorithm, secure)
    if policy.epsilon_budget is None or z is None:
        return
    if not isinstance(rounds, int) or rounds < 1:
        raise PolicyRefusal(
            "epsilon_budget", "the run does not say how many rounds it plans: the node cannot budget it"
        )
    budget(policy, client).check(
        z, rounds, f"this run of {type(algorithm).__name__} ({rounds} releases at noise multiplier {z:.3g})"
    )


def check_step(policy: NodePolicy, algorithm: Any, client: Any, *, secure: bool, what: str) -> tuple[Any, float] | None:
    """The per-step rules: refuse a step outside secure aggregation (when required) or one
    release past the budget; ``(the node's budget, the step's noise multiplier)`` to record the
    release once made, or ``None`` without a budget."""
    z = _run_rules(policy, algorithm, secure)
    if policy.epsilon_budget is None or z is None:
        return None
    b = budget(policy, client)
    b.check(z, 1, what)
    return b, z


def budget(policy: NodePolicy, client: Any) -> Any:
    """The :class:`~fedstats.federation.budget.NodeBudget` of ``client``'s data on this node
    (its policy sets ``epsilon_budget``)."""

    assert policy.epsilon_budget is not None
    path = policy.privacy_ledger.replace("{client}", re.sub(r"[^A-Za-z0-9_.-]+", "_", str(client)) or "client")
    return NodeBudget(path, policy.epsilon_budget, policy.budget_delta)


def policy_of(value: NodePolicy | str | os.PathLike | None) -> NodePolicy:
    """A :class:`NodePolicy` from a policy, a TOML file path or ``None`` (the defaults)."""
    if value is None:
        return NodePolicy()
    if isinstance(value, NodePolicy):
        return value
    if isinstance(value, (str, os.PathLike)):
        return NodePolicy.from_file(value)
    raise TypeError(f"policy must be a NodePolicy, a TOML file path or None, got {type(value).__name__}")
