"""Disclosure rules: the smallest data a client may compute a release from. One set of
defaults for Python, the command line and a node's policy (DataSHIELD's disclosure filters,
made stricter where fedstats' messages need it):

* ``min_rows`` (:data:`MIN_ROWS`, 10): a client with fewer rows takes part in no fit;
* rows per parameter (:data:`MIN_ROWS_PER_PARAMETER`, 3, as DataSHIELD's ``nfilter.glm``):
  for data with a target (a regression-type exchange), a client needs at least 3 rows per
  column of its design;
* ``min_cell_count`` (:data:`MIN_CELL_COUNT`, 5): in every 0/1 column (a dummy of a category,
  a binary outcome) that varies at a client, its count of 1s and of 0s is at least 5. A count
  of 1 to 4 is a small cell: with one row of value 1, the sums a fit sends over the rows where
  the column is 1 (a row of ``X'X``, of ``X'y``) are that row's values.

Each rule is relaxed only explicitly, for one data set and every model fitted to it:
``FederatedData(..., min_rows=, min_cell_count=)`` (and its constructors),
``fedstats fit --min-rows / --min-cell-count``, or the node policy's ``min_rows``,
``min_rows_per_parameter`` and ``min_cell_count``. ``min_rows=1`` turns both row rules off,
``min_cell_count=1`` the cell rule. Every model's ``fit`` checks its data first and refuses a
client that breaks a rule with a :class:`DisclosureError` naming the rule, the client and
the option; a node checks its own data against its policy before every run.

How to choose: the defaults keep a client's messages from pinning down its rows (with
``n`` rows and ``p`` columns, a regression's messages are sums over the rows: at least
``3 p`` rows leave many row sets with the same sums; see the threat-model page for what each
model's messages reveal). Relax them for data that is not about people (simulations,
machines, function evaluations) or when a client's rows are already public to the server.

Example
-------
>>> import numpy as np
>>> from fedstats import FederatedData
>>> from fedstats.data.disclosure import check_disclosure
>>> rng = np.random.default_rng(0)
>>> data = FederatedData.from_arrays([rng.normal(size=(30, 2)), rng.normal(size=(3, 2))],
...                                  [rng.normal(size=30), rng.normal(size=3)], clients=["a", "b"])
>>> check_disclosure(data, "FederatedGLM")
Traceback (most recent call last):
...
fedstats.data.disclosure.DisclosureError: FederatedGLM refuses client 'b' (rule min_rows): it has 3 rows, fewer than 10. To allow it, set min_rows=3; 1 turns the row rules off (FederatedData's min_rows=, --min-rows 3 on the command line, min_rows in a node's policy)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from .validation import DataError

__all__ = [
    "NO_RULES",
    "MIN_ROWS",
    "MIN_ROWS_PER_PARAMETER",
    "MIN_CELL_COUNT",
    "DisclosureError",
    "breach",
    "check_disclosure",
]


class Rules(TypedDict):
    """The data's options of the rules, as keyword arguments of :class:`FederatedData`."""

    min_rows: int
    min_cell_count: int


#: a client with fewer rows takes part in no fit
MIN_ROWS = 10
#: with a target: rows per column of the design (DataSHIELD's nfilter.glm, 0.33 parameters a row)
MIN_ROWS_PER_PARAMETER = 3.0
#: a 0/1 column that varies at a client: its count of 1s and of 0s at least this many
MIN_CELL_COUNT = 5
#: the options that turn every rule off, for data about no one (simulations, function
#: evaluations): ``FederatedData.from_arrays(Xs, ys, **NO_RULES)``
NO_RULES: Rules = {"min_rows": 1, "min_cell_count": 1}


class DisclosureError(DataError):
    """A client's data break a disclosure rule (``rule``): no model computes a release from it."""

    def __init__(self, message: str, rule: str, client: Any) -> None:
        super().__init__(message)
        self.rule, self.client = rule, client


