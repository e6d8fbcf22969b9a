"""Dishonest and broken clients (issue 41, item 4): a reply of the wrong shape or one that makes
a sum overflow is blamed on its sender, which alone sits the round (and the GLM's fit) out; a
reply no data could produce (1e300) is refused before the server step; a client that moves the
estimate far more than a client of its size would is named by the influence warning, with
each client's leave-one-client-out influence on the result."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats import FederatedData
from fedstats.federation import FederatedAlgorithm, run
from fedstats.federation.influence import INFLUENCE_WARNING, checked_sums, shape_outliers
from fedstats.glm import FederatedGLM, _irls
from fedstats.mixture import FederatedGaussianMixture
from fedstats.privacy import DifferentialPrivacy


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(200, 2)) for _ in range(5)]
    ys = [X @ [1.0, -1.0] + 0.9 + rng.normal(size=200) for X in Xs]
    return Xs, ys


def lying(monkeypatch, client, change):
    """Client ``client``'s IRLS replies pass through ``change`` (its node lies)."""
    honest = _irls.IRLS.client_step

    def step(self, message, state, data, rng):
        out, st = honest(self, message, state, data, rng)
        return (change(dict(out)) if data.client == client else out), st

    monkeypatch.setattr(_irls.IRLS, "client_step", step)


