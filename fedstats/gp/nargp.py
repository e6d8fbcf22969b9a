"""Nonlinear autoregressive multi-fidelity GPs (NARGP; Perdikaris, Raissi, Damianou, Lawrence and
Karniadakis, "Nonlinear information fusion algorithms for data-efficient multi-fidelity
modelling", Proc. R. Soc. A 2017), centralised (:class:`NARGP`) and with one level per client
(:class:`FederatedNARGP`).

Level 1 is an exact GP on its own data. Level t > 1 is an exact GP on the augmented input
``(x, f_{t-1}(x))``: the lower level's prediction enters as an extra input, so the link between
levels can be any smooth function, where AR1 allows only ``rho f_{t-1}(x) + delta(x)``. The
kernel is a simplification of the paper's ``k_rho(x, x') k_f(f, f') + k_delta(x, x')``: one ARD
kernel on ``(x, f)`` (a lengthscale for each column of x and one for the lower level's value),
which is the paper's product term without the additive ``k_delta``. Each level's targets are
standardised by their own mean and sd.

Training: level t's extra input at its design points is the lower level's predictive mean there.
Prediction: uncertainty is propagated by sampling. Level 1's predictive normal at the query
points is drawn ``samples`` times; each draw is a path, and level t, given a path's draw of
``f_{t-1}`` at the queries, has a normal predictive ``(m_t, v_t)`` along it, from which the path
draws ``f_t`` for the level above. The highest level's prediction is the mixture over paths:
mean ``mean_s m_s``, variance ``mean_s v_s + var_s m_s``. Level t's standard normals come from
its own stream (``[seed, NARGP_DRAWS, t]``), so the federated model, which draws on each
level's client, gives the centralised answer given the same hyperparameters.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..data import FederatedData
from ._core import HyperSpec, band_frame, fit_mle, posterior
from .fgpr_algorithm import standardise
from .multifidelity import chain_order

__all__ = ["NARGP", "FederatedNARGP"]

#: the stream tag of a level's standard normals (``[seed, NARGP_DRAWS, level]``)
NARGP_DRAWS = 0x4E41

Paths = tuple[np.ndarray, np.ndarray]  # means and variances, (paths, points) each


class _Level:
    """One fidelity level: its data, its GP and how it answers a query. In :class:`NARGP` the
    levels sit together; in :class:`FederatedNARGP` each is a client, and its outputs and
    hyperparameters never leave it."""

    def __init__(self, X, y, t: int, kernel: str, restarts: int, seed: int):
        self.X = np.asarray(X, dtype=float)
        self.X = self.X[:, None] if self.X.ndim == 1 else self.X
        self.y, self.mu, self.sd = standardise(np.asarray(y, dtype=float))
        self.t, self.kernel, self.restarts, self.seed = t, kernel, restarts, seed
        self.spec = HyperSpec(d=self.X.shape[1] + (t > 0), kernel=kernel, ard=True)

    def inputs(self, Xq: np.ndarray, lower: Paths | None, samples: int, seed: int) -> np.ndarray:
        """The GP's inputs at the queries: ``Xq`` itself at level 1; above, ``Xq`` with one draw
        of the lower level per path appended (``(paths * n, d + 1)``, path by path)."""
        if lower is None:
            return Xq
        M, V = lower
        # point i's draws are the i-th block of ``samples`` normals of the stream: the same for
        # a point whatever follows it in the batch
        eps = np.random.default_rng([seed, NARGP_DRAWS, self.t]).standard_normal((len(Xq), samples)).T
        f = M + np.sqrt(np.maximum(V, 0.0)) * eps  # (samples, n): one path per row
        return np.column_stack([np.tile(Xq, (samples, 1)), f.reshape(-1)])

    def fit(self, lower_mean: np.ndarray | None) -> None:
        Z = self.X if lower_mean is None else np.column_stack([self.X, lower_mean])
        self.Z = Z
        self.hyper, _, _ = fit_mle(self.spec, Z, self.y, restarts=self.restarts, seed=self.seed)

    def answer(self, Xq: np.ndarray, lower: Paths | None, samples: int, seed: int) -> Paths:
        """This level's predictive means and variances along each path, ``(paths, n)`` each (one
        path at level 1, whose predictive is exact)."""
        Zq = self.inputs(Xq, lower, samples, seed)
        m, v = posterior(self.spec, self.hyper, self.Z, self.y, Zq, device=torch.device("cpu"), dtype=torch.float64)
        return m.reshape(-1, len(Xq)), v.reshape(-1, len(Xq))


def mixture(paths: Paths) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the mixture over paths: ``mean_s m_s``, ``mean_s v_s + var_s m_s``."""
    M, V = paths
    return M.mean(0), V.mean(0) + M.var(0)


