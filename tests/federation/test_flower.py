"""fedstats on Flower's simulation engine: the same results as in-process, failures included.

One Flower simulation (Ray) serves most tests (``session``); ``backend="flower"`` starts and
stops its own. The real multi-process deployment is tested in ``test_flower_deployment.py``.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedstats import FederatedData, HierarchicalLinearModel  # noqa: E402
from fedstats.data import ClientData  # noqa: E402
from fedstats.data.disclosure import NO_RULES
from fedstats.datasets.synthetic import gmm_federation, hm2_federation  # noqa: E402
from fedstats.federation import ClientDisconnected, run, use_backend  # noqa: E402
from fedstats.federation.flower import FlowerSession, RemoteDataError, RemoteFederatedData, dumps, loads  # noqa: E402
from fedstats.federation.flower.clients import FlowerClients  # noqa: E402
from fedstats.gp import FGPR  # noqa: E402
from fedstats.linear import StructuralCovarianceModel  # noqa: E402
from fedstats.linear.baselines import FedAvg  # noqa: E402
from fedstats.mixture import FEMOMD, DecentralizedGaussianMixture, FederatedGaussianMixture, VariationalGaussianMixture  # noqa: E402

HERE = Path(__file__).parent
TIGHT = 1e-10

sys.path.insert(0, str(HERE))  # the toy algorithms; the nodes get this folder on PYTHONPATH
import flower_toys  # noqa: E402

sys.path.remove(str(HERE))


#: the nodes' release policy in most tests: the defaults (5 rows, 3 rows per regression
#: column), the toy algorithm's wait capped at 10 s, and the client posteriors and the
#: states a checkpoint needs released, so that fits compare with in-process ones in full
POLICY = """
min_rows = 5
release = "posterior"
release_statistics = true
posterior_dir = "{folder}"
[options.Flaky]
slow_seconds = [0, 10]
"""


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    """The session's policy file (the nodes read it again at every message)."""
    folder = tmp_path_factory.mktemp("node")
    path = folder / "policy.toml"
    path.write_text(POLICY.format(folder=(folder / "posteriors").as_posix()))
    return path


@pytest.fixture(scope="module")
def session(policy_file):
    # the nodes (Ray workers) import the toy algorithms from this folder
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE)] + ([old] if old else []))
    try:
        # half a CPU per node: 4 Ray actors on 2 cores, so one busy node does not hold up the others
        with FlowerSession(
            num_supernodes=6,
            timeout=300,
            trust=("fedstats", "flower_toys"),
            policy=policy_file,
            backend_config={"client_resources": {"num_cpus": 0.5, "num_gpus": 0.0}},
        ) as s:
            s.assign(list(range(6)))  # start it now: tests may run in any order
            yield s
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def same_history(a, b, tol=TIGHT):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert (
            ra.round,
            ra.participants,
            ra.answered,
            ra.failed,
            ra.skipped,
            ra.bytes_up,
            ra.bytes_down,
            ra.converged,
        ) == (rb.round, rb.participants, rb.answered, rb.failed, rb.skipped, rb.bytes_up, rb.bytes_down, rb.converged)
        assert ra.metrics.keys() == rb.metrics.keys()
        for k in ra.metrics:
            np.testing.assert_allclose(
                np.asarray(ra.metrics[k], float), np.asarray(rb.metrics[k], float), rtol=tol, atol=tol, err_msg=k
            )


def close(a, b, tol=TIGHT):
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- models


def test_fedem_with_backend_flower_equals_inprocess():
    data, _ = gmm_federation(n_clients=4, n_components=3, d=2, n_obs=(30, 60), seed=0)
    model = FederatedGaussianMixture(3, covariance_type="full")
    a = model.fit(data, seed=1)
    b = model.fit(data, seed=1, backend="flower")  # a simulation of its own, stopped after the fit
    close(a.means, b.means)
    close(a.covariances, b.covariances)
    for c in data.clients:
        close(a.weights[c], b.weights[c])
    assert a.loglik == pytest.approx(b.loglik, rel=1e-12)
    same_history(a.history, b.history)
    assert (a.communication.bytes_up, a.communication.bytes_down) == (
        b.communication.bytes_up,
        b.communication.bytes_down,
    )


def test_hm2_exact_ep_equals_inprocess(session):
    data, _ = hm2_federation(n_clients=5, n_obs=30, seed=0)
    model = HierarchicalLinearModel(tau=[1.0] * 4, sigma=0.05, fit_intercept=False, estimator="exact")
    a, b = model.fit(data, seed=2), model.fit(data, seed=2, backend=session)
    close(a.global_posterior().mean, b.global_posterior().mean)
    close(a.global_posterior().cov, b.global_posterior().cov)
    for c in data.clients:
        close(a.client_posterior(c).mean, b.client_posterior(c).mean)
        close(a.client_posterior(c).cov, b.client_posterior(c).cov)
    same_history(a.history, b.history)


