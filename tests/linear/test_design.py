"""The linear models' shared design check (fedstats.linear.design): predictors the data cannot
tell apart are named before any fit (constant, duplicated, a combination of others on the
pooled rows: refused; a combination constant within every client: warned about by the models
with per-client coefficients, refused by the lasso), from sums over the clients only."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats import FederatedData, HierarchicalLinearModel
from fedstats.data import DataError
from fedstats.linear import BayesianLasso
from fedstats.linear.baselines import DistributedRidge, FedAvg, Separate
from fedstats.linear.design import _design_sums, unidentified

SITES = pd.read_csv("examples/sites.csv")


def pooled(df, names):
    """The design sums computed from the pooled rows directly (the oracle)."""
    X = df[names].to_numpy(float)
    within = sum(
        (g[names].to_numpy(float) - g[names].to_numpy(float).mean(0)).T
        @ (g[names].to_numpy(float) - g[names].to_numpy(float).mean(0))
        for _, g in df.groupby("site")
    )
    return len(X), X.sum(0), X.T @ X, within


def test_the_federated_sums_are_the_pooled_ones():
    names = ["x1", "x2", "x3"]
    parts = [_design_sums({}, g[names].to_numpy(float), None) for _, g in SITES.groupby("site")]
    n, sx, xtx, within = pooled(SITES, names)
    assert sum(p["n"][0] for p in parts) == n
    np.testing.assert_allclose(sum(p["sx"] for p in parts), sx, rtol=1e-12)
    np.testing.assert_allclose(sum(p["xtx"] for p in parts), xtx, rtol=1e-12)
    np.testing.assert_allclose(sum(p["within"] for p in parts), within, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"const": lambda d: 1.0}, "'const' is constant on the pooled rows"),
        ({"x1b": lambda d: d.x1}, r"'x1b' duplicates 'x1' \(up to a constant\)"),
        ({"x4": lambda d: d.x1 - 2.5 * d.x3}, r"'x4' = 1 \* x1 \+ -2.5 \* x3 \+ a constant"),
    ],
)
def test_what_cannot_be_estimated_is_named_and_refused(extra, said):
    df = SITES.assign(**extra)
    names = [c for c in df.columns if c not in ("site", "y")]
    refusal, _ = unidentified(names, *pooled(df, names), intercept=True)
    assert refusal is not None and re.search(said, refusal), refusal
    data = FederatedData.from_dataframe(df, by="site", target="y")
    for model in (
        HierarchicalLinearModel(rounds=2),
        BayesianLasso(rounds=2),
        FedAvg(fit_intercept=True),
        DistributedRidge(fit_intercept=True),
    ):
        with pytest.raises(DataError, match=said):
            model.fit(data)


def test_a_constant_column_without_an_intercept_is_the_intercept():
    df = SITES.assign(const=1.0)
    names = ["x1", "x2", "x3", "const"]
    assert unidentified(names, *pooled(df, names), intercept=False) == (None, None)


def test_a_client_level_covariate_is_warned_about_or_refused():
    """A column constant within every client (a site's size) is identified between clients only:
    per-client models warn, naming it; the lasso, which would select on it, refuses; a shared
    model (FedAvg) fits it silently."""
    size = {s: float(k) for k, s in enumerate(SITES.site.unique())}
    df = SITES.assign(size=SITES.site.map(size))
    data = FederatedData.from_dataframe(df, by="site", target="y")
    with pytest.warns(RuntimeWarning, match="'size' is constant within every client"):
        HierarchicalLinearModel(rounds=2).fit(data, seed=0, progress=False)
    with pytest.warns(RuntimeWarning, match="'size' is constant within every client"):
        Separate(fit_intercept=True).fit(data)
    with pytest.raises(DataError, match="'size' is constant within every client.*cannot tell these predictors apart"):
        BayesianLasso(rounds=2).fit(data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FedAvg(fit_intercept=True).fit(data)
    assert not [w for w in caught if "within every client" in str(w.message)]


@pytest.mark.parametrize("model", [HierarchicalLinearModel(standardize=False, rounds=1), FedAvg(rounds=1)])
def test_a_column_whose_sums_overflow_is_named_not_its_client_dropped(model):
    # a sentinel 1e308 at one site: its squares overflow float64. The design round flags the
    # column (summed over the clients) instead of sending inf, which the runtime would refuse
    # as the client's failure and fit without it.
    df = SITES.copy()
    df.loc[df.index[3], "x2"] = 1e308
    data = FederatedData.from_dataframe(df, by="site", target="y", features=["x1", "x2", "x3"])
    with pytest.raises(ValueError, match=r"column\(s\) 'x2' nor fit.*overflow at 1 client"):
        model.fit(data, progress=False)
