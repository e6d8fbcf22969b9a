"""The command's models, read from the registry (:mod:`fedstats.registry`): each model's
options on the ``fit`` parser, the checks every model shares, and the model's declared
:class:`~fedstats.registry.spec.Command`. Nothing here names a model: a new model's
declaration brings its options, checks, header and JSON fields with it."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable

from ..registry import commands, declarations
from ..registry.spec import Command, Option
from .errors import CLIError


def _names(items: list[str]) -> str:
    """``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def options() -> dict[str, tuple[Option, list[str]]]:
    """Every model option of the command, by flag, with the models that take it (in the
    registry's order). An option several models declare must be declared alike."""
    out: dict[str, tuple[Option, list[str]]] = {}
    for name, cmd in commands().items():
        for o in cmd.options:
            if o.flag in out:
                first = out[o.flag][0]
                if (first.kwargs, first.param, first.dest) != (o.kwargs, o.param, o.dest):
                    raise RuntimeError(f"{o.flag} is declared differently by --model {out[o.flag][1][0]} and {name}")
                out[o.flag][1].append(name)
            else:
                out[o.flag] = (o, [name])
    return out


def _help(flag: str, models: list[str]) -> str:
    """The option's help: each model's text, prefixed with the models that declare it so."""
    texts: dict[str, list[str]] = {}
    for name in models:
        (o,) = [o for o in commands()[name].options if o.flag == flag]
        texts.setdefault(o.help, []).append(name)
    return "; ".join(f"{', '.join(names)}: {text}" for text, names in texts.items())


def _library_defaults(flag: str, models: list[str]) -> Callable[[], str]:
    """The estimators' defaults of the parameter ``flag`` sets, as the help shows them
    (importing the estimators, so only when the help is printed)."""

    def text() -> str:
        by_value: dict[str, list[str]] = {}
        for d in declarations().values():
            if d.command is None or d.command.name not in models:
                continue
            (o,) = [o for o in d.command.options if o.flag == flag]
            value = inspect.signature(d.estimator_class).parameters[o.param].default  # type: ignore[index]
            if value is not None and not isinstance(value, bool):
                by_value.setdefault(str(value), []).append(d.command.name)
        return ", ".join(f"{_names(names)} {value}" for value, names in by_value.items())

    return text


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, which also states the library's defaults of the options that set
    an estimator parameter: the command passes such an option only when it is given."""

    def _expand_help(self, action: argparse.Action) -> str:
        text = super()._expand_help(action)
        defaults = getattr(action, "library_defaults", None)
        shown = defaults() if defaults else ""
        return f"{text} (default: the model's own, as in Python: {shown})" if shown else text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every model's options on the ``fit`` parser."""
    for flag, (o, models) in options().items():
        kwargs = {**o.kwargs, "dest": o.dest}
        if o.param and "default" not in kwargs:
            kwargs["default"] = None  # not given: the estimator's default
        action = parser.add_argument(flag, help=_help(flag, models), **kwargs)
        if o.param and "required" not in o.help:
            action.library_defaults = _library_defaults(flag, models)  # type: ignore[attr-defined]


def model_help() -> str:
    """``--model``'s help: every model of the command and what it fits."""
    cmds = commands()
    first = next(iter(cmds))  # the registry's first: the default
    return f"model: {', '.join(cmds)} (default {first}); " + "; ".join(f"{n}: {c.help}" for n, c in cmds.items())


def command(args: argparse.Namespace) -> Command:
    """The declared command of ``--model``, after the checks every model shares and its own."""
    cmds = commands()
    if args.model not in cmds:
        raise CLIError(f"unknown model {args.model!r}; choose one of: {', '.join(cmds)}")
    if not 0 < args.level < 1:
        raise CLIError(f"--level must lie in (0, 1), got {args.level}")
    if args.min_rows < 1:
        raise CLIError(f"--min-rows must be at least 1, got {args.min_rows}")
    if args.min_cell_count < 1:
        raise CLIError(f"--min-cell-count must be at least 1, got {args.min_cell_count}")
    cmd = cmds[args.model]
    if cmd.target and args.target is None:
        raise CLIError(f"--model {args.model} needs --target")
    if not cmd.target and args.target is not None:
        raise CLIError(f"--model {args.model} takes no --target (it models all feature columns)")
    own = {o.flag for o in cmd.options}
    foreign: dict[tuple[str, ...], list[str]] = {}
    for flag, (o, models) in options().items():
        if flag not in own and getattr(args, o.dest) != (None if o.param else o.default):
            foreign.setdefault(tuple(models), []).append(flag)
    for takers, flags in foreign.items():
        raise CLIError(f"{', '.join(flags)}: for --model {_names(list(takers))} only")
    if getattr(args, "rounds", None) is not None and args.rounds < 1:
        raise CLIError(f"--rounds must be at least 1, got {args.rounds}")
    if cmd.check is not None:
        cmd.check(args)
    return cmd