def test_hm2_sampled_ep_equals_inprocess_client_by_client(session):
    # Importance-sampled tilted moments: each node draws from the client's own stream. A node
    # runs its client alone, as the in-process loop does; the in-process *batched* step finds
    # all Laplace modes in lockstep (iterating until the slowest converges), so it agrees
    # with both only to the mode solver's tolerance.
    data, _ = hm2_federation(n_clients=4, n_obs=20, seed=1)
    model = HierarchicalLinearModel(rounds=2, estimator_options={"num_draws": 300})
    a, b = model.fit(data, seed=3, batched=False), model.fit(data, seed=3, backend=session)
    close(a.summary()[["mean", "sd"]].to_numpy(), b.summary()[["mean", "sd"]].to_numpy())
    c = model.fit(data, seed=3)
    close(c.summary()[["mean", "sd"]].to_numpy(), b.summary()[["mean", "sd"]].to_numpy(), tol=1e-4)


def _every_byte_received(rec):
    """Each array and each bytes value (pickled states) of every message the server received."""
    out = []
    for m in rec.received:
        if m.has_error():
            continue
        for r in m.content.array_records.values():
            out += [np.ascontiguousarray(a.numpy()).tobytes() for a in r.values()]
        for r in m.content.config_records.values():
            for v in r.values():
                out += [b for b in (v if isinstance(v, list) else [v]) if isinstance(b, bytes)]
    return out


def test_client_posteriors_stay_on_the_node_under_the_default_policy(session, policy_file, monkeypatch):
    """Issue 21: under the default release policy no EP or HM1 fit sends a client's X'X, X'y or
    y'y (every message the server receives, pickled states included); each node writes its
    client's posterior for its owner, equal to the in-process one to 1e-10, and releases it
    only where its policy says so."""
    from fedstats.federation.protocol import ClientRelease
    from fedstats.linear import HierarchicalLinearModel
    from fedstats.linear.hm1_algorithm import CannotShareError
    from fedstats.results import NoPosteriorError, load_result

    data, _ = hm2_federation(n_clients=4, n_obs=30, seed=5)
    folder = policy_file.parent / "kept"
    default = f'posterior_dir = "{folder.as_posix()}"\n[options.Flaky]\nslow_seconds = [0, 10]\n'
    released = policy_file.read_text()
    rec = Recorder(session, monkeypatch)
    models = {
        "exact": HierarchicalLinearModel(rounds=4, estimator="exact", sigma=0.5, tau=1.0),
        "sampled": HierarchicalLinearModel(rounds=2, estimator_options={"num_draws": 300}),
    }
    try:
        policy_file.write_text(default)
        for name, model in models.items():
            a = model.fit(data, seed=4, batched=False)
            rec.received.clear()
            b = model.fit(data, seed=4, backend=session)
            close(a.global_posterior().mean, b.global_posterior().mean)
            secrets = [v for c in data.clients for v in a.client_states[c].stats.values() if np.size(v) > 1]
            first = a.client_states[data.clients[0]]  # the search finds a state's statistics in its pickle
            assert secrets and secrets[0].tobytes() in pickle.dumps(first)
            got = _every_byte_received(rec)
            assert got and not any(v.tobytes() in blob for v in secrets for blob in got), name
            for i, c in enumerate(data.clients):
                kept = b.client_states[c]
                assert isinstance(kept, ClientRelease) and kept.result is None
                with pytest.raises(NoPosteriorError, match=rf"stayed there \(its owner finds it in '{kept.file}'"):
                    b.client_posterior(c)
                on_node = load_result(folder / kept.file)
                assert (on_node.client, on_node.algorithm) == (c, "LinearEP")
                mine, theirs = a.client_posterior(c), on_node.result.coefficients
                close(mine.mean, theirs.mean)
                close(mine.cov if name == "exact" else mine.draws, theirs.cov if name == "exact" else theirs.draws)
        # HM1: its rounds send coefficients only, and its final state nothing; its posteriors
        # need every client's information matrix, which the default policy does not release
        hm1 = StructuralCovarianceModel(rounds=4)
        design = hm1._prepare(data)[2]
        secrets = [m for c in data.clients for X, y in [design[c]] for m in (X.T @ X, X.T @ y)]
        rec.received.clear()
        with pytest.warns(RuntimeWarning, match=r"point estimates only.*rule release_statistics"):
            points = hm1.fit(data, seed=2, backend=session)
        close(points.theta, hm1.fit(data, seed=2, uncertainty=False).theta)
        got = _every_byte_received(rec)
        assert got and not any(v.tobytes() in blob for v in secrets for blob in got)
        with pytest.raises(CannotShareError, match="rule release_statistics"):
            hm1.fit(data, seed=2, backend=session, uncertainty=True)
    finally:
        policy_file.write_text(released)
    # released: the server's result gives the node's posterior, equal to the in-process one
    for name, model in models.items():
        a, b = model.fit(data, seed=4, batched=False), model.fit(data, seed=4, backend=session)
        for c in data.clients:
            assert isinstance(b.client_states[c], ClientRelease) and b.client_states[c].result is not None
            close(a.client_posterior(c).mean, b.client_posterior(c).mean)
            close(
                a.predict(np.asarray(data[c].X)[:3], client=c).to_numpy(),
                b.predict(np.asarray(data[c].X)[:3], client=c).to_numpy(),
            )


