"""FGPR for large clients: one client's personal prediction from all of its rows.

One client with n in {1,000, 5,000, 10,000, 20,000} rows (d = 2: a smooth function plus
noise), hyperparameters fitted by ``FGPR.fit_centralized`` on a 2 x 500-row federation of the
same function, and 500 test points. For each n, in one run:

* ``FGPRResult.predict`` as a user calls it (all rows; the exact Cholesky formulas, tiled
  above 4,096 rows): wall seconds and the peak resident memory of the block;
* the dense exact Cholesky reference (``_core.posterior`` with the tiled path switched off)
  where it runs (``--exact-max``, default 20,000 rows, which needs about 7 GB; ``--exact-max
  10000`` on a smaller machine): its seconds and peak memory, and the
  largest relative errors of the prediction against it: the mean (relative to the largest
  absolute mean), ``var_f`` and ``var_y`` point by point (relative to each point's own
  variance), on the standardised scale;
* at 1,000 rows, where the default path is the dense one, the tiled path forced with
  200-row tiles, against the same reference;
* with ``--gpytorch`` (default on; ``--no-gpytorch`` skips it), GPyTorch's own iterative
  prediction at 1,000 and 5,000 rows (CG for the mean, LOVE for the variances:
  ``max_cholesky_size(0)``, ``eval_cg_tolerance(1e-6)``, ``fast_pred_var``,
  ``max_root_decomposition_size(100)``, ``max_preconditioner_size(15)``), timed and checked
  against the same reference; and, on a harder case (2,000 rows, lengthscale 0.2, noise
  variance 0.01: smaller latent variances), LOVE and plain CG variances (``fast_pred_var``
  off) at the same tolerance, next to the exact answer.

Writes ``benchmarks/results/fgpr_large.json`` and ``.md``.

    python benchmarks/fgpr_large.py [--sizes 1000 5000 10000 20000] [--exact-max 20000] [--no-gpytorch]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import numpy as np
import torch
from _measure import fmt_mib, measure, mib, record, rss_note

from fedstats.data import FederatedData
from fedstats.gp import FGPR
from fedstats.gp._core import posterior
from fedstats.gp.fgpr_algorithm import standardize

RESULTS = Path(__file__).parent / "results"
D, N_TEST, NOISE_SD = 2, 500, 0.1


def truth(X: np.ndarray) -> np.ndarray:
    return np.sin(6 * X[:, 0]) * np.cos(4 * X[:, 1]) + X[:, 0]


def client(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, D))
    return X, truth(X) + NOISE_SD * rng.standard_normal(n)


def errors(mean, var_f, ref_mean, ref_var_f, noise) -> dict:
    """Largest relative errors: the mean against max |mean|, the variances point by point."""
    return {
        "mean": float(np.max(np.abs(mean - ref_mean)) / np.max(np.abs(ref_mean))),
        "var_f": float(np.max(np.abs(var_f - ref_var_f) / ref_var_f)),
        "var_y": float(np.max(np.abs(var_f - ref_var_f) / (ref_var_f + noise))),
    }


def gpytorch_love(X, y, Xs, hyper, love=True):
    """GPyTorch's ExactGP prediction with CG and LOVE (the settings in the module docstring);
    ``love=False``: variances by CG too."""
    import gpytorch

    class GP(gpytorch.models.ExactGP):
        def __init__(self, X, y, lik):
            super().__init__(X, y, lik)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    lik = gpytorch.likelihoods.GaussianLikelihood()
    gp = GP(torch.as_tensor(X), torch.as_tensor(y), lik).double()
    gp.covar_module.base_kernel.lengthscale = float(hyper["lengthscale"][0])
    gp.covar_module.outputscale = float(hyper["outputscale"][0])
    lik.noise = float(hyper["noise"][0])
    gp.eval()
    s = gpytorch.settings
    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        s.max_cholesky_size(0),
        s.eval_cg_tolerance(1e-6),
        s.fast_pred_var(love),
        s.max_root_decomposition_size(100),
        s.max_preconditioner_size(15),
    ):
        warnings.simplefilter("ignore")
        p = gp(torch.as_tensor(Xs))
        return p.mean.numpy(), p.variance.numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000, 20000])
    ap.add_argument("--exact-max", type=int, default=20000, help="largest n with the dense exact reference")
    ap.add_argument("--no-gpytorch", dest="gpytorch", action="store_false", help="skip GPyTorch's CG/LOVE")
    a = ap.parse_args()
    train = [client(500, seed) for seed in (1, 2)]
    fed = FederatedData.from_arrays([X for X, _ in train], [y for _, y in train])
    res = FGPR(rounds=1).fit_centralized(fed, seed=0)
    hyper, spec = res.hyperparameters, res.spec
    noise = float(hyper["noise"][0])
    Xs = np.random.default_rng(99).uniform(0, 1, (N_TEST, D))
    X0, y0 = client(300, 3)
    res.predict(Xs, data=(X0, y0), progress=False)  # warm-up

    def exact(X, ys, **kw):
        return posterior(spec, hyper, X, ys, Xs, device=torch.device("cpu"), dtype=torch.float64, **kw)

    rows = []
    for n in a.sizes:
        X, y = client(n, 10 + n)
        ys = standardize(y)[0]
        with measure() as m:
            pred = res.predict(Xs, data=(X, y), scale="standardized", progress=False)
        mean, var_f = pred["mean"].to_numpy(), pred["sd"].to_numpy() ** 2
        row = {"n": n, "path": "tiled" if n > 4096 else "dense", "seconds": round(m.seconds, 2), "peak_rss_mib": mib(m)}
        if n <= a.exact_max:
            with measure() as me:
                ref_mean, ref_var = exact(X, ys, dense_max=10**9)
            row["exact"] = {"seconds": round(me.seconds, 2), "peak_rss_mib": mib(me)}
            row["max_rel_error"] = errors(mean, var_f, ref_mean, ref_var, noise)
            row["var_f_range"] = [float(ref_var.min()), float(ref_var.max())]
            if n <= 4096:
                with measure() as mt:
                    t_mean, t_var = exact(X, ys, dense_max=0, tile=200)
                row["tiled_forced"] = {
                    "tile": 200,
                    "seconds": round(mt.seconds, 2),
                    "max_rel_error": errors(t_mean, t_var, ref_mean, ref_var, noise),
                }
            if a.gpytorch and n <= 5000:
                with measure() as mg:
                    g_mean, g_var = gpytorch_love(X, ys, Xs, hyper)
                row["gpytorch_cg_love"] = {
                    "seconds": round(mg.seconds, 2),
                    "peak_rss_mib": mib(mg),
                    "max_rel_error": errors(g_mean, g_var, ref_mean, ref_var, noise),
                }
        rows.append(row)
        print(json.dumps(row), flush=True)
    stress, var_range = [], None
    if a.gpytorch:
        X, y = client(2000, 7)
        ys = standardize(y)[0]
        hard = {"lengthscale": np.array([0.2]), "outputscale": np.array([1.0]), "noise": np.array([0.01])}
        with measure() as me:
            ref = posterior(spec, hard, X, ys, Xs, device=torch.device("cpu"), dtype=torch.float64)
        var_range = [float(ref[1].min()), float(ref[1].max())]
        stress.append({"method": "exact Cholesky (dense)", "seconds": round(me.seconds, 2)})
        for love, label in (
            (True, "GPyTorch CG + LOVE (tol 1e-6, root 100)"),
            (False, "GPyTorch CG variances (tol 1e-6)"),
        ):
            with measure() as mg:
                g_mean, g_var = gpytorch_love(X, ys, Xs, hard, love=love)
            stress.append(
                {"method": label, "seconds": round(mg.seconds, 2), "max_rel_error": errors(g_mean, g_var, *ref, 0.01)}
            )
            print(json.dumps(stress[-1]), flush=True)
    dev = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only"
    out = {
        "machine": dev,
        "device": "cpu",
        "dtype": "float64",
        **record(),
        "d": D,
        "test_points": N_TEST,
        "exact_max": a.exact_max,
        "hyperparameters": {k: v.round(5).tolist() for k, v in hyper.items()},
        "note": "one client, y = sin(6 x1) cos(4 x2) + x1 + N(0, 0.1^2) on [0, 1]^2, RBF kernel with hyperparameters "
        "fitted by fit_centralized on 2 x 500 other rows; seconds and peak RSS of one predict call of 500 test "
        "points (mean and both bands) after a warm-up; errors on the standardised scale against the dense exact "
        "Cholesky answer: mean relative to max |mean|, var_f and var_y relative to each point's own variance",
        "results": rows,
        "gpytorch_hard_case": {
            "n": 2000,
            "hyperparameters": {"lengthscale": 0.2, "outputscale": 1.0, "noise": 0.01},
            "var_f_range": var_range,
            "methods": stress,
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fgpr_large.json").write_text(json.dumps(out, indent=2) + "\n")
    fmt = lambda v: f"{v:.1e}"  # noqa: E731
    md = [
        f"# FGPR for large clients: prediction from all of a client's rows ({dev})",
        "",
        "| rows | path | seconds | peak RSS MiB | dense exact: seconds | peak RSS MiB "
        "| max rel. error mean | var_f | var_y |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ex, er = r.get("exact"), r.get("max_rel_error")
        md.append(
            f"| {r['n']:,} | {r['path']} | {r['seconds']:.2f} | {fmt_mib(r['peak_rss_mib'])} | "
            + (f"{ex['seconds']:.2f} | {fmt_mib(ex['peak_rss_mib'])} | " if ex else "not run | | ")
            + (f"{fmt(er['mean'])} | {fmt(er['var_f'])} | {fmt(er['var_y'])} |" if er else "| | |")
        )
    extra = [r for r in rows if "tiled_forced" in r or "gpytorch_cg_love" in r]
    if extra:
        md += [
            "",
            "| rows | other method | seconds | max rel. error mean | var_f | var_y |",
            "|---|---|---|---|---|---|",
        ]
        for r in extra:
            for key, label in (
                ("tiled_forced", "tiled path forced (200-row tiles)"),
                ("gpytorch_cg_love", "GPyTorch CG + LOVE (tol 1e-6, root 100)"),
            ):
                if key in r:
                    e = r[key]["max_rel_error"]
                    md.append(
                        f"| {r['n']:,} | {label} | {r[key]['seconds']:.2f} | {fmt(e['mean'])} | {fmt(e['var_f'])} "
                        f"| {fmt(e['var_y'])} |"
                    )
    if stress:
        md += [
            "",
            "Harder case: 2,000 rows, lengthscale 0.2, outputscale 1, noise variance 0.01, same test points:",
            "",
            "| method | seconds | max rel. error mean | var_f | var_y |",
            "|---|---|---|---|---|",
        ]
        for r in stress:
            e = r.get("max_rel_error")
            md.append(
                f"| {r['method']} | {r['seconds']:.2f} | "
                + (f"{fmt(e['mean'])} | {fmt(e['var_f'])} | {fmt(e['var_y'])} |" if e else "reference | | |")
            )
    md += [
        "",
        out["note"] + ".",
        "",
        rss_note(out["peak_rss_scope"]) + f" Written {out['written']} on {out['machine_details']}.",
    ]
    (RESULTS / "fgpr_large.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
