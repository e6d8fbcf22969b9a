"""FederatedGLM (federated IRLS) against statsmodels' GLM on the pooled rows.

The oracle is statsmodels' own ``GLM(...).fit()``: every family and link, offsets, exposure,
frequency weights, binomial trials, HC0 sandwich errors, the likelihood-ratio and Wald tests,
all to 1e-8; the number of rounds is statsmodels' iterations + 1. Then the bad inputs a user
meets: each must stop with one line naming the column (and the client where it is one
client's rows), never fit silently wrong.
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from fedstats.data import DataError, FederatedData
from fedstats.glm import FederatedGLM, GLMResult, SeparationError
from fedstats.results import NoPosteriorError

TOL = 1e-8
L = sm.families.links
SM_FAMILY = {
    "gaussian": sm.families.Gaussian,
    "binomial": sm.families.Binomial,
    "poisson": sm.families.Poisson,
    "gamma": sm.families.Gamma,
    "negative_binomial": sm.families.NegativeBinomial,
}
SM_LINK = {
    "identity": L.Identity,
    "log": L.Log,
    "inverse": L.InversePower,
    "logit": L.Logit,
    "probit": L.Probit,
    "cloglog": L.CLogLog,
}
CASES = [
    ("gaussian", "identity"),
    ("gaussian", "log"),
    ("gaussian", "inverse"),
    ("binomial", "logit"),
    ("binomial", "probit"),
    ("binomial", "cloglog"),
    ("binomial", "log"),
    ("poisson", "log"),
    ("poisson", "identity"),
    ("gamma", "inverse"),
    ("gamma", "log"),
    ("gamma", "identity"),
    ("negative_binomial", "log"),
    ("negative_binomial", "identity"),
]
ALPHA = 0.5  # the negative binomial's fixed dispersion


def simulate(family, link, seed, K=4, d=3, offset=None):
    """K clients of unequal size with outcomes from ``family``/``link`` (means kept inside
    their range so that every link is well posed)."""
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for _ in range(K):
        n = int(rng.integers(30, 120))
        X = rng.normal(size=(n, d)) * np.linspace(0.5, 2, d)
        eta = 0.5 * X @ np.resize([0.3, -0.4, 0.2], d) + (0 if offset is None else offset)
        if family == "gaussian":
            mu = {"identity": 1 + eta, "log": np.exp(1 + 0.3 * eta), "inverse": 1 / (2 + 0.3 * eta)}[link]
            y = mu + 0.1 * rng.normal(size=n) * (1 if link == "identity" else mu)
        elif family == "binomial":
            p = {
                "logit": stats.logistic.cdf(eta),
                "probit": stats.norm.cdf(eta),
                "cloglog": -np.expm1(-np.exp(eta)),
                "log": np.exp(-1.5 + 0.3 * eta),
            }[link]
            y = rng.binomial(1, p).astype(float)
        elif family in ("poisson", "negative_binomial"):
            mu = {"log": np.exp(1 + eta), "identity": 3 + 0.5 * eta}[link]
            y = rng.poisson(mu) if family == "poisson" else rng.negative_binomial(1 / ALPHA, 1 / (1 + ALPHA * mu))
        else:
            mu = {"inverse": 1 / (1 + 0.2 * eta), "log": np.exp(eta), "identity": 3 + 0.5 * eta}[link]
            y = rng.gamma(3.0, mu / 3.0)
        Xs.append(X)
        ys.append(np.asarray(y, dtype=float))
    return Xs, ys


def pooled(family, link, X, y, **kw):
    fam = SM_FAMILY[family](link=SM_LINK[link](), **({"alpha": ALPHA} if family == "negative_binomial" else {}))
    cov = kw.pop("cov_type", "nonrobust")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' notes on non-canonical links
        return sm.GLM(y, X, family=fam, **kw).fit(cov_type=cov)


def same_fit(res: GLMResult, ref, tol=TOL):
    """Coefficients, standard errors, deviance, log-likelihood, AIC, BIC and dispersion."""
    np.testing.assert_allclose(res.params.to_numpy(), ref.params, rtol=tol, atol=tol)
    np.testing.assert_allclose(res.bse.to_numpy(), ref.bse, rtol=tol, atol=tol)
    for name in ("deviance", "llf", "aic", "bic", "scale", "pearson_chi2", "df_resid", "df_model", "nobs", "wnobs"):
        want = float(getattr(ref.model if name == "wnobs" else ref, name))
        np.testing.assert_allclose(getattr(res, name), want, rtol=tol, atol=tol, err_msg=name)
    np.testing.assert_allclose(res.pvalues.to_numpy(), ref.pvalues, rtol=1e-6, atol=tol)


@pytest.mark.parametrize("family,link", CASES, ids=[f"{f}-{l}" for f, l in CASES])
def test_every_family_and_link_equals_statsmodels_on_the_pooled_rows(family, link):
    Xs, ys = simulate(family, link, seed=zlib.crc32(f"{family}-{link}".encode()) % 1000)
    res = FederatedGLM(family, link, alpha=ALPHA).fit(FederatedData.from_arrays(Xs, ys))
    ref = pooled(family, link, sm.add_constant(np.vstack(Xs)), np.concatenate(ys))
    same_fit(res, ref)
    assert res.converged and ref.converged
    # the same IRLS iterations; the clients evaluate the last one in one more round
    assert res.n_iter == ref.fit_history["iteration"] and res.rounds == res.n_iter + 1
    ci = ref.conf_int(0.1)
    np.testing.assert_allclose(res.summary(0.9)[["lower", "upper"]].to_numpy(), ci, rtol=TOL, atol=TOL)


@pytest.mark.parametrize(
    "family,link", [("binomial", "logit"), ("poisson", "log"), ("gamma", "log"), ("binomial", "probit")]
)
def test_hc0_sandwich_equals_statsmodels(family, link):
    Xs, ys = simulate(family, link, seed=11)
    res = FederatedGLM(family, link, cov_type="HC0").fit(FederatedData.from_arrays(Xs, ys))
    ref = pooled(family, link, sm.add_constant(np.vstack(Xs)), np.concatenate(ys), cov_type="HC0")
    same_fit(res, ref)
    assert res.communication.by_kind["sandwich round"]["rounds"] == 1


RATIOS = {
    ("binomial", "logit"): "odds ratio",
    ("binomial", "log"): "risk ratio",
    ("poisson", "log"): "rate ratio",
    ("negative_binomial", "log"): "rate ratio",
    ("gamma", "log"): "ratio of means",
}


@pytest.mark.parametrize("family,link", list(RATIOS), ids=[f"{f}-{l}" for f, l in RATIOS])
def test_ratios_are_exp_of_the_pooled_coefficients_and_intervals(family, link):
    """``ratios``: exp of statsmodels' coefficients and Wald interval on the pooled rows,
    named by the link (odds, risk, rate ratio), with the coefficient's test of 0 (ratio 1)."""
    Xs, ys = simulate(family, link, seed=zlib.crc32(f"{family}-{link}".encode()) % 1000)
    res = FederatedGLM(family, link, alpha=ALPHA).fit(FederatedData.from_arrays(Xs, ys))
    ref = pooled(family, link, sm.add_constant(np.vstack(Xs)), np.concatenate(ys))
    t = res.ratios(0.9)
    assert t.attrs["ratio"] == RATIOS[family, link] and list(t.columns) == ["ratio", "lower", "upper", "p_value"]
    np.testing.assert_allclose(t["ratio"].to_numpy(), np.exp(ref.params), rtol=1e-7)
    np.testing.assert_allclose(t[["lower", "upper"]].to_numpy(), np.exp(ref.conf_int(0.1)), rtol=1e-7)
    np.testing.assert_allclose(t["p_value"].to_numpy(), ref.pvalues, rtol=1e-6, atol=TOL)


