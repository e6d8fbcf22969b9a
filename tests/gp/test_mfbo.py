"""The multi-fidelity Bayesian-optimisation loop (fedstats.experiments.mfbo): the optima it
measures regret against, its cost accounting and fidelity rule, the federated chain's level
moments against the centralised AR1, and a short seeded run of each surrogate."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("botorch")

from fedstats.data import FederatedData  # noqa: E402
from fedstats.experiments.mfbo import TASKS, bo_run, optimum  # noqa: E402
from fedstats.gp.multifidelity import AR1CoKriging, FederatedAR1  # noqa: E402


def test_optima_are_the_known_ones_or_a_dense_grids():
    # Hartmann-3's global maximum (Dixon and Szego): 3.86278 at (0.1146, 0.5556, 0.8525)
    assert optimum("hartmann") == pytest.approx(-3.86278, abs=1e-5)
    grid = np.linspace(0, 1, 200_001)[:, None]
    best = TASKS["nonlinear_1d"].g("HF", grid).min()
    assert best - 1e-6 <= optimum("nonlinear_1d") <= best
    u = np.stack(np.meshgrid(np.linspace(0, 1, 1501), np.linspace(0, 1, 1501)), -1).reshape(-1, 2)
    assert optimum("branin") <= TASKS["branin"].g("HF", u).min() + 1e-9
    assert optimum("branin") >= TASKS["branin"].g("HF", u).min() - 1e-3


def test_the_federated_chain_gives_each_levels_moments_as_the_centralised_ar1():
    task = TASKS["branin"]
    rng = np.random.default_rng(0)
    data = {lv: rng.uniform(size=(n, 2)) for lv, n in {"LF": 15, "MF": 8, "HF": 5}.items()}
    levels = [(U, task.g(lv, U)) for lv, U in data.items()]
    fed = FederatedData.from_arrays([U for U, _ in levels], [y for _, y in levels], clients=list(data))
    a = FederatedAR1(restarts=1).fit(fed, order=list(data), seed=1)
    b = AR1CoKriging(restarts=1).fit(levels, seed=1)
    Uq = rng.uniform(size=(6, 2))
    for t in range(3):
        for x, y in zip(a.level_moments(Uq, t), b.level_moments(Uq, t)):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    before = a.communication["bytes_down"]
    a.level_moments(Uq, 1)
    assert a.communication["bytes_down"] > before  # the query went down the chain, counted


def check_run(run, name: str, budget: float) -> None:
    """Costs add up level by level, the budget is spent, the regret never rises; the cheap
    levels never spend more than one HF evaluation's cost in a row."""
    task = TASKS[name]
    assert list(run.columns[:3]) == ["cost", "level", "regret"] and run["level"].iloc[0] == "init"
    steps = run["cost"].diff().iloc[1:].to_numpy()
    np.testing.assert_allclose(steps, [task.costs[lv] for lv in run["level"].iloc[1:]])
    assert run["cost"].iloc[-2] < budget <= run["cost"].iloc[-1]
    assert (np.diff(run["regret"]) <= 0).all() and (run["regret"] >= -1e-9).all()  # the best HF value so far
    spent = 0.0
    for lv in run["level"].iloc[1:]:
        spent = 0.0 if lv == "HF" else spent + task.costs[lv]
        assert spent <= task.costs["HF"]


@pytest.mark.parametrize("method", ["pooled_mfgp", "single"])
def test_a_short_run_spends_its_budget_level_by_level(method):
    run = bo_run("nonlinear_1d", method, seed=3, budget=70)
    check_run(run, "nonlinear_1d", 70)
    if method == "single":
        assert set(run["level"].iloc[1:]) == {"HF"}


def test_single_fidelity_starts_from_the_multi_fidelity_designs_hf_points():
    # 36 of cost buys 3 HF points; with a budget below that, the runs stop at their designs
    mf, sf = bo_run("nonlinear_1d", "federated", seed=5, budget=1), bo_run("nonlinear_1d", "single", seed=5, budget=1)
    assert sf["cost"].iloc[0] == 30 and mf["cost"].iloc[0] == 36
    assert sf["regret"].iloc[0] == mf["regret"].iloc[0]  # the same 3 HF points, so the same best value


@pytest.mark.parametrize("name, budget", [("nonlinear_1d", 70), ("branin", 75)])
def test_the_federated_loop_is_the_pooled_ar1_loop(name, budget):
    # the same model, one level per client or all in one place: the same choices, the same regret
    fed = bo_run(name, "federated", seed=3, budget=budget)
    pooled = bo_run(name, "pooled_ar1", seed=3, budget=budget)
    check_run(fed, name, budget)
    assert fed["level"].tolist() == pooled["level"].tolist() and set(fed["level"].iloc[1:]) != {"HF"}
    np.testing.assert_allclose(fed["regret"], pooled["regret"], rtol=1e-9, atol=1e-12)


def test_unknown_methods_are_refused():
    with pytest.raises(ValueError, match="method must be one of"):
        bo_run("branin", "pooled")
