"""The Table 2 and Table 3 study functions (the notebook and the slow tests build on them)."""

import os
from pathlib import Path

import numpy as np
import pytest

from fedstats.datasets.student import load_student
from fedstats.experiments.linear_paper import student_study, table2_run

DATA = Path(os.environ.get("FEDSTATS_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
HAVE = (DATA / "student" / "student-por.csv").is_file()


def test_table2_run_case_II_against_least_squares():
    r = table2_run("II", seed=7)
    assert r["converged"] and r["rounds"] <= 6 and r["rhat_max"] < 1.05
    assert (r["n_nonzero_pairs"], r["n_zero_pairs"]) == (30, 50)
    assert r["correct"] == 1.0 and r["false"] <= 0.2
    # Shrinking the five zero coefficients helps most at the two 20-point clients: the lasso
    # beats least squares on each client alone, and is within 20% of the paper's 0.062.
    assert r["a_rmse"] < r["a_rmse_ols"]
    assert 0.8 * 0.062 <= r["a_rmse"] <= 1.2 * 0.062


@pytest.mark.skipif(not HAVE, reason="student data absent (set FEDSTATS_DATA)")
def test_student_study_lasso_one_split():
    # Table 3 on the default split (seed 0), lasso. Measured on this split: federated
    # A-RMSE 1.137, centralised 1.077, least squares per school 1.134, predicting the
    # training mean 1.23; 4 / 3 predictors selected at GP / MS, 6 by the centralised fit.
    # (The paper's 0.825 and 21-23 selections are not reproducible with calibrated 90%
    # intervals: least squares t-intervals select only 7-13 of 38; see the notebook.)
    full = student_study(DATA, seeds=[0], penalties=("lasso",), references=True)
    t = full[full.penalty.isin(["none", "lasso"])].set_index("fit")
    assert list(t.index) == ["ols", "federated", "centralised"]
    fed, cen, ols = t.loc["federated"], t.loc["centralised"], t.loc["ols"]
    # scikit-learn's cross-validated references on the same rows (split 0: LassoCV per school
    # 1.082, pooled 1.070; RidgeCV 1.091, 1.075). The gate (mean over 5 splits, within 5%) is
    # the slow test below; on this one split the federated lasso is 6.2% above the best.
    refs = full[full.penalty.isin(["lassocv", "ridgecv"])]
    assert len(refs) == 4 and refs.a_rmse.between(1.0, 1.15).all()
    assert fed.a_rmse <= 1.08 * refs.a_rmse.min()
    assert abs(fed.a_rmse - cen.a_rmse) <= 0.08
    assert fed.a_rmse <= ols.a_rmse + 0.02 and cen.a_rmse < ols.a_rmse
    # better than predicting each school's training mean (0 after per-school scaling)
    _, test, _ = load_student(DATA, seed=0)
    mean_only = np.mean([np.sqrt(np.mean(test[c].y ** 2)) for c in test.clients])
    assert cen.a_rmse < mean_only - 0.1 and fed.a_rmse < mean_only - 0.05, mean_only
    for school in ("GP", "MS"):
        assert 1 <= fed[f"n_selected_{school}"] <= ols[f"n_selected_{school}"] + 3
        assert cen[f"recall_{school}"] == 1.0
    assert fed.recall_GP >= 0.5
    # the federated fits use fewer selected predictors at the smaller school
    assert fed.n_selected_MS <= fed.n_selected_GP


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason="student data absent (set FEDSTATS_DATA)")
def test_student_gate_over_five_splits():
    # The maintainer's gate (issue 18), about 12 minutes on 2 cores. Measured: lasso federated
    # 1.008 vs centralised 0.981 (+0.027), ridge 1.001 vs 0.980 (+0.021); best reference
    # LassoCV per school 0.972, so +3.7% (lasso) and +3.0% (ridge).
    from fedstats.experiments.linear_paper import student_gate

    gate = student_gate(student_study(DATA, seeds=range(5), references=True))
    assert gate["within 0.03"].all() and gate["within 5%"].all(), gate


def test_table1_run_references_and_recovery_trace():
    from fedstats.experiments.linear_paper import table1_run

    r = table1_run("I", seed=0, trace=True, rounds=40)
    assert len(r["recovery"]) == 40 and r["recovery"][-1] < r["recovery"][0]
    # With 20 rows at noise variance 0.05 the data overwhelm the prior: the oracle (true
    # Omega) is least squares up to a few per cent, and HM1 and Separate are close to both.
    assert abs(r["oracle"] / r["ols"] - 1) < 0.1
    assert abs(r["hm1"] / r["separate"] - 1) < 0.15


@pytest.mark.slow
def test_table1_gate_hm1_within_three_percent_of_separate():
    # The maintainer's gate (issue 18) on 30 runs per case (about 3 minutes): the mean of
    # HM1 / Separate per case at most 1.03 (measured 1.017, 1.000, 1.010, 1.000). The default
    # run keeps one run of Case I (above) and the data-poor gate (test_structural.py).
    import pandas as pd

    from fedstats.experiments.linear_paper import table1_run

    t = pd.DataFrame([table1_run(case, seed) for case in ("I", "II", "III", "IV") for seed in range(30)])
    ratio = (t.hm1 / t.separate).groupby(t.case).mean()
    assert (ratio <= 1.03).all(), ratio


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "cmapss" / "train_FD001.txt").is_file(), reason="C-MAPSS data absent")
def test_cmapss_gate_every_sensor():
    # FD001 gate (issue 18): HM1 <= Separate on sensors 2, 3, 7, 8 and within +-30% of the
    # paper's HM1 (0.270, 0.218, 0.369, 0.267); seed 0, full grids (about 6 minutes).
    from fedstats.experiments.linear_paper import cmapss_run

    for sensor, paper in ((2, 0.270), (3, 0.218), (7, 0.369), (8, 0.267)):
        r = cmapss_run(DATA, sensor=sensor, seed=0, scaling="own")
        assert r["HM1"] <= r["Separate"] and 0.7 * paper <= r["HM1"] <= 1.3 * paper, (sensor, r)


