"""The Cox partial likelihood from risk-set sums (the arithmetic the exchanges share).

At the ``m`` event times ``t_k`` (sorted), with ``e_j = exp(x_j'b)``:

* ``S0_k = sum_{T_j >= t_k} e_j`` and ``S1_k = sum_{T_j >= t_k} e_j x_j`` (the risk set's sums),
* ``D0_k``, ``D1_k``: the same over the rows with an event at ``t_k`` (Efron's ties only),
* ``d_k``: the number of events at ``t_k``.

Efron's approximation takes, for the ``l``-th of the ``d_k`` tied events (``l = 0 .. d_k - 1``,
``c = l / d_k``), the denominator ``phi = S0_k - c D0_k``; Breslow's takes ``c = 0``. Then

* log-likelihood ``sum_events x'b - sum_{k,l} log phi``,
* score ``sum_events x - sum_{k,l} (S1_k - c D1_k) / phi``,
* information ``sum_{k,l} [(S2_k - c D2_k) / phi - psi psi' / phi^2]`` with ``psi = S1_k - c D1_k``.

The ``S2`` and ``D2`` parts are per-row sums weighted by scalars of the event times
(:func:`second_moment`): a client computes them given ``A1_k = sum_l 1/phi`` and
``B1_k = sum_l c/phi``, so no ``p x p`` matrix per event time travels. A client with its own
event times (one stratum) computes everything itself (:func:`stratum_terms`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "risk_sums", "time_weights", "event_means", "second_moment", "stratum_terms", "score_residuals", "Terms",
    "risk_table", "logrank_terms",
]  # fmt: skip


def _revcumsum(a: np.ndarray) -> np.ndarray:
    return np.flip(np.cumsum(np.flip(a, axis=0), axis=0), axis=0)


def at_times(time: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each row, the index of the last event time at or before its time (-1: none): the row
    is at risk at the event times ``0 .. index``."""
    return np.searchsorted(times, time, side="right") - 1


def risk_sums(
    time: np.ndarray, event: np.ndarray, X: np.ndarray, beta: np.ndarray, times: np.ndarray, ties: bool
) -> dict[str, np.ndarray]:
    """A client's ``S0`` ``(m,)``, ``S1`` ``(m, p)`` and, with ``ties`` (Efron), ``D0``, ``D1`` at
    the event ``times`` (empty arrays without)."""
    m, p = len(times), X.shape[1]
    idx = at_times(time, times)
    ok = idx >= 0
    e = np.exp(X @ beta)
    ex = X * e[:, None]
    s0 = _revcumsum(np.bincount(idx[ok], e[ok], minlength=m))
    s1 = _revcumsum(np.stack([np.bincount(idx[ok], ex[ok, c], minlength=m) for c in range(p)], axis=1).reshape(m, p))
    if not ties:
        return {"s0": s0, "s1": s1, "d0": np.zeros(0), "d1": np.zeros((0, p))}
    dead = event & ok
    d0 = np.bincount(idx[dead], e[dead], minlength=m)
    d1 = np.stack([np.bincount(idx[dead], ex[dead, c], minlength=m) for c in range(p)], axis=1).reshape(m, p)
    return {"s0": s0, "s1": s1, "d0": d0, "d1": d1}


class Terms(NamedTuple):
    """The server's part at one ``b``: the log-likelihood's event-time part ``-sum log phi``,
    the score's ``-sum psi/phi``, the information's outer-product part ``sum psi psi'/phi^2``,
    and the weights of :func:`second_moment` (``A1``, ``B1``)."""

    ll: float
    score: np.ndarray
    outer: np.ndarray
    a1: np.ndarray
    b1: np.ndarray


def time_weights(sums: dict[str, np.ndarray], d: np.ndarray, efron: bool) -> Terms:
    """:class:`Terms` from the summed :func:`risk_sums` and the event counts ``d`` ``(m,)``."""
    s0, s1 = sums["s0"], sums["s1"]
    m, p = s1.shape
    di = d.astype(np.int64)
    rep = np.repeat(np.arange(m), di)
    if efron:
        start = np.cumsum(di) - di
        c = (np.arange(len(rep)) - start[rep]) / di[rep]
        phi = s0[rep] - c * sums["d0"][rep]
    else:
        c = np.zeros(len(rep))
        phi = s0[rep]
    inv, inv2 = 1 / phi, 1 / phi**2
    a1, b1 = np.bincount(rep, inv, minlength=m), np.bincount(rep, c * inv, minlength=m)
    a2, b2, c2 = (np.bincount(rep, w, minlength=m) for w in (inv2, c * inv2, c * c * inv2))
    ll = -float(np.sum(np.log(phi)))
    score = -(s1 * a1[:, None]).sum(axis=0)
    outer = np.einsum("k,ki,kj->ij", a2, s1, s1)
    if efron:
        d1 = sums["d1"]
        score = score + (d1 * b1[:, None]).sum(axis=0)
        sd = np.einsum("k,ki,kj->ij", b2, s1, d1)
        outer = outer - sd - sd.T + np.einsum("k,ki,kj->ij", c2, d1, d1)
    return Terms(ll, score, outer, a1, b1)


