"""Where the client side of a federated run executes: this process, or Flower.

Every model's ``fit`` takes ``backend=``:

* ``None`` (default): the backend in effect (see :func:`use_backend`), else this process;
* ``"inprocess"``: this process (the simulator of :func:`fedstats.federation.run`);
* ``"flower"``: a Flower simulation (Ray) with one SuperNode per client, started for this
  call and stopped after it;
* a :class:`fedstats.federation.flower.FlowerSession`: a Flower simulation you keep open
  over several calls (an online stream, a fit and then its Wald intervals), or the grid of
  a real deployment inside a ``ServerApp``.

The model code is the same in every case: each :func:`~fedstats.federation.run` inside a
fit hands its client side to the backend, and the server loop stays where the fit runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from .runner import BACKEND

if TYPE_CHECKING:
    from .flower import FlowerSession

_R = TypeVar("_R")

__all__ = ["use_backend", "current_backend", "accepts_backend"]


def _resolve(backend: str | FlowerSession | None) -> tuple[Any, bool]:
    """``(session or None, created here)``."""
    if backend is None:
        return BACKEND.get(), False
    if isinstance(backend, str):
        if backend == "inprocess":
            return None, False
        if backend == "flower":
            from .flower import FlowerSession

            return FlowerSession(), True
        raise ValueError(f"backend must be 'inprocess', 'flower' or a FlowerSession, got {backend!r}")
    if callable(getattr(backend, "client_side", None)):
        return backend, False
    raise TypeError(f"backend must be 'inprocess', 'flower' or a FlowerSession, got {type(backend).__name__}")


@contextmanager
def use_backend(backend: str | FlowerSession | None) -> Iterator[FlowerSession | None]:
    """Run the federated rounds inside the ``with`` block on ``backend``.

    ``backend``: ``"inprocess"``, ``"flower"`` (a simulation started here and stopped when the
    block ends) or a :class:`~fedstats.federation.flower.FlowerSession`. Yields the session
    (``None`` for in-process). The setting is scoped to the block and to this thread.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.federation import use_backend, current_backend
    >>> with use_backend("inprocess"):
    ...     current_backend() is None
    True
    """
    session, owned = _resolve(backend)
    token = BACKEND.set(session)
    try:
        yield session
    finally:
        BACKEND.reset(token)
        if owned:
            session.close()


def current_backend() -> FlowerSession | None:
    """The session that runs the client side of :func:`~fedstats.federation.run` now
    (``None``: this process)."""
    return BACKEND.get()


def accepts_backend(method: Callable[..., _R]) -> Callable[..., _R]:
    """Give a model's ``fit``-like method the keyword ``backend=`` (see the module docs)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, backend: str | FlowerSession | None = None, **kwargs: Any) -> _R:
        if backend is None:
            return method(self, *args, **kwargs)
        with use_backend(backend):
            return method(self, *args, **kwargs)

    wrapper.__doc__ = (method.__doc__ or "") + (
        "\n\n        ``backend``: where the clients' steps run: ``None`` (the backend in effect, else this"
        '\n        process), ``"inprocess"``, ``"flower"`` (a Flower simulation, one SuperNode per client) or'
        "\n        a :class:`fedstats.federation.flower.FlowerSession`. Results are the same (a Flower node"
        "\n        steps its client alone, so sampled estimators equal the in-process run with batched=False).\n"
    )
    return wrapper
