"""D-FedEM for Gaussian mixtures: no server, gossip averaging of statistics over a graph.

Every client keeps its own copy of the components (all start from the same initial
parameters, so component labels agree) and its private weights. One round (Algorithm 8 of
Marfoq's thesis, with a Gaussian mixture's closed-form M-step):

1. each client runs a local M-step from the statistics it holds after the previous
   round's gossip (round 0: the common start), then an exact E-step with its own copy
   and weights, and forms its statistics about a reference agreed once (the common
   initial means);
2. ``G`` gossip steps ``s_c <- sum_c' W[c', c] s_c'`` over the graph, ``W`` symmetric and
   doubly stochastic (Metropolis-Hastings weights by default, or the fast-mixing chain).

With ``W = 11^T / C`` one gossip step gives every client the average statistics and
D-FedEM equals FedEM; on a sparse graph the disagreement between clients shrinks like
``SLEM(W)^G``.

Simulation: the runtime's "server" plays the *network*: it only applies ``W^G`` to the
statistics the clients send and hands each client its mixed statistics; it never runs an
M-step. The bytes a real deployment would move between neighbours are in the history
as ``gossip_bytes`` (``G`` x the number of directed edges x one client's statistics).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
from numpy.typing import ArrayLike

from .._deprecation import renamed_attributes
from ..data import DataLike, FederatedData
from ..estimator import NONE, Int, OneOf, Real
from ..federation import FederatedAlgorithm
from ..fitting import RunOptions, federated_fit
from ..result_file import register
from ._common import WEIGHTS, MixtureEstimator, initial_weights, still_in_fit
from ._common import log_weights as _log_weights
from ._common import norm as _norm
from .gmm import check_cov_type, estep_statistics, log_gaussian, m_step, precision_cholesky, reshift, s2_shape
from .result import GaussianMixtureResult


# ---------------------------------------------------------------------------- graphs
def _check_adjacency(A) -> np.ndarray:
    A = np.asarray(A)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"the adjacency matrix must be square, got shape {A.shape}")
    A = A != 0
    np.fill_diagonal(A, False)
    if not np.array_equal(A, A.T):
        raise ValueError("the adjacency matrix must be symmetric (an undirected graph)")
    # connected? breadth-first search from node 0
    seen = np.zeros(len(A), bool)
    seen[0] = True
    frontier = [0]
    while frontier:
        nxt = np.flatnonzero(A[frontier].any(0) & ~seen)
        seen[nxt] = True
        frontier = list(nxt)
    if not seen.all():
        raise ValueError(
            f"the graph is not connected ({int((~seen).sum())} node(s) unreachable from node 0): "
            "gossip cannot reach consensus"
        )
    return A


def ring_graph(n: int) -> np.ndarray:
    """Adjacency of the cycle 0-1-...-(n-1)-0."""
    A = np.zeros((n, n), bool)
    i = np.arange(n)
    A[i, (i + 1) % n] = A[(i + 1) % n, i] = True
    np.fill_diagonal(A, False)
    return A


def erdos_renyi_graph(n: int, p: float, seed: int = 0, max_tries: int = 1000) -> np.ndarray:
    """A connected Erdős–Rényi graph G(n, p) (redrawn until connected)."""
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        U = np.triu(rng.random((n, n)) < p, 1)
        A = U | U.T
        try:
            return _check_adjacency(A)
        except ValueError:
            continue
    raise ValueError(f"no connected G({n}, {p}) graph in {max_tries} draws; raise p")


def metropolis_weights(A: ArrayLike) -> np.ndarray:
    """Metropolis-Hastings weights ``w_uv = 1 / (1 + max(deg u, deg v))`` on edges.

    Symmetric, doubly stochastic, non-negative, supported on the graph plus self-loops.
    """
    A = _check_adjacency(A)
    deg = A.sum(1)
    W = np.where(A, 1.0 / (1.0 + np.maximum(deg[:, None], deg[None, :])), 0.0)
    np.fill_diagonal(W, 1.0 - W.sum(1))
    return W


def slem(W: ArrayLike) -> float:
    """Second-largest eigenvalue modulus: the per-step contraction of disagreement."""
    ev = np.sort(np.abs(np.linalg.eigvalsh(np.asarray(W))))
    return float(ev[-2]) if len(ev) > 1 else 0.0


def fast_mixing_weights(A: ArrayLike, *, iters: int = 500) -> np.ndarray:
    """Fastest-mixing symmetric chain on the graph (Boyd, Diaconis & Xiao), by subgradient.

    Minimises ``SLEM(W)`` over ``W = I - sum_e w_e (e_u - e_v)(e_u - e_v)^T`` with
    ``w >= 0`` and every node's edge weights summing to at most 1 (self-loops allowed),
    starting from the Metropolis-Hastings weights and keeping the best iterate, so the
    result never mixes slower than :func:`metropolis_weights`.
    """
    A = _check_adjacency(A)
    n = len(A)
    u, v = np.nonzero(np.triu(A, 1))
    W0 = metropolis_weights(A)
    w = W0[u, v].copy()

    def build(w):
        W = np.zeros((n, n))
        W[u, v] = W[v, u] = w
        np.fill_diagonal(W, 1.0 - W.sum(1))
        return W

    best_W, best = W0, slem(W0)
    for k in range(1, iters + 1):
        W = build(w)
        lam, vec = np.linalg.eigh(W)
        # SLEM = max(lambda_2, -lambda_n); lambda_1 = 1 with the constant eigenvector
        if lam[-2] >= -lam[0]:
            g = -((vec[u, -2] - vec[v, -2]) ** 2)
        else:
            g = (vec[u, 0] - vec[v, 0]) ** 2
        w = np.maximum(w - (1.0 / math.sqrt(k)) * g / max(np.linalg.norm(g), 1e-300) * 0.1, 0.0)
        # feasibility: each node's edge weights sum to at most 1
        load = np.zeros(n)
        np.add.at(load, u, w)
        np.add.at(load, v, w)
        scale = np.minimum(1.0, 1.0 / np.maximum(np.maximum(load[u], load[v]), 1e-300))
        w = w * scale
        cur = slem(build(w))
        if cur < best:
            best, best_W = cur, build(w)
    return best_W


# ---------------------------------------------------------------------------- algorithm
class DFedEMAlgorithm(FederatedAlgorithm):
    """D-FedEM over a mixing matrix ``W`` with ``gossip_steps`` gossip steps per round.

    The statistics ``N``, ``S1``, ``S2`` stay per client: the network mixes each node's with
    its neighbours' (weights ``W``), not their sum. The log-likelihood and entropy, diagnostics
    the simulator only adds up, are declared summed."""

    reply_keys = ("N", "S1", "S2", "loglik", "entropy")
    summed_keys = ("loglik", "entropy")
    per_client_fields = ("weights_init",)

    def __init__(
        self,
        means,
        covariances,
        W,
        *,
        gossip_steps=1,
        covariance_type="full",
        reg_covar=1e-6,
        weights_init=None,
        bytes_per_value=8,
    ):
        self.cov_type = check_cov_type(covariance_type)
        self.ref = np.array(means, dtype=float)  # the reference of all statistics, agreed once
        self.cov0 = np.array(covariances, dtype=float)
        self.W = np.asarray(W, dtype=float)
        self.G = int(gossip_steps)
        self.reg_covar = float(reg_covar)
        self.M, self.d = self.ref.shape
        self.weights_init = weights_init
        self.bytes_per_value = bytes_per_value

    # network side
    def init_server(self, clients, rng):
        if len(clients) != len(self.W):
            raise ValueError(f"the mixing matrix is {len(self.W)} x {len(self.W)} but there are {len(clients)} clients")
        C = len(clients)
        return {
            "clients": list(clients),
            "mixed": None,
            "N": np.zeros((C, self.M)),
            "S1": np.zeros((C, self.M, self.d)),
            "S2": np.zeros((C,) + s2_shape(self.cov_type, self.M, self.d)),
        }

    def broadcast(self, state, client, round):
        if state["mixed"] is None:
            return {"round": np.array([round])}
        i = state["clients"].index(client)
        N, S1, S2 = state["mixed"]
        return {"round": np.array([round]), "N": N[i], "S1": S1[i], "S2": S2[i]}

    def mix(self, *arrays):
        """``G`` gossip steps on arrays stacked over clients (axis 0)."""
        out = []
        for a in arrays:
            for _ in range(self.G):
                a = np.tensordot(self.W.T, a, axes=1)
            out.append(a)
        return out

    def local_params(self, N, S1, S2, prev_means, prev_cov):
        means, cov, empty = m_step(
            N, S1, S2, self.ref, self.cov_type, self.reg_covar, prev_means=prev_means, prev_cov=prev_cov
        )
        return means, cov

    def server_step(self, state, replies, round):
        st = dict(state)
        idx = {c: i for i, c in enumerate(st["clients"])}
        for k in ("N", "S1", "S2"):
            st[k] = st[k].copy()
        for c, r in replies.items():
            i = idx[c]
            st["N"][i], st["S1"][i], st["S2"][i] = r["N"], r["S1"], r["S2"]
        ll = float(replies.sums["loglik"][0]) if replies.sums else 0.0
        N, S1, S2 = self.mix(st["N"], st["S1"], st["S2"])
        st["mixed"] = (N, S1, S2)
        before = np.concatenate([a.reshape(len(a), -1) for a in (st["N"], st["S1"], st["S2"])], 1)
        after = np.concatenate([a.reshape(len(a), -1) for a in (N, S1, S2)], 1)
        spread = np.linalg.norm(before - before.mean(0))
        # ||after - mean|| <= SLEM(W)^G ||before - mean||: gossip's contraction this round
        contraction = float(np.linalg.norm(after - after.mean(0)) / spread) if spread > 0 else 0.0
        # consensus diagnostics (the simulator can see every node; a deployment would not)
        means = self.ref + S1 / np.maximum(N, 1e-300)[..., None]
        dis = float(np.max(np.linalg.norm(means - means.mean(0), axis=-1)))
        size = N[0].size + S1[0].size + S2[0].size
        edges = int((self.W > 0).sum() - np.count_nonzero(np.diag(self.W) > 0))
        return st, {
            "loglik": ll,
            "disagreement": dis,
            "contraction": contraction,
            "gossip_bytes": float(self.G * edges * size * self.bytes_per_value),
        }

    # client side
    def init_client(self, client, data, rng):
        return {
            "log_w": _log_weights(initial_weights(self.weights_init, client, self.M)),
            "n": int(data.n),
            "means": self.ref.copy(),
            "cov": self.cov0.copy(),
        }

    def client_step(self, message, state, data, rng):
        st = dict(state)
        if "N" in message:
            st["means"], st["cov"] = self.local_params(
                message["N"], message["S1"], message["S2"], state["means"], state["cov"]
            )
        pc = precision_cholesky(st["cov"], self.cov_type)
        X = np.asarray(data.X)
        N, S1, S2, L, H = estep_statistics(X, [0], st["means"], pc, state["log_w"][None], self.cov_type)
        # move the statistics (taken about the local means) to the common reference
        S1r, S2r = reshift(N[0], S1[0], S2[0], st["means"], self.ref, self.cov_type)
        st["log_w"] = _log_weights(N[0] / st["n"])
        return {"N": N[0], "S1": S1r, "S2": S2r, "loglik": L, "entropy": H}, st


@dataclass(eq=False, repr=False, kw_only=True)
class DecentralizedGaussianMixture(MixtureEstimator):
    """D-FedEM: a Gaussian mixture fitted without a server, by gossip over a client graph.

    The initial components come from the federated k-means start (a one-off aggregation that
    a deployment would also do by gossip, or give as ``means_init``); every node starts from
    them, which keeps component labels aligned across nodes.

    The fit's ``means``/``covariances`` are the clients' average; each client's own copy
    is in ``client_means``/``client_covariances`` and is what ``predict(X, client)`` uses.

    Parameters
    ----------
    n_components, covariance_type, reg_covar, rounds, n_init, means_init, covariances_init, weights_init
        As in :class:`~fedstats.mixture.fedem.FederatedGaussianMixture`. (Every node gossips in
        every round, so there is no ``participation``; the weights are each node's own.)
    tol : float, default 1e-6
        No node sees the global objective, so every one of the ``rounds`` runs; the fit has
        ``converged`` when the log-likelihood per point (the nodes' sum, which a monitor of the
        run sees) changed by less than ``tol`` in the last round, and warns otherwise.
    graph : "complete", "ring", or a symmetric (C, C) adjacency matrix of a connected graph
    gossip_steps : int, default 1
        Gossip steps ``G`` per round.
    mixing : {"metropolis", "fast"}, default "metropolis"
        Metropolis-Hastings weights, or the fastest-mixing chain (:func:`fast_mixing_weights`).

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.mixture import DecentralizedGaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> Xs = [np.r_[rng.normal(0, 1, (30, 2)), rng.normal(6, 1, (30, 2))] for _ in range(5)]
    >>> res = DecentralizedGaussianMixture(2, graph="ring", gossip_steps=3, n_init=2).fit(Xs, seed=0)
    >>> [round(float(v)) for v in np.sort(res.means[:, 0])]
    [0, 6]
    >>> bool(res.disagreement()[-1] < 0.05)  # nodes agree up to SLEM(W)^G x their heterogeneity
    True
    """

    _constraints = {
        **MixtureEstimator._constraints,
        "weights_init": NONE | WEIGHTS,
        "gossip_steps": Int(1),
        "mixing": OneOf("metropolis", "fast"),
        "tol": Real(0),
    }

    weights_init: ArrayLike | Mapping[Hashable, ArrayLike] | None = None
    graph: str | ArrayLike = "complete"
    gossip_steps: int = 1
    mixing: str = "metropolis"
    tol: float = 1e-6

    def mixing_matrix(self, n_clients: int, keep: ArrayLike | None = None) -> np.ndarray:
        """The gossip weights over the graph of ``n_clients`` nodes; with ``keep`` (the indices
        of the nodes still in the fit) over the graph those nodes span: the links of a node
        that dropped out are gone (an error if the rest is not connected)."""
        g = self.graph
        if isinstance(g, str):
            if g == "complete":
                A = ~np.eye(n_clients, dtype=bool)
            elif g == "ring":
                A = ring_graph(n_clients)
            else:
                raise ValueError(f"graph must be 'complete', 'ring' or an adjacency matrix, got {g!r}")
        else:
            A = np.asarray(g)
            if A.shape != (n_clients, n_clients):
                raise ValueError(f"the adjacency matrix must be {n_clients} x {n_clients}, got {A.shape}")
        if keep is not None:
            keep = np.asarray(keep, dtype=int)
            A, n_clients = A[np.ix_(keep, keep)], len(keep)
        if n_clients == 1:
            return np.ones((1, 1))
        if self.mixing == "metropolis":
            return metropolis_weights(A)
        if self.mixing == "fast":
            return fast_mixing_weights(A)
        raise ValueError(f"mixing must be 'metropolis' or 'fast', got {self.mixing!r}")

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> DecentralizedMixtureResult:
        """Fit by D-FedEM. ``data``: FederatedData (``y`` ignored), or per-client arrays.
        Returns a :class:`DecentralizedMixtureResult`."""
        seed = run.seed
        self._check(data)
        G = self.gossip_steps
        W = self.mixing_matrix(data.n_clients)
        means, cov, info = self._start(data, seed)
        start = list(data.clients)
        data = still_in_fit(data)  # a node that dropped out of the start takes its links with it
        if data.n_clients < len(start):
            W = self.mixing_matrix(len(start), keep=[start.index(c) for c in data.clients])
        algo = DFedEMAlgorithm(
            means,
            cov,
            W,
            gossip_steps=G,
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            weights_init=self.weights_init,
        )
        res = run.run(algo, data, kind="gossip rounds", rounds=self.rounds)
        # a node silent in a gossip round leaves its neighbours' averages stale: no result
        failed = {c: why for rec in res.history for c, why in rec.failed.items()}
        if failed:
            c, why = next(iter(failed.items()))
            raise RuntimeError(
                f"D-FedEM: {len(failed)} node(s) failed during the gossip rounds, which leaves their neighbours' "
                f"averages stale; client {c!r}: {why}"
            )
        # each node's last local M-step, from the statistics of the last gossip
        N, S1, S2 = res.server_state["mixed"]
        cm, cc, weights = {}, {}, {}
        for i, c in enumerate(data.clients):
            s = res.client_states[c]
            cm[c], cc[c] = algo.local_params(N[i], S1[i], S2[i], s["means"], s["cov"])
            weights[c] = _norm(np.exp(s["log_w"]))
        ll = [r.metrics.get("loglik", np.nan) for r in res.history[-2:]]
        change = abs(ll[-1] - ll[0]) / data.n_total if len(ll) == 2 else np.nan
        converged = bool(change < float(self.tol))
        if not converged:
            warnings.warn(
                f"D-FedEM did not converge in {self.rounds} rounds: the log-likelihood per point changed by "
                f"{change:.3g} in the last round (tol={float(self.tol):g}); raise rounds or gossip_steps",
                RuntimeWarning,
                stacklevel=3,
            )
        out = DecentralizedMixtureResult(
            means=np.mean([cm[c] for c in data.clients], 0),
            covariances=np.mean([cc[c] for c in data.clients], 0),
            weights=weights,
            covariance_type=self.covariance_type,
            **self._run_fields(data, res, info, converged),
            shared_weights=False,
        )
        out.client_means, out.client_covariances = cm, cc
        out.mixing_matrix = W
        out.slem = slem(W)
        return out


#: the former (scikit-learn) names of the attributes, read for one release
_FORMER = {
    "client_means_": "client_means",
    "client_covariances_": "client_covariances",
    "mixing_matrix_": "mixing_matrix",
    "slem_": "slem",
}


@register
@renamed_attributes(**_FORMER)
class DecentralizedMixtureResult(GaussianMixtureResult):
    """A D-FedEM fit: each client predicts with its own copy of the components."""

    # set by the fit
    client_means: dict[Hashable, np.ndarray]
    client_covariances: dict[Hashable, np.ndarray]
    mixing_matrix: np.ndarray
    slem: float

    def _log_dens(self, X: ArrayLike, client: Hashable | None = None) -> np.ndarray:
        if client is None or client not in getattr(self, "client_means", {}):
            return super()._log_dens(X, client)
        cov = self.client_covariances[client]
        return log_gaussian(
            self._X(X), self.client_means[client], precision_cholesky(cov, self.covariance_type), self.covariance_type
        )

    def wald_intervals(self, data: DataLike, level: float = 0.95, *, seed: int = 0) -> NoReturn:
        raise AttributeError(
            "Wald intervals need one set of components at the maximum likelihood; a D-FedEM fit "
            "has one copy per node (fit FederatedGaussianMixture for intervals)"
        )

    def disagreement(self) -> np.ndarray:
        """Consensus diagnostic per round: ``max_c,j ||mu_jc - mean_c mu_jc||``."""
        return np.array([r.metrics["disagreement"] for r in self.history])
