"""Tests of fedstats.data: FederatedData, FederatedScaler and the federated moments."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats.data import (
    ClientData,
    ConstantFeatureWarning,
    DataError,
    FederatedData,
    FederatedScaler,
    UnknownClientError,
    aggregate_moments,
    client_moments,
)


# ---------------------------------------------------------------------------- helpers
def make_arrays(ns=(5, 8, 3), d=3, seed=0, loc=0.0, scale=1.0):
    rng = np.random.default_rng(seed)
    Xs = [loc + scale * rng.normal(size=(n, d)) for n in ns]
    ys = [X @ np.arange(1.0, d + 1) + rng.normal(size=X.shape[0]) for X in Xs]
    return Xs, ys


@pytest.fixture
def fd():
    Xs, ys = make_arrays()
    return FederatedData.from_arrays(Xs, ys, clients=["a", "b", "c"], feature_names=["u", "v", "w"])


@pytest.fixture
def frame():
    return pd.DataFrame(
        {
            "site": ["b", "a", "b", "c", "a", "c", "b"],
            "age": [30, 40, 50, 60, 70, 80, 90],
            "smoker": [True, False, True, False, False, True, True],
            "sex": ["f", "m", "f", "f", "m", "f", "x"],
            "y": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        }
    )


# ---------------------------------------------------------------------------- from_arrays
def test_from_arrays_defaults():
    Xs, ys = make_arrays()
    fd = FederatedData.from_arrays(Xs, ys)
    assert fd.clients == [0, 1, 2]
    assert fd.feature_names == ["x0", "x1", "x2"]
    assert fd.target_name == "y"
    assert fd.n_obs == {0: 5, 1: 8, 2: 3}
    for k in range(3):
        np.testing.assert_array_equal(fd[k].X, Xs[k])
        np.testing.assert_array_equal(fd[k].y, ys[k])
        assert fd[k].X.dtype == np.float64 and fd[k].y.dtype == np.float64


def test_from_arrays_dict_and_constructor_equivalent():
    Xs, ys = make_arrays()
    fd1 = FederatedData.from_arrays(dict(zip("pqr", Xs)), dict(zip("pqr", ys)), target_name="t")
    fd2 = FederatedData(Xs, ys, clients=list("pqr"), target_name="t")
    assert fd1.clients == fd2.clients == ["p", "q", "r"]
    assert fd1.target_name == "t"
    for c in fd1:
        np.testing.assert_array_equal(fd1[c].X, fd2[c].X)


def test_from_arrays_1d_X_int_dtype_column_y_and_numpy_ids():
    fd = FederatedData.from_arrays([np.arange(4), [1, 2]], [np.ones((4, 1)), [0, 1]], clients=np.array([10, 20]))
    assert fd.n_features == 1
    assert fd[10].X.shape == (4, 1) and fd[10].X.dtype == np.float64
    assert fd[10].y.shape == (4,)
    assert fd.clients == [10, 20] and all(type(c) is int for c in fd.clients)


def test_from_arrays_copies_and_is_read_only():
    X = np.ones((3, 2))
    y = np.zeros(3)
    fd = FederatedData.from_arrays([X], [y])
    X[0, 0] = 99.0
    assert fd[0].X[0, 0] == 1.0
    with pytest.raises(ValueError):
        fd[0].X[0, 0] = 5.0
    with pytest.raises(ValueError):
        fd[0].y[0] = 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        fd[0].X = np.zeros((3, 2))


def test_single_client_is_valid():
    fd = FederatedData.from_arrays([np.ones((2, 1))], [np.ones(2)])
    assert len(fd) == 1 and fd.n_clients == 1
    assert "K=1 client," in repr(fd)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(Xs=np.ones((3, 2)), ys=[np.ones(3)]), "not a single array"),
        (dict(Xs={"a": np.ones((2, 1))}, ys={"a": np.ones(2)}, clients=["a"]), "not both"),
        (dict(Xs={"a": np.ones((2, 1))}, ys=[np.ones(2)]), "ys must be a dict"),
        (dict(Xs=[np.ones((2, 1))], ys={"a": np.ones(2)}), "Xs must be a dict"),
        (
            dict(Xs={"a": np.ones((2, 1)), "b": np.ones((2, 1))}, ys={"a": np.ones(2), "z": np.ones(2)}),
            r"no y for 'b'; no X for 'z'",
        ),
        (dict(Xs=[np.ones((2, 1))] * 2, ys=[np.ones(2)]), "2 X arrays but 1 y"),
        (dict(Xs=[np.ones((2, 1))] * 2, ys=[np.ones(2)] * 2, clients=["a"]), "1 client ids for 2"),
        (dict(Xs=[np.ones((2, 1))], ys=[np.ones(2)], clients="a"), "not a single string"),
        (dict(Xs=[], ys=[]), "no clients"),
        (dict(Xs=[np.ones((2, 1))] * 3, ys=[np.ones(2)] * 3, clients=["a", "b", "a"]), "duplicate client ids: 'a'"),
        (
            dict(Xs=[np.ones((2, 1)), np.ones((3, 1))], ys=[np.ones(2), np.ones(2)], clients=["a", "b"]),
            "client 'b': X has 3 rows but y has 2",
        ),
        (
            dict(Xs=[np.ones((2, 2)), np.ones((2, 3))], ys=[np.ones(2)] * 2, clients=["a", "b"]),
            "client 'b': X has 3 columns but client 'a' has 2",
        ),
        (dict(Xs=[np.ones((2, 2))], ys=[np.ones(2)], feature_names=["u"]), "1 names but X has 2 columns"),
        (dict(Xs=[np.ones((2, 2))], ys=[np.ones(2)], feature_names=["u", "u"]), "duplicate feature names: 'u'"),
        (dict(Xs=[np.ones((2, 2))], ys=[np.ones(2)], feature_names=["u", 3]), "must be str"),
        (dict(Xs=[np.ones((2, 2))], ys=[np.ones(2)], feature_names="uv"), "not a single str"),
        (dict(Xs=[np.ones((2, 2))], ys=[np.ones(2)], feature_names=["u", "y"]), "target_name 'y' is also a feature"),
        (dict(Xs=[np.ones((2, 1))], ys=[np.ones(2)], target_name=3), "target_name must be a str"),
        (
            dict(Xs=[np.ones((2, 1)), np.ones((0, 1))], ys=[np.ones(2), np.ones(0)], clients=["a", "b"]),
            "client 'b' has no rows",
        ),
        (dict(Xs=[np.ones((2, 1))], ys=[np.ones(2)], min_rows=0), "min_rows must be an integer >= 1"),
        (dict(Xs=[np.array([["a"], ["b"]])], ys=[np.ones(2)], clients=["s"]), "client 's': X is not numeric"),
        (dict(Xs=[np.ones((2, 1))], ys=[np.array(["a", "b"])], clients=["s"]), "client 's': target 'y' is not numeric"),
        (dict(Xs=[np.ones((2, 1, 1))], ys=[np.ones(2)], clients=["s"]), "client 's': X must be 2-D"),
        (dict(Xs=[np.ones((2, 1))], ys=[np.ones((2, 2))], clients=["s"]), "client 's': y must be 1-D"),
        # no columns: an error without a target (with one, an intercept-only model)
        (dict(Xs=[np.ones((2, 0))], clients=["s"]), "client 's': X has no columns"),
        (dict(Xs=[np.ones((2, 1))], ys=[np.ones(2)], clients=[["unhashable"]]), "hashable"),
    ],
)
def test_from_arrays_errors(kwargs, match):
    with pytest.raises(DataError, match=match):
        FederatedData.from_arrays(**kwargs)


def test_nan_in_X_names_client_feature_and_rows():
    X = np.ones((5, 3))
    X[[0, 2], 1] = np.nan
    X[4, 2] = np.inf
    X[2, 2] = -np.inf
    with pytest.raises(DataError) as ei:
        FederatedData.from_arrays(
            [np.ones((2, 3)), X], [np.ones(2), np.ones(5)], clients=["ok", "bad"], feature_names=["u", "v", "w"]
        )
    msg = str(ei.value)
    assert "client 'bad'" in msg
    assert "feature 'v' in 2 row(s)" in msg and "feature 'w' in 2 row(s)" in msg
    assert "3 row(s) affected" in msg and "'u'" not in msg
    assert isinstance(ei.value, ValueError)


def test_every_client_with_a_nan_is_named():
    Xs = [np.ones((3, 2)) for _ in range(4)]
    ys = [np.ones(3) for _ in range(4)]
    Xs[1][0, 0], ys[2][1], Xs[3][2, 1] = np.nan, np.inf, np.nan
    with pytest.raises(DataError) as ei:
        FederatedData.from_arrays(Xs, ys, feature_names=["u", "v"])
    msg = str(ei.value)
    assert "client 1: non-finite values (NaN or inf) in X: feature 'u' in 1 row(s)" in msg
    assert "client 2: non-finite values (NaN or inf) in target 'y' in 1 row(s)" in msg
    assert "client 3: non-finite values (NaN or inf) in X: feature 'v' in 1 row(s)" in msg
    assert "client 0" not in msg


def test_nonfinite_y_names_client_target_and_rows():
    y = np.array([1.0, np.nan, np.inf, 2.0])
    with pytest.raises(DataError, match=r"client 7: .*target 'resp' in 2 row\(s\)"):
        FederatedData.from_arrays([np.ones((4, 1))], [y], clients=[7], target_name="resp")


def test_object_array_with_none_is_nan_error():
    X = np.array([[1.0], [None]], dtype=object)
    with pytest.raises(DataError, match="client 0: .*feature 'x0' in 1 row"):
        FederatedData.from_arrays([X], [np.ones(2)])


# ---------------------------------------------------------------------------- from_dataframe
def test_from_dataframe_default_features_order_and_bool(frame):
    fd = FederatedData.from_dataframe(frame.drop(columns="sex"), by="site", target="y")
    assert fd.clients == ["b", "a", "c"]  # order of first appearance
    assert fd.feature_names == ["age", "smoker"]
    assert fd.target_name == "y"
    assert fd.n_obs == {"b": 3, "a": 2, "c": 2}
    np.testing.assert_array_equal(fd["b"].X, [[30, 1], [50, 1], [90, 1]])
    np.testing.assert_array_equal(fd["a"].y, [2.0, 5.0])


def test_from_dataframe_explicit_features_and_int_clients(frame):
    df = frame.assign(site=frame["site"].map({"a": 1, "b": 2, "c": 3}))
    fd = FederatedData.from_dataframe(df, by="site", target="y", features=["smoker", "age"])
    assert fd.clients == [2, 1, 3] and all(type(c) is int for c in fd.clients)
    assert fd.feature_names == ["smoker", "age"]


def test_from_dataframe_categorical_error_names_column(frame):
    with pytest.raises(DataError) as ei:
        FederatedData.from_dataframe(frame, by="site", target="y", categorical="error")
    msg = str(ei.value)
    assert "'sex'" in msg and "categorical='onehot'" in msg and "client 'b'" in msg


def test_from_dataframe_encodes_categories_by_default_as_the_command_line(frame):
    fd = FederatedData.from_dataframe(frame, by="site", target="y")
    assert fd.feature_names == ["age", "smoker", "sex[m]", "sex[x]"]
    assert fd.encoding["features"][2] == {"column": "sex", "levels": ["f", "m", "x"], "used": ["m", "x"]}
    assert fd.encoding["ignore"] == ["site", "y"] and fd.subset(["a"]).encoding == fd.encoding


def test_from_dataframe_onehot_consistent_columns(frame):
    # client 'a' has only 'm', client 'c' only 'f': columns must still agree
    fd = FederatedData.from_dataframe(frame, by="site", target="y", categorical="onehot")
    assert fd.feature_names == ["age", "smoker", "sex[m]", "sex[x]"]
    np.testing.assert_array_equal(fd["a"].X[:, 2:], [[1, 0], [1, 0]])
    np.testing.assert_array_equal(fd["c"].X[:, 2:], [[0, 0], [0, 0]])
    np.testing.assert_array_equal(fd["b"].X[:, 2:], [[0, 0], [0, 0], [0, 1]])
    full = FederatedData.from_dataframe(frame, by="site", target="y", categorical="onehot", drop_first=False)
    assert full.feature_names[2:] == ["sex[f]", "sex[m]", "sex[x]"]
    for c in full:
        np.testing.assert_array_equal(full[c].X[:, 2:].sum(axis=1), 1.0)


def test_from_dataframe_pandas_categorical_order_and_numeric_levels():
    df = pd.DataFrame(
        {
            "g": [0, 0, 1, 1],
            "lvl": pd.Categorical(["hi", "lo", "lo", "mid"], categories=["lo", "mid", "hi", "unused"]),
            "k": pd.Categorical([3, 1, 1, 2]),
            "y": [0.0, 1.0, 2.0, 3.0],
        }
    )
    with pytest.raises(DataError, match="'lvl'.*onehot"):
        FederatedData.from_dataframe(df, by="g", target="y", categorical="error")
    fd = FederatedData.from_dataframe(df, by="g", target="y", categorical="onehot")
    # category order kept, the unused category gives no all-zero column
    assert fd.feature_names == ["lvl[mid]", "lvl[hi]", "k[2]", "k[3]"]
    np.testing.assert_array_equal(fd[0].X, [[0, 1, 0, 1], [0, 0, 0, 0]])


def test_from_dataframe_string_dtype_and_single_level_warning():
    df = pd.DataFrame({"g": ["a", "b"], "s": pd.Series(["u", "u"], dtype="string"), "x": [1.0, 2.0], "y": [0.0, 1.0]})
    with pytest.warns(UserWarning, match="'s' has a single level"):
        fd = FederatedData.from_dataframe(df, by="g", target="y", categorical="onehot")
    assert fd.feature_names == ["x"]


def test_from_dataframe_bool_target_and_nullable_ints():
    df = pd.DataFrame({"g": ["a", "a", "b"], "x": pd.array([1, 2, 3], dtype="Int64"), "y": [True, False, True]})
    fd = FederatedData.from_dataframe(df, by="g", target="y")
    np.testing.assert_array_equal(fd["a"].y, [1.0, 0.0])
    df.loc[2, "x"] = pd.NA
    with pytest.raises(DataError, match=r"client 'b': .*feature 'x' in 1 row"):
        FederatedData.from_dataframe(df, by="g", target="y")


@pytest.mark.parametrize(
    "mutate, kwargs, match",
    [
        (None, dict(by="nope", target="y"), "by='nope'"),
        (None, dict(by="site", target="nope"), "target='nope'"),
        (None, dict(by="site", target="site"), "same column"),
        (None, dict(by="site", target="y", features=["age", "zz", "ww"]), "'zz', 'ww'"),
        (None, dict(by="site", target="y", features=["age", "site"]), "by/target"),
        (None, dict(by="site", target="y", features="age"), "not a single str"),
        (None, dict(by="site", features=[]), "no feature columns"),  # with a target: intercept only
        (None, dict(by="site", target="y", categorical="dummies"), "'error' or 'onehot'"),
        (
            lambda df: df.assign(y=list("abcdefg")),
            dict(by="site", target="y", features=["age"]),
            "target column 'y' is not numeric",
        ),
        (
            lambda df: df.assign(site=[None, "a", "b", "c", "a", "c", "b"]),
            dict(by="site", target="y", features=["age"]),
            "by='site' has 1 missing client id",
        ),
        (
            lambda df: df.assign(age=[1.0, np.nan, 3, 4, np.nan, 6, 7]),
            dict(by="site", target="y", features=["age"]),
            r"client 'a': .*feature 'age' in 2 row",
        ),
        (
            lambda df: df.assign(y=[1.0, 2, 3, np.inf, 5, 6, 7]),
            dict(by="site", target="y", features=["age"]),
            r"client 'c': .*target 'y' in 1 row",
        ),
        (
            lambda df: df.assign(sex=["f", None, "f", "f", "m", "f", "x"]),
            dict(by="site", target="y", features=["sex"], categorical="onehot"),
            r"'sex' has 1 missing value.*client 'a'",
        ),
        (
            lambda df: df.assign(t=pd.date_range("2020-01-01", periods=7)),
            dict(by="site", target="y", features=["t"], categorical="onehot"),
            "'t' has dtype datetime",
        ),
        (lambda df: df.iloc[:0], dict(by="site", target="y", features=["age"]), "no rows"),
        (
            lambda df: pd.concat([df, df[["age"]]], axis=1),
            dict(by="site", target="y", features=["age"]),
            "duplicate column label",
        ),
    ],
)
def test_from_dataframe_errors(frame, mutate, kwargs, match):
    df = mutate(frame) if mutate else frame
    with pytest.raises(DataError, match=match):
        FederatedData.from_dataframe(df, **kwargs)


def test_from_dataframe_not_a_frame():
    with pytest.raises(DataError, match="pandas DataFrame"):
        FederatedData.from_dataframe({"a": [1]}, by="a", target="a")


# ---------------------------------------------------------------------------- accessors
def test_accessors(fd):
    assert fd.clients == ["a", "b", "c"] and len(fd) == 3 and fd.n_clients == 3
    assert list(fd) == ["a", "b", "c"]
    assert fd.n_features == 3 and fd.feature_names == ["u", "v", "w"]
    assert fd.n_obs == {"a": 5, "b": 8, "c": 3} and fd.n_total == 16
    assert "a" in fd and "z" not in fd and ["unhashable"] not in fd
    fd.clients.append("z")
    fd.feature_names.append("z")
    assert fd.clients == ["a", "b", "c"] and fd.feature_names == ["u", "v", "w"]
    cd = fd["b"]
    assert isinstance(cd, ClientData) and cd.client == "b" and cd.n == 8
    items = fd.items()
    assert [c for c, _ in items] == fd.clients
    assert all(isinstance(v, ClientData) and v.client == c for c, v in items)
    assert repr(fd) == "FederatedData(K=3 clients, d=3 features, n=16, rows per client 3..8, target='y')"


def test_getitem_unknown_names_id_and_known_ones():
    fd = FederatedData.from_arrays([np.ones((1, 1))] * 8, [np.ones(1)] * 8)
    with pytest.raises(KeyError) as ei:
        fd[42]
    msg = str(ei.value)
    assert "client 42" in msg and "known clients (8): 0, 1, 2, 3, 4, ..." in msg
    assert isinstance(ei.value, UnknownClientError) and isinstance(ei.value, ValueError)


# ---------------------------------------------------------------------------- subset
def test_subset(fd):
    sub = fd.subset(["c", "a"])
    assert sub.clients == ["c", "a"]
    assert sub.feature_names == fd.feature_names and sub.target_name == fd.target_name
    np.testing.assert_array_equal(sub["a"].X, fd["a"].X)
    assert fd.clients == ["a", "b", "c"]  # original unchanged


@pytest.mark.parametrize(
    "clients, exc, match",
    [
        (["a", "zz"], UnknownClientError, "'zz'.*known clients"),
        (["a", "a"], DataError, "duplicate client ids: 'a'"),
        ([], DataError, "at least one client"),
        ("a", DataError, "sequence of client ids"),
        (3, DataError, "sequence of client ids"),
    ],
)
def test_subset_errors(fd, clients, exc, match):
    with pytest.raises(exc, match=match):
        fd.subset(clients)


# ---------------------------------------------------------------------------- train_test_split
def _rows(fdata_, c):
    return {tuple(r) for r in np.column_stack([fdata_[c].X, fdata_[c].y])}


def test_train_test_split_per_client_proportions_and_partition():
    Xs, ys = make_arrays(ns=(10, 20, 7, 2, 3))
    fd = FederatedData.from_arrays(Xs, ys)
    train, test = fd.train_test_split(0.3, seed=1)
    assert train.clients == test.clients == fd.clients
    expected_test = {0: 3, 1: 6, 2: 2, 3: 1, 4: 1}
    assert test.n_obs == expected_test
    for c in fd:
        assert train.n_obs[c] + test.n_obs[c] == fd.n_obs[c]
        assert train.n_obs[c] >= 1 and test.n_obs[c] >= 1
        assert _rows(train, c) | _rows(test, c) == _rows(fd, c)
        assert not (_rows(train, c) & _rows(test, c))
        # rows keep their original order within each part
        pos = {tuple(r): i for i, r in enumerate(fd[c].X)}
        for part in (train, test):
            idx = [pos[tuple(r)] for r in part[c].X]
            assert idx == sorted(idx)


def test_train_test_split_deterministic_by_seed(fd):
    a_tr, a_te = fd.train_test_split(seed=5)
    b_tr, b_te = fd.train_test_split(seed=5)
    c_tr, _ = fd.train_test_split(seed=6)
    g_tr, _ = fd.train_test_split(seed=np.random.default_rng(5))
    for c in fd:
        np.testing.assert_array_equal(a_tr[c].X, b_tr[c].X)
        np.testing.assert_array_equal(a_te[c].y, b_te[c].y)
        np.testing.assert_array_equal(a_tr[c].X, g_tr[c].X)
    assert any(not np.array_equal(a_tr[c].X, c_tr[c].X) for c in fd)


def test_train_test_split_chronological():
    fd = FederatedData.from_arrays([np.arange(10.0), np.arange(5.0)], [np.arange(10.0), np.arange(5.0)])
    train, test = fd.train_test_split(0.4, seed=None, shuffle=False)
    np.testing.assert_array_equal(train[0].y, np.arange(6.0))
    np.testing.assert_array_equal(test[0].y, [6.0, 7.0, 8.0, 9.0])
    np.testing.assert_array_equal(train[1].y, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(test[1].X.ravel(), [3.0, 4.0])


@pytest.mark.parametrize("test_size", [0, 1, 1.5, -0.1, True, "0.3"])
def test_train_test_split_bad_test_size(fd, test_size):
    with pytest.raises(DataError, match="test_size"):
        fd.train_test_split(test_size, seed=0)


def test_train_test_split_errors():
    fd = FederatedData.from_arrays(
        [np.ones((3, 1)), np.ones((1, 1))], [np.ones(3), np.ones(1)], clients=["big", "tiny"]
    )
    with pytest.raises(DataError, match="client 'tiny': fewer than 2 rows"):
        fd.train_test_split(seed=0)
    with pytest.raises(DataError, match="needs a seed"):
        fd.subset(["big"]).train_test_split(seed=None)
    with pytest.raises(TypeError):
        fd.train_test_split(0.5)  # seed is keyword-only and required


# ---------------------------------------------------------------------------- scaler
def test_scaler_oracle_against_pooled_numpy():
    # a large offset makes a naive sum-of-squares formula lose digits
    Xs, ys = make_arrays(ns=(50, 7, 123, 1), d=4, seed=3, loc=1e4, scale=3.0)
    fd = FederatedData.from_arrays(Xs, ys)
    sc = fd.fit_scaler(target=True)
    X_all, y_all = np.vstack(Xs), np.concatenate(ys)  # the test may pool; the code may not
    np.testing.assert_allclose(sc.mean, X_all.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sc.sd, X_all.std(axis=0, ddof=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sc.y_mean, y_all.mean(), rtol=1e-12)
    np.testing.assert_allclose(sc.y_sd, y_all.std(ddof=1), rtol=1e-12)
    assert sc.n == X_all.shape[0]
    scaled = sc.transform(fd)
    Z = np.vstack([scaled[c].X for c in scaled])
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z.std(axis=0, ddof=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(sc.inverse_transform_y(scaled[2].y), fd[2].y, rtol=1e-12)


def test_fit_scaler_server_sees_only_sums_over_clients(fd, monkeypatch):
    """Two rounds, each client's functions run on its own rows only; what the server combines
    is the sum over the clients of each round's replies, never one client's record."""
    from fedstats.data import scaling

    calls = {"client_sums": [], "client_moments": []}
    summed, seen_by_server = [], []

    def spy(name):
        real = getattr(scaling, name)

        def inner(X, y=None, **kw):
            calls[name].append((X, y, kw))
            return real(X, y, **kw)

        return inner

    real_add, real_agg = scaling.add_moments, scaling.aggregate_moments

    def add_spy(records):
        out = real_add(records)
        summed.append((list(records), out))
        return out

    def agg_spy(moments):
        seen_by_server.append(list(moments))
        return real_agg(moments)

    def forbidden(*args, **kwargs):
        raise AssertionError("rows of different clients must not be pooled")

    for name in calls:
        monkeypatch.setattr(scaling, name, spy(name))
    monkeypatch.setattr(scaling, "add_moments", add_spy)
    monkeypatch.setattr(scaling, "aggregate_moments", agg_spy)
    for name in ("concatenate", "vstack", "hstack", "stack", "row_stack", "column_stack", "append"):
        if hasattr(np, name):
            monkeypatch.setattr(np, name, forbidden)
    sc = fd.fit_scaler(target=True)
    monkeypatch.undo()

    # one call per client and round, each with exactly that client's own arrays
    X_all, y_all = np.vstack([fd[c].X for c in fd]), np.concatenate([fd[c].y for c in fd])
    for name in calls:
        assert len(calls[name]) == fd.n_clients
        for (X, y, _), c in zip(calls[name], fd.clients):
            assert X is fd._X[c] and y is fd._y[c]
    # the second round is centred at the federation's means, which the first round's sums give
    for _, _, kw in calls["client_moments"]:
        np.testing.assert_allclose(kw["about"][0], X_all.mean(axis=0), rtol=1e-14)
        assert kw["about"][1] == pytest.approx(y_all.mean(), rel=1e-14)
    # the per-client records only ever go into their sum; the server combines one record
    assert [len(records) for records, _ in summed] == [fd.n_clients, fd.n_clients]
    (moments,) = seen_by_server
    assert len(moments) == 1 and moments[0] is summed[1][1]
    assert set(moments[0]) == {"n", "sum_x", "m2_x", "sum_y", "m2_y"} and moments[0]["n"] == X_all.shape[0]
    np.testing.assert_allclose(moments[0]["m2_x"], ((X_all - X_all.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(sc.sd, X_all.std(axis=0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(sc.y_sd, y_all.std(ddof=1), rtol=1e-12)


def test_aggregate_moments_from_sums_only():
    # three clients summarised by hand: {1, 3}, {5}, {0, 2, 4}; pooled mean 15/6 = 2.5
    moments = [
        {"n": 2, "sum_x": np.array([4.0]), "m2_x": np.array([2.0]), "sum_y": 1.0, "m2_y": 0.5},
        {"n": 1, "sum_x": np.array([5.0]), "m2_x": np.array([0.0]), "sum_y": 2.0, "m2_y": 0.0},
        {"n": 3, "sum_x": np.array([6.0]), "m2_x": np.array([8.0]), "sum_y": 3.0, "m2_y": 0.0},
    ]
    agg = aggregate_moments(moments)
    pooled = np.array([1.0, 3, 5, 0, 2, 4])
    assert agg["n"] == 6
    np.testing.assert_allclose(agg["mean_x"], pooled.mean())
    np.testing.assert_allclose(agg["sd_x"], pooled.std(ddof=1))
    assert agg["mean_y"] == pytest.approx(1.0)
    assert "mean_y" not in aggregate_moments([{k: m[k] for k in ("n", "sum_x", "m2_x")} for m in moments])
    with pytest.raises(DataError):
        aggregate_moments([])


def test_client_moments_matches_raw_sums():
    X = np.array([[1.0, 10.0], [2.0, 20.0], [6.0, 30.0]])
    y = np.array([1.0, 1.0, 4.0])
    m = client_moments(X, y)
    assert m["n"] == 3
    np.testing.assert_allclose(m["sum_x"], X.sum(axis=0))
    # m2 is the sum of squares re-centred at the client's mean
    np.testing.assert_allclose(m["m2_x"], (X**2).sum(axis=0) - X.sum(axis=0) ** 2 / 3)
    assert m["sum_y"] == 6.0 and m["m2_y"] == pytest.approx(6.0)
    assert "sum_y" not in client_moments(X)


def test_moments_about_a_common_centre_add_up_to_the_pooled_moments():
    from fedstats.data.scaling import add_moments, client_sums
    from fedstats.federation import federated_moments

    Xs, ys = make_arrays(ns=(50, 7, 123, 1), d=4, seed=3, loc=1e4, scale=3.0)
    X_all, y_all = np.vstack(Xs), np.concatenate(ys)
    about = (X_all.mean(axis=0), float(y_all.mean()))
    total = add_moments([client_moments(X, y, about=about) for X, y in zip(Xs, ys)])
    pooled = client_moments(X_all, y_all)
    assert total["n"] == pooled["n"] == 181
    for k in ("sum_x", "m2_x", "sum_y", "m2_y"):
        np.testing.assert_allclose(total[k], pooled[k], rtol=1e-12)
    agg = federated_moments(list(zip(Xs, ys)))
    np.testing.assert_allclose(agg["sd_x"], X_all.std(axis=0, ddof=1), rtol=1e-12)
    assert agg["mean_y"] == pytest.approx(y_all.mean(), rel=1e-14)
    assert "sum_y" not in add_moments([client_sums(X) for X in Xs])
    with pytest.raises(DataError, match="different keys"):
        add_moments([client_sums(Xs[0]), client_sums(Xs[1], ys[1])])
    with pytest.raises(DataError):
        add_moments([])


def test_scaler_center_scale_flags(fd):
    sc = fd.fit_scaler(center=False)
    np.testing.assert_array_equal(sc.mean, 0.0)
    assert np.all(sc.sd != 1.0)
    sc = fd.fit_scaler(scale=False, target=True)
    np.testing.assert_array_equal(sc.sd, 1.0)
    assert sc.y_sd == 1.0 and sc.y_mean != 0.0
    sc = fd.fit_scaler(center=False, scale=False, target=True)
    assert sc.y_mean == 0.0 and sc.y_sd == 1.0
    out = sc.transform(fd)
    np.testing.assert_array_equal(out["a"].X, fd["a"].X)
    assert not sc.has_target or sc.y_sd == 1.0


def test_constant_feature_warns_and_gets_sd_one():
    Xs = [np.column_stack([np.full(3, 0.1), [1.0, 2, 3]]), np.column_stack([np.full(2, 0.1), [4.0, 5]])]
    fd = FederatedData.from_arrays(
        Xs, [np.full(3, 7.0), np.full(2, 7.0)], clients=["a", "b"], feature_names=["const", "t"]
    )
    with pytest.warns(ConstantFeatureWarning) as rec:
        scaled, sc = fd.standardize(target=True)
    msgs = [str(w.message) for w in rec]
    assert any("feature 'const'" in m for m in msgs) and any("target 'y'" in m for m in msgs)
    assert not any("'t'" in m for m in msgs)
    assert sc.sd[0] == 1.0 and sc.y_sd == 1.0
    for c in scaled:
        assert np.all(np.isfinite(scaled[c].X)) and np.all(np.isfinite(scaled[c].y))
        np.testing.assert_allclose(scaled[c].X[:, 0], 0.0, atol=1e-15)


def test_all_zero_feature_with_scale_false_does_not_warn():
    fd = FederatedData.from_arrays([np.zeros((3, 1))], [np.arange(3.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sc = fd.fit_scaler(scale=False)
    assert sc.sd[0] == 1.0


def test_standardize_equals_fit_then_transform(fd):
    scaled, sc = fd.standardize(target=True)
    again = fd.fit_scaler(target=True).transform(fd)
    for c in fd:
        np.testing.assert_array_equal(scaled[c].X, again[c].X)
        np.testing.assert_array_equal(scaled[c].y, again[c].y)
    np.testing.assert_allclose(scaled["a"].X, (fd["a"].X - sc.mean) / sc.sd)
    np.testing.assert_allclose(sc.transform_y(fd["b"].y), scaled["b"].y)
    assert scaled.feature_names == fd.feature_names and scaled.clients == fd.clients


def test_scaler_without_target_keeps_y_and_refuses_y_methods(fd):
    scaled, sc = fd.standardize()
    assert sc.y_mean is None and sc.y_sd is None and not sc.has_target
    np.testing.assert_array_equal(scaled["a"].y, fd["a"].y)
    with pytest.raises(DataError, match="target=True"):
        sc.inverse_transform_y(np.ones(2))
    with pytest.raises(DataError, match="target=True"):
        sc.transform_y(np.ones(2))


def test_scaler_dict_roundtrip_and_validation(fd):
    sc = fd.fit_scaler(target=True)
    d = json.loads(json.dumps(sc.to_dict()))
    back = FederatedScaler.from_dict(d)
    np.testing.assert_array_equal(back.mean, sc.mean)
    np.testing.assert_array_equal(back.sd, sc.sd)
    assert back.feature_names == sc.feature_names == ("u", "v", "w")
    assert (back.y_mean, back.y_sd, back.n) == (sc.y_mean, sc.y_sd, sc.n)
    no_y = FederatedScaler.from_dict(fd.fit_scaler().to_dict())
    assert no_y.y_sd is None
    with pytest.raises(DataError, match="lacks key"):
        FederatedScaler.from_dict({"mean": [0.0]})
    with pytest.raises(DataError, match="sd finite and > 0"):
        FederatedScaler.from_dict({**d, "sd": [1.0, 0.0, 1.0]})
    with pytest.raises(DataError, match="same length"):
        FederatedScaler.from_dict({**d, "mean": [0.0]})
    with pytest.raises(DataError, match="both y_mean and y_sd"):
        FederatedScaler.from_dict({**d, "y_sd": None})
    with pytest.raises(DataError, match="y_sd finite"):
        FederatedScaler.from_dict({**d, "y_sd": -1.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.mean = np.zeros(3)
    with pytest.raises(ValueError):
        sc.mean[0] = 1.0


def test_scaler_transform_checks_features(fd):
    sc = fd.fit_scaler()
    other = FederatedData.from_arrays([np.ones((2, 3))], [np.ones(2)])
    with pytest.raises(DataError, match="fitted on features"):
        sc.transform(other)
    with pytest.raises(DataError, match=r"shape \(n, 3\)"):
        sc.transform_X(np.ones((2, 2)))


def test_fit_scaler_needs_two_rows():
    fd = FederatedData.from_arrays([np.ones((1, 1))], [np.ones(1)])
    with pytest.raises(DataError, match="at least 2 rows"):
        fd.fit_scaler()


# ---------------------------------------------------------------------------- statistics / export
def test_sufficient_statistics(fd):
    stats = fd.sufficient_statistics()
    assert list(stats) == fd.clients
    for c, s in stats.items():
        X, y = fd[c].X, fd[c].y
        np.testing.assert_allclose(s["A"], X.T @ X)
        np.testing.assert_allclose(s["b"], X.T @ y)
        assert s["c"] == pytest.approx(float(y @ y)) and isinstance(s["c"], float)
        assert s["n"] == fd.n_obs[c] and isinstance(s["n"], int)
    X_all = np.vstack([fd[c].X for c in fd])
    np.testing.assert_allclose(sum(s["A"] for s in stats.values()), X_all.T @ X_all)


def test_to_dataframe_roundtrip(fd):
    df = fd.to_dataframe()
    assert list(df.columns) == ["client", "u", "v", "w", "y"]
    assert len(df) == fd.n_total
    assert list(df["client"].unique()) == fd.clients
    back = FederatedData.from_dataframe(df, by="client", target="y")
    assert back.clients == fd.clients and back.feature_names == fd.feature_names
    for c in fd:
        np.testing.assert_array_equal(back[c].X, fd[c].X)
        np.testing.assert_array_equal(back[c].y, fd[c].y)
    df2 = FederatedData.from_arrays([np.ones((2, 1))] * 2, [np.ones(2)] * 2).to_dataframe(client_col="site")
    assert list(df2["site"]) == [0, 0, 1, 1]


def test_to_dataframe_name_clash():
    fd = FederatedData.from_arrays([np.ones((2, 1))], [np.ones(2)], feature_names=["client"])
    with pytest.raises(DataError, match="clashes"):
        fd.to_dataframe()
    assert "grp" in fd.to_dataframe(client_col="grp").columns
