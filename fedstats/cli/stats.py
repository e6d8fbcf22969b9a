"""``fedstats describe`` and ``fedstats test``: :mod:`fedstats.stats` on a CSV with one client per
value of ``--by`` (missing values allowed: empty fields; text columns are categorical).

``fedstats describe DATA.csv --by SITE [--columns A B ...] [--group G] [--output T.json|.csv|.html]``
prints the "Table 1"; ``fedstats test DATA.csv --by SITE --test TEST --column Y [--group G] ...``
prints one row per test (several ``--column``\\ s: one test each, ``--adjust holm|bh`` for the
family); ``--test wald|lr`` runs the exact GLM of ``--target`` on ``--columns`` and tests them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..data.disclosure import MIN_CELL_COUNT, MIN_ROWS
from .errors import CLIError
from .inputs import check_columns, read_csv

#: test name -> (function name, what it needs, extra keyword arguments)
TESTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "welch": ("ttest", "column group", {"equal_var": False}),
    "student": ("ttest", "column group", {"equal_var": True}),
    "ttest": ("ttest", "column", {}),
    "paired": ("paired_ttest", "pair", {}),
    "anova": ("anova", "column group", {"equal_var": True}),
    "welch-anova": ("anova", "column group", {"equal_var": False}),
    "chi2": ("chi2_test", "pair-or-column", {}),
    "fisher": ("fisher_exact", "pair", {}),
    "mh": ("mantel_haenszel", "pair", {}),
    "pearson": ("correlation", "pair", {"method": "pearson"}),
    "spearman": ("correlation", "pair", {"method": "spearman"}),
    "proportions": ("proportions_test", "column", {}),
    "mannwhitney": ("mannwhitneyu", "column group", {}),
    "kruskal": ("kruskal", "column group", {}),
    "logrank": ("logrank_test", "survival", {}),
    "wald": ("", "regression", {}),
    "lr": ("", "regression", {}),
}
_WITH_ALTERNATIVE = {"ttest", "paired_ttest", "correlation", "fisher_exact", "proportions_test", "mannwhitneyu"}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="CSV file (separator detected; empty fields are missing values)")
    p.add_argument("--by", required=True, help="column naming each row's client")
    p.add_argument("--level", type=float, default=0.95, help="level of the intervals (default 0.95)")
    p.add_argument("--decimal", default=".", choices=(".", ","), help="decimal separator of the CSV")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--min-rows",
        type=int,
        default=MIN_ROWS,
        help=f"disclosure rule: the fewest rows a client may have, and of a statistic's values (default {MIN_ROWS})",
    )
    p.add_argument(
        "--min-cell-count",
        type=int,
        default=MIN_CELL_COUNT,
        help=f"disclosure rule: the fewest rows of a category at a client and in a released table cell "
        f"(default {MIN_CELL_COUNT}); 1 turns it off",
    )


def add_parsers(sub: Any, fit_parser: argparse.ArgumentParser) -> None:
    """The ``describe`` and ``test`` sub-commands (``fit_parser``: the ``fit`` sub-command's
    parser, which ``--test wald|lr`` hands its fit to)."""
    d = sub.add_parser("describe", help='a "Table 1" of a CSV with one client per value of --by')
    _common(d)
    d.add_argument("--columns", nargs="+", help="columns to describe (default: all but --by and --group)")
    d.add_argument("--group", help="describe per level of this column too")
    d.add_argument("--output", help="write the table here: .json, .csv (the long table) or .html (the Table 1)")
    d.add_argument(
        "--survival", metavar="TIME", help="the Kaplan-Meier curve of this time column instead (needs --event)"
    )
    d.add_argument("--event", help="--survival: the 0/1 event column (1: the event at the time; 0: censored)")
    d.add_argument("--bins", nargs="+", type=float, metavar="EDGE", help="--survival: coarsen the times to these edges")
    t = sub.add_parser("test", help="a classical test on a CSV with one client per value of --by")
    _common(t)
    t.add_argument("--test", required=True, choices=list(TESTS), help="the test (see the docs' command-line page)")
    t.add_argument("--column", nargs="+", help="the tested column(s): one test per column")
    t.add_argument("--group", help="the column whose levels are compared")
    t.add_argument("--columns", nargs="+", help="two columns (paired, chi2, fisher, mh, pearson, spearman); wald/lr: "
                   "the predictors tested")  # fmt: skip
    t.add_argument("--groups", nargs=2, metavar="LEVEL", help="the two levels of --group to compare")
    t.add_argument("--strata", help="mh: the strata column (default: the clients)")
    t.add_argument("--mu", type=float, default=0.0, help="ttest/paired/welch/student: the null difference")
    t.add_argument("--value", type=float, help="proportions: the null proportion (one sample; default 0.5)")
    t.add_argument("--expected", nargs="+", type=float, help="chi2 with one column: the expected proportions")
    t.add_argument("--alternative", default="two-sided", choices=("two-sided", "less", "greater"))
    t.add_argument("--adjust", choices=("holm", "bh"), help="adjust the p-values of several --column tests")
    t.add_argument("--event", help="logrank: the 0/1 event column (--column: the time; --group: the groups)")
    t.add_argument("--stratify", action="store_true", help="logrank: each client a stratum (no time leaves it)")
    t.add_argument("--bins", nargs="+", type=float, metavar="EDGE", help="logrank: coarsen the times to these edges")
    t.add_argument("--target", help="wald/lr: the GLM's response column")
    t.add_argument("--family", default="gaussian", help="wald/lr: the GLM's family (default gaussian)")
    t.add_argument("--output", help="write the results as JSON here")
    t.set_defaults(fit_parser=fit_parser)


def _data(df: pd.DataFrame, args: Any, columns: list[str]) -> Any:
    from ..data import DataError, FederatedData

    missing = [c for c in [args.by, *columns] if c not in df.columns]
    if missing:
        raise CLIError(
            f"{args.data}: column(s) not found: {', '.join(missing)} (columns: {', '.join(map(str, df.columns))})"
        )
    check_columns(df, columns, None, args.by, args.data)
    try:
        return FederatedData.from_dataframe(
            df[[args.by, *columns]],
            by=args.by,
            features=columns,
            missing="keep",
            min_rows=args.min_rows,
            min_cell_count=args.min_cell_count,
        )
    except DataError as exc:
        raise CLIError(f"{args.data}: {exc}") from None


def describe_command(args: Any) -> None:
    from ..stats import describe

    if args.survival:
        return _survival_curves(args)
    if args.event or args.bins:
        raise CLIError("--event and --bins go with --survival TIME (the Kaplan-Meier curve)")
    df = read_csv(args.data, args.decimal)
    columns = list(args.columns) if args.columns else [c for c in df.columns if c not in (args.by, args.group)]
    data = _data(df, args, list(dict.fromkeys([*columns, *([args.group] if args.group else [])])))
    res = describe(data, columns, by=args.group, level=args.level, seed=args.seed)
    print(repr(res))
    if args.output:
        path = Path(args.output)
        kind = path.suffix.lower()
        if kind not in (".json", ".csv", ".html"):
            raise CLIError(f"--output writes .json, .csv or .html, got {args.output}")
        text = {".json": lambda: res.to_json(indent=2), ".csv": lambda: res.to_frame().to_csv(), ".html": res.to_html}[
            kind
        ]()
        _write(path, text)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror}") from None
    print(f"\nwrote {path}")


def test_command(args: Any) -> None:
    from .. import stats

    name, needs, extra = TESTS[args.test]
    if needs == "regression":
        return _regression_test(args)
    if needs == "survival":
        return _survival_test(args)
    df = read_csv(args.data, args.decimal)
    columns = args.column or []
    if "pair" in needs and args.columns:
        if len(args.columns) != 2:
            raise CLIError(f"--test {args.test} takes two --columns, got {len(args.columns)}")
        calls = [list(args.columns)]
    elif "column" in needs and columns:
        calls = [[c] for c in columns]
    else:
        what = "two --columns" if needs == "pair" else "--column (or two --columns)" if "pair" in needs else "--column"
        raise CLIError(f"--test {args.test} needs {what}")
    if "group" in needs and not args.group:
        raise CLIError(f"--test {args.test} needs --group")
    used = sorted({c for call in calls for c in call} | {g for g in (args.group, args.strata) if g})
    data = _data(df, args, used)
    fn = getattr(stats, name)
    kw: dict[str, Any] = {**extra, "level": args.level, "seed": args.seed}
    if name in _WITH_ALTERNATIVE:
        kw["alternative"] = args.alternative
    if name in ("ttest", "paired_ttest"):
        kw["mu"] = args.mu
    if name in ("ttest", "proportions_test", "mannwhitneyu") and args.groups:
        kw["groups"] = args.groups
    if name == "proportions_test" and args.value is not None:
        kw["value"] = args.value
    if name == "chi2_test" and args.expected:
        kw["expected"] = args.expected
    if name == "mantel_haenszel" and args.strata:
        kw["strata"] = args.strata
    results = []
    for call in calls:
        pos = call + ([args.group] if "group" in needs or (args.group and name == "proportions_test") else [])
        results.append(fn(data, *pos, **kw))
    table = pd.concat([r.summary() for r in results])
    table.insert(0, "column", [" & ".join(c) for c in calls])
    if args.adjust:
        table.insert(table.columns.get_loc("p_value") + 1, "p_adjusted", stats.adjust(table.p_value, args.adjust))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string())
    for r in results:
        h = r.details.get("homogeneity")
        if h is not None:
            print(f"\n{h!r}")
    if args.output:
        out = [r.to_dict() for r in results]
        if args.adjust:
            for rec, p in zip(out, table.p_adjusted, strict=True):
                rec["p_adjusted"] = float(p)
        _write(Path(args.output), json.dumps(out, indent=2, allow_nan=False))


def _survival_test(args: Any) -> None:
    """``--test logrank``: the log-rank test of the times ``--column`` with events ``--event``
    between the levels of ``--group`` (:func:`fedstats.survival.logrank_test`)."""
    from ..data import DataError
    from ..survival import logrank_test

    if not args.column or len(args.column) != 1 or not args.event or not args.group:
        raise CLIError(f"--test {args.test} needs one --column (the time), --event and --group")
    data = _survival_data(args, args.column[0], [args.event, args.group])
    try:
        res = logrank_test(
            data, args.event, args.group, stratify=args.stratify, bins=args.bins, level=args.level, seed=args.seed
        )
    except DataError as exc:  # a refusal by the disclosure rules too: its message names the options
        raise CLIError(f"{args.data}: {exc}".replace("bins=[...]", "--bins")) from None
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(res.summary().to_string())
    if args.output:
        _write(Path(args.output), json.dumps([res.to_dict()], indent=2, allow_nan=False))


def _survival_data(args: Any, time: str, columns: list[str]) -> Any:
    """The CSV's ``time`` (the target) and ``columns``, by client."""
    from ..data import DataError, FederatedData

    df = read_csv(args.data, args.decimal)
    missing = [c for c in (args.by, time, *columns) if c not in df.columns]
    if missing:
        raise CLIError(f"{args.data}: column(s) not found: {', '.join(missing)}")
    try:
        return FederatedData.from_dataframe(
            df[[args.by, time, *columns]], by=args.by, target=time,
            min_rows=args.min_rows, min_cell_count=args.min_cell_count,
        )  # fmt: skip
    except DataError as exc:
        raise CLIError(f"{args.data}: {exc}") from None


