"""What the command prints and writes: the tables of the result contract, p-values as
printed, and the JSON records (non-finite values as ``null``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def table(df: pd.DataFrame, estimates: str | None = None) -> str:
    """A table as printed: p-values as :func:`fedstats.results.printed_p_values` shows them,
    the columns named for what they hold when ``estimates`` says (``"posterior"`` or
    ``"estimate"``, :data:`fedstats.summary_table.ESTIMATE_KINDS`)."""
    from ..results import printed_p_values
    from ..summary_table import ESTIMATE_KINDS

    shown = pd.DataFrame(printed_p_values(df))
    return shown.rename(columns=ESTIMATE_KINDS.get(estimates or "", {})).to_string()


def communication(res) -> dict:
    """The JSON of a fit's communication: totals and the per-kind breakdown (every exchange of
    the fit, one-off rounds included)."""
    c = res.communication
    return {
        "bytes_up": int(c.bytes_up),
        "bytes_down": int(c.bytes_down),
        "by_kind": {
            k: {"bytes_up": int(v["bytes_up"]), "bytes_down": int(v["bytes_down"]), "rounds": int(v["rounds"])}
            for k, v in c.by_kind.items()
        },
    }


def json_ready(out: Any) -> tuple[Any, list[str]]:
    """``out`` with every non-finite float replaced by ``None`` (JSON has no NaN or Infinity;
    strict parsers reject them), and where that happened: ``"section name field"`` strings
    such as ``"global mean[3][x1] sd"``."""
    found: list[str] = []

    def walk(x: Any, path: list[str]) -> Any:
        if isinstance(x, dict):
            here = path + ([x["name"]] if isinstance(x.get("name"), str) else [])
            return {k: walk(v, here + [str(k)]) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, path if isinstance(v, dict) else path + [str(i)]) for i, v in enumerate(x)]
        if isinstance(x, (float, np.floating)) and not np.isfinite(x):
            found.append(" ".join(path))
            return None
        return x.item() if isinstance(x, np.generic) else x

    return walk(out, []), found


def nonfinite_warning(where: list[str], mixture: bool) -> str:
    """The warning for non-finite values written as null; ``mixture``: the fit has components
    (a component's name in ``where`` then says which are empty)."""
    import re

    comps = sorted({int(m.group(1)) for w in where if (m := re.search(r"\b(?:mean|var|weight)\[(\d+)\]", w))})
    if mixture and comps:
        why = (
            f"component(s) {', '.join(map(str, comps))} are (almost) empty: no client gives them weight, so "
            "their posterior is the prior and some sds are infinite"
        )
    else:
        why = ", ".join(where[:6]) + (" ..." if len(where) > 6 else "")
    return f"warning: {len(where)} non-finite value(s) written as null (JSON has no NaN or Infinity): {why}"


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One JSON record per row: ``name``, the contract's columns (``null`` where the model has
    no value), then the table's own columns (HM1's ``estimate``, the lasso's ``selected``)."""
    from ..results import SUMMARY_COLUMNS

    cols = [*SUMMARY_COLUMNS, *(c for c in df.columns if c not in SUMMARY_COLUMNS)]
    out = []
    for name, row in df.iterrows():
        rec: dict[str, Any] = {"name": str(name)}
        for c in cols:
            v = row.get(c, np.nan)
            rec[c] = v if isinstance(v, (bool, np.bool_)) or v is None else (None if pd.isna(v) else float(v))
        out.append(rec)
    return out


def print_predictions(rows: list[dict[str, Any]], args) -> None:
    """The prediction records as a table on stdout, one line per row of ``--predict`` in its
    order (the JSON's ``"predictions"``; a mixture's ``proba`` shown rounded)."""
    frame = pd.DataFrame(rows)
    if "proba" in frame.columns:
        frame["proba"] = [None if p is None else [round(float(v), 3) for v in p] for p in frame["proba"]]
    frame = frame[[c for c in frame.columns if frame[c].notna().any()]]
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.max_rows", 200):
        print(
            f"\nPredictions for {args.predict} ({100 * args.level:g}% bands: lower/upper of the mean, "
            "pred_lower/pred_upper of a new observation)"
            if "pred_lower" in frame.columns
            else f"\nPredictions for {args.predict}"
        )
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


def print_tables(g, tables, res, args, head: list[str]) -> None:
    """The header lines ``head``, the global table and one table per client."""

    def shown(t):  # the columns with a value somewhere
        return t[[c for c in t.columns if t[c].notna().any()]]

    from ..summary_table import table_note

    pct = f"{100 * args.level:g}%"
    estimates = res._estimates()
    with pd.option_context(
        "display.width", 120, "display.max_columns", 10, "display.max_rows", 60, "display.float_format", "{:.4f}".format
    ):
        print("\n".join(head))
        if len(g):
            print(table(shown(g), estimates))
            print(table_note(estimates, args.level))
        excluded = dict(getattr(res, "excluded", None) or {})
        printed = False
        for c, s in tables.items():
            if c in excluded:
                print(f"\nClient {c}: not in the fit, no numbers: {excluded[c]}")
            elif len(s):
                print(f"\nClient {c}")
                print(
                    table(
                        shown(s).assign(
                            **(
                                {"selected": s["selected"].map({True: "yes", False: "no"}).fillna("")}
                                if "selected" in s.columns
                                else {}
                            )
                        ),
                        estimates,
                    )
                )
                printed = True
        if printed:
            print(f"\nEvery client's table: {table_note(estimates, args.level)}")
        if any("selected" in s.columns for s in tables.values()):
            print(f"\nselected: the {pct} credible interval excludes 0 (the intercept is never penalised or selected)")
