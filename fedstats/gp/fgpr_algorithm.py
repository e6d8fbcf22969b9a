"""FGPR's federated algorithm (the model is :class:`fedstats.gp.FGPR`, whose module docs
describe a round): the server's weighted average of the clients' hyperparameters and its
participant draws, and the clients' optimiser steps on minibatches of their own rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.spatial import cKDTree

from .. import streams
from ..federation import FederatedAlgorithm, Message
from ..result_file import register
from ._core import HyperSpec, raw_tensors
from ._local import nll_grad

__all__ = ["FGPRAlgorithm", "draw_participants", "average_hypers", "to_average_space", "from_average_space"]

#: the fewest clients in a part of a group that :meth:`FGPRAlgorithm.client_steps` runs on a thread
PART = 32


# --------------------------------------------------------------------------- server helpers


def draw_participants(seed: int, round: int, p: np.ndarray, k: int) -> np.ndarray:
    """Multiplicities of the K clients in round ``round``: ``k`` draws with replacement from
    Categorical(p), as in the paper's partial-participation analysis (each sampled client an
    independent draw: FedAvg's scheme, Li et al., 2019). A pure function of ``(seed, round)``,
    so that the participation callable and the server step agree without sharing state."""
    rng = streams.stream(seed, "fgpr participants", round)
    return np.bincount(rng.choice(len(p), size=k, replace=True, p=p), minlength=len(p))


def to_average_space(spec: HyperSpec, hyper: dict, space: str) -> dict[str, np.ndarray]:
    """``g(h)``: constrained hyperparameters mapped to the space where :func:`average_hypers`
    takes its arithmetic mean: the values themselves (``constrained``), their logarithms
    (``log``) or GPyTorch's raw parameters (``raw``); the constant mean stays as it is."""
    out = {}
    for n in spec.names:
        v = np.asarray(hyper[n], dtype=float)
        if n == "mean" or space == "constrained":
            out[n] = v
        elif space == "log":
            out[n] = np.log(v)
        else:
            out[n] = spec.to_raw(n, torch.as_tensor(v, dtype=torch.float64)).numpy()
    return out


def from_average_space(spec: HyperSpec, mean: dict, space: str) -> dict[str, np.ndarray]:
    """``g^{-1}``: the inverse of :func:`to_average_space`."""
    out = {}
    for n in spec.names:
        v = np.asarray(mean[n], dtype=float)
        if n == "mean" or space == "constrained":
            out[n] = v
        elif space == "log":
            out[n] = np.exp(v)
        else:
            out[n] = spec.from_raw(n, torch.as_tensor(v, dtype=torch.float64)).numpy()
    return out


def average_hypers(spec: HyperSpec, hypers: list[dict], weights: np.ndarray, space: str) -> dict[str, np.ndarray]:
    """Weighted mean of constrained hyperparameter sets in ``space``: ``constrained`` (the
    published code), ``raw`` (GPyTorch's raw parameters: the variable SGD updates) or ``log``
    (geometric mean). The constant mean is averaged as it is in every space.

    Each is a weighted arithmetic mean ``g^{-1}(sum_k w_k g(h_k) / sum_k w_k)`` in the space
    of :func:`to_average_space`, so a server needs only the sum of the clients' terms
    ``w_k g(h_k)`` (what FGPR's clients send) and of their weights."""
    w = np.asarray(weights, dtype=float)
    terms = [to_average_space(spec, h, space) for h in hypers]
    total = {n: sum(wk * t[n] for wk, t in zip(w, terms)) for n in spec.names}
    return from_average_space(spec, {n: total[n] / w.sum() for n in spec.names}, space)


# --------------------------------------------------------------------------- client state


@register
@dataclass(frozen=True)
class _FGPRClient:
    """A client's private state between rounds: no data (checkpoints never hold data), only
    its sizes, its step count and, if persistent, its optimiser moments (numpy, on the CPU)."""

    n: int
    m: int  # batch size M_k
    e: int  # local steps E_k
    opt: dict | None  # persistent optimiser state: {"m": {...}, "v": {...}}
    steps: int  # local steps taken so far (Adam's t, SGD's schedule)


