"""The FGPR paper's case studies (Applications II and III): SARCOS and C-MAPSS, each against
Separate (every client's own GP, fitted by maximum likelihood on its own data) and the
centralised exact GP.

"Centralised" is the same model fitted on pooled data: the FGPR objective
``sum_k p_k L_k / N_k`` maximised by L-BFGS (:meth:`FGPR.fit_centralized`), predictions
again conditioned on each client's own data. For SARCOS, whose clients are a random
partition of one data set, ``pooled=True`` adds one exact GP on all training rows that
conditions every prediction on all of them (what a single data holder would do).

Metrics as the paper: each client's RMSE on its own test points; the mean over clients
(``avg_rmse``) and their sd (``sd_rmse``). Targets are on the standardised scale.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ..data import FederatedData
from ..datasets import load_cmapss_gp, load_sarcos_federation
from ..gp.fgpr import FGPR
from ..gp.multifidelity import SeparateGP
from .multifidelity_paper import rmse

__all__ = ["sarcos_study", "cmapss_study", "separate_rmse", "SARCOS_FGPR", "CMAPSS_FGPR"]

#: FGPR settings of the SARCOS study: the paper's Matérn-3/2 kernel; 5 local steps, batches of 128, 100 rounds
#: (the paper does not state them) and Adam's lr 0.1, not the usual 0.01 (the centralised optimum has
#: lengthscale ~70 and outputscale ~150; with lr 0.01, 500 Adam steps reach lengthscale 5 and RMSE 0.40 vs 0.27)
SARCOS_FGPR = dict(kernel="matern", nu=1.5, local_steps=5, batch_size=128, rounds=100, lr=0.1)
#: FGPR settings of the C-MAPSS study (not given by the paper: the defaults of FGPR)
CMAPSS_FGPR = dict(kernel="rbf", local_steps=5, batch_size=64, rounds=100, lr=0.01)


def _row(method: str, rmse: pd.Series, seconds: float) -> dict:
    return {
        "method": method,
        "avg_rmse": float(rmse.mean()),
        "sd_rmse": float(rmse.std(ddof=1)),
        "seconds": round(seconds, 2),
    }


def separate_rmse(
    cond: FederatedData, test: FederatedData, *, kernel: str = "rbf", nu: float = 1.5, restarts: int = 3, seed: int = 0
) -> pd.Series:
    """RMSE of every client's own GP (maximum likelihood on its own standardised data, best of
    ``restarts`` starts) on its test points."""
    sep = SeparateGP(protocol="converged", kernel=kernel, nu=nu, restarts=restarts)
    out = {}
    for c in test.clients:
        res = sep.fit(np.asarray(cond[c].X), np.asarray(cond[c].y), seed=seed)
        out[c] = rmse(res.predict(np.asarray(test[c].X), client="HF")["mean"], np.asarray(test[c].y))
    return pd.Series(out, name="rmse")


def _compare(train, cond, test, fgpr_opts, *, seed, restarts, extra=None):
    rows, models = [], {}
    model = FGPR(**fgpr_opts)
    t0 = time.perf_counter()
    fed = model.fit(train, seed=seed, progress=False)
    rows.append(_row("FGPR", fed.rmse(test, cond), time.perf_counter() - t0))
    t0 = time.perf_counter()
    cen = model.fit_centralized(train, restarts=restarts, seed=seed)
    rows.append(_row("Centralised (same objective)", cen.rmse(test, cond), time.perf_counter() - t0))
    t0 = time.perf_counter()
    sep = separate_rmse(
        cond if cond is not None else train,
        test,
        kernel=fgpr_opts.get("kernel", "rbf"),
        nu=fgpr_opts.get("nu", 1.5),
        restarts=restarts,
        seed=seed,
    )
    rows.append(_row("Separate", sep, time.perf_counter() - t0))
    models.update(FGPR=fed, Centralised=cen)
    if extra is not None:
        rows.append(extra())
    return pd.DataFrame(rows).set_index("method"), models


def sarcos_study(
    path=None,
    *,
    output: int = 1,
    seed: int = 0,
    n_clients: int = 25,
    test_fraction: float = 0.3,
    restarts: int = 2,
    pooled: bool = False,
    **fgpr,
) -> tuple[pd.DataFrame, dict]:
    """One repetition on SARCOS joint ``output``: FGPR, centralised, Separate (and the pooled
    GP). Returns ``(table, models)``; ``table`` has avg_rmse, sd_rmse and seconds per method."""
    train, test = load_sarcos_federation(
        path, output=output, n_clients=n_clients, test_fraction=test_fraction, seed=seed
    )
    opts = {**SARCOS_FGPR, **fgpr}

    def pooled_gp():
        t0 = time.perf_counter()
        X = np.vstack([np.asarray(train[c].X) for c in train.clients])
        y = np.concatenate([np.asarray(train[c].y) for c in train.clients])
        res = SeparateGP(protocol="converged", kernel=opts["kernel"], nu=opts.get("nu", 1.5), restarts=1).fit(
            X, y, seed=seed
        )
        rm = {
            c: rmse(res.predict(np.asarray(test[c].X), client="HF")["mean"], np.asarray(test[c].y))
            for c in test.clients
        }
        return _row("Pooled exact GP (all rows)", pd.Series(rm), time.perf_counter() - t0)

    return _compare(train, None, test, opts, seed=seed, restarts=restarts, extra=pooled_gp if pooled else None)


def cmapss_study(path=None, *, sensor: int = 2, seed: int = 0, restarts: int = 2, **fgpr) -> tuple[pd.DataFrame, dict]:
    """One repetition on C-MAPSS FD001: FGPR trained on 60 engines; the 40 unseen engines
    condition on half their cycles and are scored on the other half."""
    train, cond, test = load_cmapss_gp(path, sensor=sensor, seed=seed)
    return _compare(train, cond, test, {**CMAPSS_FGPR, **fgpr}, seed=seed, restarts=restarts)