def test_hm1_equals_inprocess(session):
    data, _ = hm2_federation(n_clients=5, n_obs=30, seed=0)
    model = StructuralCovarianceModel(rounds=6)
    a, b = model.fit(data, seed=2, uncertainty=True), model.fit(data, seed=2, uncertainty=True, backend=session)
    close(a.theta, b.theta)
    close(a.omega_array, b.omega_array)
    close(a.posterior_cov, b.posterior_cov)
    same_history(a.history, b.history)


def test_fgpr_equals_inprocess(session):
    rng = np.random.default_rng(4)
    Xs = [rng.uniform(0, 1, (25, 4)) for _ in range(4)]
    data = FederatedData.from_arrays(Xs, [np.sin(4 * X[:, 0]) + 0.2 * rng.standard_normal(25) for X in Xs], **NO_RULES)
    model = FGPR(rounds=4, local_steps=3, newton_steps=5)  # with the curvature exchanges and Newton steps
    a, b = model.fit(data, seed=5), model.fit(data, seed=5, backend=session)
    cols = ["mean", "sd", "lower", "upper"]
    assert np.isfinite(a.summary()[cols].to_numpy()).all()
    close(a.summary()[cols].to_numpy(), b.summary()[cols].to_numpy(), tol=1e-9)
    assert a.communication.by_kind["hyperparameter curvature"] == b.communication.by_kind["hyperparameter curvature"]
    X = np.random.default_rng(0).normal(size=(5, 4))
    c = data.clients[0]
    close(a.predict(X, client=c)["mean"], b.predict(X, client=c)["mean"], tol=1e-9)


def test_variational_fedem_wald_d_fedem_and_fem_omd_equal_inprocess(session):
    data, _ = gmm_federation(n_clients=5, n_components=2, d=2, n_obs=(30, 50), seed=2)
    vb = VariationalGaussianMixture(2, rounds=20)
    a, b = vb.fit(data, seed=1), vb.fit(data, seed=1, backend=session)
    close(a.summary(0.9)[["mean", "lower", "upper"]].to_numpy(), b.summary(0.9)[["mean", "lower", "upper"]].to_numpy())

    ml = FederatedGaussianMixture(2).fit(data, seed=1)
    wa = ml.wald_intervals(data, 0.9)
    wb = ml.wald_intervals(data, 0.9, backend=session)
    for fa, fb in zip(wa, wb):
        close(fa.select_dtypes("number").to_numpy(), fb.select_dtypes("number").to_numpy())

    dfe = DecentralizedGaussianMixture(2, rounds=4)
    a, b = dfe.fit(data, seed=1), dfe.fit(data, seed=1, backend=session)
    same_history(a.history, b.history)

    online_a, online_b = FEMOMD(2, inner_rounds=3), FEMOMD(2, inner_rounds=3)
    halves = [data.train_test_split(0.5, seed=s) for s in range(2)]
    for batch in [h[k] for h in halves for k in range(2)]:  # four time steps
        online_a.partial_fit(batch, seed=4)
        online_b.partial_fit(batch, seed=4, backend=session)
    close(online_a.means_, online_b.means_)
    for c in data.clients:
        close(online_a.weights_[c], online_b.weights_[c])


def test_multifidelity_chains_fit_on_flower_as_in_process(session):
    """The fit of a federated chain is a run: on Flower it equals the in-process fit, round by
    round; the queries after it travel the chain in process."""
    from fedstats.gp.multifidelity import FederatedAR1, fidelity_data
    from fedstats.gp.nargp import FederatedNARGP

    mf = fidelity_data("branin", seed=1, sizes={"LF": 30, "MF": 20, "HF": 10})
    order = ["LF", "MF", "HF"]
    for model in (FederatedAR1(restarts=1), FederatedNARGP(restarts=1, samples=20)):
        a, b = model.fit(mf.train, order, seed=3), model.fit(mf.train, order, seed=3, backend=session)
        close(a.summary()["mean"], b.summary()["mean"])
        same_history(a.history, b.history)
        assert a.communication.by_kind == b.communication.by_kind
        close(a.predict(mf.X_test[:20])["mean"], b.predict(mf.X_test[:20])["mean"])


def test_fedavg_baseline_equals_inprocess(session):
    data, _ = hm2_federation(n_clients=3, n_obs=20, seed=6)
    a, b = FedAvg(rounds=3).fit(data, seed=1), FedAvg(rounds=3).fit(data, seed=1, backend=session)
    close(a.theta, b.theta)


