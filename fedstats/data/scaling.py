"""Federated standardisation: every client reports a few sums of its own rows in two rounds
(its count and column sums, :func:`client_sums`; then its squared deviations about the
federation's means, :func:`client_moments`), the server combines only their sums over the
clients (:func:`add_moments`, :func:`aggregate_moments`) into a :class:`FederatedScaler`;
rows are never pooled and the server needs no client's own value.

:func:`fedstats.federation.federated_moments` runs both rounds over clients' rows (with
``dp=``, as differentially private releases)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .validation import ClientId, ConstantFeatureWarning, DataError, missing_target, readonly

if TYPE_CHECKING:
    from .container import FederatedData


def client_sums(X: np.ndarray, y: np.ndarray | None = None) -> dict[str, Any]:
    """The first federated round of scaling: a client's row count and column sums.

    Summed over the clients they give the federation's means, which the server broadcasts
    for the second round (:func:`client_moments` with ``about``).

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.data.scaling import client_sums
    >>> client_sums(np.array([[1.0], [3.0]]), np.array([2.0, 0.0]))
    {'n': 2, 'sum_x': array([4.]), 'sum_y': 2.0}
    """
    return _sums(np.asarray(X, dtype=np.float64), y)


def _sums(X: np.ndarray, y: np.ndarray | None) -> dict[str, Any]:
    out: dict[str, Any] = {"n": int(X.shape[0]), "sum_x": X.sum(axis=0)}
    if y is not None:
        out["sum_y"] = float(np.asarray(y, dtype=np.float64).sum())
    return out


def client_moments(
    X: np.ndarray, y: np.ndarray | None = None, *, about: tuple[np.ndarray, float | None] | None = None
) -> dict[str, Any]:
    """Sums a client computes from its own rows and reports for federated scaling.

    The sum of squares is reported centred, ``m2 = sum((x - c)**2)``: it carries the same
    information as the raw ``sum(x**2)`` (``m2 = sum(x**2) - 2 c sum + n c**2``) but cannot
    lose digits to cancellation when the mean is large relative to the sd. The centre ``c``
    is the client's own mean, or ``about = (mean_x, mean_y)``: the federation's means, which
    the server broadcasts after a first round of :func:`client_sums`. About a common centre
    the clients' moments add up to the moments of their pooled rows, so the server needs
    only their sum over the clients (:func:`add_moments`, then :func:`aggregate_moments` of
    that one record): the exact pooled mean and sd, with no client's own values.

    Parameters
    ----------
    X : (n, d) array
    y : (n,) array, optional
    about : (mean_x, mean_y), optional
        The centre of the squared deviations (``mean_y`` may be ``None`` without ``y``);
        default: the client's own means.

    Returns
    -------
    dict
        ``n`` (int), ``sum_x`` (d,), ``m2_x`` (d,), and ``sum_y``, ``m2_y`` (floats)
        when ``y`` is given.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.data import client_moments
    >>> m = client_moments(np.array([[1.0], [3.0]]))
    >>> m["n"], m["sum_x"], m["m2_x"]
    (2, array([4.]), array([2.]))
    >>> client_moments(np.array([[1.0], [3.0]]), about=(np.array([1.0]), None))["m2_x"]
    array([4.])
    """
    X = np.asarray(X, dtype=np.float64)
    out = _sums(X, y)
    n = out["n"]
    centre_x = out["sum_x"] / n if about is None else np.asarray(about[0], dtype=np.float64)
    out["m2_x"] = ((X - centre_x) ** 2).sum(axis=0)
    if y is not None:
        y = np.asarray(y, dtype=np.float64)
        centre_y = out["sum_y"] / n if about is None or about[1] is None else float(about[1])
        out["m2_y"] = float(((y - centre_y) ** 2).sum())
    return out


def add_moments(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum over the clients of their :func:`client_sums` or :func:`client_moments`
    (key by key; every record must have the same keys): all the server of a federated
    scaling receives of a round, and all a secure aggregation would reveal."""
    if not records:
        raise DataError("add_moments needs the sums of at least one client")
    keys = set(records[0])
    if any(set(r) != keys for r in records):
        raise DataError("add_moments: the clients' records have different keys")
    out: dict[str, Any] = {}
    for k in records[0]:
        total = records[0][k]
        for r in records[1:]:
            total = total + r[k]
        out[k] = total
    return out


