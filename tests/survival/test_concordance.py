"""Harrell's concordance of a Cox fit: the pair counts against a brute-force count and lifelines,
within clients exactly, over all pairs between bounds that hold lifelines' pooled index."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedstats.data.disclosure import DisclosureError
from fedstats.survival import CoxPH
from fedstats.survival.concordance import binned_bounds, pair_counts
from fedstats.survival.simulate import proportional_hazards

lifelines = pytest.importorskip("lifelines")
from lifelines.utils import concordance_index  # noqa: E402


def brute(t, d, r):
    """Every ordered pair: i had its event, j outlived it (a later time, or censored at its time)."""
    later = (t[None, :] > t[:, None]) | ((t[None, :] == t[:, None]) & ~d[None, :])
    comp = d[:, None] & later
    return (
        int(np.sum(comp & (r[:, None] > r[None, :]))),
        int(np.sum(comp & (r[:, None] == r[None, :]))),
        int(comp.sum()),
    )


def test_pair_counts_are_every_pair_counted():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 40))
        t = rng.integers(1, 6, n).astype(float)
        d = rng.random(n) < 0.6
        r = rng.integers(0, 4, n).astype(float)
        assert pair_counts(t, d, r) == brute(t, d, r)
    t, d, r = rng.exponential(size=3000), rng.random(3000) < 0.7, rng.normal(size=3000)
    c, tied, p = pair_counts(t, d, r)
    assert (c + 0.5 * tied) / p == pytest.approx(concordance_index(t, -r, d), abs=1e-15)


@pytest.fixture(scope="module")
def federation():
    fd = proportional_hazards(4, seed=2, rows=(50, 120, 300, 80), beta=(0.6, -0.4), resolution=0.05)
    frame = pd.concat(
        [pd.DataFrame(fd[c].X, columns=fd.feature_names).assign(time=fd[c].y, site=c) for c in fd.clients],
        ignore_index=True,
    )
    return fd, frame


def test_within_clients_is_exact(federation):
    fd, frame = federation
    res = CoxPH(event="event", stratify=True).fit(fd)
    c = res.concordance(fd)  # a stratified fit: within clients by default
    counts = np.sum(
        [brute(g.time.to_numpy(), g.event.to_numpy() == 1, g[["x0", "x1"]].to_numpy() @ res.coef)
         for _, g in frame.groupby("site")],
        axis=0,
    )  # fmt: skip
    assert c.exact and c.within_clients and c.pairs == counts[2]
    assert c.estimate == pytest.approx((counts[0] + 0.5 * counts[1]) / counts[2], abs=1e-15)
    assert res.communication.rounds > 0 and "exact, within clients" in repr(c)


def test_over_all_pairs_bounds_hold_lifelines_pooled_index(federation):
    fd, frame = federation
    res = CoxPH(event="event").fit(fd)
    pooled = concordance_index(frame.time, -(frame[["x0", "x1"]].to_numpy() @ res.coef), frame.event)
    widths = []
    for kw in ({}, {"risk_bins": 60}, {"bins": [0.25, 0.5, 1, 2, 5, 50], "risk_bins": 10}):
        c = res.concordance(fd, **kw)
        assert c.lower <= pooled <= c.upper and c.lower <= c.estimate <= c.upper, (kw, c, pooled)
        assert not c.within_clients
        widths.append(c.upper - c.lower)
    assert widths[1] < widths[0] < 0.06 and widths[2] > widths[0]  # more risk bins narrow them; time bins widen
    assert abs(res.concordance(fd, risk_bins=60).estimate - pooled) < 0.005


def test_bounds_of_a_table_without_unresolved_pairs_are_the_index():
    """One row per (time, risk) cell: every pair is resolved, and the index is exact."""
    rng = np.random.default_rng(1)
    t = np.arange(1.0, 41.0)
    d = rng.random(40) < 0.7
    r = rng.permutation(40).astype(float)
    E = np.zeros((81, 40))
    C = np.zeros((81, 40))
    times = t[d]
    for ti, di, ri in zip(t, d, r, strict=True):
        k = np.searchsorted(times, ti, side="right") - 1
        cell = 0 if k < 0 else 2 * k + 1 if times[k] == ti else 2 * k + 2
        (E if di else C)[cell, int(ri)] += 1
    b = binned_bounds(E[: 2 * len(times) + 1], C[: 2 * len(times) + 1], exact_times=True)
    assert b["lower"] == b["upper"] == pytest.approx(concordance_index(t, -r, d), abs=1e-15)


def test_refusals(federation):
    fd, _ = federation
    res = CoxPH(event="event").fit(fd)
    with pytest.raises(DisclosureError, match="within_clients=True"):
        res.concordance(fd.with_rules(min_cell_count=5))
    strat = CoxPH(event="event", stratify=True).fit(fd)
    with pytest.raises(ValueError, match="give bins"):
        strat.concordance(fd, within_clients=False)
    with pytest.raises(ValueError, match="risk_bins"):
        res.concordance(fd, risk_bins=1)
