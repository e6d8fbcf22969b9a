"""One FEM-OMD time step as a federated algorithm (:class:`FEMOMDStep`; the model is
:class:`fedstats.mixture.online.FEMOMD`, whose module docs describe the step)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..federation import FederatedAlgorithm
from ._common import RowStack
from ._common import log_weights as _log_weights
from .gmm import e_step, estep_statistics, full_covariances, log_gaussian, m_step, precision_cholesky, s2_shape

COV_TYPES_ONLINE = ("identity", "full", "tied", "diag", "spherical")
from .omd import adaptive_eta, eg_update, floor_at, lse, omd_gradient

if TYPE_CHECKING:
    from .online import FEMOMD


def prior_concentration(n_components: int, concentration_prior: float | None) -> float:
    """The Dirichlet prior's concentration of a client's weights (``1/m`` by default)."""
    return 1.0 / n_components if concentration_prior is None else concentration_prior


def new_client_state(n_components: int, alpha0: float) -> dict:
    """A client's state before its first time step: uniform played and inner weights, the
    prior's Dirichlet, no gradient yet."""
    M = n_components
    return {
        "log_pi": np.full(M, -math.log(M)),
        "log_pi_tilde": np.full(M, -math.log(M)),
        "alpha": np.full(M, alpha0),
        "last_gradient": np.zeros(M),
        "grad_sq": 0.0,
        "n": 0,
    }


