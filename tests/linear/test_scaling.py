"""Scale-aware defaults (fedstats.federation.scaling): HM2 and the lasso fit standardised data and
report on the data's own scale, so that units do not change the answer and data in natural
units are not pulled towards the priors' unit scale."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats import FederatedData, HierarchicalLinearModel
from fedstats.federation.scaling import federated_scaling
from fedstats.linear import BayesianLasso
from fedstats.reference.hierarchical import pooled_nuts


def panel(seed=0, K=10, n=20):
    """Clients like the firms of a public investment panel: intercepts around -150, slopes
    around 0.1 and 0.2, predictors in the hundreds and thousands."""
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for _ in range(K):
        X = np.column_stack([rng.uniform(500, 3000, n), rng.uniform(50, 800, n)])
        beta = np.array([0.1 + 0.02 * rng.standard_normal(), 0.2 + 0.05 * rng.standard_normal()])
        ys.append(-150 + 40 * rng.standard_normal() + X @ beta + 30 * rng.standard_normal(n))
        Xs.append(X)
    return FederatedData.from_arrays(Xs, ys, feature_names=["value", "capital"])


def unit_data(seed=1, K=6, n=30):
    rng = np.random.default_rng(seed)
    Xs = [np.column_stack([rng.standard_normal(n), rng.integers(0, 2, n)]) for _ in range(K)]
    ys = [0.5 + X @ [1.0 + 0.3 * rng.standard_normal(), -0.5] + 0.5 * rng.standard_normal(n) for X in Xs]
    return Xs, ys


def ols(X, y):
    Xd = np.column_stack([np.ones(len(y)), X])
    beta, *_ = np.linalg.lstsq(Xd, y, rcond=None)
    s2 = np.sum((y - Xd @ beta) ** 2) / (len(y) - Xd.shape[1])
    return beta, np.sqrt(np.diag(s2 * np.linalg.inv(Xd.T @ Xd)))


def test_scaling_is_one_exchange_and_keeps_dummies():
    Xs, ys = unit_data()
    data = FederatedData.from_arrays(Xs, ys, feature_names=["x", "dummy"])
    sc = federated_scaling(data, True)
    X, y = np.concatenate(Xs), np.concatenate(ys)
    np.testing.assert_allclose([sc.x_mean[0], sc.x_sd[0]], [X[:, 0].mean(), X[:, 0].std(ddof=1)], rtol=1e-12)
    np.testing.assert_allclose([sc.y_mean, sc.y_sd], [y.mean(), y.std(ddof=1)], rtol=1e-12)
    assert sc.binary.tolist() == [False, True] and (sc.x_mean[1], sc.x_sd[1]) == (0.0, 1.0)  # 0/1 coding kept
    # the coefficient map is exact: predictions of mapped coefficients equal mapped predictions
    theta = np.array([0.3, -1.2, 0.7])
    Xq = np.array([[0.5, 1.0], [-2.0, 0.0]])
    np.testing.assert_allclose(
        np.column_stack([np.ones(2), Xq]) @ sc.coef_back(theta),
        sc.inverse_y(np.column_stack([np.ones(2), sc.transform_X(Xq)]) @ theta),
    )
    np.testing.assert_allclose(sc.coef_forward(sc.coef_back(theta)), theta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = HierarchicalLinearModel(rounds=2).fit(data, seed=0, progress=False)
    kinds = res.communication.by_kind
    assert kinds["federated scaling"]["runs"] == 1 and kinds["federated scaling"]["bytes_up"] > 0
    assert kinds["federated scaling"]["rounds"] == 2  # sums, then squares about the federation's means
    no = HierarchicalLinearModel(rounds=2, standardize=False).fit(data, seed=0, progress=False)
    assert no.scaling is None and "federated scaling" not in no.communication.by_kind


def test_the_server_sees_only_sums_of_the_moments(monkeypatch):
    """Both scaling rounds declare every reply a sum: the server step never holds one client's
    count, sums, squares or flags; the scaling still equals the pooled rows' mean and sd, the
    sums of squares those about the pooled means."""
    from fedstats.federation import scaling

    seen = []
    real = scaling._Moments.server_step

    def spy(self, state, replies, round):
        seen.append(([set(r) for r in replies.values()], {k: np.array(v) for k, v in replies.sums.items()}))
        return real(self, state, replies, round)

    monkeypatch.setattr(scaling._Moments, "server_step", spy)
    Xs, ys = unit_data()
    Xs[1] = Xs[1].copy()
    Xs[1][0, 1] = 2.0  # the dummy is not 0/1 at one client: it is standardised
    data = FederatedData.from_arrays(Xs, ys, feature_names=["x", "dummy"])
    sc = federated_scaling(data, True)
    monkeypatch.undo()
    X, y = np.concatenate(Xs), np.concatenate(ys)
    np.testing.assert_allclose(sc.x_mean, X.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(sc.x_sd, X.std(axis=0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose([sc.y_mean, sc.y_sd], [y.mean(), y.std(ddof=1)], rtol=1e-12)
    assert sc.binary.tolist() == [False, False]
    assert len(seen) == 2
    for per_client, sums in seen:
        assert len(per_client) == len(Xs) and all(keys == set() for keys in per_client)
        assert set(sums) == set(scaling._Moments.reply_keys)
        assert sums["n"][0] == len(y) and sums["not_binary"].tolist() == [len(Xs), 1]
        assert not sums["overflow"].any()
    (_, first), (_, second) = seen
    np.testing.assert_allclose(np.r_[first["sum_x"], first["sum_y"]], np.r_[X.sum(axis=0), y.sum()], rtol=1e-12)
    np.testing.assert_allclose(second["sum_x"], ((X - X.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(second["sum_y"], ((y - y.mean()) ** 2).sum(), rtol=1e-12)


def test_overflowing_values_name_the_column():
    Xs, ys = unit_data()
    Xs[2] = Xs[2].copy()
    Xs[2][3, 0] = 1e308
    data = FederatedData.from_arrays(Xs, ys, feature_names=["size", "dummy"])
    with pytest.raises(ValueError, match="cannot standardise column.*'size'.*overflow"):
        HierarchicalLinearModel(rounds=1).fit(data, progress=False)


def test_an_overflowing_sum_names_the_column_after_both_rounds():
    """A column whose sum overflows at a client (round 0) and one whose squares overflow about
    the federation's mean (round 1) are both named."""
    Xs, ys = unit_data()
    Xs[2], Xs[4] = Xs[2].copy(), Xs[4].copy()
    Xs[2][:2, 0] = 1e308  # the sum of 'size' overflows at client 2
    ys[4] = ys[4].copy()
    ys[4][0] = 1e200  # the target's sum is finite, its squares are not
    data = FederatedData.from_arrays(Xs, ys, feature_names=["size", "dummy"])
    with pytest.raises(ValueError, match=r"column\(s\) 'size', 'y' \(the target\).*overflow"):
        federated_scaling(data, True)


