"""FedEM for Gaussian mixtures: shared components, private per-client weights.

Model (Algorithm 7 of Marfoq's thesis with a Gaussian mixture's closed-form M-step): client ``c`` draws ``x ~ sum_j pi_cj N(mu_j, Sigma_j)``; the
components ``(mu_j, Sigma_j)`` are shared, the weights ``pi_c`` belong to the client.

One round (client-server, :class:`FedEMAlgorithm`):

* the server broadcasts the components (and, with ``shared_weights=True``, the weights);
* each client runs an exact E-step on its own rows with its own weights, updates its
  weights ``pi_c = N_c / n_c`` (they never leave the client) and replies with summed
  statistics: soft counts ``N_c``, moments ``S1_c``, ``S2_c`` shifted by the broadcast
  means, its log-likelihood at the broadcast parameters and the entropy of its
  responsibilities;
* the server adds the statistics and does the closed-form M-step. It never averages
  parameters (averaging the clients' local closed-form means with weights ``n_c/N`` is not the
  EM update: a component's mean must be weighted by each client's responsibility mass).

So a federated round *is* an EM iteration of the per-client-weights model on the pooled
data: federated equals centralised exactly, and the log-likelihood never decreases.

Partial participation is incremental EM (Neal & Hinton): the server keeps every client's
latest statistics and replaces those of the clients that answered; the free energy
(ELBO) it reports after each M-step never decreases. The first round always asks every
client, so the M-step always sees the whole federation.

The variational model (:mod:`fedstats.mixture.bayes`) and D-FedEM
(:mod:`fedstats.mixture.decentralized`) are sibling estimators; what they share is in
:mod:`fedstats.mixture._common`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..data import DataLike, FederatedData
from ..estimator import NONE
from ..federation import FederatedAlgorithm, run
from ..federation.backend import accepts_backend
from ..results import counted
from ._common import (
    SERVER_CONSTRAINTS,
    WEIGHTS,
    MixtureEstimator,
    RowStack,
    as_federated,
    check_failures,
    initial_weights,
    log_weights,
    norm,
    without_lost,
)
from ._init import federated_loglik
from .gmm import check_cov_type, estep_statistics, expected_loglik_terms, m_step, precision_cholesky, reshift, s2_shape
from .result import GaussianMixtureResult

# helpers shared by the three mixtures (their names here are kept for the modules that import them)
_log_weights, _norm = log_weights, norm


@dataclass
class ClientMixtureState:
    """What a client keeps between rounds: its log-weights (never sent) and row count."""

    log_weights: np.ndarray
    n: int


class FedEMAlgorithm(FederatedAlgorithm):
    """Client-server FedEM for a Gaussian mixture (closed-form M-step on summed statistics).

    Parameters
    ----------
    means, covariances : initial components (scikit-learn layout, see :mod:`fedstats.mixture.gmm`).
    covariance_type : "full" | "tied" | "diag" | "spherical".
    reg_covar : added to the diagonal of every covariance after the M-step.
    shared_weights : one weight vector for all clients (the server aggregates the soft
        counts and broadcasts it): pooled EM, i.e. scikit-learn on the pooled data.
    weights_init : (M,) initial weights for every client, or a dict client -> (M,);
        default uniform.
    tol : convergence when the free energy per point changes by less than ``tol``.
    """

    reply_keys = ("N", "S1", "S2", "loglik", "entropy")
    per_client_fields: tuple[str, ...] = ("weights_init",)

    def __init__(
        self,
        means,
        covariances,
        *,
        covariance_type="full",
        reg_covar=1e-6,
        shared_weights=False,
        weights_init=None,
        tol=1e-6,
    ):
        self.cov_type = check_cov_type(covariance_type)
        self.means0 = np.array(means, dtype=float)
        self.cov0 = np.array(covariances, dtype=float)
        self.reg_covar = float(reg_covar)
        self.shared = bool(shared_weights)
        self.weights_init = weights_init
        self.tol = tol
        self.M, self.d = self.means0.shape
        self._stack = RowStack()

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_stack"] = RowStack()
        return s

    def _w0(self, client) -> np.ndarray:
        return initial_weights(self.weights_init, client, self.M)

    # ---------------------------------------------------------------- server side
    def init_server(self, clients, rng):
        C = len(clients)
        return {
            "clients": list(clients),
            "means": self.means0.copy(),
            "cov": self.cov0.copy(),
            "log_w": _log_weights(self._w0(None)) if self.shared else None,
            "seen": np.zeros(C, bool),
            "N": np.zeros((C, self.M)),
            "S1": np.zeros((C, self.M, self.d)),
            "S2": np.zeros((C,) + s2_shape(self.cov_type, self.M, self.d)),
            "shift": np.zeros((C, self.M, self.d)),
            "H": np.zeros(C),
            "F": None,
            "F_prev": None,
            "empty": [],
        }

    def broadcast(self, state, client, round):
        msg = {"means": state["means"], "covariances": state["cov"]}
        if self.shared:
            msg["log_weights"] = state["log_w"]
        return msg

    def absorb(self, state, replies, shift):
        """The server's cache after this round's replies (statistics taken about ``shift``).

        Returns ``(new_state, metrics, (N_c, S1_c, S2_c) of every client seen so far, all
        moved to ``shift``)``; the last item is ``None`` before any client answered.
        """
        st = dict(state)
        idx = {c: i for i, c in enumerate(st["clients"])}
        for k in ("N", "S1", "S2", "shift", "H", "seen"):
            st[k] = st[k].copy()
        ll = n_ans = 0.0
        for c, r in replies.items():
            i = idx[c]
            st["N"][i], st["S1"][i], st["S2"][i] = r["N"], r["S1"], r["S2"]
            st["shift"][i], st["H"][i], st["seen"][i] = shift, r["entropy"][0], True
            ll += float(r["loglik"][0])
            n_ans += float(r["N"].sum())
        metrics = {
            "loglik": ll,
            "n_points": n_ans,
            "answered": float(len(replies)),
            "mean_loglik": ll / n_ans if n_ans else float("nan"),
        }
        seen = st["seen"]
        if not seen.any():
            return st, metrics, None
        S1c, S2c = reshift(st["N"][seen], st["S1"][seen], st["S2"][seen], st["shift"][seen], shift, self.cov_type)
        return st, metrics, (st["N"][seen], S1c, S2c)

    def server_step(self, state, replies, round):
        old = state["means"]
        st, metrics, stats = self.absorb(state, replies, old)
        if stats is None:
            metrics.update(free_energy=float("nan"), empty_components=0.0)
            return st, metrics
        Nc, S1c, S2c = stats
        Nj = Nc.sum(0)
        means, cov, empty = m_step(
            Nj, S1c.sum(0), S2c.sum(0), old, self.cov_type, self.reg_covar, prev_means=old, prev_cov=state["cov"]
        )
        st["means"], st["cov"], st["empty"] = means, cov, empty.tolist()
        # weights the clients now hold: pi_c = N_c / n_c (the server can form them from N_c,
        # which is why soft counts reveal the weights unless summed by secure aggregation)
        if self.shared:
            st["log_w"] = _log_weights(Nj / Nj.sum())
            logw = np.broadcast_to(st["log_w"], Nc.shape)
        else:
            logw = _log_weights(Nc / Nc.sum(1, keepdims=True))
        q = expected_loglik_terms(Nc, S1c, S2c, old, means, cov, self.cov_type)
        F = float(np.sum(Nc * logw) + q.sum() + st["H"][st["seen"]].sum())
        st["F_prev"], st["F"] = state["F"], F
        metrics.update(free_energy=F, empty_components=float(len(empty)))
        return st, metrics

    def converged(self, state, metrics):
        if self.tol is None or state["F_prev"] is None or not state["seen"].all():
            return False
        n = state["N"].sum()
        return abs(state["F"] - state["F_prev"]) / n < self.tol

    # ---------------------------------------------------------------- client side
    def init_client(self, client, data, rng):
        w = self._w0(client)
        return ClientMixtureState(log_weights=_log_weights(w), n=int(data.n))

    def _unpack(self, msg):
        means, cov = msg["means"], msg["covariances"]
        return means, cov, precision_cholesky(cov, self.cov_type)

    def client_step(self, message, state, data, rng):
        return self.client_steps([message], [state], [data], [rng])[0]

    def client_steps(self, messages, states, datas, rngs):
        # FedEM broadcasts the same components to everybody: one E-step over the stacked rows.
        first = messages[0]
        if any(not all(np.array_equal(m[k], first[k]) for k in first) for m in messages[1:]):
            return super().client_steps(messages, states, datas, rngs)
        means, cov, pc = self._unpack(first)
        X, starts = self._stack.get([np.asarray(d.X) for d in datas])
        logw = first["log_weights"] if self.shared else np.stack([s.log_weights for s in states])
        N, S1, S2, L, H = estep_statistics(X, starts, means, pc, logw, self.cov_type)
        out = []
        for i, s in enumerate(states):
            new = ClientMixtureState(log_weights=_log_weights(N[i] / s.n), n=s.n)
            out.append(({"N": N[i], "S1": S1[i], "S2": S2[i], "loglik": L[i : i + 1], "entropy": H[i : i + 1]}, new))
        return out


# ====================================================================== the model
class FederatedGaussianMixture(MixtureEstimator):
    """Gaussian mixture fitted by FedEM: shared components, private per-client weights
    (maximum likelihood; :class:`~fedstats.mixture.bayes.VariationalGaussianMixture` is the
    variational sibling, :class:`~fedstats.mixture.decentralized.DecentralizedGaussianMixture`
    the serverless one).

    Parameters
    ----------
    n_components : int
        Number of components M.
    covariance_type : {"full", "tied", "diag", "spherical"}, default "full"
    reg_covar : float, default 1e-6
        Added to every covariance's diagonal after the M-step (scikit-learn's meaning).
    rounds : int, default 100
        Communication rounds of EM (each is one exact EM iteration).
    tol : float or None, default 1e-6
        Stop when the free energy per point changes by less than ``tol`` (``None`` or 0:
        run ``rounds``).
    shared_weights : bool, default False
        One weight vector for all clients: pooled EM (scikit-learn on the pooled rows).
    n_init : int, default 10
        Candidates of the federated k-means initialisation (ranked by federated
        log-likelihood) when no ``means_init`` is given.
    means_init, covariances_init, weights_init : optional
        Explicit start. ``weights_init`` is (M,) for every client or a dict client -> (M,).
        ``covariances_init`` defaults to the federated within-cluster covariance at
        ``means_init``.
    participation : float in (0, 1], default 1.0
        Fraction of clients asked in each round after the first (incremental EM).

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.mixture import FederatedGaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> Xs = [np.r_[rng.normal(0, 1, (40, 2)), rng.normal(6, 1, (10 + 20 * k, 2))] for k in range(3)]
    >>> res = FederatedGaussianMixture(2, n_init=3).fit(Xs, seed=0)
    >>> [round(float(v)) for v in np.sort(res.means_[:, 0])]
    [0, 6]
    """

    _constraints = {**MixtureEstimator._constraints, **SERVER_CONSTRAINTS, "weights_init": NONE | WEIGHTS}

    def __init__(
        self,
        n_components: int,
        *,
        covariance_type: str = "full",
        reg_covar: float = 1e-6,
        rounds: int = 100,
        tol: float | None = 1e-6,
        shared_weights: bool = False,
        n_init: int = 10,
        means_init: ArrayLike | None = None,
        covariances_init: ArrayLike | None = None,
        weights_init: ArrayLike | Mapping[Hashable, ArrayLike] | None = None,
        participation: float = 1.0,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.reg_covar = reg_covar
        self.rounds = rounds
        self.tol = tol
        self.shared_weights = shared_weights
        self.n_init = n_init
        self.means_init = means_init
        self.covariances_init = covariances_init
        self.weights_init = weights_init
        self.participation = participation

    def _check(self, data: FederatedData) -> None:
        super()._check(data)
        if isinstance(self.weights_init, Mapping) and self.shared_weights:
            raise ValueError("shared_weights=True takes one weights_init vector (M,), not one per client")

    @counted
    @accepts_backend
    def fit(
        self,
        data: DataLike,
        *,
        seed: int = 0,
        progress: bool | None = None,
        checkpoint: str | os.PathLike | None = None,
        resume: bool = False,
        uncertainty: bool = False,
    ) -> GaussianMixtureResult:
        """Fit by FedEM. ``data``: FederatedData (``y`` ignored), or per-client arrays.

        Returns a :class:`GaussianMixtureResult`. ``uncertainty=True`` adds the Wald rounds
        (:meth:`GaussianMixtureResult.wald_intervals`): the result's ``summary(level)`` and
        ``client_summary(level)`` then carry observed-information sd and intervals of the
        means and weights.
        """
        data = as_federated(data)
        self._check(data)
        means, cov, info = self._start(data, seed)
        algo = FedEMAlgorithm(
            means,
            cov,
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            shared_weights=self.shared_weights,
            weights_init=self.weights_init,
            tol=self.tol or None,
        )
        res = run(
            algo,
            data,
            kind="EM rounds",
            rounds=self.rounds,
            participation=self._participation(data.clients),
            seed=seed,
            progress=progress,
            checkpoint=checkpoint,
            resume=resume,
            min_rounds=min(2, self.rounds),
        )
        st = res.server_state
        check_failures(res.history, st["seen"], st["clients"], "FedEM")
        data = without_lost(data, res.lost, "FedEM")
        weights = (
            {c: np.exp(st["log_w"]) / np.exp(st["log_w"]).sum() for c in data.clients}
            if self.shared_weights
            else {c: norm(np.exp(s.log_weights)) for c, s in res.client_states.items()}
        )
        # one more round: the log-likelihood at the final parameters (for bic, the CLI, ...)
        ll = federated_loglik(
            data, st["means"], st["cov"], self.covariance_type, {c: log_weights(w) for c, w in weights.items()}, seed
        )
        if st["empty"]:
            warnings.warn(
                f"component(s) {st['empty']} received (almost) no mass in the last round and kept their "
                "previous parameters; consider fewer components",
                RuntimeWarning,
                stacklevel=2,
            )
        if not res.converged and self.tol:
            warnings.warn(
                f"FedEM did not converge in {self.rounds} rounds (tol={self.tol}); increase rounds",
                RuntimeWarning,
                stacklevel=2,
            )
        out = GaussianMixtureResult(
            means=st["means"],
            covariances=st["cov"],
            weights=weights,
            covariance_type=self.covariance_type,
            feature_names=data.feature_names,
            n_obs=data.n_obs,
            history=res.history,
            communication=res.communication,
            rounds=res.rounds,
            converged=res.converged,
            shared_weights=self.shared_weights,
            init_info=info,
            reg_covar=self.reg_covar,
            loglik=ll,
        )
        if uncertainty:
            out.wald_intervals(data, seed=seed)
        return out


# ====================================================================== results