def test_glm_equals_inprocess(session):
    from fedstats.glm import FederatedGLM

    data, _ = hm2_federation(n_clients=4, n_obs=30, seed=7)
    data = FederatedData.from_arrays(
        [np.asarray(data[c].X) for c in data.clients],
        [(np.asarray(data[c].y) > 0).astype(float) for c in data.clients],
        **NO_RULES,
    )
    a = FederatedGLM("binomial", cov_type="HC0").fit(data, seed=1)
    b = FederatedGLM("binomial", cov_type="HC0").fit(data, seed=1, backend=session)
    close(np.r_[a.params, a.bse, a.deviance, a.llf], np.r_[b.params, b.bse, b.deviance, b.llf])
    same_history(a.history, b.history)


class Recorder:
    """Every message the server receives through the session's grid, and every client's
    declared-sum arrays of the same fits in process."""

    def __init__(self, session, monkeypatch):
        from fedstats.federation import Replies

        self.received, self.client_sums, self.client_plain = [], [], []
        grid, pull = session.grid, session.grid.pull_messages

        def pulling(ids):
            got = list(pull(ids))
            self.received.extend(got)
            return got

        monkeypatch.setattr(grid, "pull_messages", pulling)
        summing = Replies.summing.__func__

        def spy(cls, keys, replies):
            self.client_sums += [np.asarray(r[k], float).ravel() for r in replies.values() for k in keys]
            self.client_plain += [
                np.asarray(v, float).ravel() for r in replies.values() for k, v in r.items() if k not in keys
            ]
            return summing(cls, keys, replies)

        monkeypatch.setattr(Replies, "summing", classmethod(spy))

    def arrays(self):
        """Every numeric array the server received, flattened (replies and masked vectors)."""
        from flwr.common import bytes_to_ndarray

        out = []
        for m in self.received:
            if m.has_error():
                continue
            for rec in m.content.array_records.values():
                out += [np.asarray(a.numpy(), float).ravel() for a in rec.values()]
            for rec in m.content.config_records.values():  # SecAgg+'s masked vectors travel as bytes
                for k, v in rec.items():
                    if k == "masked_params":
                        self.masked += 1
                        out += [np.asarray(bytes_to_ndarray(b), float).ravel() for b in v]
        return out

    def check_no_client_value(self, secure, masked=True):
        from fedstats.federation.flower.secure import CLIP, STEP, encode

        self.masked = 0
        got = self.arrays()
        assert self.masked > 0 or not masked, "no masked vector reached the server"

        assert self.client_sums and self.received

        def same(a, v):
            return a.size == v.size and np.allclose(a, v, rtol=1e-9, atol=1e-12)

        # a declared sum that equals an array its client sends openly (a GLM client's weighted
        # row count and its row count, without weights) is no secret to hide
        plain = [v for v in self.client_sums if v.size and not any(same(v, w) for w in self.client_plain)]
        # the client's values, and their encoding before Flower masks them
        coded = [(encode({"v": v}, ("v",), secure) + CLIP) / STEP for v in plain]
        for a in got:
            assert not any(same(a, v) for v in plain + coded), "the server received a client's summed array"


@pytest.mark.parametrize("model", ["glm", "hm2"])
def test_secure_aggregation_equals_plain_and_hides_every_client(session, monkeypatch, model):
    """Declared sums through Flower's SecAgg+: the fit equals the plain in-process fit (here
    to 1e-10 for the GLM, 1e-8 for HM2's sampled EP: the fixed point is exact to 2**-44 per value), and no array the server receives
    equals one client's declared-sum array, raw or encoded."""
    from fedstats.federation.flower.secure import SecureAggregation
    from fedstats.glm import FederatedGLM

    data, _ = hm2_federation(n_clients=4, n_obs=30, seed=7)
    make = (lambda: FederatedGLM("gaussian")) if model == "glm" else (lambda: HierarchicalLinearModel(rounds=4))
    rec = Recorder(session, monkeypatch)
    plain = make().fit(data, seed=1, **({} if model == "glm" else {"batched": False}))
    if model == "glm":  # the recorder does see the clients' values when the sums travel in the replies
        make().fit(data, seed=1, backend=session)
        with pytest.raises(AssertionError, match="a client's summed array"):
            rec.check_no_client_value(SecureAggregation(), masked=False)
    monkeypatch.setattr(session, "secure_aggregation", SecureAggregation())
    rec.received.clear()
    secure = make().fit(data, seed=1, backend=session)
    if model == "glm":
        close(np.r_[plain.params, plain.bse, plain.deviance], np.r_[secure.params, secure.bse, secure.deviance])
    else:
        # HM2's sampled moments sit on a Laplace proposal found with finite differences, whose
        # round-off passes the 2**-44 of the encoding on: measured 9e-10 on this fit for a
        # 1e-13 change of the prior (importance sampling through jax: 5e-13)
        close(plain.global_posterior().mean, secure.global_posterior().mean, tol=1e-8)
        close(plain.global_posterior().sd, secure.global_posterior().sd, tol=1e-8)
    assert [r.answered for r in secure.history] == [r.answered for r in plain.history]
    rec.check_no_client_value(SecureAggregation())