def test_links_without_a_ratio_scale_refuse_ratios():
    Xs, ys = simulate("binomial", "probit", seed=3)
    with pytest.raises(ValueError, match="only under the log or logit link; this binomial fit has the probit link"):
        FederatedGLM("binomial", "probit").fit(FederatedData.from_arrays(Xs, ys)).ratios()


def test_the_server_steps_see_only_sums_of_information_and_score(monkeypatch):
    """IRLS and the sandwich round declare every reply a sum, the design check all but each
    client's row count and column ranges: their server steps cannot read one client's value."""
    from fedstats.glm import _irls

    seen = []
    for cls in (_irls.DesignCheck, _irls.IRLS, _irls.Sandwich):
        real = cls.server_step

        def spy(self, state, replies, round, real=real):
            seen.append((type(self).__name__, [set(r) for r in replies.values()], set(replies.sums)))
            return real(self, state, replies, round)

        monkeypatch.setattr(cls, "server_step", spy)
    Xs, ys = simulate("binomial", "logit", seed=11)
    res = FederatedGLM("binomial", "logit", cov_type="HC0").fit(FederatedData.from_arrays(Xs, ys))
    monkeypatch.undo()
    ref = pooled("binomial", "logit", sm.add_constant(np.vstack(Xs)), np.concatenate(ys), cov_type="HC0")
    same_fit(res, ref)
    kinds = {name for name, _, _ in seen}
    assert kinds == {"DesignCheck", "IRLS", "Sandwich"}
    for name, per_client, sums in seen:
        assert len(per_client) == len(Xs)
        if name == "DesignCheck":
            assert all(keys == {"n_rows"} for keys in per_client)
            assert sums == {"sum_y", "wnobs", "xtx", "non_integer"}  # non_integer: non-integer outcomes (none here)
        else:
            assert all(keys == set() for keys in per_client) and sums == set(getattr(_irls, name).reply_keys)