def event_means(sums: dict[str, np.ndarray], t: Terms, d: np.ndarray, efron: bool) -> np.ndarray:
    """The risk sets' weighted means that each event's Schoenfeld residual is taken from, ``(m, p)``:
    ``sum_l psi / phi`` over the ``d`` tied events, divided by ``d`` (Breslow's: ``S1 / S0``)."""
    wm = sums["s1"] * t.a1[:, None] - (sums["d1"] * t.b1[:, None] if efron else 0.0)
    return wm / d[:, None]


def second_moment(
    time: np.ndarray,
    event: np.ndarray,
    X: np.ndarray,
    beta: np.ndarray,
    times: np.ndarray,
    a1: np.ndarray,
    b1: np.ndarray,
) -> np.ndarray:
    """``sum_k (A1_k S2_k - B1_k D2_k)``: a client's rows' ``e x x'`` weighted by the ``A1`` of
    the event times they are at risk at, less the ``B1`` of their own event time."""
    idx = at_times(time, times)
    ok = idx >= 0
    cum = np.cumsum(a1)
    r = np.zeros(len(time))
    r[ok] = np.exp(X[ok] @ beta) * (cum[idx[ok]] - np.where(event[ok], b1[idx[ok]], 0.0))
    return (X * r[:, None]).T @ X


def event_times(time: np.ndarray, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct event times of rows and the number of events at each."""
    return np.unique(time[event], return_counts=True)


def stratum_terms(
    time: np.ndarray, event: np.ndarray, X: np.ndarray, beta: np.ndarray, efron: bool
) -> tuple[float, np.ndarray, np.ndarray]:
    """One stratum's log partial likelihood, score and information at ``beta`` (all its rows
    and event times its own)."""
    times, d = event_times(time, event)
    p = X.shape[1]
    if len(times) == 0:
        return 0.0, np.zeros(p), np.zeros((p, p))
    xd = X[event].sum(axis=0)
    t = time_weights(risk_sums(time, event, X, beta, times, efron), d, efron)
    info = second_moment(time, event, X, beta, times, t.a1, t.b1) - t.outer
    return float(xd @ beta) + t.ll, xd + t.score, info


def score_residuals(
    time: np.ndarray,
    event: np.ndarray,
    X: np.ndarray,
    beta: np.ndarray,
    times: np.ndarray,
    mean: np.ndarray,
    hazard: np.ndarray,
) -> np.ndarray:
    """Each row's score residual (Lin and Wei; statsmodels' ``PHReg.score_residuals``, the
    Breslow increments of the hazard whatever the ties): ``delta_j (x_j - a(T_j)) - e_j sum_{t_k
    <= T_j} h_k (x_j - a(t_k))``, given the risk sets' weighted means ``a`` ``(m, p)`` and the
    hazard increments ``h = d / S0`` at the event ``times``."""
    idx = at_times(time, times)
    ok = idx >= 0
    out = np.zeros_like(X)
    if not ok.any():
        return out
    ch = np.cumsum(hazard)
    cq = np.cumsum(hazard[:, None] * mean, axis=0)
    e = np.exp(X[ok] @ beta)
    out[ok] = -e[:, None] * (X[ok] * ch[idx[ok], None] - cq[idx[ok]])
    dead = event & ok
    out[dead] += X[dead] - mean[idx[dead]]
    return out


def risk_table(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From counts ``(m, 2 G)`` (events, censored per group) at sorted times: the events ``d``
    and the numbers at risk ``n`` (rows whose time is at or after the time), each ``(m, G)``."""
    ev, cen = counts[:, 0::2], counts[:, 1::2]
    leaving = ev + cen
    n = leaving.sum(axis=0) - np.cumsum(leaving, axis=0) + leaving
    return ev, n


def logrank_terms(d: np.ndarray, n: np.ndarray, p: float = 0.0, q: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Observed minus expected events per group and their covariance (``G x G``), weighted by
    ``S(t-)^p (1 - S(t-))^q`` (S: the Kaplan-Meier curve of all the rows; 0, 0: the log-rank
    test), from events ``d`` and numbers at risk ``n`` ``(m, G)`` (lifelines' and R's survdiff)."""
    D, N = d.sum(axis=1), n.sum(axis=1)
    ok = N > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.cumprod(np.where(ok, 1 - D / np.where(ok, N, 1), 1.0))
        w = np.ones_like(D)
        if p or q:
            s_left = np.r_[1.0, s[:-1]]
            w = s_left**p * (1 - s_left) ** q
        share = np.where(ok[:, None], n / np.where(ok, N, 1)[:, None], 0.0)
        factor = np.where(N > 1, (N - D) / np.where(N > 1, N - 1, 1), 1.0) * D
    o_e = (w[:, None] * (d - D[:, None] * share)).sum(axis=0)
    a = (w**2 * factor)[:, None] * share
    v = np.diag(a.sum(axis=0)) - np.einsum("ki,kj->ij", a, share)
    return o_e, v
