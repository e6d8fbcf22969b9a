"""The fit of a federated multi-fidelity chain (:class:`~fedstats.gp.multifidelity.FederatedAR1`,
:class:`~fedstats.gp.nargp.FederatedNARGP`) as one run of the runtime (:func:`fedstats.federation.run`).

One client per fidelity, lowest first. The run's rounds follow a fixed plan, one client
per round (a participation schedule), fidelity by fidelity:

* fidelity 0 fits its GP on its own rows (``"fit"``);
* for each fidelity t above it: its client sends its inputs up (``"ask"``); the server sends them
  down to fidelity 0, which answers with its predictive moments there, then with those moments to
  fidelity 1, and so on to fidelity t - 1 (``"answer"``); the server then sends fidelity t the mean that
  came up (for NARGP the paths' mixture mean), and fidelity t fits its GP and link on its own rows
  (``"fit"``);
* in the last round every fidelity releases its fitted parameters (``"release"``): its
  hyperparameters and link on its standardised scale, its row count and its outputs' mean and
  sd.

Each client's fitted fidelity (its rows, residuals and GP) is its private state and stays with it;
no output leaves a client. A failed client stops the chain: the fit raises, naming it. Every
message is counted by the runtime (kind ``"chain"``) and runs on any backend; the queries after
the fit (predictions) travel the chain in process (:mod:`fedstats.gp.chain_result`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from ..federation import FederatedAlgorithm, Message
from ._core import HyperSpec, mixture

__all__ = ["ChainFit", "plan"]

_EMPTY = np.zeros(0)
#: the round's task, sent as the message's ``task`` code
TASKS = ("fit", "ask", "answer", "release")
HYPER = ("lengthscale", "outputscale", "noise")


def plan(n_fidelities: int) -> list[tuple[str, int | None]]:
    """The chain's rounds: ``(task, fidelity)`` (the fidelity whose client takes part; ``None``: all)."""
    out: list[tuple[str, int | None]] = [("fit", 0)]
    for t in range(1, n_fidelities):
        out += [("ask", t), *(("answer", s) for s in range(t)), ("fit", t)]
    return [*out, ("release", None)]