def frame(Xs, ys, **cols):
    parts = []
    for k, (X, y) in enumerate(zip(Xs, ys)):
        d = {"site": f"s{k}", **{f"x{j}": X[:, j] for j in range(X.shape[1])}, "y": y}
        d.update({name: v[k] for name, v in cols.items()})
        parts.append(pd.DataFrame(d))
    return pd.concat(parts, ignore_index=True)


def test_poisson_with_exposure_offset_and_frequency_weights():
    rng = np.random.default_rng(3)
    Xs, _ = simulate("poisson", "log", seed=3)
    years = [rng.uniform(0.5, 4, len(X)) for X in Xs]
    off = [0.1 * rng.normal(size=len(X)) for X in Xs]
    freq = [rng.integers(1, 4, len(X)).astype(float) for X in Xs]
    ys = [rng.poisson(t * np.exp(0.3 + 0.2 * X[:, 0] + o)).astype(float) for X, t, o in zip(Xs, years, off)]
    df = frame(Xs, ys, years=years, off=off, freq=freq)
    data = FederatedData.from_dataframe(df, by="site", target="y")
    res = FederatedGLM("poisson", exposure="years", offset="off", weights="freq").fit(data)
    assert res.names == ["intercept", "x0", "x1", "x2"]
    ref = sm.GLM(
        df["y"],
        sm.add_constant(df[["x0", "x1", "x2"]]),
        family=sm.families.Poisson(),
        exposure=df["years"],
        offset=df["off"],
        freq_weights=df["freq"],
    ).fit()
    same_fit(res, ref)
    # predictions carry the exposure: the expected count over 2 years is twice that over one
    p1 = res.predict(np.zeros((1, 3)), exposure=1.0, offset=0.0)["mean"].iloc[0]
    p2 = res.predict(np.zeros((1, 3)), exposure=2.0, offset=0.0)["mean"].iloc[0]
    assert p2 == pytest.approx(2 * p1) and p1 == pytest.approx(np.exp(ref.params.iloc[0]))
    with pytest.raises(ValueError, match="exposure column"):
        res.predict(np.zeros((1, 3)), offset=0.0)


