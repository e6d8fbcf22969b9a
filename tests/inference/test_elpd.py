"""LOO and WAIC across clients: the ArviZ export's pointwise log-likelihood (checked against
scipy's densities), arviz.loo / arviz.waic on it, and the federated sums that equal them."""

import warnings

import arviz as az
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedstats import FederatedData, HierarchicalLinearModel
from fedstats.glm import BayesianGLM, HierarchicalGLM

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def sites():
    return FederatedData.from_dataframe(pd.read_csv(EXAMPLES / "sites.csv"), by="site", target="y")


@pytest.fixture(scope="module")
def hm2(sites):
    return HierarchicalLinearModel().fit(sites, seed=0)


@pytest.fixture(scope="module")
def events():
    df = pd.read_csv(EXAMPLES / "events.csv")
    return df


def quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


def assert_same_elpd(ours, theirs):
    for key in ("se", "n_samples", "n_data_points", "warning"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-9), key
    for key in [k for k in ours.index if k.startswith(("elpd", "p_"))]:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-10, abs=1e-8), key


def test_hm2_export_has_chains_and_the_rows_log_likelihood(hm2, sites):
    idata = hm2.to_arviz(n=800, seed=3, log_likelihood=sites)
    assert idata.posterior["local"].shape[:3] == (4, 200, len(sites.clients))
    rhat = az.rhat(idata)
    assert np.isfinite(rhat["global"].values).all() and np.isfinite(rhat["local"].values).all()
    assert float(rhat["local"].max()) < 1.05  # independent draws: the chains agree
    ll = idata.log_likelihood["y"]
    assert ll.shape == (4, 200, sum(sites.n_obs.values()))
    # one client's rows at its own joint draws of (coefficients, noise sd): scipy's normal density
    from fedstats.inference.elpd import stream

    i, c = 1, sites.clients[1]
    coef, sigma = hm2._joint_draws(c, 800, stream(3, i))
    X, y = sites[c].X, sites[c].y
    expect = stats.norm.logpdf(y, coef[:, :1] + coef[:, 1:] @ X.T, sigma[:, None])
    start = sum(sites.n_obs[k] for k in sites.clients[:i])
    got = ll.values.reshape(800, -1)[:, start : start + len(y)]
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)
    assert list(ll.coords["obs"].values[start : start + 2]) == [f"{c}[0]", f"{c}[1]"]


def test_hm2_federated_loo_and_waic_equal_arviz_on_the_pooled_export(hm2, sites):
    idata = hm2.to_arviz(n=1000, seed=5, log_likelihood=sites)
    assert_same_elpd(quiet(hm2.loo, sites, n=1000, seed=5), quiet(az.loo, idata))
    assert_same_elpd(quiet(hm2.waic, sites, n=1000, seed=5), quiet(az.waic, idata))


def test_loo_prefers_the_model_with_the_predictor_that_matters(sites):
    # y depends on x1 (slope about 1.5): dropping it costs far more than its standard error
    full = quiet(HierarchicalLinearModel().fit, sites, seed=0)
    df = pd.read_csv(EXAMPLES / "sites.csv").drop(columns="x1")
    small_data = FederatedData.from_dataframe(df, by="site", target="y")
    small = quiet(HierarchicalLinearModel().fit, small_data, seed=0)
    a, b = quiet(full.loo, sites, n=1000), quiet(small.loo, small_data, n=1000)
    assert a["elpd_loo"] - b["elpd_loo"] > 5 * np.hypot(a["se"], b["se"])


def test_bayesian_glm_pointwise_values_are_binomial_densities(events):
    data = FederatedData.from_dataframe(events, by="clinic", target="sick", features=["age", "smoker"])
    res = quiet(BayesianGLM("binomial").fit, data, seed=0)
    idata = res.to_arviz(n=400, seed=2, log_likelihood=data)
    from fedstats.inference.elpd import stream

    beta = res.global_posterior().sample(400, seed=stream(2))
    c = data.clients[0]
    eta = beta[:, :1] + beta[:, 1:] @ data[c].X.T
    expect = stats.bernoulli.logpmf(data[c].y, 1 / (1 + np.exp(-eta)))
    np.testing.assert_allclose(idata.log_likelihood["y"].values.reshape(400, -1)[:, : data.n_obs[c]], expect, rtol=1e-9)
    assert_same_elpd(quiet(res.loo, data, n=400, seed=2), quiet(az.loo, idata))


def test_hierarchical_poisson_with_exposure_equals_arviz(events):
    data = FederatedData.from_dataframe(events, by="clinic", target="visits", features=["age", "smoker", "years"])
    res = quiet(HierarchicalGLM("poisson", exposure="years").fit, data, seed=0)
    idata = res.to_arviz(n=400, seed=1, log_likelihood=data)
    assert np.isfinite(idata.log_likelihood["y"].values).all()
    assert_same_elpd(quiet(res.waic, data, n=400, seed=1), quiet(az.waic, idata))
    assert_same_elpd(quiet(res.loo, data, n=400, seed=1), quiet(az.loo, idata))


def test_the_wrong_data_and_frequency_weights_are_refused(hm2, events):
    other = FederatedData.from_arrays([np.ones((20, 3))] * 2, [np.zeros(20)] * 2, min_rows=1)
    with pytest.raises(ValueError, match="fit's"):
        hm2.loo(other)
    data = FederatedData.from_dataframe(
        events.assign(w=2.0), by="clinic", target="sick", features=["age", "smoker", "w"]
    )
    res = quiet(BayesianGLM("binomial", weights="w").fit, data, seed=0)
    with pytest.raises(ValueError, match="frequency weights"):
        res.to_arviz(n=40, log_likelihood=data)
