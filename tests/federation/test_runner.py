"""Tests of the in-process federated runtime (fedstats.federation.run)."""

from __future__ import annotations

import glob
import os
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

import fedstats.federation as fed
from fedstats.federation import (
    Communication,
    FederatedAlgorithm,
    History,
    ProtocolError,
    RoundRecord,
    RunResult,
    SkipRound,
    run,
)
from fedstats.federation.checkpoints import read_checkpoint

# --------------------------------------------------------------------------- fixtures


@dataclass
class ClientData:
    X: np.ndarray
    y: np.ndarray


class FederatedDataLike:
    """Not a Mapping: a ``clients`` list and ``__getitem__`` (like FederatedData)."""

    def __init__(self, parts):
        self._parts = dict(parts)
        self.clients = list(self._parts)

    def __getitem__(self, c):
        return self._parts[c]


def make_data(n_clients=5, d=3, seed=0, ids=None):
    rng = np.random.default_rng(seed)
    ids = ids if ids is not None else [f"c{i}" for i in range(n_clients)]
    out = {}
    for k, c in enumerate(ids):
        n = 3 + 2 * k
        X = rng.normal(size=(n, d)) + k
        out[c] = ClientData(X=X, y=rng.normal(size=n))
    return out


def strip_seconds(history):
    return [
        (r.round, r.participants, r.answered, r.failed, r.skipped, r.bytes_up, r.bytes_down, r.metrics) for r in history
    ]


# --------------------------------------------------------------------------- toy algorithms


class FedMean(FederatedAlgorithm):
    """Each client sends {"s": column sums, "n": row count}; the server averages.

    The server also keeps running totals over all accepted replies (``seen_s``, ``seen_n``),
    and every client counts the steps it completed in its private state.
    """

    reply_keys = ("s", "n")

    def __init__(self, d=3):
        self.d = d

    def init_server(self, clients, rng):
        return {"mean": np.zeros(self.d), "seen_s": np.zeros(self.d), "seen_n": 0}

    def init_client(self, client, data, rng):
        return {"steps": 0}

    def broadcast(self, server_state, client, round):
        return {"mean": server_state["mean"]}

    def client_step(self, message, state, data, rng):
        reply = {"s": data.X.sum(axis=0), "n": np.array(data.X.shape[0])}
        return reply, {"steps": state["steps"] + 1}

    def server_step(self, server_state, replies, round):
        if not replies:
            return server_state, {"n": 0.0}
        s = sum(r["s"] for r in replies.values())
        n = int(sum(r["n"] for r in replies.values()))
        new = {"mean": s / n, "seen_s": server_state["seen_s"] + s, "seen_n": server_state["seen_n"] + n}
        return new, {"n": float(n), "mean0": float(new["mean"][0])}


class Noisy(FederatedAlgorithm):
    """Randomness everywhere: init_server, init_client and client_step all use their rng.

    The server moves ``theta`` towards the mean of the noisy client replies; the client
    keeps a random walk in its private state. Converges when the step is small.
    """

    reply_keys = ("g",)

    def __init__(self, tol=0.0):
        self.tol = tol

    def init_server(self, clients, rng):
        return {"theta": rng.normal(size=2), "step": np.inf}

    def init_client(self, client, data, rng):
        return {"walk": rng.normal(size=2), "steps": 0}

    def broadcast(self, server_state, client, round):
        return {"theta": server_state["theta"], "round": np.array(round)}

    def client_step(self, message, state, data, rng):
        walk = state["walk"] + 0.1 * rng.normal(size=2)
        g = data.X[:, :2].mean(axis=0) - message["theta"] + 0.01 * walk
        return {"g": g}, {"walk": walk, "steps": state["steps"] + 1}

    def server_step(self, server_state, replies, round):
        if not replies:
            return dict(server_state), {"step": float("nan")}
        g = np.mean([r["g"] for r in replies.values()], axis=0)
        theta = server_state["theta"] + 0.5 * g
        step = float(np.abs(0.5 * g).max())
        return {"theta": theta, "step": step}, {"step": step, "theta0": float(theta[0])}

    def converged(self, server_state, metrics):
        return bool(metrics.get("step", np.inf) < self.tol)


class VectorisedNoisy(Noisy):
    """Same maths as Noisy, but client_steps does all clients in one numpy pass."""

    def __init__(self, tol=0.0):
        super().__init__(tol)
        self.batch_calls = 0

    def client_steps(self, messages, states, datas, rngs):
        self.batch_calls += 1
        noise = np.stack([r.normal(size=2) for r in rngs])
        walks = np.stack([s["walk"] for s in states]) + 0.1 * noise
        means = np.stack([d.X[:, :2].mean(axis=0) for d in datas])
        thetas = np.stack([m["theta"] for m in messages])
        g = means - thetas + 0.01 * walks
        return [({"g": g[k]}, {"walk": walks[k], "steps": s["steps"] + 1}) for k, s in enumerate(states)]


class BrokenBatch(Noisy):
    """client_steps consumes the rngs, then blows up as a whole."""

    def client_steps(self, messages, states, datas, rngs):
        for r in rngs:
            r.normal(size=100)
        raise MemoryError("vectorised kernel ran out of memory")


class Exploding(FedMean):
    """FedMean whose client ``bad`` raises (at the given rounds) or declines."""

    def __init__(self, bad, rounds=(1,), exc=None, d=3):
        super().__init__(d)
        self.bad, self.bad_rounds = bad, set(rounds)
        self.exc = RuntimeError("client lost power") if exc is None else exc

    def client_step(self, message, state, data, rng):
        if data is self.bad and int(message["round"]) in self.bad_rounds:
            raise self.exc
        return super().client_step(message, state, data, rng)

    def broadcast(self, server_state, client, round):
        return {"mean": server_state["mean"], "round": np.array(round)}


