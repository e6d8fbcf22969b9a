"""The result contract (fedstats.results), checked the same way for every model: the same
verbs, the same leading columns, one behaviour for posteriors a model does not have and for
clients a fit has not seen, ArviZ export, a short repr. (The save/load round trip and the byte
accounting against the runtime's own records are in test_results.py, over the same fits.)"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats.registry import declarations
from fedstats.results import (
    CLIENT_SUMMARY_COLUMNS,
    PREDICT_COLUMNS,
    SUMMARY_COLUMNS,
    NoPosteriorError,
    UnknownClientError,
)

#: what each result is expected to do, declared with its example in the registry
#: (fedstats.registry.spec.Expect); an online model's result is "<name>-result"
EXPECT = {
    (f"{ex.name}-result" if ex.data == "stream" else ex.name): ex.expect
    for d in declarations().values()
    for ex in d.examples
}
POSTERIORS = {n: e.posteriors for n, e in EXPECT.items()}
REMEDY = {n: e.remedy for n, e in EXPECT.items()}
NO_GLOBAL_ROWS = {n for n, e in EXPECT.items() if not e.global_rows}
NO_CLIENT_ROWS = {n for n, e in EXPECT.items() if not e.client_rows}
DISCRETE = {n for n, e in EXPECT.items() if e.discrete}
MIXTURES = {n for n, e in EXPECT.items() if e.mixture}
NEW_CLIENT = {n: e.new_client for n, e in EXPECT.items() if not e.mixture}
_EXAMPLES = [ex for d in declarations().values() for ex in d.examples]
POOLED = {ex.name for ex in _EXAMPLES if ex.method == "fit_centralized"}  # pooled rows: nothing exchanged
ONLINE = {f"{ex.name}-result" for ex in _EXAMPLES if ex.data == "stream"}  # an online learner's result


def test_every_result_has_its_expectations(result_names):
    assert set(EXPECT) == set(result_names)
    for n, e in EXPECT.items():  # a missing posterior's error names its remedy
        assert bool(e.remedy) == (not all(e.posteriors)) or e.mixture and all(e.posteriors), n


@pytest.fixture
def fit(fitted, result_name):
    """``(result, data)`` of each fitted result in turn (its name is the test's id)."""
    return fitted[0][result_name], fitted[1]


def test_summary_has_the_fixed_columns(fit, result_name):
    res, _ = fit
    name = result_name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = res.summary()
        s90 = res.summary(level=0.5)
        hdi = res.summary(kind="hdi")
    assert tuple(s.columns[:5]) == SUMMARY_COLUMNS and s.index.name == "parameter"
    assert tuple(hdi.columns[:5]) == SUMMARY_COLUMNS and list(hdi.index) == list(s.index)
    assert (len(s) == 0) == (name in NO_GLOBAL_ROWS)
    has = s["sd"].notna()
    assert has.any() == EXPECT[name].summary_sd, (
        "sd given exactly where the model has a global posterior (or the sampling distribution of an estimate)"
    )
    ok = has & np.isfinite(s["sd"])
    assert np.all(s.loc[ok, "lower"] <= s.loc[ok, "upper"])
    # a narrower level gives a nested interval
    assert np.all(s90.loc[ok, "lower"] >= s.loc[ok, "lower"] - 1e-12)
    assert np.all(s90.loc[ok, "upper"] <= s.loc[ok, "upper"] + 1e-12)
    for bad in (0, 1, 1.5, "high"):
        with pytest.raises(ValueError, match="level must be a number in"):
            res.summary(level=bad)
    with pytest.raises(ValueError, match="kind must be"):
        res.summary(kind="central")


def test_client_summary_is_one_long_table(fit, result_name):
    res, _ = fit
    name = result_name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = res.client_summary()
    assert tuple(t.columns[:7]) == CLIENT_SUMMARY_COLUMNS
    if name in NO_CLIENT_ROWS:
        assert len(t) == 0
        return
    assert list(pd.unique(t["client"])) == list(res.clients)
    assert t["mean"].notna().all()
    assert t["sd"].notna().any() == POSTERIORS[name][1]
    if POSTERIORS[name][1]:  # the table describes the client posteriors (closed forms or their draws)
        c = res.clients[-1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            own = res.client_posterior(c).summary()
        rows = t[t["client"] == c].set_index("parameter").loc[own.index]
        assert np.all(np.abs(rows["mean"] - own["mean"]) <= 0.1 * own["sd"] + 1e-12)
        np.testing.assert_allclose(rows["sd"], own["sd"], rtol=0.1)


def test_posteriors_one_calling_convention(fit, result_name):
    res, _ = fit
    name = result_name
    has_global, has_client = POSTERIORS[name]
    c = res.clients[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for has, call in ((has_global, lambda: res.global_posterior()), (has_client, lambda: res.client_posterior(c))):
            if has:
                post = call()
                lo, hi = post.credible_interval(0.9)
                assert np.all(lo <= hi) and post.sample(5, seed=0).shape == (5, post.dim)
                assert post.summary().index.name == "parameter"
            else:
                with pytest.raises(NoPosteriorError, match=REMEDY[name].replace("(", r"\(").replace(")", r"\)")):
                    call()
        with pytest.raises(UnknownClientError, match="unknown client 'nowhere'") as err:
            res.client_posterior("nowhere")
        assert isinstance(err.value, KeyError)


def test_predict_leading_columns_and_unseen_clients(fit, result_name):
    res, data = fit
    name = result_name
    c = res.clients[0]
    X = np.asarray(data[data.clients[0]].X)[:4]
    if name in MIXTURES:  # scikit-learn's meaning: labels and responsibilities (the contract says so)
        X = np.random.default_rng(0).normal(size=(4, res.means.shape[-1]))
        labels, proba = res.predict(X, client=c), res.predict_proba(X, client=c)
        assert labels.dtype.kind == "i" and np.allclose(proba.sum(1), 1)
        assert np.array_equal(labels, proba.argmax(1))
        with pytest.raises(KeyError, match="unknown client"):
            res.predict(X, client="nowhere")
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = res.predict(X, client=c, level=0.9)
        assert tuple(p.columns[:5]) == PREDICT_COLUMNS and len(p) == 4 and p.attrs["predicted_for"] == "client"
        bands = p[list(PREDICT_COLUMNS[1:])]
        # bands come from the client's posterior, or from shared coefficients (the GLMs)
        assert bands.notna().all().all() == EXPECT[name].bands
        if bands.notna().all().all() and name in DISCRETE:  # a band of 0/1 outcomes need not hold the mean's
            assert np.all((p["lower"] <= p["upper"]) & (p["pred_lower"] <= p["pred_upper"]))
            assert set(p["pred_lower"]) | set(p["pred_upper"]) <= {0.0, 1.0}
        elif bands.notna().all().all():
            assert np.all(
                (p["lower"] <= p["upper"])
                & (p["pred_lower"] <= p["lower"] + 1e-9)
                & (p["upper"] <= p["pred_upper"] + 1e-9)
            )
        with pytest.raises(UnknownClientError, match="unknown client 'nowhere'"):
            res.predict(X, client="nowhere")
        how = NEW_CLIENT[name]
        if how == "refused":
            with pytest.raises(ValueError, match="took no part in the fit"):
                res.predict(X, client=None)
        else:
            kw = {"data": (np.asarray(data[c].X), np.asarray(data[c].y))} if how == "data" else {}
            q = res.predict(X, client=None, **kw)
            assert tuple(q.columns[:5]) == PREDICT_COLUMNS and q.attrs["predicted_for"] == "new client"


def test_to_arviz_holds_every_posterior(fit, result_name):
    res, _ = fit
    name = result_name
    has_global, has_client = POSTERIORS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not (has_global or has_client):
            with pytest.raises(NoPosteriorError):
                res.to_arviz(n=20)
            return
        idata = res.to_arviz(n=20, seed=1)
    post = idata.posterior
    assert ("global" in post) == has_global and ("local" in post) == has_client
    if has_global:
        assert post["global"].shape == (4, 5, len(res.global_posterior().names))  # 4 chains of 5 draws
    if has_client:
        assert post["local"].shape[:3] == (4, 5, len(res.clients))
        assert list(post["local"].coords["client"].values) == [str(c) for c in res.clients]


def test_run_facts_and_a_short_repr(fit, result_name):
    res, _ = fit
    for attr in ("history", "rounds", "converged", "seconds", "communication"):
        assert hasattr(res, attr), attr
    if result_name not in POOLED:  # pooled rows in one process: nothing exchanged
        assert res.communication.bytes_up > 0 and not res.communication.breakdown().empty
    r = repr(res)
    assert r.startswith(type(res).__name__ + "(") and "\n" not in r and len(r) < 200
    assert "clients=" in r


def test_tables_survive_save_and_load(fit, tmp_path):
    res, _ = fit
    back = type(res).load(res.save(tmp_path / "r.fedstats"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pd.testing.assert_frame_equal(res.summary(), back.summary())
        pd.testing.assert_frame_equal(res.client_summary(), back.client_summary())


# --------------------------------------------------------------------------- clients not in the fit
def test_a_client_not_in_the_fit_has_no_numbers(dropped_fits, dropped_name, dropout_reasons):
    """Three clients drop out of every model's fit: refused by its node's policy (too few rows),
    every step raising, its node lost after the first round. Each is named with its reason in a
    warning and in ``excluded``; its client_summary rows hold NaN (no zero-width interval, no
    p_value) and say why; its posterior and its predictions are refused with the reason; the
    clients in the fit keep their numbers."""
    from fedstats.results import ExcludedClientError

    fits, data = dropped_fits
    res, caught, backend = fits[dropped_name]
    if isinstance(res, BaseException):
        raise res
    # the node of "gone" is lost after the fit's first round: a fit of one exchange has it
    gone = {"tiny", "bad"} | ({"gone"} if backend.rounds > 1 else set())
    assert set(res.excluded) == gone, res.excluded
    for c in gone:
        assert dropout_reasons[c] in res.excluded[c], (c, res.excluded[c])
    said = [str(w.message) for w in caught if "not in the fit" in str(w.message)]
    assert len(said) == 1 and all(repr(c) in said[0] for c in gone), said
    fitted = [c for c in res._all_clients() if c not in gone]
    assert fitted == [c for c in data.clients if c not in gone] or dropped_name in MIXTURES

    t = res.client_summary()
    nums = list(SUMMARY_COLUMNS)
    if dropped_name in NO_CLIENT_ROWS:
        assert len(t) == 0
    else:
        out = t[t["client"].isin(gone)]
        assert set(out["client"]) == gone and out[nums].isna().all().all()
        assert all(dropout_reasons[c] in why for c, why in zip(out["client"], out["excluded"]))
        kept = t[~t["client"].isin(gone)]
        assert kept["mean"].notna().all() and kept["excluded"].isna().all()
        ok = kept["sd"].notna()
        assert np.all(kept.loc[ok, "upper"] - kept.loc[ok, "lower"] > 0), "no zero-width interval"
    X = np.asarray(data[fitted[0]].X)[:3]
    if dropped_name in MIXTURES:
        X = X[:, :2]
    for c in gone:
        with pytest.raises(ExcludedClientError, match=dropout_reasons[c]):
            res.client_posterior(c)
        with pytest.raises(ExcludedClientError, match="not in the fit"):
            res.predict(X, client=c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = res.predict(X, client=fitted[0])
    assert np.all(np.isfinite(np.asarray(p if dropped_name in MIXTURES else p["mean"], dtype=float)))


# --------------------------------------------------------------------------- rows by name
def test_predict_reads_a_data_frame_by_column_name(fit, result_name):
    """A data frame is matched to the fit's features by name: reversed columns give the same
    predictions as the fit's order (and as the array), a column the fit never saw or one it
    needs and does not get is refused by name."""
    from fedstats.data import DataError

    res, data = fit
    c = res.clients[0]
    names = list(res.feature_names) if result_name in MIXTURES else list(data.feature_names)
    X = (
        np.random.default_rng(0).normal(size=(4, len(names)))
        if result_name in MIXTURES
        else data[data.clients[0]].X[:4]
    )
    df = pd.DataFrame(X, columns=names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = (
            {"data": (np.asarray(data[c].X), np.asarray(data[c].y))} if EXPECT[result_name].new_client == "data" else {}
        )
        by_position = res.predict(X, client=c)
        by_name = res.predict(df[names[::-1]], client=c)
        if result_name in MIXTURES:
            np.testing.assert_array_equal(by_position, by_name)
        else:
            pd.testing.assert_frame_equal(by_position, by_name)
        with pytest.raises(DataError, match="'height'.*not in the fit"):
            res.predict(df.assign(height=1.0), client=c)
        with pytest.raises(DataError, match=f"'{names[0]}'.*missing"):
            res.predict(df.drop(columns=names[0]), client=c)
        if NEW_CLIENT.get(result_name) not in (None, "refused"):
            new = res.predict(df[names[::-1]], client=None, **kw)
            pd.testing.assert_frame_equal(res.predict(X, client=None, **kw), new)


def test_predict_encodes_a_category_as_the_fit_did():
    """A string column one-hot encoded in the fit is encoded the same way at predict time (any
    column order, a single row, a level the fit saw); a level it did not see is refused by
    name. Checked on models of each kind of result: EP, point estimates, GLM, GP, mixture."""
    from fedstats import HierarchicalLinearModel
    from fedstats.data import DataError, FederatedData
    from fedstats.glm import FederatedGLM
    from fedstats.gp import FGPR
    from fedstats.linear.baselines import FedAvg
    from fedstats.mixture import FederatedGaussianMixture

    rng = np.random.default_rng(3)
    n = 240
    df = pd.DataFrame(
        {
            "site": np.repeat(["a", "b", "c"], n // 3),
            "smoker": rng.choice(["no", "yes", "former"], n),
            "age": rng.normal(50, 10, n),
        }
    )
    df["y"] = 0.05 * df["age"] + 2.0 * (df["smoker"] == "yes") + rng.normal(0, 1, n)
    data = FederatedData.from_dataframe(df, by="site", target="y", categorical="onehot")
    assert data.feature_names == ["smoker[no]", "smoker[yes]", "age"]
    new = pd.DataFrame({"age": [40.0, 60.0], "smoker": ["yes", "former"]})
    X = np.array([[0.0, 1.0, 40.0], [0.0, 0.0, 60.0]])  # the same rows, encoded by hand
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = {
            "hm2": HierarchicalLinearModel(rounds=3).fit(data, seed=0, progress=False),
            "fedavg": FedAvg().fit(data),
            "glm": FederatedGLM("gaussian").fit(data),
            "fgpr": FGPR(rounds=2).fit(data, seed=0, progress=False),
            "fedem": FederatedGaussianMixture(2).fit(data, seed=0),
        }
        for name, res in fits.items():
            a, b = res.predict(new, client="a"), res.predict(X, client="a")
            if name == "fedem":
                np.testing.assert_array_equal(a, b)
            else:
                pd.testing.assert_frame_equal(a, b)
            with pytest.raises(DataError, match="'smoker' has level.*'never'.*did not see"):
                res.predict(new.assign(smoker=["never", "yes"]), client="a")
            with pytest.raises(DataError, match="'age' is numeric in the fit"):
                res.predict(new.assign(age=["forty", "sixty"]), client="a")


#: the fits of the battery that stop before their convergence rule is met (few rounds): each
#: must say so in a warning that names the criterion. (The GLM's is tested on its own,
#: test_federated_glm.py::test_non_convergence_warns_naming_the_predictor; FedEM's, D-FedEM's and
#: FedAvg's in their files.)
UNCONVERGED = {n for n, e in EXPECT.items() if e.unconverged}


def test_a_fit_that_stops_unconverged_says_why(fit, result_name, fit_warnings):
    res, _ = fit
    said = [w for w in fit_warnings[result_name] if "did not converge" in w or "not converge" in w]
    if result_name in UNCONVERGED:
        assert res.converged is False
    if res.converged is False:
        assert said, f"{result_name}: converged=False without a warning"
        keys = ("tol", "R-hat", "criterion", "changed by", "moved by", "from the likelihood's maximum")
        assert any(k in w for w in said for k in keys), said
    elif result_name in ONLINE:
        assert res.converged is None  # an online learner has no stopping rule


def test_every_result_has_a_plot(fit, result_name):
    """``fedstats.plots``: every model's result gives a Figure: its default plot (a mixture's
    components over rows, a regression's forest plot, a GP's predictive band), and the trace
    of its rounds wherever its history has per-round quantities."""
    from matplotlib.figure import Figure

    from fedstats import plots

    res, data = fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if result_name in MIXTURES:
            means = np.asarray(res.means, dtype=float)
            fig = plots.mixture(res, np.vstack([means, means + 0.1]))
            assert len(fig.axes[0].patches) == len(means)  # one ellipse per component
        else:
            fig = plots.plot(res, data)
        assert isinstance(fig, Figure) and fig.axes
        history = getattr(res, "history", None)
        if history is not None and len(history):
            try:
                assert isinstance(plots.convergence(res), Figure)
            except ValueError as e:  # only a run without per-round quantities of its own
                assert "no per-round quantity" in str(e)
