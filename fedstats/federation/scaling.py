"""Scale-aware fitting of the models with a linear predictor (the Bayesian linear models and GLMs): fit on standardised data, report on the
data's own scale.

The models' default priors (``N(0, 1)`` on coefficient means, log-normal on scales) suit
data of unit scale; on data in natural units (dollars, kelvin, counts in thousands) they pin
the intercept near 0 and the slopes absorb the difference. With ``standardize=True`` (the
default) a model first learns the federated mean and sd of every predictor and of the target
in two counted rounds whose replies the server sees only summed over the clients (row counts
and sums; then the sums of squared deviations about the federation's means, and how many
clients hold a column that is not only 0 and 1: never a row, nor one client's value), fits
with

    x'_j = (x_j - m_j) / s_j,    y' = (y - m_y) / s_y

applied by each client to its own rows, and maps every output back by the exact affine map
of the coefficients ``theta = A theta' + c`` (:meth:`LinearScaling.coef_map`): Gaussian
posteriors stay Gaussian, draws are mapped draw by draw, predictions and both bands are
mapped by ``y = m_y + s_y y'`` (monotone, so quantiles map exactly). Predictors that hold only
0 and 1 at every client keep their coding (m = 0, s = 1), and so does a constant one. Without
an intercept nothing is centred (the model has no intercept to absorb a shift): only scaled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.scaling import aggregate_moments, client_moments, client_sums
from ..result_file import register
from .oneshot import raise_failures
from .protocol import FederatedAlgorithm
from .runner import run

__all__ = ["LinearScaling", "federated_scaling"]


@register
@dataclass(repr=False)
class LinearScaling:
    """The affine map between the data's scale and the standardised one a model is fitted on.

    ``x_mean``, ``x_sd`` (one per predictor, intercept excluded), ``y_mean``, ``y_sd``;
    ``binary`` marks the predictors that keep their 0/1 coding; ``fit_intercept`` says
    whether the coefficient vector starts with an intercept."""

    x_mean: np.ndarray
    x_sd: np.ndarray
    y_mean: float
    y_sd: float
    binary: np.ndarray
    fit_intercept: bool

    def __repr__(self) -> str:
        return f"LinearScaling(y_mean={self.y_mean:.4g}, y_sd={self.y_sd:.4g}, predictors={len(self.x_sd)})"

    # ---------------------------------------------------------------- rows (client side)
    def transform_X(self, X) -> np.ndarray:
        return (np.asarray(X, dtype=float) - self.x_mean) / self.x_sd

    def transform_y(self, y) -> np.ndarray:
        return (np.asarray(y, dtype=float) - self.y_mean) / self.y_sd

    def inverse_y(self, v) -> np.ndarray:
        return self.y_mean + self.y_sd * np.asarray(v, dtype=float)

    # ---------------------------------------------------------------- coefficients
    def coef_map(self) -> tuple[np.ndarray, np.ndarray]:
        """``(A, c)`` with ``theta = A theta' + c`` for coefficient vectors (intercept first
        when the model has one)."""
        r = self.y_sd / self.x_sd
        if not self.fit_intercept:
            return np.diag(r), np.zeros(len(r))
        d = len(r) + 1
        A = np.zeros((d, d))
        A[0, 0] = self.y_sd
        A[0, 1:] = -r * self.x_mean
        A[1:, 1:] = np.diag(r)
        c = np.zeros(d)
        c[0] = self.y_mean
        return A, c

    def coef_back(self, theta) -> np.ndarray:
        """Coefficient vectors (rows of ``theta``) on the data's scale."""
        A, c = self.coef_map()
        return np.asarray(theta) @ A.T + c

    def coef_forward(self, theta) -> np.ndarray:
        """Coefficient vectors on the data's scale -> the standardised scale."""
        A, c = self.coef_map()
        return np.linalg.solve(A, (np.asarray(theta) - c).T).T

    @property
    def identity(self) -> bool:
        return bool(np.all(self.x_mean == 0) and np.all(self.x_sd == 1) and self.y_mean == 0 and self.y_sd == 1)


