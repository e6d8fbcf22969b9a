"""FGPR: the federated fit against the centralised exact GP fit of the same objective.

For a few federations, in one run:

* ``FGPR.fit`` through the federated runtime, clients with equal batch sizes as one batched
  GP (the default), and one client at a time (``batched=False``);
* ``FGPR.fit_centralized``: the same objective ``sum_k p_k L_k / N_k`` on pooled data,
  maximised by L-BFGS (full data, exact Cholesky);

then seconds per federated round, total times and their ratio (the batched and centralised fits
run in turn, ``--repeats`` times, best of each: a shared machine's speed can drift by 20-30%
from one minute to the next), and the final objective of both (the federated fit uses
minibatches and a fixed budget of rounds, so it stops above the centralised optimum; the gap is
reported), and the peak resident memory of each fit (and, with
``--device cuda``, the peak CUDA memory torch allocated). Writes ``benchmarks/results/fgpr.json``
and ``.md`` (``fgpr_cuda.*`` for ``--device cuda``, ``fgpr_quick*`` with ``--quick``).

On the CPU, a federated round of 64 or more clients shares their local steps among up to
``torch.get_num_threads()`` threads (``--threads``; torch's default: one per core); the
centralised fit factorises its clients' matrices one after the other.

    python benchmarks/fgpr.py [--quick] [--device cpu|cuda] [--threads N] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch
from _measure import fmt_mib, interleaved, machine, measure, mib, record, rss_note

from fedstats.data import FederatedData
from fedstats.gp import FGPR, laplace

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


def synced(f, peaks: list | None = None):
    """``f`` that waits for the GPU's work before it returns (with CUDA), and appends torch's
    peak CUDA MiB during it to ``peaks``."""

    def run():
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        out = f()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            if peaks is not None:
                peaks.append(round(torch.cuda.max_memory_allocated() / 2**20, 1))
        return out

    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small federations only (smoke run)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of the batched and centralised fits, in turn")
    a = ap.parse_args()
    if a.threads is not None:
        torch.set_num_threads(a.threads)
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
        # the rounds against L-BFGS: neither fit computes the hyperparameters' curvature afterwards
        model = FGPR(**{"lr": 0.01, **opts}, device=a.device, laplace=False)
        model.fit(data, seed=0, progress=False)  # warm-up (kernels, CUDA context)
        cuda = a.device == "cuda"
        gpu: dict = {"fed": [], "loop": [], "cen": []}
        # the batched and centralised fits in turn, best of each; the looped one once (it is slow)
        res, best, every = interleaved(
            {
                "fed": synced(lambda: model.fit(data, seed=0, progress=False), gpu["fed"]),
                "cen": synced(lambda: model.fit_centralized(data, seed=0), gpu["cen"]),
            },
            a.repeats,
        )
        fed, cen, m_fed, m_cen = res["fed"], res["cen"], best["fed"], best["cen"]
        with measure() as m_loop:
            synced(lambda: model.fit(data, seed=0, progress=False, batched=False), gpu["loop"])()
        g_fed, g_loop, g_cen = (max(gpu[k]) if cuda else None for k in ("fed", "loop", "cen"))
        t_fed, t_loop, t_cen = m_fed.seconds, m_loop.seconds, m_cen.seconds
        r = opts["rounds"]
        f_fed, f_cen = fed.objective(), cen.objective()
        # the hyperparameters' curvature (issue 23): one exchange at the centralised optimum, against
        # the same sums computed on pooled data
        std = model.standardize
        with measure() as m_curv:
            _, curv = laplace.federated_curvature(
                model.spec(data.n_features), cen.hyperparameters, data, standardize=std, seed=0
            )
        pooled = laplace.pooled_curvature(model.spec(data.n_features), cen.hyperparameters, data, standardize=std)
        same = (
            None
            if isinstance(curv, str)
            else float(np.abs(curv["hessian"] - pooled["hessian"]).max() / np.abs(pooled["hessian"]).max())
        )
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
                "peak_rss_mib": {
                    "federated_batched": mib(m_fed),
                    "federated_looped": mib(m_loop),
                    "centralised_lbfgs": mib(m_cen),
                },
                "seconds_per_round": {
                    "federated_batched": round(t_fed / r, 5),
                    "federated_looped": round(t_loop / r, 5),
                },
                "federated_over_centralised": round(t_fed / t_cen, 2),
                "every_run_seconds": {
                    k: [round(t, 3) for t in every[j]]
                    for k, j in (("federated_batched", "fed"), ("centralised_lbfgs", "cen"))
                },
                "looped_over_batched": round(t_loop / t_fed, 2),
                "curvature_exchange": {
                    "seconds": round(m_curv.seconds, 3),
                    "over_the_rounds": round(m_curv.seconds / t_fed, 3),
                    "peak_rss_mib": mib(m_curv),
                    "hessian_vs_pooled_relative": same,
                    "why_none": curv if isinstance(curv, str) else None,
                },
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
        if cuda:
            rows[-1]["peak_cuda_mib"] = {
                "federated_batched": g_fed,
                "federated_looped": g_loop,
                "centralised_lbfgs": g_cen,
            }
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
        "torch_threads": torch.get_num_threads(),
        **record(),
        "note": f"after a warm-up fit, the best of {a.repeats} wall times of the batched federated fit and of the "
        "centralised fit, run in turn (a slow spell of the machine touches both), the looped fit once; objective = sum_k p_k L_k / N_k (mean NLL per point) on "
        f"each client's full standardised data; torch threads: {torch.get_num_threads()} (a federated round of "
        "64 or more clients shares them; the centralised fit factorises its clients one after the other)",
        "results": rows,
    }
    if a.device == "cuda":
        out["machine_details"] = f"{machine()}, {dev}"
    RESULTS.mkdir(exist_ok=True)
    stem = "fgpr" + ("_quick" if a.quick else "") + ("_cuda" if a.device == "cuda" else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=2))
    md = [
        f"# FGPR: federated against the centralised exact fit of the same objective ({dev})",
        "",
        "| federation | rounds | s/round federated (batched) | looped | total federated | centralised L-BFGS "
        "| federated / centralised | looped / batched | objective federated | centralised | gap "
        "| peak RSS MiB batched / looped / centralised |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, o = r["seconds_per_round"], r["objective"]
        md.append(
            f"| {r['federation']} | {r['rounds']} | {s['federated_batched']:.4f} | {s['federated_looped']:.4f} "
            f"| {r['seconds']['federated_batched']:.2f} | {r['seconds']['centralised_lbfgs']:.2f} "
            f"| {r['federated_over_centralised']} | {r['looped_over_batched']} | {o['federated']:.4f} "
            f"| {o['centralised']:.4f} | {o['gap']:+.4f} | "
            + " / ".join(
                fmt_mib(r["peak_rss_mib"][k]) for k in ("federated_batched", "federated_looped", "centralised_lbfgs")
            )
            + " |"
        )
    md += [
        "",
        "The hyperparameters' curvature exchange (one round after the rounds: each client's value, gradient and "
        "Hessian of its full-data likelihood, summed; `laplace=False` above, so the times exclude it), at the "
        "centralised optimum:",
        "",
        "| federation | seconds | / the batched rounds | peak RSS MiB | summed Hessian vs pooled (relative) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["curvature_exchange"]
        md.append(
            f"| {r['federation']} | {c['seconds']:.3f} | {c['over_the_rounds']:.3f} | {fmt_mib(c['peak_rss_mib'])} "
            f"| {'none: ' + c['why_none'] if c['why_none'] else format(c['hessian_vs_pooled_relative'], '.1e')} |"
        )
    md += ["", out["note"] + ".", "", rss_note(out["peak_rss_scope"])]
    if a.device == "cuda":
        md[-1] += (
            " Peak CUDA memory torch allocated (MiB), batched / looped / centralised: "
            + "; ".join(
                f"{r['federation']}: " + " / ".join(fmt_mib(v) for v in r["peak_cuda_mib"].values()) for r in rows
            )
            + "."
        )
    md[-1] += f" Written {out['written']} on {out['machine_details']}."
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