@pytest.mark.parametrize("link", ["logit", "cloglog"])
def test_binomial_successes_out_of_trials_with_weights(link):
    rng = np.random.default_rng(4)
    Xs, _ = simulate("binomial", link, seed=4)
    trials = [rng.integers(1, 12, len(X)).astype(float) for X in Xs]
    freq = [rng.uniform(0.5, 3, len(X)) for X in Xs]
    ys = [rng.binomial(t.astype(int), stats.logistic.cdf(0.4 * X[:, 1])).astype(float) for X, t in zip(Xs, trials)]
    df = frame(Xs, ys, n=trials, w=freq)
    res = FederatedGLM("binomial", link, trials="n", weights="w").fit(
        FederatedData.from_dataframe(df, by="site", target="y")
    )
    ref = pooled(
        "binomial",
        link,
        sm.add_constant(df[["x0", "x1", "x2"]]).to_numpy(),
        np.column_stack([df["y"], df["n"] - df["y"]]),
        freq_weights=df["w"].to_numpy(),
    )
    same_fit(res, ref)


def test_gaussian_weights_and_no_intercept():
    Xs, ys = simulate("gaussian", "identity", seed=5)
    rng = np.random.default_rng(5)
    freq = [rng.integers(0, 3, len(X)).astype(float) for X in Xs]  # rows with weight 0 drop out
    df = frame(Xs, ys, w=freq)
    res = FederatedGLM("gaussian", fit_intercept=False, weights="w").fit(
        FederatedData.from_dataframe(df, by="site", target="y")
    )
    ref = sm.GLM(df["y"], df[["x0", "x1", "x2"]], freq_weights=df["w"]).fit()
    same_fit(res, ref)


def test_likelihood_ratio_and_wald_tests_equal_the_pooled_ones():
    Xs, ys = simulate("binomial", "logit", seed=6, d=4)
    data = FederatedData.from_arrays(Xs, ys, feature_names=["a", "b", "c", "d"])
    full = FederatedGLM("binomial").fit(data)
    small = FederatedGLM("binomial").fit(
        FederatedData.from_arrays([X[:, :2] for X in Xs], ys, feature_names=["a", "b"])
    )
    X, y = sm.add_constant(np.vstack(Xs)), np.concatenate(ys)
    rf, rs = pooled("binomial", "logit", X, y), pooled("binomial", "logit", X[:, :3], y)
    lr = full.lr_test(small)
    assert lr["statistic"] == pytest.approx(2 * (rf.llf - rs.llf), abs=TOL) and lr["df"] == 2
    assert lr["p_value"] == pytest.approx(stats.chi2.sf(2 * (rf.llf - rs.llf), 2), abs=TOL)
    assert small.lr_test(full)["statistic"] == lr["statistic"]  # either order
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = rf.wald_test(np.eye(5)[3:], scalar=True)
    ours = full.wald_test(["c", "d"])
    assert ours["statistic"] == pytest.approx(float(w.statistic), abs=TOL) and ours["df"] == 2
    assert ours["p_value"] == pytest.approx(float(w.pvalue), abs=TOL)
    with pytest.raises(ValueError, match="not nested"):
        small.lr_test(
            FederatedGLM("binomial").fit(
                FederatedData.from_arrays([X[:, 2:] for X in Xs], ys, feature_names=["c", "d"])
            )
        )
    with pytest.raises(ValueError, match="same family"):
        full.lr_test(FederatedGLM("binomial", "probit").fit(data))
    with pytest.raises(ValueError, match="unknown coefficient"):
        full.wald_test(["e"])