@dataclass(frozen=True)
class _View:
    """A client's data for one round, built on the client from its own data."""

    X: np.ndarray  # (N, d) inputs (numpy, for the samplers)
    Xt: torch.Tensor  # the same on the compute device
    yt: torch.Tensor  # (standardised) targets on the compute device
    tree: cKDTree | None  # for nearest-neighbour batches


@register
class _FGPRServer:
    def __init__(self, hyper: dict, weights: dict):
        self.hyper, self.weights = hyper, weights


class CountShare(FederatedAlgorithm):
    """The one exchange before training: every client sends its number of points N_k.

    The counts stay per client (not summed): under partial participation the server draws
    the participants with probabilities ``N_k / N``, one per client, and it weights the
    average by its own copy of the answering clients' ``N_k`` (full participation) and
    reports them as the result's ``n_obs``."""

    reply_keys = ("n",)

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        return {"n": np.array([data.n], dtype=np.int64)}, state

    def server_step(self, server_state, replies, round):
        return {c: int(r["n"][0]) for c, r in replies.items()}, {}


class FGPRAlgorithm(FederatedAlgorithm):
    """FGPR (Algorithm 1 of the FGPR paper) as a :class:`~fedstats.federation.FederatedAlgorithm`.

    The broadcast holds the constrained hyperparameters (one array per name of
    ``spec.names``) and, under partial participation, the client's ``weight``: its
    multiplicity among the round's draws. Client k replies, under each name, its term
    ``w_k g(h_k)`` of the server's weighted mean (:func:`average_hypers`): ``g`` maps to
    the ``average_space`` (:func:`to_average_space`), ``w_k`` is its ``N_k`` (which it knows)
    or the broadcast multiplicity. The server uses the replies only through their sum
    (:attr:`summed_keys`): it divides it by the answering clients' total weight, which it
    holds itself (their ``N_k`` from :class:`CountShare`, or the multiplicities it drew),
    and maps back. :meth:`client_steps` runs all clients with equal ``(M_k, E_k)`` as one
    batched GP (``batch_shape=[G]``), which gives what :meth:`client_step` gives client by
    client; a round of at least ``2 PART`` clients shares its groups among up to ``workers``
    threads (a group in parts of at least :data:`PART` clients; :class:`FGPR` passes torch's
    thread count on the CPU). See :class:`FGPR` for the options.
    """

    def __init__(
        self,
        spec: HyperSpec,
        *,
        init: dict,
        counts: dict,
        local_steps,
        batch_size,
        sampler: str,
        optimizer: str,
        lr: float,
        lr_decay,
        betas,
        optimizer_state: str,
        loss_normalization: str,
        average_space: str,
        participants: int | None,
        seed: int,
        standardize: bool,
        device,
        dtype,
        workers: int = 1,
    ):
        self.spec, self.init, self.counts = spec, init, counts
        self.local_steps, self.batch_size, self.sampler = local_steps, batch_size, sampler
        self.optimizer, self.lr, self.lr_decay, self.betas = optimizer, lr, lr_decay, betas
        self.optimizer_state, self.loss_normalization, self.average_space = (
            optimizer_state,
            loss_normalization,
            average_space,
        )
        self.participants, self.seed, self.standardize = participants, seed, standardize
        self.device, self.dtype, self.workers = device, dtype, workers
        self.reply_keys = spec.names
        self.summed_keys = spec.names  # the server uses the weighted terms only through their sum
        clients = list(counts)
        self._p = np.array([counts[c] for c in clients], dtype=float) / sum(counts.values())
        self._index = {c: i for i, c in enumerate(clients)}

    # ---- participation: K_s draws with replacement by p_k
    def multiplicity(self, round: int) -> np.ndarray:
        assert self.participants is not None  # used only with partial participation (FGPR.fit, server_step)
        drawn = self.__dict__.setdefault("_drawn", {})  # each round's draw, made once
        if round not in drawn:
            drawn[round] = draw_participants(self.seed, round, self._p, self.participants)
        return drawn[round]

    def participation(self, round: int, rng) -> list:
        mult = self.multiplicity(round)
        return [c for c, i in self._index.items() if mult[i] > 0]

    # ---- protocol
    def init_server(self, clients, rng):
        return _FGPRServer({n: v.copy() for n, v in self.init.items()}, dict(self.counts))

    def init_client(self, client, data, rng):
        n = data.n
        m = batch_for(self.batch_size, n)
        e = max(1, n // m) if self.local_steps == "epoch" else int(self.local_steps)
        return _FGPRClient(n, m, e, None, 0)

    def _view(self, state: _FGPRClient, data) -> _View:
        X, y = np.array(data.X, dtype=float), np.array(data.y, dtype=float)
        y = standardize_y(y)[0] if self.standardize else y
        tree = cKDTree(X) if (self.sampler == "nearest" and state.m < state.n) else None
        return _View(
            X,
            torch.as_tensor(X, device=self.device, dtype=self.dtype),
            torch.as_tensor(y, device=self.device, dtype=self.dtype),
            tree,
        )

    def broadcast(self, server_state, client, round):
        msg = dict(server_state.hyper)  # the same arrays for every client: the runtime checks them once
        if self.participants is not None:  # the client's weight: how often it was drawn
            msg["weight"] = np.array([float(self.multiplicity(round)[self._index[client]])])
        return msg

    def weighted_term(self, hyper: dict, message: Message, n: int) -> Message:
        """Client side: its term ``w_k g(h_k)`` of the server's weighted mean, for its new
        hyperparameters ``hyper``; ``w_k`` is the broadcast ``weight`` (its multiplicity
        under partial participation), else its number of points ``n``."""
        w = float(message["weight"][0]) if "weight" in message else float(n)
        return {k: w * v for k, v in to_average_space(self.spec, hyper, self.average_space).items()}

    def _weight(self, server_state, client, round: int) -> float:
        """Client ``client``'s weight in round ``round``'s average, as the server knows it."""
        if self.participants is None:
            return float(server_state.weights[client])
        return float(self.multiplicity(round)[self._index[client]])

    def client_step(self, message, state, data, rng):
        return self._update([message], [state], [data], [rng])[0]

    def client_steps(
        self,
        messages: Sequence[Message],
        states: Sequence[Any],
        datas: Sequence[Any],
        rngs: Sequence[np.random.Generator],
    ) -> list[tuple[Message, Any] | BaseException]:
        groups: dict = {}
        for i, s in enumerate(states):
            groups.setdefault((s.m, s.e, s.m == s.n), []).append(i)
        # a group of 2 PART clients or more in up to `workers` parts of PART clients at least; in
        # a round of 2 PART clients or more, the groups and parts run on up to `workers` threads
        # (torch releases the GIL in its operations). A client's result does not depend on the
        # clients batched with it.
        parts = [
            list(part)
            for idx in groups.values()
            for part in np.array_split(idx, max(1, min(self.workers, len(idx) // PART)))
        ]
        pick = lambda xs, part: [xs[i] for i in part]  # noqa: E731
        run = lambda part: self._group(*(pick(xs, part) for xs in (messages, states, datas, rngs)))  # noqa: E731
        if self.workers > 1 and len(parts) > 1 and len(states) >= 2 * PART:
            with ThreadPoolExecutor(min(self.workers, len(parts))) as pool:
                results = list(pool.map(run, parts))
        else:
            results = [run(part) for part in parts]
        out: list = [None] * len(states)
        for part, res in zip(parts, results):
            for i, r in zip(part, res):
                out[i] = r
        return out

    def _group(self, messages, states, datas, rngs) -> list:
        """:meth:`_update` of clients with equal ``(M_k, E_k)``; if it fails, client by client
        (each with the batch draws it would have made on its own), to isolate the failure."""
        saved = [rng.bit_generator.state for rng in rngs]
        try:
            return self._update(messages, states, datas, rngs)
        except Exception:  # noqa: BLE001 - the runtime records a failing client's exception
            for rng, st in zip(rngs, saved):
                rng.bit_generator.state = st
            return [self._one(*a) for a in zip(messages, states, datas, rngs)]

    def _one(self, message, state, data, rng):
        try:
            return self._update([message], [state], [data], [rng])[0]
        except Exception as exc:  # noqa: BLE001 - the runtime records it
            return exc

    def __getstate__(self) -> dict:
        # the caches of one process (clients' data views, stacked tensors, the local steps'
        # buffers) are never pickled: a copy of the algorithm carries no client's data
        return {k: v for k, v in self.__dict__.items() if k not in ("_view_cache", "_stack_cache")}

    def _views(self, states, datas) -> list[_View]:
        """Each client's :class:`_View`, built once per fit (a client's data and sizes do not
        change between rounds) and reused while its data object is the same."""
        cache = self.__dict__.setdefault("_view_cache", {})
        if len(cache) > 2 * len(self._index) + 16:  # data objects that come and go (remote clients)
            cache.clear()
        out = []
        for s, d in zip(states, datas):
            hit = cache.get(id(d))
            if hit is None or hit[0] is not d:
                hit = cache[id(d)] = (d, self._view(s, d))
            out.append(hit[1])
        return out

    def _stacked(self, states, datas, views) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The group's inputs ``[G, N_max, d]`` and targets ``[G, N_max]`` (zero padded), stacked
        once per fit for a group of the same data objects, and the buffers of its local steps
        (:func:`~._local.nll_grad`'s ``work``)."""
        cache = self.__dict__.setdefault("_stack_cache", {})
        key = tuple(id(d) for d in datas)
        hit = cache.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], datas)):
            return hit[1], hit[2], hit[3]
        if len(cache) > 8:
            cache.clear()
        G, nmax = len(states), max(s.n for s in states)
        Xpad = torch.zeros((G, nmax, self.spec.d), device=self.device, dtype=self.dtype)
        ypad = torch.zeros((G, nmax), device=self.device, dtype=self.dtype)
        for g, (s, v) in enumerate(zip(states, views)):
            Xpad[g, : s.n], ypad[g, : s.n] = v.Xt, v.yt
        cache[key] = (list(datas), Xpad, ypad, {})
        return Xpad, ypad, cache[key][3]

    def _draws(self, states, views, rngs, E: int) -> np.ndarray:
        """Every local step's batch indices ``[E, G, M]`` (each batch in increasing row order),
        each client's from its own stream alone, so a client draws the same batches in a group
        as on its own.

        ``uniform``: the rows of the M smallest of N_k uniform keys, for each step: M rows
        uniformly without replacement, as ``rng.choice(N_k, M, replace=False)`` draws them but
        from another use of the stream (one ``rng.random((E, N_k))`` per client and round, and
        one partition for the whole group). ``nearest``: the M nearest neighbours of a row
        drawn uniformly, step by step."""
        M = states[0].m
        if self.sampler == "uniform":
            keys = np.full((E, len(states), max(s.n for s in states)), np.inf)  # padding is never drawn
            for g, (s, rng) in enumerate(zip(states, rngs)):
                keys[:, g, : s.n] = rng.random((E, s.n))
            return np.sort(np.argpartition(keys, M - 1, axis=-1)[..., :M], axis=-1)
        return np.stack(
            [np.stack([self._nearest(s, v, rng) for _ in range(E)]) for s, v, rng in zip(states, views, rngs)], axis=1
        )

    @staticmethod
    def _nearest(state: _FGPRClient, view: _View, rng) -> np.ndarray:
        assert view.tree is not None  # _view builds it for "nearest" whenever M < N_k
        return np.sort(view.tree.query(view.X[rng.integers(state.n)], k=state.m)[1])

    def _update(self, messages, states, datas, rngs) -> list:
        """E local steps of G clients with equal (M, E) as one batched GP."""
        spec, G = self.spec, len(states)
        names = spec.names
        views = self._views(states, datas)
        dev, dt = self.device, self.dtype
        M, E = states[0].m, states[0].e
        # all hyperparameters as one [G, P] tensor (Adam and SGD act element by element)
        sizes = [spec.size(n) for n in names]
        raw = torch.cat(list(raw_tensors(spec, messages, dev, dt).values()), dim=1)
        keep = self.optimizer_state == "persistent"
        mom, vel = (
            (self._moments(states, "m"), self._moments(states, "v"))
            if keep and any(s.opt for s in states)
            else (torch.zeros_like(raw), torch.zeros_like(raw))
        )
        # Adam's step counter restarts with a fresh state; SGD's schedule counts across rounds
        restart = self.optimizer == "adam" and not keep
        t0 = torch.tensor([0 if restart else s.steps for s in states], device=dev)
        Xpad, ypad, work = self._stacked(states, datas, views)
        batches = None
        if not all(s.m == s.n for s in states):
            nmax = Xpad.shape[1]
            idx = torch.as_tensor(self._draws(states, views, rngs, E), device=dev)
            idx = idx + (torch.arange(G, device=dev) * nmax)[:, None]  # rows of the flattened [G * N_max]
            batches = (Xpad.reshape(G * nmax, -1)[idx], ypad.reshape(-1)[idx])  # [E, G, M, d], [E, G, M]
        for step in range(E):
            Xb, yb = (Xpad, ypad) if batches is None else (batches[0][step], batches[1][step])
            loss, g_ = nll_grad(spec, raw, Xb, yb, work)
            if self.loss_normalization == "mean":
                loss, g_ = loss / M, g_ / M
            if not bool(torch.isfinite(loss.sum() + g_.sum())):  # one synchronisation: inf or NaN anywhere
                raise FloatingPointError(
                    f"non-finite marginal likelihood or gradient in local step {step} (lr={self.lr:g})"
                )
            t = t0 + step
            if self.optimizer == "adam":
                raw, mom, vel = adam_update(raw, g_, mom, vel, t + 1, self.lr, self.betas)
            else:
                raw = raw - sgd_lr(self.lr, self.lr_decay, t).to(dt).reshape(-1, 1) * g_
        values = {
            n: spec.from_raw(n, v).to(torch.float64).cpu().numpy() for n, v in zip(names, raw.split(sizes, dim=1))
        }
        if not all(np.all(np.isfinite(v)) for v in values.values()):
            raise FloatingPointError(f"hyperparameters overflowed (lr={self.lr:g})")
        if type(self).weighted_term is FGPRAlgorithm.weighted_term:  # every client's term at once
            w = np.array([float(m["weight"][0]) if "weight" in m else float(s.n) for m, s in zip(messages, states)])
            terms = {n: w[:, None] * v for n, v in to_average_space(spec, values, self.average_space).items()}
            reply = lambda g, msg, s: {n: terms[n][g].copy() for n in names}  # noqa: E731
        else:  # a subclass's own term, client by client
            reply = lambda g, msg, s: self.weighted_term({n: values[n][g].copy() for n in names}, msg, s.n)  # noqa: E731
        if keep:
            cut = np.cumsum(sizes)[:-1]
            cpu = lambda x: x.detach().to(torch.float64).cpu().numpy()  # noqa: E731
            mo, ve = (dict(zip(names, np.split(cpu(x), cut, axis=1))) for x in (mom, vel))
        out = []
        for g, (msg, s) in enumerate(zip(messages, states)):
            opt = {"m": {n: mo[n][g].copy() for n in names}, "v": {n: ve[n][g].copy() for n in names}} if keep else None
            out.append((reply(g, msg, s), _FGPRClient(s.n, s.m, s.e, opt, s.steps + E)))
        return out

    def _moments(self, states, k: str) -> torch.Tensor:
        """The persistent Adam moments ``k`` (``"m"`` or ``"v"``) as one ``[G, P]`` tensor (zeros
        for a client without a state yet)."""
        P = sum(self.spec.size(n) for n in self.spec.names)
        rows = [
            np.concatenate([np.asarray(s.opt[k][n], dtype=float).reshape(-1) for n in self.spec.names])
            if s.opt
            else np.zeros(P)
            for s in states
        ]
        return torch.as_tensor(np.stack(rows), device=self.device, dtype=self.dtype)

    def server_step(self, server_state, replies, round):
        old = server_state.hyper
        if not replies:
            return server_state, self._metrics(old, old)
        total = sum(self._weight(server_state, c, round) for c in replies)
        mean = {n: np.asarray(replies.sums[n]) / total for n in self.spec.names}
        new = from_average_space(self.spec, mean, self.average_space)
        return _FGPRServer(new, server_state.weights), self._metrics(old, new)

    def _metrics(self, old, new) -> dict:
        out = {"change": float(np.sqrt(sum(np.sum((new[n] - old[n]) ** 2) for n in self.spec.names)))}
        for n in self.spec.names:
            for j, v in enumerate(new[n]):
                out[n if len(new[n]) == 1 else f"{n}[{j}]"] = float(v)
        return out


def adam_update(p, g, m, v, t, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
    """One Adam step, element by element, with a step counter ``t`` per batch member.

    The arithmetic of :class:`torch.optim.Adam` (single-tensor, no weight decay): returns
    ``(new_p, new_m, new_v)``; ``t`` (``[G]``, the step number starting at 1) broadcasts
    over the trailing dimensions of ``p``.
    """
    b1, b2 = betas
    m = torch.lerp(m, g, 1 - b1)  # m b1 + (1 - b1) g
    v = (v * b2).addcmul_(g, g, value=1 - b2)
    if bool((t == t[0]).all()):  # one step number (a group's usual case): scalar corrections
        k = int(t[0])
        return p.addcdiv(m, (v.sqrt() / math.sqrt(1 - b2**k)).add_(eps), value=-lr / (1 - b1**k)), m, v
    shape = (-1,) + (1,) * (p.dim() - 1)
    tt = t.to(p.dtype).reshape(shape)
    step_size = lr / (1 - b1**tt)
    denom = v.sqrt() / torch.sqrt(1 - b2**tt) + eps
    return p - step_size * m / denom, m, v


def sgd_lr(lr: float, decay, t: torch.Tensor) -> torch.Tensor:
    """``lr / (1 + t / decay)`` (``decay`` = t0 in steps) or the constant ``lr``; ``t`` counts
    the steps a client took before this one (0 for its first)."""
    if decay is None:
        return torch.full_like(t, lr, dtype=torch.float64)
    return lr / (1 + t.to(torch.float64) / decay)


def batch_for(batch_size, n: int) -> int:
    """``M_k``: ``min(M, N_k)``, or for a fraction ``max(2, floor(M N_k))`` capped at ``N_k``."""
    if isinstance(batch_size, float):
        return min(n, max(2, int(math.floor(batch_size * n))))
    return min(int(batch_size), n)


def standardize_y(y: np.ndarray) -> tuple[np.ndarray, float, float]:
    """``(y - mean) / sd`` with the client's own mean and sd (sd 1 if y is constant)."""
    mu = float(np.mean(y))
    sd = float(np.std(y))
    if not np.isfinite(sd) or sd <= 1e-12 * max(1.0, abs(mu)):
        sd = 1.0
    return (y - mu) / sd, mu, sd
