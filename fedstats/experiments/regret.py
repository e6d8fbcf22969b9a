"""Streams of federated mixtures and the regret of online learners (the synthetic experiment of
Section 4.4.5.1 of Marfoq's thesis, with the regret measured as described below).

* :class:`MixtureStream`: the thesis's synthetic environment. Components ``N(mu*_j, I_d)``
  with ``mu*_j ~ N(0, s I_d)``, fixed; client weights ``pi*_{t,c}`` from Dirichlet(alpha),
  redrawn every step (``"iid"``), drawn once per client (``"fixed"``), redrawn every
  ``period`` steps (``"switching"``), or chosen against the learner (``"adversarial"``: most
  mass on the component the client's played weights neglect most). Step ``t``'s draws come
  from the seed and ``t`` only, so several learners can face the very same data.
* :class:`RegretTracker`: per client and step the cross-entropy of the played mixture on an
  evaluation sample from the true ``P_{t,c}`` (independent of the learner's data); the
  comparator of a prefix ``t`` is the best *fixed* weight vector in hindsight with the true
  components, found by EM on the weights **restarted from uniform for every prefix**, on the
  same evaluation points (common random numbers). ``R_{t,c}`` = played minus comparator.
* :func:`growth`: the log-log slope of the client-averaged regret over the second half of the
  grid and whether ``R_t / t`` decreases: sub-linear or linear.
* :func:`simulate`: runs learners side by side on one stream and returns their regret curves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from ..data import FederatedData
from ..data.disclosure import NO_RULES
from ..mixture.gmm import LOG_2PI

PROCESSES = ("iid", "fixed", "switching", "adversarial")


class MixtureStream:
    """The synthetic environment of section 4.4.5.1 of Marfoq's thesis.

    Parameters
    ----------
    n_clients, n, d, n_components : int
        ``C`` clients, ``n`` rows per client and step, dimension ``d``, ``m`` components.
    spread : float, default 5.0
        ``s``: the variance of the centre prior ``mu*_j ~ N(0, s I_d)``.
    alpha : float, default 0.1
        Dirichlet concentration of the weights.
    process : {"iid", "fixed", "switching", "adversarial"}, default "iid"
    period : int, default 50
        Steps between redraws for ``"switching"``.
    adversary_mass : float, default 0.9
        ``"adversarial"``: the mass put on the component the played weights neglect most
        (the rest spread uniformly).
    seed : int
    """

    def __init__(
        self,
        *,
        n_clients=50,
        n=30,
        d=10,
        n_components=5,
        spread=5.0,
        alpha=0.1,
        process="iid",
        period=50,
        adversary_mass=0.9,
        seed=0,
    ):
        if process not in PROCESSES:
            raise ValueError(f"process must be one of {PROCESSES}, got {process!r}")
        for name, v in (
            ("n_clients", n_clients),
            ("n", n),
            ("d", d),
            ("n_components", n_components),
            ("period", period),
        ):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not spread > 0 or not alpha > 0 or not 0 < adversary_mass <= 1:
            raise ValueError("spread and alpha must be > 0 and adversary_mass in (0, 1]")
        self.C, self.n, self.d, self.m = int(n_clients), int(n), int(d), int(n_components)
        self.spread, self.alpha, self.process, self.period = float(spread), float(alpha), process, int(period)
        self.adversary_mass = float(adversary_mass)
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 0])
        self.means = rng.normal(0.0, math.sqrt(self.spread), (self.m, self.d))
        self._fixed = rng.dirichlet(np.full(self.m, self.alpha), self.C)
        self.clients = list(range(self.C))

    @property
    def min_separation(self) -> float:
        D = np.linalg.norm(self.means[:, None] - self.means[None], axis=-1)
        return float(D[np.triu_indices(self.m, 1)].min()) if self.m > 1 else float("inf")

    def _rng(self, t, stream):
        return np.random.default_rng([self.seed, int(t), stream])

    def weights(self, t: int, played: Mapping | None = None) -> np.ndarray:
        """True weights ``pi*_{t,c}`` (C, m) at step ``t`` (``played``: client -> weights,
        needed by the adversarial process)."""
        if self.process == "fixed":
            return self._fixed
        if self.process == "iid":
            return self._rng(t, 1).dirichlet(np.full(self.m, self.alpha), self.C)
        if self.process == "switching":
            block = (int(t) - 1) // self.period
            return self._fixed if block == 0 else self._rng(block, 2).dirichlet(np.full(self.m, self.alpha), self.C)
        if played is None:
            raise ValueError("the adversarial process needs the played weights: weights(t, played={client: pi})")
        W = np.full((self.C, self.m), (1 - self.adversary_mass) / max(self.m - 1, 1))
        for c in self.clients:
            W[c, int(np.argmin(np.asarray(played[c])))] = self.adversary_mass
        return W / W.sum(1, keepdims=True)

    def _draw(self, W, size, rng):
        out = []
        for c in self.clients:
            z = rng.choice(self.m, size=size, p=W[c])
            out.append(self.means[z] + rng.standard_normal((size, self.d)))
        return out

    def batch(self, t: int, played: Mapping | None = None) -> FederatedData:
        """Step ``t``'s rows: ``n`` per client from ``sum_j pi*_{t,c,j} N(mu*_j, I)``."""
        Xs = self._draw(self.weights(t, played), self.n, self._rng(t, 3))
        return FederatedData.from_arrays(Xs, feature_names=[f"x{i + 1}" for i in range(self.d)], **NO_RULES)

    def evaluation(self, t: int, n_eval: int, played: Mapping | None = None) -> list[np.ndarray]:
        """An independent evaluation sample per client from the same ``P_{t,c}``."""
        return self._draw(self.weights(t, played), n_eval, self._rng(t, 4))