def test_the_result_contract():
    Xs, ys = simulate("poisson", "log", seed=7)
    data = FederatedData.from_arrays(Xs, ys, clients=["a", "b", "c", "d"])
    res = FederatedGLM("poisson").fit(data)
    s = res.summary(0.9)
    assert list(s.columns) == ["mean", "sd", "lower", "upper", "p_value", "z"]
    assert res.client_summary().empty and list(res.client_summary().columns[:3]) == ["client", "parameter", "mean"]
    with pytest.raises(NoPosteriorError, match="BayesianGLM"):
        res.global_posterior()
    p = res.predict(Xs[0][:5], client="a", level=0.9)
    np.testing.assert_allclose(p["mean"], np.exp(sm.add_constant(Xs[0][:5]) @ res.params.to_numpy()))
    assert np.all(p["lower"] < p["mean"]) and np.all(p["mean"] < p["upper"]) and p["pred_lower"].isna().all()
    with pytest.raises(KeyError, match="unknown client"):
        res.predict(Xs[0][:5], client="zz")
    assert res.communication.by_kind["IRLS rounds"]["rounds"] == res.rounds
    # one p x p matrix and a few numbers per client and round, never a row
    p_ = len(res.names)
    per_round = 4 * (8 * (p_ * p_ + p_ + 4))
    assert res.communication.by_kind["IRLS rounds"]["bytes_up"] == per_round * res.rounds


def test_a_client_with_a_constant_outcome_still_counts():
    Xs, ys = simulate("binomial", "logit", seed=8)
    ys[2] = np.zeros_like(ys[2])  # no events at this site: its rows still inform the fit
    res = FederatedGLM("binomial").fit(FederatedData.from_arrays(Xs, ys))
    same_fit(res, pooled("binomial", "logit", sm.add_constant(np.vstack(Xs)), np.concatenate(ys)))
    assert res.n_obs[2] == len(ys[2])


# --------------------------------------------------------------------------- bad input
def test_separation_is_an_error_naming_the_predictor():
    Xs, ys = simulate("binomial", "logit", seed=9)
    ys = [(X[:, 1] > 0).astype(float) for X in Xs]  # x1 separates the outcome completely
    with pytest.raises(SeparationError, match="'x1'.*BayesianGLM"):
        FederatedGLM("binomial").fit(FederatedData.from_arrays(Xs, ys))
    # quasi-complete: a dummy whose rows are all events, the others mixed
    rng = np.random.default_rng(9)
    for X, y in zip(Xs, ys):
        X[:, 2] = (rng.uniform(size=len(X)) < 0.1).astype(float)
        y[:] = np.where(X[:, 2] == 1, 1.0, rng.binomial(1, 0.4, len(X)))
    with pytest.raises(SeparationError, match="'x2'"):
        FederatedGLM("binomial").fit(FederatedData.from_arrays(Xs, ys))


def test_a_poisson_category_without_events_is_separation():
    rng = np.random.default_rng(10)
    Xs = [np.column_stack([rng.normal(size=60), (rng.uniform(size=60) < 0.2).astype(float)]) for _ in range(3)]
    ys = [np.where(X[:, 1] == 1, 0.0, rng.poisson(2.0, 60)) for X in Xs]
    with pytest.raises(SeparationError, match="means of exactly 0.*'x1'"):
        FederatedGLM("poisson").fit(FederatedData.from_arrays(Xs, ys))


def test_a_gaussian_outcome_of_zero_where_the_fitted_mean_is_negative_is_no_separation():
    # an unbounded mean has no edge: y = 0 with a fitted mean below 0 is an ordinary row
    rng = np.random.default_rng(11)
    Xs = [rng.normal(size=(80, 2)) for _ in range(3)]
    ys = [np.round(X @ [2.0, -1.0] - 0.5 + rng.normal(size=80), 1) for X in Xs]
    ys[0][:5] = 0.0
    res = FederatedGLM("gaussian").fit(FederatedData.from_arrays(Xs, ys))
    assert (np.column_stack([np.ones(240), np.vstack(Xs)]) @ res.coef < 0).any()
    ref = sm.GLM(np.concatenate(ys), sm.add_constant(np.vstack(Xs)), family=sm.families.Gaussian()).fit()
    np.testing.assert_allclose(res.coef, ref.params, rtol=1e-9)


