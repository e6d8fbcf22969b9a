"""The estimator conventions every fedstats model keeps (scikit-learn's, where they apply).

* The constructor takes keyword parameters and stores each one as given, under its own name,
  without validating or converting it; no ``**options``.
* :meth:`Estimator.get_params` / :meth:`Estimator.set_params` read and change them,
  :meth:`Estimator.clone` makes an unfitted copy, and the ``repr`` lists the parameters that
  differ from their defaults.
* Parameters are validated when ``fit`` starts, declaratively: each class lists its
  constraints in ``_constraints`` (name -> :class:`Constraint`) and every violation gives the
  same message, ``"<Model>: <name> must be <what>, got <value>"``.
* ``rounds`` is the one name of a round budget, ``seed`` is an argument of ``fit`` (or of
  ``partial_fit`` for online models), and ``fit`` takes a
  :class:`~fedstats.data.FederatedData` or what converts to one.
"""

from __future__ import annotations

import copy
import inspect
import numbers
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

import numpy as np

from ._deprecation import warn_renamed


class Constraint:
    """What a parameter may be: ``check(value)`` is true when it is allowed; ``what`` says it
    in words for the error message."""

    def __init__(self, check: Callable[[Any], bool], what: str) -> None:
        self.check, self.what = check, what

    def __or__(self, other: Constraint) -> Constraint:
        return Constraint(lambda v: self.check(v) or other.check(v), f"{self.what} or {other.what}")


def is_int(v: Any) -> bool:
    """Whether ``v`` is an integer (numpy's included), not a bool: the one integer check of
    fedstats (parameters, participation counts, privacy settings)."""
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return isinstance(v, (numbers.Real, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_))


def _bound_text(low: float | None, high: float | None, closed: tuple[bool, bool]) -> str:
    lo = "" if low is None else f"{'>=' if closed[0] else '>'} {low:g}"
    hi = "" if high is None else f"{'<=' if closed[1] else '<'} {high:g}"
    return " and ".join(t for t in (lo, hi) if t)


def Int(low: int | None = None, high: int | None = None) -> Constraint:
    """An int in [low, high] (either bound may be None)."""
    ok = lambda v: is_int(v) and (low is None or v >= low) and (high is None or v <= high)  # noqa: E731
    bounds = _bound_text(low, high, (True, True))
    return Constraint(ok, "an int" + (f" {bounds}" if bounds else ""))


def Real(low: float | None = None, high: float | None = None, closed: tuple[bool, bool] = (True, True)) -> Constraint:
    """A finite real number between ``low`` and ``high`` (bounds closed or open as given)."""

    def ok(v: Any) -> bool:
        if not _is_real(v) or not np.isfinite(v):
            return False
        if low is not None and (v < low if closed[0] else v <= low):
            return False
        return high is None or (v <= high if closed[1] else v < high)

    bounds = _bound_text(low, high, closed)
    return Constraint(ok, "a number" + (f" {bounds}" if bounds else ""))


def OneOf(*values: Any) -> Constraint:
    return Constraint(
        lambda v: isinstance(v, str) and v in values or (not isinstance(v, str) and any(v is x for x in values)),
        "one of " + ", ".join(repr(v) for v in values),
    )


BOOL = Constraint(lambda v: isinstance(v, (bool, np.bool_)), "True or False")
NONE = Constraint(lambda v: v is None, "None")
MAPPING = Constraint(lambda v: isinstance(v, Mapping), "a dict")


def Pair(low_sd: float = 0.0) -> Constraint:
    """A (mean, sd) pair of a Normal prior: finite numbers, sd > ``low_sd``."""

    def ok(v: Any) -> bool:
        try:
            m, s = v
        except (TypeError, ValueError):
            return False
        return _is_real(m) and _is_real(s) and np.isfinite(m) and np.isfinite(s) and s > low_sd

    return Constraint(ok, "a (mean, sd) pair of finite numbers with sd > 0")


#: methods renamed for one spelling of public names (former -> now), served with a warning
_FORMER_METHODS = {"fit_centralised": "fit_centralized"}