class Spy(FedMean):
    """FedMean whose server_step records exactly what it is handed.

    Client ``mode`` per client id decides what that client sends back.
    """

    def __init__(self, modes, d=3):
        super().__init__(d)
        self.modes = modes
        self.received = []  # (round, replies) exactly as passed
        self.server_args = []  # every positional argument of every server_step call

    def client_step(self, message, state, data, rng):
        reply, new_state = super().client_step(message, state, data, rng)
        mode = self.modes.get(data.tag, "ok")
        if mode == "extra_raw_X":
            reply["X"] = data.X
        elif mode == "list":
            reply["s"] = list(reply["s"])
        elif mode == "object":
            reply["s"] = np.array([data, 1.0], dtype=object)
        elif mode == "missing":
            del reply["n"]
        elif mode == "nan":
            reply["s"] = reply["s"].copy()
            reply["s"][0] = np.nan
        elif mode == "inf":
            reply["s"] = np.full_like(reply["s"], np.inf)
        elif mode == "not_a_mapping":
            reply = [reply["s"], reply["n"]]
        elif mode == "data_object":
            reply["n"] = data
        elif mode == "state_object":
            reply["n"] = new_state
        elif mode == "complex":
            reply["s"] = reply["s"].astype(complex)
        elif mode == "string":
            reply["s"] = np.array(["1", "2", "3"])
        elif mode == "bad_tuple":
            return reply  # not (reply, state)
        return reply, new_state

    def server_step(self, server_state, replies, round):
        self.received.append((round, dict(replies)))
        self.server_args.append((server_state, replies, round))
        return super().server_step(server_state, replies, round)


@dataclass(eq=False)
class TaggedData:
    X: np.ndarray
    tag: str


# --------------------------------------------------------------------------- basics


def test_public_api_reexported():
    for name in [
        "run",
        "RunResult",
        "History",
        "RoundRecord",
        "Communication",
        "FederatedAlgorithm",
        "Message",
        "SkipRound",
        "ProtocolError",
        "validate_message",
        "message_nbytes",
    ]:
        assert hasattr(fed, name), name
        assert name in fed.__all__
    assert fed.__doc__


@pytest.mark.parametrize("wrap", [dict, FederatedDataLike])
@pytest.mark.parametrize("batched", [True, False])
def test_federated_mean_equals_numpy_mean(wrap, batched):
    data = make_data(6)
    res = run(FedMean(), wrap(data), rounds=1, progress=False, batched=batched)
    X = np.concatenate([d.X for d in data.values()])
    np.testing.assert_allclose(res.server_state["mean"], X.mean(axis=0))
    assert res.server_state["seen_n"] == X.shape[0]
    assert isinstance(res, RunResult)
    assert res.rounds == 1 and not res.converged and res.resumed_from == 0
    assert list(res.client_states) == list(data)
    assert all(s == {"steps": 1} for s in res.client_states.values())
    assert isinstance(res.history, History) and len(res.history) == 1
    rec = res.history[0]
    assert isinstance(rec, RoundRecord)
    assert rec.round == 0 and rec.participants == list(data) and rec.answered == list(data)
    assert rec.failed == {} and rec.skipped == []
    assert rec.metrics["n"] == X.shape[0]


def test_client_order_kept_and_ids_can_be_anything():
    ids = [7, "b", ("site", 2), 3.5]
    data = make_data(ids=ids)
    res = run(FedMean(), data, rounds=2, progress=False)
    assert list(res.client_states) == ids
    assert res.history[1].participants == ids
    assert list(res.communication.per_client) == ids


def test_history_is_list_like_and_has_dataframe():
    res = run(Noisy(), make_data(4), rounds=3, participation=2, progress=False)
    h = res.history
    assert len(h) == 3 and [r.round for r in h] == [0, 1, 2]
    assert h[-1].round == 2 and isinstance(h[1:], History) and len(h[1:]) == 2
    assert h.metric("step") == [r.metrics["step"] for r in h]
    df = h.to_dataframe()
    assert list(df.index) == [0, 1, 2]
    for col in [
        "n_participants",
        "n_answered",
        "n_failed",
        "n_skipped",
        "bytes_up",
        "bytes_down",
        "seconds",
        "step",
        "theta0",
        "participants",
        "failed",
    ]:
        assert col in df.columns, col
    assert (df["n_participants"] == 2).all()
    assert df["bytes_up"].sum() == res.communication.bytes_up


# --------------------------------------------------------------------------- participation


def participants(res):
    return [r.participants for r in res.history]


def test_participation_fraction_uses_ceil_and_at_least_one():
    data = make_data(10)
    for p, k in [(0.3, 3), (0.25, 3), (0.31, 4), (0.01, 1), (1.0, 10), (np.float64(0.5), 5)]:
        res = run(FedMean(), data, rounds=4, participation=p, progress=False)
        assert all(len(ps) == k for ps in participants(res)), (p, k)
        for ps in participants(res):
            assert ps == [c for c in data if c in ps]  # client-list order, no duplicates


def test_participation_count_and_seed_determinism():
    data = make_data(10)
    a = run(FedMean(), data, rounds=8, participation=3, seed=5, progress=False)
    b = run(FedMean(), data, rounds=8, participation=3, seed=5, progress=False)
    c = run(FedMean(), data, rounds=8, participation=3, seed=6, progress=False)
    assert participants(a) == participants(b)
    assert participants(a) != participants(c)
    assert all(len(ps) == 3 for ps in participants(a))
    assert len({tuple(ps) for ps in participants(a)}) > 1  # re-drawn each round
    # same count as a fraction gives the same draw
    d = run(FedMean(), data, rounds=8, participation=0.3, seed=5, progress=False)
    assert participants(d) == participants(a)
    # the sampling rng is the documented one
    for r, ps in enumerate(participants(a)):
        s = int(np.random.default_rng([5, 6, zlib.crc32(b""), 0]).integers(2**62))  # the run's seed
        idx = sorted(np.random.default_rng([s, 3, r]).choice(10, size=3, replace=False))  # "participants" of r
        assert ps == [list(data)[i] for i in idx]


