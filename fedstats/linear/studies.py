"""The variable-selection studies of the linear-models paper (spec §4.2, §5.1), as functions
that return tidy tables: used by the notebook and the tests.

* :func:`table2_run`: one seeded run of a Table 2 simulation case.
* :func:`student_study`: federated lasso and ridge against their centralised versions on
  the student-performance data (Table 3).
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from .shrinkage import BayesianShrinkage


def _rmse(pred, y) -> float:
    return float(np.sqrt(np.mean((np.asarray(pred) - np.asarray(y)) ** 2)))


def selected_sets(res, level: float) -> dict:
    """client -> set of selected predictor names (intervals at ``level`` excluding 0)."""
    sel = res.selected(level)
    return {c: set(g.loc[g["selected"], "name"]) for c, g in sel.groupby("client", sort=False)}


def _ols(X, y, level: float):
    """Least squares with an intercept: coefficients and which slopes' level-``level``
    t-intervals exclude 0."""
    from scipy import stats

    Xd = np.column_stack([np.ones(len(X)), X])
    beta, _, rank, _ = np.linalg.lstsq(Xd, y, rcond=None)
    dof = len(y) - rank
    s2 = np.sum((y - Xd @ beta) ** 2) / dof
    se = np.sqrt(np.diag(np.linalg.pinv(Xd.T @ Xd)) * s2)
    return beta, np.abs(beta / se)[1:] > stats.t.ppf(0.5 + level / 2, dof)


def _ols_rmse(train, test, c) -> float:
    """Test RMSE of least squares (with intercept) fitted on client ``c`` alone."""
    beta, _ = _ols(train[c].X, train[c].y, 0.9)
    return _rmse(np.column_stack([np.ones(test[c].n), test[c].X]) @ beta, test[c].y)


def table2_run(case: str, seed: int, *, penalty: str = "lasso", level: float = 0.9, sigma: float = 0.05,
               model_options=None) -> dict:
    """One run of Table 2 (spec §4.2): fit on ``selection_case(case, seed=seed)``, then the
    correct inclusion rate (share of (device, nonzero coefficient) pairs selected), the
    false inclusion rate (share of (device, zero coefficient) pairs selected) and A-RMSE
    (mean over devices of the test RMSE of the posterior-mean prediction, spec §2.5).

    Two references in the same run: ``a_rmse_selected`` predicts with the excluded
    coefficients set to 0 (the student-data rule, spec §9 item 17) and ``a_rmse_ols`` is
    least squares on each device alone. ``model_options`` default to ``{"damping": 1.0}``
    (the paper's undamped EP, which converges in 3-7 rounds on these cases).
    """
    from ..datasets.synthetic import selection_case

    train, test, theta = selection_case(case, sigma=sigma, seed=seed)
    options = {"damping": 1.0, **(model_options or {})}
    t0 = time.perf_counter()
    res = BayesianShrinkage(penalty, **options).fit(train, seed=seed, progress=False)
    seconds = time.perf_counter() - t0
    sel = res.selected(level)
    nonzero = np.tile(theta != 0, train.n_clients)
    clients = train.clients

    def armse(predict):
        return float(np.mean([_rmse(predict(c), test[c].y) for c in clients]))

    diag = res.sampler_diagnostics()
    return {"case": case, "seed": seed, "penalty": penalty, "correct": float(sel["selected"][nonzero].mean()),
            "false": float(sel["selected"][~nonzero].mean()),
            "n_nonzero_pairs": int(nonzero.sum()), "n_zero_pairs": int((~nonzero).sum()),
            "a_rmse": armse(lambda c: res.predict(test[c].X, client=c, n=100)["mean"]),
            "a_rmse_selected": armse(lambda c: res.predict_selected(test[c].X, c, level)),
            "a_rmse_ols": float(np.mean([_ols_rmse(train, test, c) for c in clients])),
            "rounds": res.rounds, "converged": res.converged, "seconds": seconds,
            "rhat_max": float(diag["rhat_max"].max()), "ess_min": float(diag["ess_min"].min())}


def student_study(path=None, *, seeds=(0,), level: float = 0.9, subject: str = "por", scaling: str = "school",
                  penalties=("lasso", "ridge"), centralised_options=None) -> pd.DataFrame:
    """Table 3 (spec §5.1) over one or more random 60/40 splits.

    For each split and penalty: the federated fit (one coefficient vector per school) and the
    centralised fit (the same Bayesian model on the pooled rows, one coefficient vector),
    each predicting with its posterior mean after setting excluded coefficients to 0. One
    row per (seed, penalty, fit) with the RMSE of each school's test rows, their mean
    (A-RMSE), the pooled test RMSE, the number selected per school (the centralised fit
    selects one set for both), and the overlap of each school's set with the centralised
    set: ``recall`` = |F & C| / |C| and ``jaccard`` = |F & C| / |F | C|.

    A reference row per split (penalty ``"none"``, fit ``"ols"``): least squares on each
    school alone, its RMSEs and the number of slopes whose t-interval at ``level`` excludes 0
    (what calibrated intervals without shrinkage select).
    """
    from ..datasets.student import load_student

    rows = []
    for seed in seeds:
        train, test, _ = load_student(path, subject, seed=seed, scaling=scaling)
        yall = np.concatenate([test[c].y for c in test.clients])
        row = {"seed": seed, "penalty": "none", "fit": "ols", "seconds": np.nan}
        preds = []
        for c in train.clients:
            beta, sig = _ols(train[c].X, train[c].y, level)
            preds.append(np.column_stack([np.ones(test[c].n), test[c].X]) @ beta)
            row[f"rmse_{c}"], row[f"n_selected_{c}"] = _rmse(preds[-1], test[c].y), int(sig.sum())
        row["a_rmse"] = float(np.mean([row[f"rmse_{c}"] for c in train.clients]))
        row["pooled_rmse"] = _rmse(np.concatenate(preds), yall)
        rows.append(row)
        for penalty in penalties:
            model = BayesianShrinkage(penalty)
            t0 = time.perf_counter()
            fed = model.fit(train, seed=seed, progress=False)
            t1 = time.perf_counter()
            cen = model.fit_centralised(train, seed=seed, **(centralised_options or {}))
            t2 = time.perf_counter()
            csel = selected_sets(cen, level)["pooled"]
            for fit, res, secs in (("federated", fed, t1 - t0), ("centralised", cen, t2 - t1)):
                fsel = selected_sets(res, level)
                row = {"seed": seed, "penalty": penalty, "fit": fit, "seconds": secs}
                for c in train.clients:
                    row[f"rmse_{c}"] = _rmse(res.predict_selected(test[c].X, c, level), test[c].y)
                    s = fsel[c] if fit == "federated" else csel
                    row[f"n_selected_{c}"] = len(s)
                    row[f"recall_{c}"] = len(s & csel) / len(csel) if csel else np.nan
                    row[f"jaccard_{c}"] = len(s & csel) / len(s | csel) if s | csel else np.nan
                row["a_rmse"] = float(np.mean([row[f"rmse_{c}"] for c in train.clients]))
                pred = np.concatenate([res.predict_selected(test[c].X, c, level) for c in test.clients])
                row["pooled_rmse"] = _rmse(pred, yall)
                rows.append(row)
    return pd.DataFrame(rows)


__all__ = ["table2_run", "student_study", "selected_sets"]
