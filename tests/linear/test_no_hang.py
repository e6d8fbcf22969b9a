"""Fits that once hung forever (issue 17) finish.

Each runs in a subprocess with a generous time limit, so a deadlock fails its test instead of
stalling the suite.

The cause: jaxlib 0.10.0 to 0.11.0 split a batched LAPACK call (Cholesky, triangular solve,
eigh of a vmapped computation) into chunks on XLA's intra-op thread pool and blocked the pool
thread that made the call until the chunks had run. The thunk executor runs independent calls
concurrently, so two such calls could hold every thread of the pool while their chunks waited
behind them: the process sat at 0% CPU forever. It began at 9 predictors (HM2's Laplace
Newton solve with 9 predictors and the intercept: phi of dimension 20 + 1, 16 padded
clients) because a batch is split only above
2e5 flops. ``pyproject.toml`` excludes those jaxlib versions; ``constraints.txt`` pins 0.9.2.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from fedstats.inference import DEADLOCKING_JAXLIB as AFFECTED


def run_script(code: str, timeout: float) -> str:
    """Run ``code`` in a fresh interpreter; fail (not hang) if it takes longer than ``timeout``."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"did not finish within {timeout:.0f} s (a hang?); output so far: {exc.stdout!r} {exc.stderr!r}")
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_jaxlib_has_no_parallel_lapack_batches():
    import jaxlib

    v = jaxlib.__version__
    assert not v.startswith(AFFECTED), (
        f"jaxlib {v} splits batched LAPACK calls over XLA's thread pool and deadlocks vmapped fits "
        "(fixed upstream by jax-ml/jax 859992407d); use 0.9.2 (constraints.txt) or >= 0.11.1"
    )


def test_laplace_kernel_repeated_does_not_deadlock():
    # The smallest reproducer of the report: the compiled, vmapped Newton solve of HM2 with 9
    # predictors and the intercept, called again and again. On jaxlib 0.10.2 it hangs (checked:
    # no call returned within 300 s); on 0.9.2 the 80 calls take about 10 s.
    out = run_script(
        """
        import numpy as np, jax
        from fedstats.inference.tilted.kernels import stack_stats
        from fedstats.inference.tilted.laplace import laplace_fns
        from fedstats.linear._hm2_site import HM2Site
        rng = np.random.default_rng(0)
        site, B = HM2Site(d=10), 16
        stats = []
        for _ in range(B):
            X = rng.normal(size=(100, 10))
            stats.append(site.stats_from(X, X @ np.ones(10) + 0.05 * rng.normal(size=100)))
        p = site.phi_dim
        x0 = np.stack([np.r_[np.zeros(p), site.init_local(s)[1]] for s in stats])
        args = (x0, np.zeros((B, p)), np.broadcast_to(np.eye(p), (B, p, p)).copy(), stack_stats(stats, B))
        f = jax.jit(jax.vmap(laplace_fns(site, 30)[1]))
        with jax.enable_x64(True):
            for _ in range(80):
                x = np.asarray(f(*args)[0])
        print("ok", np.isfinite(x).all())
    """,
        timeout=240,
    )
    assert "ok True" in out


FIT = """
    import time, numpy as np, warnings
    warnings.simplefilter("ignore")
    from fedstats.datasets.synthetic import hm2_federation
    from fedstats import HierarchicalLinearModel
    for d, K, n, seed in {cases}:
        data, _ = hm2_federation(n_clients=K, n_obs=n, mu=np.ones(d), tau=np.ones(d), sigma=0.05, seed=seed)
        kw = {kw}
        if kw.get("estimator") == "exact":
            kw.update(tau=1.0, sigma=0.05)
        t = time.perf_counter()
        res = HierarchicalLinearModel(**kw).fit(data, seed=0)
        s = res.summary(level=0.9)
        ok = np.isfinite(s["mean"].to_numpy()).all()
        print("fit", d, K, n, seed, res.rounds, ok, round(time.perf_counter() - t, 1), flush=True)
"""

SMALL = [
    (9, 10, 100, 0),
    (9, 10, 100, 1),
    (10, 10, 100, 1),
    (12, 10, 100, 0),
    (12, 10, 100, 1),
    (16, 10, 100, 0),
    (16, 10, 100, 1),
]