def test_bad_outcomes_name_the_client_and_column():
    Xs, ys = simulate("binomial", "logit", seed=12)
    ys[1] = ys[1].copy()
    ys[1][3] = 2.0
    data = FederatedData.from_arrays(Xs, ys, clients=["a", "b", "c", "d"], target_name="sick")
    with pytest.raises(DataError, match=r"^client 'b': outcome 'sick' is not 0/1.*2$"):
        FederatedGLM("binomial").fit(data)
    ys[1][3] = -1.0
    with pytest.raises(DataError, match="client 'b': outcome 'sick' has negative counts"):
        FederatedGLM("poisson").fit(FederatedData.from_arrays(Xs, ys, clients=list("abcd"), target_name="sick"))
    with pytest.raises(DataError, match="client 'a': outcome 'sick' is not positive \\(gamma\\)"):
        FederatedGLM("gamma").fit(FederatedData.from_arrays(Xs, ys, clients=list("abcd"), target_name="sick"))
    Xs[3][0, 1] = np.nan
    with pytest.raises(DataError, match="client 3.*'x1'"):
        FederatedData.from_arrays(Xs, ys)  # NaN never reaches a fit


def test_constant_and_collinear_predictors_are_named():
    Xs, ys = simulate("poisson", "log", seed=13)
    for X in Xs:
        X[:, 1] = 2.5  # the same value at every client
    with pytest.raises(DataError, match="'x1' is constant \\(2.5\\) at every client"):
        FederatedGLM("poisson").fit(FederatedData.from_arrays(Xs, ys))
    Xs, ys = simulate("poisson", "log", seed=13)
    for X in Xs:
        X[:, 2] = X[:, 0] - 2 * X[:, 1]
    with pytest.raises(DataError, match="'x2' is a linear combination of"):
        FederatedGLM("poisson").fit(FederatedData.from_arrays(Xs, ys))
    # a predictor constant within each client but not across them is fine (a site effect)
    Xs, ys = simulate("poisson", "log", seed=13)
    for k, X in enumerate(Xs):
        X[:, 1] = k
    FederatedGLM("poisson").fit(FederatedData.from_arrays(Xs, ys))


def test_bad_options_and_special_columns():
    Xs, ys = simulate("poisson", "log", seed=14)
    data = FederatedData.from_arrays(Xs, ys)
    with pytest.raises(ValueError, match="FederatedGLM: family must be one of"):
        FederatedGLM("weibull").fit(data)
    with pytest.raises(ValueError, match="poisson family takes the links"):
        FederatedGLM("poisson", "logit").fit(data)
    with pytest.raises(ValueError, match="trials= is for the binomial"):
        FederatedGLM("poisson", trials="x0").fit(data)
    with pytest.raises(DataError, match="exposure='t' is not a column"):
        FederatedGLM("poisson", exposure="t").fit(data)
    with pytest.raises(DataError, match="exposure column 'x0' has values <= 0"):
        FederatedGLM("poisson", exposure="x0").fit(data)


def test_a_mean_outside_the_family_range_is_named():
    rng = np.random.default_rng(17)
    Xs = [3 * rng.normal(size=(50, 1)) for _ in range(3)]
    ys = [rng.poisson(np.exp(0.8 * X[:, 0])).astype(float) for X in Xs]
    with pytest.raises(RuntimeError, match="left the poisson family's range under the identity link"):
        FederatedGLM("poisson", "identity").fit(FederatedData.from_arrays(Xs, ys))


def test_non_convergence_warns_naming_the_predictor():
    Xs, ys = simulate("gamma", "log", seed=15)
    with pytest.warns(UserWarning, match="did not converge in 2 iterations.*coefficient still moving most"):
        res = FederatedGLM("gamma", "log", rounds=2).fit(FederatedData.from_arrays(Xs, ys))
    assert not res.converged and res.rounds == 3


