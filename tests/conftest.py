"""Fixtures shared across test files: one small fit of every model that returns a result
(``fitted``), shared by the files that check every model the same way (the result contract,
the file format, the byte accounting), with the model names as parametrized fixtures; and the
process-wide cleanup of compiled jax code."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats import FederatedData
from fedstats.data.disclosure import NO_RULES
from fedstats.federation.client_side import InProcessClients, Outcome, client_list
from fedstats.federation.protocol import describe_exc

SITES = os.path.join(os.path.dirname(__file__), "..", "examples", "sites.csv")


#: model name -> the exchanges its fit in ``fit_with_spy`` made (see ``exchange_of``)
EXCHANGES: dict = {}


def exchange_of(r):
    """``(label, algorithm class name, reply keys, summed keys)`` of a run of the runtime."""
    return (r.kind, type(r.algorithm).__name__, tuple(r.algorithm.reply_keys), tuple(r.algorithm.summed_keys))


def fit_with_spy():
    """A small fit of every model that has a result (and FEM-OMD's online state), with the
    bytes of every run of each fit read from the runtime's round records."""
    from fedstats.federation import runner

    df = pd.read_csv(SITES)
    data = FederatedData.from_dataframe(df, by="site", target="y")
    gm = FederatedData.from_dataframe(df[["site", "x1", "x2"]], by="site")
    # the runtime's own counters, read independently of the ledger: every run's round records
    seen, exchanges = [], []
    real_run = runner._run

    def spying_run(r):
        exchanges.append(exchange_of(r))
        res = real_run(r)
        seen.append((sum(r.bytes_up for r in res.history), sum(r.bytes_down for r in res.history)))
        return res

    class Spy(dict):
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            runs[key] = (sum(u for u, _ in seen), sum(d for _, d in seen))
            EXCHANGES[key] = set(exchanges)
            seen.clear()
            exchanges.clear()

    runs = {}
    out = Spy()
    runner._run = spying_run
    try:
        fit_all(out, data, gm, df)
    finally:
        runner._run = real_run
    return dict(out), data, runs


# --------------------------------------------------------------------------- dropouts
# A backend for tests: the in-process simulation, except that some clients drop out the ways
# they do in a deployment. A node whose policy refuses the run (too few rows) and a node that
# stops answering are *lost* (as on Flower: failed in every round after, their private state
# missing from the run's final states); a client whose every step raises is recorded as failed.
# ``lost_after``: the node stops answering after that many rounds, counted over every run of
# the fit (its one-off exchanges included), so it answers the first exchanges only.


class Dropouts:
    def __init__(self, refused=None, broken=(), lost_after=None):
        self.refused = dict(refused or {})  # client -> its row count (the node's policy refuses)
        self.broken = set(broken)
        self.lost_after = dict(lost_after or {})
        self.rounds = 0  # rounds run so far, over every run of the fit

    def client_side(self, algorithm, ids, data, seed):
        _, get = client_list(data)
        return _Side(self, InProcessClients(algorithm, ids, get, seed), ids)


class _Side:
    def __init__(self, backend, inner, ids):
        self.backend, self.inner, self.ids = backend, inner, ids
        self.lost = {}
        for c, rows in backend.refused.items():
            if c in ids:
                self.lost[c] = (
                    f"refused by the node's policy (rule min_rows): this client has {rows} rows; the node "
                    "releases nothing from fewer than 5"
                )

    def init_states(self, skip=frozenset()):
        self.inner.init_states(skip)

    def load_states(self, states):
        self.inner.load_states(states)

    def states(self):
        return self.inner.states()

    def final_states(self, final=None):
        return {c: s for c, s in self.inner.final_states(final).items() if c not in self.lost}

    def close(self):
        pass

    def run_round(self, rnd, idx, messages, batched):
        b = self.backend
        for c, after in b.lost_after.items():
            if c in self.ids and b.rounds >= after:
                self.lost.setdefault(c, f"no reply within 3.0 s at round {rnd}")
        b.rounds += 1
        out: dict[int, Outcome] = {}
        run = []
        for i in idx:
            c = self.ids[i]
            if c in self.lost:
                out[i] = Outcome(failed=f"ClientDisconnected: {self.lost[c]}")
            elif c in b.broken:
                out[i] = Outcome(failed=describe_exc(OSError(f"client {c!r}: the disk holding its rows failed")))
            else:
                run.append(i)
        fallback = None
        if run:
            got, fallback = self.inner.run_round(rnd, run, messages, batched)
            out.update(zip(run, got))
        return [out[i] for i in idx], fallback


def _examples():
    """``(declaration, example)`` of every small fit the registry declares, in its order."""
    from fedstats.registry import declarations

    return [(d, ex) for d in declarations().values() for ex in d.examples]


def _example_fit(declaration, example, sources):
    model = declaration.estimator_class(**example.params)
    if example.data == "stream":  # an online model: two batches of a stream, one step each
        from fedstats.experiments.regret import MixtureStream

        stream = MixtureStream(n_clients=5, n=30, d=3, n_components=2, process="fixed", seed=0)
        for t in range(1, 3):
            getattr(model, example.method)(stream.batch(t), **example.fit)
        return model
    n_clients = len(sources["regression"]().clients)  # a declared data function gives as many clients
    return getattr(model, example.method)(example.data_for(sources, n_clients), **example.fit)


def fits(data, gm, df, **rules):
    """``(name, thunk)`` of a small fit of every model, the examples of the registry's
    declarations in its order (an online model's thunk returns the model, whose result is
    ``"<name>-result"``); ``rules``: the disclosure rules of the binary outcome's data made
    from ``df``."""
    import functools

    binary = FederatedData.from_dataframe(
        df.assign(y=(df["y"] > df["y"].median()).astype(float)), by="site", target="y", **rules
    )
    # survival: the outcome as a time (larger y, earlier event) in 8 steps (ties), every fourth row censored
    steps = np.ceil(8 * (1 - (df["y"] - df["y"].min()) / (df["y"].max() - df["y"].min() + 1e-9)))
    timed = df.assign(time=steps, event=(np.arange(len(df)) % 4 != 0).astype(float)).drop(columns="y")
    survival = FederatedData.from_dataframe(timed, by="site", target="time", **rules)
    sources = {
        "regression": lambda: data,
        "binary": lambda: binary,
        "features": lambda: gm,
        "survival": lambda: survival,
    }
    return [(ex.name, functools.partial(_example_fit, d, ex, sources)) for d, ex in _examples()]


#: model name -> the messages of the warnings its fit in ``fit_all`` gave
FIT_WARNINGS: dict = {}


def fit_all(out, data, gm, df):
    for name, thunk in fits(data, gm, df):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = thunk()
            if name in ONLINE:
                out[f"{name}-result"] = res.result()
        FIT_WARNINGS[name] = [str(w.message) for w in caught]
        out[name] = res


#: how the three extra clients of ``dropout_data`` drop out of every fit of ``fit_with_dropouts``:
#: "tiny" (2 rows) is refused by its node's policy, every step of "bad" raises, and the node of
#: "gone" is lost after the fit's first round (it answers the first exchange only)
DROPOUTS = {"refused": {"tiny": 2}, "broken": {"bad"}, "lost_after": {"gone": 1}}
#: words each dropped client's reason must contain
DROPOUT_REASONS = {"tiny": "rule min_rows", "bad": "disk holding its rows failed", "gone": "no reply within"}


def dropout_data(df):
    """``df`` with the three clients of ``DROPOUTS`` added (rows drawn from the others)."""
    extra = [
        df.sample(n, random_state=k).assign(site=c) for k, (c, n) in enumerate((("tiny", 2), ("bad", 30), ("gone", 30)))
    ]
    return pd.concat([df, *extra], ignore_index=True)


def fit_with_dropouts(names):
    """The models ``names`` of :func:`fits` on ``dropout_data``, each on its own
    :class:`Dropouts` backend: ``({name: (result or the exception it raised, its
    warnings, its backend)}, data)``."""
    from fedstats.federation import use_backend

    df = dropout_data(pd.read_csv(SITES))
    # the small client is refused by its node's policy (the Dropouts backend), not by the data's rules
    data = FederatedData.from_dataframe(df, by="site", target="y", **NO_RULES)
    gm = FederatedData.from_dataframe(df[["site", "x1", "x2"]], by="site", **NO_RULES)
    out = {}
    for name, thunk in fits(data, gm, df, **NO_RULES):
        if name not in names:
            continue
        backend = Dropouts(**DROPOUTS)
        with warnings.catch_warnings(record=True) as caught, use_backend(backend):
            warnings.simplefilter("always")
            try:
                res = thunk()
            except Exception as exc:  # noqa: BLE001 - the test of this model reports it
                res = exc
        out[name] = (res, list(caught), backend)
    return out, data


#: the online models' examples (their fixture is the model; "<name>-result" is its result)
ONLINE = [ex.name for _, ex in _examples() if ex.data == "stream"]
#: the examples of pooled fits (no clients)
POOLED = [ex.name for _, ex in _examples() if ex.method == "fit_centralized"]
#: every fixture name: each example of the registry, and each online model's result
MODELS = [n for _, ex in _examples() for n in ((ex.name,) if ex.name not in ONLINE else (f"{ex.name}-result", ex.name))]

#: the results of the contract (test_contract.py): an online model itself (partial_fit / played /
#: result) is not a fitted result; its result is "<name>-result"
RESULTS = [m for m in MODELS if m not in ONLINE]
#: the fits whose every exchange is counted from the runtime's round records (test_results.py)
COUNTED = [m for m in MODELS if m not in ONLINE + POOLED]


@pytest.fixture(scope="session")
def fitted():
    """``(results, data, runs)``: a small fit of every model (``MODELS``), the data they were
    fitted on, and each fit's bytes from the runtime's own round records."""
    return fit_with_spy()


#: the results of the dropout battery: every federated result (the pooled lasso has no clients
#: that could drop out; FEM-OMD's online steps are tested on their own)
DROPPED = [m for m in RESULTS if m not in POOLED + [f"{o}-result" for o in ONLINE]]


@pytest.fixture(scope="session")
def dropped_fits():
    """``({name: (result or exception, warnings, backend)}, data)``: every model of ``DROPPED``
    fitted with three clients more, which drop out as ``DROPOUTS`` says."""
    return fit_with_dropouts(DROPPED)


@pytest.fixture(scope="session")
def dropout_reasons():
    """Client -> words its reason for not being in a fit of ``dropped_fits`` must contain."""
    return dict(DROPOUT_REASONS)


@pytest.fixture(params=DROPPED)
def dropped_name(request):
    """Each name of ``DROPPED`` in turn."""
    return request.param


@pytest.fixture(scope="session")
def record_exchanges():
    """A context manager: ``with record_exchanges() as seen:`` appends ``exchange_of`` of every
    run of the runtime inside the block to ``seen``."""
    import contextlib

    from fedstats.federation import runner

    @contextlib.contextmanager
    def recording():
        seen, real = [], runner._run

        def spy(r):
            seen.append(exchange_of(r))
            return real(r)

        runner._run = spy
        try:
            yield seen
        finally:
            runner._run = real

    return recording


@pytest.fixture(scope="session")
def fit_warnings(fitted):
    """Model name -> the messages of the warnings its fit in ``fitted`` gave."""
    return {**FIT_WARNINGS, **{f"{o}-result": FIT_WARNINGS.get(o, []) for o in ONLINE}}


@pytest.fixture(scope="session")
def exchanges(fitted):
    """Model name -> the set of exchanges (``exchange_of``) its fit in ``fitted`` made."""
    return dict(EXCHANGES)


@pytest.fixture(params=MODELS)
def model_name(request):
    """Each name of ``MODELS`` in turn."""
    return request.param


@pytest.fixture(params=RESULTS)
def result_name(request):
    """Each fitted result's name in turn (``RESULTS``)."""
    return request.param


@pytest.fixture(scope="session")
def result_names():
    """Every fitted result's name (``RESULTS``)."""
    return list(RESULTS)


@pytest.fixture(params=COUNTED)
def counted_name(request):
    """Each name of a fit whose exchanges are counted in turn (``COUNTED``)."""
    return request.param


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_code():
    """After each test module, drop the process's compiled jax code. Every compiled kernel
    holds memory maps of JIT code, and one process may hold at most 65,530 maps (Linux's
    default); the whole suite in one process compiles more than that, and XLA then crashes
    (a segmentation fault, no Python traceback). Kernels shared within a module stay."""
    yield
    import gc
    import sys

    if "jax" in sys.modules:
        import jax

        from fedstats.inference.tilted.kernels import KERNELS

        KERNELS.clear()
        jax.clear_caches()
        gc.collect()


@pytest.fixture(scope="session")
def model_fits():
    """:func:`fits`: ``(name, thunk)`` of a small fit of every model on the data given."""
    return fits