class _Moments(FederatedAlgorithm):
    """Two rounds whose replies the server receives only summed over the clients:

    * round 0: each client sends its row count (``n``), the sums of its columns (``sum_x``)
      and of its target (``sum_y``, :func:`~fedstats.data.scaling.client_sums`) and, per
      column, 1 where the column holds a value other than 0 and 1 (``not_binary``: summed,
      the number of clients at which it is not a 0/1 dummy);
    * round 1: the server broadcasts the federation's means; each client sends ``n`` and
      ``not_binary`` again and, under ``sum_x`` and ``sum_y``, its sums of squared
      deviations about those means (:func:`~fedstats.data.scaling.client_moments`). About
      a common centre they add up to the pooled rows' sums of squares: the exact pooled sd,
      with the precision of centred sums and without any client's own mean.

    In both rounds a sum that overflowed is sent as 0 and flagged with a 1 in ``overflow``
    (summed: the number of clients at which it overflowed), for the server to name the
    column. The server state keeps each round's sums (``"sums"``, ``"squares"``)."""

    reply_keys = ("n", "sum_x", "sum_y", "not_binary", "overflow")
    summed_keys = reply_keys  # the server uses every reply only through its sum over the clients

    def init_server(self, clients, rng):
        return {"sums": None, "squares": None}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        if server_state["sums"] is None:
            return {}
        return {"mean_x": server_state["mean_x"], "mean_y": server_state["mean_y"]}

    def client_step(self, message, state, data, rng):
        X, y = np.asarray(data.X, dtype=float), np.asarray(data.y, dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):
            if "mean_x" in message:
                m = client_moments(X, y, about=(message["mean_x"], float(message["mean_y"][0])))
                vals = np.r_[m["m2_x"], m["m2_y"]]
            else:
                m = client_sums(X, y)
                vals = np.r_[m["sum_x"], m["sum_y"]]
        ok = np.isfinite(vals)
        vals = np.where(ok, vals, 0.0)
        return {
            "n": np.array([m["n"]], float),
            "sum_x": vals[:-1],
            "sum_y": vals[-1:],
            "not_binary": (~np.all((X == 0) | (X == 1), axis=0)).astype(np.int8),
            "overflow": (~ok).astype(np.int8),
        }, state

    def server_step(self, server_state, replies, round):
        s = dict(server_state)
        if not replies:  # every client failed: the caller names the first failure
            return s, {}
        sums = {k: np.array(v) for k, v in replies.sums.items()}
        if s["sums"] is not None:
            s["squares"] = sums
            return s, {}
        s["sums"] = sums
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            mean = np.r_[sums["sum_x"], sums["sum_y"]] / sums["n"][0]
        mean = np.where(np.isfinite(mean), mean, 0.0)  # an overflowed column is named after round 1
        s["mean_x"], s["mean_y"] = mean[:-1], mean[-1:]
        return s, {}


def overflow_message(columns: list[str], clients: int | None = None) -> str:
    """Why columns (their names quoted) whose sums of squares overflow float64 are refused."""
    at = f" at {clients} client(s)" if clients else ""
    return (
        f"cannot standardise column(s) {', '.join(columns[:5])} nor fit their coefficients: their values "
        f"are too large for a sum of squares in float64 (overflow{at}); rescale them (e.g. to thousands) "
        "or check for a sentinel value such as 1e308"
    )


def federated_scaling(data, fit_intercept: bool, *, seed: int = 0) -> LinearScaling:
    """The :class:`LinearScaling` of ``data`` from two counted rounds of sums over the clients
    (:class:`_Moments`)."""
    out = run(_Moments(), data, rounds=2, seed=seed, progress=False, batched=False, kind="federated scaling")
    raise_failures(out.history, "the federated scaling rounds")
    first, second = out.server_state["sums"], out.server_state["squares"]
    with np.errstate(over="ignore", invalid="ignore"):
        agg = aggregate_moments(
            [
                {
                    "n": int(first["n"][0]),
                    "sum_x": first["sum_x"],
                    "m2_x": second["sum_x"],
                    "sum_y": float(first["sum_y"][0]),
                    "m2_y": float(second["sum_y"][0]),
                }
            ]
        )
    x_mean, x_sd = agg["mean_x"], agg["sd_x"]
    y_means, y_sds = np.atleast_1d(agg["mean_y"]), np.atleast_1d(agg["sd_y"])
    flagged = (first["overflow"] + second["overflow"]) > 0
    flagged |= ~np.isfinite(np.r_[x_mean, y_means]) | ~np.isfinite(np.r_[x_sd, y_sds])
    names = [*map(repr, data.feature_names), f"{data.target_name or 'y'!r} (the target)"]
    bad = [n for n, f in zip(names, flagged) if f]
    if bad:
        raise ValueError(overflow_message(bad))
    binary = first["not_binary"] == 0  # 0/1 at every client
    keep = binary | ~(x_sd > 0) | ~np.isfinite(x_sd)  # 0/1 dummies and constant columns keep their coding
    x_mean = np.where(keep, 0.0, x_mean)
    x_sd = np.where(keep, 1.0, x_sd)
    y_sd = float(y_sds[0]) if np.isfinite(y_sds[0]) and y_sds[0] > 0 else 1.0
    y_mean = float(y_means[0])
    if not fit_intercept:  # nothing to absorb a shift: scale only
        x_mean, y_mean = np.zeros_like(x_mean), 0.0
    return LinearScaling(
        x_mean=x_mean, x_sd=x_sd, y_mean=y_mean, y_sd=y_sd, binary=binary, fit_intercept=bool(fit_intercept)
    )
