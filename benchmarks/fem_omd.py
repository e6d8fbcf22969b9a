"""Cost of one FEM-OMD time step as the federation grows: linear in C * n?

For C clients with n new rows each (d = 10, m = 5, K = 5 inner rounds, unit covariances):

* federated: ``FEMOMD.partial_fit`` through the in-process federated runtime (K + 1 rounds:
  every client's E-steps and statistics, the Monte-Carlo gradient and mirror-descent update,
  message validation and copies, the server's M-steps and running average);
* centralised reference, same run: the same step on the stacked batch with no runtime (K
  E/M iterations of the per-client-weights model, running average, the soft counts of the
  discounted Dirichlet, Monte-Carlo gradients and exponentiated-gradient updates of all
  clients as array operations);
* the ratio federated / centralised, and a least-squares fit (relative residuals)
  ``seconds = a + b C + c C n`` of the federated times: ``b`` is the per-client cost of the runtime (messages), ``c`` the
  per-row compute. Linear growth shows as a good fit (max relative residual reported).

The peak resident memory of the timed steps of each side is recorded next to its time. Writes
``benchmarks/results/fem_omd.json`` and ``.md`` (``fem_omd_quick.*`` with ``--quick``).

    python benchmarks/fem_omd.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
from _measure import fmt_mib, measure, mib, record, rss_note

from fedstats.experiments.regret import MixtureStream
from fedstats.mixture import FEMOMD
from fedstats.mixture.gmm import e_step, estep_statistics, log_gaussian
from fedstats.mixture.omd import eg_update, omd_gradient

RESULTS = Path(__file__).parent / "results"
D, M, K = 10, 5, 5


def centralised_step(X, starts, means, logw, t, eta, rng):
    """One FEM-OMD step on the stacked batch, no runtime (the reference)."""
    C = len(starts)
    sizes = np.diff(np.r_[starts, X.shape[0]])
    pc = np.ones(M)
    tilde = means.copy()
    lw_t = np.full((C, M), -math.log(M))
    for _ in range(K):
        N, S1, _, _, _ = estep_statistics(X, starts, tilde, pc, lw_t, "spherical")
        lw_t = np.log(np.maximum(N / sizes[:, None], 1e-300))
        tilde = tilde + S1.sum(0) / N.sum(0)[:, None]
    new = (t * means + tilde) / (t + 1)
    g = new.mean(0)
    resp = e_step(log_gaussian(X - g, new - g, pc, "spherical"), np.repeat(lw_t, sizes, axis=0))[0]
    np.add.reduceat(resp, starts, axis=0)  # the soft counts of the discounted Dirichlet
    p = np.exp(lw_t)
    z = np.concatenate([rng.choice(M, size=s, p=p[i] / p[i].sum()) for i, s in enumerate(sizes)])
    Z = new[z] + rng.standard_normal((len(z), D))
    G = omd_gradient(log_gaussian(Z - g, new - g, pc, "spherical"), logw, starts)
    return new, np.log(eg_update(np.exp(logw), G, eta, 1e-3))


def case(C, n, steps, reps=3):
    stream = MixtureStream(n_clients=C, n=n, d=D, n_components=M, process="fixed", seed=1)
    batches = [stream.batch(t) for t in range(1, steps + 2)]
    fed_times, ref_times, fed_peaks, ref_peaks = [], [], [], []
    for _ in range(reps):
        model = FEMOMD(M, means_init=stream.means + 0.1, horizon=100, weight_floor=1e-3)
        model.partial_fit(batches[0])  # warm-up (first-call costs)
        ts = []
        with measure() as m:
            for b in batches[1:]:
                t0 = time.perf_counter()
                model.partial_fit(b)
                ts.append(time.perf_counter() - t0)
        fed_times.append(float(np.median(ts)))
        fed_peaks.append(m.peak_rss_mib)
        rng = np.random.default_rng(0)
        means, logw = stream.means + 0.1, np.full((C, M), -math.log(M))
        ts = []
        with measure() as m:
            for t, b in enumerate(batches[1:], start=2):
                X = np.concatenate([b[c].X for c in b.clients])
                starts = np.cumsum([0] + [b.n_obs[c] for c in b.clients[:-1]])
                t0 = time.perf_counter()
                means, logw = centralised_step(X, starts, means, logw, t, 0.05, rng)
                ts.append(time.perf_counter() - t0)
        ref_times.append(float(np.median(ts)))
        ref_peaks.append(m.peak_rss_mib)
    fed, ref = min(fed_times), min(ref_times)
    return {
        "C": C,
        "n": n,
        "Cn": C * n,
        "s_per_step_federated": fed,
        "s_per_step_centralised": ref,
        "peak_rss_mib_federated": mib(max(fed_peaks)),
        "peak_rss_mib_centralised": mib(max(ref_peaks)),
        "ratio": fed / ref,
        "bytes_up_per_step": model.history[-1]["bytes_up"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small grid (smoke run)")
    args = ap.parse_args()
    Cs, ns, steps = ([5, 20], [10, 40], 3) if args.quick else ([10, 30, 100, 300], [10, 30, 100], 8)
    rows = [case(C, n, steps) for C in Cs for n in ns]
    Cv = np.array([r["C"] for r in rows], float)
    Cn = np.array([r["Cn"] for r in rows], float)
    y = np.array([r["s_per_step_federated"] for r in rows])
    A = np.c_[np.ones_like(Cv), Cv, Cn]
    coef, *_ = np.linalg.lstsq(A / y[:, None], np.ones_like(y), rcond=None)  # relative residuals
    pred = A @ coef
    for r, p in zip(rows, pred):
        r["fit"] = float(p)
    fit = {
        "a_s": float(coef[0]),
        "b_s_per_client": float(coef[1]),
        "c_s_per_row": float(coef[2]),
        "max_rel_residual": float(np.max(np.abs(pred - y) / y)),
    }
    machine = f"{platform.machine()}, {__import__('os').cpu_count()} cores, CPU only"
    RESULTS.mkdir(exist_ok=True)
    suffix = "_quick" if args.quick else ""
    meta = record()
    (RESULTS / f"fem_omd{suffix}.json").write_text(
        json.dumps({"machine": machine, **meta, "fit": fit, "rows": rows}, indent=2)
    )
    lines = [
        f"# FEM-OMD: seconds per time step against C x n ({machine})",
        "",
        f"d = {D}, m = {M}, K = {K} inner rounds, unit covariances; median of {steps} steps, best of 3.",
        "",
        "| C | n | C x n | s/step federated | s/step centralised | ratio | fit a + bC + cCn | bytes up/step "
        "| peak RSS MiB federated / centralised |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['C']} | {r['n']} | {r['Cn']} | {r['s_per_step_federated']:.4f} | "
            f"{r['s_per_step_centralised']:.4f} | {r['ratio']:.1f} | {r['fit']:.4f} | "
            f"{r['bytes_up_per_step']} | {fmt_mib(r['peak_rss_mib_federated'])} / "
            f"{fmt_mib(r['peak_rss_mib_centralised'])} |"
        )
    lines += [
        "",
        f"Least squares: a = {fit['a_s'] * 1e3:.2f} ms, b = {fit['b_s_per_client'] * 1e6:.1f} us per client "
        f"(runtime messages, K + 1 rounds), c = {fit['c_s_per_row'] * 1e6:.2f} us per row; max relative "
        f"residual {fit['max_rel_residual']:.2f}.",
        "The centralised reference is the same step as array operations on the stacked batch (no "
        "messages); the ratio is the price of the federated runtime, mostly per client and round.",
        "",
        f"{rss_note(meta['peak_rss_scope'])} Here: the largest over the 3 repetitions, of all the timed "
        f"steps of one repetition. Written {meta['written']} on {meta['machine_details']}.",
    ]
    (RESULTS / f"fem_omd{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