def test_secure_aggregation_goes_on_without_a_node_lost_before_its_shares(session, monkeypatch):
    """A node that stops answering inside SecAgg+ before its key shares are out: the round is
    summed over the others (Flower alone halts it: "Not enough shares to recover secret"), the
    node's client is recorded as failed in that round, and the fit equals the in-process fit in
    which that client sits that round out. With three nodes the same loss stops the fit."""
    from fedstats.federation.flower.secure import SecureAggregation

    data, _ = gmm_federation(n_clients=4, n_components=2, d=2, n_obs=(40, 60), seed=3)
    victim, at_round = data.clients[2], 1
    grid, send = session.grid, session.grid.send_and_receive
    node = [session.assign(list(data.clients))[victim]]
    stages = []

    def losing(messages, timeout=None):
        replies = list(send(messages, timeout=timeout))
        stage = [
            m.content.config_records["secaggplus_configs"]["stage"]
            for m in messages[:1]
            if "secaggplus_configs" in m.content.config_records
        ]
        stages.extend(stage)
        # the k-means start sums twice (statistics, then log-likelihoods) before EM round 0
        if stage == ["share_keys"] and stages.count("setup") == 2 + at_round + 1:
            replies = [r for r in replies if r.metadata.src_node_id != node[0]]  # silent from here on
        return replies

    monkeypatch.setattr(grid, "send_and_receive", losing)
    monkeypatch.setattr(session, "secure_aggregation", SecureAggregation())
    model = FederatedGaussianMixture(2, rounds=4, tol=0.0)
    secure = model.fit(data, seed=1, backend=session)
    assert stages.count("unmask") == 2 + 4 + 1  # the start, every EM round and the scoring round were summed
    assert [list(r.failed) for r in secure.history] == [[], [victim], [], []]
    schedule = [list(data.clients)] * 4
    schedule[at_round] = [c for c in data.clients if c != victim]
    reference = FederatedGaussianMixture(2, rounds=4, tol=0.0)
    monkeypatch.setattr(reference, "_participation", lambda clients: lambda rnd, rng: schedule[rnd])
    plain = reference.fit(data, seed=1)
    # the dropped client's node undid its step (else its next change would be counted from a
    # state the server never summed: covariances off by 2e-8 here)
    close(secure.means, plain.means)
    close(secure.covariances, plain.covariances)
    # with three nodes the threshold is all three: a sum over two would give each the other's values
    from fedstats.federation.flower.secure import SecureAggregationError

    stages.clear()
    three, _ = gmm_federation(n_clients=3, n_components=2, d=2, n_obs=(40, 60), seed=3)
    node[0] = session.assign(list(three.clients))[victim]
    with pytest.raises(SecureAggregationError, match="halted at round"):
        model.fit(three, seed=1, backend=session)


def test_secure_aggregation_refuses_what_it_cannot_hide_or_encode(session, monkeypatch):
    from fedstats.federation.flower.secure import SecureAggregation, SecureAggregationError
    from fedstats.glm import FederatedGLM

    data, _ = hm2_federation(n_clients=2, n_obs=30, seed=7)
    monkeypatch.setattr(session, "secure_aggregation", SecureAggregation())
    with pytest.raises(SecureAggregationError, match="at least 3 nodes in a round, this round has 2"):
        FederatedGLM("gaussian").fit(data, backend=session)
    # a value beyond the declared bound is an error on its node, never a clipped value
    data, _ = hm2_federation(n_clients=3, n_obs=30, seed=7)
    monkeypatch.setattr(session, "secure_aggregation", SecureAggregation(bound=2.0**4))
    with pytest.raises(Exception, match=r"not below the declared bound 16.*nothing is clipped"):
        FederatedGLM("gaussian").fit(data, backend=session)


def test_bayesian_and_hierarchical_glms_equal_inprocess(session):
    """Sampled EP: a node steps its client alone, as the in-process run with batched=False;
    no row is in the state a node sends back."""
    from fedstats.glm import BayesianGLM, HierarchicalGLM

    data, _ = hm2_federation(n_clients=3, n_obs=30, seed=8)
    data = FederatedData.from_arrays(
        [np.asarray(data[c].X) for c in data.clients],
        [(np.asarray(data[c].y) > 0).astype(float) for c in data.clients],
        **NO_RULES,
    )
    for make in (
        lambda: BayesianGLM("binomial", rounds=2, num_draws=200),
        lambda: HierarchicalGLM("binomial", rounds=2, num_draws=200),
    ):
        a = make().fit(data, seed=2, batched=False)
        b = make().fit(data, seed=2, backend=session)
        close(a.global_posterior().mean, b.global_posterior().mean)
        close(a.global_posterior().sd, b.global_posterior().sd)
        same_history(a.history, b.history)
    close(a.client_posterior(0).mean, b.client_posterior(0).mean)


def test_more_clients_than_nodes_is_refused(session):
    data, _ = gmm_federation(n_clients=7, n_components=2, d=2, n_obs=(20, 30), seed=0)
    with pytest.raises(ValueError, match=r"7 clients but the Flower simulation has \d live SuperNodes"):
        FederatedGaussianMixture(2).fit(data, backend=session)


