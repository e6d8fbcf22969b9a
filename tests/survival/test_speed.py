"""The acceptance's speed bound, at a tenth of its scale by default (the full 50 x 2,000 x 10 is
benchmarks/survival.py's first case, and the slow test here): CoxPH within 2x of lifelines'
CoxPHFitter on the pooled rows, both timed in this process, best of two runs."""

import time
import warnings

import numpy as np
import pandas as pd
import pytest

from fedstats.survival import CoxPH
from fedstats.survival.simulate import proportional_hazards

lifelines = pytest.importorskip("lifelines")


def best(f, repeats=2):
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return min(out)


def ratio(K, n, p):
    fd = proportional_hazards(K, seed=0, rows=n, beta=np.linspace(-0.5, 0.5, p))
    df = pd.concat(
        [pd.DataFrame(np.asarray(fd[c].X), columns=fd.feature_names).assign(time=fd[c].y) for c in fd.clients]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pooled = best(lambda: lifelines.CoxPHFitter().fit(df, "time", "event"))
        federated = best(lambda: CoxPH(event="event").fit(fd, progress=False))
    return federated / pooled


def test_cox_within_twice_lifelines():
    assert ratio(10, 1000, 10) < 2.0


@pytest.mark.slow
def test_cox_within_twice_lifelines_at_the_acceptance_scale():
    assert ratio(50, 2000, 10) < 2.0
