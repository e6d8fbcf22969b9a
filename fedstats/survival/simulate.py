"""Seeded survival federations for the examples, tests and benchmarks: proportional hazards
with an exponential baseline, censoring, and (optionally) times rounded to make ties."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..data import FederatedData

__all__ = ["proportional_hazards", "piecewise_hazards"]


def proportional_hazards(
    n_clients: int = 4,
    seed: int = 0,
    *,
    rows: int | Sequence[int] = 200,
    beta: Sequence[float] = (0.5, -0.5),
    censoring: float = 0.3,
    resolution: float | None = None,
    client_effect: float = 0.0,
) -> FederatedData:
    """``n_clients`` clients of ``rows`` rows each (or one count per client): predictors
    ``x0, x1, ...`` standard normal, hazard ``exp(x'beta + u_c)`` (``u_c ~ N(0, client_effect^2)``
    a client's frailty), exponential censoring at rate ``censoring``, and with ``resolution``
    times rounded up to its multiples (ties). Columns ``x0, ..., event``; target ``time``.

    >>> fd = proportional_hazards(3, rows=50)
    >>> fd.feature_names, fd.target_name
    (['x0', 'x1', 'event'], 'time')
    """
    rng = np.random.default_rng(seed)
    b = np.asarray(beta, dtype=float)
    sizes = [int(rows)] * n_clients if isinstance(rows, (int, np.integer)) else [int(r) for r in rows]
    if len(sizes) != n_clients:
        raise ValueError(f"rows: one count per client ({n_clients}), got {len(sizes)}")
    Xs, ts = [], []
    for n in sizes:
        x = rng.normal(size=(n, len(b)))
        u = rng.normal(0.0, client_effect) if client_effect else 0.0
        t = rng.exponential(1.0 / np.exp(x @ b + u))
        c = rng.exponential(1.0 / censoring, n) if censoring > 0 else np.full(n, np.inf)
        time = np.minimum(t, c)
        if resolution is not None:
            time = np.ceil(time / resolution) * resolution
        Xs.append(np.column_stack([x, (t <= c).astype(float)]))
        ts.append(time)
    names = [f"x{j}" for j in range(len(b))] + ["event"]
    return FederatedData.from_arrays(
        Xs, ts, feature_names=names, target_name="time", clients=[f"site{k}" for k in range(n_clients)],
        min_rows=1, min_cell_count=1,
    )  # fmt: skip


def piecewise_hazards(
    theta: np.ndarray,
    cuts: Sequence[float],
    seed: int = 0,
    *,
    rows: int | Sequence[int] = 100,
    censoring: float = 0.2,
    follow_up: float | None = None,
) -> FederatedData:
    """One client per row of ``theta`` (``(K, J + p)``: the client's log hazards in the ``J``
    intervals that ``cuts`` (``J - 1`` increasing times) make, then its coefficients of ``p``
    standard normal predictors), the :class:`~fedstats.survival.HierarchicalCox` model itself;
    exponential censoring at rate ``censoring`` and, with ``follow_up``, at that time. Columns
    ``x0, ..., event``; target ``time``.

    >>> fd = piecewise_hazards(np.zeros((2, 3)), [1.0], rows=20)
    >>> fd.feature_names, fd.n_obs
    (['x0', 'event'], {'site0': 20, 'site1': 20})
    """
    rng = np.random.default_rng(seed)
    theta = np.atleast_2d(np.asarray(theta, dtype=float))
    edges = np.r_[0.0, np.asarray(cuts, dtype=float)]
    J = len(edges)
    K, p = theta.shape[0], theta.shape[1] - J
    sizes = [int(rows)] * K if isinstance(rows, (int, np.integer)) else [int(r) for r in rows]
    if len(sizes) != K or p < 0:
        raise ValueError(f"theta must be (clients, {J} + p) and rows one count per client ({K})")
    width = np.r_[np.diff(edges), np.inf]
    Xs, ts = [], []
    for th, n in zip(theta, sizes, strict=True):
        x = rng.normal(size=(n, p))
        h = np.exp(th[:J][None, :] + (x @ th[J:])[:, None])  # (n, J) hazards
        H = np.cumsum(np.c_[np.zeros(n), (h * width)[:, :-1]], axis=1)  # cumulative hazard at each edge
        e = rng.exponential(size=n)
        j = np.sum(H <= e[:, None], axis=1) - 1  # the interval where the cumulative hazard reaches e
        t = edges[j] + (e - H[np.arange(n), j]) / h[np.arange(n), j]
        c = rng.exponential(1.0 / censoring, n) if censoring > 0 else np.full(n, np.inf)
        if follow_up is not None:
            c = np.minimum(c, follow_up)
        Xs.append(np.column_stack([x, (t <= c).astype(float)]))
        ts.append(np.minimum(t, c))
    names = [f"x{j}" for j in range(p)] + ["event"]
    return FederatedData.from_arrays(
        Xs, ts, feature_names=names, target_name="time", clients=[f"site{k}" for k in range(K)],
        min_rows=1, min_cell_count=1,
    )  # fmt: skip