# --------------------------------------------------------------------------- the runtime


def toy_data():
    rng = np.random.default_rng(0)
    ids = ["ok1", "boom", "skip", "bad", "ok2"]
    return {c: ClientData(X=rng.normal(size=(5 + i, 2)), y=None, client=c) for i, c in enumerate(ids)}


def test_failures_skips_and_protocol_breaches_as_in_process(session):
    data = toy_data()
    a = run(flower_toys.Flaky(), data, rounds=4, seed=7, participation=0.8)
    with use_backend(session):
        b = run(flower_toys.Flaky(), data, rounds=4, seed=7, participation=0.8)
    assert a.history == b.history  # failed messages, skips, participants, bytes, metrics: all equal
    assert any(r.failed for r in a.history) and any(r.skipped for r in a.history)
    assert "ValueError: disk full" in str([r.failed for r in b.history])
    assert "undeclared ['extra']" in str([r.failed for r in b.history])
    for k in ("mean", "seen", "draw"):
        close(a.server_state[k], b.server_state[k], tol=0)
    for c in data:  # private states came back as they were on the nodes
        assert a.client_states[c]["steps"] == b.client_states[c]["steps"]
        close(a.client_states[c]["offset"], b.client_states[c]["offset"], tol=0)
    assert a.communication.per_client == b.communication.per_client
    assert b.lost == {}


def test_checkpoint_and_resume_on_flower(session, tmp_path):
    data = toy_data()
    straight = run(flower_toys.Flaky(), data, rounds=5, seed=1)
    path = tmp_path / "run.ckpt"
    with use_backend(session):
        run(flower_toys.Flaky(), data, rounds=2, seed=1, checkpoint=path)
        resumed = run(flower_toys.Flaky(), data, rounds=5, seed=1, checkpoint=path, resume=True)
    assert resumed.resumed_from == 2
    assert resumed.history == straight.history
    close(resumed.server_state["mean"], straight.server_state["mean"], tol=0)


def test_no_node_receives_another_clients_entries(session):
    # FedEM's scoring round carries every client's weights; each node must get only its own
    from fedstats.federation.oneshot import OneShot
    from fedstats.mixture._init import _score
    from fedstats.mixture.online_step import FEMOMDStep

    weights = {c: np.full(2, 0.5) + 0.1 * i for i, c in enumerate("abc")}
    side = session.client_side(
        OneShot(("loglik",), {}, _score, private=weights), list("abc"), {c: None for c in "abc"}, 0
    )
    for c in "abc":
        sent = loads(side._algorithm[c])
        assert list(sent.private) == [c] and np.array_equal(sent.private[c], weights[c])
    model = FEMOMD(2, means_init=np.zeros((2, 2)))
    model._clients = {c: {"log_pi": np.zeros(2) + i} for i, c in enumerate("abc")}
    step = FEMOMDStep(model, {"means": np.zeros((2, 2))}, model._clients, 0.1).for_client("b")
    assert list(step.clients0) == ["b"] and step.server0 is None and step.m._clients == {}
    assert model._clients.keys() == {"a", "b", "c"}  # the server's objects are untouched


def test_a_node_that_stops_answering_is_lost(session):
    data = {c: d for c, d in toy_data().items() if c != "boom"}
    data["slow"] = ClientData(X=np.ones((5, 2)), y=None, client="slow")
    saved = session.timeout, session.on_disconnect
    try:
        session.timeout = 3.0
        with use_backend(session):
            res = run(flower_toys.Flaky(), data, rounds=3, seed=2)
        # lost at round 1, failed without waiting at round 2, its state missing from the result
        assert "no reply within 3.0 s" in res.lost["slow"]
        assert [list(r.failed) for r in res.history] == [["bad"], ["slow"], ["slow"]], [r.failed for r in res.history]
        assert set(res.client_states) == set(data) - {"slow"}
        with pytest.raises(ClientDisconnected, match="client 'slow' was lost"):
            res.client_states["slow"]
        # later runs place their clients on live nodes only; with "raise" a loss stops the run
        # before that round's server step
        session.on_disconnect = "raise"
        with (
            use_backend(session),
            pytest.raises(ClientDisconnected, match="client 'slow' .* stopped answering at round 1"),
        ):
            run(flower_toys.Flaky(), data, rounds=3, seed=2)
    finally:
        session.timeout, session.on_disconnect = saved
        session.lost.clear()  # the node is alive (it was only slow): the next tests may use it


