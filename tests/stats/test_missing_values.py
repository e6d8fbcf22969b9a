"""FederatedData(missing="keep"): NaN marks a missing value for fedstats.stats; the models refuse
such data, naming the client; infinities are still refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedstats import FederatedData, HierarchicalLinearModel
from fedstats.data import DataError
from fedstats.glm import FederatedGLM
from fedstats.mixture import FederatedGaussianMixture


def frame_with_gaps() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {"site": np.repeat(["a", "b"], 30), "x": rng.normal(size=60), "c": rng.choice(["u", "v", "w"], 60),
         "y": rng.normal(size=60)}
    )  # fmt: skip
    df.loc[3, "x"] = np.nan
    df.loc[40, "c"] = None
    df.loc[50, "y"] = np.nan
    return df


def test_missing_values_are_kept_as_nan_and_refused_by_default():
    df = frame_with_gaps()
    with pytest.raises(DataError, match="non-finite|missing"):
        FederatedData.from_dataframe(df, by="site", target="y")
    data = FederatedData.from_dataframe(df, by="site", target="y", missing="keep")
    assert data.feature_names == ["x", "c[v]", "c[w]"]
    assert np.isnan(data["a"].X[3, 0]) and np.isnan(data["b"].X[10, 1:]).all() and np.isnan(data["b"].y[20])
    assert data.encoding["features"][1]["levels"] == ["u", "v", "w"]  # the missing value is no level
    with pytest.raises(DataError, match="missing must be 'error' or 'keep'"):
        FederatedData.from_dataframe(df, by="site", target="y", missing="drop")
    X = np.ones((5, 2))
    X[0, 0] = np.inf
    with pytest.raises(DataError, match="non-finite"):
        FederatedData.from_arrays([X], missing="keep")


@pytest.mark.parametrize(
    "model", [lambda: FederatedGLM("gaussian"), lambda: HierarchicalLinearModel(), lambda: FederatedGaussianMixture(2)]
)
def test_every_model_refuses_data_with_missing_values_naming_the_client(model):
    df = frame_with_gaps()
    target = None if "Mixture" in type(model()).__name__ else "y"
    data = FederatedData.from_dataframe(df, by="site", target=target, missing="keep", min_rows=1)
    with pytest.raises(DataError, match="needs complete rows, and client 'a' has missing values"):
        model().fit(data)
