"""FEM-OMD: online federated Gaussian mixtures with drifting client weights (Section 4.4 of
Marfoq's thesis, "Tackling heterogeneity in federated learning systems").

At every time step ``t`` each client *plays* the shared components ``mu_t`` (and covariances)
with its own weights ``pi_{t,c}``, then receives a batch ``X_{t,c}`` of ``n`` rows. One step
(Algorithm 15 of Marfoq's thesis, section 4.4) is one run of ``K + 1`` federated rounds:

* rounds ``0..K-1`` (inner federated EM): the server broadcasts ``mu~``; each client runs an
  E-step on its batch (or on the k-th of ``K`` splits) with its inner weights ``pi~_c``
  (reset to uniform, or to the played weights, at the start of the step), sets
  ``pi~_c = N_c / n_c`` and replies with the summed statistics ``N_c, S1_c`` (and ``S2_c``
  when covariances are learned); the server does the closed-form M-step. With equal batch
  sizes this is the thesis's ``pi~``-weighted synchronisation; it stays right when they differ.
* the server then plays the running average ``mu_{t+1} = (t mu_t + mu~) / (t + 1)``;
* round ``K`` (mirror descent): the server broadcasts ``mu_{t+1}``; each client draws ``n_mc``
  points ``Z ~ sum_r pi~_cr N(mu_{t+1,r}, Sigma_r)`` (or uses its batch,
  ``grad_source="empirical"``), estimates the gradient of the KL cost at its played weights,
  ``g_j = -mean_s f_j(Z_s) / sum_l pi_l f_l(Z_s)`` (so ``sum_j pi_j g_j = -1`` exactly), and
  updates ``pi_{t+1} = softmax(log pi_t - eta_t g)`` (exponentiated gradient), optionally
  mixed with the uniform vector (``weight_floor``). Nothing is sent back in this round
  (with ``shared_weights``, ``(n_c g_c, n_c)`` goes up and the server makes the step).

A client's weights themselves never leave it, but, as in FedEM, its soft counts do, and
``N_c / n_c`` is its inner weight estimate of the step; so every reply array is declared
summed: the server uses only their totals, which secure aggregation can hide (with
``pooling="local"`` the statistics stay per client: each client's components are its own).
By default ``eta_t`` is adaptive, per client: ``sqrt(log m / sum_{s<=t} r_s^2)`` with
``r_s = max_j g_sj - min_j g_sj`` (the scale-free step of exponentiated gradient; it is
``sqrt(log m / t)`` when every range is 1), and the floor is ``min(eta_t, 1) / (t + 1)`` (see
:class:`FEMOMD` for why); ``eta=None`` gives the thesis's schedule ``sqrt(log m / T)`` (known
horizon ``T``) or ``sqrt(log m / t)``.

Each client also keeps a discounted Dirichlet ``a_{t+1} = lambda a_t + (1 - lambda) alpha_0 +
N_t`` (``N_t``: its soft counts of the batch under the new components and its inner weights),
whose Beta marginals are credible intervals for its *current* weights (not in the thesis).

Two baselines for experiments use the same machinery: ``pooling="local"`` (every client
estimates its own components from its own statistics only: local online EM with the same
mirror-descent weights) and ``shared_weights=True`` (one weight vector for all clients, a
global online mixture).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats

from .. import streams
from ..data import DataError, DataLike
from ..data.disclosure import check_disclosure
from ..estimator import BOOL, NONE, Estimator, Int, OneOf, Real
from ..federation import Communication, counting, run
from ..federation.backend import accepts_backend
from ..federation.oneshot import raise_failures
from ..result_file import MAX_ARRAY_BYTES, load_result, register, save_result
from ._common import as_federated
from .gmm import cov_shape, precision_cholesky
from .result import GaussianMixtureResult

COV_TYPES_ONLINE = ("identity", "full", "tied", "diag", "spherical")
from .omd import adaptive_eta, floor_at, step_size
from .online_step import FEMOMDStep, new_client_state, prior_concentration

__all__ = ["FEMOMD"]


# ------------------------------------------------------------------ the model
@register
class FEMOMD(Estimator):
    """Online federated Gaussian mixture: FEM-OMD (Algorithm 15 of Marfoq's thesis, section 4.4).

    The parameters are stored as given and checked at the first ``partial_fit`` (or
    ``played``); the seed is an argument of :meth:`partial_fit`: all randomness of step ``t``
    derives from ``(seed, t)``.

    Parameters
    ----------
    n_components : int
        Number of components ``m``.
    covariance_type : {"identity", "full", "tied", "diag", "spherical"}, default "identity"
        ``"identity"``: unit covariances, only the means are learned (the thesis's case, the
        one the regret analysis covers). The others learn covariances with the FedEM M-step
        in the inner loop and play their running average too (an extension, no guarantee).
    inner_rounds : int, default 5
        Inner federated EM rounds ``K`` per time step.
    eta : "adaptive", None or float, default "adaptive"
        Mirror-descent step. ``"adaptive"``: per client, ``eta_t = sqrt(log m / sum_{s<=t}
        r_s^2)`` with ``r_s = max_j g_sj - min_j g_sj`` the range of its gradient at step ``s``
        (the scale-free, AdaGrad step of exponentiated gradient; the server's, from the pooled
        gradient, with ``shared_weights``). It equals the anytime ``sqrt(log m / t)`` while the
        ranges are 1, needs no horizon, and keeps ``eta_t r_t <= sqrt(log m)``: no single step
        moves a weight ratio by more than ``exp(sqrt(log m))``. ``None``: the thesis's
        ``sqrt(log m / horizon)`` if ``horizon`` is given, else ``sqrt(log m / t)``; a float: a
        constant step.
    horizon : int, optional
        The number of time steps ``T``, when known (used by ``eta=None`` only).
    weight_floor : "auto" or float in [0, 1), default "auto"
        Mix the new weights with the uniform vector: ``(1 - floor) pi + floor / m``.
        ``"auto"``: ``min(eta_t, 1) / (t + 1)`` at step ``t`` (per client with the adaptive
        step), so that a weight the gradients push down settles near ``1 / (m (t + 1))`` and
        the mixing adds of the order of ``log(T + 1)`` nats over ``T`` steps (see Notes). 0 is
        the thesis.
    sample_splitting : bool, default False
        Inner round ``k`` uses only the k-th of ``K`` equal parts of the batch (needs
        ``n >= K``; required by the proof, worse for small ``n``).
    inner_init : {"uniform", "played"}, default "uniform"
        Start of the inner weights ``pi~`` at every step.
    grad_source : {"model", "empirical"}, default "model"
        Monte-Carlo draws from the fitted mixture (the thesis) or the batch itself.
    n_mc : int, optional
        Monte-Carlo draws per client and step (default: the client's batch size).
    discount, concentration_prior : float
        Forgetting factor ``lambda`` (default 0.9) and prior ``alpha_0`` (default ``1/m``,
        scikit-learn's choice; it lets sparse weights near 0 be covered) of the discounted
        Dirichlet behind :meth:`weight_intervals`.
    means_init, covariances_init : optional
        Components played at the first step (the thesis form: the running average counts
        them as one estimate). Without ``means_init`` the first batch initialises them
        (federated k-means, as :class:`FederatedGaussianMixture`) before that step runs, and
        the running average starts from the first step's estimate (the data-free start is not
        averaged in); nothing can be
        played before that first batch.
    pooling : {"federated", "local"}, default "federated"
        ``"local"``: the local-only baseline, each client learns its own components from
        its own statistics (the simulator's server keeps one copy per client).
    shared_weights : bool, default False
        One weight vector for all clients (the global baseline): the server adds the
        clients' gradients (weighted by batch size) and makes the mirror-descent step.
    reg_covar : float, default 1e-6
        For learned covariances.

    Notes
    -----
    The defaults ``eta="adaptive"``, ``weight_floor="auto"`` come from the sweep in
    ``benchmarks/fem_omd_defaults.py`` (results in ``benchmarks/results/fem_omd_defaults.md``:
    C = 50, n = 30, d = 10, m = 5, T = 500; fixed, iid, switching and adversarial weights;
    starts ``stream.means + 0.3`` and ``+ 1.0``; 3 seeds). The thesis's step with no floor (the
    old defaults) diverges: a client's weight of a component absent from its data shrinks like
    ``exp(-eta t)``, far below the ``1/n`` resolution of one batch; when one point of a batch is
    then attributed to that component, its gradient ``-pi~_j / pi_j`` is in the hundreds, the
    multiplicative step gives it almost all the mass, the weights of the true components
    underflow, their gradients (up to 1e40) throw the mass back and forth and the client never
    recovers: regret 2,932 at T = 500 on the README's stream (slope 2.05), 0 of 6 runs
    sub-linear on fixed and on switching weights, and all 24 runs linear or worse without a
    horizon. A floor of 1e-3 alone fixes the fixed weights with the horizon's step (``R_T`` 23)
    but not without a horizon (the early steps ``sqrt(log m / t)`` overshoot as well: ``R_T``
    2,537 on iid weights), nor the growth within a run against the adversarial process
    (3 of 6 sub-linear). The adaptive step bounds every step's exponent, ``eta_t r_t <=
    sqrt(log m)``, which removes the overshoot at its cause; alone, though, one huge gradient
    inflates ``sum r_s^2`` for good and a client stops adapting (switching weights: 0 of 6).
    The floor keeps weights revivable, and a floor proportional to the step keeps its
    effect constant: under a shrinking step a constant floor ``gamma`` holds ignored weights
    near ``gamma / (m eta_t)``, growing with ``t`` (``R_T`` 19 on fixed weights with
    ``gamma = 1/(T+1)``, against 11 with ``"auto"``). The defaults were sub-linear in all 24
    runs (median ``R_T`` 14.6 iid, 11.3 fixed, 2.3 switching, 23.1 adversarial), and at
    notebook 06's settings (start within sep/16) lower than its options (``eta=None``,
    ``weight_floor=1e-3``): ``R_T`` 7.0 against 18.7 at n = 30, 8.2 against 24.2 at n = 10 and
    16 against 324 at n = 1 (where the thesis's step is linear). Switching weights are tracked
    better by the horizon's constant step with a floor (regret below the comparator, -245).

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.mixture import FEMOMD
    >>> from fedstats.experiments.regret import MixtureStream
    >>> stream = MixtureStream(n_clients=5, n=20, d=2, n_components=2, process="fixed", seed=0)
    >>> model = FEMOMD(2, means_init=stream.means + 0.3, horizon=50)
    >>> for t in range(1, 51):
    ...     _ = model.partial_fit(stream.batch(t))
    >>> bool(np.abs(model.means_ - stream.means).max() < 0.3)
    True
    """

    def __init__(
        self,
        n_components: int,
        *,
        covariance_type: str = "identity",
        inner_rounds: int = 5,
        eta: str | float | None = "adaptive",
        horizon: int | None = None,
        weight_floor: str | float = "auto",
        sample_splitting: bool = False,
        inner_init: str = "uniform",
        grad_source: str = "model",
        n_mc: int | None = None,
        discount: float = 0.9,
        concentration_prior: float | None = None,
        means_init: ArrayLike | None = None,
        covariances_init: ArrayLike | None = None,
        pooling: str = "federated",
        shared_weights: bool = False,
        reg_covar: float = 1e-6,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.inner_rounds = inner_rounds
        self.eta = eta
        self.horizon = horizon
        self.weight_floor = weight_floor
        self.sample_splitting = sample_splitting
        self.inner_init = inner_init
        self.grad_source = grad_source
        self.n_mc = n_mc
        self.discount = discount
        self.concentration_prior = concentration_prior
        self.means_init = means_init
        self.covariances_init = covariances_init
        self.pooling = pooling
        self.shared_weights = shared_weights
        self.reg_covar = reg_covar
        self._reset()

    @property
    def _alpha0(self) -> float:
        """The Dirichlet prior's concentration (``1/m`` by default)."""
        return prior_concentration(self.n_components, self.concentration_prior)

    _constraints = {
        "n_components": Int(1),
        "covariance_type": OneOf(*COV_TYPES_ONLINE),
        "inner_rounds": Int(1),
        "eta": OneOf("adaptive") | NONE | Real(0, closed=(False, True)),
        "horizon": NONE | Int(1),
        "weight_floor": OneOf("auto") | Real(0, 1, closed=(True, False)),
        "sample_splitting": BOOL,
        "inner_init": OneOf("uniform", "played"),
        "grad_source": OneOf("model", "empirical"),
        "n_mc": NONE | Int(1),
        "discount": Real(0, 1, closed=(False, True)),
        "concentration_prior": NONE | Real(0, closed=(False, True)),
        "pooling": OneOf("federated", "local"),
        "shared_weights": BOOL,
        "reg_covar": Real(0),
    }

    def _validate(self) -> None:
        """Check the parameters (when a step or ``played`` first needs them; they are stored as
        given): the declarative constraints, then the combinations."""
        self._validate_params()
        if self.means_init is not None:
            mi = np.asarray(self.means_init, float)
            if mi.ndim != 2 or mi.shape[0] != self.n_components or not np.all(np.isfinite(mi)):
                raise ValueError(f"means_init must be a finite ({self.n_components}, d) array, got shape {mi.shape}")
        if self.covariances_init is not None and self.covariance_type == "identity":
            raise ValueError("covariances_init does not apply to covariance_type='identity' (unit covariances)")
        if self.n_mc is not None and self.grad_source == "empirical":
            raise ValueError("n_mc does not apply to grad_source='empirical' (the batch is the sample)")
        if self.pooling == "local" and self.shared_weights:
            raise ValueError(
                "pooling='local' with shared_weights=True is not a model (local components, global weights)"
            )

    def _reset(self) -> None:
        self._init = "given" if self.means_init is not None else "kmeans"
        self.t_ = 0
        self.history: list[dict[str, Any]] = []
        self.communication: Communication | None = None  # every exchange of every step so far (starts included)
        self._server: dict[str, Any] | None = None
        self._clients: dict = {}
        self.feature_names: list[str] | None = None
        self.n_features_: int | None = None

    # ---------------------------------------------------------------- state
    @property
    def _ct(self):
        return "spherical" if self.covariance_type == "identity" else self.covariance_type

    def _new_client_state(self):
        return new_client_state(self.n_components, self._alpha0)

    def _start(self, data, seed):
        M, d = self.n_components, data.n_features
        self.n_features_, self.feature_names = d, list(data.feature_names)
        if self.means_init is not None:
            means = np.array(self.means_init, dtype=float)
            if means.shape != (M, d):
                raise ValueError(f"means_init must have shape {(M, d)}, got {means.shape}")
        else:
            from ._init import federated_kmeans_init

            means, _, _ = federated_kmeans_init(data, M, self._ct, self.reg_covar, 10, seed)
        if self.covariance_type == "identity":
            cov = np.ones(M)
        elif self.covariances_init is not None:
            cov = np.array(self.covariances_init, dtype=float)
            if cov.shape != cov_shape(self.covariance_type, M, d):
                raise ValueError(f"covariances_init must have shape {cov_shape(self.covariance_type, M, d)}")
            precision_cholesky(cov, self.covariance_type)
        else:
            cov = {
                "full": np.stack([np.eye(d)] * M),
                "tied": np.eye(d),
                "diag": np.ones((M, d)),
                "spherical": np.ones(M),
            }[self.covariance_type]
        # the running average counts the given start as one estimate; a k-means start on the
        # first batch is not averaged in: mu_2 is then the first step's estimate
        self._server = {
            "means": means,
            "cov": cov,
            "log_w": np.full(M, -math.log(M)),
            "index": {},
            "n_avg": 1.0 if self._init == "given" else 0.0,
        }

    def _local_layout(self, clients):
        """pooling='local': one copy of the components per client (new clients copy the start)."""
        st = self._server
        idx = dict(st["index"])
        new = [c for c in clients if c not in idx]
        if not new and st["means"].ndim == 3:
            return
        base_m = st["means"] if st["means"].ndim == 2 else st["init_means"]
        base_c = st["cov"] if st["means"].ndim == 2 else st["init_cov"]
        if st["means"].ndim == 2:
            st["init_means"], st["init_cov"], st["init_n_avg"] = base_m.copy(), base_c.copy(), st["n_avg"]
            st["means"] = np.zeros((0,) + base_m.shape)
            st["cov"] = np.zeros((0,) + base_c.shape)
            st["n_avg"] = np.zeros(0)
        for c in new:
            idx[c] = len(idx)
        st["means"] = np.concatenate([st["means"], np.repeat(base_m[None], len(new), 0)])
        st["cov"] = np.concatenate([st["cov"], np.repeat(base_c[None], len(new), 0)])
        st["n_avg"] = np.r_[st["n_avg"], np.full(len(new), float(st["init_n_avg"]))]  # a late joiner starts afresh
        st["index"] = idx

    @accepts_backend
    def partial_fit(self, data: DataLike, *, seed: int = 0, progress: bool | None = False) -> FEMOMD:
        """Run one time step on the clients' new batches (FederatedData, dict or list of
        arrays; the clients present take part, the others keep their weights). Step ``t``'s
        randomness (the k-means start at the first step, Monte-Carlo gradients, minibatch
        splits) comes from ``seed`` and ``t``: pass the same ``seed`` at every step of a stream."""
        self._validate()
        data = as_federated(data)
        check_disclosure(data, type(self).__name__)  # each batch's: its statistics leave the client
        with counting() as ledger:
            self._step(data, progress, int(seed))
        # (combine skips a part that is None: no step before this one)
        parts = [c for c in (self.communication, ledger.communication()) if c is not None]
        self.communication = Communication.combine(parts)
        return self

    def _step(self, data, progress, seed: int) -> None:
        if self._server is None:
            self._start(data, seed)
        elif data.n_features != self.n_features_:
            raise DataError(f"the model has {self.n_features_} features, the batch {data.n_features}")
        if self.sample_splitting:
            small = [c for c in data.clients if data.n_obs[c] < self.inner_rounds]
            if small:
                raise DataError(
                    f"sample_splitting needs n >= inner_rounds={self.inner_rounds} rows per client; "
                    f"client(s) {small[:5]} have fewer"
                )
        if self.pooling == "local":
            self._local_layout(data.clients)
        t = self.t_ + 1
        if self.horizon is not None and t == self.horizon + 1 and self.eta is None:
            warnings.warn(
                f"step {t} is past horizon={self.horizon}: eta stays sqrt(log m / {self.horizon}); "
                "give the real horizon, or none for the anytime step size",
                RuntimeWarning,
                stacklevel=2,
            )
        adaptive = isinstance(self.eta, str)
        eta = None if adaptive else step_size(t, self.n_components, self.eta, self.horizon)
        server = self._check_fitted()  # _start set it at the first step
        algo = FEMOMDStep(self, server, self._clients, eta, t)
        t0 = time.perf_counter()
        step_seed = streams.seed_of(seed, "online step", t)
        res = run(algo, data, kind="FEM-OMD step", rounds=self.inner_rounds + 1, seed=step_seed, progress=progress)
        raise_failures(res.history, f"FEM-OMD step {t}")  # no client answered: no step
        failed = {c: why for rec in res.history for c, why in rec.failed.items()}
        if failed:  # a client absent from a step keeps its weights (and is asked again next step)
            c, why = next(iter(failed.items()))
            warnings.warn(
                f"FEM-OMD step {t}: {len(failed)} client(s) failed and sit this step out (they keep their "
                f"weights; the components come from the others); client {c!r}: {why}",
                RuntimeWarning,
                stacklevel=3,
            )
        st = res.server_state
        self.inner_means_ = st["tilde_means"]  # this step's federated EM estimate
        self.inner_covariances_ = st["tilde_cov"]
        moved = float(np.max(np.abs(st["means"] - server["means"])))
        self._server = {k: v for k, v in st.items() if k not in ("clients", "tilde_means", "tilde_cov", "log_w_tilde")}
        self._clients.update(res.client_states)
        self.t_ = t
        if adaptive and self.shared_weights:
            eta = float(adaptive_eta(st["grad_sq"], self.n_components)) if "grad_sq" in st else float("nan")
        floor = float("nan") if eta is None else float(floor_at(t, eta, self.weight_floor))
        self.history.append(
            {
                "t": t,
                "eta": float("nan") if eta is None else eta,
                "floor": floor,
                "clients": len(data.clients),
                "points": data.n_total,
                "means_change": moved,
                "seconds": time.perf_counter() - t0,
                "bytes_up": int(res.communication.bytes_up),
                "bytes_down": int(res.communication.bytes_down),
            }
        )

    # ---------------------------------------------------------------- what is played next
    def _check_fitted(self) -> dict[str, Any]:
        """The server's state (the components played next); a RuntimeError before the first step."""
        if self._server is None:
            raise RuntimeError("FEMOMD has not seen any data yet: call partial_fit first")
        return self._server

    @property
    def means_(self) -> np.ndarray:
        """Components played at the next step: (m, d), or (C, m, d) with ``pooling="local"``."""
        return self._check_fitted()["means"]

    @property
    def covariances_(self) -> np.ndarray:
        return self._check_fitted()["cov"]

    @property
    def clients(self) -> list:
        return list(self._clients)

    @property
    def weights_(self) -> dict:
        """Each client's weights for the next step (the shared vector with ``shared_weights``)."""
        server = self._check_fitted()
        if self.shared_weights:
            w = np.exp(server["log_w"])
            return {c: w / w.sum() for c in self._clients}
        return {c: np.exp(s["log_pi"]) / np.exp(s["log_pi"]).sum() for c, s in self._clients.items()}

    @property
    def gradients_(self) -> dict:
        """Each client's last Monte-Carlo gradient ``g`` (at the weights it played)."""
        return {c: s["last_gradient"] for c, s in self._clients.items()}

    def played(self, client: Hashable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(means (m, d), covariances, weights (m,))`` client ``client`` plays next
        (uniform weights for a client not seen yet; before the first step, ``means_init``)."""
        M = self.n_components
        if self._server is None:
            self._validate()
            if self.means_init is None:
                raise RuntimeError(
                    "without means_init nothing can be played before the first batch (the k-means "
                    "start needs data): give means_init, or partial_fit a warm-up batch first"
                )
            means = np.asarray(self.means_init, float)
            d = means.shape[1]
            cov = (
                np.ones(M)
                if self.covariance_type == "identity"
                else np.asarray(self.covariances_init, float)
                if self.covariances_init is not None
                else {
                    "full": np.stack([np.eye(d)] * M),
                    "tied": np.eye(d),
                    "diag": np.ones((M, d)),
                    "spherical": np.ones(M),
                }[self.covariance_type]
            )
            return means, cov, np.full(M, 1.0 / M)
        st = self._server
        if self.pooling == "local":
            i = st["index"].get(client)
            means, cov = (st["init_means"], st["init_cov"]) if i is None else (st["means"][i], st["cov"][i])
        else:
            means, cov = st["means"], st["cov"]
        if self.shared_weights:
            w = np.exp(st["log_w"])
        elif client in self._clients:
            w = np.exp(self._clients[client]["log_pi"])
        else:
            w = np.ones(self.n_components)
        return means, cov, w / w.sum()

    def result(self, client: Hashable | None = None) -> GaussianMixtureResult:
        """The played mixture as a :class:`GaussianMixtureResult` (``predict``, ``score``, ...).

        With ``pooling="local"`` give the client whose components to use."""
        self._check_fitted()
        if self.pooling == "local" and client is None:
            raise ValueError("pooling='local': every client has its own components; give client=")
        means, cov, _ = self.played(client) if self.pooling == "local" else (self.means_, self.covariances_, None)
        weights = self.weights_ if self.pooling != "local" else {client: self.played(client)[2]}
        assert self.feature_names is not None  # _start sets it with the server state
        return GaussianMixtureResult(
            means=means,
            covariances=cov,
            weights=weights,
            covariance_type=self._ct,
            feature_names=self.feature_names,
            n_obs={c: s["n"] for c, s in self._clients.items()},
            history=[],
            communication=self.communication,
            rounds=self.t_,
            converged=None,  # an online learner has no stopping rule
            shared_weights=self.shared_weights,
            init_info={},
            reg_covar=self.reg_covar,
            seconds=sum(h["seconds"] for h in self.history),
        )

    # ---------------------------------------------------------------- uncertainty
    def weight_intervals(self, client: Hashable, level: float = 0.95) -> pd.DataFrame:
        """Credible intervals for the client's *current* weights from its discounted
        Dirichlet ``a_{t+1} = lambda a_t + (1 - lambda) alpha_0 + N_t``, computed
        on the client: Beta marginals. ``mean`` is the posterior mean, ``played`` the
        mirror-descent weights the client plays next."""
        if not 0 < level < 1:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        if client not in self._clients:
            raise KeyError(f"unknown client {client!r}")
        a = self._clients[client]["alpha"]
        M = len(a)
        if M == 1:
            sd, lo, hi = np.zeros(1), np.ones(1), np.ones(1)
        else:
            dist = stats.beta(a, a.sum() - a)
            sd, lo, hi = dist.std(), dist.ppf(0.5 - level / 2), dist.ppf(0.5 + level / 2)
        return pd.DataFrame(
            {"mean": a / a.sum(), "sd": sd, "lower": lo, "upper": hi, "played": self.played(client)[2]},
            index=pd.Index([f"weight[{j}]" for j in range(M)], name="parameter"),
        )

    def client_summary(self, level: float = 0.95) -> pd.DataFrame:
        """Every client's weight intervals (a ``client`` column)."""
        parts = [self.weight_intervals(c, level).assign(client=c).reset_index() for c in self._clients]
        return pd.concat(parts, ignore_index=True)[["client", "parameter", "mean", "sd", "lower", "upper", "played"]]

    def save(self, path: str | os.PathLike) -> Path:
        """Write the whole online state (components, every client's weights and Dirichlet,
        the step counter, options and history) in the safe format of :mod:`fedstats.results`,
        to resume the stream later with :meth:`load`. In a deployment each client would keep
        its own part."""
        return save_result(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, max_bytes: int = MAX_ARRAY_BYTES) -> FEMOMD:
        """Read a model written by :meth:`save` (the safe, bounded format of :mod:`fedstats.results`)."""
        return load_result(path, expected=cls, max_bytes=max_bytes)

    def history_frame(self) -> pd.DataFrame:
        """One row per time step: step size (NaN for the adaptive step of per-client weights: each
        client's own, kept on the client), weight floor, participants, change of the played means,
        time, bytes."""
        return pd.DataFrame(self.history)
