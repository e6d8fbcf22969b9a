"""Federated initialisation of a Gaussian mixture (not in the FedEM thesis): clients' k-means
centres merged on the server, then federated Lloyd steps.

1. Each client runs k-means++ and Lloyd on its own rows and sends at most ``M`` centres
   with their cluster sizes (if fewer than ``M`` arrive in all, the round is repeated with
   ``2M``, then ``4M`` local clusters). Every centre is the mean of at least ``d + 1`` of its rows
   (smaller clusters are dissolved into the others), so no centre is a raw row; a client
   with fewer than ``d + 1`` rows sends nothing in this step.
2. The server runs weighted k-means++/Lloyd on the pooled centres, ``n_init`` times with
   different seeds: ``n_init`` candidate sets of means.
3. One round of hard-assignment statistics per candidate gives each candidate's
   covariances (a federated M-step, as scikit-learn's k-means initialisation does); a
   component with fewer than ``d + 1`` points gets the pooled covariance instead of a
   singular one.
4. One round scores every candidate by the federated log-likelihood (uniform weights);
   the best candidate starts EM.

Every step is a one-round :class:`~fedstats.federation.oneshot.OneShot` algorithm run by the ordinary runtime, so
the bytes are counted like any other round; every client must answer (a failure raises).
Steps 3 and 4 declare their replies summed (:class:`OneShotSums`): the server gets only the
totals. Step 1 cannot: the server seeds k-means++ with individual centres, and a client sends
as many centres as it has clusters.
"""

from __future__ import annotations

import numpy as np

from .. import streams
from ..data import DataError
from ..federation.oneshot import one_shot, one_shot_sums
from ..federation.protocol import client_function
from .gmm import COV_TYPES, centre, e_step, log_gaussian, m_step, precision_cholesky, reshift, segment_statistics


