"""Summary tables that print what their numbers are.

Every model's ``summary()`` and ``client_summary()`` keep the contract's column names
(``mean, sd, lower, upper, p_value``) whatever the model, so code reads every model alike. What
those columns hold differs: a Bayesian model's posterior mean, sd, credible interval and
posterior tail probability of 0, or a frequentist model's estimate, standard error,
confidence interval and p-value. A :class:`SummaryTable` is a plain :class:`pandas.DataFrame`
in every respect but its printed form (``repr``, ``str`` and the notebook's HTML), which
names the columns for what they hold and adds a line under the table saying which. It stays a
``SummaryTable`` through selections, ``round``, ``head`` and the like. A leaf: it imports
nothing of fedstats.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

__all__ = ["SummaryTable", "ESTIMATE_KINDS", "labelled", "table_note"]

#: what the columns hold, by kind of estimate: the printed header of each contract column
ESTIMATE_KINDS: dict[str, dict[str, str]] = {
    "posterior": {"mean": "posterior mean", "sd": "sd", "p_value": "tail prob."},
    "estimate": {"mean": "estimate", "sd": "std err", "p_value": "p-value"},
}


def table_note(kind: str, level: float) -> str:
    """The line printed under a table of ``kind``: what its columns hold."""
    pct = f"{100 * level:g}% " if 0 < level < 1 else ""  # NaN: no level known
    if kind == "posterior":
        return (
            f"posterior mean and sd; lower, upper: {pct}credible interval; "
            "tail prob.: two-sided posterior tail probability of 0"
        )
    return f"estimate and standard error; lower, upper: {pct}confidence interval; p-value: test that the parameter is 0"


class SummaryTable(pd.DataFrame):
    """A summary table (a :class:`pandas.DataFrame`) whose printed form says what its numbers
    are: ``attrs["estimates"]`` is ``"posterior"`` or ``"estimate"`` and ``attrs["level"]``
    the intervals' level. The columns themselves keep their names.

    Examples
    --------
    >>> t = labelled(pd.DataFrame({"mean": [1.0], "sd": [0.5]}, index=["x"]), "estimate", 0.95)
    >>> print(t)
       estimate  std err
    x       1.0      0.5
    estimate and standard error; lower, upper: 95% confidence interval; p-value: test that the parameter is 0
    >>> list(t.columns)
    ['mean', 'sd']
    """

    @property
    def _constructor(self) -> Any:
        return SummaryTable

    def _shown(self) -> tuple[pd.DataFrame, str] | None:
        kind = self.attrs.get("estimates")
        if kind not in ESTIMATE_KINDS:
            return None
        plain = pd.DataFrame(self).rename(columns=ESTIMATE_KINDS[kind])
        return plain, table_note(kind, float(self.attrs.get("level") or "nan"))

    def __repr__(self) -> str:
        shown = self._shown()
        if shown is None:
            return super().__repr__()
        return f"{shown[0]!r}\n{shown[1]}"

    def _repr_html_(self) -> str | None:
        shown = self._shown()
        if shown is None:
            return super()._repr_html_()
        table = shown[0]._repr_html_()
        return None if table is None else f"{table}<p><small>{html.escape(shown[1])}</small></p>"


def labelled(frame: pd.DataFrame, kind: str, level: float) -> SummaryTable:
    """``frame`` as a :class:`SummaryTable` whose numbers are of ``kind`` (``"posterior"`` or
    ``"estimate"``) at the intervals' ``level``."""
    if kind not in ESTIMATE_KINDS:
        raise ValueError(f"kind must be one of {sorted(ESTIMATE_KINDS)}, got {kind!r}")
    out = SummaryTable(frame)
    out.attrs = {**frame.attrs, "estimates": kind, "level": level}
    return out
