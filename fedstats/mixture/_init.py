"""Federated initialisation of a Gaussian mixture (spec fedem.md §1.8.3, option 1 + 3).

1. Each client runs k-means++ and Lloyd on its own rows and sends ``min(M, n_c)`` centres
   with their cluster sizes (never rows).
2. The server runs weighted k-means++/Lloyd on the pooled centres, ``n_init`` times with
   different seeds: ``n_init`` candidate sets of means.
3. One round of hard-assignment statistics per candidate gives each candidate's
   covariances (a federated M-step, as scikit-learn's k-means initialisation does).
4. One round scores every candidate by the federated log-likelihood (uniform weights);
   the best candidate starts EM.

Every step is a one-round :class:`_OneShot` algorithm run by the ordinary runtime, so
the bytes are counted like any other round.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..federation import FederatedAlgorithm, run
from ._gmm import COV_TYPES, e_step, log_gaussian, m_step, precision_cholesky, reshift, segment_statistics


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
        d2 = np.minimum(d2, _sq_dist(X, X[i:i + 1])[:, 0])
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


class _OneShot(FederatedAlgorithm):
    """A single round: broadcast ``payload``, each client answers ``client_fn(payload, X, rng)``."""

    def __init__(self, keys: tuple[str, ...], payload: dict, client_fn: Callable):
        self.reply_keys = keys
        self.payload = payload
        self.client_fn = client_fn

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return self.payload

    def client_step(self, message, state, data, rng):
        return self.client_fn(message, np.asarray(data.X), rng), state

    def server_step(self, server_state, replies, round):
        return dict(replies), {}


# ------------------------------------------------------------------ client functions
def _local_centres(msg, X, rng):
    k = min(int(msg["k"][0]), X.shape[0])
    C, _, sizes = kmeans(X, k, rng)
    live = sizes > 0
    return {"centres": C[live], "sizes": sizes[live]}


def _hard_stats(msg, X, rng):
    cands = msg["candidates"]  # (R, M, d)
    cov_type = COV_TYPES[int(msg["cov_type"][0])]
    N, S1, S2 = [], [], []
    for means in cands:
        lab = np.argmin(_sq_dist(X, means), axis=1)
        resp = np.zeros((X.shape[0], means.shape[0]))
        resp[np.arange(X.shape[0]), lab] = 1.0
        zero = np.zeros(X.shape[0])
        n_, s1, s2, _, _ = segment_statistics(X, resp, zero, zero, [0], means, cov_type)
        N.append(n_[0]), S1.append(s1[0]), S2.append(s2[0])
    return {"N": np.array(N), "S1": np.array(S1), "S2": np.array(S2)}


def _score(msg, X, rng):
    cov_type = COV_TYPES[int(msg["cov_type"][0])]
    M = msg["means"].shape[1]
    out = []
    for means, cov in zip(msg["means"], msg["covariances"]):
        ld = log_gaussian(X, means, precision_cholesky(cov, cov_type), cov_type)
        out.append(e_step(ld, np.full(M, -np.log(M)))[1].sum())
    return {"loglik": np.array(out)}


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

    ``info`` holds the candidates' log-likelihoods and the bytes of the three init rounds.
    """
    M = n_components
    ct = np.array([COV_TYPES.index(cov_type)])
    r1 = run(_OneShot(("centres", "sizes"), {"k": np.array([M])}, _local_centres), data, rounds=1,
             seed=seed, progress=False, batched=False)
    reps = r1.server_state
    centres = np.concatenate([reps[c]["centres"] for c in data.clients])
    sizes = np.concatenate([reps[c]["sizes"] for c in data.clients])
    if centres.shape[0] < M:
        raise ValueError(f"the federation holds only {centres.shape[0]} distinct local centres, fewer than "
                         f"n_components={M}")
    srng = np.random.default_rng([seed, 7919])
    cands = np.stack([kmeans(centres, M, srng, sizes)[0] for _ in range(n_init)])
    r2 = run(_OneShot(("N", "S1", "S2"), {"candidates": cands, "cov_type": ct}, _hard_stats), data,
             rounds=1, seed=seed, progress=False, batched=False)
    N = sum(r2.server_state[c]["N"] for c in data.clients)
    S1 = sum(r2.server_state[c]["S1"] for c in data.clients)
    S2 = sum(r2.server_state[c]["S2"] for c in data.clients)
    means_l, cov_l = [], []
    for r in range(n_init):
        fallback = _pooled_cov(N[r], S1[r], S2[r], cands[r], cov_type, reg_covar)
        mu, cov, _ = m_step(N[r], S1[r], S2[r], cands[r], cov_type, reg_covar, prev_means=cands[r],
                            prev_cov=fallback, min_count=1.0)
        means_l.append(mu), cov_l.append(cov)
    means_a, cov_a = np.stack(means_l), np.stack(cov_l)
    r3 = run(_OneShot(("loglik",), {"means": means_a, "covariances": cov_a, "cov_type": ct}, _score), data,
             rounds=1, seed=seed, progress=False, batched=False)
    ll = sum(r3.server_state[c]["loglik"] for c in data.clients)
    best = int(np.argmax(ll))
    comm = [r1.communication, r2.communication, r3.communication]
    info = {"candidate_loglik": ll, "best": best, "bytes_up": sum(c.bytes_up for c in comm),
            "bytes_down": sum(c.bytes_down for c in comm)}
    return means_a[best], cov_a[best], info