def aggregate_moments(moments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Server side: overall mean and sample sd from groups' :func:`client_moments`.

    Uses only the groups' sums: ``mean = sum_k sum_k / N`` and
    ``M2 = sum_k m2_k + sum_k n_k (mean_k - mean)**2`` (the parallel-variance formula),
    ``sd = sqrt(M2 / (N - 1))``. Federated scaling passes one group: the sum over the
    clients (:func:`add_moments`) of their moments about the federation's mean (see
    :func:`client_moments`), for which ``M2 = sum_k m2_k``; the per-client form needs every
    client's own mean.

    Parameters
    ----------
    moments : sequence of dict
        One :func:`client_moments` result per group.

    Returns
    -------
    dict
        ``n``, ``mean_x``, ``sd_x`` and, if every group has y sums, ``mean_y``, ``sd_y``
        (sd is NaN when ``N < 2``).

    Example
    -------
    >>> from fedstats.data import aggregate_moments
    >>> import numpy as np
    >>> agg = aggregate_moments([{"n": 2, "sum_x": np.array([2.0]), "m2_x": np.array([2.0])},
    ...                          {"n": 1, "sum_x": np.array([4.0]), "m2_x": np.array([0.0])}])
    >>> agg["n"], agg["mean_x"], agg["sd_x"]
    (3, array([2.]), array([2.]))
    """
    if not moments:
        raise DataError("aggregate_moments needs the sums of at least one client")
    has_y = all("sum_y" in m for m in moments)
    n = sum(int(m["n"]) for m in moments)
    out: dict[str, Any] = {"n": n}
    keys = [("x", "sum_x", "m2_x")] + ([("y", "sum_y", "m2_y")] if has_y else [])
    for name, s_key, m2_key in keys:
        total = sum(np.asarray(m[s_key], dtype=np.float64) for m in moments)
        mean = total / n
        m2 = sum(
            np.asarray(m[m2_key], dtype=np.float64)
            + m["n"] * (np.asarray(m[s_key], dtype=np.float64) / m["n"] - mean) ** 2
            for m in moments
        )
        var = m2 / (n - 1) if n > 1 else np.full_like(mean, np.nan)
        if name == "y":
            out["mean_y"], out["sd_y"] = float(mean), float(np.sqrt(var))
        else:
            out["mean_x"], out["sd_x"] = np.asarray(mean), np.sqrt(var)
    return out


def two_round_moments(rows: Sequence[tuple[np.ndarray, np.ndarray | None]]) -> dict[str, Any]:
    """:func:`aggregate_moments` of clients' rows ``[(X_k, y_k or None), ...]`` from the two
    rounds' sums: the counts and sums (:func:`client_sums`), then the squared deviations about
    the means they give (:func:`client_moments` with ``about``); each client's function sees
    only that client's rows (:func:`fedstats.federation.federated_moments` adds ``dp=``)."""
    first = add_moments([client_sums(X, y) for X, y in rows])
    n = first["n"]
    about = (first["sum_x"] / n, first["sum_y"] / n if "sum_y" in first else None)
    return aggregate_moments([add_moments([client_moments(X, y, about=about) for X, y in rows])])


def _safe_sd(sd: np.ndarray, mean: np.ndarray, names: Sequence[str], what: str = "feature") -> np.ndarray:
    """sd with constant columns set to 1 (and a warning), so nothing divides by zero."""
    sd = np.array(sd, dtype=np.float64)
    # relative tolerance: a constant column's sd is rounding noise of order eps * |mean|
    const = (sd == 0) | (sd <= 1e-12 * np.abs(mean))
    for j in np.flatnonzero(const):
        warnings.warn(
            f"{what} {names[int(j)]!r} is constant across all clients (sd == 0); "
            "its sd is taken as 1, so it is only centred",
            ConstantFeatureWarning,
            stacklevel=4,
        )
    sd[const] = 1.0
    return sd


def fit_scaler(fd: FederatedData, *, center: bool, scale: bool, target: bool) -> FederatedScaler:
    """The scaler of :meth:`FederatedData.fit_scaler`."""
    if target and not fd.has_target:
        raise missing_target("fit_scaler(target=True)")
    # Federated on purpose: a client's rows only ever enter client_sums and client_moments
    # (run by that client); the server sees their sums over the clients and nothing else.
    agg = two_round_moments([(cd.X, cd.y if target else None) for _, cd in fd.items()])
    n = agg["n"]
    if n < 2:
        raise DataError("fit_scaler needs at least 2 rows in total for a sample sd")
    d = fd.n_features
    mean = agg["mean_x"] if center else np.zeros(d)
    sd = _safe_sd(agg["sd_x"], agg["mean_x"], fd.feature_names) if scale else np.ones(d)
    y_mean = y_sd = None
    if target:
        target_name = fd.target_name
        assert target_name is not None  # fd.has_target, checked above
        y_mean = float(agg["mean_y"]) if center else 0.0
        y_sd = (
            float(_safe_sd(np.atleast_1d(agg["sd_y"]), np.atleast_1d(agg["mean_y"]), [target_name], what="target")[0])
            if scale
            else 1.0
        )
    return FederatedScaler(mean=mean, sd=sd, feature_names=tuple(fd.feature_names), y_mean=y_mean, y_sd=y_sd, n=n)


