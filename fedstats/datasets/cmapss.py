"""NASA C-MAPSS turbofan degradation data as a federation of engines (the linear-models paper's
Section 6.2 and the FGPR paper's Application II).

The files are not shipped with fedstats: pass the folder (or file) that holds
``train_FD001.txt``, or set ``FEDSTATS_DATA`` to a folder holding a ``cmapss/`` sub-folder
(or the files themselves). The NASA text format is whitespace separated without a header:
unit, cycle, three operational settings, then sensors 1-21 (sensor ``s`` is column ``5 + s``,
1-based).

The linear-models paper fits, per engine and per sensor, a polynomial in time: rows
``(1, t, t^2, ..., t^order)`` with ``t = (cycle - 1) / 299``; the first 60% of each engine's
cycles train and the last 40% test (extrapolation). Each engine's sensor values are min-max
scaled with its *training* minimum and maximum (default); the published code scaled the
test segment with its own minimum and maximum (``scaling="own"``, a leak kept for
comparison with the paper's numbers).

The engines' data are about no one: the federations come without disclosure rules
(``NO_RULES``, :mod:`fedstats.data.disclosure`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from ..data import FederatedData
from ..data.disclosure import NO_RULES
from ._files import DataPath, find_data_file

SETTINGS = ["setting1", "setting2", "setting3"]
SENSORS = [f"sensor{s}" for s in range(1, 22)]
COLUMNS = ["unit", "cycle", *SETTINGS, *SENSORS]
SUBSETS = ("FD001", "FD002", "FD003", "FD004")
SCALINGS = ("train", "own")
#: the time scale of the paper's code: t = (cycle - 1) / TIME_SCALE
TIME_SCALE = 299.0


def _find(path: DataPath, filename: str) -> Path:
    return find_data_file(path, filename, "cmapss")


def read_cmapss(path: DataPath = None, subset: str = "FD001", split: str = "train") -> pd.DataFrame:
    """The raw table of ``{split}_{subset}.txt`` (``split`` "train" or "test") with columns
    unit, cycle, setting1-3, sensor1-21."""
    if subset not in SUBSETS:
        raise ValueError(f"subset must be one of {SUBSETS}, got {subset!r}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    file = _find(path, f"{split}_{subset}.txt")
    df = pd.read_csv(file, sep=r"\s+", header=None, engine="python")
    if df.shape[1] != len(COLUMNS):
        raise ValueError(
            f"{file.name}: expected {len(COLUMNS)} columns (unit, cycle, 3 settings, 21 sensors), found {df.shape[1]}"
        )
    df.columns = COLUMNS
    df[["unit", "cycle"]] = df[["unit", "cycle"]].astype(int)
    return df.sort_values(["unit", "cycle"], kind="stable").reset_index(drop=True)


def polynomial_design(t: ArrayLike, order: int) -> np.ndarray:
    """Rows ``(1, t, ..., t^order)`` (raw monomials, as in the paper)."""
    t = np.asarray(t, dtype=float)
    return t[:, None] ** np.arange(order + 1)


def load_cmapss(
    path: DataPath = None,
    subset: str = "FD001",
    *,
    sensor: int = 2,
    order: int = 6,
    train_fraction: float = 0.6,
    scaling: str = "train",
    engines: Sequence[int] | None = None,
) -> tuple[FederatedData, FederatedData]:
    """Per-engine polynomial-trend regression of one sensor, split chronologically.

    Parameters
    ----------
    path, subset
        where ``train_{subset}.txt`` is (see the module docs) and which subset (FD001).
    sensor : int
        C-MAPSS sensor number 1-21 (the paper: 2, 3, 7 and 8).
    order : int
        polynomial order d; the design has ``d + 1`` columns ``t^0 .. t^d`` (paper: 6).
    train_fraction : float
        each engine's first ``floor(train_fraction * n)`` cycles train, the rest test.
    scaling : "train" or "own"
        min-max scaling of each engine's sensor values with its training statistics, or the
        published code's scaling of the test segment with its own statistics.
    engines : list of int, optional
        a subset of unit numbers (default all).

    Returns
    -------
    (train, test) : two :class:`~fedstats.data.FederatedData` with one client per engine
    (``"engine1"`` ...), features ``t^0 .. t^order`` (fit without an extra intercept).
    """
    if not isinstance(sensor, (int, np.integer)) or not 1 <= sensor <= 21:
        raise ValueError(f"sensor must be an integer in 1..21, got {sensor!r}")
    if not isinstance(order, (int, np.integer)) or order < 0:
        raise ValueError(f"order must be a non-negative integer, got {order!r}")
    if not 0 < float(train_fraction) < 1:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction!r}")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    df = read_cmapss(path, subset)
    units = sorted(df["unit"].unique()) if engines is None else list(engines)
    unknown = sorted(set(units) - set(df["unit"]))
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown[:5]} in {subset}")
    col = f"sensor{sensor}"
    names = [f"t^{j}" for j in range(order + 1)]
    parts: dict[str, tuple[dict[Hashable, np.ndarray], dict[Hashable, np.ndarray]]] = {
        "train": ({}, {}),
        "test": ({}, {}),
    }
    for u in units:
        g = df[df["unit"] == u]
        n = len(g)
        n_tr = int(np.floor(train_fraction * n))
        if n_tr < 1 or n_tr >= n:
            raise ValueError(f"engine {u} has {n} cycles: too few to split {train_fraction:.0%}/rest")
        t = (g["cycle"].to_numpy(dtype=float) - 1) / TIME_SCALE
        y = g[col].to_numpy(dtype=float)
        tr, te = slice(0, n_tr), slice(n_tr, n)
        lo, hi = y[tr].min(), y[tr].max()
        if hi == lo:
            raise ValueError(
                f"sensor {sensor} is constant on engine {u}'s training cycles: it cannot be min-max "
                "scaled (FD001 sensors 1, 5, 6, 10, 16, 18, 19 are constant)"
            )
        lo_te, hi_te = (lo, hi) if scaling == "train" else (y[te].min(), y[te].max())
        if hi_te == lo_te:
            raise ValueError(f"sensor {sensor} is constant on engine {u}'s test cycles: use scaling='train'")
        X = polynomial_design(t, order)
        cid = f"engine{u}"
        parts["train"][0][cid], parts["train"][1][cid] = X[tr], (y[tr] - lo) / (hi - lo)
        parts["test"][0][cid], parts["test"][1][cid] = X[te], (y[te] - lo_te) / (hi_te - lo_te)
    train, test = (
        FederatedData.from_arrays(Xs, ys, feature_names=names, target_name=col, **NO_RULES) for Xs, ys in parts.values()
    )
    return train, test


def load_cmapss_gp(
    path: DataPath = None, subset: str = "FD001", *, sensor: int = 2, n_train_engines: int = 60, seed: int = 0
) -> tuple[FederatedData, FederatedData, FederatedData]:
    """The FGPR paper's engine study (its Application II; the published code fixes the FD001
    file and sensors 2 and 7, which the paper does not name).

    The engines are split at random into ``n_train_engines`` training engines (all their
    cycles) and the rest, which take no part in training: each of those splits its own cycles
    at random 50/50 into points it conditions on and points it is scored on. Input: the cycle
    divided by the largest cycle of the training engines; output: the sensor, standardised
    per engine over all its cycles (the paper's convention).

    Returns ``(train, condition, test)``: the training engines, and for the unseen engines
    their conditioning and scoring halves (same client names ``"engine<unit>"``).
    """
    if not isinstance(sensor, (int, np.integer)) or not 1 <= sensor <= 21:
        raise ValueError(f"sensor must be an integer in 1..21, got {sensor!r}")
    df = read_cmapss(path, subset, "train")
    units = np.sort(df["unit"].unique())
    if not 1 <= n_train_engines < len(units):
        raise ValueError(f"n_train_engines must be between 1 and {len(units) - 1}, got {n_train_engines!r}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(units)
    train_units, test_units = np.sort(order[:n_train_engines]), np.sort(order[n_train_engines:])
    tmax = float(df.loc[df["unit"].isin(train_units), "cycle"].max())

    def engine(u: int) -> tuple[np.ndarray, np.ndarray]:
        g = df[df["unit"] == u]
        v = g[f"sensor{sensor}"].to_numpy(dtype=float)
        sd = v.std()
        if not sd > 1e-9 * max(1.0, abs(v.mean())):
            raise ValueError(f"sensor {sensor} is constant on engine {u}: nothing to model (choose e.g. 2 or 7)")
        return (g["cycle"].to_numpy(dtype=float) / tmax)[:, None], (v - v.mean()) / sd

    name = lambda u: f"engine{u}"  # noqa: E731
    feats, target = ["cycle"], f"sensor{sensor}"
    tr = [engine(u) for u in train_units]
    train = FederatedData.from_arrays(
        [x for x, _ in tr],
        [y for _, y in tr],
        clients=[name(u) for u in train_units],
        feature_names=feats,
        target_name=target,
        **NO_RULES,
    )
    cond: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    test: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for u in test_units:
        x, y = engine(u)
        perm = rng.permutation(len(y))
        a, b = np.sort(perm[: len(y) // 2]), np.sort(perm[len(y) // 2 :])
        cond[0].append(x[a])
        cond[1].append(y[a])
        test[0].append(x[b])
        test[1].append(y[b])
    names = [name(u) for u in test_units]
    return (
        train,
        FederatedData.from_arrays(*cond, clients=names, feature_names=feats, target_name=target, **NO_RULES),
        FederatedData.from_arrays(*test, clients=names, feature_names=feats, target_name=target, **NO_RULES),
    )