def test_a_node_refuses_what_its_policy_forbids(session):
    """A client with fewer rows than its node's minimum, or asked for an option outside the
    node's range, sits the run out with the rule named (the run goes on without it, or stops
    with on_disconnect="raise"); a regression with too few rows per column is refused too."""
    data = {c: d for c, d in toy_data().items() if c in ("ok1", "ok2")}
    data["tiny"] = ClientData(X=np.ones((4, 2)), y=None, client="tiny")
    with use_backend(session):
        res = run(flower_toys.Flaky(), data, rounds=2, seed=3)
    assert "rule min_rows" in res.lost["tiny"] and "4 rows" in res.lost["tiny"], res.lost
    assert [sorted(r.failed) for r in res.history] == [["tiny"], ["tiny"]]
    alone = run(flower_toys.Flaky(), {c: data[c] for c in ("ok1", "ok2")}, rounds=2, seed=3)
    close(res.server_state["mean"], alone.server_state["mean"])
    greedy = flower_toys.Flaky()
    greedy.slow_seconds = 60.0  # a server asking for more than the node's range
    saved = session.on_disconnect
    try:
        session.on_disconnect = "raise"
        with (
            use_backend(session),
            pytest.raises(ClientDisconnected, match=r"sits the run out.*rule options.*slow_seconds = 60.0"),
        ):
            run(greedy, {c: data[c] for c in ("ok1", "ok2")}, rounds=1, seed=0)
    finally:
        session.on_disconnect = saved
    Xs = [np.random.default_rng(k).normal(size=(n, 3)) for k, n in enumerate((40, 30, 8))]
    ys = [X @ np.ones(3) + np.random.default_rng(9).normal(size=len(X)) for X in Xs]
    from fedstats.glm import FederatedGLM

    # the refused client sits the fit out (issue 40): named with the rule in the warning and in
    # the result's exclusions, the fit is that of the other two clients
    with pytest.warns(
        RuntimeWarning, match=r"\b2: .*rule min_rows_per_parameter.*8 rows for a regression on 4 columns.*\(12\)"
    ):
        res = FederatedGLM("gaussian").fit(FederatedData.from_arrays(Xs, ys, **NO_RULES), backend=session)
    assert "rule min_rows_per_parameter" in res.excluded[2], res.excluded
    two = FederatedGLM("gaussian").fit(FederatedData.from_arrays(Xs[:2], ys[:2], **NO_RULES))
    close(res.params, two.params)


def test_a_node_keeps_its_privacy_budget_across_runs(session, policy_file, tmp_path):
    """Issue 41: a node whose policy budget is epsilon 5 records every release on its ledger and
    refuses a run that would take the composed total past 5, before computing anything.

    Runs of epsilon 3.3 each: under the tight (Renyi) composition of Gaussian mechanisms that
    the ledger uses, two such runs spend 4.86 together, not 6.6 (3.3 + 3.3 is the loose basic
    composition), so the node accepts the second and refuses the third (any two Gaussian
    mechanisms of 3.3 each compose to 4.86). A run that alone would spend 4.4 in one release
    composes to more than 5 with the first and is refused at once."""
    from fedstats.federation.budget import NodeBudget
    from fedstats.privacy import DifferentialPrivacy, PrivacyLedger

    rng = np.random.default_rng(4)
    data = {c: ClientData(X=rng.normal(size=(30, 2)), y=None, client=c) for c in ("a", "b", "c")}
    dp = DifferentialPrivacy(noise_multiplier=5.2227, clip=1.0)  # 4 rounds among 3 clients: epsilon 3.3
    ledger = (tmp_path / "ledger-{client}.json").as_posix()
    saved, saved_mode = policy_file.read_text(), session.on_disconnect
    policy_file.write_text(f'epsilon_budget = 5.0\nprivacy_ledger = "{ledger}"\n' + saved)
    try:
        with use_backend(session):
            first = run(flower_toys.PrivateSum(dp, 3), data, rounds=4, seed=1, progress=False)
        eps = first.privacy.epsilon(1e-6)
        assert eps == pytest.approx(3.3, abs=0.01)  # the run's own account: each reply read alone
        books = {c: NodeBudget(ledger.replace("{client}", c), 5.0, 1e-6) for c in data}
        for b in books.values():  # every node's ledger agrees with the run's
            assert b.epsilon() == pytest.approx(eps, rel=1e-9)
        with use_backend(session):
            second = run(flower_toys.PrivateSum(dp, 3), data, rounds=4, seed=2, progress=False)
        assert not second.lost and books["a"].epsilon() == pytest.approx(4.858, abs=0.01)
        session.on_disconnect = "raise"
        with use_backend(session), pytest.raises(ClientDisconnected, match=r"rule epsilon_budget.*from 4.86 to 6.\d+"):
            run(flower_toys.PrivateSum(dp, 3), data, rounds=4, seed=3, progress=False)
        assert books["a"].epsilon() == pytest.approx(4.858, abs=0.01)  # refused before any release

        # fresh ledgers: one run of 3.3, then a run of one release that alone spends 4.4 (within the budget)
        for f in tmp_path.glob("ledger-*.json"):
            f.unlink()
        with use_backend(session):
            run(flower_toys.PrivateSum(dp, 3), data, rounds=4, seed=4, progress=False)
        one = PrivacyLedger()
        strong = DifferentialPrivacy(noise_multiplier=2.0, clip=1.0)
        one.record("x", 2.0 / np.sqrt(3), 1)
        assert 4.0 < one.epsilon(1e-6) < 5.0
        with use_backend(session), pytest.raises(ClientDisconnected, match="rule epsilon_budget"):
            run(flower_toys.PrivateSum(strong, 3), data, rounds=1, seed=5, progress=False)

        # a server that plans fewer rounds than it runs is stopped at the step that would pass the budget
        for f in tmp_path.glob("ledger-*.json"):
            f.unlink()
        session.on_disconnect = saved_mode
        original = FlowerClients.plan_rounds
        try:
            FlowerClients.plan_rounds = lambda self, rounds: original(self, 1)
            with use_backend(session):
                lying = run(flower_toys.PrivateSum(dp, 3), data, rounds=12, seed=6, progress=False)
        finally:
            FlowerClients.plan_rounds = original
        failed = [r.failed for r in lying.history if r.failed]
        assert failed and all("rule epsilon_budget" in why for f in failed for why in f.values()), failed
        assert 4.5 < books["a"].epsilon() <= 5.0
    finally:
        policy_file.write_text(saved)
        session.on_disconnect = saved_mode


