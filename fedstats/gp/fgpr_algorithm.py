"""FGPR's federated algorithm (the model is :class:`fedstats.gp.FGPR`, whose module docs
describe a round): the server's weighted average of the clients' hyperparameters and its
participant draws, and the clients' optimiser steps on minibatches of their own rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from scipy.spatial import cKDTree

from .. import streams
from ..federation import FederatedAlgorithm, Message
from ._core import BatchGP, HyperSpec, adam_update, hyper_to_numpy, raw_tensors, sgd_lr

__all__ = ["FGPRAlgorithm", "draw_participants", "average_hypers"]


# --------------------------------------------------------------------------- server helpers


def draw_participants(seed: int, round: int, p: np.ndarray, k: int) -> np.ndarray:
    """Multiplicities of the K clients in round ``round``: ``k`` draws with replacement from
    Categorical(p), as in the paper's partial-participation analysis (each sampled client an
    independent draw: FedAvg's scheme, Li et al., 2019). A pure function of ``(seed, round)``,
    so that the participation callable and the server step agree without sharing state."""
    rng = streams.stream(seed, round, streams.FGPR_DRAWS)
    return np.bincount(rng.choice(len(p), size=k, replace=True, p=p), minlength=len(p))


def average_hypers(spec: HyperSpec, hypers: list[dict], weights: np.ndarray, space: str) -> dict[str, np.ndarray]:
    """Weighted mean of constrained hyperparameter sets in ``space``: ``constrained`` (the
    published code), ``raw`` (GPyTorch's raw parameters: the variable SGD updates) or ``log``
    (geometric mean). The constant mean is averaged as it is in every space."""
    w = np.asarray(weights, dtype=float)
    w = w / w.sum()
    out = {}
    for n in spec.names:
        V = np.stack([np.asarray(h[n], dtype=float) for h in hypers])  # (G, size)
        if n == "mean" or space == "constrained":
            out[n] = w @ V
        elif space == "log":
            out[n] = np.exp(w @ np.log(V))
        else:
            raw = spec.to_raw(n, torch.as_tensor(V, dtype=torch.float64)).numpy()
            out[n] = spec.from_raw(n, torch.as_tensor(w @ raw, dtype=torch.float64)).numpy()
    return out


# --------------------------------------------------------------------------- client state


@dataclass(frozen=True)
class _Client:
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


class _Server:
    def __init__(self, hyper: dict, weights: dict):
        self.hyper, self.weights = hyper, weights


class CountShare(FederatedAlgorithm):
    """The one exchange before training: every client sends its number of points N_k."""

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

    Broadcast and reply hold exactly the constrained hyperparameters (one array per name of
    ``spec.names``). :meth:`client_steps` runs all clients with equal ``(M_k, E_k)`` as one
    batched GP (``batch_shape=[G]``), which gives what :meth:`client_step` gives client by
    client. See :class:`FGPR` for the options.
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
        self.device, self.dtype = device, dtype
        self.reply_keys = spec.names
        clients = list(counts)
        self._p = np.array([counts[c] for c in clients], dtype=float) / sum(counts.values())
        self._index = {c: i for i, c in enumerate(clients)}

    # ---- participation: K_s draws with replacement by p_k
    def multiplicity(self, round: int) -> np.ndarray:
        assert self.participants is not None  # used only with partial participation (FGPR.fit, server_step)
        return draw_participants(self.seed, round, self._p, self.participants)

    def participation(self, round: int, rng) -> list:
        mult = self.multiplicity(round)
        return [c for c, i in self._index.items() if mult[i] > 0]

    # ---- protocol
    def init_server(self, clients, rng):
        return _Server({n: v.copy() for n, v in self.init.items()}, dict(self.counts))

    def init_client(self, client, data, rng):
        n = data.n
        m = batch_for(self.batch_size, n)
        e = max(1, n // m) if self.local_steps == "epoch" else int(self.local_steps)
        return _Client(n, m, e, None, 0)

    def _view(self, state: _Client, data) -> _View:
        X, y = np.array(data.X, dtype=float), np.array(data.y, dtype=float)
        y = standardise(y)[0] if self.standardize else y
        tree = cKDTree(X) if (self.sampler == "nearest" and state.m < state.n) else None
        return _View(
            X,
            torch.as_tensor(X, device=self.device, dtype=self.dtype),
            torch.as_tensor(y, device=self.device, dtype=self.dtype),
            tree,
        )

    def broadcast(self, server_state, client, round):
        return {n: v.copy() for n, v in server_state.hyper.items()}

    def client_step(self, message, state, data, rng):
        return self._update([message], [state], [data], [rng])[0]

    def client_steps(
        self,
        messages: Sequence[Message],
        states: Sequence[Any],
        datas: Sequence[Any],
        rngs: Sequence[np.random.Generator],
    ) -> list[tuple[Message, Any] | BaseException]:
        out: list = [None] * len(states)
        groups: dict = {}
        for i, s in enumerate(states):
            groups.setdefault((s.m, s.e, s.m == s.n), []).append(i)
        for idx in groups.values():
            saved = [rngs[i].bit_generator.state for i in idx]
            try:
                res = self._update(
                    [messages[i] for i in idx],
                    [states[i] for i in idx],
                    [datas[i] for i in idx],
                    [rngs[i] for i in idx],
                )
            except Exception:  # noqa: BLE001 - isolate the failing client: redo this group one by one
                for i, st in zip(idx, saved):  # with the batch draws it would have made on its own
                    rngs[i].bit_generator.state = st
                res = [self._one(messages[i], states[i], datas[i], rngs[i]) for i in idx]
            for i, r in zip(idx, res):
                out[i] = r
        return out

    def _one(self, message, state, data, rng):
        try:
            return self._update([message], [state], [data], [rng])[0]
        except Exception as exc:  # noqa: BLE001 - the runtime records it
            return exc

    def _model(self, G: int) -> BatchGP:
        # one module per group size, reused across rounds (its values are overwritten each step)
        cache = self.__dict__.setdefault("_models", {})
        if G not in cache:
            cache[G] = BatchGP(self.spec, G, self.device, self.dtype)
        return cache[G]

    def _batch_indices(self, state: _Client, view: _View, rng) -> np.ndarray:
        if state.m == state.n:
            return np.arange(state.n)
        if self.sampler == "uniform":
            return rng.choice(state.n, size=state.m, replace=False)
        assert view.tree is not None  # _view builds it for "nearest" whenever m < n
        centre = view.X[rng.integers(state.n)]
        return np.sort(view.tree.query(centre, k=state.m)[1])

    def _update(self, messages, states, datas, rngs) -> list:
        """E local steps of G clients with equal (M, E) as one batched GP."""
        spec, G = self.spec, len(states)
        views = [self._view(s, d) for s, d in zip(states, datas)]
        dev, dt = self.device, self.dtype
        M, E = states[0].m, states[0].e
        model = self._model(G)
        raw = raw_tensors(spec, messages, dev, dt)
        zeros = {n: torch.zeros_like(raw[n][0]) for n in spec.names}
        keep = self.optimizer_state == "persistent"
        saved = lambda s, k, n: torch.as_tensor(s.opt[k][n], device=dev, dtype=dt)  # noqa: E731
        mom = {n: torch.stack([saved(s, "m", n) if keep and s.opt else zeros[n] for s in states]) for n in spec.names}
        vel = {n: torch.stack([saved(s, "v", n) if keep and s.opt else zeros[n] for s in states]) for n in spec.names}
        # Adam's step counter restarts with a fresh state; SGD's schedule counts across rounds
        restart = self.optimizer == "adam" and not keep
        t0 = torch.tensor([0 if restart else s.steps for s in states], device=dev)
        full = all(s.m == s.n for s in states)
        if full:
            Xb, yb = torch.stack([v.Xt for v in views]), torch.stack([v.yt for v in views])
        else:
            nmax = max(s.n for s in states)
            Xpad = torch.zeros((G, nmax, spec.d), device=dev, dtype=dt)
            ypad = torch.zeros((G, nmax), device=dev, dtype=dt)
            for g, (s, v) in enumerate(zip(states, views)):
                Xpad[g, : s.n], ypad[g, : s.n] = v.Xt, v.yt
        leaves = model.leaves()
        for step in range(E):
            if not full:
                idx = torch.as_tensor(
                    np.stack([self._batch_indices(s, v, r) for s, v, r in zip(states, views, rngs)]), device=dev
                )
                Xb = torch.take_along_dim(Xpad, idx[:, :, None], dim=1)
                yb = torch.take_along_dim(ypad, idx, dim=1)
            model.set_raw(raw)
            loss = model.nll(Xb, yb)
            if self.loss_normalization == "mean":
                loss = loss / M
            grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
            bad = ~torch.isfinite(loss)
            for g_ in grads:
                bad |= ~torch.isfinite(g_.reshape(G, -1)).all(-1)
            if bool(bad.any()):
                raise FloatingPointError(
                    f"non-finite marginal likelihood or gradient in local step {step} (lr={self.lr:g})"
                )
            t = t0 + step
            for n, g_ in zip(leaves, grads):
                g_ = g_.reshape(G, -1)
                if self.optimizer == "adam":
                    raw[n], mom[n], vel[n] = adam_update(raw[n], g_, mom[n], vel[n], t + 1, self.lr, self.betas)
                else:
                    raw[n] = raw[n] - sgd_lr(self.lr, self.lr_decay, t).to(dt).reshape(-1, 1) * g_
        model.set_raw(raw)
        values = model.values()
        out = []
        for g, s in enumerate(states):
            reply = hyper_to_numpy(spec, values, g)
            if not all(np.all(np.isfinite(v)) for v in reply.values()):
                raise FloatingPointError(f"hyperparameters overflowed (lr={self.lr:g})")
            cpu = lambda t: t.detach().to(torch.float64).cpu().numpy().copy()  # noqa: E731
            opt = (
                {"m": {n: cpu(mom[n][g]) for n in spec.names}, "v": {n: cpu(vel[n][g]) for n in spec.names}}
                if self.optimizer_state == "persistent"
                else None
            )
            out.append((reply, replace(s, opt=opt, steps=s.steps + E)))
        return out

    def server_step(self, server_state, replies, round):
        old = server_state.hyper
        if not replies:
            return server_state, self._metrics(old, old)
        clients = list(replies)
        if self.participants is None:
            w = np.array([server_state.weights[c] for c in clients], dtype=float)
        else:
            mult = self.multiplicity(round)
            w = np.array([mult[self._index[c]] for c in clients], dtype=float)
        new = average_hypers(self.spec, [replies[c] for c in clients], w, self.average_space)
        return _Server(new, server_state.weights), self._metrics(old, new)

    def _metrics(self, old, new) -> dict:
        out = {"change": float(np.sqrt(sum(np.sum((new[n] - old[n]) ** 2) for n in self.spec.names)))}
        for n in self.spec.names:
            for j, v in enumerate(new[n]):
                out[n if len(new[n]) == 1 else f"{n}[{j}]"] = float(v)
        return out


def batch_for(batch_size, n: int) -> int:
    """``M_k``: ``min(M, N_k)``, or for a fraction ``max(2, floor(M N_k))`` capped at ``N_k``."""
    if isinstance(batch_size, float):
        return min(n, max(2, int(math.floor(batch_size * n))))
    return min(int(batch_size), n)


def standardise(y: np.ndarray) -> tuple[np.ndarray, float, float]:
    """``(y - mean) / sd`` with the client's own mean and sd (sd 1 if y is constant)."""
    mu = float(np.mean(y))
    sd = float(np.std(y))
    if not np.isfinite(sd) or sd <= 1e-12 * max(1.0, abs(mu)):
        sd = 1.0
    return (y - mu) / sd, mu, sd
