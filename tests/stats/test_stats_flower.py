"""fedstats.stats on Flower's simulation engine: the same answers as in process (1e-10), plain and
under secure aggregation, where the server receives no client's count or sum (record check)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr")

from fedstats import FederatedData  # noqa: E402
from fedstats.data.disclosure import NO_RULES  # noqa: E402
from fedstats.federation.flower import FlowerSession  # noqa: E402
from fedstats.federation.flower.secure import SecureAggregation  # noqa: E402
from fedstats.stats import describe, mannwhitneyu, mantel_haenszel, quantiles, ttest  # noqa: E402

from ..federation.test_flower import Recorder  # noqa: E402
from .test_tests import frame  # noqa: E402

TIGHT = 1e-10


@pytest.fixture(scope="module")
def data():
    df = frame(4, sizes=(30, 45, 60, 80))
    return FederatedData.from_dataframe(df, by="site", missing="keep", **NO_RULES)


@pytest.fixture(scope="module")
def session():
    with FlowerSession(
        num_supernodes=4, timeout=300, backend_config={"client_resources": {"num_cpus": 0.5, "num_gpus": 0.0}}
    ) as s:
        s.assign(list(range(4)))
        yield s


CALLS = {
    "ttest": lambda d, **kw: ttest(d, "y", "arm", **kw),
    "mannwhitneyu": lambda d, **kw: mannwhitneyu(d, "y", "grp", groups=("a", "c"), **kw),
    "mantel_haenszel": lambda d, **kw: mantel_haenszel(d, "arm", "event", **kw),
}


def numbers(res):
    return np.array([res.statistic, res.p_value, res.estimate, res.lower, res.upper], dtype=float)


def test_flower_equals_in_process(data, session):
    for name, call in CALLS.items():
        np.testing.assert_allclose(
            numbers(call(data, backend=session)), numbers(call(data)), rtol=TIGHT, atol=TIGHT, err_msg=name
        )
    a, b = describe(data, by="arm", backend=session), describe(data, by="arm")
    pd.testing.assert_frame_equal(a.to_frame(), b.to_frame(), rtol=TIGHT, atol=TIGHT)
    q = quantiles(data, "y2", [0.1, 0.5, 0.9], backend=session)
    np.testing.assert_array_equal(q.values, quantiles(data, "y2", [0.1, 0.5, 0.9]).values)


def test_secure_aggregation_equals_in_process_and_hides_every_client(data, session, monkeypatch):
    rec = Recorder(session, monkeypatch)
    monkeypatch.setattr(session, "secure_aggregation", SecureAggregation())
    for name, call in CALLS.items():
        np.testing.assert_allclose(
            numbers(call(data, backend=session)), numbers(call(data)), rtol=TIGHT, atol=TIGHT, err_msg=name
        )
    a = describe(data, by="arm", backend=session)
    pd.testing.assert_frame_equal(a.to_frame(), describe(data, by="arm").to_frame(), rtol=TIGHT, atol=TIGHT)
    rec.check_no_client_value(SecureAggregation())


def test_per_client_columns_need_the_nodes_release_of_statistics(data, session):
    # the session's nodes keep the default policy: release_statistics = false
    with pytest.raises(RuntimeError, match="rule release_statistics"):
        describe(data, ["y"], clients=True, backend=session)
