"""FedEM's protocol (:class:`FedEMAlgorithm`): one round is one exact EM iteration of the
per-client-weights mixture on the pooled rows; what each client keeps and sends. The model,
the round and its numerics are described in :mod:`fedstats.mixture.fedem`, whose estimator
runs it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..federation import FederatedAlgorithm
from ..result_file import register
from ._common import RowStack, initial_weights
from ._common import log_weights as _log_weights
from .gmm import (
    check_cov_type,
    estep_statistics,
    expected_loglik_terms,
    m_step,
    means_and_variances,
    precision_cholesky,
    reshift,
    s2_shape,
)

__all__ = ["ClientMixtureState", "FedEMAlgorithm", "SentStatistics"]


@register
@dataclass
class SentStatistics:
    """What a client last added to the server's running totals: its statistics about
    ``shift`` (the means it was sent then), its weight term and its entropy."""

    N: np.ndarray
    S1: np.ndarray
    S2: np.ndarray
    shift: np.ndarray
    weight_term: float
    entropy: float


@register
@dataclass
class ClientMixtureState:
    """What a client keeps between rounds: its log-weights (never sent), row count, and what
    it last sent (``None`` before its first reply)."""

    log_weights: np.ndarray
    n: int
    sent: SentStatistics | None = None


class FedEMAlgorithm(FederatedAlgorithm):
    """Client-server FedEM for a Gaussian mixture (closed-form M-step on summed statistics).

    A client's reply, every array summed over the clients (see the module docs): the change
    of its statistics ``N``, ``S1``, ``S2`` about :attr:`ref` since its previous reply
    (the first time: the statistics), the change of its ``entropy`` and of its
    ``weight_term`` ``sum_j N_cj log pi_cj`` (not sent with ``shared_weights``: the server
    forms that term from the totals), its ``loglik`` at the broadcast parameters and ``n``,
    its soft-count total (for the metrics).

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

    reply_keys: tuple[str, ...] = ("N", "S1", "S2", "loglik", "entropy", "weight_term", "n")
    summed_keys: tuple[str, ...] = reply_keys
    cumulative_replies = True  # each reply is the change since the client's previous one
    row_count_keys = ("N",)  # each row's responsibilities add up to one
    random_client_steps = False
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
        #: the fixed point about which the clients take their moments (the starting means'
        #: average, in the data's region): no client moves its statistics from round to round
        self.ref = self.means0.mean(0)
        self._ref_m = np.repeat(self.ref[None], self.M, axis=0)  # as every component's shift
        self._ref_m.setflags(write=False)
        self._stack = RowStack()
        if self.shared:  # the weight term is the server's: it holds the weights
            self.reply_keys = self.summed_keys = tuple(k for k in type(self).reply_keys if k != "weight_term")

    def final_state(self, state):
        """At the end of a run the client's weights and row count leave it, not the statistics
        it last sent (kept for resuming only)."""
        return replace(state, sent=None) if getattr(state, "sent", None) is not None else state

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_stack"] = RowStack()
        return s

    def _ref_shift(self) -> np.ndarray:
        """:attr:`ref` as a shift of every component's statistics, ``(M, d)`` (one object, read-only)."""
        return self._ref_m

    def _w0(self, client) -> np.ndarray:
        return initial_weights(self.weights_init, client, self.M)

    # ---------------------------------------------------------------- server side
    def init_server(self, clients, rng):
        return {
            "clients": list(clients),
            "means": self.means0.copy(),
            "cov": self.cov0.copy(),
            "log_w": _log_weights(self._w0(None)) if self.shared else None,
            "seen": np.zeros(len(clients), bool),
            # running totals, over the clients seen so far, of their latest statistics (about
            # "shift"), entropies and weight terms
            "N": np.zeros(self.M),
            "S1": np.zeros((self.M, self.d)),
            "S2": np.zeros(s2_shape(self.cov_type, self.M, self.d)),
            "shift": self._ref_shift(),
            "H": 0.0,
            "weight_term": 0.0,
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
        """The server's running totals after this round's replies, about ``shift`` (:attr:`ref`,
        about which the clients send their changes; totals of a checkpoint taken about another
        point are moved there first).

        Returns ``(new_state, metrics, (N, S1, S2) totals about shift)``; the last item is
        ``None`` before any client answered.
        """
        st = dict(state)
        if "weight_term" not in st:  # a checkpoint of the per-client cache that came before the totals
            raise ValueError("this checkpoint holds FedEM's former per-client statistics: start the fit afresh")
        # reshift is linear in (N, S1, S2): moving the total moves every client's part
        N, (S1, S2) = st["N"], reshift(st["N"], st["S1"], st["S2"], st["shift"], shift, self.cov_type)
        sums = replies.sums
        if sums:
            N, S1, S2 = N + sums["N"], S1 + sums["S1"], S2 + sums["S2"]
            st["H"] = st["H"] + float(sums["entropy"][0])
            if not self.shared:
                st["weight_term"] = st["weight_term"] + float(sums["weight_term"][0])
        st["N"], st["S1"], st["S2"], st["shift"] = N, S1, S2, np.array(shift, dtype=float)
        idx = {c: i for i, c in enumerate(st["clients"])}
        st["seen"] = st["seen"].copy()
        st["seen"][[idx[c] for c in replies]] = True
        ll = float(sums["loglik"][0]) if sums else 0.0
        n_ans = float(sums["n"][0]) if sums else 0.0
        metrics = {
            "loglik": ll,
            "n_points": n_ans,
            "answered": float(len(replies)),
            "mean_loglik": ll / n_ans if n_ans else float("nan"),
        }
        return st, metrics, ((N, S1, S2) if st["seen"].any() else None)

    def server_step(self, state, replies, round):
        old = state["means"]
        ref = self._ref_shift()
        st, metrics, stats = self.absorb(state, replies, ref)
        if stats is None:
            metrics.update(free_energy=float("nan"), empty_components=0.0)
            return st, metrics
        N, S1, S2 = stats
        means, cov, empty = m_step(N, S1, S2, ref, self.cov_type, self.reg_covar, prev_means=old, prev_cov=state["cov"])
        st["means"], st["cov"], st["empty"] = means, cov, empty.tolist()
        if self.shared:
            st["log_w"] = _log_weights(N / N.sum())
            weight_term = float(np.sum(N * st["log_w"]))
        else:  # sum_c sum_j N_cj log pi_cj, each client's term formed on the client
            weight_term = st["weight_term"]
        # the expected log-densities are linear in the statistics: evaluated on the totals
        q = expected_loglik_terms(N[None], S1[None], S2[None], ref, means, cov, self.cov_type)[0]
        F = float(weight_term + q + st["H"])
        st["F_prev"], st["F"] = state["F"], F
        metrics.update(free_energy=F, empty_components=float(len(empty)))
        return st, metrics

    def leave_one_out(self, totals, own):
        """The M-step's means from the totals with and without each client's statistics (one
        row per client in ``own``; its replies are changes: a row is all it sent): the largest
        change of a mean coordinate in the standard errors of the fit without it
        (``sd / sqrt(N_j)``), and that over what a client with its share of the rows typically
        causes."""
        ref, cov_type, reg = self._ref_shift(), self.cov_type, self.reg_covar
        means = means_and_variances(totals["N"], totals["S1"], totals["S2"], ref, cov_type, reg)[0]
        N = totals["N"] - own["N"]
        without, var = means_and_variances(N, totals["S1"] - own["S1"], totals["S2"] - own["S2"], ref, cov_type, reg)
        z = np.abs(without - means) / np.sqrt(var / N[..., None])
        shift = np.max(np.where(np.isnan(means), 0.0, z), axis=(1, 2))  # components empty in the fit: no mean
        # a component of the fit that has no mass without the client rests on it alone
        alone = np.any(np.isnan(without) & ~np.isnan(means), axis=(1, 2))
        share = np.clip(own["N"].sum(axis=1) / totals["N"].sum(), 1e-12, 1 - 1e-12)
        shift = np.where(alone, np.inf, shift)
        return shift, shift / np.sqrt(share / (1 - share))

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

    def _estep_log_weights(self, message, states):
        """The E-step's log-weights: the broadcast ones (M,), or every client's own (C, M)."""
        return message["log_weights"] if self.shared else np.stack([s.log_weights for s in states])

    def _updated_many(self, states, N):
        """Every client's new private state (weights ``pi_c = N_c / n_c``) and its weight term
        ``sum_j N_cj log pi_cj`` (0 with shared weights: the server's), ``N`` stacked ``(C, M)``."""
        lw = _log_weights(N / np.array([s.n for s in states], dtype=float)[:, None])
        terms = np.zeros(len(states)) if self.shared else np.sum(N * lw, axis=1)
        return [ClientMixtureState(log_weights=lw[i].copy(), n=s.n) for i, s in enumerate(states)], terms

    def _replies(self, states, N, S1, S2, loglik, entropy):
        """Each client's reply (changes since its previous reply, see the module docs) and new
        state, from its statistics about :attr:`ref` stacked over clients (``N (C, M)``...).

        The server's totals hold exactly what every client remembers sending: the runtime
        commits a client's new state only with a reply that reaches the server step (a client
        that fails keeps its old state; a lost node never answers again).
        """
        news, terms = self._updated_many(states, N)
        ref = self._ref_shift()
        prevs = [s.sent for s in states]
        # the scalar changes at once (a first reply changes from 0)
        dterm = terms - [0.0 if p is None else p.weight_term for p in prevs]
        dH = np.asarray(entropy, dtype=float) - [0.0 if p is None else p.entropy for p in prevs]
        ns, L, dterm, dH = (np.reshape(a, (-1, 1)) for a in (N.sum(1), loglik, dterm, dH))
        out = []
        for i, (prev, new) in enumerate(zip(prevs, news)):
            # copies: a state must not keep this round's stacked arrays alive
            now = SentStatistics(N[i].copy(), S1[i].copy(), S2[i].copy(), ref, float(terms[i]), float(entropy[i]))
            new.sent = now
            if prev is None:
                dN, dS1, dS2 = now.N, now.S1, now.S2
            else:
                S1p, S2p = (
                    (prev.S1, prev.S2)
                    if prev.shift is ref or np.array_equal(prev.shift, ref)
                    else self._moved(prev, ref)
                )
                dN, dS1, dS2 = now.N - prev.N, now.S1 - S1p, now.S2 - S2p
            reply = {"N": dN, "S1": dS1, "S2": dS2, "loglik": L[i], "entropy": dH[i], "n": ns[i]}
            if not self.shared:
                reply["weight_term"] = dterm[i]
            out.append((reply, new))
        return out

    def _moved(self, prev, ref):
        """What a client sent about another point (a checkpoint of an earlier version), moved to ``ref``."""
        return reshift(prev.N, prev.S1, prev.S2, prev.shift, ref, self.cov_type)

    def client_step(self, message, state, data, rng):
        return self.client_steps([message], [state], [data], [rng])[0]

    def client_steps(self, messages, states, datas, rngs):
        # FedEM broadcasts the same components to everybody: one E-step over the stacked rows.
        first = messages[0]
        if any(not all(m[k] is first[k] or np.array_equal(m[k], first[k]) for k in first) for m in messages[1:]):
            return super().client_steps(messages, states, datas, rngs)
        means, cov, pc = self._unpack(first)
        X, starts = self._stack.get([np.asarray(d.X) for d in datas])
        logw = self._estep_log_weights(first, states)
        N, S1, S2, L, H = estep_statistics(X, starts, means, pc, logw, self.cov_type, self._stack.centred_on(self.ref))
        return self._replies(states, N, S1, S2, L, H)


# ====================================================================== the model
