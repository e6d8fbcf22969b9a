"""The command's error: an input problem, reported as one line without a traceback."""


class CLIError(Exception):
    """An input problem reported as one line, without a traceback."""
