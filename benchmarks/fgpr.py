"""FGPR: the federated fit against the centralised exact GP fit of the same objective.

For a few federations, in one run:

* ``FGPR.fit`` through the federated runtime, clients with equal batch sizes as one batched
  GP (the default), and one client at a time (``batched=False``);
* ``FGPR.fit_centralised``: the same objective ``sum_k p_k L_k / N_k`` on pooled data,
  maximised by L-BFGS (full data, exact Cholesky);

then seconds per federated round, total times and their ratio, and the final objective of
both (the federated fit uses minibatches and a fixed budget of rounds, so it stops above the
centralised optimum; the gap is reported). Writes ``benchmarks/results/fgpr.json`` and
``.md`` (``fgpr_<device>.json`` for ``--device cuda``).

    python benchmarks/fgpr.py [--quick] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from fedstats.data import FederatedData
from fedstats.gp import FGPR

RESULTS = Path(__file__).parent / "results"
DATA = Path(os.environ.get("FEDSTATS_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def gp_clients(K, n, d, seed=0, ls=0.3, noise=0.05):
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for _ in range(K):
        X = rng.uniform(0, 1, (n, d))
        C = np.exp(-0.5 * (((X[:, None] - X[None]) / ls) ** 2).sum(-1)) + noise * np.eye(n)
        Xs.append(X)
        ys.append(np.linalg.cholesky(C) @ rng.standard_normal(n))
    return FederatedData.from_arrays(Xs, ys)


def timed(f):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = f()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small federations only (smoke run)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available on this machine")
    cases = [("K=20 x 250 points, d=2 (spec §9 item 7)", gp_clients(20, 250, 2), dict(batch_size=64, rounds=100))]
    if not a.quick:
        cases.append(("K=100 x 100 points, d=5", gp_clients(100, 100, 5, seed=1), dict(batch_size=64, rounds=100)))
        cases.append(("K=10 x 1000 points, d=3", gp_clients(10, 1000, 3, seed=2), dict(batch_size=128, rounds=100)))
        if (DATA / "sarcos" / "sarcos_inv_test.mat").is_file():
            from fedstats.datasets import load_sarcos_federation
            from fedstats.experiments.fgpr_case_studies import SARCOS_FGPR

            train, _ = load_sarcos_federation(DATA, output=1)
            cases.append(("SARCOS joint 1, K=25 x 125 points, d=21, Matern-3/2", train, dict(SARCOS_FGPR)))
    rows = []
    for name, data, opts in cases:
        model = FGPR(**{"lr": 0.01, **opts}, device=a.device)
        model.fit(data, seed=0, progress=False)  # warm-up (kernels, CUDA context)
        fed, t_fed = timed(lambda: model.fit(data, seed=0, progress=False))
        _, t_loop = timed(lambda: model.fit(data, seed=0, progress=False, batched=False))
        cen, t_cen = timed(lambda: model.fit_centralised(data, seed=0))
        r = opts["rounds"]
        f_fed, f_cen = fed.objective(), cen.objective()
        rows.append(
            {
                "federation": name,
                "K": data.n_clients,
                "N": int(sum(data.n_obs.values())),
                "d": data.n_features,
                "rounds": r,
                "batch_size": opts["batch_size"],
                "seconds": {
                    "federated_batched": round(t_fed, 3),
                    "federated_looped": round(t_loop, 3),
                    "centralised_lbfgs": round(t_cen, 3),
                },
                "seconds_per_round": {
                    "federated_batched": round(t_fed / r, 5),
                    "federated_looped": round(t_loop / r, 5),
                },
                "federated_over_centralised": round(t_fed / t_cen, 2),
                "looped_over_batched": round(t_loop / t_fed, 2),
                "objective": {
                    "federated": round(f_fed, 5),
                    "centralised": round(f_cen, 5),
                    "gap": round(f_fed - f_cen, 5),
                },
                "hyperparameters": {
                    "federated": {k: v.round(4).tolist() for k, v in fed.hyperparameters.items()},
                    "centralised": {k: v.round(4).tolist() for k, v in cen.hyperparameters.items()},
                },
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    dev = (
        torch.cuda.get_device_name(0)
        if a.device == "cuda"
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only"
    )
    out = {
        "machine": dev,
        "device": a.device,
        "dtype": "float64",
        "note": "single wall times after a warm-up fit; objective = sum_k p_k L_k / N_k (mean NLL per point) on "
        "each client's full standardised data",
        "results": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "fgpr" + ("_quick" if a.quick else "") + ("_cuda" if a.device == "cuda" else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=2))
    md = [
        f"# FGPR: federated against the centralised exact fit of the same objective ({dev})",
        "",
        "| federation | rounds | s/round federated (batched) | looped | total federated | centralised L-BFGS "
        "| federated / centralised | looped / batched | objective federated | centralised | gap |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, o = r["seconds_per_round"], r["objective"]
        md.append(
            f"| {r['federation']} | {r['rounds']} | {s['federated_batched']:.4f} | {s['federated_looped']:.4f} "
            f"| {r['seconds']['federated_batched']:.2f} | {r['seconds']['centralised_lbfgs']:.2f} "
            f"| {r['federated_over_centralised']} | {r['looped_over_batched']} | {o['federated']:.4f} "
            f"| {o['centralised']:.4f} | {o['gap']:+.4f} |"
        )
    md += ["", out["note"] + "."]
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