def _log_dens_identity(X, means):
    """``log N(x; mu_j, I)`` (n, m)."""
    d = X.shape[1]
    D2 = np.sum(X**2, 1)[:, None] - 2 * X @ means.T + np.sum(means**2, 1)[None]
    return -0.5 * (np.maximum(D2, 0.0) + d * LOG_2PI)


def weights_em(log_f: np.ndarray, tol: float = 1e-9, max_iter: int = 500) -> tuple[np.ndarray, float]:
    """``max_pi mean_i log sum_j pi_j f_ij`` by EM on the weights from uniform.

    ``log_f`` (N, m). Returns ``(pi, mean log-likelihood)``; stops when the mean
    log-likelihood changes by less than ``tol``.
    """
    m = log_f.shape[1]
    shift = log_f.max(1, keepdims=True)
    F = np.exp(log_f - shift)  # f_ij / max_j f_ij: one exponential per entry, once
    base = float(shift.mean())
    pi = np.full(m, 1.0 / m)
    prev = -np.inf
    for _ in range(max_iter):
        s = F @ pi
        cur = float(np.mean(np.log(s))) + base
        if cur - prev < tol:
            break
        prev = cur
        pi = pi * (F.T @ (1.0 / s)) / F.shape[0]
        pi /= pi.sum()
    return pi, cur


class RegretTracker:
    """Per-client regret of one or more learners against the best fixed weights in hindsight.

    Call :meth:`record` once per step with the evaluation samples and what each learner
    played; then :meth:`curve` gives ``R_t`` on a grid of prefixes.

    Parameters
    ----------
    true_means : (m, d)
        The true components (unit covariances): the comparator's components.
    n_eval : int, default 100
        Evaluation points per client and step.
    """

    def __init__(self, true_means, *, n_eval: int = 100, tol: float = 1e-9, max_iter: int = 500):
        self.true_means = np.asarray(true_means, float)
        self.n_eval = int(n_eval)
        self.tol, self.max_iter = tol, max_iter
        self._logf: list[list[np.ndarray]] = []  # per step, per client: (n_eval, m) at the true means
        self._ce: dict[str, list[np.ndarray]] = {}  # learner -> per step (C,) cross-entropies
        self._comparator: dict[int, np.ndarray] = {}

    @property
    def steps(self) -> int:
        return len(self._logf)

    def record(self, eval_samples, played: Mapping[str, Callable]):
        """One step: ``eval_samples`` (per client, (n_eval, d)); ``played``: learner name ->
        ``f(client) -> (means, weights)`` (identity covariances) or ``(means, cov, weights)``
        with a covariance type the learner knows (see :func:`played_log_density`)."""
        bad = [c for c, E in enumerate(eval_samples) if len(E) != self.n_eval]
        if bad:  # the comparator pools the points: every step must weigh the same
            raise ValueError(f"every evaluation sample must have n_eval={self.n_eval} rows (client(s) {bad[:5]})")
        self._logf.append([_log_dens_identity(E, self.true_means) for E in eval_samples])
        for name, fn in played.items():
            ce = np.array([-np.mean(played_log_density(fn(c), E)) for c, E in enumerate(eval_samples)])
            self._ce.setdefault(name, []).append(ce)

    def comparator(self, t: int) -> np.ndarray:
        """Per client: ``min_pi sum_{s<=t} CE_{s,c}(pi; mu*)`` (EM restarted from uniform)."""
        if t not in self._comparator:
            C = len(self._logf[0])
            out = np.empty(C)
            for c in range(C):
                L = np.concatenate([self._logf[s][c] for s in range(t)])
                _, ll = weights_em(L, self.tol, self.max_iter)
                out[c] = -ll * t  # mean over t * n_eval points, times t steps
            self._comparator[t] = out
        return self._comparator[t]

    def grid(self, points: int = 16) -> np.ndarray:
        T = self.steps
        return np.unique(np.round(np.geomspace(1, T, points)).astype(int))

    def curve(self, name: str, grid=None, clients=None) -> pd.DataFrame:
        """``t``, client-averaged regret ``R_t``, ``R_t / t``, and the spread over clients
        (``clients``: positions of the clients to average, default all)."""
        grid = self.grid() if grid is None else np.asarray(grid, int)
        ce = np.cumsum(np.stack(self._ce[name]), axis=0)  # (T, C)
        sel = slice(None) if clients is None else np.asarray(clients)
        rows = []
        for t in grid:
            R = (ce[t - 1] - self.comparator(int(t)))[sel]
            rows.append(
                {
                    "t": int(t),
                    "regret": float(R.mean()),
                    "regret_per_step": float(R.mean() / t),
                    "regret_sd": float(R.std(ddof=1)) if len(R) > 1 else 0.0,
                    "min_client": float(R.min()),
                }
            )
        return pd.DataFrame(rows)

    def played_loss(self, name: str) -> np.ndarray:
        """Cross-entropy of the played mixture per step and client (T, C)."""
        return np.stack(self._ce[name])


