"""The runtime's part of differential privacy (FederatedAlgorithm.privacy): central noise on
the sums, one ledger release per round with the noise it actually carried, and the checks
that keep the accounting true (every reply array summed, every client in every round)."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.federation import FederatedAlgorithm, run
from fedstats.privacy import DifferentialPrivacy, PrivacyLedger

pytest.importorskip("dp_accounting")


class _Mean(FederatedAlgorithm):
    """The mean of every row, each row's count and value released under ``privacy``."""

    reply_keys = ("n", "s")
    summed_keys = ("n", "s")

    def __init__(self, dp: DifferentialPrivacy | None, n_clients: int, per_client: bool = False) -> None:
        self.privacy = dp
        self.n_clients = n_clients
        if per_client:
            self.reply_keys = ("n", "s", "own")

    def init_server(self, clients, rng):
        return []

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        rows = {"n": np.ones(len(data)), "s": data}
        if self.privacy is None:
            return {k: np.asarray(v.sum()) for k, v in rows.items()}, state
        out = self.privacy.client_sums(rows, rng, n_clients=self.n_clients)
        reply = {k: np.asarray(v) for k, v in out.sums.items()}
        if "own" in self.reply_keys:
            reply["own"] = np.zeros(1)
        return reply, state

    def server_step(self, server_state, replies, round):
        return [*server_state, (float(replies.sums["n"]), float(replies.sums["s"]))], {}


DATA = {i: np.arange(5.0) + i for i in range(4)}  # 20 rows, values 0..8, sum 70


def test_noiseless_private_run_equals_the_plain_run_and_spends_infinite_epsilon():
    dp = DifferentialPrivacy(noise_multiplier=0.0, clip={"n": 1.0, "s": 100.0})
    out = run(_Mean(dp, 4), DATA, rounds=2)
    plain = run(_Mean(None, 4), DATA, rounds=2)
    assert out.server_state == plain.server_state == [(20.0, 70.0)] * 2
    assert plain.privacy is None
    assert out.privacy.releases[0].count == 2 and out.privacy.epsilon(1e-6) == np.inf


@pytest.mark.parametrize("placement", ["central", "client"])
def test_noise_has_the_declared_size_and_the_ledger_the_noise_the_release_carried(placement):
    # 400 rounds of the same release: the sums' spread is the mechanism's
    dp = DifferentialPrivacy(noise_multiplier=2.0, clip={"n": 1.0, "s": 3.0}, placement=placement)
    out = run(_Mean(dp, 4), DATA, rounds=400, seed=3)
    sums = np.array(out.server_state)
    # clipped: rows 4..8 count 3 each -> sum of min(x, 3)
    exact = np.array([20.0, sum(min(x, 3.0) for d in DATA.values() for x in d)])
    std = dp.noise_std(["n", "s"], n_clients=4, n_answered=4)
    z = (sums - exact) / np.array([std["n"], std["s"]])
    assert np.all(np.abs(z.mean(0)) < 4 / np.sqrt(400))
    assert np.all(np.abs(z.std(0) - 1) < 0.1)
    # in process nothing is summed securely: with client noise the server reads one share
    want = 2.0 if placement == "central" else 1.0
    assert out.privacy.releases == (out.privacy.releases[0],)
    assert out.privacy.releases[0].noise_multiplier == pytest.approx(want)
    assert out.privacy.releases[0].count == 400


def test_central_noise_is_seeded_and_a_fit_ledger_collects_every_run_with_its_own_seed():
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip={"n": 1.0, "s": 10.0}, placement="central")
    ledger = PrivacyLedger()
    a = run(_Mean(dp, 4), DATA, rounds=3, seed=5, privacy_ledger=ledger, kind="moments")
    again = run(_Mean(dp, 4), DATA, rounds=3, seed=5, kind="moments")  # seeded: the same noise
    assert a.server_state == again.server_state
    other = run(_Mean(dp, 4), DATA, rounds=3, seed=5, kind="squares")  # another kind: its own streams
    assert other.server_state != a.server_state
    b = run(_Mean(dp, 4), DATA, rounds=2, seed=6, privacy_ledger=ledger, kind="EM rounds")
    assert a.server_state[:2] != b.server_state
    assert [(r.name, r.count) for r in ledger.releases] == [("moments", 3), ("EM rounds", 2)]
    # a second run of the same fit with the same seed would repeat the first one's noise
    with pytest.raises(ValueError, match="use seed 5: their noise would repeat"):
        run(_Mean(dp, 4), DATA, rounds=1, seed=5, privacy_ledger=ledger)
    single = PrivacyLedger()
    single.record("all", 1.0, count=5)
    assert ledger.epsilon(1e-6) == pytest.approx(single.epsilon(1e-6), rel=1e-12)


def test_a_checkpointed_run_keeps_the_releases_before_it_resumed(tmp_path):
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip=1.0, placement="central")
    path = tmp_path / "ck.pkl"
    run(_Mean(dp, 4), DATA, rounds=2, checkpoint=path)
    out = run(_Mean(dp, 4), DATA, rounds=5, checkpoint=path, resume=True)
    assert out.resumed_from == 2 and out.privacy.releases[0].count == 5


def test_a_private_algorithm_must_sum_every_reply_and_take_every_client():
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip=1.0)
    with pytest.raises(TypeError, match=r"releases \['own'\] per client"):
        run(_Mean(dp, 4, per_client=True), DATA, rounds=1)
    with pytest.raises(ValueError, match="every client in every round"):
        run(_Mean(dp, 4), DATA, rounds=1, participation=0.5)
    with pytest.raises(ValueError, match="every client in every round"):
        run(_Mean(dp, 4), DATA, rounds=1, participation=[[0, 1]])
    alg = _Mean(None, 4)
    alg.privacy = {"noise_multiplier": 1.0}
    with pytest.raises(TypeError, match="must be a DifferentialPrivacy"):
        run(alg, DATA, rounds=1)
    with pytest.raises(TypeError, match="privacy_ledger must be a PrivacyLedger"):
        run(_Mean(dp, 4), DATA, rounds=1, privacy_ledger={})