def _survival_curves(args: Any) -> None:
    """``describe --survival TIME --event E [--group G] [--bins ...]``: the pooled Kaplan-Meier
    curve of each group (:class:`fedstats.survival.KaplanMeier`), its median with interval and
    its table."""
    from ..data import DataError
    from ..survival import KaplanMeier

    if not args.event:
        raise CLIError("--survival needs --event, the 0/1 column of events")
    data = _survival_data(args, args.survival, [args.event, *([args.group] if args.group else [])])
    try:
        km = KaplanMeier(event=args.event, group=args.group, bins=args.bins).fit(data, seed=args.seed)
    except DataError as exc:  # a refusal by the disclosure rules too: its message names the options
        raise CLIError(f"{args.data}: {exc}".replace("bins=[...]", "--bins")) from None
    pct = f"{100 * args.level:g}%"
    out = []
    for g in km.groups:
        median, lo, hi = km.median_survival(g, args.level)
        table = km.table(g, args.level)
        name = "all rows" if args.group is None else f"{args.group} = {g}"
        print(f"{name}: median {args.survival} {_reached(median)} ({pct} interval {_reached(lo)} to {_reached(hi)})")
        with pd.option_context("display.width", 200, "display.max_rows", 40):
            print(table.to_string(), end="\n\n")
        out.append(
            {
                "group": None if args.group is None else str(g),
                "median": _finite(median),
                "median_lower": _finite(lo),
                "median_upper": _finite(hi),
                "table": [
                    {args.survival: float(t), **{k: float(v) for k, v in row.items()}} for t, row in table.iterrows()
                ],
            }
        )
    if args.output:
        doc = {"time": args.survival, "event": args.event, "group": args.group, "level": args.level, "curves": out}
        _write(Path(args.output), json.dumps(doc, indent=2, allow_nan=False))