# ------------------------------------------------------------------ one time step
class FEMOMDStep(FederatedAlgorithm):
    """One FEM-OMD time step as ``K + 1`` rounds (see the module docs).

    ``server`` / ``clients``: the state carried over from the previous step (mutated copies
    are returned through the run's server and client states).

    Every reply array is declared summed (the server uses only the totals), except the
    statistics ``N``, ``S1``, ``S2`` with ``pooling="local"``: there every client has its own
    components, whose M-step uses that client's statistics alone.
    """

    reply_keys = ("N", "S1", "S2", "g")
    per_client_fields = ("clients0",)
    server_only_fields = ("server0",)

    def __init__(self, model: FEMOMD, server: dict, clients: Mapping, eta: float | None, t: int = 1):
        self.m = model
        self.server0 = server
        self.clients0 = clients
        self.eta = eta  # None: the adaptive step, per client (per federation with shared_weights)
        self.t = t
        self.K = model.inner_rounds
        self.ct = "spherical" if model.covariance_type == "identity" else model.covariance_type
        self.M = model.n_components
        self.summed_keys = ("g",) if model.pooling == "local" else self.reply_keys
        self._stack = RowStack()

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_stack"] = RowStack()
        return s

    def for_client(self, client):
        out = super().for_client(client)
        # the model object carries every client's state and the server's: a node gets options only
        out.m = copy.copy(self.m)
        out.m._clients, out.m._server, out.m.history = {}, None, []
        return out

    # ---------------------------------------------------------------- server side
    def init_server(self, clients, rng):
        st = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.server0.items()}
        st["clients"] = list(clients)
        st["tilde_means"] = st["means"].copy()
        st["tilde_cov"] = st["cov"].copy()
        if self.m.shared_weights:
            st["log_w_tilde"] = (
                st["log_w"].copy() if self.m.inner_init == "played" else np.full(self.M, -math.log(self.M))
            )
        return st

    def _means_for(self, st, key, client):
        a = st[key]
        return a[st["index"][client]] if self.m.pooling == "local" else a

    def broadcast(self, st, client, round):
        inner = round < self.K
        msg = {
            "means": self._means_for(st, "tilde_means" if inner else "means", client),
            "covariances": self._means_for(st, "tilde_cov" if inner else "cov", client),
            "round": np.array([round]),
        }
        if self.m.shared_weights:
            msg["log_w_tilde"] = st["log_w_tilde"]
            msg["log_w"] = st["log_w"]
        return msg

    def server_step(self, st, replies, round):
        st = dict(st)
        if round < self.K:
            st = self._inner_update(st, replies)
            if round == self.K - 1:  # play the running average (k mu_t + mu~) / (k + 1) from now on
                k = st["n_avg"]  # estimates averaged so far (the given start counts as one)
                if self.m.pooling == "local":  # per client: only those that took part this step
                    k = np.asarray(k, float)
                    st["n_avg"] = k + np.isin(np.arange(len(k)), [st["index"][c] for c in replies])
                else:
                    st["n_avg"] = k + 1
                kk = k.reshape((-1,) + (1,) * (st["means"].ndim - 1)) if np.ndim(k) else k
                st["means"] = (kk * st["means"] + st["tilde_means"]) / (kk + 1)
                if self.m.covariance_type != "identity":
                    kc = k.reshape((-1,) + (1,) * (st["cov"].ndim - 1)) if np.ndim(k) else k
                    st["cov"] = (kc * st["cov"] + st["tilde_cov"]) / (kc + 1)
            return st, {"answered": float(len(replies))}
        if self.m.shared_weights and replies:
            tot = replies.sums["g"]  # (sum_c n_c g_c, sum_c n_c)
            g = tot[:-1] / tot[-1]
            eta = self.eta
            if eta is None:  # adaptive: sqrt(log m / sum of squared gradient ranges so far)
                st["grad_sq"] = st.get("grad_sq", 0.0) + float(np.ptp(g)) ** 2
                eta = float(adaptive_eta(st["grad_sq"], self.M))
            floor = floor_at(self.t, eta, self.m.weight_floor)
            st["log_w"] = _log_weights(eg_update(np.exp(st["log_w"]), g, eta, floor))
        return st, {"answered": float(len(replies))}

    def _inner_update(self, st, replies):
        if not replies:
            return st
        cov_fixed = self.m.covariance_type == "identity"
        idx = st["index"]
        if self.m.pooling == "local":
            means, cov = st["tilde_means"].copy(), st["tilde_cov"].copy()
            for c, r in replies.items():
                i = idx[c]
                means[i], cv, _ = m_step(
                    r["N"],
                    r["S1"],
                    r["S2"] if not cov_fixed else self._zeros_s2(),
                    means[i],
                    self.ct,
                    self.m.reg_covar,
                    prev_means=means[i],
                    prev_cov=cov[i],
                )
                if not cov_fixed:
                    cov[i] = cv
            st["tilde_means"], st["tilde_cov"] = means, cov
        else:
            N, S1 = replies.sums["N"], replies.sums["S1"]
            S2 = replies.sums["S2"] if not cov_fixed else self._zeros_s2()
            old = st["tilde_means"]
            means, cv, _ = m_step(N, S1, S2, old, self.ct, self.m.reg_covar, prev_means=old, prev_cov=st["tilde_cov"])
            st["tilde_means"] = means
            if not cov_fixed:
                st["tilde_cov"] = cv
            if self.m.shared_weights:
                st["log_w_tilde"] = _log_weights(N / N.sum())
        return st

    def _zeros_s2(self):
        return np.zeros(s2_shape(self.ct, self.M, self.m.n_features_))

    # ---------------------------------------------------------------- client side
    def init_client(self, client, data, rng):
        s = self.clients0.get(client)
        if s is None:  # a client seen for the first time starts from uniform weights
            s = new_client_state(self.M, prior_concentration(self.M, self.m.concentration_prior))
        s = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
        s["n"] = int(data.n)
        return s

    def client_step(self, message, state, data, rng):
        return self.client_steps([message], [state], [data], [rng])[0]

    def _rows(self, X, k):
        if not self.m.sample_splitting:
            return X
        b = X.shape[0] // self.K
        return X[k * b : (k + 1) * b]

    def client_steps(self, messages, states, datas, rngs):
        first = messages[0]
        if self.m.pooling == "local" and len(messages) > 1:  # every client has its own components
            return [self.client_steps([m], [s], [d], [r])[0] for m, s, d, r in zip(messages, states, datas, rngs)]
        k = int(first["round"][0])
        Xs = [np.asarray(d.X) for d in datas]
        means, cov = first["means"], first["covariances"]
        pc = precision_cholesky(cov, self.ct)
        empty = np.zeros(0)
        if k < self.K:
            if k == 0:
                for s in states:
                    s["log_pi_tilde"] = (
                        s["log_pi"].copy() if self.m.inner_init == "played" else np.full(self.M, -math.log(self.M))
                    )
            rows = [self._rows(X, k) for X in Xs]
            X, starts = (
                self._stack.get(rows)
                if not self.m.sample_splitting
                else (np.concatenate(rows), np.cumsum([0] + [len(r) for r in rows[:-1]]))
            )
            logw = first["log_w_tilde"] if self.m.shared_weights else np.stack([s["log_pi_tilde"] for s in states])
            N, S1, S2, _, _ = estep_statistics(X, starts, means, pc, logw, self.ct)
            out = []
            for i, s in enumerate(states):
                s = dict(s)
                if not self.m.shared_weights:
                    s["log_pi_tilde"] = _log_weights(N[i] / len(rows[i]))
                s2 = S2[i] if self.m.covariance_type != "identity" else empty
                out.append(({"N": N[i], "S1": S1[i], "S2": s2, "g": empty}, s))
            return out
        # mirror-descent round: gradient at the played weights, new weights, Dirichlet update
        out = []
        X, starts = self._stack.get(Xs)
        inner_logw = first["log_w_tilde"] if self.m.shared_weights else np.stack([s["log_pi_tilde"] for s in states])
        g0 = means.mean(0)
        ld_x = log_gaussian(X - g0, means - g0, pc, self.ct)
        lw_rows = inner_logw if inner_logw.ndim == 1 else np.repeat(inner_logw, np.diff(np.r_[starts, len(X)]), 0)
        Nx = np.add.reduceat(e_step(ld_x, lw_rows)[0], starts, axis=0)  # soft counts for the Dirichlet
        Z, zstarts = self._draws(means, cov, states, Xs, inner_logw, rngs)
        ld = log_gaussian(Z - means.mean(0), means - means.mean(0), pc, self.ct)
        C = len(states)
        played = (
            np.broadcast_to(first["log_w"], (C, self.M))
            if self.m.shared_weights
            else np.stack([s["log_pi"] for s in states])
        )
        G = omd_gradient(ld, played, zstarts)
        eta = self.eta
        if eta is None and not self.m.shared_weights:  # adaptive, per client
            gsq = np.array([s.get("grad_sq", 0.0) for s in states]) + np.ptp(G, axis=1) ** 2
            eta = adaptive_eta(gsq, self.M)[:, None]
        new_w = (
            None
            if self.m.shared_weights
            else _log_weights(eg_update(np.exp(played), G, eta, floor_at(self.t, eta, self.m.weight_floor)))
        )
        lam, a0 = self.m.discount, prior_concentration(self.M, self.m.concentration_prior)
        for i, s in enumerate(states):
            s = dict(s)
            if self.m.shared_weights:
                reply_g = np.r_[G[i] * s["n"], s["n"]]
            else:
                s["log_pi"] = new_w[i]
                reply_g = empty
            s["last_gradient"] = G[i]
            if self.eta is None and not self.m.shared_weights:
                s["grad_sq"] = float(gsq[i])
            s["alpha"] = lam * s["alpha"] + (1 - lam) * a0 + Nx[i]
            out.append(({"N": empty, "S1": empty, "S2": empty, "g": reply_g}, s))
        return out

    def _draws(self, means, cov, states, Xs, inner_logw, rngs):
        if self.m.grad_source == "empirical":
            return np.concatenate(Xs), np.cumsum([0] + [len(X) for X in Xs[:-1]])
        M, d = means.shape
        ct = self.m.covariance_type
        chol = np.linalg.cholesky(full_covariances(cov, self.ct, M, d)) if ct in ("full", "tied") else None
        sd = (
            None if chol is not None else np.sqrt(np.broadcast_to(cov[:, None] if cov.ndim == 1 else cov, (M, d)))
        )  # identity / spherical / diag: scale normals
        Zs = []
        for i, (s, rng) in enumerate(zip(states, rngs)):
            S = self.m.n_mc or s["n"]
            lw = inner_logw if inner_logw.ndim == 1 else inner_logw[i]
            p = np.exp(lw - lse(lw))
            z = rng.choice(M, size=S, p=p / p.sum())
            eps = rng.standard_normal((S, d))
            if chol is None:
                Zs.append(means[z] + sd[z] * eps)
            else:  # one product per component, not one d x d factor per draw
                Z = means[z].copy()
                for j in np.unique(z):
                    Z[z == j] += eps[z == j] @ chol[j].T
                Zs.append(Z)
        return np.concatenate(Zs), np.cumsum([0] + [len(Z) for Z in Zs[:-1]])
