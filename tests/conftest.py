"""Fixtures shared across test files."""

import pytest


@pytest.fixture(scope="session")
def fitted():
    """``(results, data, runs)``: a small fit of every model (``fitted_models.MODELS``), the
    data they were fitted on, and each fit's bytes from the runtime's own round records."""
    from fitted_models import fit_with_spy

    return fit_with_spy()


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
