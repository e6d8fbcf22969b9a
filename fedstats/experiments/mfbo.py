"""Cost-aware multi-fidelity Bayesian optimisation with federated surrogates (the study of
``notebooks/08_multifidelity_bo.ipynb``; needs the optional extra ``fedstats[bo]``).

Each fidelity of a test problem (:mod:`fedstats.gp.testfunctions`) is held by a different
client; an evaluation at fidelity t costs ``costs[t]``. Four surrogates run the same loop:

* ``"federated"``: :class:`~fedstats.gp.multifidelity.FederatedAR1` (ARD Matern-5/2 kernels,
  the family of BoTorch's multi-fidelity GP, and a noise floor of 1e-6 for the noise-free
  simulators), one fidelity per client (queries go down the chain of fidelities, predictive moments
  come up; outputs never move), its highest fidelity as a BoTorch model (``to_botorch``);
* ``"pooled_ar1"``: the same AR1 model with every fidelity's data in one place
  (:class:`~fedstats.gp.multifidelity.AR1CoKriging`): what federating it changes;
* ``"pooled_mfgp"``: BoTorch's ``SingleTaskMultiFidelityGP`` on every fidelity's data pooled in
  one place, the fidelity an input in [0, 1] (1 the highest): another model, centralised;
* ``"single"``: BoTorch's ``SingleTaskGP`` on the highest fidelity alone (every evaluation at it).

The loop, until the budget is spent: refit the surrogate on everything evaluated; choose ``x``
by maximising the analytic ``LogExpectedImprovement`` of the highest fidelity (best value: the
best highest-level evaluation); evaluate ``x`` at the cheapest fidelity whose posterior sd there
still exceeds ``gamma`` times that fidelity's own output sd, else at the highest (the fidelity
rule of MF-GP-UCB, Kandasamy et al. 2016, because the AR1 models have no fantasies for the
knowledge gradient, and the pooled multi-fidelity GP follows the same rule so that only the
surrogate differs); the lower fidelities may spend at most one highest-level evaluation's cost in
a row before the highest is evaluated (MF-GP-UCB raises its thresholds for the same reason).
By default a point chosen for a fidelity is first evaluated, and paid for, at the lower fidelities
that have not run there, so the designs grow nested: AR1's recursive fit is the full
co-kriging model on nested designs (Le Gratiet 2013), and an evaluated point is known at every
fidelity below it (without that, AR1 keeps the lower fidelities' uncertainty, and so HF's, at a point
HF has run).
The regret after each evaluation is that of the best highest-level evaluation so far (the
simulators are noise-free: a point is only known to be good once the highest fidelity has run
there), minus the optimum. All problems are minimised (``sense=-1`` maximises the problem's own function).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from linear_operator.utils.warnings import NumericalWarning
from scipy.optimize import minimize

from .._deprecation import renamed_attribute
from ..data import FederatedData
from ..data.disclosure import NO_RULES
from ..gp._core import small_work
from ..gp.ar1_result import AR1Result
from ..gp.multifidelity import AR1CoKriging, FederatedAR1
from ..gp.testfunctions import Problem, problem

__all__ = ["Task", "TASKS", "METHODS", "AR1_OPTIONS", "optimum", "bo_run", "bo_study"]

METHODS = ("federated", "pooled_ar1", "pooled_mfgp", "single")
# the AR1 surrogates' options: the kernel of SingleTaskMultiFidelityGP, a noise floor for noise-free simulators
AR1_OPTIONS: dict[str, Any] = {"kernel": "matern", "nu": 2.5, "ard": True, "restarts": 2, "noise_floor": 1e-6}


@dataclass(frozen=True)
class Task:
    """A problem with its fidelities (lowest first), costs, initial design sizes and budget."""

    name: str
    sense: int  # +1: minimise the problem's function, -1: maximise it
    costs: dict[str, float]
    init: dict[str, int]
    budget: float
    gamma: float = 0.1

    @property
    def problem(self) -> Problem:
        return problem(self.name)

    @property
    def fidelities(self) -> list[str]:
        """Lowest first."""
        return list(self.problem.fidelities)[::-1]

    levels = renamed_attribute("fidelities")  # the former name, one release

    def g(self, fidelity: str, U: np.ndarray) -> np.ndarray:
        """The minimised function of a fidelity at inputs ``U`` of the unit box."""
        p = self.problem
        X = p.bounds[:, 0] + np.atleast_2d(U) * (p.bounds[:, 1] - p.bounds[:, 0])
        return self.sense * p.fidelities[fidelity](X)


TASKS = {
    "branin": Task("branin", 1, {"LF": 1.0, "MF": 3.0, "HF": 10.0}, {"LF": 10, "MF": 5, "HF": 3}, 200.0),
    "hartmann": Task("hartmann", -1, {"LF": 1.0, "MF": 3.0, "HF": 10.0}, {"LF": 15, "MF": 8, "HF": 4}, 250.0),
    "nonlinear_1d": Task("nonlinear_1d", -1, {"LF": 1.0, "HF": 10.0}, {"LF": 6, "HF": 3}, 150.0),
}


@functools.lru_cache(maxsize=None)
def optimum(name: str) -> float:
    """The minimum of a task's highest fidelity on the unit box: the best of 20,000 uniform points,
    polished by L-BFGS-B from the best 20."""
    task = TASKS[name]
    rng = np.random.default_rng(0)
    U = rng.uniform(size=(20000, task.problem.d))
    v = task.g("HF", U)
    best = float(v.min())
    for u in U[np.argsort(v)[:20]]:
        r = minimize(lambda z: float(task.g("HF", z[None])[0]), u, bounds=[(0, 1)] * len(u), method="L-BFGS-B")
        best = min(best, float(r.fun))
    return best


def _unit_bounds(d: int) -> torch.Tensor:
    return torch.tensor([[0.0] * d, [1.0] * d], dtype=torch.float64)


class _Surrogate:
    """The fitted surrogate of one step: the highest fidelity's BoTorch model, and each fidelity's
    posterior sd relative to that fidelity's output sd."""

    def __init__(self, method: str, task: Task, data: dict[str, tuple[np.ndarray, np.ndarray]], seed: int):
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP, SingleTaskMultiFidelityGP
        from botorch.models.transforms.outcome import Standardize
        from gpytorch.mlls import ExactMarginalLogLikelihood

        self.method, self.task, self.fidelities = method, task, task.fidelities
        d = task.problem.d
        if method == "federated":
            Xs = [data[lv][0] for lv in self.fidelities]
            fed = FederatedData.from_arrays(
                Xs, [data[lv][1] for lv in self.fidelities], clients=self.fidelities, **NO_RULES
            )
            self.ar1: AR1Result = FederatedAR1(**AR1_OPTIONS).fit(fed, order=self.fidelities, seed=seed)
            self.model = self.ar1.to_botorch()
            return
        if method == "pooled_ar1":
            self.ar1 = AR1CoKriging(**AR1_OPTIONS).fit([data[lv] for lv in self.fidelities], seed=seed)
            self.model = self.ar1.to_botorch()
            return
        if method == "single":
            X, y = data["HF"]
            train = (torch.as_tensor(X), torch.as_tensor(y)[:, None])
            self.model = SingleTaskGP(*train, outcome_transform=Standardize(m=1))
        else:  # pooled_mfgp: the fidelity s in [0, 1] is the last input column
            s = dict(zip(self.fidelities, np.linspace(0, 1, len(self.fidelities))))
            self.s, self.sd = s, {lv: float(np.std(data[lv][1])) or 1.0 for lv in self.fidelities}
            X = np.vstack([np.column_stack([data[lv][0], np.full(len(data[lv][0]), s[lv])]) for lv in self.fidelities])
            y = np.concatenate([data[lv][1] for lv in self.fidelities])
            self.model = SingleTaskMultiFidelityGP(
                torch.as_tensor(X), torch.as_tensor(y)[:, None], data_fidelities=[d], outcome_transform=Standardize(m=1)
            )
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BoTorch's notes on input scaling and optimiser restarts
            fit_gpytorch_mll(ExactMarginalLogLikelihood(self.model.likelihood, self.model))

    def acquisition(self, best: float):
        """LogEI of the highest fidelity (minimised)."""
        from botorch.acquisition import LogExpectedImprovement
        from botorch.acquisition.fixed_feature import FixedFeatureAcquisitionFunction

        acq = LogExpectedImprovement(self.model, best_f=best, maximize=False)
        if self.method != "pooled_mfgp":
            return acq
        d = self.task.problem.d
        return FixedFeatureAcquisitionFunction(acq, d=d + 1, columns=[d], values=[1.0])

    def fidelity_sd(self, U: np.ndarray, fidelity: str) -> float:
        """The fidelity's posterior sd at ``U`` (one point) relative to its output sd."""
        if self.method in ("federated", "pooled_ar1"):
            return float(
                np.sqrt(self.ar1.fidelity_moments(U, self.fidelities.index(fidelity), scale="standardized")[1][0])
            )
        X = torch.as_tensor(np.column_stack([U, [[self.s[fidelity]]]]))
        with torch.no_grad():
            return float(self.model.posterior(X).variance.sqrt()) / self.sd[fidelity]