def test_participation_callable_gets_round_and_deterministic_rng():
    data = make_data(6)
    ids = list(data)
    calls = []

    def pick(round, rng):
        calls.append(round)
        return [ids[int(i)] for i in rng.choice(6, size=2, replace=False)][::-1]  # any order

    a = run(Noisy(), data, rounds=4, participation=pick, progress=False)
    b = run(Noisy(), data, rounds=4, participation=pick, progress=False)
    assert calls == [0, 1, 2, 3, 0, 1, 2, 3]
    assert participants(a) == participants(b)
    for ps in participants(a):
        assert len(ps) == 2 and ps == [c for c in ids if c in ps]
    assert strip_seconds(a.history) == strip_seconds(b.history)


def test_participation_schedule_and_order_independence():
    data = make_data(5)
    ids = list(data)
    sched = [[ids[3], ids[0]], [ids[1]], ids[::-1]]
    res = run(Noisy(), data, rounds=3, participation=sched, progress=False)
    assert participants(res) == [[ids[0], ids[3]], [ids[1]], ids]
    # the order in which participants are listed changes nothing
    res2 = run(Noisy(), data, rounds=3, participation=[[ids[0], ids[3]], [ids[1]], ids], progress=False)
    np.testing.assert_array_equal(res.server_state["theta"], res2.server_state["theta"])
    assert strip_seconds(res.history) == strip_seconds(res2.history)
    for c in ids:
        np.testing.assert_array_equal(res.client_states[c]["walk"], res2.client_states[c]["walk"])
    # a longer schedule is fine (only the first `rounds` entries are used)
    run(Noisy(), data, rounds=2, participation=sched, progress=False)


def test_client_rng_depends_only_on_seed_round_and_index():
    data = make_data(4)
    ids = list(data)
    solo = run(Noisy(), data, rounds=1, participation=[[ids[2]]], progress=False)
    full = run(Noisy(), data, rounds=1, participation=1.0, progress=False)
    # client 2's private walk is the same whether it ran alone or with everyone
    np.testing.assert_array_equal(solo.client_states[ids[2]]["walk"], full.client_states[ids[2]]["walk"])
    # the run's seed: the stream "run" (tag 6) of its kind (none given: "") and occurrence 0
    s = int(np.random.default_rng([0, 6, zlib.crc32(b""), 0]).integers(2**62))
    init_rng = np.random.default_rng([s, 2, 2])  # "client init" of client 2
    step_rng = np.random.default_rng([s, 4, 0, 2])  # "client step" of round 0, client 2
    expected = init_rng.normal(size=2) + 0.1 * step_rng.normal(size=2)
    np.testing.assert_allclose(full.client_states[ids[2]]["walk"], expected)
    # the server started from the documented init_server stream
    theta0 = np.random.default_rng([s, 1]).normal(size=2)
    g = np.mean([d.X[:, :2].mean(axis=0) - theta0 for d in data.values()], axis=0)
    np.testing.assert_allclose(full.server_state["theta"], theta0 + 0.5 * g, atol=0.05)


def test_empty_participation_round_still_calls_server_step():
    data = make_data(3)
    spy = Spy({})
    for c, d in data.items():
        data[c] = TaggedData(d.X, c)
    res = run(spy, data, rounds=2, participation=[[], list(data)], progress=False)
    assert spy.received[0] == (0, {})
    assert res.history[0].participants == [] and res.history[0].metrics == {"n": 0.0}
    assert res.history[0].bytes_down == 0 and res.history[0].bytes_up == 0
    assert res.history[1].answered == list(data)


@pytest.mark.parametrize(
    "participation, err, match",
    [
        (0, ValueError, "count"),
        (11, ValueError, "count"),
        (-1, ValueError, "count"),
        (0.0, ValueError, "fraction"),
        (1.5, ValueError, "fraction"),
        (float("nan"), ValueError, "fraction"),
        (True, TypeError, "bool"),
        ("all", TypeError, "participation"),
        ([["c0"]], ValueError, "fewer than rounds"),
        ([["c0"], ["nope"]], ValueError, "unknown client"),
        ([["c0"], ["c1", "c1"]], ValueError, "twice"),
        ([["c0"], "c1"], TypeError, "sequence of client ids"),
    ],
)
def test_participation_errors(participation, err, match):
    with pytest.raises(err, match=match):
        run(FedMean(), make_data(10), rounds=2, participation=participation, progress=False)


def test_participation_callable_unknown_ids():
    with pytest.raises(ValueError, match=r"unknown client id\(s\) \['ghost'\]"):
        run(FedMean(), make_data(3), rounds=1, participation=lambda r, rng: ["c0", "ghost"], progress=False)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(rounds=0), ValueError, "rounds"),
        (dict(rounds=2.0), ValueError, "rounds"),
        (dict(rounds=True), ValueError, "rounds"),
        (dict(rounds=2, seed=-1), ValueError, "seed"),
        (dict(rounds=2, seed=1.5), ValueError, "seed"),
        (dict(rounds=2, min_rounds=3), ValueError, "min_rounds"),
        (dict(rounds=2, min_rounds=0), ValueError, "min_rounds"),
        (dict(rounds=2, checkpoint_every=0), ValueError, "checkpoint_every"),
        (dict(rounds=2, resume=True), ValueError, "checkpoint path"),
        (dict(rounds=2, progress="yes"), TypeError, "progress"),
    ],
)
def test_argument_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        run(FedMean(), make_data(3), **kwargs)


