"""Observed-information (Wald) intervals for a FedEM fit, federated by a Schur complement.

Spec fedem.md §4.2. Parameters: the shared means ``theta = (mu_1, ..., mu_M)`` (the
covariances are held at their estimate) and each client's weights in log-ratio
coordinates ``eta_cl = log(pi_cl / pi_cM)``. The log-likelihood is a sum over clients, so
its information matrix is an *arrowhead*: ``J_tt = sum_c J^c_tt``, a block ``J^c_te`` per
client and nothing between two clients' weights. Hence

* each client sends only ``A_c = J^c_tt - J^c_te (J^c_ee)^{-1} J^c_et`` (P x P, P = M d);
* the server inverts ``sum_c A_c``: the covariance of the means, exactly the means block
  of the inverse of the whole (pooled) information matrix;
* each client gets that covariance back and forms its weights' covariance
  ``J_ee^{-1} + J_ee^{-1} J_et Cov(theta) J_te J_ee^{-1}`` on its own; intervals for
  ``pi_cj`` come from the delta method on the logit scale, so they stay inside (0, 1).

With ``shared_weights=True`` the weights are shared parameters: clients send their three
blocks and the server inverts the summed (P + M - 1)-square matrix.

All blocks are closed-form sums over points (no loop over points), checked against an
autodiff Hessian in the tests.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import expit

from ..federation import FederatedAlgorithm, run
from ._gmm import COV_TYPES, e_step, full_covariances, log_gaussian, precision_cholesky


def free_weights(weights, tiny=1e-8):
    """The weight coordinates that are parameters: every component but the largest (the
    reference of the log-ratios) and those at the boundary (``pi < tiny``), whose weight is
    an MLE at 0 with no Wald interval."""
    w = np.asarray(weights)
    return [j for j in range(len(w)) if j != int(np.argmax(w)) and w[j] >= tiny]


def information_blocks(X, means, cov, cov_type, weights, free=None):
    """Observed information of one client's rows at ``(means, weights)``, covariances fixed.

    Returns ``(J_tt (Md, Md), J_te (Md, L), J_ee (L, L))`` for ``theta`` = the means
    (component-major) and ``eta_l = log(pi_l / pi_ref)`` for ``l`` in ``free`` (default:
    all but the last component, which is then the reference).
    """
    n, d = X.shape
    M = means.shape[0]
    P = np.linalg.inv(full_covariances(cov, cov_type, M, d))  # (M, d, d) precisions
    r = e_step(log_gaussian(X, means, precision_cholesky(cov, cov_type), cov_type), np.log(np.maximum(weights, 1e-300)))[0]
    u = np.einsum("mde,nme->nmd", P, X[:, None, :] - means[None])  # u_ij = P_j (x_i - mu_j)
    G = (r[:, :, None] * u).reshape(n, M * d)
    Jtt = G.T @ G
    for j in range(M):
        s = slice(j * d, (j + 1) * d)
        Jtt[s, s] += r[:, j].sum() * P[j] - (r[:, j, None] * u[:, j]).T @ u[:, j]
    # d score_mu_j / d eta_l = sum_i r_ij (delta_jl - r_il) u_ij
    f = list(range(M - 1)) if free is None else list(free)
    L = len(f)
    rf = r[:, f]
    Hte = np.einsum("nj,njl,njd->jdl", r, np.eye(M)[None, :, f] - rf[:, None, :], u).reshape(M * d, L)
    pi = np.asarray(weights, float)[f]
    Hee = (np.diag(rf.sum(0)) - rf.T @ rf) - n * (np.diag(pi) - np.outer(pi, pi))
    return Jtt, -Hte, -Hee


def _schur_reply(msg, X, rng):
    cov_type = COV_TYPES[int(msg["cov_type"][0])]
    w = msg["weights"]
    Jtt, Jte, Jee = information_blocks(X, msg["means"], msg["covariances"], cov_type, w, free_weights(w))
    if msg["shared"][0]:
        return {"A": Jtt, "Jte": Jte, "Jee": Jee}
    A = Jtt - Jte @ np.linalg.solve(Jee, Jte.T) if Jee.size else Jtt
    return {"A": A, "Jte": np.zeros((0,)), "Jee": np.zeros((0,))}


class _WaldRound(FederatedAlgorithm):
    """One round: each client (holding its own fitted weights) sends its Schur term."""

    reply_keys = ("A", "Jte", "Jee")

    def __init__(self, payload, weights):
        self.payload, self.weights = payload, weights

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return np.asarray(self.weights[client])  # the client's own weights, kept on the client

    def broadcast(self, server_state, client, round):
        return self.payload

    def client_step(self, message, state, data, rng):
        return _schur_reply(dict(message, weights=state), np.asarray(data.X), rng), state

    def server_step(self, server_state, replies, round):
        return dict(replies), {}


def _logit_interval(p, sd_p, z):
    # delta method on the logit scale: sd(logit p) = sd(p) / (p (1 - p))
    lp = np.log(p) - np.log1p(-p)
    s = sd_p / (p * (1 - p))
    return expit(lp - z * s), expit(lp + z * s)


def wald_intervals(result, data, *, level: float = 0.95, seed: int = 0):
    """Wald intervals of a :class:`~fedstats.mixture.GaussianMixtureResult` (one federated round).

    Returns ``(means_table, weights_table, info)``: the means with ``sd``, ``lower``,
    ``upper``; every client's weights likewise (a ``client`` column), each computed on its
    client; ``info`` holds ``cov_means`` (Md x Md) and the bytes of the round.
    Raises ``numpy.linalg.LinAlgError`` when the information is singular (a weight at 0,
    or components that cannot be told apart).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    M, d = result.means_.shape
    z = stats.norm.ppf(0.5 + level / 2)
    shared = bool(result.shared_weights)
    payload = {"means": result.means_, "covariances": result.covariances_,
               "cov_type": np.array([COV_TYPES.index(result.covariance_type)]), "shared": np.array([int(shared)])}

    r = run(_WaldRound(payload, result.weights_), data, rounds=1, seed=seed, progress=False, batched=False)
    replies = r.server_state
    Ptot = M * d
    if shared:
        L = len(free_weights(result.weights_[data.clients[0]]))
        J = np.zeros((Ptot + L, Ptot + L))
        for r in replies.values():
            J[:Ptot, :Ptot] += r["A"]
            J[:Ptot, Ptot:] += r["Jte"]
            J[Ptot:, :Ptot] += r["Jte"].T
            J[Ptot:, Ptot:] += r["Jee"]
        cov_all = np.linalg.inv(J)
        cov_t = cov_all[:Ptot, :Ptot]
        cov_eta = {c: cov_all[Ptot:, Ptot:] for c in data.clients}
    else:
        cov_t = np.linalg.inv(sum(r["A"] for r in replies.values()))
        cov_eta = {}
        for c in data.clients:  # on the client: its own blocks and the broadcast Cov(theta)
            w = result.weights_[c]
            _, Jte, Jee = information_blocks(np.asarray(data[c].X), result.means_, result.covariances_,
                                             result.covariance_type, w, free_weights(w))
            Jinv = np.linalg.inv(Jee) if Jee.size else Jee
            cov_eta[c] = Jinv + Jinv @ Jte.T @ cov_t @ Jte @ Jinv
    sd = np.sqrt(np.diag(cov_t)).reshape(M, d)
    names = [f"mean[{j}][{f}]" for j in range(M) for f in result.feature_names]
    means_table = pd.DataFrame({"mean": result.means_.ravel(), "sd": sd.ravel(),
                                "lower": (result.means_ - z * sd).ravel(), "upper": (result.means_ + z * sd).ravel()},
                               index=pd.Index(names, name="name"))
    rows = []
    for c in data.clients:
        pi = result.weights_[c]
        # pi = softmax(eta) over the free coordinates: d pi_k / d eta_l = pi_k (delta_kl - pi_l)
        f = free_weights(pi)
        Jac = (np.diag(pi) - np.outer(pi, pi))[:, f]
        sd_pi = np.sqrt(np.maximum(np.diag(Jac @ cov_eta[c] @ Jac.T), 0.0))
        lo, hi = _logit_interval(np.clip(pi, 1e-12, 1 - 1e-12), sd_pi, z)
        boundary = (pi < 1e-8) | (len(f) == 0)  # an MLE at 0 (or 1 because all others are): no Wald interval
        sd_pi, lo, hi = (np.where(boundary, np.nan, v) for v in (sd_pi, lo, hi))
        for j in range(M):
            rows.append({"client": c, "name": f"weight[{j}]", "mean": pi[j], "sd": sd_pi[j], "lower": lo[j],
                         "upper": hi[j]})
    info = {"cov_means": cov_t, "cov_eta": cov_eta, "bytes_up": int(r.communication.bytes_up),
            "bytes_down": int(r.communication.bytes_down)}
    return means_table, pd.DataFrame(rows), info
