"""The ``fedstats`` command.

``fedstats fit DATA.csv --by CLIENT --target Y [--features A B ...] [--model MODEL]
[--level 0.9] [--rounds N] [--seed S] [--output OUT.json] [--predict TEST.csv]`` fits a
federated model with one client per value of ``--by``. Every model (hm2, lasso, ridge, hm1,
fgpr, gmm, glm) goes through one path, the result contract of :mod:`fedstats.results`: the
printed tables and the JSON's ``"global"`` and ``"client"`` are ``summary(level)`` and
``client_summary(level)`` (records ``name, mean, sd, lower, upper, p_value``, ``null`` where
the model has no distribution, then the model's own columns such as HM1's ``estimate``,
the lasso's ``selected`` or the GLM's ``z`` and ``se``), ``"predictions"`` come from ``predict`` (regressions: its
columns with their Python names and meanings, ``mean``, the credible band of the mean
``lower``/``upper``, the predictive band of a new observation ``pred_lower``/``pred_upper``;
mixtures, with scikit-learn's meaning: ``component``, ``proba``, ``logdensity``; printed as a
table when there is no ``--output``), and ``"communication"`` is the fit's one ledger with its
per-kind breakdown. What differs per model is declared with the model
(:mod:`fedstats.registry`): its options, the estimator's construction, the header line and a
few model-specific JSON fields. A client not in the fit is predicted as a new client (``new_client``)
where the model has a rule for one, and refused before the fit by hm1 and fgpr.
``fedstats demo`` simulates a federation, fits it and prints the fit beside the pooled gold
standard. ``fedstats describe`` and ``fedstats test`` print a descriptive table and classical
tests (:mod:`.stats`, on :mod:`fedstats.stats`).

Bad input gives a one-line error on stderr and exit status 2 (1 for a failed fit).

Modules: :mod:`.inputs` (reading and checking the CSVs), :mod:`.models` (the models' options and
checks, read from the registry), :mod:`.output` (tables and JSON), and one per
sub-command, :mod:`.fit` and :mod:`.demo`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..data.disclosure import MIN_CELL_COUNT, MIN_ROWS
from ..registry import commands
from . import demo, fit, models, stats
from .errors import CLIError

__all__ = ["main", "build_parser", "CLIError"]


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    p = argparse.ArgumentParser(prog="fedstats", description="Federated statistics from the command line.")
    p.add_argument("--version", action="version", version=f"fedstats {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser(
        "fit",
        help="fit a federated model to a CSV with one client per value of --by",
        formatter_class=models.HelpFormatter,
    )
    f.add_argument("data", help="CSV file (separator detected)")
    f.add_argument("--by", required=True, help="column naming each row's client")
    untargeted = [n for n, c in commands().items() if not c.target]
    f.add_argument("--target", help=f"response column (every model but {', '.join(untargeted)})")
    f.add_argument("--features", nargs="+", help="feature columns (default: all but --by and --target)")
    f.add_argument("--model", default=next(iter(commands())), help=models.model_help())
    f.add_argument("--level", type=float, default=0.95, help="credible level (default 0.95)")
    models.add_arguments(f)  # every model's own options, from its declaration
    f.add_argument(
        "--decimal",
        default=".",
        choices=(".", ","),
        help="decimal separator of the CSVs (',' reads semicolon-separated files with decimal commas)",
    )
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    f.add_argument(
        "--progress",
        action="store_true",
        help="a progress line per round on stderr even when it is not a terminal (default: only on a terminal)",
    )
    f.add_argument(
        "--min-rows",
        type=int,
        default=MIN_ROWS,
        help=f"disclosure rule: the fewest rows a client may have (default {MIN_ROWS}), and with a target at least "
        "3 per column; 1 turns both off. A client that breaks it is an error naming it",
    )
    f.add_argument(
        "--min-cell-count",
        type=int,
        default=MIN_CELL_COUNT,
        help=f"disclosure rule: in a 0/1 column (a category's dummy, a binary outcome) a client's count of 1s and "
        f"of 0s is at least this where the column varies at the client (default {MIN_CELL_COUNT}); 1 turns it off",
    )
    f.add_argument("--output", help="write the results as JSON here")
    f.add_argument(
        "--plot",
        metavar="FILE",
        help="write the fit's plot here (.png, .svg or .pdf): a forest plot of every client's estimates and the "
        "population's for a regression, the components over a client's rows for a mixture, a client's predictive "
        "band for fgpr (fedstats.plots)",
    )
    f.add_argument(
        "--predict",
        help="CSV of rows to predict (same client and feature columns); printed as a table unless --output is given",
    )
    stats.add_parsers(sub, f)
    d = sub.add_parser("demo", help="simulate a federation, fit it, compare with the pooled gold standard")
    d.add_argument("--seed", type=int, default=0)
    return p


def _raise_cli_error(message: str) -> NoReturn:
    raise CLIError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    # argparse prints usage on errors; turn its errors into our one-line form (argparse has no
    # hook for that: the method is replaced on the parser and its sub-command parsers)
    parser.error = _raise_cli_error  # type: ignore[method-assign]
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sp in action.choices.values():
                sp.error = parser.error
    try:
        args = parser.parse_args(argv)
        commands = {"demo": demo.command, "fit": fit.command}
        commands |= {"describe": stats.describe_command, "test": stats.test_command}
        commands[args.command](args)
        return 0
    except CLIError as exc:
        print(f"fedstats: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedstats: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - no tracebacks for users; the message says what failed
        print(f"fedstats: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