def test_data_errors():
    with pytest.raises(TypeError, match="mapping"):
        run(FedMean(), [np.zeros(3)], rounds=1)
    with pytest.raises(ValueError, match="no clients"):
        run(FedMean(), {}, rounds=1)
    with pytest.raises(TypeError, match="FederatedAlgorithm"):
        run(object(), make_data(2), rounds=1)


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("batched", [True, False])
def test_failing_client_does_not_sink_the_round(batched):
    data = make_data(4)
    bad = data["c2"]
    alg = Exploding(bad, rounds=(1,))
    res = run(alg, data, rounds=3, progress=False, batched=batched)
    r0, r1, r2 = res.history
    assert r1.participants == list(data)
    assert r1.failed == {"c2": "RuntimeError: client lost power"}
    assert r1.answered == ["c0", "c1", "c3"] and r1.skipped == []
    assert r0.failed == {} and r2.failed == {}
    # its private state did not advance in the failed round
    assert res.client_states["c2"] == {"steps": 2}
    assert all(res.client_states[c] == {"steps": 3} for c in ["c0", "c1", "c3"])
    # the server's running totals are exactly the sum over accepted replies
    n = {c: d.X.shape[0] for c, d in data.items()}
    s = {c: d.X.sum(axis=0) for c, d in data.items()}
    answered = [c for r in res.history for c in r.answered]
    assert res.server_state["seen_n"] == sum(n[c] for c in answered)
    np.testing.assert_allclose(res.server_state["seen_s"], sum(s[c] for c in answered))
    # round 1's mean is over the survivors only
    assert r1.metrics["n"] == n["c0"] + n["c1"] + n["c3"]


def test_all_clients_fail_server_step_gets_empty_mapping():
    data = make_data(2)

    class AllFail(FedMean):
        seen = []

        def client_step(self, message, state, data, rng):
            raise ValueError("nope")

        def server_step(self, server_state, replies, round):
            self.seen.append(dict(replies))
            return super().server_step(server_state, replies, round)

    alg = AllFail()
    res = run(alg, data, rounds=1, progress=False)
    assert alg.seen == [{}]
    assert res.history[0].failed == {"c0": "ValueError: nope", "c1": "ValueError: nope"}
    assert res.communication.bytes_up == 0


@pytest.mark.parametrize("batched", [True, False])
def test_skip_round_recorded_as_skipped(batched):
    data = make_data(3)
    alg = Exploding(data["c1"], rounds=(0,), exc=SkipRound("cavity not positive definite"))
    res = run(alg, data, rounds=2, progress=False, batched=batched)
    assert res.history[0].skipped == ["c1"]
    assert res.history[0].failed == {}
    assert res.history[0].answered == ["c0", "c2"]
    assert res.history[1].skipped == []
    assert res.client_states["c1"] == {"steps": 1}


def test_batched_equals_loop_and_calls_client_steps_once_per_round():
    data = make_data(6)
    vec = VectorisedNoisy()
    a = run(vec, data, rounds=5, participation=0.5, seed=3, progress=False, batched=True)
    b = run(Noisy(), data, rounds=5, participation=0.5, seed=3, progress=False, batched=False)
    assert vec.batch_calls == 5
    np.testing.assert_allclose(a.server_state["theta"], b.server_state["theta"], rtol=1e-12)
    for c in data:
        np.testing.assert_allclose(a.client_states[c]["walk"], b.client_states[c]["walk"], rtol=1e-12)
        assert a.client_states[c]["steps"] == b.client_states[c]["steps"]
    assert participants(a) == participants(b)
    assert same_bytes(a.communication, b.communication)
    assert all(r.batch_fallback is None for r in a.history)


def test_batched_call_that_raises_falls_back_per_client():
    data = make_data(4)
    with pytest.warns(RuntimeWarning, match="falling back"):
        a = run(BrokenBatch(), data, rounds=3, progress=False, batched=True)
    b = run(Noisy(), data, rounds=3, progress=False, batched=False)
    # identical, although the broken batch call consumed its rngs before raising
    np.testing.assert_array_equal(a.server_state["theta"], b.server_state["theta"])
    for c in data:
        np.testing.assert_array_equal(a.client_states[c]["walk"], b.client_states[c]["walk"])
    assert all(r.batch_fallback == "MemoryError: vectorised kernel ran out of memory" for r in a.history)
    assert all(r.failed == {} for r in a.history)


def test_batched_fallback_isolates_the_bad_client():
    data = make_data(4)

    class BadBatch(Exploding):
        def client_steps(self, messages, states, datas, rngs):
            raise RuntimeError("whole batch")

    with pytest.warns(RuntimeWarning):
        res = run(BadBatch(data["c0"], rounds=(0,)), data, rounds=1, progress=False)
    assert res.history[0].failed == {"c0": "RuntimeError: client lost power"}
    assert res.history[0].answered == ["c1", "c2", "c3"]


def test_batched_entries_may_be_exceptions_or_garbage():
    data = make_data(4)

    class PerEntry(FedMean):
        def client_steps(self, messages, states, datas, rngs):
            out = super().client_steps(messages, states, datas, rngs)
            out[1] = KeyError("row 7")
            out[2] = SkipRound("not this time")
            out[3] = "garbage"
            return out

    res = run(PerEntry(), data, rounds=1, progress=False)
    rec = res.history[0]
    assert rec.answered == ["c0"]
    assert rec.failed["c1"] == "KeyError: 'row 7'"
    assert rec.failed["c3"].startswith("ProtocolError:")
    assert rec.skipped == ["c2"]
    assert rec.batch_fallback is None
    assert res.client_states["c1"] == {"steps": 0} and res.client_states["c0"] == {"steps": 1}


def test_batched_wrong_length_falls_back():
    class Short(FedMean):
        def client_steps(self, messages, states, datas, rngs):
            return super().client_steps(messages, states, datas, rngs)[:-1]

    data = make_data(3)
    with pytest.warns(RuntimeWarning):
        res = run(Short(), data, rounds=1, progress=False)
    assert res.history[0].answered == list(data)
    assert "2 results for 3 clients" in res.history[0].batch_fallback


def test_invalid_broadcast_is_a_server_error():
    class BadBroadcast(FedMean):
        def broadcast(self, server_state, client, round):
            return {"mean": [1.0, 2.0]}

    with pytest.raises(ProtocolError, match="broadcast"):
        run(BadBroadcast(), make_data(2), rounds=1, progress=False)