class ChainFit(FederatedAlgorithm):
    """The fit of a chain of fidelities (see the module's docs). ``model`` is ``"ar1"``
    (each fidelity an :class:`~fedstats.gp.ar1_result.AR1Fidelity`) or ``"nargp"``
    (:class:`~fedstats.gp.nargp_result.NARGPFidelity`, its paths drawn with ``samples`` and
    ``seed``); ``order`` the clients lowest first; ``specs`` each fidelity's GP prior (the model's
    ``fidelity_spec``); fidelity t's ``restarts`` maximum-likelihood starts are seeded ``seed + t``,
    as the centralised fit's."""

    reply_keys = ("queries", "mean", "var", "n", "mu", "sd", "rho", *HYPER)
    random_client_steps = False

    def __init__(
        self,
        model: str,
        order: Sequence[Hashable],
        specs: Sequence[HyperSpec],
        restarts: int,
        seed: int,
        samples: int = 0,
    ) -> None:
        self.model, self.order, self.specs = model, list(order), list(specs)
        self.restarts, self.seed, self.samples = int(restarts), int(seed), int(samples)
        self.plan = plan(len(self.order))

    def schedule(self) -> list[list[Hashable]]:
        """The participation schedule: the client of each round."""
        return [list(self.order) if t is None else [self.order[t]] for _, t in self.plan]

    # ------------------------------------------------------------------ server
    def init_server(self, clients: Sequence[Hashable], rng: np.random.Generator) -> dict:
        return {"queries": _EMPTY, "lower": None, "released": {}}

    def broadcast(self, state: dict, client: Hashable, round: int) -> Message:
        task, _ = self.plan[round]
        msg: Message = {"task": np.array([TASKS.index(task)], dtype=float)}
        lower = state["lower"]
        if task == "answer":
            msg["queries"] = state["queries"]
            if lower is not None:
                msg["mean"], msg["var"] = lower
        elif task == "fit" and lower is not None:  # the input the fidelity fits on
            msg["mean"] = mixture(lower)[0] if self.model == "nargp" else lower[0]
        return msg

    def server_step(self, state: dict, replies: Mapping[Hashable, Message], round: int) -> tuple[dict, dict]:
        task, t = self.plan[round]
        asked = [] if t is None else [self.order[t]]
        missing = [c for c in (asked or self.order) if c not in replies]
        if missing:  # a chain cannot leave a fidelity out
            why = getattr(replies, "declined", {})
            raise RuntimeError(
                f"the fidelity chain needs every fidelity: client {missing[0]!r} did not answer the {task!r} round "
                f"({why.get(missing[0], 'no reply')})"
            )
        new = dict(state)
        if task == "ask":
            new["queries"], new["lower"] = np.asarray(replies[asked[0]]["queries"]), None
        elif task == "answer":
            r = replies[asked[0]]
            new["lower"] = (np.asarray(r["mean"]), np.asarray(r["var"]))
        elif task == "fit":
            new["queries"], new["lower"] = _EMPTY, None
        else:
            new["released"] = {c: dict(r) for c, r in replies.items()}
        return new, {}

    # ------------------------------------------------------------------ client
    def init_client(self, client: Hashable, data: Any, rng: np.random.Generator) -> Any:
        from .ar1_result import AR1Fidelity
        from .nargp_result import NARGPFidelity

        t = self.order.index(client)
        X, y, spec, seed = np.asarray(data.X), np.asarray(data.y), self.specs[t], self.seed + t
        if self.model == "nargp":
            return NARGPFidelity(X, y, t, spec, restarts=self.restarts, seed=seed)
        return AR1Fidelity(X, y, spec, restarts=self.restarts, seed=seed)

    def client_step(self, message: Message, fidelity: Any, data: Any, rng: Any) -> tuple[Message, Any]:
        task = TASKS[int(message["task"][0])]
        reply: dict[str, np.ndarray] = {k: _EMPTY for k in self.reply_keys}
        if task == "fit":
            fidelity.fit(np.asarray(message["mean"]) if "mean" in message else None)
        elif task == "ask":
            reply["queries"] = fidelity.X
        elif task == "answer":
            Xq = np.asarray(message["queries"])
            lower = (np.asarray(message["mean"]), np.asarray(message["var"])) if "mean" in message else None
            if self.model == "nargp":
                reply["mean"], reply["var"] = fidelity.answer(Xq, lower, self.samples, self.seed)
            else:
                reply["mean"], reply["var"] = fidelity.answer(Xq, lower)
        else:
            reply.update({k: np.asarray(fidelity.hyper[k], dtype=float) for k in HYPER})
            reply.update({k: np.array([float(getattr(fidelity, k))]) for k in ("n", "mu", "sd")})
            if self.model == "ar1":  # the link (0 at the lowest level)
                reply["rho"] = np.array([fidelity.rho])
        return reply, fidelity

    def final_state(self, state: Any) -> Any:
        """Nothing: the fidelity's release was its last reply; its rows and GP stay with it."""
        return None

    # ------------------------------------------------------------------ result
    def released(self, state: dict) -> list[Any]:
        """Each fidelity as released (no rows), lowest first, from the release round's replies."""
        from .ar1_result import AR1Fidelity
        from .nargp_result import NARGPFidelity

        out = []
        for t, c in enumerate(self.order):
            r = state["released"][c]
            cls = NARGPFidelity if self.model == "nargp" else AR1Fidelity
            lv = object.__new__(cls)
            fields: dict[str, Any] = {
                "X": None,
                "z": None,
                "n": int(r["n"][0]),
                "mu": float(r["mu"][0]),
                "sd": float(r["sd"][0]),
                "spec": self.specs[t],
                "restarts": self.restarts,
                "seed": self.seed + t,
                "hyper": {k: np.array(r[k], dtype=float) for k in HYPER},
            }
            if self.model == "nargp":
                fields |= {"t": t, "Z": None}
            else:
                fields |= {"rho": float(r["rho"][0]), "resid": None, "_gp": None}
            lv.__dict__.update(fields)
            out.append(lv)
        return out