def _reached(t: float) -> str:
    return f"{t:g}" if np.isfinite(t) else "not reached"


def _finite(t: float) -> float | None:
    """A median or its bound in JSON: null where the curve never reaches 0.5."""
    return float(t) if np.isfinite(t) else None


def _regression_test(args: Any) -> None:
    """``--test wald|lr``: the fit of ``--target`` on ``--columns`` (and the ``--column``
    values) by the registry's model that declares these tests (the exact GLM), and its Wald or
    likelihood-ratio test of ``--columns``."""
    from ..registry import commands
    from . import fit

    flag = "--wald" if args.test == "wald" else "--lr-test"
    model = next((m for m, c in commands().items() if any(o.flag == flag for o in c.options)), None)
    if model is None:
        raise CLIError(f"no model declares {flag}")
    if not args.target or not args.columns:
        raise CLIError(f"--test {args.test} needs --target and --columns (the predictors tested)")
    argv = [args.data, "--by", args.by, "--model", model, "--target", args.target, "-q"]
    argv += ["--features", *dict.fromkeys([*(args.column or []), *args.columns])]
    argv += ["--family", args.family, "--level", str(args.level), "--seed", str(args.seed)]
    argv += ["--min-rows", str(args.min_rows), "--min-cell-count", str(args.min_cell_count)]
    argv += ["--decimal", args.decimal, flag, *args.columns]
    fit_args = args.fit_parser.parse_args(argv)
    out = fit.fit(fit_args)
    tests = out.get("tests", [])
    print(pd.DataFrame(tests).to_string(index=False))
    if args.output:
        _write(Path(args.output), json.dumps(tests, indent=2, allow_nan=False))
