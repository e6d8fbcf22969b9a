"""Federated Bayesian lasso and ridge: against pooled NUTS, selection, tests, bad input."""

import numpy as np
import pandas as pd
import pytest

from fedstats import FederatedData
from fedstats.datasets.synthetic import selection_case
from fedstats.experiments.linear_paper import table2_run
from fedstats.linear import BayesianLasso, BayesianRidge, BayesianShrinkage

FAST_NUTS = dict(num_warmup=300, num_samples=500, num_chains=4)


def one_client(seed=0, n=60, d=5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    beta = np.array([1.5, 0.0, -0.8, 0.0, 0.3])[:d]
    y = 0.4 + X @ beta + 0.7 * rng.normal(size=n)
    return FederatedData.from_arrays([X], [y], clients=["only"])


@pytest.mark.parametrize(
    "cls, opts",
    [(BayesianRidge, {}), (BayesianLasso, {}), (BayesianLasso, {"estimator": "nuts", "estimator_options": FAST_NUTS})],
    ids=["ridge-importance", "lasso-gibbs", "lasso-nuts"],
)
def test_one_client_equals_pooled_nuts(cls, opts):
    # One client: its posterior comes from the cavity (= the prior), so the federated fit is
    # the exact posterior up to Monte-Carlo error; the reference is NumPyro NUTS on the
    # model written directly (Laplace or normal prior, not the scale mixture).
    data = one_client()
    model = cls(**opts)
    fed = model.fit(data, seed=0, progress=False)
    ref = model.fit_centralized(data, seed=1, num_warmup=1000, num_samples=2000)
    assert ref.diagnostics["rhat_max"] < 1.01
    a, b = fed.client_posterior("only"), ref.client_posterior("only")
    assert a.names == b.names == ["intercept", "x0", "x1", "x2", "x3", "x4"]
    np.testing.assert_array_less(np.abs(a.mean - b.mean) / b.sd, 0.1)
    np.testing.assert_allclose(a.sd / b.sd, 1.0, atol=0.08)
    np.testing.assert_array_equal(fed.selected(0.9)["selected"], ref.selected(0.9)["selected"])
    # phi: EP's Gaussian q against the NUTS marginals of (log lambda, log sigma^2)
    g, r = fed.global_posterior(), ref.global_posterior()
    np.testing.assert_array_less(np.abs(g.mean - r.mean) / r.sd, 0.15)
    np.testing.assert_allclose(g.sd / r.sd, 1.0, atol=0.15)


@pytest.mark.parametrize("cls", [BayesianLasso, BayesianRidge])
def test_several_clients_match_pooled_nuts_of_the_same_model(cls):
    # K = 4 unequal clients: the exact posterior of the federated model (per-client
    # coefficients, shared lambda and sigma^2) by pooled NUTS; EP approximates only the
    # shared phi by a Gaussian, so client posteriors and decisions should match closely
    # (measured: max |mean diff| / sd 0.04, sd ratios within 4%).
    rng = np.random.default_rng(0)
    beta = np.array([1.0, 0.0, -0.5, 0.0, 0.2])
    Xs = [rng.normal(size=(n, 5)) for n in (30, 50, 80, 40)]
    ys = [0.3 * k + X @ beta + 0.8 * rng.normal(size=len(X)) for k, X in enumerate(Xs)]
    data = FederatedData.from_arrays(Xs, ys)
    model = cls(damping=1.0)
    fed = model.fit(data, seed=0, progress=False)
    ref = model.fit_centralized(data, seed=0, per_client=True, num_warmup=500, num_samples=1500)
    assert ref.clients == data.clients and ref.diagnostics["rhat_max"] < 1.01
    for c in data.clients:
        a, b = fed.client_posterior(c), ref.client_posterior(c)
        np.testing.assert_array_less(np.abs(a.mean - b.mean) / b.sd, 0.12)
        np.testing.assert_allclose(a.sd / b.sd, 1.0, atol=0.08)
    g, r = fed.global_posterior(), ref.global_posterior()
    np.testing.assert_array_less(np.abs(g.mean - r.mean) / r.sd, 0.15)
    np.testing.assert_allclose(g.sd / r.sd, 1.0, atol=0.1)
    np.testing.assert_array_equal(fed.selected(0.9)["selected"], ref.selected(0.9)["selected"])
    with pytest.raises(KeyError, match="unknown client"):
        ref.client_posterior("pooled")


def test_case_I_selection_and_accuracy():
    # Table 2, Case I, one run (the 30-run study is the slow test and the notebook).
    train, test, theta = selection_case("I", seed=3)
    res = BayesianLasso().fit(train, seed=0, progress=False)
    assert res.converged
    diag = res.sampler_diagnostics()
    assert set(diag["stage"]) == {"last round", "client posterior"} and len(diag) == 2 * train.n_clients
    # the default sampler keeps 4 x 500 draws (thinned by 2): an ESS of phi of about 350-550
    assert diag["rhat_max"].max() < 1.05 and diag["ess_min"].min() > 250, diag
    sel = res.selected(0.9)
    nonzero = np.tile(theta != 0, train.n_clients)
    assert sel["selected"][nonzero].mean() >= 0.85
    assert sel["selected"][~nonzero].mean() <= 0.12
    rmse = [np.sqrt(np.mean((res.predict(test[c].X, client=c, n=100)["mean"] - test[c].y) ** 2)) for c in train.clients]
    assert 0.8 * 0.055 <= np.mean(rmse) <= 1.2 * 0.055, np.mean(rmse)


def test_selection_tests_and_joint_test_agree_with_intervals():
    train, _, theta = selection_case("I", seed=1)
    res = BayesianRidge().fit(train, seed=0, progress=False)
    sel, t = res.selected(0.9), res.test(level=0.9)
    assert list(sel.columns) == ["client", "parameter", "mean", "sd", "lower", "upper", "p_value", "selected"]
    assert "intercept" not in set(sel["parameter"])
    # the equal-tailed interval excludes 0 exactly when p_B < 1 - level
    np.testing.assert_array_equal(sel["selected"].to_numpy(), t["reject"].to_numpy())
    np.testing.assert_allclose(t["p_value"], 2 * np.minimum(t["p_positive"], t["p_negative"]), atol=1e-12)
    strong = res.joint_test(["x1", "x2"], client="c0")
    null = res.joint_test(["x3", "x4", "x6"], client="c0")
    assert strong["reject"] and strong["p_value"] < 1e-6 and strong["df"] == 2
    assert 0 <= null["p_value"] <= 1 and null["df"] == 3
    with pytest.raises(ValueError, match="unknown coefficient"):
        res.joint_test(["nope"], client="c0")
    # a client that took no part: the prior predictive is wider than a fitted client's
    x = train["c0"].X[:3]
    own, new = res.predict(x, client="c0", level=0.9), res.predict(x, client=None, level=0.9)
    assert np.all(new["pred_upper"] - new["pred_lower"] > own["pred_upper"] - own["pred_lower"])


def test_bad_input_is_reported():
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(30, 3)) for _ in range(2)]
    ys = [X @ [1.0, 0.0, 2.0] + rng.normal(size=30) for X in Xs]
    # perfectly collinear columns at every client
    coll = [np.column_stack([X, 2 * X[:, 0]]) for X in Xs]
    with pytest.raises(ValueError, match=r"predictor .x3. = 2 \* x0 \+ a constant on the pooled rows"):
        BayesianRidge().fit(FederatedData.from_arrays(coll, ys), progress=False)
    # a constant predictor at one site
    const = [X.copy() for X in Xs]
    const[1][:, 1] = 1.0
    with pytest.warns(RuntimeWarning, match="constant"):
        BayesianRidge(rounds=2).fit(FederatedData.from_arrays(const, ys), progress=False)
    # fewer rows than predictors at one site
    few = [Xs[0], Xs[1][:2]]
    with pytest.warns(RuntimeWarning, match="2 rows for 3 predictors"):
        BayesianRidge(rounds=2).fit(FederatedData.from_arrays(few, [ys[0], ys[1][:2]], min_rows=1), progress=False)
    with pytest.raises(ValueError, match="not reliable for the lasso"):
        BayesianLasso(estimator="importance").fit(FederatedData.from_arrays(Xs, ys), progress=False)
    with pytest.raises(ValueError, match="BayesianShrinkage: penalty must be one of 'lasso', 'ridge'"):
        BayesianShrinkage("elastic").fit(FederatedData.from_arrays(Xs, ys), progress=False)
    with pytest.raises(ValueError, match="BayesianLasso: noise must be"):
        BayesianLasso(noise="none").fit(FederatedData.from_arrays(Xs, ys), progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("case, runs", [("I", 10), ("II", 10), ("III", 3)])
def test_table2_cases_over_runs(case, runs):
    # Spec A9 over several seeded runs (the notebook runs 30): false inclusion <= 0.12 and
    # correct inclusion >= 0.85 everywhere. A-RMSE of the posterior mean within 20% of the
    # paper in Cases I and II; in Case III the model's posterior mean is least squares on
    # each client (the clients share only lambda and sigma^2, and one Laplace scale fits the
    # coefficients of 3), so the posterior-mean A-RMSE is checked against OLS in the same run
    # and the paper's band is checked for the prediction with excluded coefficients zeroed.
    paper = {"I": 0.055, "II": 0.062, "III": 0.088}[case]
    t = pd.DataFrame([table2_run(case, seed=100 + r) for r in range(runs)])
    assert t.converged.all() and t.rhat_max.max() < 1.05
    assert t.false.mean() <= 0.12 and t.correct.mean() >= 0.85, t
    if case == "III":
        assert t.a_rmse.mean() <= 1.01 * t.a_rmse_ols.mean(), t
        assert 0.8 * paper <= t.a_rmse_selected.mean() <= 1.2 * paper, t
    else:
        assert 0.8 * paper <= t.a_rmse.mean() <= 1.2 * paper, t


def test_centralised_predictions_cover():
    data = one_client(n=80)
    ref = BayesianRidge().fit_centralized(data, seed=0, num_warmup=300, num_samples=500, num_chains=2)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(400, 5))
    y = 0.4 + X @ np.array([1.5, 0.0, -0.8, 0.0, 0.3]) + 0.7 * rng.normal(size=400)
    p = ref.predict(X, level=0.9)
    cover = np.mean((p["pred_lower"] <= y) & (y <= p["pred_upper"]))
    assert 0.85 <= cover <= 0.95
    assert np.all(p["pred_lower"] < p["lower"]) and np.all(p["upper"] < p["pred_upper"])