def _sq_dist(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    d2 = np.sum(X**2, 1)[:, None] - 2 * X @ C.T + np.sum(C**2, 1)[None, :]
    return np.maximum(d2, 0.0)


def kmeans_pp(X: np.ndarray, k: int, rng: np.random.Generator, weights: np.ndarray | None = None) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii), with optional point weights."""
    n = X.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, float)
    idx = [int(rng.choice(n, p=w / w.sum()))]
    d2 = _sq_dist(X, X[idx])[:, 0]
    for _ in range(1, k):
        p = w * d2
        tot = p.sum()
        i = int(rng.choice(n, p=p / tot)) if tot > 0 else int(rng.choice(n, p=w / w.sum()))
        idx.append(i)
        d2 = np.minimum(d2, _sq_dist(X, X[i : i + 1])[:, 0])
    return X[idx].copy()


def lloyd(X: np.ndarray, centres: np.ndarray, weights: np.ndarray | None = None, iters: int = 50):
    """Weighted Lloyd iterations; an empty cluster keeps its centre. Returns (centres, labels, sizes)."""
    w = np.ones(X.shape[0]) if weights is None else np.asarray(weights, float)
    C = centres.copy()
    labels = np.full(X.shape[0], -1)
    for _ in range(iters):
        new = np.argmin(_sq_dist(X, C), axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
        sizes = np.bincount(labels, weights=w, minlength=len(C))
        sums = np.zeros_like(C)
        np.add.at(sums, labels, w[:, None] * X)
        live = sizes > 0
        C[live] = sums[live] / sizes[live, None]
    sizes = np.bincount(labels, weights=w, minlength=len(C))
    return C, labels, sizes


def kmeans(X, k, rng, weights=None, iters=50):
    return lloyd(X, kmeans_pp(X, k, rng, weights), weights, iters)


# ------------------------------------------------------------------ client functions
@client_function
def _local_centres(msg, X, rng, _private=None):
    """At most ``k`` local k-means centres, each the mean of at least ``min_size`` rows.

    Clusters smaller than ``min_size`` are dissolved (Lloyd re-run without their centres),
    so no centre is a raw row; a client with fewer than ``min_size`` rows sends nothing. The
    client holds ``min_size`` to at least ``d + 1`` whatever the server asks.
    """
    m = max(int(msg["min_size"][0]), X.shape[1] + 1)
    k = min(int(msg["k"][0]), X.shape[0] // m)
    if k == 0:
        return {"centres": np.zeros((0, X.shape[1])), "sizes": np.zeros(0)}
    g = X.mean(0)
    C, _, sizes = kmeans(X - g, k, rng)
    while np.any(sizes < m):  # the largest cluster has >= n / k >= m rows, so this ends
        C, _, sizes = lloyd(X - g, C[sizes >= m])
    return {"centres": C + g, "sizes": sizes}


@client_function
def _hard_stats(msg, X, rng, _private=None):
    cands = msg["candidates"]  # (R, M, d)
    cov_type = COV_TYPES[int(msg["cov_type"][0])]
    N, S1, S2 = [], [], []
    for means in cands:
        Xg, mg, _ = centre(X, means)
        lab = np.argmin(_sq_dist(Xg, mg), axis=1)
        resp = np.zeros((X.shape[0], means.shape[0]))
        resp[np.arange(X.shape[0]), lab] = 1.0
        zero = np.zeros(X.shape[0])
        n_, s1, s2, _, _ = segment_statistics(Xg, resp, zero, zero, [0], mg, cov_type)
        N.append(n_[0]), S1.append(s1[0]), S2.append(s2[0])
    return {"N": np.array(N), "S1": np.array(S1), "S2": np.array(S2)}


@client_function
def _score(msg, X, rng, log_weights=None):
    """Log-likelihood of the client's rows under each candidate (its own weights, or uniform).
    The client also keeps it (its new private state), for a result that reports it per client."""
    cov_type = COV_TYPES[int(msg["cov_type"][0])]
    M = msg["means"].shape[1]
    lw = np.full(M, -np.log(M)) if log_weights is None else log_weights
    out = []
    for means, cov in zip(msg["means"], msg["covariances"]):
        Xg, mg, _ = centre(X, means)
        out.append(e_step(log_gaussian(Xg, mg, precision_cholesky(cov, cov_type), cov_type), lw)[1].sum())
    return {"loglik": np.array(out)}, np.array(out)


def federated_loglik(data, means, cov, cov_type, log_weights, seed=0):
    """One round: the federated log-likelihood at ``(means, cov)``, each client with its own
    log-weights (dict client -> (M,)). Returns a dict client -> log-likelihood.

    The reply is summed; each client's own value comes from its final state, as its weights
    do (the server step sees only the total)."""
    payload = {"means": means[None], "covariances": cov[None], "cov_type": np.array([COV_TYPES.index(cov_type)])}
    _, held = one_shot_sums(
        data, ("loglik",), ("loglik",), payload, _score, seed=seed, what="the scoring round", private=log_weights
    )
    return {c: float(held[c][0]) for c in data.clients if c in held}


def hard_covariances(data, means, cov_type, reg_covar, seed=0):
    """Covariances at given means from one round of hard-assignment statistics (a
    component with fewer than ``d + 1`` points gets the pooled covariance)."""
    keys = ("N", "S1", "S2")
    reps, _ = one_shot_sums(
        data,
        keys,
        keys,
        {"candidates": means[None], "cov_type": np.array([COV_TYPES.index(cov_type)])},
        _hard_stats,
        seed=seed,
        what="the covariance initialisation",
    )
    N, S1, S2 = (reps.sums[k][0] for k in keys)
    return _typed_m_step(N, S1, S2, means, cov_type, reg_covar)


def _typed_m_step(N, S1, S2, means, cov_type, reg_covar):
    d = means.shape[1]
    fallback = _pooled_cov(N, S1, S2, means, cov_type, reg_covar)
    return m_step(N, S1, S2, means, cov_type, reg_covar, prev_means=means, prev_cov=fallback, min_count=float(d + 1))[1]


def _pooled_cov(N, S1, S2, shift, cov_type, reg_covar):
    """Covariance of all points (every component's hard statistics pooled), typed."""
    tot = N.sum()
    centre = (shift * N[:, None] + S1).sum(0) / tot
    S1c, S2c = reshift(N, S1, S2, shift, np.broadcast_to(centre, shift.shape), cov_type)
    d = shift.shape[1]
    if cov_type in ("full", "tied"):
        cov = S2c.sum(0) / tot + reg_covar * np.eye(d)
        return cov if cov_type == "tied" else np.broadcast_to(cov, (len(N), d, d)).copy()
    if cov_type == "diag":
        return np.broadcast_to(S2c.sum(0) / tot + reg_covar, (len(N), d)).copy()
    return np.full(len(N), S2c.sum() / tot / d + reg_covar)


def federated_kmeans_init(data, n_components, cov_type, reg_covar, n_init, seed):
    """Run the four steps above; returns ``(means, covariances, info)``.

    ``info`` holds the candidates' log-likelihoods and the index of the best.
    """
    M, d = n_components, data.n_features
    ct = np.array([COV_TYPES.index(cov_type)])
    min_size = d + 1
    for k in (M, 2 * M, 4 * M):  # ask for more local clusters when small ones dissolved too many
        reps, _ = one_shot(
            data,
            ("centres", "sizes"),
            {"k": np.array([k]), "min_size": np.array([min_size])},
            _local_centres,
            seed=seed,
            what="the k-means initialisation",
        )
        # the clients that answered, in the data's order (in a fit, one that failed has dropped out)
        centres = np.concatenate([reps[c]["centres"] for c in data.clients if c in reps])
        sizes = np.concatenate([reps[c]["sizes"] for c in data.clients if c in reps])
        if centres.shape[0] >= M:
            break
    if centres.shape[0] < M:
        raise DataError(
            f"the federated k-means start got {centres.shape[0]} local centres (each the mean of at "
            f"least d + 1 = {min_size} rows of one client), fewer than n_components={M}; "
            "give means_init or fewer components"
        )
    srng = streams.stream(seed, "mixture start")
    g = np.average(centres, axis=0, weights=sizes)
    cands = np.stack([kmeans(centres - g, M, srng, sizes)[0] + g for _ in range(n_init)])
    keys = ("N", "S1", "S2")
    reps, _ = one_shot_sums(
        data,
        keys,
        keys,
        {"candidates": cands, "cov_type": ct},
        _hard_stats,
        seed=seed,
        what="the k-means initialisation",
    )
    N, S1, S2 = (reps.sums[k] for k in keys)
    cov_a = np.stack([_typed_m_step(N[r], S1[r], S2[r], cands[r], cov_type, reg_covar) for r in range(n_init)])
    reps, _ = one_shot_sums(
        data,
        ("loglik",),
        ("loglik",),
        {"means": cands, "covariances": cov_a, "cov_type": ct},
        _score,
        seed=seed,
        what="the k-means initialisation",
    )
    ll = np.array(reps.sums["loglik"])
    best = int(np.argmax(ll))
    info = {"candidate_loglik": ll, "best": best}
    return cands[best], cov_a[best], info