class Untrusted(flower_toys.Flaky):  # defined in this module, which the session does not trust
    pass


def test_a_node_refuses_a_class_from_an_untrusted_module(session):
    with (
        use_backend(session),
        pytest.raises(RuntimeError, match="could not start the run on its node: UnpicklingError: refusing to load"),
    ):
        run(Untrusted(), toy_data(), rounds=1, seed=0)


def test_one_simulation_at_a_time(session):
    data, _ = gmm_federation(n_clients=3, n_components=2, d=2, n_obs=(20, 30), seed=0)
    with pytest.raises(RuntimeError, match="another FlowerSession's simulation is running"):
        FederatedGaussianMixture(2).fit(data, backend="flower")


# --------------------------------------------------------------------------- no simulation needed


def test_restricted_unpickler():
    arr = np.arange(6.0).reshape(2, 3)
    close(loads(dumps({"a": arr, "g": np.random.default_rng(1)}))["a"], arr, tol=0)
    assert isinstance(loads(dumps(FederatedGaussianMixture(2))), FederatedGaussianMixture)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    with pytest.raises(pickle.UnpicklingError, match="refusing to load posix.system|refusing to load nt.system"):
        loads(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="numpy.save"):
        loads(pickle.dumps(np.save))
    from fedstats.results import save_result  # a fedstats function that is no client function

    with pytest.raises(pickle.UnpicklingError, match="save_result"):
        loads(pickle.dumps(save_result))
    # dotted names walk attributes from a trusted module to anything it imports
    for module, name in (
        ("fedstats.data", "np.f2py.subprocess.Popen"),
        ("fedstats.federation.protocol", "np.memmap"),
        ("fedstats.federation.flower", "logging.FileHandler"),
        ("fedstats.data", "np"),
    ):
        with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
            loads(global_pickle(module, name))
    # a class imported into a trusted module (np.memmap as fedstats...protocol.memmap) is not one of its own
    import fedstats.federation.protocol as proto

    proto.memmap = np.memmap
    try:
        with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
            loads(global_pickle("fedstats.federation.protocol", "memmap"))
    finally:
        del proto.memmap
    assert loads(global_pickle("fedstats.data", "FederatedData")) is FederatedData


def global_pickle(module: str, name: str) -> bytes:
    """A pickle that only looks up ``module.name`` (what a hostile peer would send)."""
    return (
        b"\x80\x04"
        + pickle.SHORT_BINUNICODE
        + bytes([len(module)])
        + module.encode()
        + pickle.SHORT_BINUNICODE
        + bytes([len(name)])
        + name.encode()
        + pickle.STACK_GLOBAL
        + pickle.STOP
    )


def test_remote_data_refuses_server_side_reads():
    rd = RemoteFederatedData({"a": 5, "b": 7}, ["x1", "x2"], None)
    assert rd.clients == ["a", "b"] and rd.n_obs == {"a": 5, "b": 7} and rd.n_features == 2 and rd.n_total == 12
    assert isinstance(rd, FederatedData)
    with pytest.raises(RemoteDataError, match="rows of client 'b' stay on its node"):
        np.asarray(rd["b"].X)
    with pytest.raises(RemoteDataError):
        rd["a"].X[0]


def test_session_options_are_checked():
    with pytest.raises(ValueError, match="on_disconnect"):
        FlowerSession(on_disconnect="ignore")
    with pytest.raises(ValueError, match="timeout"):
        FlowerSession(timeout=0)
    with pytest.raises(ValueError, match="num_supernodes"):
        FlowerSession(num_supernodes=0)
    with pytest.raises(TypeError, match="trust"):
        FlowerSession(trust="fedstats")
    with pytest.raises(ValueError, match="backend must be"):
        FederatedGaussianMixture(2).fit(FederatedData.from_arrays([np.zeros((3, 2))] * 2, **NO_RULES), backend="spark")
