"""The models fedstats knows, one declaration each.

A model's whole declaration (:class:`~fedstats.registry.spec.Declaration`) sits in one module of
this package, by family (:mod:`.linear`, :mod:`.glm`, :mod:`.gp`, :mod:`.mixture`,
:mod:`.custom`): its estimator and result classes, a line on what it fits, the threat-model
tables of what its clients send, how ``fedstats fit`` builds and reports it (its command-line
name, options and help; every option's default is the estimator's own), the pooled fit it is
tested against, and its small test fits. The command line, the threat-model page and the test
battery that checks every model alike read :func:`declarations`; result files find their classes
by their ``@register`` (:mod:`fedstats.result_file`).

Adding a model is one module here (a ``DECLARATIONS`` tuple) and its line in :data:`MODULES`.
The declaration modules import no model: estimators, results and their packages are imported
when a declaration is used (:func:`~fedstats.registry.spec.load`), so reading the registry is
cheap and the command line imports only the chosen model's packages.

Example
-------
>>> from fedstats.registry import commands, declarations
>>> declarations()["glm"].estimator
'fedstats.glm:FederatedGLM'
>>> list(commands())[:3]
['hm2', 'lasso', 'ridge']
"""

from __future__ import annotations

import importlib

from .spec import Command, Declaration

__all__ = ["MODULES", "commands", "declarations"]

#: the declaration modules, in the order of the command line's models and the threat-model page
MODULES = (
    "fedstats.registry.linear",
    "fedstats.registry.glm",
    "fedstats.registry.gp",
    "fedstats.registry.mixture",
    "fedstats.registry.custom",
    "fedstats.registry.survival",
)

_DECLARATIONS: dict[str, Declaration] = {}


def declarations() -> dict[str, Declaration]:
    """Every registered model's declaration, by name, in :data:`MODULES` order."""
    if not _DECLARATIONS:
        found: dict[str, Declaration] = {}
        for module in MODULES:
            for d in importlib.import_module(module).DECLARATIONS:
                if d.name in found:
                    raise RuntimeError(f"two declarations named {d.name!r} ({module})")
                found[d.name] = d
        commands = [d.command.name for d in found.values() if d.command is not None]
        if len(set(commands)) != len(commands):
            raise RuntimeError(f"a command-line model name is declared twice: {commands}")
        _DECLARATIONS.update(found)
    return dict(_DECLARATIONS)


def commands() -> dict[str, Command]:
    """The command line's models: name -> :class:`~fedstats.registry.spec.Command`."""
    return {d.command.name: d.command for d in declarations().values() if d.command is not None}
