"""What each client reads for a survival analysis: its times (the data's target), its event
indicators (a named column, taken out of the predictors on the client, as the GLM's special
columns), its predictors (every other feature column) and, for the curves and tests, the level
of a group column. Rows are checked on the client: a bad time or event raises
:class:`~fedstats.data.DataError` naming the client and the column."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..data import DataError, FederatedData
from ..stats._columns import Column, codes, resolve

__all__ = ["SurvivalColumns", "SurvivalRows", "columns_of", "predictor_rows"]


class SurvivalRows(NamedTuple):
    """One client's rows: ``time`` (>= 0), ``event`` (bool), predictors ``X`` and ``group``
    codes (0 .. L-1; zeros without a group)."""

    time: np.ndarray
    event: np.ndarray
    X: np.ndarray
    group: np.ndarray


@dataclass(frozen=True)
class SurvivalColumns:
    """Where a client finds its survival data: ``event`` is the feature position of the event
    column, ``predictors`` the positions of the predictors (``names``), ``group`` a categorical
    :class:`~fedstats.stats._columns.Column` (or None). The specification travels to the
    clients inside the exchanges; each reads its own rows with :meth:`rows`."""

    time_name: str
    event_name: str
    event: int
    predictors: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    group: Column | None = None
    bins: tuple[float, ...] | None = None

    def rows(self, data: Any, client: Any = None) -> SurvivalRows:
        """The client's rows, checked (``client`` names it in a message)."""
        where = "" if client is None else f"client {client!r}: "
        X = np.asarray(data.X, dtype=float)
        t = np.asarray(data.y, dtype=float)
        e = X[:, self.event]
        bad_t = ~np.isfinite(t) | (t < 0)
        if bad_t.any():
            v = t[bad_t][0]
            raise DataError(
                f"{where}time {self.time_name!r} must be finite and >= 0, found {v:g} in {int(bad_t.sum())} row(s)"
            )
        bad_e = ~np.isin(e, (0.0, 1.0))
        if bad_e.any():
            raise DataError(
                f"{where}event {self.event_name!r} must be 1 (the event happened) or 0 (censored): "
                f"{int(bad_e.sum())} row(s) hold another value"
            )
        if self.bins is not None:  # each time coarsened to the upper edge of its bin
            edges = np.asarray(self.bins)
            over = t > edges[-1]
            if over.any():
                raise DataError(
                    f"{where}{int(over.sum())} time(s) lie beyond the last bin edge {edges[-1]:g}: add an edge at or "
                    "above the largest time"
                )
            t = edges[np.searchsorted(edges, t, side="left")]
        P = X[:, list(self.predictors)]
        if not np.isfinite(P).all():
            j = int(np.flatnonzero(~np.isfinite(P).all(axis=0))[0])
            raise DataError(f"{where}predictor {self.names[j]!r} has missing or infinite values")
        g = np.zeros(len(t), dtype=np.int64) if self.group is None else codes(data, self.group)
        if self.group is not None and (g >= self.group.n_categories).any():
            raise DataError(f"{where}group column {self.group.name!r} has missing values")
        return SurvivalRows(t, e == 1.0, P, g)


def check_bins(bins: Any, what: str) -> tuple[float, ...] | None:
    """``bins`` as a tuple of increasing finite edges (None: exact times)."""
    if bins is None:
        return None
    b = np.asarray(bins, dtype=float)
    if b.ndim != 1 or len(b) < 1 or not np.isfinite(b).all() or np.any(np.diff(b) <= 0) or b[0] < 0:
        raise ValueError(f"{what}: bins must be increasing finite edges >= 0, got {bins!r}")
    return tuple(map(float, b))


def columns_of(
    data: FederatedData,
    event: str,
    what: str,
    *,
    group: Column | None = None,
    exclude: tuple[str, ...] = (),
    bins: Any = None,
) -> SurvivalColumns:
    """The :class:`SurvivalColumns` of ``data``: its target is the time, ``event`` names the
    event column; the predictors are the other feature columns, less the group's and those of
    ``exclude``."""
    if not isinstance(data, FederatedData):
        raise TypeError(f"{what}: data must be a FederatedData, got {type(data).__name__}")
    data._need_target(what)
    names = list(data.feature_names)
    if not isinstance(event, str) or event not in names:
        raise DataError(
            f"{what}: event={event!r} is not a column of the data (columns: {names[:10]}); the time is the "
            f"target ({data.target_name!r}) and event names the 0/1 column of events"
        )
    skip = {names.index(event)}
    if group is not None and group.index is not None:
        skip |= set(group.index)
    for name in exclude:
        col = resolve(data, name)
        skip |= set(col.index or ())
    keep = tuple(j for j in range(len(names)) if j not in skip)
    return SurvivalColumns(
        str(data.target_name), event, names.index(event), keep, tuple(names[j] for j in keep), group,
        check_bins(bins, what),
    )  # fmt: skip


def predictor_rows(result: Any, X: Any) -> np.ndarray:
    """Rows to predict for a survival ``result`` (its ``predictors``, ``feature_names``,
    ``event_index``, ``event_name``, ``time_name``): a data frame read by column name (the time
    and event columns, if there, ignored), or an array of the predictors in the fit's order, or
    of all the data's feature columns (the event's ignored)."""
    if isinstance(X, pd.DataFrame):
        X = result._feature_rows(
            X.drop(columns=[result.event_name, result.time_name], errors="ignore"), result.predictors
        )
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X[None, :]
    if X.ndim == 2 and X.shape[1] == len(result.feature_names) != len(result.predictors):
        X = np.delete(X, result.event_index, axis=1)
    if X.ndim != 2 or X.shape[1] != len(result.predictors):
        raise ValueError(f"X must have {len(result.predictors)} columns ({result.predictors}), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X has NaN or inf")
    return X