def bo_run(name: str, method: str, seed: int = 0, *, budget: float | None = None, nested: bool = True) -> pd.DataFrame:
    """One seeded run of the loop (see the module's docs) on task ``name`` with surrogate
    ``method``: a row for the initial design, then one per evaluation (``cost`` spent so far,
    ``fidelity`` evaluated, ``regret`` of the best highest-fidelity evaluation so far, ``nested``:
    whether it was made only to keep the design nested, ``x`` the point in the unit box).
    Each fidelity's initial design is drawn from its own stream of ``seed``; the single-fidelity
    loop starts from as many highest-fidelity points as the multi-fidelity initial design's cost
    buys (at least ``d + 1``), the first of them those of the others' design.

    ``nested`` (default): a point chosen for a fidelity is first evaluated, and paid for, at every
    lower fidelity that has not been evaluated there, so every point added to a fidelity's design is
    in each lower fidelity's too (nested designs, under which AR1's recursive fit is the full
    co-kriging model, Le Gratiet 2013; the initial designs are drawn independently); these
    evaluations do not count against the lower fidelities' allowance. ``False``: each point only
    at its own fidelity (the study's first design)."""
    from botorch.optim import optimize_acqf

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    task = TASKS[name]
    budget = task.budget if budget is None else float(budget)
    d = task.problem.d
    init = dict(task.init)
    if method == "single":
        cost0 = sum(task.costs[lv] * n for lv, n in init.items())
        init = {"HF": max(d + 1, int(cost0 // task.costs["HF"]))}
    data = {}
    # each fidelity's design from its own stream: single-fidelity's starts with the others' HF points
    for lv, n in init.items():
        U = np.random.default_rng([seed, task.fidelities.index(lv)]).uniform(size=(n, d))
        data[lv] = (U, task.g(lv, U))
    spent = sum(task.costs[lv] * len(data[lv][0]) for lv in data)
    g_min, cheap = optimum(name), 0.0
    rows: list[dict[str, Any]] = [
        {"cost": spent, "fidelity": "init", "regret": float(data["HF"][1].min() - g_min), "nested": False, "x": None}
    ]
    while spent < budget:
        with warnings.catch_warnings():
            # GPyTorch's notes that it added jitter to a factorisation (frequent with noise-free fidelities)
            warnings.simplefilter("ignore", NumericalWarning)
            model = _Surrogate(method, task, data, seed)
            torch.manual_seed(seed + len(rows))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the acquisition optimiser's restarts that stop early
                x, _ = optimize_acqf(
                    model.acquisition(float(data["HF"][1].min())),
                    bounds=_unit_bounds(d),
                    q=1,
                    num_restarts=4,
                    raw_samples=128,
                )
            u = x.detach().numpy().reshape(1, d)
            fidelity = "HF"
            if method != "single":  # the cheapest fidelity still uncertain at u that the cheap allowance pays for
                allowed = [lv for lv in task.fidelities[:-1] if cheap + task.costs[lv] <= task.costs["HF"]]
                fidelity = next((lv for lv in allowed if model.fidelity_sd(u, lv) > task.gamma), "HF")
        cheap = 0.0 if fidelity == "HF" else cheap + task.costs[fidelity]
        below = task.fidelities[: task.fidelities.index(fidelity)] if nested and method != "single" else []
        for lv in [*(lv for lv in below if not (data[lv][0] == u).all(1).any()), fidelity]:
            X, y = data[lv]
            data[lv] = (np.vstack([X, u]), np.concatenate([y, task.g(lv, u)]))
            spent += task.costs[lv]
            regret = float(data["HF"][1].min() - g_min)
            rows.append({"cost": spent, "fidelity": lv, "regret": regret, "nested": lv != fidelity, "x": tuple(u[0])})
    return pd.DataFrame(rows).assign(task=name, method=method, seed=seed)


def _timed_run(args: tuple) -> pd.DataFrame:
    name, method, seed, budget, nested = args
    with small_work("cpu", 0):  # every run on one thread, whatever the number of workers
        t = time.perf_counter()
        run = bo_run(name, method, seed, budget=budget, nested=nested)
        return run.assign(seconds=time.perf_counter() - t)


def bo_study(
    budgets: dict[str, float],
    seeds: Iterable[int],
    methods: Sequence[str] = METHODS,
    *,
    nested: bool = True,
    workers: int = 1,
) -> pd.DataFrame:
    """Every run of the study: each task of ``budgets`` (name: budget), seed and method, one
    :func:`bo_run` each (with its ``seconds``), in ``workers`` processes (each on one thread;
    the runs are independent, so the result does not depend on ``workers``)."""
    jobs = [(name, m, int(s), float(b), nested) for name, b in budgets.items() for s in seeds for m in methods]
    if workers <= 1:
        runs = [_timed_run(job) for job in jobs]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            runs = list(pool.map(_timed_run, jobs))
    return pd.concat(runs, ignore_index=True)