def test_save_and_load_keep_everything(tmp_path):
    Xs, ys = simulate("negative_binomial", "log", seed=16)
    res = FederatedGLM("negative_binomial", alpha=ALPHA, cov_type="HC0").fit(FederatedData.from_arrays(Xs, ys))
    back = GLMResult.load(res.save(tmp_path / "glm.fedstats"))
    pd.testing.assert_frame_equal(res.summary(), back.summary())
    assert back.llf == res.llf and back._family.alpha == ALPHA
    pd.testing.assert_frame_equal(res.predict(Xs[0][:3]), back.predict(Xs[0][:3]))


# --------------------------------------------------------------------------- diagnostics that name the culprit
def _frame(y, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"site": np.repeat(list("abc"), 40), "x": rng.normal(size=120), "y": y})


@pytest.mark.parametrize(
    ("family", "value", "inf"), [("poisson", 0.0, "-inf"), ("binomial", 0.0, "-inf"), ("binomial", 1.0, "+inf")]
)
def test_an_outcome_at_the_edge_everywhere_is_explained(family, value, inf):
    """Every outcome 0 (or every binomial outcome 1): the intercept diverges and the MLE does
    not exist; said as that (not blamed on a predictor or on client 0), while the Bayesian GLM,
    whose prior keeps the intercept finite, fits it."""
    from fedstats.glm import BayesianGLM

    data = FederatedData.from_dataframe(_frame(np.full(120, value)), by="site", target="y")
    with pytest.raises(
        DataError, match=f"every outcome 'y' is {value:g} at every client.*intercept diverges to \\{inf}"
    ):
        FederatedGLM(family).fit(data)
    res = BayesianGLM(family, rounds=3).fit(data, seed=0, progress=False)
    assert np.isfinite(res.summary()["mean"]).all()


def test_an_intercept_only_glm_equals_statsmodels():
    rng = np.random.default_rng(4)
    df = _frame(rng.poisson(3, 120).astype(float))
    data = FederatedData.from_dataframe(df, by="site", target="y", features=[])
    assert data.feature_names == []
    res = FederatedGLM("poisson").fit(data)
    ref = sm.GLM(df["y"], np.ones((120, 1)), family=sm.families.Poisson()).fit()
    np.testing.assert_allclose(res.summary()["mean"], ref.params, rtol=1e-10)
    np.testing.assert_allclose(res.summary()["sd"], ref.bse, rtol=1e-8)
    np.testing.assert_allclose(
        res.predict(pd.DataFrame(index=range(2)))["mean"], np.exp(ref.params.iloc[0]), rtol=1e-10
    )


def test_non_integer_counts_are_warned_about():
    rng = np.random.default_rng(5)
    data = FederatedData.from_dataframe(_frame(rng.poisson(3, 120) + 0.5), by="site", target="y")
    with pytest.warns(UserWarning, match="120 row.* of outcome 'y' are not whole numbers.*poisson"):
        FederatedGLM("poisson").fit(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # whole counts: no warning
        FederatedGLM("poisson").fit(
            FederatedData.from_dataframe(_frame(rng.poisson(3, 120).astype(float)), by="site", target="y")
        )


def test_a_model_failure_names_every_client_that_failed(monkeypatch):
    """Non-finite statistics from the IRLS rounds stop the fit naming every client that sent
    them, not the first one alone."""
    from fedstats.glm import _irls

    real = _irls.evaluate

    def broken(family, r, beta, start, ybar):
        out = real(family, r, beta, start, ybar)
        if r.client in ("b", "c") and not start:
            out["xtwx"] = out["xtwx"] * np.nan
        return out

    monkeypatch.setattr(_irls, "evaluate", broken)
    data = FederatedData.from_dataframe(
        _frame(np.random.default_rng(6).poisson(3, 120).astype(float)), by="site", target="y"
    )
    with pytest.raises(RuntimeError, match=r"2 client.*failed: client 'b' in round \d+.*NaN.*client 'c' in round \d+"):
        FederatedGLM("poisson").fit(data)