def fit(data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = FederatedGLM("gaussian").fit(data)
    return res, [str(w.message) for w in caught]


def test_an_honest_fit_reports_every_clients_influence_and_warns_of_none(regression):
    res, said = fit(FederatedData.from_arrays(*regression))
    assert list(res.influence.index) == [0, 1, 2, 3, 4]
    assert (res.influence["relative"] < 2.0).all() and (res.influence["shift"] < 1.5).all(), res.influence
    assert not [w for w in said if "estimate moves" in w]
    # exact leave-one-client-out at the last Newton step: the fit without client 2 (least
    # squares: one step from anywhere) moves the estimate by the reported shift, in that fit's
    # standard errors (within 1%: the reported ones take the dispersion with the client)
    without = FederatedGLM("gaussian").fit(FederatedData.from_arrays(*[v[:2] + v[3:] for v in regression]))
    se = without.bse.to_numpy()
    assert res.influence.loc[2, "shift"] == pytest.approx(np.max(np.abs(without.params - res.params) / se), rel=0.01)


def test_a_client_that_scales_its_score_is_named(regression, monkeypatch):
    lying(monkeypatch, 2, lambda out: {**out, "xtwz": out["xtwz"] * 50})
    res, said = fit(FederatedData.from_arrays(*regression))
    named = [w for w in said if "estimate moves" in w]
    assert len(named) == 1 and "client(s) 2 (" in named[0] and "'0'" not in named[0], said
    assert res.influence["relative"].idxmax() == 2 and res.influence.loc[2, "relative"] > INFLUENCE_WARNING


def test_a_reply_of_1e300_is_refused_and_blamed_on_its_sender(regression, monkeypatch):
    lying(monkeypatch, 2, lambda out: {**out, "xtwz": out["xtwz"] * 1e300})
    res, said = fit(FederatedData.from_arrays(*regression))
    assert list(res.excluded) == [2] and "refused as broken" in res.excluded[2], res.excluded
    monkeypatch.undo()
    honest = FederatedGLM("gaussian").fit(FederatedData.from_arrays(*[v[:2] + v[3:] for v in regression]))
    np.testing.assert_allclose(res.params, honest.params, rtol=1e-10)


def test_a_wrong_shape_reply_drops_only_its_sender(regression, monkeypatch):
    lying(monkeypatch, 3, lambda out: {**out, "xtwz": np.append(out["xtwz"], 1.0)})
    res, said = fit(FederatedData.from_arrays(*regression))
    assert list(res.excluded) == [3] and "sent 'xtwz' of shape (4,); the other clients' is (3,)" in res.excluded[3]
    monkeypatch.undo()
    honest = FederatedGLM("gaussian").fit(FederatedData.from_arrays(*[v[:3] + v[4:] for v in regression]))
    np.testing.assert_allclose(res.params, honest.params, rtol=1e-10)


class Sum(FederatedAlgorithm):
    """Every client sends one vector; the server keeps the sum."""

    reply_keys = summed_keys = ("v",)
    random_client_steps = False

    def init_server(self, clients, rng):
        return None

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        return {"v": np.asarray(data, dtype=float)}, None

    def server_step(self, state, replies, round):
        return (replies.sums.get("v"), {})


def test_an_overflowing_sum_is_blamed_on_the_largest_value():
    data = {"a": [1.0, 2.0], "b": [1e308, 1.0], "c": [1e308, 1.0], "d": [3.0, 4.0]}
    res = run(Sum(), data, rounds=1, progress=False)
    failed = res.history[0].failed
    assert sorted(failed) == ["b"] and "makes the sum over the clients overflow" in failed["b"]
    np.testing.assert_array_equal(res.server_state, [1e308 + 4.0, 7.0])
    # shapes: the majority's shape wins; a tie names every client of the tie
    replies = {"a": {"v": np.zeros(2)}, "b": {"v": np.zeros(3)}, "c": {"v": np.zeros(2)}}
    assert list(shape_outliers(("v",), replies)) == ["b"]
    tie = {"a": {"v": np.zeros(2)}, "b": {"v": np.zeros(3)}}
    assert sorted(shape_outliers(("v",), tie)) == ["a", "b"]
    summed, bad = checked_sums(("v",), dict(replies))
    assert list(bad) == ["b"] and summed.sums["v"].shape == (2,)


def test_a_client_whose_data_form_a_component_alone_is_named_by_fedem():
    # the report's case: one client's rows sit 100 away from the others', and the fitted means
    # move to about (103, 102); the warning names that client
    rng = np.random.default_rng(0)
    blocks = [
        np.vstack([rng.normal(size=(150, 2)), rng.normal(size=(150, 2)) + 6]) + (100 if k == 2 else 0) for k in range(4)
    ]
    df = pd.DataFrame(np.vstack(blocks), columns=["a", "b"]).assign(c=np.repeat([f"s{k}" for k in range(4)], 300))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = FederatedGaussianMixture(2).fit(FederatedData.from_dataframe(df, by="c"), seed=0)
    assert np.max(res.means) > 100
    named = [str(w.message) for w in caught if "estimate moves" in str(w.message)]
    assert len(named) == 1 and "'s2' (a part of the estimate rests on it alone)" in named[0], named
    others = res.influence.drop(index="s2")
    assert (others["relative"] < 2.0).all() and np.isinf(res.influence.loc["s2", "shift"])
    # robust=True leaves s2 out and fits the others afresh: FedEM on s0, s1 and s3 exactly
    data = FederatedData.from_dataframe(df, by="c")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kept = FederatedGaussianMixture(2, robust=True).fit(data, seed=0)
    assert list(kept.excluded) == ["s2"] and "left out by robust=True" in kept.excluded["s2"]
    assert sorted(kept.weights) == ["s0", "s1", "s3"]
    alone = FederatedGaussianMixture(2).fit(data.subset(["s0", "s1", "s3"]), seed=0)
    np.testing.assert_allclose(kept.means, alone.means, rtol=1e-10)
    np.testing.assert_allclose(kept.covariances, alone.covariances, rtol=1e-10)
    assert np.max(np.abs(kept.means)) < 7
    # an honest federation: robust=True changes nothing
    honest = data.subset(["s0", "s1", "s3"])
    np.testing.assert_array_equal(FederatedGaussianMixture(2, robust=True).fit(honest, seed=0).means, alone.means)
    with pytest.raises(ValueError, match="robust=True needs each client's influence"):
        FederatedGaussianMixture(2, robust=True, dp=DifferentialPrivacy(1.0, clip=1.0), means_init=alone.means).fit(
            data
        )


@pytest.mark.parametrize("cov_type", ["full", "tied", "diag", "spherical"])
def test_fedem_leave_one_out_means_and_variances_are_the_m_steps(cov_type):
    # the influence's stacked means and coordinate variances (every client left out at once)
    # equal the M-step's on each client's totals without it, one at a time
    from fedstats.mixture.gmm import m_step, means_and_variances, s2_shape, segment_statistics

    rng = np.random.default_rng(3)
    M, d, C = 3, 4, 5
    X = rng.normal(size=(C * 40, d)) * [1, 2, 0.5, 3] + 1.0
    resp = rng.dirichlet(np.ones(M), size=len(X))
    shift = rng.normal(size=(M, d))
    N, S1, S2, _, _ = segment_statistics(
        X, resp, np.zeros(len(X)), np.zeros(len(X)), np.arange(C) * 40, shift, cov_type
    )
    assert S2.shape[1:] == s2_shape(cov_type, M, d)
    means, var = means_and_variances(N.sum(0) - N, S1.sum(0) - S1, S2.sum(0) - S2, shift, cov_type, 1e-6)
    for c in range(C):
        m, cov, _ = m_step(N.sum(0) - N[c], S1.sum(0) - S1[c], S2.sum(0) - S2[c], shift, cov_type, 1e-6)
        diag = {
            "full": lambda: np.diagonal(cov, axis1=1, axis2=2),
            "tied": lambda: np.broadcast_to(np.diag(cov), (M, d)),
            "diag": lambda: cov,
            "spherical": lambda: np.broadcast_to(cov[:, None], (M, d)),
        }[cov_type]()
        np.testing.assert_allclose(means[c], m, rtol=1e-12)
        np.testing.assert_allclose(var[c], diag, rtol=1e-10)


@pytest.fixture(scope="module")
def hm2_fit():
    from fedstats import HierarchicalLinearModel
    from fedstats.datasets.synthetic import hm2_federation

    data, _ = hm2_federation(n_clients=20, n_obs=50, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = HierarchicalLinearModel().fit(data, seed=0, progress=False)
    return data, res, [str(w.message) for w in caught]


def test_hm2_influence_is_the_exact_ep_cavity_of_each_client(hm2_fit):
    # every client's influence is its EP leave-one-out: q against q without its site (the
    # cavity), from the sites the clients hold; an honest federation warns of none
    data, res, caught = hm2_fit
    assert list(res.influence.index) == list(data.clients)
    assert not [m for m in caught if "estimate moves" in m]
    q = res.server.q
    mean = np.linalg.solve(q.Q, q.r)
    for c, site in res.algorithm.committed_sites(res.server, res.client_states).items():
        cov = np.linalg.inv(q.Q - site.Q)
        shift = np.max(np.abs(cov @ (q.r - site.r) - mean) / np.sqrt(np.diag(cov)))
        assert res.influence.loc[c, "shift"] == pytest.approx(shift, rel=1e-9)
    assert res.influence["relative"].max() < INFLUENCE_WARNING


def test_an_hm2_client_whose_outcome_is_shifted_is_named(hm2_fit):
    from fedstats import HierarchicalLinearModel

    data = hm2_fit[0]
    ys = [data[c].y + (30.0 if c == 5 else 0.0) for c in data.clients]
    shifted = FederatedData.from_arrays([data[c].X for c in data.clients], ys, min_rows=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = HierarchicalLinearModel().fit(shifted, seed=0, progress=False)
    named = [str(w.message) for w in caught if "estimate moves" in str(w.message)]
    assert len(named) == 1 and "client(s) 5 (" in named[0] and "posterior sd" in named[0], named
    assert res.influence["relative"].idxmax() == 5 and res.influence.loc[5, "relative"] > 10


def test_a_cross_product_no_rows_give_is_blamed_on_its_sender(regression, monkeypatch):
    # a client whose X'WX has a negative eigenvalue (or is not symmetric) sits the fit out,
    # named; the fit of the others equals a fit without it
    Xs, ys = regression

    def negative(out):
        out["xtwx"] = out["xtwx"] - 2 * np.trace(out["xtwx"]) * np.eye(len(out["xtwx"]))
        return out

    lying(monkeypatch, 3, negative)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = FederatedGLM("gaussian").fit(FederatedData.from_arrays(Xs, ys))
    monkeypatch.undo()
    assert "negative eigenvalue" in res.excluded[3] and "BrokenReply" in res.excluded[3]
    without = FederatedGLM("gaussian").fit(FederatedData.from_arrays(Xs[:3] + Xs[4:], ys[:3] + ys[4:]))
    np.testing.assert_allclose(res.params.to_numpy(), without.params.to_numpy(), rtol=1e-10)
    assert any("3" in str(w.message) for w in caught)
    asym = {0: {"a": np.eye(2)}, 1: {"a": np.array([[1.0, 0.5], [0.0, 1.0]])}, 2: {"a": np.ones((2, 2))}}
    from fedstats.federation.influence import not_cross_products

    assert list(not_cross_products(("a",), asym)) == [1]


def test_robust_glm_fits_the_others_exactly_without_the_scaled_client(regression, monkeypatch):
    # robust=True leaves out the client the warning names and refits: the exact GLM of the
    # other four (the intercept back from about 26 to the honest 0.9)
    lying(monkeypatch, 2, lambda out: {**out, "xtwz": out["xtwz"] * 50})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        res = FederatedGLM("gaussian", robust=True).fit(FederatedData.from_arrays(*regression))
    monkeypatch.undo()
    assert list(res.excluded) == [2] and "left out by robust=True" in res.excluded[2]
    Xs, ys = regression
    without = FederatedGLM("gaussian").fit(FederatedData.from_arrays(Xs[:2] + Xs[3:], ys[:2] + ys[3:]))
    np.testing.assert_allclose(res.params.to_numpy(), without.params.to_numpy(), rtol=1e-10)
    assert res.params["intercept"] == pytest.approx(0.9, abs=0.15)
    # an honest federation: robust=True changes nothing
    honest = FederatedGLM("gaussian", robust=True).fit(FederatedData.from_arrays(*regression))
    np.testing.assert_allclose(
        honest.params, FederatedGLM("gaussian").fit(FederatedData.from_arrays(*regression)).params
    )
    assert not honest.excluded


def test_a_fedem_client_whose_counts_do_not_add_up_to_its_rows_is_refused(monkeypatch):
    # a client that scales all its statistics (N, S1, S2 times 3: its data counted thrice)
    # moves the components consistently, but its soft counts no longer add up to the rows it
    # declared: refused as inconsistent, named, and the fit is FedEM of the others
    from fedstats.federation import runner

    rng = np.random.default_rng(1)
    Xs = [np.vstack([rng.normal(size=(60, 2)), rng.normal(size=(60, 2)) + 5]) for _ in range(4)]
    data = FederatedData.from_arrays(Xs)
    thrice = _tampering(lambda m: {**m, **{k: m[k] * 3 for k in ("N", "S1", "S2")}}, 1, kind="EM rounds")
    monkeypatch.setattr(runner, "_run", thrice)
    start = np.array([[0.0, 0.0], [5.0, 5.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = FederatedGaussianMixture(2, means_init=start, tol=None, rounds=20).fit(data, seed=0)
    monkeypatch.undo()
    assert list(res.excluded) == [1], res.excluded
    assert "'N' adds up to 360 rows; it declared 120" in res.excluded[1]
    others = FederatedGaussianMixture(2, means_init=start, tol=None, rounds=20).fit(data.subset([0, 2, 3]), seed=0)
    np.testing.assert_allclose(res.means, others.means, rtol=1e-8)


def _tampering(change, who, kind="EP rounds"):
    """A runtime whose ``kind`` runs pass client ``who``'s replies through ``change`` (after its
    step: the client says other changes than it made)."""
    from fedstats.federation import runner

    real = runner._run

    def spy(r):
        if who in r.ids and r.kind == kind:
            i, honest = r.ids.index(who), r.client_side.run_round

            def lying_round(rnd, idx, messages, batched):
                outs, fallback = honest(rnd, idx, messages, batched)
                return [
                    type(o)(reply=change(dict(o.reply))) if j == i and o.reply is not None else o
                    for j, o in zip(idx, outs)
                ], fallback

            r.client_side.run_round = lying_round
        return real(r)

    return spy


@pytest.mark.parametrize(
    "case, change, named",
    [
        ("precision scaled", lambda m: {**m, "dQ": m["dQ"] * -100}, "ProtocolError"),
        ("mean scaled", lambda m: {**m, "dr": m["dr"] * 1e6}, "ProtocolError"),
        ("asymmetric", lambda m: {**m, "dQ": m["dQ"] + np.triu(np.ones_like(m["dQ"]), 1)}, "is not symmetric"),
        ("1e300", lambda m: {**m, "dr": m["dr"] * 1e300}, "its reply alone moves the estimate"),
        ("shape", lambda m: {**m, "dr": m["dr"][:-1]}, "sent 'dr' of shape"),
        ("nan", lambda m: {**m, "dr": m["dr"] * np.nan}, "holds values that are not finite"),
    ],
)
def test_tampered_hm2_site_changes_are_blamed_on_their_sender(hm2_fit, monkeypatch, case, change, named):
    # the report's case: tampered HM2 site updates gave a bare AssertionError naming nobody
    from fedstats import HierarchicalLinearModel
    from fedstats.federation import runner
    from fedstats.federation.protocol import ProtocolError

    data = hm2_fit[0].subset(range(10))
    monkeypatch.setattr(runner, "_run", _tampering(change, 3))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        if named == "ProtocolError":  # in process the client's own site shows the lie: the fit stops
            with pytest.raises(ProtocolError, match=r"client\(s\) \[3\] sent do not add up to the site"):
                HierarchicalLinearModel(rounds=10).fit(data, seed=0, progress=False)
            return
        res = HierarchicalLinearModel(rounds=10).fit(data, seed=0, progress=False)
    assert list(res.excluded) == [3] and "BrokenReply" in res.excluded[3] and named in res.excluded[3], res.excluded