class Estimator:
    """Base of fedstats's models: parameters as given, ``get_params``/``set_params``,
    ``clone``, a generated ``repr`` and declarative validation (see the module docs)."""

    _constraints: ClassVar[Mapping[str, Constraint]] = {}

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        names = []
        for p in list(sig.parameters.values())[1:]:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"{cls.__name__}.__init__ takes *args or **kwargs: every parameter must be named")
            names.append(p.name)
        return names

    @classmethod
    def _defaults(cls) -> dict[str, Any]:
        sig = inspect.signature(cls.__init__)
        return {n: p.default for n, p in sig.parameters.items() if p.default is not p.empty}

    def __getattr__(self, name: str) -> Any:
        """Former method names, for one release (``fit_centralised``: ``fit_centralized``)."""
        new = _FORMER_METHODS.get(name)
        if new is not None and hasattr(type(self), new):
            warn_renamed(f"{type(self).__name__}.{name}", f".{new}")
            return getattr(self, new)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def get_params(self, deep: bool = False) -> dict[str, Any]:
        """The constructor's parameters, as given (``deep`` is accepted for scikit-learn
        compatibility; fedstats models hold no nested estimators)."""
        return {n: getattr(self, n) for n in self._param_names()}

    def set_params(self, **params: Any) -> Self:
        """Change parameters by name (validated when ``fit`` starts); returns the model."""
        valid = self._param_names()
        unknown = [k for k in params if k not in valid]
        if unknown:
            raise ValueError(f"{type(self).__name__} has no parameter(s) {unknown}; its parameters: {valid}")
        for k, v in params.items():
            setattr(self, k, v)
        return self

    def clone(self) -> Self:
        """An unfitted copy with the same parameters (deep copies of them)."""
        return type(self)(**copy.deepcopy(self.get_params()))

    def _validate_params(self) -> None:
        """Raise a ValueError for the first parameter that breaks its constraint."""
        for name, c in self._constraints.items():
            v = getattr(self, name)
            if not c.check(v):
                raise ValueError(f"{type(self).__name__}: {name} must be {c.what}, got {v!r}")

    def __repr__(self) -> str:
        defaults = self._defaults()
        parts = []
        for n, v in self.get_params().items():
            if n in defaults and _same(v, defaults[n]):
                continue
            parts.append(f"{n}={_short(v)}")
        return f"{type(self).__name__}({', '.join(parts)})"


def subclass_init(base: type, fixed: Mapping[str, Any] | None = None, **extra: Any) -> Callable[..., None]:
    """The constructor of a subclass of the estimator ``base`` without repeating ``base``'s
    parameter list: ``base``'s parameters but those ``fixed`` (name -> the subclass's value),
    then the keyword parameters ``extra`` (name -> default), each stored as given.

    >>> class Base(Estimator):
    ...     def __init__(self, *, rounds: int = 10, penalty: str = "lasso"):
    ...         self.rounds, self.penalty = rounds, penalty
    >>> class Ridge(Base):
    ...     __init__ = subclass_init(Base, {"penalty": "ridge"}, tol=0.1)
    >>> Ridge(rounds=3).get_params(), Ridge().penalty
    ({'rounds': 3, 'tol': 0.1}, 'ridge')
    """
    fixed = dict(fixed or {})
    sig = inspect.signature(base.__init__)  # type: ignore[misc]
    kept = [p for name, p in sig.parameters.items() if name not in fixed]
    inherited = {p.name for p in kept[1:]}
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=v) for name, v in extra.items()]

    def __init__(self: Any, **params: Any) -> None:
        unknown = sorted(set(params) - inherited - set(extra))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r}")
        base.__init__(self, **fixed, **{k: v for k, v in params.items() if k in inherited})  # type: ignore[misc]
        for name, default in extra.items():
            setattr(self, name, params.get(name, default))

    __init__.__signature__ = sig.replace(parameters=[*kept, *added])  # type: ignore[attr-defined]
    return __init__


def _same(a: Any, b: Any) -> bool:
    try:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return False
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError):
        return False


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array(shape={v.shape})"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."
