"""The command's error for bad input (one line on stderr, exit status 2); declared with the
models' commands, whose checks raise it (:mod:`fedstats.registry.spec`)."""

from ..registry.spec import CLIError

__all__ = ["CLIError"]