def test_grid_search_picks_the_validation_minimum_and_refits():
    from fedstats.data import FederatedData
    from fedstats.experiments.linear_paper import grid_search, validation_split
    from fedstats.linear.baselines import DistributedRidge

    rng = np.random.default_rng(0)
    Xs = [rng.standard_normal((40, 3)) for _ in range(4)]
    ys = [X @ np.array([1.0, -1.0, 0.5]) + 0.1 * rng.standard_normal(40) for X in Xs]
    data = FederatedData.from_arrays(Xs, ys)
    fit, val = validation_split(data, 0.2, seed=1)
    assert fit.n_obs == {k: 32 for k in range(4)} and val.n_obs == {k: 8 for k in range(4)}
    res, best, table = grid_search(lambda lam: DistributedRidge(lam=lam), {"lam": [1e-4, 10.0]}, data, seed=1)
    assert best == {"lam": 1e-4} and len(table) == 2
    np.testing.assert_allclose(res.theta, DistributedRidge(lam=1e-4).fit(data).theta)


HAVE_CMAPSS = (DATA / "cmapss" / "train_FD001.txt").is_file()


@pytest.mark.skipif(not HAVE_CMAPSS, reason="C-MAPSS data absent (set FEDSTATS_DATA)")
def test_cmapss_sensor_2_one_seed():
    # Table 4, sensor 2, paper's scaling, options chosen on validation from small grids.
    from fedstats.experiments.linear_paper import cmapss_run

    grids = {"lr_factor": (0.3, 0.1), "eig_floor": (0.0, 1e-2), "ditto_lam": (1.0, 10.0), "ridge_lam": (1e-3, 1e-2)}
    r = cmapss_run(DATA, sensor=2, seed=0, scaling="own", grids=grids)
    assert 0.75 * 0.270 <= r["HM1"] <= 1.25 * 0.270  # the paper's HM1, +-25%
    assert r["HM1"] <= r["Separate"] and r["Ditto"] <= r["Separate"]
    assert r["HM1 options"]["eig_floor"] == 1e-2  # without the floor Omega goes singular (K = 100 > d = 7)


def test_long_runs_need_the_eigenvalue_floor():
    # Figure 3's finding: with K = 100 > d = 8 Omega becomes nearly singular and, from round
    # ~83, the prior step destabilises the iteration; the eigenvalue floor keeps the plateau.
    from fedstats.experiments.linear_paper import table1_run

    plain = table1_run("II", 0, trace=True, rounds=100, n_test=10)["recovery"]
    floored = table1_run("II", 0, trace=True, rounds=100, n_test=10, eig_floor=1e-3)["recovery"]
    plateau = min(plain[:80])
    assert max(plain[85:]) > 1.5 * plateau
    assert max(floored[40:]) < 1.1 * min(floored)