@pytest.mark.parametrize("model", ["hm2", "lasso"])
def test_units_do_not_change_the_posterior(model):
    """Target x 1000 + 5000 and features x 1000: mapped back, the same posterior (acceptance:
    means within 0.02 sd, sds within 2%), and the same predictions in the new units."""
    Xs, ys = unit_data()
    unit = FederatedData.from_arrays(Xs, ys, feature_names=["x", "dummy"])
    big = FederatedData.from_arrays(
        [X * [1e3, 1.0] for X in Xs], [1e3 * y + 5e3 for y in ys], feature_names=["x", "dummy"]
    )  # the 0/1 dummy keeps its coding
    make = (lambda: HierarchicalLinearModel(rounds=6)) if model == "hm2" else (lambda: BayesianLasso(rounds=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = make().fit(unit, seed=3, progress=False)
        b = make().fit(big, seed=3, progress=False)
    # theta_big = M theta_unit + c: intercept x 1000 + 5000, slope of x unchanged (x and y both x 1000),
    # dummy's coefficient x 1000
    M, c = np.diag([1e3, 1.0, 1e3]), np.array([5e3, 0.0, 0.0])
    for client in (0, 3, 5):
        pa, pb = a.client_posterior(client), b.client_posterior(client)
        mapped_mean, mapped_sd = M @ pa.mean + c, np.diag(M) * pa.sd
        assert np.all(np.abs(pb.mean - mapped_mean) <= 0.02 * pb.sd), (pb.mean, mapped_mean)
        np.testing.assert_allclose(pb.sd, mapped_sd, rtol=0.02)
    Xq = np.array([[0.4, 1.0], [-1.0, 0.0]])
    qa, qb = a.predict(Xq, client=1, seed=5), b.predict(Xq * [1e3, 1.0], client=1, seed=5)
    np.testing.assert_allclose(qb.to_numpy(), 1e3 * qa.to_numpy() + 5e3, rtol=1e-6, atol=1e-3)
    if model == "hm2":
        ga, gb = a.summary(), b.summary()
        np.testing.assert_allclose(
            gb.loc["mu[intercept]", "mean"], 1e3 * ga.loc["mu[intercept]", "mean"] + 5e3, rtol=1e-6
        )
        np.testing.assert_allclose(gb.loc["tau[x]", "mean"], ga.loc["tau[x]", "mean"], rtol=1e-6)
    else:  # sigma^2 in squared units of y; lambda penalises standardised coefficients: unchanged
        np.testing.assert_allclose(
            b.summary().loc["sigma2", "mean"], 1e6 * a.summary().loc["sigma2", "mean"], rtol=1e-6
        )
        np.testing.assert_allclose(b.summary().loc["lambda", "mean"], a.summary().loc["lambda", "mean"], rtol=1e-9)
        assert a.selected().equals(
            b.selected().assign(**{c: a.selected()[c] for c in ("mean", "sd", "lower", "upper")})
        )


def test_natural_units_match_pooled_nuts_and_each_clients_least_squares():
    """Acceptance: 10 clients x 20 rows, intercepts around -150, slopes around 0.1: every
    client's coefficients within 0.5 posterior sd of pooled NUTS on the same standardised model,
    every intercept within 2 standard errors of the client's own least squares; with
    standardize=False (the old default) the N(0, 1) prior pins every intercept near 0."""
    data = panel()
    res = HierarchicalLinearModel().fit(data, seed=0, progress=False)
    assert res.converged
    sc = res.scaling
    std = FederatedData.from_arrays(
        [sc.transform_X(data[c].X) for c in data.clients], [sc.transform_y(data[c].y) for c in data.clients]
    )
    ref = pooled_nuts(std, num_warmup=1000, num_samples=1500, num_chains=2, seed=1)
    theta = sc.coef_back(ref["theta"])  # (S, K, d) on the data's scale
    for k, c in enumerate(data.clients):
        post = res.client_posterior(c)
        z = np.abs(post.mean - theta[:, k].mean(axis=0)) / theta[:, k].std(axis=0)
        assert np.all(z < 0.5), (c, z)
        beta, se = ols(np.asarray(data[c].X), np.asarray(data[c].y))
        assert abs(post.mean[0] - beta[0]) < 2 * se[0], (c, post.mean[0], beta[0], se[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = HierarchicalLinearModel(standardize=False).fit(data, seed=0, progress=False)
    assert all(abs(old.client_posterior(c).mean[0]) < 10 for c in data.clients)  # the defect standardize fixes
