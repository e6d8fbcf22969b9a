"""Scale-aware fitting of the Bayesian linear models: fit on standardised data, report on the
data's own scale.

The models' default priors (``N(0, 1)`` on coefficient means, log-normal on scales) suit
data of unit scale; on data in natural units (dollars, kelvin, counts in thousands) they pin
the intercept near 0 and the slopes absorb the difference. With ``standardize=True`` (the
default) a model first learns the federated mean and sd of every predictor and of the target
in one counted round (each client sends its row count, sums and sums of squared deviations,
and whether each column holds only 0 and 1: never a row), fits with

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

from ..data import aggregate_moments, client_moments
from ..federation import run
from ..federation.oneshot import OneShot, raise_failures
from ..results import register

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


class _Moments(OneShot):
    """One round: every client sends :func:`~fedstats.data.client_moments` of its rows (count,
    sums, sums of squared deviations about its own mean), whether each column holds only 0
    and 1, and which sums overflowed (sent as 0, for the server to name)."""

    def __init__(self):
        super().__init__(("n", "sum_x", "m2_x", "sum_y", "m2_y", "binary", "overflow"), {}, None)

    def client_step(self, message, state, data, rng):
        X = np.asarray(data.X, dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):
            m = client_moments(X, np.asarray(data.y, dtype=float))
        parts = {k: np.atleast_1d(np.asarray(m[k], dtype=float)) for k in ("sum_x", "m2_x", "sum_y", "m2_y")}
        overflow = ~(
            np.isfinite(np.r_[parts["sum_x"], parts["sum_y"]]) & np.isfinite(np.r_[parts["m2_x"], parts["m2_y"]])
        )
        reply = {k: np.where(np.isfinite(v), v, 0.0) for k, v in parts.items()}
        reply.update(
            n=np.array([m["n"]], float),
            binary=np.all((X == 0) | (X == 1), axis=0).astype(np.int8),
            overflow=overflow.astype(np.int8),
        )
        return reply, state


def federated_scaling(data, fit_intercept: bool, *, seed: int = 0) -> LinearScaling:
    """The :class:`LinearScaling` of ``data`` from one counted round of per-client sums."""
    out = run(_Moments(), data, rounds=1, seed=seed, progress=False, batched=False, kind="federated scaling")
    raise_failures(out.history, "the federated scaling round")
    reps = [out.server_state[c] for c in data.clients]
    with np.errstate(over="ignore", invalid="ignore"):
        agg = aggregate_moments(
            [
                {
                    "n": int(r["n"][0]),
                    "sum_x": r["sum_x"],
                    "m2_x": r["m2_x"],
                    "sum_y": float(r["sum_y"][0]),
                    "m2_y": float(r["m2_y"][0]),
                }
                for r in reps
            ]
        )
    x_mean, x_sd = agg["mean_x"], agg["sd_x"]
    y_means, y_sds = np.atleast_1d(agg["mean_y"]), np.atleast_1d(agg["sd_y"])
    flagged = np.any(np.stack([r["overflow"] for r in reps]), axis=0)
    flagged |= ~np.isfinite(np.r_[x_mean, y_means]) | ~np.isfinite(np.r_[x_sd, y_sds])
    names = [*map(repr, data.feature_names), f"{data.target_name or 'y'!r} (the target)"]
    bad = [n for n, f in zip(names, flagged) if f]
    if bad:
        raise ValueError(
            f"cannot standardise column(s) {', '.join(bad[:5])}: their values are too large "
            "for a sum of squares in float64 (overflow); rescale them (e.g. to thousands) or check "
            "for a sentinel value such as 1e308"
        )
    binary = np.all(np.stack([r["binary"] for r in reps]), axis=0).astype(bool)
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
