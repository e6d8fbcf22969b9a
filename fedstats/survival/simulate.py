"""Seeded survival federations for the examples, tests and benchmarks: proportional hazards
with an exponential baseline, censoring, and (optionally) times rounded to make ties."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..data import FederatedData

__all__ = ["proportional_hazards"]


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