def test_broadcast_arrives_read_only_copy():
    seen = []

    class Peek(FedMean):
        def client_step(self, message, state, data, rng):
            seen.append(message["mean"])
            return super().client_step(message, state, data, rng)

    res = run(Peek(), make_data(2), rounds=2, progress=False)
    assert all(isinstance(m, np.ndarray) and not m.flags.writeable for m in seen)
    assert all(not np.shares_memory(m, res.server_state["mean"]) for m in seen)


# --------------------------------------------------------------------------- the key test


BAD_MODES = [
    "extra_raw_X",
    "list",
    "object",
    "missing",
    "nan",
    "inf",
    "not_a_mapping",
    "data_object",
    "state_object",
    "complex",
    "string",
    "bad_tuple",
]


@pytest.mark.parametrize("batched", [True, False])
def test_server_never_receives_anything_but_declared_arrays(batched):
    rng = np.random.default_rng(1)
    ids = ["good1"] + BAD_MODES + ["good2"]
    data = {c: TaggedData(X=rng.normal(size=(4 + k, 3)), tag=c) for k, c in enumerate(ids)}
    spy = Spy(modes={m: m for m in BAD_MODES})
    res = run(spy, data, rounds=3, progress=False, batched=batched)

    assert len(spy.received) == 3
    for rnd, replies in spy.received:
        # only the correct clients reached the server, and with exactly the declared keys
        assert list(replies) == ["good1", "good2"]
        for c, msg in replies.items():
            assert type(msg) is dict
            assert set(msg) == set(spy.reply_keys)
            for k, v in msg.items():
                assert type(v) is np.ndarray
                assert v.dtype.kind in "biuf"
                assert not v.flags.writeable
                assert np.all(np.isfinite(v))
                assert not np.shares_memory(v, data[c].X)
        np.testing.assert_array_equal(replies["good1"]["s"], data["good1"].X.sum(axis=0))

    # nothing the server was given anywhere is client data or a client state
    client_objects = list(data.values()) + [d.X for d in data.values()]
    for server_state, replies, rnd in spy.server_args:
        assert isinstance(rnd, int)
        for msg in replies.values():
            for v in msg.values():
                assert isinstance(v, np.ndarray)
                assert all(v is not o for o in client_objects)
        for v in server_state.values():
            assert all(v is not o for o in client_objects)

    # every misbehaving client is recorded as failed, every round, with a protocol error
    for rec in res.history:
        assert rec.answered == ["good1", "good2"]
        assert set(rec.failed) == set(BAD_MODES)
        assert all(msg.startswith("ProtocolError:") for msg in rec.failed.values()), rec.failed
    assert "undeclared ['X']" in res.history[0].failed["extra_raw_X"]
    assert "missing ['n']" in res.history[0].failed["missing"]
    assert "NaN" in res.history[0].failed["nan"]
    # and their state never advanced (the step was rejected as a whole)
    for m in BAD_MODES:
        assert res.client_states[m] == {"steps": 0}
    assert res.client_states["good1"] == {"steps": 3}
    # server totals are consistent with the accepted replies only
    assert res.server_state["seen_n"] == 3 * (data["good1"].X.shape[0] + data["good2"].X.shape[0])
    # and a rejected reply costs no upload
    assert res.communication.per_client["extra_raw_X"]["bytes_up"] == 0


def test_server_side_never_handed_client_objects():
    """init_server, broadcast, server_step and converged only see ids, arrays and server state."""
    data = make_data(3)
    data_objs = list(data.values())
    seen = []

    class Watch(FedMean):
        def init_server(self, clients, rng):
            seen.append(("init_server", list(clients)))
            return super().init_server(clients, rng)

        def broadcast(self, server_state, client, round):
            seen.append(("broadcast", server_state, client))
            return super().broadcast(server_state, client, round)

        def server_step(self, server_state, replies, round):
            seen.append(("server_step", server_state, replies))
            for msg in replies.values():
                assert all(isinstance(v, np.ndarray) for v in msg.values())
            return super().server_step(server_state, replies, round)

        def converged(self, server_state, metrics):
            seen.append(("converged", server_state, metrics))
            return False

    run(Watch(), data, rounds=2, progress=False)
    assert seen[0] == ("init_server", list(data))

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                yield k
                yield from walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from walk(v)
        else:
            yield x

    for item in seen:
        for v in walk(item[1:]):
            assert not isinstance(v, ClientData)
            assert all(v is not d.X for d in data_objs)


# --------------------------------------------------------------------------- bytes


def test_bytes_counting_exact():
    data = make_data(4, d=3)
    alg = Exploding(data["c3"], rounds=(1,))  # broadcast: mean (3 float64) + round (int64 0-d)
    res = run(alg, data, rounds=2, progress=False)
    down_msg = 3 * 8 + 8  # 32 bytes per participant per round
    up_msg = 3 * 8 + 8  # s: 3 float64, n: 0-d int64
    r0, r1 = res.history
    assert r0.bytes_down == 4 * down_msg and r0.bytes_up == 4 * up_msg
    assert r1.bytes_down == 4 * down_msg and r1.bytes_up == 3 * up_msg  # c3 failed: no upload
    comm = res.communication
    assert isinstance(comm, Communication)
    assert comm.bytes_down == 8 * down_msg == 256
    assert comm.bytes_up == 7 * up_msg == 224
    assert comm.bytes_total == 480
    assert comm.rounds == 2
    assert comm.per_client["c0"] == {"bytes_up": 2 * up_msg, "bytes_down": 2 * down_msg}
    assert comm.per_client["c3"] == {"bytes_up": 1 * up_msg, "bytes_down": 2 * down_msg}


def test_bytes_only_for_participants():
    data = make_data(4)
    ids = list(data)
    res = run(FedMean(), data, rounds=2, participation=[[ids[0]], [ids[0], ids[1]]], progress=False)
    assert res.communication.per_client[ids[0]] == {"bytes_up": 64, "bytes_down": 48}
    assert res.communication.per_client[ids[1]] == {"bytes_up": 32, "bytes_down": 24}
    assert res.communication.per_client[ids[2]] == {"bytes_up": 0, "bytes_down": 0}
    assert res.communication.bytes_down == 72 and res.communication.bytes_up == 96


