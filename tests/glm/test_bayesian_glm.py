"""BayesianGLM and HierarchicalGLM (federated EP) against pooled NUTS of the same model and
against maximum likelihood, with the issue's tolerances."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.data.disclosure import NO_RULES
from fedstats.glm import BayesianGLM, FederatedGLM, HierarchicalGLM
from fedstats.glm._design import GLMDesign
from fedstats.reference.glm import pooled_nuts
from fedstats.results import NoPosteriorError


def logistic_clients(sizes, mu, tau, seed):
    """Clients with their own coefficients theta_k ~ N(mu, diag tau) (intercept first)."""
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for n in sizes:
        X = rng.normal(size=(n, len(mu) - 1))
        th = np.asarray(mu) + np.sqrt(tau) * rng.normal(size=len(mu))
        Xs.append(X)
        ys.append(rng.binomial(1, 1 / (1 + np.exp(-(th[0] + X @ th[1:])))).astype(float))
    return FederatedData.from_arrays(Xs, ys, **NO_RULES)


def test_bayesian_glm_one_client_equals_pooled_nuts():
    data = logistic_clients([300], [-0.3, 0.8, -0.5], [0.0, 0.0, 0.0], seed=1)
    res = BayesianGLM("binomial", standardize=False, prior_scale=1.5, intercept_scale=1.5).fit(data)
    g = res.global_posterior()
    ref = pooled_nuts(
        GLMDesign(data, True, {}),
        "binomial",
        "logit",
        prior_mean=np.zeros(3),
        prior_sd=np.full(3, 1.5),
        num_samples=2000,
    )["phi"]
    # Monte-Carlo error of 4,000 NUTS draws is about 0.02 sd; EP with one site is exact up to its importance draws
    assert np.max(np.abs(g.mean - ref.mean(0)) / ref.std(0)) < 0.1
    assert np.all(np.abs(g.sd / ref.std(0) - 1) < 0.06)
    assert res.converged and res.client_summary().empty
    with pytest.raises(NoPosteriorError, match="HierarchicalGLM"):
        res.client_posterior(0)


def test_bayesian_glm_with_many_rows_and_a_vague_prior_is_the_mle():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(10_000, 3)) * [1, 5, 0.2] + [0, 10, 0]  # natural units: the prior is on the standardised scale
    y = rng.binomial(1, 1 / (1 + np.exp(-(-0.5 + X @ [1.0, -0.1, 2.0])))).astype(float)
    data = FederatedData.from_arrays([X], [y], **NO_RULES)
    res = BayesianGLM("binomial", prior_scale=100.0, intercept_scale=100.0).fit(data)
    mle = FederatedGLM("binomial").fit(data)
    g = res.global_posterior()
    assert np.max(np.abs(g.mean - mle.params.to_numpy()) / mle.bse.to_numpy()) < 0.1
    assert np.max(np.abs(g.sd / mle.bse.to_numpy() - 1)) < 0.05


def test_bayesian_poisson_rates_over_clients_with_exposure():
    rng = np.random.default_rng(3)
    Xs, ys = [], []
    for n in (400, 250, 600):
        x, years = rng.normal(size=n), rng.uniform(0.5, 3, n)
        Xs.append(np.column_stack([x, years]))
        ys.append(rng.poisson(years * np.exp(0.2 + 0.5 * x)).astype(float))
    data = FederatedData.from_arrays(Xs, ys, feature_names=["x", "years"], **NO_RULES)
    res = BayesianGLM("poisson", exposure="years").fit(data)
    mle = FederatedGLM("poisson", exposure="years").fit(data)
    g = res.global_posterior()
    assert g.names == ["intercept", "x"]
    assert np.max(np.abs(g.mean - mle.params.to_numpy()) / mle.bse.to_numpy()) < 0.15
    assert np.max(np.abs(g.sd / mle.bse.to_numpy() - 1)) < 0.1
    p = res.predict([[0.0]], exposure=2.0, level=0.9)
    assert p["lower"][0] < p["mean"][0] < p["upper"][0] and p["pred_lower"][0] <= p["mean"][0] <= p["pred_upper"][0]
    assert p["mean"][0] == pytest.approx(2 * np.exp(g.mean[0] + g.sd[0] ** 2 / 2), rel=0.03)


@pytest.mark.parametrize("family", ["binomial", "poisson"])
def test_hierarchical_glm_k20_equals_pooled_nuts(family):
    """K = 20 clients of unequal size: phi within 0.25 posterior sd of pooled NUTS of the same
    model, sd ratios in [0.8, 1.25], client posteriors within 0.3 sd."""
    rng = np.random.default_rng(4)
    sizes = rng.integers(30, 150, 20)
    mu, tau = [-0.3, 0.6, -0.4], [0.3, 0.1, 0.05]
    if family == "binomial":
        data = logistic_clients(sizes, mu, tau, seed=4)
    else:
        Xs, ys = [], []
        for n in sizes:
            X = rng.normal(size=(n, 2))
            th = np.asarray(mu) + np.sqrt(tau) * rng.normal(size=3)
            Xs.append(X)
            ys.append(rng.poisson(np.exp(th[0] + X @ th[1:])).astype(float))
        data = FederatedData.from_arrays(Xs, ys, **NO_RULES)
    res = HierarchicalGLM(family, standardize=False).fit(data)
    q = res._fitted_q()
    ref = pooled_nuts(
        GLMDesign(data, True, {}),
        family,
        "log" if family == "poisson" else "logit",
        hierarchical=True,
        num_warmup=500,
        num_samples=1000,
    )
    phi = ref["phi"]
    assert np.max(np.abs(q.mean - phi.mean(0)) / phi.std(0)) < 0.25
    assert np.all((q.sd / phi.std(0) > 0.8) & (q.sd / phi.std(0) < 1.25))
    for k, c in enumerate(data.clients):
        post, th = res.client_posterior(c), ref["theta"][:, k]
        assert np.max(np.abs(post.mean - th.mean(0)) / th.std(0)) < 0.3, c
    s = res.summary(0.9)
    assert (
        list(s.index[:3]) == ["mu[intercept]", "mu[x0]", "mu[x1]"]
        and s.loc["log_tau[x0]", "p_value"] != s.loc["log_tau[x0]", "p_value"]
    )  # NaN: no test of log tau = 0
    cs = res.client_summary()
    assert len(cs) == 20 * 3 and set(cs["client"]) == set(data.clients)
    pred = res.predict(np.zeros((2, 2)), client=data.clients[0])
    new = res.predict(np.zeros((2, 2)))  # a new client: wider than a fitted one
    assert pred.attrs["predicted_for"] == "client" and new.attrs["predicted_for"] == "new client"
    assert (new["upper"] - new["lower"]).iloc[0] > (pred["upper"] - pred["lower"]).iloc[0]
    assert res.communication.by_kind["client posteriors"]["rounds"] == 1


def test_standardised_fit_reports_on_the_data_scale():
    rng = np.random.default_rng(5)
    Xs, ys = [], []
    for n in (200, 300, 250, 150):
        X = np.column_stack([rng.normal(50, 10, n), rng.integers(0, 2, n)])  # age in years, a 0/1 dummy
        th = np.array([-4.0, 0.08, 0.5]) + np.array([0.3, 0.0, 0.0]) * rng.normal()
        Xs.append(X)
        ys.append(rng.binomial(1, 1 / (1 + np.exp(-(th[0] + X @ th[1:])))).astype(float))
    data = FederatedData.from_arrays(Xs, ys, feature_names=["age", "smoker"], **NO_RULES)
    res = HierarchicalGLM("binomial").fit(data)
    s = res.summary()
    assert -6 < s.loc["mu[intercept]", "mean"] < -2 and 0.04 < s.loc["mu[age]", "mean"] < 0.12
    post = res.client_posterior(0)
    assert post.names == ["intercept", "age", "smoker"] and 0.03 < post.mean[1] < 0.13
    flat = BayesianGLM("binomial").fit(data)
    mle = FederatedGLM("binomial").fit(data)
    g = flat.global_posterior()
    assert np.max(np.abs(g.mean - mle.params.to_numpy()) / mle.bse.to_numpy()) < 0.3


def test_bad_input_for_the_bayesian_models():
    data = logistic_clients([50, 60], [0.0, 1.0], [0.0, 0.0], seed=6)
    with pytest.raises(ValueError, match="BayesianGLM: family/link must be one of"):
        BayesianGLM("binomial", "log").fit(data)
    with pytest.raises(ValueError, match="HierarchicalGLM: family must be one of"):
        HierarchicalGLM("gamma").fit(data)
    bad = FederatedData.from_arrays([np.ones((3, 1)) * [[1], [2], [3]]], [np.array([0.0, 2.0, 1.0])], **NO_RULES)
    with pytest.raises(Exception, match="client 0: outcome 'y' is not 0/1"):
        BayesianGLM("binomial").fit(bad)


def test_successes_out_of_trials():
    """Binomial rows with trials= (successes out of n): the Bayesian fit sees proportions, as
    the maximum likelihood fit does, and agrees with it under a vague prior."""
    rng = np.random.default_rng(7)
    Xs, ys = [], []
    for n in (30, 50, 40):
        x, trials = rng.normal(size=n), rng.integers(20, 400, n).astype(float)
        Xs.append(np.column_stack([x, trials]))
        ys.append(rng.binomial(trials.astype(int), 1 / (1 + np.exp(-(0.3 + 0.7 * x)))).astype(float))
    data = FederatedData.from_arrays(Xs, ys, feature_names=["x", "n"], **NO_RULES)
    mle = FederatedGLM("binomial", trials="n").fit(data)
    res = BayesianGLM("binomial", trials="n", prior_scale=100.0, intercept_scale=100.0).fit(data)
    g = res.global_posterior()
    assert np.max(np.abs(g.mean - mle.params.to_numpy()) / mle.bse.to_numpy()) < 0.1
    assert np.max(np.abs(g.sd / mle.bse.to_numpy() - 1)) < 0.05
    hier = HierarchicalGLM("binomial", trials="n").fit(data)
    assert abs(hier.summary().loc["mu[x]", "mean"] - 0.7) < 0.3


def test_ratios_exponentiate_the_posterior_coefficients():
    """``ratios`` of a Bayesian GLM: exp of the posterior means and credible interval ends of
    the shared coefficients (hierarchical: of ``mu``), the tail probabilities kept."""
    import warnings

    rng = np.random.default_rng(3)
    Xs = [rng.normal(size=(60, 1)) for _ in range(4)]
    ys = [rng.poisson(np.exp(0.3 + 0.5 * X[:, 0])).astype(float) for X in Xs]
    data = FederatedData.from_arrays(Xs, ys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model, rows in (
            (BayesianGLM("poisson"), ["intercept", "x0"]),
            (HierarchicalGLM("poisson"), ["mu[intercept]", "mu[x0]"]),
        ):
            res = model.fit(data, seed=0)
            t, s = res.ratios(0.9), res.summary(0.9)
            assert list(t.index) == rows and t.attrs["ratio"] == "rate ratio"
            np.testing.assert_allclose(t[["ratio", "lower", "upper"]], np.exp(s.loc[rows, ["mean", "lower", "upper"]]))
            np.testing.assert_allclose(t["p_value"], s.loc[rows, "p_value"])
    pooled = FederatedGLM("poisson").fit(data).ratios(0.9)  # a vague prior: close to the MLE's ratios
    np.testing.assert_allclose(
        BayesianGLM("poisson").fit(data, seed=0).ratios(0.9)["ratio"], pooled["ratio"], rtol=0.02
    )