def played_log_density(played, E):
    """Log-density of rows ``E`` under a played mixture ``(means, weights)`` (unit
    covariances) or ``(means, covariances, weights, covariance_type)``."""
    if len(played) == 2:
        means, w = played
        ld = _log_dens_identity(E, np.asarray(means))
    else:
        from ..mixture.gmm import log_gaussian, precision_cholesky

        means, cov, w, ct = played
        g = means.mean(0)
        ld = log_gaussian(E - g, means - g, precision_cholesky(cov, ct), ct)
    return logsumexp(ld + np.log(np.maximum(w, 1e-300)), axis=1)


def growth(curve: pd.DataFrame) -> dict:
    """Classify the growth of a regret curve as sub-linear or linear.

    ``slope``: least-squares slope of ``log R_t`` on ``log t`` over the second half of the
    grid (points with ``R_t <= 0`` left out; NaN if fewer than two remain); ``ratio_decreasing``: ``R_T / T < R_{T/2} / (T/2)`` (the grid point nearest
    ``T/2``); ``sublinear``: slope < 0.9 and the ratio decreasing.
    """
    t = curve["t"].to_numpy(float)
    R = curve["regret"].to_numpy(float)
    half = np.arange(len(t)) >= len(t) // 2  # the second half of the (log-spaced) grid
    half &= R > 0
    slope = float(np.polyfit(np.log(t[half]), np.log(R[half]), 1)[0]) if half.sum() >= 2 else float("nan")
    mid = int(np.argmin(np.abs(t - t[-1] / 2)))
    ratio_end, ratio_mid = R[-1] / t[-1], R[mid] / t[mid]
    return {
        "slope": slope,
        "regret_T": float(R[-1]),
        "ratio_T": float(ratio_end),
        "ratio_mid": float(ratio_mid),
        "ratio_decreasing": bool(ratio_end < ratio_mid),
        "sublinear": bool(slope < 0.9 and ratio_end < ratio_mid),
    }


def simulate(
    stream: MixtureStream,
    learners: Mapping,
    T: int,
    *,
    n_eval: int = 100,
    grid_points: int = 16,
    progress: bool | None = None,
    seed: int = 0,
):
    """Run ``learners`` (name -> an object with ``played(client)`` and ``partial_fit(batch)``,
    e.g. :class:`~fedstats.mixture.FEMOMD`) on the same stream for ``T`` steps; learners whose
    ``partial_fit`` takes a ``seed`` get ``seed`` at every step.

    At every step each learner first plays, the evaluator charges the loss on a fresh
    evaluation sample, then the learner receives the batch. Returns ``(curves, tracker)``:
    a long DataFrame (``learner``, ``t``, ``regret``, ...) and the :class:`RegretTracker`.
    The adversarial process reacts to the first learner's played weights.
    """
    import inspect

    from tqdm import tqdm

    tracker = RegretTracker(stream.means, n_eval=n_eval)
    names = list(learners)
    takes_seed = ["seed" in inspect.signature(L.partial_fit).parameters for L in learners.values()]
    for t in tqdm(range(1, T + 1), disable=progress is False or (progress is None and not _tty()), desc="steps"):
        played_w = None
        if stream.process == "adversarial":
            first = learners[names[0]]
            played_w = {c: first.played(c)[2] for c in stream.clients}
        evals = stream.evaluation(t, n_eval, played_w)
        tracker.record(evals, {name: (lambda c, L=L: _played(L, c)) for name, L in learners.items()})
        batch = stream.batch(t, played_w)
        for L, seeded in zip(learners.values(), takes_seed):
            L.partial_fit(batch, seed=seed) if seeded else L.partial_fit(batch)
    grid = tracker.grid(grid_points)
    curves = pd.concat([tracker.curve(name, grid).assign(learner=name) for name in names], ignore_index=True)
    return curves, tracker


def _played(learner, client):
    """A learner's played mixture for the tracker: (means, weights) for identity covariances."""
    means, cov, w = learner.played(client)
    if getattr(learner, "covariance_type", "identity") == "identity":
        return means, w
    return means, cov, w, learner.covariance_type


def _tty() -> bool:
    import sys

    return sys.stderr.isatty()