# --------------------------------------------------------------------------- checkpoints


def same_bytes(a, b):
    """Equal counts; ``by_kind`` labels differ where the two runs used different algorithm classes."""
    from dataclasses import replace

    return replace(a, by_kind={}) == replace(b, by_kind={}) and list(a.by_kind.values()) == list(b.by_kind.values())


def assert_same_run(a, b):
    np.testing.assert_array_equal(a.server_state["theta"], b.server_state["theta"])
    assert a.server_state["step"] == b.server_state["step"]
    assert list(a.client_states) == list(b.client_states)
    for c in a.client_states:
        np.testing.assert_array_equal(a.client_states[c]["walk"], b.client_states[c]["walk"])
        assert a.client_states[c]["steps"] == b.client_states[c]["steps"]
    assert a.history == b.history  # RoundRecord equality ignores seconds
    assert same_bytes(a.communication, b.communication)
    assert a.rounds == b.rounds and a.converged == b.converged


@pytest.mark.parametrize("participation", [1.0, 0.5, 2])
@pytest.mark.parametrize("batched", [True, False])
def test_resume_equals_straight_run(tmp_path, participation, batched):
    data = make_data(6)
    p = tmp_path / "run.ckpt"
    straight = run(Noisy(), data, rounds=6, participation=participation, seed=11, progress=False)
    first = run(
        Noisy(), data, rounds=3, participation=participation, seed=11, progress=False, checkpoint=p, batched=batched
    )
    assert first.rounds == 3 and p.exists()
    resumed = run(
        Noisy(),
        data,
        rounds=6,
        participation=participation,
        seed=11,
        progress=False,
        checkpoint=str(p),
        resume=True,
        batched=batched,
    )
    assert resumed.resumed_from == 3 and resumed.rounds == 6
    assert_same_run(straight, resumed)
    saved = read_checkpoint(str(p))  # the safe file format: no pickle
    assert zipfile.is_zipfile(p)
    assert saved["completed"] == 6 and saved["seed"] == 11 and saved["format"] == 2
    assert saved["fingerprint"]["algorithm"].endswith("Noisy")
    assert [os.path.basename(f) for f in glob.glob(str(tmp_path / "*"))] == ["run.ckpt"]  # no temp left


def test_resume_after_crash_same_algorithm(tmp_path):
    data = make_data(5)
    p = tmp_path / "crash.ckpt"
    straight = run(Noisy(), data, rounds=6, participation=3, progress=False)

    class Flaky(Noisy):
        crash_at = 4

        def server_step(self, server_state, replies, round):
            if round == self.crash_at:
                raise KeyboardInterrupt
            return super().server_step(server_state, replies, round)

    with pytest.raises(KeyboardInterrupt):
        run(Flaky(), data, rounds=6, participation=3, progress=False, checkpoint=p, checkpoint_every=2)
    assert read_checkpoint(str(p))["completed"] == 4
    alg = Flaky()
    alg.crash_at = -1
    resumed = run(alg, data, rounds=6, participation=3, progress=False, checkpoint=p, resume=True)
    assert resumed.resumed_from == 4
    assert_same_run(straight, resumed)


def test_checkpoint_every_and_final_write(tmp_path, monkeypatch):
    import fedstats.federation.runner as runner_mod

    writes = []
    orig = runner_mod.write_atomic

    def spy(path, payload):
        writes.append(payload["completed"])
        orig(path, payload)

    monkeypatch.setattr(runner_mod, "write_atomic", spy)
    run(FedMean(), make_data(3), rounds=5, checkpoint=tmp_path / "c.ckpt", checkpoint_every=2, progress=False)
    assert writes == [2, 4, 5]


def test_resume_fingerprint_mismatch(tmp_path):
    data = make_data(4)
    p = tmp_path / "fp.ckpt"
    run(Noisy(), data, rounds=2, participation=0.5, seed=1, checkpoint=p, progress=False)
    with pytest.raises(ValueError, match=r"seed: checkpoint 1, this run 2"):
        run(Noisy(), data, rounds=4, participation=0.5, seed=2, checkpoint=p, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"participation"):
        run(Noisy(), data, rounds=4, participation=0.75, seed=1, checkpoint=p, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"algorithm: checkpoint .*Noisy, this run .*FedMean"):
        run(FedMean(), data, rounds=4, participation=0.5, seed=1, checkpoint=p, resume=True, progress=False)
    fewer = dict(list(data.items())[:3])
    with pytest.raises(ValueError, match=r"clients: checkpoint has 4, this run 3"):
        run(Noisy(), fewer, rounds=4, participation=0.5, seed=1, checkpoint=p, resume=True, progress=False)
    reordered = dict(reversed(list(data.items())))
    with pytest.raises(ValueError, match=r"different order"):
        run(Noisy(), reordered, rounds=4, participation=0.5, seed=1, checkpoint=p, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"already holds 2 rounds"):
        run(Noisy(), data, rounds=1, participation=0.5, seed=1, checkpoint=p, resume=True, progress=False)
    # resume=False just starts over and overwrites
    res = run(Noisy(), data, rounds=1, participation=0.75, seed=2, checkpoint=p, progress=False)
    assert res.resumed_from == 0


def test_resume_schedule_may_be_extended_but_not_rewritten(tmp_path):
    data = make_data(3)
    ids = list(data)
    sched = [[ids[0]], [ids[1], ids[2]], ids, [ids[2]]]
    p = tmp_path / "s.ckpt"
    straight = run(Noisy(), data, rounds=4, participation=sched, progress=False)
    run(Noisy(), data, rounds=2, participation=sched[:2], checkpoint=p, progress=False)
    resumed = run(Noisy(), data, rounds=4, participation=sched, checkpoint=p, resume=True, progress=False)
    assert_same_run(straight, resumed)
    other = [[ids[1]]] + sched[1:]
    with pytest.raises(ValueError, match="schedule differs at round 0"):
        run(Noisy(), data, rounds=4, participation=other, checkpoint=p, resume=True, progress=False)


