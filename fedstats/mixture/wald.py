"""Observed-information (Wald) intervals for a FedEM fit, federated by a Schur complement.

Not in the FedEM thesis. Parameters: the shared means ``theta = (mu_1, ..., mu_M)`` (the
covariances are held at their estimate) and each client's weights in log-ratio
coordinates ``eta_cl = log(pi_cl / pi_cM)``. The log-likelihood is a sum over clients, so
its information matrix is an *arrowhead*: ``J_tt = sum_c J^c_tt``, a block ``J^c_te`` per
client and nothing between two clients' weights. Hence

* each client sends only ``A_c = J^c_tt - J^c_te (J^c_ee)^{-1} J^c_et`` (P x P, P = M d),
  declared summed: the server receives only ``sum_c A_c``;
* the server inverts ``sum_c A_c``: the covariance of the means, exactly the means block
  of the inverse of the whole (pooled) information matrix;
* a second round sends that covariance back; each client forms its weights' covariance
  ``J_ee^{-1} + J_ee^{-1} J_et Cov(theta) J_te J_ee^{-1}`` on its own and sends nothing;
  intervals for ``pi_cj`` come from the delta method on the logit scale, so they stay
  inside (0, 1). (The simulator reads the clients' results to build the table.)

With ``shared_weights=True`` the weights are shared parameters: clients send their three
blocks (summed) and the server inverts the summed (P + L)-square matrix (L free weights); one
round.

All blocks are closed-form sums over points (no loop over points), checked against an
autodiff Hessian in the tests.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import expit

from ..federation.oneshot import one_shot
from ..federation.protocol import client_function
from ._init import one_shot_sums
from .gmm import COV_TYPES, centre, e_step, full_covariances, log_gaussian, precision_cholesky


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
    Xg, mg, _ = centre(X, means)
    r = e_step(log_gaussian(Xg, mg, precision_cholesky(cov, cov_type), cov_type), np.log(np.maximum(weights, 1e-300)))[
        0
    ]
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


def _blocks(msg, X, w):
    cov_type = COV_TYPES[int(msg["cov_type"][0])]
    return information_blocks(X, msg["means"], msg["covariances"], cov_type, w, free_weights(w))


@client_function
def _schur_reply(msg, X, rng, w):
    """Round 1 on a client holding weights ``w``: its Schur term (or, for shared weights,
    its three blocks)."""
    Jtt, Jte, Jee = _blocks(msg, X, w)
    if msg["shared"][0]:
        return {"A": Jtt, "Jte": Jte, "Jee": Jee}
    return {"A": Jtt - Jte @ np.linalg.solve(Jee, Jte.T) if Jee.size else Jtt}


@client_function
def _weights_cov(msg, X, rng, w):
    """Round 2 on a client: the covariance of its own log-ratio weights from its blocks and
    the broadcast ``Cov(theta)``. Nothing is sent in this round; the client keeps it as its
    state (which a remote run returns to the server at its end, for the result object)."""
    _, Jte, Jee = _blocks(msg, X, w)
    Jinv = np.linalg.inv(Jee) if Jee.size else Jee
    return {}, (w, Jinv + Jinv @ Jte.T @ msg["cov_means"] @ Jte @ Jinv)


def _logit_interval(p, sd_p, z):
    # delta method on the logit scale: sd(logit p) = sd(p) / (p (1 - p))
    lp = np.log(p) - np.log1p(-p)
    s = sd_p / (p * (1 - p))
    return expit(lp - z * s), expit(lp + z * s)


def wald_covariances(result, data, *, seed: int = 0) -> dict:
    """The Wald rounds of a :class:`~fedstats.mixture.GaussianMixtureResult` (two federated
    rounds; one with ``shared_weights``): ``{"cov_means": (Md x Md), "cov_eta": {client: its
    weights' covariance in log-ratio coordinates}}``. Raises ``numpy.linalg.LinAlgError``
    when the information is singular (a weight at 0, or components that cannot be told
    apart)."""
    if set(data.clients) != set(result.weights):
        raise ValueError("the Wald intervals need the fitted federation: data's clients differ from the fit's")
    M, d = result.means.shape
    shared = bool(result.shared_weights)
    payload = {
        "means": result.means,
        "covariances": result.covariances,
        "cov_type": np.array([COV_TYPES.index(result.covariance_type)]),
        "shared": np.array([int(shared)]),
    }
    what = "the Wald round"
    keys = ("A", "Jte", "Jee") if shared else ("A",)
    reps, _ = one_shot_sums(data, keys, keys, payload, _schur_reply, seed=seed, what=what, private=result.weights)
    tot = reps.sums
    Ptot = M * d
    if shared:
        cov_all = np.linalg.inv(np.block([[tot["A"], tot["Jte"]], [tot["Jte"].T, tot["Jee"]]]))
        return {"cov_means": cov_all[:Ptot, :Ptot], "cov_eta": {c: cov_all[Ptot:, Ptot:] for c in data.clients}}
    cov_t = np.linalg.inv(tot["A"])
    _, held = one_shot(
        data, (), dict(payload, cov_means=cov_t), _weights_cov, seed=seed, what=what, private=result.weights
    )
    return {"cov_means": cov_t, "cov_eta": {c: held[c][1] for c in data.clients}}


def means_table(result, cov_means, level: float) -> pd.DataFrame:
    """The shared means (``mean[j][feature]``) with Wald ``sd``, ``lower``, ``upper``."""
    z = stats.norm.ppf(0.5 + level / 2)
    M, d = result.means.shape
    sd = np.sqrt(np.diag(cov_means)).reshape(M, d)
    names = [f"mean[{j}][{f}]" for j in range(M) for f in result.feature_names]
    return pd.DataFrame(
        {
            "mean": result.means.ravel(),
            "sd": sd.ravel(),
            "lower": (result.means - z * sd).ravel(),
            "upper": (result.means + z * sd).ravel(),
        },
        index=pd.Index(names, name="parameter"),
    )


def weights_table(result, client, cov_eta, level: float) -> pd.DataFrame:
    """One client's weights (``weight[j]``) with Wald ``sd`` and logit-scale intervals (NaN
    for a weight estimated at 0)."""
    z = stats.norm.ppf(0.5 + level / 2)
    M = result.n_components
    pi = result.weights[client]
    # pi = softmax(eta) over the free coordinates: d pi_k / d eta_l = pi_k (delta_kl - pi_l)
    f = free_weights(pi)
    Jac = (np.diag(pi) - np.outer(pi, pi))[:, f]
    sd_pi = np.sqrt(np.maximum(np.diag(Jac @ cov_eta @ Jac.T), 0.0))
    lo, hi = _logit_interval(np.clip(pi, 1e-12, 1 - 1e-12), sd_pi, z)
    if M == 1:  # the weight is 1 by definition, not a parameter
        sd_pi, lo, hi = np.zeros(1), np.ones(1), np.ones(1)
    else:
        boundary = (pi < 1e-8) | (len(f) == 0)  # an MLE at 0 (or 1 because all others are): no interval
        sd_pi, lo, hi = (np.where(boundary, np.nan, v) for v in (sd_pi, lo, hi))
    return pd.DataFrame(
        {"mean": pi, "sd": sd_pi, "lower": lo, "upper": hi},
        index=pd.Index([f"weight[{j}]" for j in range(M)], name="parameter"),
    )
