"""Random streams by construction: the one place where fedstats names its seeded streams.

Every random number a fit draws comes from ``numpy.random.default_rng([seed, tag, *indices])``
(:func:`stream`), where ``tag`` is the fixed tag of the stream's purpose and ``indices`` are
exactly that purpose's indices (below). Two streams of one seed are one stream only when they
have the same purpose and the same indices: the purpose is always the second word, and a
purpose always has the same number of indices (numpy pads a short seed list with zeros, so
``[s, 7]`` and ``[s, 7, 0]`` would be one stream). The same seed gives the same fit on every
backend (in process or on Flower).

Each run of the federated runtime (:func:`fedstats.federation.run`) draws under its own seed,
:func:`run_seed` of the fit's seed and the run's kind (``"EP rounds"``, ``"design check"``...),
and how many runs of that kind the fit started before it, so the runs of one fit (a scaling
run, the model's rounds, a curvature round per Newton step) never share a stream.

======================  ===  ====================  ==========================================
purpose                 tag  indices               drawn by
======================  ===  ====================  ==========================================
``server init``         1                          the runtime: ``init_server`` (run seed)
``client init``         2    client                the runtime: ``init_client`` (run seed)
``participants``        3    round                 the runtime: a round's participants
``client step``         4    round, client         the runtime: a client's step
``dp noise``            5    round                 the runtime: central DP noise of a round
``run``                 6    kind, occurrence      :func:`run_seed`: a run's seed
``fgpr participants``   7    round                 FGPR's draws with replacement by size
``mixture start``       8                          the mixtures' federated k-means start
``scale map``           9                          a posterior mapped to the data's scale
``separate batches``    10   client                the Separate baseline's minibatches
``final tilted``        11   client                EP's final tilted distribution of a client
``client posterior``    12   client                EP's coefficient draws of a client
``initial theta``       13                         HM1's and the baselines' start
``hyperparameter``      14                         FGPR's restarts of the pooled likelihood
``nargp draws``         15   fidelity              NARGP's paths through a fidelity
``online step``         16   time step             FEM-OMD: a time step's run seed
``dp start``            17   part                  private FedEM's start (0: run seed, 1: draws)
``hyper draws``         18                         FGPR's hyperparameter draws in ``predict``
======================  ===  ====================  ==========================================

Tags are fixed: changing one changes every seeded result that uses it. Before this scheme a
round's participant draw could be another purpose's stream (round 7's was a client's final
tilted draw); seeded results changed once when it came in.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

#: purpose -> (tag, names of its indices)
PURPOSES: dict[str, tuple[int, tuple[str, ...]]] = {
    "server init": (1, ()),
    "client init": (2, ("client",)),
    "participants": (3, ("round",)),
    "client step": (4, ("round", "client")),
    "dp noise": (5, ("round",)),
    "run": (6, ("kind", "occurrence")),
    "fgpr participants": (7, ("round",)),
    "mixture start": (8, ()),
    "scale map": (9, ()),
    "separate batches": (10, ("client",)),
    "final tilted": (11, ("client",)),
    "client posterior": (12, ("client",)),
    "initial theta": (13, ()),
    "hyperparameter": (14, ()),
    "nargp draws": (15, ("fidelity",)),
    "online step": (16, ("time step",)),
    "dp start": (17, ("part",)),
    "hyper draws": (18, ()),
}

_RECORDS: ContextVar[list[tuple[int, ...]] | None] = ContextVar("fedstats_stream_records", default=None)


def key(seed: int, purpose: str, *indices: int) -> tuple[int, ...]:
    """The seed list of a stream: ``(seed, tag, *indices)``; a purpose not in :data:`PURPOSES`
    or the wrong number of indices is a ``ValueError``."""
    try:
        tag, names = PURPOSES[purpose]
    except KeyError:
        raise ValueError(f"unknown random stream purpose {purpose!r}; known: {sorted(PURPOSES)}") from None
    if len(indices) != len(names):
        raise ValueError(f"stream {purpose!r} takes {len(names)} indices {names}, got {len(indices)}: {indices}")
    return (int(seed), tag, *(int(i) for i in indices))


def stream(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    """The generator of purpose ``purpose`` with ``indices`` under ``seed`` (see the module docs)."""
    k = key(seed, purpose, *indices)
    records = _RECORDS.get()
    if records is not None:
        records.append(k)
    return np.random.default_rng(list(k))


def seed_of(seed: int, purpose: str, *indices: int) -> int:
    """An integer seed drawn from :func:`stream` (for what takes an int: a run, JAX, torch)."""
    return int(stream(seed, purpose, *indices).integers(2**62))


def run_seed(seed: int, kind: str, occurrence: int = 0) -> int:
    """The seed of a run of kind ``kind`` (its label, e.g. ``"EP rounds"``) in a fit seeded
    ``seed``, the fit's ``occurrence``-th run of that kind (from 0): runs of different kinds,
    and repeated runs of one kind (a Newton step's curvature round), draw different streams."""
    return seed_of(seed, "run", zlib.crc32(kind.encode()), occurrence)


@contextmanager
def recording() -> Iterator[list[tuple[int, ...]]]:
    """Record the seed list of every stream :func:`stream` makes inside the block (tests)."""
    records: list[tuple[int, ...]] = []
    token = _RECORDS.set(records)
    try:
        yield records
    finally:
        _RECORDS.reset(token)