def check_setting(name: str, value: Any) -> int:
    """``value`` of a rule's option (an int >= 1), or a :class:`DataError` naming it."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise DataError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def breach(
    X: np.ndarray,
    y: np.ndarray | None,
    *,
    min_rows: int = MIN_ROWS,
    min_rows_per_parameter: float = MIN_ROWS_PER_PARAMETER,
    min_cell_count: int = MIN_CELL_COUNT,
    names: Sequence[str] | None = None,
    target_name: str | None = None,
) -> tuple[str, str, int] | None:
    """The first rule one client's rows ``X`` (and target ``y``) break: ``(rule, what is
    wrong, the option's value that would allow it)``, or ``None``. ``min_rows=1`` turns both
    row rules off, ``min_cell_count=1`` the cell rule."""
    rows = int(X.shape[0])
    if rows < min_rows:
        return "min_rows", f"it has {rows} rows, fewer than {min_rows}", rows
    cols = int(X.shape[1]) if X.ndim > 1 else 1
    if min_rows > 1 and y is not None and rows < min_rows_per_parameter * cols:
        need = math.ceil(min_rows_per_parameter * cols)
        return (
            "min_rows_per_parameter",
            f"it has {rows} rows for a regression on {cols} columns, which needs {min_rows_per_parameter:g} "
            f"rows per column ({need})",
            1,
        )
    if min_cell_count > 1:
        columns = [X] if y is None else [X, np.asarray(y, dtype=float).reshape(-1, 1)]
        labels = [*(names or [f"column {j}" for j in range(cols)]), target_name or "the target"]
        for j, col in enumerate(np.hstack(columns).T):
            if not np.all((col == 0) | (col == 1)):
                continue
            ones = int(np.count_nonzero(col))
            if ones in (0, rows):  # constant at the client: its sums are the client's own totals
                continue
            small = min(ones, rows - ones)
            if small < min_cell_count:
                value = 1 if small == ones else 0
                return (
                    "min_cell_count",
                    f"{small} of its rows have {labels[j]!r} = {value}, fewer than {min_cell_count} "
                    "(a small cell: the sums over those rows are their values)",
                    small,
                )
    return None


def check_disclosure(data: Any, model: str) -> None:
    """Refuse, with a :class:`DisclosureError`, the first client of ``data`` (a
    :class:`~fedstats.data.FederatedData`) that breaks one of its rules: the check every
    model's ``fit`` makes before its first exchange. Data whose rows live elsewhere (a
    deployment's nodes, which check their own against their policies) pass."""
    X_of = getattr(data, "_X", None)
    min_rows, min_cells = getattr(data, "min_rows", 1), getattr(data, "min_cell_count", 1)
    for c in data.clients if X_of else ():
        X, y = data._X[c], data._y[c]
        if isinstance(X, np.ndarray) and (np.isnan(X).any() or (y is not None and np.isnan(y).any())):
            raise DataError(
                f"{model} needs complete rows, and client {c!r} has missing values (the data were built "
                "with missing='keep', for fedstats.stats): drop or impute them first"
            )
    if not X_of or min_rows == min_cells == 1:
        return
    for c in data.clients:
        found = breach(
            X_of[c],
            data._y[c],
            min_rows=min_rows,
            min_cell_count=min_cells,
            names=data.feature_names,
            target_name=data.target_name,
        )
        if found is not None:
            raise refusal(model, c, found)


def refusal(who: str, client: Any, found: tuple[str, str, int]) -> DisclosureError:
    """The error of ``who`` refusing ``client`` for the rule :func:`breach` ``found``, naming
    the option that would allow it."""
    rule, why, allowed = found
    option = "min_cell_count" if rule == "min_cell_count" else "min_rows"
    kind = "cell" if option == "min_cell_count" else "row"
    off = f"; 1 turns the {kind} rules off" if allowed != 1 else f" (no {kind} rules)"
    cli = "--min-cell-count" if option == "min_cell_count" else "--min-rows"
    return DisclosureError(
        f"{who} refuses client {client!r} (rule {rule}): {why}. To allow it, set {option}={allowed}{off} "
        f"(FederatedData's {option}=, {cli} {allowed} on the command line, {option} in a node's policy)",
        rule,
        client,
    )