# The default run fits with the default estimator (Rao-Blackwellised Laplace moments beyond 8
# sampled coordinates since issue 40), one seed per size; the importance estimator (the default
# until then; it compiles the kernels that deadlocked) runs in the default suite at 40
# predictors below, and here in the slow run; the version check above guards the known cause.
# Every estimator and seed: the slow run.
@pytest.mark.parametrize(
    "estimator, options, cases",
    [
        ("auto", {}, SMALL[::2]),
        pytest.param("importance", {}, SMALL, marks=pytest.mark.slow),
        pytest.param("exact", {}, SMALL, marks=pytest.mark.slow),
        pytest.param("laplace", {}, SMALL, marks=pytest.mark.slow),
        pytest.param(
            "nuts",
            {"rounds": 2, "estimator_options": {"num_warmup": 60, "num_samples": 60, "num_chains": 2}},
            SMALL[::2],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_hm2_finishes_with_many_predictors(estimator, options, cases):
    out = run_script(FIT.format(cases=cases, kw={"estimator": estimator, **options}), timeout=900)
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("fit ")]
    assert len(lines) == len(cases) and all(ln[6] == "True" for ln in lines), out


@pytest.mark.parametrize(
    "estimator, options",
    [
        ("auto", {"rounds": 3}),
        ("importance", {"rounds": 3}),
        pytest.param("exact", {"rounds": 3}, marks=pytest.mark.slow),
        pytest.param("laplace", {"rounds": 3}, marks=pytest.mark.slow),
        pytest.param(
            "nuts",
            {"rounds": 2, "estimator_options": {"num_warmup": 60, "num_samples": 60, "num_chains": 2}},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_hm2_finishes_with_40_predictors_short(estimator, options):
    # 20 clients x 200 rows, phi of dimension 80 (measured: exact 2 rounds at once, Laplace 3
    # rounds 19 s, importance 3 rounds 33 s, NUTS 2 rounds 45 s; each in a fresh process that
    # compiles, about 90-110 s in all; the default, Rao-Blackwellised Laplace moments, compiles
    # nothing). The importance estimator falls back to Laplace moments where importance
    # weights degenerate, so every client answers from round 1. The full default fit is the
    # slow test below.
    out = run_script(FIT.format(cases=[(40, 20, 200, 0)], kw={"estimator": estimator, **options}), timeout=1200)
    line = out.split()
    assert line[6] == "True" and int(line[5]) <= options["rounds"], out


def test_hm2_with_fifty_clients_and_sixteen_predictors_fits_in_seconds():
    # The report (issue 40): 50 clients x 16 predictors x 100 rows with defaults took
    # 15-40 s per round and had not finished after 175 s; a simulated federation took 113 s
    # and stopped unconverged after 15 rounds (importance sampling of all 34 coordinates of
    # phi). With the Rao-Blackwellised Laplace moments: about 3 s, converged.
    code = """
        import time, numpy as np, warnings
        warnings.simplefilter("ignore")
        from fedstats.datasets.synthetic import hm2_federation
        from fedstats import HierarchicalLinearModel
        mu = np.random.default_rng(1).normal(size=16)
        data, _ = hm2_federation(n_clients=50, n_obs=100, mu=mu, tau=np.full(16, 0.5), sigma=1.0, seed=0)
        t = time.perf_counter()
        res = HierarchicalLinearModel().fit(data, seed=0)
        print("fit", res.rounds, res.converged, round(time.perf_counter() - t, 1))
    """
    line = run_script(code, timeout=120).split()
    assert line[0] == "fit" and line[2] == "True", line


@pytest.mark.slow
def test_hm2_finishes_with_40_predictors():
    out = run_script(FIT.format(cases=[(40, 20, 200, 0)], kw={}), timeout=3600)
    assert out.split()[6] == "True", out


@pytest.mark.parametrize("model", ["BayesianLasso", "BayesianRidge"])
def test_shrinkage_finishes_with_many_predictors(model):
    out = run_script(
        f"""
        import numpy as np, warnings
        warnings.simplefilter("ignore")
        from fedstats import FederatedData
        from fedstats.linear import {model}
        rng = np.random.default_rng(0)
        for d in (12,):
            beta = np.r_[np.ones(3), np.zeros(d - 3)]
            Xs = [rng.normal(size=(100, d)) for _ in range(6)]
            data = FederatedData.from_arrays(Xs, [X @ beta + 0.3 * rng.normal(size=100) for X in Xs])
            res = {model}(rounds=2).fit(data, seed=0)
            print("fit", d, np.isfinite(res.summary()["mean"].to_numpy()).all(), flush=True)
    """,
        timeout=900,
    )
    assert out.count("True") == 1, out


def test_cli_hm2_with_nine_predictors_finishes(tmp_path):
    # The report's command line: 10 sites x 100 rows, 9 predictors.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 9))
    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(9)])
    df["y"] = X @ np.linspace(-1, 1, 9) + rng.normal(size=1000)
    df["site"] = np.repeat([f"s{k}" for k in range(10)], 100)
    df.to_csv(tmp_path / "big.csv", index=False)
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "fedstats.cli",
                "fit",
                str(tmp_path / "big.csv"),
                "--by",
                "site",
                "--target",
                "y",
                "--model",
                "hm2",
                "--output",
                str(tmp_path / "fit.json"),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("fedstats fit did not finish within 900 s")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "fit.json").is_file()
