"""Toy algorithms for the Flower tests. A module of its own (on the nodes' PYTHONPATH and in
the session's ``trust``), because a Flower node loads the algorithm it is sent by reference."""

from __future__ import annotations

import time

import numpy as np

from fedstats.federation import FederatedAlgorithm, SkipRound


class Flaky(FederatedAlgorithm):
    """Clients send noisy column sums and row counts; the server averages what it receives.

    By client id: ``"boom"`` raises at round 1, ``"skip"`` declines round 2 (SkipRound),
    ``"bad"`` sends an undeclared array at round 0, ``"slow"`` takes ``slow_seconds`` at round 1. Every client counts its steps and keeps
    the noise it drew at init (private state); the server keeps running totals.
    """

    reply_keys = ("s", "n")
    slow_seconds = 8.0

    def init_server(self, clients, rng):
        return {"mean": np.zeros(2), "seen": 0.0, "draw": rng.normal()}

    def init_client(self, client, data, rng):
        return {"steps": 0, "offset": rng.normal(size=2)}

    def broadcast(self, state, client, round):
        return {"mean": state["mean"], "round": np.array([round])}

    def client_step(self, message, state, data, rng):
        r = int(message["round"][0])
        if data.client == "boom" and r == 1:
            raise ValueError("disk full")
        if data.client == "skip" and r == 2:
            raise SkipRound("not today")
        if data.client == "slow" and r == 1:
            time.sleep(self.slow_seconds)
        reply = {"s": data.X.sum(0) + state["offset"] + 1e-3 * rng.normal(size=2), "n": np.array([len(data.X)])}
        if data.client == "bad" and r == 0:
            reply["extra"] = np.zeros(1)
        return reply, {"steps": state["steps"] + 1, "offset": state["offset"]}

    def server_step(self, state, replies, round):
        if not replies:
            return dict(state), {"answered": 0.0}
        n = sum(float(m["n"][0]) for m in replies.values())
        mean = sum(m["s"] for m in replies.values()) / n
        return {"mean": mean, "seen": state["seen"] + n, "draw": state["draw"]}, {"answered": float(len(replies))}


class PrivateSum(FederatedAlgorithm):
    """Clients release their clipped column sums and row counts under differential privacy
    (``privacy``, a DifferentialPrivacy shared among ``n_clients``); the server keeps the sums."""

    reply_keys = ("s", "n")
    summed_keys = ("s", "n")

    def __init__(self, privacy, n_clients: int):
        self.privacy, self.n_clients = privacy, n_clients

    def init_server(self, clients, rng):
        return {"s": np.zeros(2), "n": np.zeros(1)}

    def init_client(self, client, data, rng):
        return {}

    def broadcast(self, state, client, round):
        return {"round": np.array([round])}

    def client_step(self, message, state, data, rng):
        rows = {"s": np.asarray(data.X, float), "n": np.ones(len(data.X))}
        out = self.privacy.client_sums(rows, rng, n_clients=self.n_clients)
        return {k: np.atleast_1d(np.asarray(v, float)) for k, v in out.sums.items()}, state

    def server_step(self, state, replies, round):
        if not replies:  # every node refused the round
            return dict(state), {}
        return {k: np.asarray(replies.sums[k], float) for k in self.summed_keys}, {}