@pytest.mark.slow  # 75 s; the default run keeps test_one_client_equals_pooled_nuts (the same comparison, shorter)
def test_diabetes_single_client_against_long_pooled_nuts():
    # Independent reference (issue 3): scikit-learn's diabetes data (bundled, 442 x 10) as one
    # client. The federated lasso (EP + Gibbs on the scale mixture) against a long NumPyro NUTS
    # run of the directly written Laplace model: medians agree in sign and magnitude, and the
    # interval rule selects the same predictors.
    from sklearn.datasets import load_diabetes

    ds = load_diabetes()
    X = (ds.data - ds.data.mean(0)) / ds.data.std(0)
    y = (ds.target - ds.target.mean()) / ds.target.std()
    data = FederatedData.from_arrays([X], [y], clients=["diabetes"], feature_names=ds.feature_names)
    model = BayesianLasso()
    fed = model.fit(data, seed=0, progress=False)
    ref = model.fit_centralized(data, seed=1, num_warmup=2000, num_samples=8000)
    assert ref.diagnostics["rhat_max"] < 1.01
    fmed = np.median(fed.client_posterior("diabetes").draws, axis=0)[1:]
    rmed = np.median(ref.client_posterior("diabetes").draws, axis=0)[1:]
    big = np.abs(rmed) > 0.05
    assert big.sum() >= 4
    np.testing.assert_array_equal(np.sign(fmed[big]), np.sign(rmed[big]))
    np.testing.assert_allclose(fmed[big] / rmed[big], 1.0, atol=0.1)
    np.testing.assert_allclose(fmed[~big], rmed[~big], atol=0.03)
    for level in (0.9, 0.95):
        np.testing.assert_array_equal(fed.selected(level)["selected"], ref.selected(level)["selected"])
    assert set(fed.selected(0.95).query("selected")["parameter"]) >= {"bmi", "bp", "s5"}


