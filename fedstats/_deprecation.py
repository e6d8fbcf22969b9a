"""Renamed public names keep working for one release, with a :class:`DeprecationWarning` that
names the new spelling (one vocabulary across the package). A leaf: it imports nothing of fedstats.

* :func:`renamed_parameters`: a function's or constructor's keyword under its former name;
* :func:`renamed_value`: a parameter's former value (``noise="device"``);
* :class:`renamed_attribute` and :func:`renamed_attributes`: an attribute under its former
  name (reads and writes);
* :func:`renamed_module_names`: a module's ``__getattr__`` for classes and functions under
  their former names.

Result files written before a rename still load: :data:`fedstats.result_file.FORMER_NAMES`
maps former class names, and a class's ``_former_attributes`` its former attribute names.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` is now ``new`` (and that ``old`` goes in the next release)."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release: use {new}", DeprecationWarning, stacklevel=stacklevel
    )


def renamed_parameters(**renames: str) -> Callable[[_F], _F]:
    """Decorator: accept each keyword ``old`` of ``renames`` as its new name ``renames[old]``,
    with a warning; passing both is a ``TypeError``. The signature shown (and read by
    ``get_params``) is the new one."""

    def deco(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{fn.__qualname__}() got both {old}= and its new name {new}=: pass {new}= only"
                        )
                    warn_renamed(f"{fn.__qualname__}({old}=...)", f"{new}=")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def renamed_value(name: str, value: Any, former: Mapping[Any, Any]) -> Any:
    """``value`` of the parameter ``name``, with a former value mapped to its new one (warned)."""
    if isinstance(value, (str, int)) and not isinstance(value, bool) and value in former:
        warn_renamed(f"{name}={value!r}", f"{name}={former[value]!r}", stacklevel=4)
        return former[value]
    return value


class renamed_attribute:
    """A class attribute that serves the former name of the attribute ``new``: reading or
    setting it warns and goes to ``new``."""

    def __init__(self, new: str) -> None:
        self.new = new

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        warn_renamed(f"{type(obj).__name__}.{self.old}", f".{self.new}")
        return getattr(obj, self.new)

    def __set__(self, obj: Any, value: Any) -> None:
        warn_renamed(f"{type(obj).__name__}.{self.old}", f".{self.new}")
        setattr(obj, self.new, value)


def renamed_attributes(**renames: str) -> Callable[[type], type]:
    """Class decorator: each former attribute name ``old`` of ``renames`` serves
    ``renames[old]`` (:class:`renamed_attribute`), and result files that stored it load
    (``_former_attributes``, inherited renames included)."""

    def deco(cls: type) -> type:
        for old, new in renames.items():
            alias = renamed_attribute(new)
            alias.old = old
            setattr(cls, old, alias)
        cls._former_attributes = {**getattr(cls, "_former_attributes", {}), **renames}  # type: ignore[attr-defined]
        return cls

    return deco


def renamed_module_names(module: str, names: Mapping[str, str], namespace: Mapping[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each former name of ``names`` as the object now named
    ``names[old]`` in ``namespace`` (the module's globals), with a warning."""

    def __getattr__(name: str) -> Any:
        if name in names:
            warn_renamed(f"{module}.{name}", f"{module}.{names[name]}")
            return namespace[names[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