@dataclass(frozen=True, eq=False)
class FederatedScaler:
    """Federated standardisation: ``x -> (x - mean) / sd`` per feature (and for y).

    Fitted by :meth:`FederatedData.fit_scaler` from per-client sums only. ``mean`` is the
    shift applied (zeros when fitted with ``center=False``), ``sd`` the divisor applied
    (ones with ``scale=False``; 1 for a constant feature). ``y_mean``/``y_sd`` are ``None``
    unless fitted with ``target=True``. ``n`` is the number of rows it was fitted on.

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.data import FederatedScaler
    >>> sc = FederatedScaler(mean=np.array([1.0]), sd=np.array([2.0]), feature_names=("x0",),
    ...                      y_mean=10.0, y_sd=5.0, n=4)
    >>> sc.transform_X(np.array([[3.0]])), sc.inverse_transform_y(np.array([1.0]))
    (array([[1.]]), array([15.]))
    >>> FederatedScaler.from_dict(sc.to_dict()).sd
    array([2.])
    """

    mean: np.ndarray
    sd: np.ndarray
    feature_names: tuple[str, ...]
    y_mean: float | None = None
    y_sd: float | None = None
    n: int | None = field(default=None)

    def __post_init__(self) -> None:
        mean = np.array(self.mean, dtype=np.float64).reshape(-1)
        sd = np.array(self.sd, dtype=np.float64).reshape(-1)
        names = tuple(self.feature_names)
        if not (mean.shape == sd.shape == (len(names),)):
            raise DataError(
                f"scaler: mean ({mean.size}), sd ({sd.size}) and feature_names ({len(names)}) must have the same length"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(sd)) and np.all(sd > 0)):
            raise DataError("scaler: mean must be finite and sd finite and > 0")
        if (self.y_mean is None) != (self.y_sd is None):
            raise DataError("scaler: give both y_mean and y_sd, or neither")
        if (
            self.y_mean is not None
            and self.y_sd is not None
            and not (math.isfinite(self.y_mean) and math.isfinite(self.y_sd) and self.y_sd > 0)
        ):
            raise DataError("scaler: y_mean must be finite and y_sd finite and > 0")
        object.__setattr__(self, "mean", readonly(mean))
        object.__setattr__(self, "sd", readonly(sd))
        object.__setattr__(self, "feature_names", names)
        if self.y_mean is not None and self.y_sd is not None:
            object.__setattr__(self, "y_mean", float(self.y_mean))
            object.__setattr__(self, "y_sd", float(self.y_sd))

    @property
    def has_target(self) -> bool:
        """Whether y is standardised too."""
        return self.y_sd is not None

    def transform(self, fd: FederatedData) -> FederatedData:
        """A new :class:`FederatedData` with every client's X (and y, if fitted) scaled.

        Each client applies the broadcast ``mean``/``sd`` to its own rows.
        """
        if list(self.feature_names) != fd.feature_names:
            raise DataError(
                f"scaler was fitted on features {list(self.feature_names)} but the data has {fd.feature_names}"
            )
        Xd: dict[ClientId, np.ndarray] = {}
        yd: dict[ClientId, np.ndarray | None] = {}
        for c, cd in fd.items():
            Xd[c] = self.transform_X(cd.X)
            if self.has_target and cd.y is None:
                raise DataError("the scaler standardises a target, but the data has none")
            yd[c] = self.transform_y(cd.y) if self.has_target and cd.y is not None else cd.y
        from .container import checked_data

        return checked_data(Xd, yd, fd.feature_names, fd.target_name, fd)

    def transform_X(self, X: np.ndarray) -> np.ndarray:
        """``(X - mean) / sd`` for an ``(n, d)`` array (e.g. new points to predict at)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.mean.size:
            raise DataError(f"X must have shape (n, {self.mean.size}), got {X.shape}")
        return (X - self.mean) / self.sd

    def transform_y(self, y: np.ndarray) -> np.ndarray:
        """``(y - y_mean) / y_sd``; needs a scaler fitted with ``target=True``."""
        y_mean, y_sd = self._target_scale()
        return (np.asarray(y, dtype=np.float64) - y_mean) / y_sd

    def inverse_transform_y(self, y: np.ndarray) -> np.ndarray:
        """Back to the original units of y: ``y * y_sd + y_mean``.

        Only for values of y itself (predictions, posterior draws); an sd or a
        residual scale is multiplied by ``y_sd`` alone, without the shift.
        """
        y_mean, y_sd = self._target_scale()
        return np.asarray(y, dtype=np.float64) * y_sd + y_mean

    def _target_scale(self) -> tuple[float, float]:
        # y_mean and y_sd are both set or both None (__post_init__)
        if self.y_mean is None or self.y_sd is None:
            raise DataError("this scaler was fitted without target=True; it has no y_mean/y_sd")
        return self.y_mean, self.y_sd

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (plain lists and floats)."""
        return {
            "feature_names": list(self.feature_names),
            "mean": self.mean.tolist(),
            "sd": self.sd.tolist(),
            "y_mean": self.y_mean,
            "y_sd": self.y_sd,
            "n": self.n,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FederatedScaler:
        """Inverse of :meth:`to_dict` (validated)."""
        missing = [k for k in ("feature_names", "mean", "sd") if k not in d]
        if missing:
            raise DataError(f"scaler dict lacks key(s) {missing}")
        return cls(
            mean=np.asarray(d["mean"], dtype=np.float64),
            sd=np.asarray(d["sd"], dtype=np.float64),
            feature_names=tuple(d["feature_names"]),
            y_mean=d.get("y_mean"),
            y_sd=d.get("y_sd"),
            n=d.get("n"),
        )
