"""The Table 2 and Table 3 study functions (the notebook and the slow tests build on them)."""

import os
from pathlib import Path

import numpy as np
import pytest

from fedstats.datasets.student import load_student
from fedstats.linear.studies import student_study, table2_run

DATA = Path(os.environ.get("FEDSTATS_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
HAVE = (DATA / "student" / "student-por.csv").is_file()


def test_table2_run_case_II_against_least_squares():
    r = table2_run("II", seed=7)
    assert r["converged"] and r["rounds"] <= 6 and r["rhat_max"] < 1.05
    assert (r["n_nonzero_pairs"], r["n_zero_pairs"]) == (30, 50)
    assert r["correct"] == 1.0 and r["false"] <= 0.2
    # Shrinking the five zero coefficients helps most at the two 20-point devices: the lasso
    # beats least squares on each device alone, and is within 20% of the paper's 0.062.
    assert r["a_rmse"] < r["a_rmse_ols"]
    assert 0.8 * 0.062 <= r["a_rmse"] <= 1.2 * 0.062


@pytest.mark.skipif(not HAVE, reason="student data absent (set FEDSTATS_DATA)")
def test_student_study_lasso_one_split():
    # Table 3 on the default split (seed 0), lasso. Measured on this split: federated
    # A-RMSE 1.137, centralised 1.077, least squares per school 1.134, predicting the
    # training mean 1.23; 4 / 3 predictors selected at GP / MS, 6 by the centralised fit.
    # (The paper's 0.825 and 21-23 selections are not reproducible with calibrated 90%
    # intervals: least squares t-intervals select only 7-13 of 38; see the notebook.)
    t = student_study(DATA, seeds=[0], penalties=("lasso",)).set_index("fit")
    assert list(t.index) == ["ols", "federated", "centralised"]
    fed, cen, ols = t.loc["federated"], t.loc["centralised"], t.loc["ols"]
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
