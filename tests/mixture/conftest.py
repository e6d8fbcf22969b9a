"""What the mixtures' tests share: a spy on the server steps (which reply arrays reach the
server per client, which only as sums over the clients)."""

from __future__ import annotations

import pytest


@pytest.fixture
def server_steps(monkeypatch):
    """``install(*classes)`` replaces each class's ``server_step`` by a spy and returns the
    list it fills: one ``(class name, client function or None, round, [keys of each client's
    reply], keys of replies.sums)`` per call on an instance of exactly that class. Undone at
    the end of the test."""
    seen: list = []

    def install(*classes):
        for cls in classes:
            real = cls.server_step

            def spy(self, state, replies, round, real=real, cls=cls):
                if type(self) is cls:  # a subclass's spy (if any) records its own calls
                    fn = getattr(getattr(self, "client_fn", None), "__name__", None)
                    seen.append((cls.__name__, fn, round, [set(r) for r in replies.values()], set(replies.sums)))
                return real(self, state, replies, round)

            monkeypatch.setattr(cls, "server_step", spy)
        return seen

    return install


@pytest.fixture
def recorded_draws(monkeypatch):
    """``use(seed)``: the runs' participants drawn as before the streams of
    :mod:`fedstats.streams` (``[seed, round, 0]`` of the fit's seed), for the tests that compare
    with fits recorded then; the draws are the only thing the streams changed in them."""
    import numpy as np

    from fedstats.federation import runner

    def use(seed: int) -> None:
        monkeypatch.setattr(runner, "round_rng", lambda _own, rnd: np.random.default_rng([seed, rnd, 0]))

    return use