class NARGP:
    """NARGP (see the module's docs), centralised: every level's data in one place.

    Parameters
    ----------
    kernel : "rbf" or "matern"
        Each level's ARD kernel family (Matern-3/2 for "matern").
    restarts : int
        Random restarts of each level's maximum-likelihood fit (L-BFGS, the best kept).
    samples : int
        Paths drawn to propagate the lower levels' uncertainty (the paper uses 100 or more).
    """

    def __init__(self, *, kernel: str = "rbf", restarts: int = 5, samples: int = 200):
        self.kernel, self.restarts, self.samples = _options(kernel, restarts, samples)

    def fit(self, levels: list[tuple[np.ndarray, np.ndarray]], *, seed: int = 0) -> NARGP:
        """``levels``: ``(X, y)`` per fidelity, lowest first, highest last."""
        if len(levels) < 2:
            raise ValueError("NARGP needs at least two fidelity levels")
        self.seed_, self.levels_ = seed, []
        for t, (X, y) in enumerate(levels):
            level = _Level(X, y, t, self.kernel, self.restarts, seed + t)
            level.fit(None if t == 0 else mixture(self._paths(level.X, t))[0])
            self.levels_.append(level)
        return self

    def _paths(self, Xq: np.ndarray, upto: int) -> Paths:
        """The paths of level ``upto - 1`` at ``Xq``."""
        lower = None
        for level in self.levels_[:upto]:
            lower = level.answer(Xq, lower, self.samples, self.seed_)
        assert lower is not None
        return lower

    def predict(self, X, *, level: float = 0.95, scale: str = "standardized") -> pd.DataFrame:
        """Highest-fidelity prediction: mean, sd of f and the credible band (a normal with the
        mixture's mean and variance); ``scale`` ``"standardized"`` (the highest level's training
        scale) or ``"original"``."""
        Xs = _queries(X, self.levels_[0].X.shape[1])
        mean, var = mixture(self._paths(Xs, len(self.levels_)))
        top = self.levels_[-1]
        if scale == "original":
            mean, var = top.mu + top.sd * mean, var * top.sd**2
        return band_frame(mean, var, level)


class FederatedNARGP:
    """NARGP with one fidelity level per client, as :class:`~.multifidelity.FederatedAR1` is
    for AR1: each client keeps its outputs and its GP. To fit level t, its client sends its
    design points down the chain; level 1 answers with its predictive means and variances
    there, each level above draws its paths from what comes up and answers with its own means
    and variances along them, and level t takes the mixture mean as its extra input. A
    prediction travels the same chain. Shared: input locations downwards, predictive means and
    variances (per path) upwards; never outputs or hyperparameters. ``messages`` records the
    shape of every array sent and ``communication`` counts the bytes."""

    def __init__(self, *, kernel: str = "rbf", restarts: int = 5, samples: int = 200):
        self.kernel, self.restarts, self.samples = _options(kernel, restarts, samples)

    def fit(self, data: FederatedData, order, *, seed: int = 0) -> FederatedNARGP:
        """``order``: the clients of ``data`` from the lowest fidelity to the highest."""
        self.order_, self.seed_ = chain_order(data, order, "FederatedNARGP"), seed
        self.communication = {"bytes_down": 0, "bytes_up": 0}
        self.messages: list[tuple[str, str, tuple]] = []  # (direction, what, shape)
        self.clients_: list[_Level] = []
        for t, c in enumerate(self.order_):
            level = _Level(data[c].X, data[c].y, t, self.kernel, self.restarts, seed + t)
            level.fit(None if t == 0 else mixture(self._chain(level.X, t))[0])
            self.clients_.append(level)
        return self

    def _send(self, direction: str, what: str, a: np.ndarray) -> None:
        self.messages.append((direction, what, a.shape))
        self.communication["bytes_down" if direction == "down" else "bytes_up"] += a.nbytes

    def _chain(self, Xq: np.ndarray, upto: int) -> Paths:
        """The paths of level ``upto - 1`` at ``Xq``, level by level (inputs down, moments up)."""
        lower = None
        for client in self.clients_[:upto]:
            self._send("down", "queries", Xq)
            if lower is not None:
                for a in lower:
                    self._send("down", "moments from below", a)
            lower = client.answer(Xq, lower, self.samples, self.seed_)
            for a in lower:
                self._send("up", "moments", a)
        assert lower is not None
        return lower

    def predict(self, X, *, level: float = 0.95, scale: str = "standardized") -> pd.DataFrame:
        """Highest-fidelity prediction (same columns and scales as :meth:`NARGP.predict`); the
        highest level asks, and computes its own term and the mixture locally."""
        Xs = _queries(X, self.clients_[0].X.shape[1])
        top = self.clients_[-1]
        mean, var = mixture(top.answer(Xs, self._chain(Xs, len(self.clients_) - 1), self.samples, self.seed_))
        if scale == "original":
            mean, var = top.mu + top.sd * mean, var * top.sd**2
        return band_frame(mean, var, level)


def _options(kernel: str, restarts: int, samples: int) -> tuple[str, int, int]:
    if int(samples) < 2:
        raise ValueError(f"samples must be at least 2, got {samples!r}")
    return kernel, int(restarts), int(samples)


def _queries(X, d: int) -> np.ndarray:
    Xs = np.asarray(X, dtype=float)
    Xs = Xs[:, None] if Xs.ndim == 1 else Xs
    if Xs.ndim != 2 or Xs.shape[1] != d or not np.all(np.isfinite(Xs)):
        raise ValueError(f"X must be finite with {d} column(s), got shape {np.shape(Xs)}")
    return Xs