def test_lasso_with_many_predictors_warms_up_with_laplace_rounds():
    # From 16 predictors the default lasso runs Laplace rounds (at most rounds // 3, ended
    # once no mean moves by 0.5 sd), then Gibbs rounds to convergence: the warm-up moves
    # only EP's start, so the result is that of Gibbs rounds alone, to Monte-Carlo error.
    from fedstats.inference.ep import FederatedEP
    from fedstats.linear._shrinkage_site import ShrinkageSite

    rng = np.random.default_rng(5)
    beta = np.r_[1.0, -0.8, 0.5, np.zeros(13)]
    Xs = [rng.normal(size=(60, 16)) for _ in range(4)]
    data = FederatedData.from_arrays(Xs, [X @ beta + 0.5 * rng.normal(size=60) for X in Xs])
    staged = BayesianLasso(damping=1.0, standardize=False, rounds=12).fit(data, seed=0, progress=False)
    stages = [rec.metrics["stage"] for rec in staged.history]
    assert stages[0] == 0 and stages[-1] == 1 and stages == sorted(stages) and stages.count(0) <= 4
    assert staged.converged and type(staged.algorithm.estimator).__name__ == "GibbsTilted"
    # each client keeps where its chains stopped (its EP state): its Gibbs rounds after the first
    # and its posterior after the fit continue from there, with a short warm-up
    est = staged.algorithm.estimator
    assert stages.count(1) > 1
    for c in data.clients:
        state = staged.client_states[c]
        assert state.tilted_state["x"].shape == (est.num_chains, 2 + 16)
        assert state.diagnostics["warmup"] == est.resume_warmup < est.num_warmup
        assert staged._client_results()[c].diagnostics["warmup"] == est.resume_warmup
    alone = BayesianLasso(damping=1.0, standardize=False, estimator="gibbs").fit(data, seed=0, progress=False)
    assert alone.converged and all("stage" not in rec.metrics for rec in alone.history)
    g, r = staged.global_posterior(), alone.global_posterior()
    np.testing.assert_array_less(np.abs(g.mean - r.mean) / r.sd, 0.15)
    np.testing.assert_allclose(g.sd / r.sd, 1.0, atol=0.1)
    for c in data.clients:
        a, b = staged.client_posterior(c), alone.client_posterior(c)
        np.testing.assert_array_less(np.abs(a.mean - b.mean) / b.sd, 0.2)
    # fewer predictors, another estimator or too few rounds: no warm-up
    lasso = BayesianLasso()
    assert lasso._warmup_rounds(ShrinkageSite(d=16), 25) == 8 and lasso._warmup_rounds(ShrinkageSite(d=15), 25) == 0
    assert lasso._warmup_rounds(ShrinkageSite(d=16), 2) == 0
    assert BayesianLasso(estimator="gibbs")._warmup_rounds(ShrinkageSite(d=30), 25) == 0
    with pytest.raises(ValueError, match="stage_rounds"):
        FederatedEP(ShrinkageSite(d=2), staged.algorithm.prior, lasso._estimator(ShrinkageSite(d=2)), stage_rounds=0)


def test_federated_lasso_is_faster_than_pooled_nuts_of_the_same_model():
    # Issue 22's speed item, Case I (K = 10, d = 8): the federated fit with every client's
    # posterior against pooled NUTS of the same model, 4 x (1000 + 1000). Measured 3.8 s vs
    # 16.0 s (4.2x) in benchmarks/results/shrinkage_vs_pooled.md; asserted with room for a
    # busy machine (it was 1.0x before the Gibbs kernel's rework).
    import time

    import jax

    jax.jit(lambda x: x + 1)(jax.numpy.zeros(1)).block_until_ready()  # jax's start-up, paid by neither side
    train, _, _ = selection_case("I", seed=1000)
    model = BayesianShrinkage("lasso", damping=1.0, standardize=False)
    t0 = time.perf_counter()
    fed = model.fit(train, seed=1000, progress=False)
    for c in train.clients:
        fed.client_posterior(c)
    t_fed = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.fit_centralized(train, seed=1000, per_client=True, num_warmup=1000, num_samples=1000, num_chains=4)
    t_ref = time.perf_counter() - t0
    assert t_ref / t_fed > 2.0, (t_fed, t_ref)
