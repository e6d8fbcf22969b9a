"""The FGPR paper's multi-fidelity table: one repetition (:func:`mf_run`) under the paper
protocol (the published code's settings: nearest-neighbour batches, Adam lr 0.01,
``M = min_k N_k``, ``E_k = floor(N_k / M)``, 200 rounds plus the code's initial one, log 2
start; :func:`paper_protocol`) or the converged protocol (every model at its optimum), with the
RMSE of each method on the high-fidelity client's standardised scale."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data import FederatedData
from ..gp.fgpr import FGPR
from ..gp.fgpr_algorithm import standardize_y
from ..gp.multifidelity import AR1CoKriging, FederatedAR1, SeparateGP, fidelity_data
from ..gp.nargp import NARGP

__all__ = ["paper_protocol", "mf_run", "rmse"]


def paper_protocol(
    data: FederatedData,
    *,
    lr: float = 0.01,
    rounds: int = 201,
    kernel: str = "rbf",
    ard: bool = False,
    batch_size=None,
    **kw,
) -> FGPR:
    """FGPR with the published code's multi-fidelity settings:
    nearest-neighbour batches of ``M = min_k N_k`` (``batch_size`` overrides, e.g. 0.2 for the
    1-D examples' ``N_k / 5``), one local epoch ``E_k = floor(N_k / M_k)``, Adam with a fresh
    state each round, 200 rounds plus the initial one, log 2 start; no hyperparameter curvature
    (``laplace=False``: the paper reports predictions only) unless ``laplace`` is passed."""
    M = int(min(data.n_obs.values())) if batch_size is None else batch_size
    kw.setdefault("laplace", False)
    return FGPR(
        kernel=kernel,
        ard=ard,
        rounds=rounds,
        local_steps="epoch",
        batch_size=M,
        sampler="nearest",
        optimizer="adam",
        lr=lr,
        optimizer_state="fresh",
        **kw,
    )


def rmse(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


def mf_run(
    name: str,
    *,
    seed: int = 0,
    protocol: str = "paper",
    layout: str = "paper",
    methods=("FGPR", "Separate", "AR1", "FedAR1"),
    code_compat: bool = False,
    scale_x: bool = True,
    lr: float | None = None,
    rounds: int = 201,
    restarts: int = 2,
) -> dict:
    """One repetition of the multi-fidelity table (``FedAR1``, the federated AR1, with the paper
    layout only: the code layout has two clients per fidelity; ``"NARGP"`` in ``methods`` adds the
    nonlinear autoregressive GP of :mod:`fedstats.gp.nargp`).

    ``protocol="paper"``: FGPR follows :func:`paper_protocol`; Separate
    gets the same Adam, lr and batch size for ``rounds - 1`` epochs on the high-fidelity data
    alone. ``"converged"``: the optimum of FGPR's objective
    (:meth:`FGPR.fit_centralized`, L-BFGS from ``restarts`` starts) against a Separate GP
    fitted to convergence the same way. AR1 (centralised recursive co-kriging, fitted to
    convergence) is the same under both. Returns the RMSE of each method against the
    noise-free high-fidelity truth on the scored client's standardised scale.
    """
    if protocol not in ("paper", "converged"):
        raise ValueError(f"protocol must be 'paper' or 'converged', got {protocol!r}")
    mf = fidelity_data(name, seed=seed, layout=layout, code_compat=code_compat, scale_x=scale_x)
    prob = mf.problem
    lr = (0.1 if prob.grid else 0.01) if lr is None else lr
    truth = mf.truth_standardized()
    out = {"problem": prob.name, "protocol": protocol, "seed": seed}
    M = min(mf.train.n_obs.values())
    Xh, yh = np.asarray(mf.train[mf.hf_client].X), np.asarray(mf.train[mf.hf_client].y)
    batch: dict[str, Any] = {"batch_size": 0.2} if prob.grid else {}
    if "FGPR" in methods:
        model = paper_protocol(mf.train, lr=lr, rounds=rounds, device="cpu", **batch)
        res = (
            model.fit(mf.train, seed=seed, progress=False)
            if protocol == "paper"
            else model.fit_centralized(mf.train, restarts=restarts, seed=seed)
        )
        out["FGPR"] = rmse(res.predict(mf.X_test, client=mf.hf_client, scale="standardized")["mean"], truth)
    if "Separate" in methods:
        sep = SeparateGP(
            protocol=protocol, lr=lr, rounds=rounds - 1, batch_size=0.2 if prob.grid else M, restarts=restarts
        )
        res = sep.fit(Xh, yh, seed=seed)
        out["Separate"] = rmse(res.predict(mf.X_test, client="HF", scale="standardized")["mean"], truth)
    if "AR1" in methods:
        order = [lv for lv in ("LF", "MF", "HF") if lv in prob.fidelities]
        ar = AR1CoKriging(restarts=max(restarts, 2)).fit([mf.fidelity_data(lv) for lv in order], seed=seed)
        _, mu, sd = standardize_y(yh)
        out["AR1"] = rmse((ar.predict(mf.X_test, scale="original")["mean"] - mu) / sd, truth)
    if "FedAR1" in methods and layout == "paper":
        fa = FederatedAR1(restarts=max(restarts, 2)).fit(
            mf.train, order=[lv for lv in ("LF", "MF", "HF") if lv in prob.fidelities], seed=seed
        )
        out["FedAR1"] = rmse(fa.predict(mf.X_test, scale="standardized")["mean"], truth)
        # the fit's exchanges (its chain and each fidelity's release) and the prediction's (not the
        # in-process rebuild of the levels' GPs before the first query: a node keeps its level)
        pred = fa.query_communication.by_kind["predict"]
        out["FedAR1_kB"] = (fa.communication.bytes_total + pred["bytes_up"] + pred["bytes_down"]) / 1e3
    if "NARGP" in methods:  # beyond the paper, not in the default methods
        order = [lv for lv in ("LF", "MF", "HF") if lv in prob.fidelities]
        # from one or two starts the fidelity-2 fit can stop at "all noise" (nonlinear 1-D, seed 0)
        na = NARGP(restarts=max(restarts, 5)).fit([mf.fidelity_data(lv) for lv in order], seed=seed)
        _, mu, sd = standardize_y(yh)
        out["NARGP"] = rmse((na.predict(mf.X_test, scale="original")["mean"] - mu) / sd, truth)
    return out
