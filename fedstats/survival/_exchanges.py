"""The exchanges of :mod:`fedstats.survival`. Every reply array is declared summed: under secure
aggregation the server receives only sums over the clients, never one client's count or sum.

* :class:`_TimeCounts`: the distinct times (or event times) of the rows and how many rows of each
  group have an event, or are censored, at each: the interval search of
  :class:`~fedstats.stats._rounds._DistinctValues` on the float64 order (at most 17 rounds);
* :class:`_BinnedCounts`: the same on public bins (one round; the server learns no exact time);
* :class:`_CoxCheck`: rows, events, the predictors' sums and cross-products (to centre them and
  name a constant or collinear one), the events' predictor sums;
* :class:`_Leaving`: how many rows leave the risk set between consecutive event times (the
  groups whose sums the risk-set sums set apart: the disclosure rule checks them first);
* :class:`_CoxNewton`: Newton's method on the pooled partial likelihood, two rounds a step:
  the risk-set sums at the event times, then the information's second-moment part;
* :class:`_CoxStrata`: the same with every client its own stratum (its own baseline hazard): a
  client sends its partial likelihood's value, score and information, one round a step;
* :class:`_CoxScores`: the sum of the rows' score-residual outer products (robust errors);
* :class:`_LogRankStrata`: each client's log-rank observed-minus-expected and variance (the
  stratified test: no time leaves a client).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..federation.protocol import ClientId, FederatedAlgorithm, Message
from ..stats._columns import data_key
from ..stats._rounds import _DistinctValues, _SumRound
from ._data import SurvivalColumns
from ._partial import (
    event_means,
    event_times,
    logrank_terms,
    risk_sums,
    risk_table,
    score_residuals,
    second_moment,
    stratum_terms,
    time_weights,
)

__all__ = ["NEWTON_TOL"]

#: Newton stops when no coefficient would move by more than this (in the predictors' units)
NEWTON_TOL = 1e-9
#: most step halvings in one Newton step (the log partial likelihood is concave: rarely any)
MAX_HALVINGS = 30


class _TimeCounts(_DistinctValues):
    """The distinct times of the rows and, at each, per level of the group, how many rows have
    an event and (unless ``events_only``) how many are censored: ``found_counts`` of shape
    ``(m, G * 2)`` (events of group g in column ``2 g``, censored in ``2 g + 1``) or ``(m, G)``."""

    def __init__(self, spec: SurvivalColumns, events_only: bool = False) -> None:
        self.spec, self.events_only = spec, bool(events_only)
        self.column, self.group, self.require = None, spec.group, ()  # type: ignore[assignment]

    @property
    def n_groups(self) -> int:
        G = 1 if self.spec.group is None else self.spec.group.n_categories
        return G if self.events_only else 2 * G

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> list[np.ndarray]:
        r = self.spec.rows(data, client)
        G = 1 if self.spec.group is None else self.spec.group.n_categories
        kinds = (True,) if self.events_only else (True, False)
        return [np.sort(data_key(r.time[(r.group == g) & (r.event == k)])) for g in range(G) for k in kinds]


class _BinnedCounts(_SumRound, FederatedAlgorithm):
    """Per bin edge (the rows' times coarsened to the edges on the client), per group level,
    events and censored rows: ``counts`` ``(n_edges, G * 2)``."""

    reply_keys = summed_keys = count_keys = ("counts",)

    def __init__(self, spec: SurvivalColumns) -> None:
        self.spec = spec

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        edges = np.asarray(self.spec.bins)
        G = 1 if self.spec.group is None else self.spec.group.n_categories
        at = np.searchsorted(edges, r.time)
        col = 2 * r.group + (~r.event).astype(np.int64)
        flat = np.bincount(at * 2 * G + col, minlength=len(edges) * 2 * G)
        return {"counts": flat.reshape(len(edges), 2 * G).astype(float)}


class _CoxCheck(_SumRound, FederatedAlgorithm):
    """One round: rows, events, the predictors' sums ``sx`` and cross-products ``sxx``, and the
    events' predictor sums ``xd``."""

    reply_keys = summed_keys = ("rows", "events", "sx", "sxx", "xd")
    count_keys = ("rows", "events")

    def __init__(self, spec: SurvivalColumns) -> None:
        self.spec = spec

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        return {
            "rows": np.array([len(r.time)]),
            "events": np.array([r.event.sum()]),
            "sx": r.X.sum(axis=0),
            "sxx": r.X.T @ r.X,
            "xd": r.X[r.event].sum(axis=0),
        }


class _Leaving(_SumRound, FederatedAlgorithm):
    """How many rows have their time in ``[t_k, t_(k+1))`` (``leaving``; the last: at or after
    ``t_m``): the rows that leave the risk set after the event time ``t_k``."""

    reply_keys = summed_keys = count_keys = ("leaving",)

    def __init__(self, spec: SurvivalColumns, times: np.ndarray) -> None:
        self.spec, self.times = spec, np.asarray(times, dtype=float)

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        idx = np.searchsorted(self.times, r.time, side="right") - 1
        return {"leaving": np.bincount(idx[idx >= 0], minlength=len(self.times)).astype(float)}


class _Newton:
    """The server's Newton's method with step halving, shared by the two Cox exchanges: given
    the log-likelihood and score at the broadcast ``beta`` (:meth:`_value`), and then its
    information (:meth:`_curvature`), step until no coefficient moves by more than ``tol``."""

    p: int
    tol: float
    max_steps: int

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict[str, Any]:
        return {"beta": np.zeros(self.p), "phase": 0, "accepted": None, "lls": [], "betas": [], "steps": 0,
                "halvings": 0, "done": False, "converged": False, "info": None, "why": ""}  # fmt: skip

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> None:
        return None

    def _value(self, s: dict[str, Any], ll: float, score: np.ndarray, extra: dict[str, Any]) -> dict[str, Any]:
        """The log-likelihood at ``s["beta"]``: accept it, or halve the step if it fell."""
        s = dict(s)
        acc = s["accepted"]
        if acc is not None and ll < acc["ll"] - 1e-12 * max(1.0, abs(acc["ll"])):
            s["halvings"] += 1
            if s["halvings"] > MAX_HALVINGS:
                s.update(done=True, why="the partial likelihood did not increase along the Newton step")
                return s
            s["beta"] = (s["beta"] + acc["beta"]) / 2
            return s
        s["accepted"] = {"beta": s["beta"].copy(), "ll": ll, "score": score, **extra}
        s["lls"] = [*s["lls"], ll]
        s["betas"] = [*s["betas"], s["beta"].copy()]
        s["halvings"] = 0
        s["phase"] = 1
        return s

    def _curvature(self, s: dict[str, Any], info: np.ndarray) -> dict[str, Any]:
        s = dict(s)
        acc = s["accepted"]
        s["info"] = info
        try:
            delta = np.linalg.solve(info, acc["score"])
        except np.linalg.LinAlgError:
            s.update(done=True, why="the information became singular (a predictor is collinear with others)")
            return s
        if not np.all(np.isfinite(delta)):
            s.update(done=True, why="the Newton step is not finite")
        elif np.max(np.abs(delta), initial=0.0) <= self.tol:  # the last, tiny step taken too
            s.update(done=True, converged=True)
            s["accepted"] = {**acc, "beta": acc["beta"] + delta}
        elif s["steps"] >= self.max_steps:
            s.update(done=True, why=f"no convergence in {self.max_steps} Newton steps")
        else:
            s.update(beta=acc["beta"] + delta, steps=s["steps"] + 1, phase=0)
        return s

    def converged(self, server_state: Any, metrics: Mapping[str, float]) -> bool:
        return bool(server_state["done"])


class _CoxNewton(_Newton, FederatedAlgorithm):
    """Newton's method on the pooled partial likelihood at the pooled event ``times`` (``d``
    events at each), the predictors centred at ``mean`` on the clients. Phase 0: each client's
    risk-set sums ``s0``, ``s1`` (and with Efron's ties, its events' sums ``d0``, ``d1`` at the
    tied times, in their order); phase 1: its ``h2``, the information's second-moment part. A phase's reply
    leaves the other phase's arrays empty."""

    reply_keys = summed_keys = ("s0", "s1", "d0", "d1", "h2")
    random_client_steps = False

    def __init__(self, spec: SurvivalColumns, times: np.ndarray, d: np.ndarray, mean: np.ndarray, xd: np.ndarray,
                 efron: bool, tol: float, max_steps: int) -> None:  # fmt: skip
        self.spec, self.times, self.d = spec, np.asarray(times, float), np.asarray(d, float)
        self.mean, self.xd, self.efron = np.asarray(mean, float), np.asarray(xd, float), bool(efron)
        self.p, self.tol, self.max_steps = len(self.mean), float(tol), int(max_steps)
        self.tied = self.d >= 2

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        s = server_state
        msg = {"beta": s["beta"], "phase": np.array([float(s["phase"])])}
        if s["phase"] == 1:
            msg |= {"a1": s["accepted"]["a1"], "b1": s["accepted"]["b1"]}
        return msg

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        r = self.spec.rows(data)
        X = r.X - self.mean
        beta = np.asarray(message["beta"], float)
        p = self.p
        if message["phase"][0] == 0:
            sums = risk_sums(r.time, r.event, X, beta, self.times, self.efron)
            if self.efron:  # only the tied times' event sums are used: the others stay on the client
                sums["d0"], sums["d1"] = sums["d0"][self.tied], sums["d1"][self.tied]
            return {**sums, "h2": np.zeros((0, p))}, None
        h2 = second_moment(r.time, r.event, X, beta, self.times, message["a1"], message["b1"])
        return {"s0": np.zeros(0), "s1": np.zeros((0, p)), "d0": np.zeros(0), "d1": np.zeros((0, p)), "h2": h2}, None

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        sums = replies.sums  # type: ignore[attr-defined]
        s = server_state
        if s["phase"] == 0:
            if self.efron:  # the event sums at the tied times, in place
                for k, shape in (("d0", (len(self.d),)), ("d1", (len(self.d), self.p))):
                    full = np.zeros(shape)
                    full[self.tied] = sums[k]
                    sums = {**sums, k: full}
            t = time_weights(sums, self.d, self.efron)
            extra = {"a1": t.a1, "b1": t.b1, "outer": t.outer, "s0": sums["s0"], "s1": sums["s1"],
                     "wm": event_means(sums, t, self.d, self.efron)}  # fmt: skip
            s = self._value(s, float(self.xd @ s["beta"]) + t.ll, self.xd + t.score, extra)
        else:
            s = self._curvature(s, sums["h2"] - s["accepted"]["outer"])
        return s, {"ll": s["lls"][-1] if s["lls"] else np.nan}


class _CoxStrata(_Newton, FederatedAlgorithm):
    """Newton's method with each client its own stratum: a client sends its own partial
    likelihood's log-likelihood ``ll``, score and information at the broadcast ``beta``."""

    reply_keys = summed_keys = ("ll", "score", "info")
    random_client_steps = False

    def __init__(self, spec: SurvivalColumns, mean: np.ndarray, efron: bool, tol: float, max_steps: int) -> None:
        self.spec, self.mean, self.efron = spec, np.asarray(mean, float), bool(efron)
        self.p, self.tol, self.max_steps = len(self.mean), float(tol), int(max_steps)

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        return {"beta": server_state["beta"]}

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        r = self.spec.rows(data)
        ll, score, info = stratum_terms(r.time, r.event, r.X - self.mean, np.asarray(message["beta"]), self.efron)
        return {"ll": np.array([ll]), "score": score, "info": info}, None

    def server_step(self, server_state: Any, replies: Mapping[ClientId, Message], round: int) -> tuple[Any, dict]:
        sums = replies.sums  # type: ignore[attr-defined]
        s = self._value(server_state, float(sums["ll"][0]), sums["score"], {})
        if s["phase"] == 1:  # accepted: its information came with it
            s = self._curvature(s, sums["info"])
        return s, {"ll": s["lls"][-1] if s["lls"] else np.nan}


class _CoxScores(_SumRound, FederatedAlgorithm):
    """One round at the fit: the sum of the rows' score-residual outer products ``meat``. The
    server sends the risk sets' weighted means and hazard increments at the pooled event times;
    with ``times=None`` (stratified) each client forms its own."""

    reply_keys = summed_keys = ("meat",)

    def __init__(self, spec: SurvivalColumns, beta: np.ndarray, mean: np.ndarray, times: np.ndarray | None = None,
                 risk_mean: np.ndarray | None = None, hazard: np.ndarray | None = None) -> None:  # fmt: skip
        self.spec, self.beta, self.mean = spec, np.asarray(beta, float), np.asarray(mean, float)
        self.times, self.risk_mean, self.hazard = times, risk_mean, hazard

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        X = r.X - self.mean
        if self.times is None:
            times, d = event_times(r.time, r.event)
            if len(times) == 0:
                return {"meat": np.zeros((len(self.beta),) * 2)}
            s = risk_sums(r.time, r.event, X, self.beta, times, False)
            a, h = s["s1"] / s["s0"][:, None], d / s["s0"]
        else:
            times, a, h = self.times, self.risk_mean, self.hazard
        U = score_residuals(r.time, r.event, X, self.beta, times, a, h)
        return {"meat": U.T @ U}


class _Schoenfeld(_SumRound, FederatedAlgorithm):
    """One round at the fit: the sums over a client's events of their Schoenfeld residuals
    ``r`` (the event's predictors less the risk set's weighted mean at its time), of ``g r``
    (``gr``, ``g`` the event's transformed time), of ``g`` and ``g^2``, and the events ``d``.
    The server sends the pooled event ``times`` with their weighted means ``wm`` and, for the
    Kaplan-Meier and rank transforms, ``g`` at each; without ``times`` (stratified) each client
    forms its own means, and ``g`` is the time or its log."""

    reply_keys = summed_keys = ("r", "gr", "g", "gg", "d")

    def __init__(self, spec: SurvivalColumns, beta: np.ndarray, mean: np.ndarray, efron: bool, transform: str,
                 times: np.ndarray | None = None, wm: np.ndarray | None = None,
                 g: np.ndarray | None = None) -> None:  # fmt: skip
        self.spec, self.beta, self.mean, self.efron = spec, np.asarray(beta, float), np.asarray(mean, float), efron
        self.transform, self.times, self.wm, self.g = transform, times, wm, g

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        X = r.X - self.mean
        times, wm = self.times, self.wm
        if times is None:  # its own stratum
            times, d = event_times(r.time, r.event)
            if len(times) == 0:
                p = len(self.beta)
                return {"r": np.zeros(p), "gr": np.zeros(p), "g": np.zeros(1), "gg": np.zeros(1), "d": np.zeros(1)}
            sums = risk_sums(r.time, r.event, X, self.beta, times, self.efron)
            wm = event_means(sums, time_weights(sums, d, self.efron), d, self.efron)
        assert wm is not None
        dead = r.event
        idx = np.searchsorted(times, r.time[dead])
        res = X[dead] - wm[idx]
        if self.g is not None:
            g = self.g[idx]
        else:
            g = r.time[dead] if self.transform == "identity" else np.log(r.time[dead])
        return {"r": res.sum(axis=0), "gr": g @ res, "g": np.array([g.sum()]), "gg": np.array([g @ g]),
                "d": np.array([float(dead.sum())])}  # fmt: skip


class _LogRankStrata(_SumRound, FederatedAlgorithm):
    """Each client a stratum: its log-rank ``o_e`` (observed minus expected events per group) and
    variance ``v`` (``G x G``), under Fleming-Harrington weights ``S(t-)^p (1 - S(t-))^q`` (its own
    Kaplan-Meier curve; ``p = q = 0``: the log-rank test)."""

    reply_keys = summed_keys = ("o_e", "v", "rows")

    def __init__(self, spec: SurvivalColumns, n_groups: int, p: float = 0.0, q: float = 0.0) -> None:
        self.spec, self.G, self.p, self.q = spec, int(n_groups), float(p), float(q)

    def sums(self, data: Any) -> dict[str, np.ndarray]:
        r = self.spec.rows(data)
        times = np.unique(r.time)
        counts = np.zeros((len(times), 2 * self.G))
        at = np.searchsorted(times, r.time)
        np.add.at(counts, (at, 2 * r.group + (~r.event).astype(np.int64)), 1.0)
        o_e, v = logrank_terms(*risk_table(counts), self.p, self.q)
        return {"o_e": o_e, "v": v, "rows": np.array([float(len(r.time))])}