def test_resume_without_file_starts_fresh(tmp_path):
    p = tmp_path / "none.ckpt"
    data = make_data(3)
    res = run(Noisy(), data, rounds=2, checkpoint=p, resume=True, progress=False)
    assert res.resumed_from == 0 and res.rounds == 2 and p.exists()
    again = run(Noisy(), data, rounds=2, checkpoint=p, resume=True, progress=False)
    assert again.resumed_from == 2 and again.rounds == 2
    assert_same_run(res, again)


def test_not_a_checkpoint(tmp_path):
    p = tmp_path / "junk.ckpt"
    p.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="could not read checkpoint"):
        run(Noisy(), make_data(2), rounds=2, checkpoint=p, resume=True, progress=False)


# --------------------------------------------------------------------------- convergence


def test_early_stopping_via_converged():
    data = make_data(4)
    res = run(Noisy(tol=1e-3), data, rounds=200, progress=False)
    assert res.converged and res.rounds < 200
    assert len(res.history) == res.rounds
    assert res.history[-1].converged and not any(r.converged for r in res.history[:-1])
    assert res.history[-1].metrics["step"] < 1e-3


def test_min_rounds_delays_stopping():
    class Always(FedMean):
        def converged(self, server_state, metrics):
            return True

    data = make_data(2)
    assert run(Always(), data, rounds=10, progress=False).rounds == 1
    res = run(Always(), data, rounds=10, min_rounds=4, progress=False)
    assert res.rounds == 4 and res.converged
    assert not run(FedMean(), data, rounds=3, progress=False).converged


def test_resume_after_convergence_runs_no_more(tmp_path):
    data = make_data(4)
    p = tmp_path / "conv.ckpt"
    first = run(Noisy(tol=1e-3), data, rounds=200, checkpoint=p, progress=False)
    assert first.converged
    again = run(Noisy(tol=1e-3), data, rounds=300, checkpoint=p, resume=True, progress=False)
    assert again.rounds == first.rounds and again.converged
    assert_same_run(first, again)


# --------------------------------------------------------------------------- progress


def test_progress_false_prints_nothing(capfd):
    run(Noisy(), make_data(3), rounds=3, progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_progress_none_hidden_when_not_a_tty(capfd):
    run(Noisy(), make_data(3), rounds=3)  # pytest's captured stderr is not a TTY
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_progress_true_shows_bar_with_metrics(capsys):
    run(FedMean(), make_data(3), rounds=3, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    assert "3/3" in err and "failed=0" in err and "mean0=" in err


# --------------------------------------------------------------------------- round lines


def test_round_lines_print_each_round_and_the_ending():
    import io

    out = io.StringIO()
    with fed.round_lines(out, label="toy", min_interval=0):
        res = run(FedMean(), make_data(), rounds=3, seed=0)
        run(FedMean(), make_data(), rounds=2, seed=0, progress=False)  # a one-off exchange: quiet
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines[:3]] == ["toy: round 1/3", "toy: round 2/3", "toy: round 3/3"]
    assert "5/5 answered" in lines[0] and len(lines) == 4
    assert lines[3].startswith(f"toy: stopped after {res.rounds} round(s) (the limit)")


def test_round_lines_throttle_fast_rounds_but_keep_first_and_last(capsys):
    import io

    out = io.StringIO()
    with fed.round_lines(out, min_interval=3600):
        run(FedMean(), make_data(), rounds=6, seed=0)
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines[:2]] == ["FedMean: round 1/6", "FedMean: round 6/6"]
    assert len(lines) == 3
    # outside the block: no lines (and no bar, stderr not being a terminal under pytest)
    capsys.readouterr()
    run(FedMean(), make_data(), rounds=2, seed=0)
    assert capsys.readouterr().err == ""


def test_counting_adds_up_every_run_by_kind_and_nests():
    data = make_data()
    with fed.counting() as outer:
        a = run(FedMean(), data, rounds=3, seed=0)
        with fed.counting() as inner:
            b = run(FedMean(), data, rounds=2, seed=0, kind="one-off")
        c = run(FedMean(), data, rounds=1, seed=1, kind="one-off")
    run(FedMean(), data, rounds=1, seed=0)  # outside: counted nowhere
    assert a.communication.by_kind == {
        "FedMean": {
            "bytes_up": a.communication.bytes_up,
            "bytes_down": a.communication.bytes_down,
            "rounds": 3,
            "runs": 1,
        }
    }
    total, only_b = outer.communication(), inner.communication()
    assert (only_b.bytes_up, only_b.bytes_down) == (b.communication.bytes_up, b.communication.bytes_down)
    assert (
        total.bytes_up
        == sum(r.communication.bytes_up for r in (a, b, c))
        == sum(h.bytes_up for r in (a, b, c) for h in r.history)
    )
    assert total.rounds == 6 and set(total.by_kind) == {"FedMean", "one-off"}
    assert total.by_kind["one-off"] == {
        "bytes_up": b.communication.bytes_up + c.communication.bytes_up,
        "bytes_down": b.communication.bytes_down + c.communication.bytes_down,
        "rounds": 3,
        "runs": 2,
    }
    for client, per in total.per_client.items():
        assert per["bytes_up"] == sum(r.communication.per_client[client]["bytes_up"] for r in (a, b, c))
    assert list(total.breakdown().index) == ["FedMean", "one-off"]


def test_random_streams_are_named_distinct_and_stable():
    """Every seeded stream's purpose lives in fedstats.streams with its tag; the tags differ, and
    the layout of the runner's streams is the documented one (a change would change every
    seeded result and break equality with results saved earlier)."""
    from fedstats import streams
    from fedstats.federation.client_side import client_rng

    tags = [tag for tag, _ in streams.PURPOSES.values()]
    assert len(tags) >= 6 and len(set(tags)) == len(tags)
    assert client_rng(5, 3, 2).random() == np.random.default_rng([5, 4, 3, 2]).random()
    assert client_rng(5, 3, 2, init=True).random() == np.random.default_rng([5, 2, 2]).random()


