"""Fixtures shared across test files: one small fit of every model that returns a result
(``fitted``), shared by the files that check every model the same way (the result contract,
the file format, the byte accounting), with the model names as parametrized fixtures; and the
process-wide cleanup of compiled jax code."""

from __future__ import annotations

import os
import warnings

import pandas as pd
import pytest

from fedstats import FederatedData

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


def fit_all(out, data, gm, df):
    from fedstats import HierarchicalLinearModel
    from fedstats.experiments.regret import MixtureStream
    from fedstats.glm import BayesianGLM, FederatedGLM, HierarchicalGLM
    from fedstats.gp import FGPR
    from fedstats.linear import BayesianLasso, BayesianRidge, StructuralCovarianceModel
    from fedstats.linear.baselines import DistributedRidge, Ditto, FedAvg, Separate
    from fedstats.mixture import (
        FEMOMD,
        DecentralizedGaussianMixture,
        FederatedGaussianMixture,
        VariationalGaussianMixture,
        ring_graph,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["hm2"] = HierarchicalLinearModel(rounds=3).fit(data, seed=0, progress=False)
        out["hm2-nuts"] = HierarchicalLinearModel(
            rounds=1, estimator="nuts", estimator_options={"num_warmup": 50, "num_samples": 50, "num_chains": 1}
        ).fit(data, seed=0, progress=False)
        out["lasso"] = BayesianLasso(rounds=2).fit(data, seed=0, progress=False)
        out["ridge"] = BayesianRidge(rounds=2).fit(data, seed=0, progress=False)
        out["lasso-centralised"] = BayesianLasso().fit_centralised(data, seed=0, num_warmup=100, num_samples=100)
        out["hm1"] = StructuralCovarianceModel(rounds=5).fit(data, seed=0, uncertainty=True, progress=False)
        out["hm1-point"] = StructuralCovarianceModel(rounds=5).fit(data, seed=0, progress=False, uncertainty=False)
        out["separate"] = Separate().fit(data)
        out["fedavg"] = FedAvg().fit(data)
        out["ditto"] = Ditto(lam=1.0).fit(data)
        out["distributed-ridge"] = DistributedRidge().fit(data)
        out["fgpr"] = FGPR(rounds=3, newton_steps=5).fit(data, seed=0, progress=False)
        out["glm"] = FederatedGLM("gaussian").fit(data, seed=0, progress=False)
        binary = FederatedData.from_dataframe(
            df.assign(y=(df["y"] > df["y"].median()).astype(float)), by="site", target="y"
        )
        out["bglm"] = BayesianGLM("binomial", rounds=3, num_draws=400).fit(binary, seed=0, progress=False)
        out["hglm"] = HierarchicalGLM("binomial", rounds=2, num_draws=400).fit(binary, seed=0, progress=False)
        out["fedem"] = FederatedGaussianMixture(3).fit(gm, seed=0)
        out["vb-fedem"] = VariationalGaussianMixture(3).fit(gm, seed=0)
        out["d-fedem"] = DecentralizedGaussianMixture(3, graph=ring_graph(gm.n_clients)).fit(gm, seed=0)
        stream = MixtureStream(n_clients=5, n=30, d=3, n_components=2, process="fixed", seed=0)
        m = FEMOMD(2, means_init=stream.means + 0.3, horizon=3)
        for t in range(1, 3):
            m.partial_fit(stream.batch(t))
        out["fem-omd-result"] = m.result()
        out["fem-omd"] = m


MODELS = [
    "hm2",
    "hm2-nuts",
    "lasso",
    "ridge",
    "lasso-centralised",
    "hm1",
    "hm1-point",
    "separate",
    "fedavg",
    "ditto",
    "distributed-ridge",
    "fgpr",
    "glm",
    "bglm",
    "hglm",
    "fedem",
    "vb-fedem",
    "d-fedem",
    "fem-omd-result",
    "fem-omd",
]

#: the results of the contract (test_contract.py): "fem-omd" is the online model itself
#: (partial_fit / played / result), not a fitted result; its result is "fem-omd-result"
RESULTS = [m for m in MODELS if m != "fem-omd"]
#: the fits whose every exchange is counted from the runtime's round records (test_results.py)
COUNTED = [m for m in MODELS if m not in ("fem-omd", "lasso-centralised")]


@pytest.fixture(scope="session")
def fitted():
    """``(results, data, runs)``: a small fit of every model (``MODELS``), the data they were
    fitted on, and each fit's bytes from the runtime's own round records."""
    return fit_with_spy()


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
