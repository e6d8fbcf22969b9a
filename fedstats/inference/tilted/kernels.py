"""What the estimators share to run batches of clients in compiled kernels: the process's
cache of compiled kernels, stacking and padding of a batch, normal draws (optionally
quasi-random), and the model's per-client preparation."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import numpy as np

from ..gaussian import symmetrize
from .base import SiteModel, Stats


def prepare_stats(model: SiteModel, stats: Stats) -> Stats:
    """``model.prepare(stats)`` where the model has it (:class:`~.base.PreparedSite`), else
    ``stats`` (inside a kernel)."""
    return model.prepare(stats) if hasattr(model, "prepare") else stats


class KernelCache(OrderedDict):
    """Compiled kernels by key; beyond ``maxsize`` the least recently used one is dropped
    (and its compiled code freed): every compiled kernel holds memory maps of JIT code, and a
    process may hold only so many (65,530 by default on Linux; past that XLA crashes)."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = int(maxsize)

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)


# Compiled kernels, shared by every estimator instance in the process: a kernel depends on
# the model's structure (``model.cache_key()``) and the estimator's static options only, so
# repeated fits (studies, notebooks, tests) compile once.
KERNELS = KernelCache(maxsize=32)


def jit_kernel(fn):
    """``jax.jit(fn)`` at XLA's backend optimisation level 1 (of 3; jax's default is 2): the
    estimators' kernels (loops of small linear algebra) then compile in about two thirds of
    the time (the lasso's Gibbs kernel: 3.5 s -> 2.3 s) and run as fast (measured; the
    Laplace Newton kernel compiles no faster at level 1)."""
    import jax

    return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 1})


def stack_stats(stats: list[dict[str, np.ndarray]], pad_to: int) -> dict[str, np.ndarray]:
    """Stack per-client stats along a new leading axis, padding by repeating the first."""
    keys = stats[0].keys()
    padded = list(stats) + [stats[0]] * (pad_to - len(stats))
    return {k: np.stack([np.asarray(s[k], dtype=float) for s in padded]) for k in keys}


def pad_batch(a: np.ndarray, pad_to: int) -> np.ndarray:
    """``a`` with its first entry repeated along the leading axis up to ``pad_to`` entries."""
    if a.shape[0] == pad_to:
        return a
    return np.concatenate([a, np.repeat(a[:1], pad_to - a.shape[0], axis=0)])


def bucket(b: int) -> int:
    """Batch size rounded up to 1, 2, 4 or a multiple of 8: few distinct shapes (few
    compilations) when participation varies, little padding when it does not (padded
    clients are computed, so a single client must not pay for eight)."""
    if b <= 4:
        return 1 if b <= 1 else (2 if b == 2 else 4)
    return -(-b // 8) * 8


def normal_draws(rng: np.random.Generator, n: int, d: int, qmc: bool | str) -> np.ndarray:
    """``n`` standard normal draws in ``d`` dimensions, mapped through the normal quantile
    from: pseudo-random uniforms (``qmc=False``), a scrambled Sobol sequence (``True``), or
    the Sobol sequence under a random digital shift (``"shift"``). Both quasi-random kinds
    are randomised quasi-Monte Carlo: unbiased, with much smaller errors for smooth
    integrands. The digital shift (each point's bits XOR one random 30-bit word per
    coordinate, plus a uniform offset inside its 2^-30 cell, so that every point is exactly
    uniform) costs nothing to set up, where scrambling costs about 0.5 ms per sequence; on
    HM2's tilted moments its errors were as small as scrambling's (0.0005 tilted sd at 256
    draws, against 0.0039 for pseudo-random draws)."""
    if not qmc:
        return rng.standard_normal((n, d))
    from scipy.stats import norm
    from scipy.stats import qmc as _qmc

    m = max(0, int(np.ceil(np.log2(max(n, 1)))))
    if qmc == "shift":
        u = (_sobol_bits(d, m)[:n] ^ rng.integers(0, 2**30, size=d)) + rng.random((n, d))
        u /= 2.0**30
    else:
        # the first n points of a scrambled base-2 sequence (still unbiased when n is not a power of 2)
        u = _qmc.Sobol(d, scramble=True, seed=rng).random_base2(m)[:n]
    return norm.ppf(np.clip(u, 1e-12, 1 - 1e-12))


@lru_cache(maxsize=64)
def _sobol_bits(d: int, m: int) -> np.ndarray:
    """The first 2^m points of the (unscrambled) Sobol sequence in d dimensions, as 30-bit
    integers (read only)."""
    from scipy.stats import qmc as _qmc

    bits = (_qmc.Sobol(d, scramble=False).random_base2(m) * 2.0**30).astype(np.int64)
    bits.flags.writeable = False
    return bits


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Within the block, numpy's BLAS and LAPACK run on one thread (restored after; through
    ``threadpoolctl`` where it is installed, else nothing changes). Batches of small matrices
    (one factorisation per client and point) gain nothing from more threads, and lose much
    when other work shares the cores: on a loaded 2-core machine ``eigh`` of 50 matrices of
    42 x 42 took 1.08 s with OpenBLAS's two threads and 0.016 s with one, and the
    Rao-Blackwellised Laplace moments with 40 predictors 10 s per EP round instead of 3 s."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # not a dependency of fedstats: without it, the BLAS keeps its threads
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def cavity_precision(cavity_cov: np.ndarray) -> np.ndarray:
    """The precision matrices of a batch of cavity covariances (B, p, p)."""
    return np.stack([symmetrize(np.linalg.inv(symmetrize(c))) for c in cavity_cov])
