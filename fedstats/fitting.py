"""The one skeleton of every federated model's ``fit``.

A model writes its fit as ``fit(self, data, run, *, <its own keywords>)`` and decorates it with
:func:`federated_fit`. The decorator gives every model the same entry:

* ``data`` is anything :func:`fedstats.data.as_federated` converts, and every client of it must
  pass its disclosure rules; the estimator's parameters are checked (``_constraints``) before
  anything is exchanged;
* the run options every iterative fit takes, ``seed``, ``progress``, ``checkpoint``,
  ``resume`` and ``batched``, arrive as one :class:`RunOptions` (``run``), whose
  :meth:`RunOptions.run` starts the fit's main run with them: no model repeats them;
* ``backend=`` runs the clients' steps elsewhere (:func:`fedstats.federation.accepts_backend`);
* the result counts every exchange of the fit, its excluded clients are warned about, and its
  ``seconds`` are the fit's wall time (:func:`fedstats.results.counted`).

The round budget has one home, the constructor's ``rounds``; participation, where a model has
it, the constructor's ``participation``.

Example
-------
>>> from fedstats.fitting import RunOptions
>>> RunOptions(seed=3).seed, RunOptions().checkpoint
(3, None)
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .federation.backend import accepts_backend
from .results import counted

if TYPE_CHECKING:
    from .data import DataLike

__all__ = ["RunOptions", "federated_fit", "fit_rounds"]

_R = TypeVar("_R")


@dataclass(frozen=True)
class RunOptions:
    """The options of a fit's runs, as given to ``fit``: ``seed`` (every run's randomness
    derives from it), ``progress`` (a bar or per-round lines over the main run's rounds),
    ``checkpoint`` and ``resume`` (the main run's checkpoint file, and whether to continue it),
    ``batched`` (one vectorised client step for all the clients of a round)."""

    seed: int = 0
    progress: bool | None = None
    checkpoint: str | os.PathLike | None = None
    resume: bool = False
    batched: bool = True

    def run(self, algorithm: Any, data: Any, *, rounds: int, kind: str, **kwargs: Any) -> Any:
        """The fit's main run: :func:`fedstats.federation.run` of ``algorithm`` with these options
        (``kwargs``: its other arguments, such as ``participation``)."""
        from .federation import run

        return run(
            algorithm,
            data,
            rounds=rounds,
            kind=kind,
            seed=self.seed,
            progress=self.progress,
            checkpoint=self.checkpoint,
            resume=self.resume,
            batched=self.batched,
            **kwargs,
        )


def federated_fit(fn: Callable[..., _R]) -> Callable[..., _R]:
    """Make ``fn(self, data, run, [<own positional>], *, <own keywords>)`` a model's
    ``fit(data, [<own positional>], *, seed=0, progress=None, checkpoint=None, resume=False,
    batched=True, <own keywords>, backend=None)`` (see the module's docs)."""
    params = [p for name, p in inspect.signature(fn).parameters.items() if name not in ("self", "data", "run")]
    positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]

    def fit(
        self: Any,
        data: DataLike,
        *args: Any,
        seed: int = 0,
        progress: bool | None = None,
        checkpoint: str | os.PathLike | None = None,
        resume: bool = False,
        batched: bool = True,
        **kwargs: Any,
    ) -> _R:
        self._validate_params()
        return fn(self, data, RunOptions(seed, progress, checkpoint, resume, batched), *args, **kwargs)

    common = [p for name, p in inspect.signature(fit).parameters.items() if name not in ("args", "kwargs")]
    keywords = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    functools.update_wrapper(fit, fn)
    public = inspect.signature(fn).replace(parameters=[*common[:2], *positional, *common[2:], *keywords])
    fit.__signature__ = public  # type: ignore[attr-defined]
    return counted(accepts_backend(fit))


def fit_rounds(model: Any, rounds: int | None) -> int:
    """The fit's round budget: the model's ``rounds``. A ``rounds`` given to ``fit`` (the old
    second home, deprecated) still counts for this release, with a warning."""
    if rounds is None:
        return int(model.rounds)
    name = type(model).__name__
    warnings.warn(
        f"{name}.fit(rounds=...) is deprecated and goes in the next release: set it on the model "
        f"({name}(rounds={rounds}) or model.set_params(rounds={rounds}))",
        DeprecationWarning,
        stacklevel=3,
    )
    return int(rounds)
