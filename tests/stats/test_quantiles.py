"""Exact federated quantiles (fedstats.stats.quantiles): equal to numpy.quantile of the pooled
rows for each of numpy's definitions it offers, in at most 17 rounds, from summed counts."""

import numpy as np
import pytest

from fedstats import FederatedData
from fedstats.data import DataError
from fedstats.stats import QUANTILE_METHODS, quantiles
from fedstats.stats._columns import data_key
from fedstats.stats._columns import order_key as _key
from fedstats.stats._columns import order_value as _value
from fedstats.stats.quantiles import _QuantileSearch

QS = np.r_[np.linspace(0, 1, 21), [0.001, 0.333, 0.999]]


@pytest.mark.parametrize("method", QUANTILE_METHODS)
@pytest.mark.parametrize("seed", [0, 1])
def test_equal_to_numpy_on_the_pooled_rows(method, seed):
    # clients of 5 to 5,000 rows, ties (values rounded), negative and positive, a wide range
    rng = np.random.default_rng(seed)
    sizes = (5, 37, 5000, 12, 400)
    Xs = [np.column_stack([np.round(rng.normal(size=n), 1), rng.standard_t(2, size=n) * 1e4]) for n in sizes]
    ys = [rng.exponential(size=n) for n in sizes]
    data = FederatedData.from_arrays(Xs, ys, min_rows=1)
    pooled = np.concatenate(Xs)
    for column, values in (("x0", pooled[:, 0]), ("x1", pooled[:, 1]), ("y", np.concatenate(ys))):
        res = quantiles(data, column, QS, method=method)
        np.testing.assert_array_equal(res.values, np.quantile(values, QS, method=method))
        assert res.n == len(values) and res.rounds <= 17


def test_a_real_data_set_split_into_sites():
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    cut = [0, 80, 200, 330, len(y)]
    data = FederatedData.from_arrays([X[a:b] for a, b in zip(cut, cut[1:])], [y[a:b] for a, b in zip(cut, cut[1:])])
    res = quantiles(data, "y", [0.1, 0.25, 0.5, 0.75, 0.9])
    np.testing.assert_array_equal(res.values, np.quantile(y, [0.1, 0.25, 0.5, 0.75, 0.9]))
    assert list(res.to_series().index) == [0.1, 0.25, 0.5, 0.75, 0.9] and res.to_dict()["n"] == len(y)


def test_the_server_receives_only_sums():
    assert _QuantileSearch.summed_keys == _QuantileSearch.reply_keys == ("below",)


def test_the_key_map_keeps_the_order_of_every_float():
    x = np.array([-np.inf, -1e300, -1.0, -5e-324, -0.0, 0.0, 5e-324, 1.0, 1e300, np.inf])
    k = _key(x)
    assert np.all(np.diff(k.astype(object)) > 0)  # strictly increasing (-0.0 just below 0.0)
    np.testing.assert_array_equal(_value(k), x)
    assert data_key(np.array([-0.0]))[0] == data_key(np.array([0.0]))[0]  # in data, equal values: one key


def test_bad_input_is_refused():
    rng = np.random.default_rng(0)
    data = FederatedData.from_arrays([rng.normal(size=(20, 1)) for _ in range(3)])
    with pytest.raises(ValueError, match="method must be one of"):
        quantiles(data, "x0", 0.5, method="weibull")
    with pytest.raises(ValueError, match=r"q must be probabilities in \[0, 1\]"):
        quantiles(data, "x0", [0.5, 1.5])
    with pytest.raises(DataError, match="no column 'age'"):
        quantiles(data, "age", 0.5)
    tiny = FederatedData.from_arrays([rng.normal(size=(3, 1))], min_rows=1).with_rules(min_rows=10)
    with pytest.raises(DataError, match="min_rows"):
        quantiles(tiny, "x0", 0.5)
