"""Exact GP prediction for large clients: a tiled Cholesky factorisation.

A client with N rows conditions on all of them by the same closed form as small clients,
``mu = m + K*^T (K + s I)^{-1} (y - m)`` and ``var_f = k** - K*^T (K + s I)^{-1} K*``, with
the same Cholesky factor, but the factor is held in square tiles of at most :data:`TILE`
rows, only those on and below the diagonal: about half of the dense matrix (1.8 GB in
float64 at 20,000 rows, where a dense kernel matrix and its factor take 6.4 GB), built from
the kernel tile by tile so that no N x N array ever exists. The right-looking tile algorithm
(one Cholesky, then triangular solves and matrix products per tile) does the arithmetic of
LAPACK's ``potrf`` in matrix products of tiles, as fast, and a progress bar can follow it.

Why not conjugate gradients or LOVE: one CG iteration on the test points' kernel columns
costs ``2 N^2 n*`` flops, so for a few hundred test points 1e-4 relative accuracy in the
variances (which cancel, ``k** - k*' C^-1 k*``) takes longer than the ``N^3 / 3`` of the
factorisation, and LOVE's low-rank variances miss 1e-4 on harder cases
(``benchmarks/fgpr_large.py``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import torch
from linear_operator import settings as lo_settings
from linear_operator.utils.errors import NanError, NotPSDError
from linear_operator.utils.warnings import NumericalWarning

from ..federation.progress import progress_bar

#: clients with more rows than this are conditioned by the tiled factorisation
DENSE_MAX = 4096
#: the tiles' edge (rows); tiles are balanced, so each has at most this many
TILE = 2048
#: test points solved at once on the tiled path
TEST_CHUNK = 512

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def tile_bounds(n: int, tile: int = TILE) -> list[tuple[int, int]]:
    """``[start, stop)`` of ``ceil(n / tile)`` row blocks of (nearly) equal size."""
    if tile < 1:
        raise ValueError(f"tile must be a positive number of rows, got {tile!r}")
    T = max(1, math.ceil(n / tile))
    edges = [round(i * n / T) for i in range(T + 1)]
    return list(zip(edges[:-1], edges[1:]))


def tiled_bytes(n: int, tile: int = TILE, chunk: int = TEST_CHUNK, itemsize: int = 8) -> int:
    """Bytes the tiled prediction holds at its peak: the lower tiles of the factor, a few
    tiles of work space, and the kernel columns of one chunk of test points."""
    T = len(tile_bounds(n, tile))
    t = math.ceil(n / T)
    return itemsize * (T * (T + 1) // 2 * t * t + 4 * t * t + 2 * n * chunk)


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(n: int, need: int, device: torch.device) -> None:
    """Refuse, before allocating, a host-memory factorisation that cannot fit (CPU only)."""
    avail = available_bytes() if device.type == "cpu" else None
    if avail is not None and need > avail:
        raise MemoryError(
            f"exact conditioning on {n} rows needs about {need / 2**30:.1f} GiB (the lower half of the "
            f"kernel matrix) and {avail / 2**30:.1f} GiB are available: free memory, predict on a GPU, "
            "or condition on fewer rows (FGPR's condition_limit opts in to a random subset)"
        )


class TiledCholesky:
    """The lower Cholesky factor ``L`` of ``K(X, X) + diag I``, in tiles ``L[i, j]`` (``j <= i``).

    Built tile by tile from ``kernel`` (a function of two row blocks returning their dense
    covariance) and factorised in place by the right-looking algorithm. As GPyTorch's
    ``psd_safe_cholesky``: if a diagonal tile is not positive definite, the factorisation
    starts again with ``cholesky_jitter`` (1e-8 in float64, 1e-6 in float32) added to the
    diagonal, ten times more each try, with a ``NumericalWarning``.
    """

    def __init__(self, kernel: Kernel, X: torch.Tensor, diag: float, *, tile: int = TILE, bar=None) -> None:
        self.n, self.bounds = len(X), tile_bounds(len(X), tile)
        self.L: dict[tuple[int, int], torch.Tensor] = {}
        jitter = lo_settings.cholesky_jitter.value(X.dtype)
        added = 0.0
        for attempt in range(lo_settings.cholesky_max_tries.value() + 1):
            if attempt:
                added = jitter * 10 ** (attempt - 1)
                warnings.warn(
                    f"the kernel matrix of {self.n} rows is not p.d.: added jitter of {added:.1e} to the diagonal",
                    NumericalWarning,
                    stacklevel=3,
                )
                if bar is not None:
                    bar.reset()
            if self._factor(kernel, X, diag + added, bar):
                return
        raise NotPSDError(f"the kernel matrix of {self.n} rows is not p.d. after adding jitter up to {added:.1e}")

    @staticmethod
    def units(T: int) -> int:
        """Progress units of a factorisation with T tile columns (column k costs ~(T - k)^2)."""
        return sum((T - k) ** 2 for k in range(T))

    def _factor(self, kernel: Kernel, X: torch.Tensor, diag: float, bar) -> bool:
        b, T = self.bounds, len(self.bounds)
        self.L = {}  # a failed try's tiles go before the next are built
        # one allocation for all tiles (each a contiguous view): the freed temporaries of the
        # kernel and the solves are recycled between tiles instead of scattering the heap
        sizes = {(i, j): (b[i][1] - b[i][0], b[j][1] - b[j][0]) for i in range(T) for j in range(i + 1)}
        store = torch.empty(sum(r * c for r, c in sizes.values()), dtype=X.dtype, device=X.device)
        L: dict[tuple[int, int], torch.Tensor] = {}
        off = 0
        for (i, j), (r, c) in sizes.items():
            L[i, j] = store[off : off + r * c].view(r, c)
            off += r * c
            L[i, j].copy_(kernel(X[b[i][0] : b[i][1]], X[b[j][0] : b[j][1]]))
            if i == j:
                L[i, i].diagonal().add_(diag)
        for k in range(T):
            Lkk, info = torch.linalg.cholesky_ex(L[k, k])
            if info.item() != 0:
                if torch.isnan(L[k, k]).any():
                    raise NanError(f"the kernel matrix of {self.n} rows has NaN entries")
                return False
            L[k, k].copy_(Lkk)
            for i in range(k + 1, T):  # L_ik = A_ik L_kk^-T
                L[i, k].copy_(torch.linalg.solve_triangular(Lkk.mT, L[i, k], upper=True, left=False))
            del Lkk
            for i in range(k + 1, T):  # the trailing matrix: A_ij -= L_ik L_jk^T
                for j in range(k + 1, i + 1):
                    L[i, j].addmm_(L[i, k], L[j, k].mT, alpha=-1)
            if bar is not None:
                bar.update((T - k) ** 2)
        self.L = L
        return True

    def forward(self, B: list[torch.Tensor]) -> list[torch.Tensor]:
        """``L^{-1} B`` for ``B`` given as its row blocks (one per tile row; overwritten)."""
        V: list[torch.Tensor] = []
        for i in range(len(self.bounds)):
            for j in range(i):
                B[i].addmm_(self.L[i, j], V[j], alpha=-1)
            V.append(torch.linalg.solve_triangular(self.L[i, i], B[i], upper=False))
            B[i] = V[-1]  # the input block goes now
        return V

    def solve(self, r: torch.Tensor) -> list[torch.Tensor]:
        """``(L L^T)^{-1} r`` (``r``: ``(n, k)``), by row blocks."""
        z = self.forward([r[a:b].clone() for a, b in self.bounds])
        T = len(self.bounds)
        out: list[torch.Tensor] = [z[0]] * T
        for i in reversed(range(T)):
            acc = z[i]
            for j in range(i + 1, T):
                acc = torch.addmm(acc, self.L[j, i].mT, out[j], alpha=-1)
            out[i] = torch.linalg.solve_triangular(self.L[i, i].mT, acc, upper=True)
        return out


def tiled_posterior(
    kernel: Kernel,
    X: torch.Tensor,
    r: torch.Tensor,
    Xs: np.ndarray,
    *,
    noise: torch.Tensor,
    prior_var: torch.Tensor,
    mean: torch.Tensor,
    tile: int = TILE,
    chunk: int = TEST_CHUNK,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and latent variance at ``Xs`` given rows ``X`` with centred targets ``r = y - m``:
    the exact GP predictive of :func:`._core.posterior`, by :class:`TiledCholesky`.

    ``prior_var`` is ``k(x, x)`` (the outputscale of a stationary kernel); ``mean`` the prior
    mean added back. Checks the host memory first (:func:`check_memory`).
    """
    n, dev, dt = len(X), X.device, X.dtype
    check_memory(n, tiled_bytes(n, tile, chunk, X.element_size()), dev)
    T = len(tile_bounds(n, tile))
    chunks = range(0, len(Xs), chunk)
    per_chunk = max(1, round(T * T * min(chunk, len(Xs)) / tile))  # n^2 n* flops in tile^3 units
    bar = progress_bar(
        progress, total=TiledCholesky.units(T) + per_chunk * len(chunks), desc=f"exact GP on {n} rows", unit="tile"
    )
    try:
        chol = TiledCholesky(kernel, X, float(noise), tile=tile, bar=bar)
        alpha = chol.solve(r.reshape(-1, 1))
        means, vars_ = [], []
        for s in chunks:
            xs = torch.as_tensor(np.array(Xs[s : s + chunk], dtype=float), device=dev, dtype=dt)
            Ks = [kernel(X[a:b], xs) for a, b in chol.bounds]  # (rows of the tile, n*)
            mu = mean + sum(K_i.mT @ a_i for K_i, a_i in zip(Ks, alpha))
            V = chol.forward(Ks)  # overwrites Ks
            del Ks
            quad = sum((v * v).sum(0) for v in V)
            del V
            means.append(mu.reshape(-1).cpu().numpy())
            vars_.append(torch.clamp(prior_var - quad, min=0).cpu().numpy())
            if bar is not None:
                bar.update(per_chunk)
    finally:
        if bar is not None:
            bar.close()
    return np.concatenate(means), np.concatenate(vars_)