# --------------------------------------------------------------------------- declared sums


class SummedMean(FedMean):
    """FedMean declaring that the server uses "s" and "n" only through their sums."""

    summed_keys = ("s", "n")

    def server_step(self, server_state, replies, round):
        self.seen = [dict(r) for r in replies.values()]  # what the server step could read per client
        self.sums = dict(replies.sums)
        st = dict(server_state)
        if replies.sums:
            st["mean"] = replies.sums["s"] / replies.sums["n"]
        return st, {}


def test_declared_sums_reach_the_server_step_summed_only():
    data = make_data(4)
    alg = SummedMean()
    out = run(alg, data, rounds=1, progress=False)
    assert alg.seen == [{} for _ in data]  # no client's own value of a declared sum
    np.testing.assert_allclose(alg.sums["s"], sum(d.X.sum(axis=0) for d in data.values()), rtol=1e-14)
    assert alg.sums["n"] == sum(d.X.shape[0] for d in data.values())
    plain = run(FedMean(), data, rounds=1, progress=False)
    np.testing.assert_allclose(out.server_state["mean"], plain.server_state["mean"], rtol=1e-14)
    # the bytes are those of every client's reply, as before
    assert out.communication.bytes_up == plain.communication.bytes_up


def test_declared_sums_with_failed_clients_and_bad_declarations():
    data = make_data(3)
    alg = SummedMean()
    run(alg, data, rounds=1, participation=[[]], progress=False)  # nobody answered: no sums
    assert alg.sums == {} and alg.seen == []

    class Wrong(SummedMean):
        summed_keys = ("s", "missing")

    with pytest.raises(TypeError, match="not reply_keys: \\['missing'\\]"):
        run(Wrong(), data, rounds=1, progress=False)

    class Ragged(SummedMean):
        def client_step(self, message, state, data, rng):
            reply, st = super().client_step(message, state, data, rng)
            return {**reply, "s": reply["s"][: 1 + (len(data.y) > 4)]}, st

    # issue 41: the client whose summed array has another shape than most clients' is blamed
    # (it sits the round out); the others are summed
    out = run(Ragged(), data, rounds=1, progress=False)
    assert (
        list(out.history[0].failed) == ["c0"] and "BrokenReply: sent 's' of shape (1,)" in out.history[0].failed["c0"]
    )
    assert sorted(out.history[0].answered) == ["c1", "c2"]


# ------------------------------------------------------------------ batched validation (issue 22)
def _outcome(f):
    try:
        return f()
    except ProtocolError as exc:
        return exc


def test_batched_validation_equals_one_message_at_a_time():
    """validate_messages (one stack per key) gives every message what validate_message gives
    it: the same read-only arrays, or the same error, whatever the mix."""
    from fedstats.federation.protocol import validate_message, validate_messages

    rng = np.random.default_rng(0)

    def good():
        return {"a": rng.standard_normal((2, 3)), "b": np.array([rng.integers(9)]), "c": np.float64(rng.random())}

    bad = [
        {**good(), "a": np.full((2, 3), np.nan)},
        {**good(), "b": [1]},
        {**good(), "x": np.zeros(1)},
        {**good(), "a": np.zeros((2, 3), dtype=complex)},
        "not a mapping",
        {**good(), "c": np.array([np.inf, 1.0])[:1]},
    ]
    keys = ("a", "b", "c")
    every_complex = [{**good(), "a": np.zeros((2, 3), dtype=complex)} for _ in range(3)]
    mixes = ([good() for _ in range(5)], [good(), *bad, good()], [{**good(), "a": np.zeros((3, 3))}, good()])
    for mix in (*mixes, every_complex):
        who = [f"client {i}" for i in range(len(mix))]
        batched = validate_messages(mix, keys, who)
        for m, w, got in zip(mix, who, batched):
            want = _outcome(lambda: validate_message(m, keys, who=w))
            if isinstance(want, ProtocolError):
                assert isinstance(got, ProtocolError) and str(got) == str(want)
                continue
            assert not isinstance(got, ProtocolError) and got.keys() == want.keys()
            for k in keys:
                assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
                np.testing.assert_array_equal(got[k], want[k])
                assert not got[k].flags.writeable and not np.shares_memory(got[k], m[k])
    assert validate_messages([{}, {}], (), ["client 0", "client 1"]) == [{}, {}]


def test_one_broadcast_array_is_checked_once_and_shared():
    """An array the server broadcasts to every client reaches each of them as one read-only
    copy (checked once per round); arrays of their own stay their own."""
    seen = []

    class Shared(FedMean):
        def broadcast(self, server_state, client, round):
            return {"mean": server_state["mean"], "own": np.array([float(len(str(client)))])}

        def client_step(self, message, state, data, rng):
            seen.append(message)
            return super().client_step({"mean": message["mean"]}, state, data, rng)

    res = run(Shared(), make_data(3), rounds=1, progress=False, batched=False)
    assert len({id(m["mean"]) for m in seen}) == 1 and len({id(m["own"]) for m in seen}) == 3
    assert not seen[0]["mean"].flags.writeable and not np.shares_memory(seen[0]["mean"], res.server_state["mean"])


def test_client_steps_that_draw_nothing_get_no_stream():
    got = []

    class Plain(FedMean):
        random_client_steps = False

        def client_step(self, message, state, data, rng):
            got.append(rng)
            return super().client_step(message, state, data, rng)

    run(Plain(), make_data(2), rounds=1, progress=False)
    assert got == [None, None]
    got.clear()
    run(type("Drawing", (Plain,), {"random_client_steps": True})(), make_data(2), rounds=1, progress=False)
    assert all(isinstance(r, np.random.Generator) for r in got) and len(got) == 2
