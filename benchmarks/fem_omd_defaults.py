"""FEM-OMD's default step size and weight floor: which options keep the regret sub-linear?

The issue: with the old defaults (``eta = sqrt(log m / T)``, no weight floor) FEM-OMD on
``MixtureStream(n_clients=50, n=30, d=10, n_components=5, process="fixed")`` from
``means_init = stream.means + 0.3`` (``horizon=500``) has regret 13.5 at t = 95 and 2,932 at
t = 500 (log-log slope 2.05). This sweep runs every option below on the four weight processes
(fixed, iid, switching every 50 steps, adversarial), from shifted starts
``means_init = stream.means + shift`` (shift 0.3 and 1.0 in every coordinate) and several
seeds, T = 500 steps, C = 50 clients, n = 30 rows per client and step, d = 10, m = 5, and
classifies each regret curve with :func:`fedstats.experiments.regret.growth` (log-log slope over
the second half of the grid, ``R_t / t`` decreasing; a run whose regret ends at or below 0,
i.e. better than the best fixed weights in hindsight, which happens under switching weights,
is counted as sub-linear too and flagged).

Options (``eta``, ``weight_floor``, ``horizon`` of :class:`~fedstats.mixture.FEMOMD`):

* ``theory-T, floor 0``: ``eta = sqrt(log m / T)``, no floor (the old default with a horizon);
* ``theory-t, floor 0``: ``eta = sqrt(log m / t)`` (the old default without a horizon);
* ``theory-T, floor 1e-3`` (notebook 06's setting) and ``theory-t, floor 1e-3``: a floor alone;
* ``adaptive, floor 0``: the adaptive step ``eta_t = sqrt(log m / sum_{s<=t} r_s^2)`` (``r_s``
  the range of the client's gradient at step s) alone;
* ``adaptive, floor 1e-3`` and ``adaptive, floor 1/(T+1)``: with a constant floor;
* ``adaptive, floor min(eta,1)/(t+1)``: the new default (``eta="adaptive"``,
  ``weight_floor="auto"``; neither uses the horizon).

The adversarial process reacts to the played weights of one learner, so every option gets its
own adversarial stream; on the other processes all options face the very same data and
evaluation points (one :func:`simulate` call). A second part checks notebook 06's settings
(fixed weights, start within sep/16 of the truth, seeds 1-3, n = 30, 10, 1), where the old
notebook options (``theory-T, floor 1e-3``) are the reference.

Writes ``benchmarks/results/fem_omd_defaults.json`` and ``.md`` (``_quick`` with ``--quick``:
T = 150, one seed, to check that the script runs). Two worker processes; each job (one stream)
records its wall time and the peak resident memory of its worker process.

    python benchmarks/fem_omd_defaults.py [--quick] [--workers 2]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread per worker
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _measure import fmt_mib, measure, mib, record, rss_note  # noqa: E402

from fedstats.experiments.regret import PROCESSES, MixtureStream, growth, simulate  # noqa: E402
from fedstats.mixture import FEMOMD  # noqa: E402

RESULTS = Path(__file__).parent / "results"
C, N, D, M = 50, 30, 10, 5

# name -> FEMOMD options; "T" stands for the horizon of the run
OPTIONS = {
    "theory-T, floor 0": dict(eta=None, weight_floor=0.0, horizon="T"),
    "theory-t, floor 0": dict(eta=None, weight_floor=0.0, horizon=None),
    "theory-T, floor 1e-3": dict(eta=None, weight_floor=1e-3, horizon="T"),
    "theory-t, floor 1e-3": dict(eta=None, weight_floor=1e-3, horizon=None),
    "adaptive, floor 0": dict(eta="adaptive", weight_floor=0.0, horizon="T"),
    "adaptive, floor 1e-3": dict(eta="adaptive", weight_floor=1e-3, horizon="T"),
    "adaptive, floor 1/(T+1)": dict(eta="adaptive", weight_floor="1/(T+1)", horizon="T"),
    "adaptive, floor min(eta,1)/(t+1)": dict(horizon="T"),  # every option default (the horizon is not used)
}
DEFAULT = "adaptive, floor min(eta,1)/(t+1)"  # FEMOMD(m): eta="adaptive", weight_floor="auto"
OLD = "theory-T, floor 1e-3"  # notebook 06's options: the reference of part 2


def _model(name, means_init, T):
    kw = dict(OPTIONS[name])
    kw["horizon"] = T if kw["horizon"] == "T" else None
    if kw.get("weight_floor") == "1/(T+1)":
        kw["weight_floor"] = 1.0 / (T + 1)
    return FEMOMD(M, means_init=means_init, **kw)


def start_near_truth(stream, seed=5):
    """Notebook 06's start: means within sep/16 of the truth (the thesis's Assumption 28)."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(stream.means.shape)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return stream.means + u * stream.min_separation / 16


def run_job(job):
    """One stream (process, start, seed) and the options that face it side by side."""
    with measure() as m:
        rows = _run_job(job)
    for r in rows:
        r.update(job_seconds=round(m.seconds, 2), peak_rss_mib_job=mib(m))
    return rows, m.seconds, mib(m), m.scope


def _run_job(job):
    stream = MixtureStream(n_clients=C, n=job["n"], d=D, n_components=M, process=job["process"], seed=job["seed"])
    start = stream.means + job["shift"] if job["shift"] != "sep/16" else start_near_truth(stream)
    learners = {name: _model(name, start, job["T"]) for name in job["options"]}
    curves, _ = simulate(stream, learners, job["T"], progress=False, seed=job["seed"])
    rows = []
    for name, model in learners.items():
        c = curves[curves.learner == name]
        g = growth(c)
        W = np.array([model.weights_[k] for k in stream.clients])
        rows.append(
            {
                **{k: job[k] for k in ("part", "process", "n", "shift", "seed", "T")},
                "option": name,
                "slope": g["slope"],
                "regret_T": g["regret_T"],
                "ratio_mid": g["ratio_mid"],
                "ratio_T": g["ratio_T"],
                "sublinear_growth": g["sublinear"],
                "sublinear": bool(g["sublinear"] or g["regret_T"] <= 0),
                "min_played_weight": float(W.min()),
                "mean_error": float(np.abs(model.means_ - stream.means).max()),
                "curve": {"t": c.t.tolist(), "regret": [round(r, 4) for r in c.regret]},
            }
        )
    return rows


def jobs_for(quick):
    T = 150 if quick else 500
    seeds = [0] if quick else [0, 1, 2]
    shifts = [0.3, 1.0]
    names = list(OPTIONS)
    jobs = []
    for process in PROCESSES:
        for shift in shifts:
            for seed in seeds:
                base = dict(part="sweep", process=process, n=N, shift=shift, seed=seed, T=T)
                if process == "adversarial":  # the adversary follows the first learner: one stream each
                    jobs += [dict(base, options=[name]) for name in names]
                else:
                    jobs.append(dict(base, options=names))
    ref_seeds = [1] if quick else [1, 2, 3]
    for n in [30] if quick else [30, 10, 1]:
        for seed in ref_seeds:
            jobs.append(
                dict(part="notebook06", process="fixed", n=n, shift="sep/16", seed=seed, T=T, options=[OLD, DEFAULT])
            )
    return sorted(jobs, key=lambda j: -len(j["options"]))  # the long ones first


def _fmt(x, nd=2):
    return "nan" if not np.isfinite(x) else f"{x:.{nd}f}"


def summarise(rows, part, keys):
    out = {}
    for r in rows:
        if r["part"] == part:
            out.setdefault(tuple(r[k] for k in keys), []).append(r)
    summ = {}
    for key, rs in out.items():
        slope = np.array([r["slope"] for r in rs], float)
        R = np.array([r["regret_T"] for r in rs], float)
        summ[key] = {
            "runs": len(rs),
            "sublinear": int(sum(r["sublinear"] for r in rs)),
            "below_comparator": int(sum(r["regret_T"] <= 0 for r in rs)),
            "slope_median": float(np.nanmedian(slope)) if np.isfinite(slope).any() else float("nan"),
            "slope_max": float(np.nanmax(slope)) if np.isfinite(slope).any() else float("nan"),
            "regret_T_median": float(np.median(R)),
            "regret_T_max": float(R.max()),
            "regret_T_mean": float(R.mean()),
        }
    return summ


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T = 150, one seed (smoke run)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    jobs = jobs_for(args.quick)
    t0 = time.perf_counter()
    rows, seconds, peaks, scopes = [], [], [], set()
    with get_context("fork").Pool(args.workers) as pool:
        for k, (r, sec, peak, scope) in enumerate(pool.imap_unordered(run_job, jobs), 1):
            rows += r
            seconds.append(sec)
            peaks.append(peak)
            scopes.add(scope)
            print(
                f"[{k}/{len(jobs)}] {r[0]['part']} {r[0]['process']} n={r[0]['n']} shift={r[0]['shift']} "
                f"seed={r[0]['seed']}: {len(r)} learner(s) in {sec:.0f} s, peak RSS {fmt_mib(peak)} MiB",
                flush=True,
            )
    peak_workers = None if None in peaks else max(peaks)
    wall = time.perf_counter() - t0
    T = jobs[0]["T"]
    sweep = summarise(rows, "sweep", ("option", "process"))
    ref = summarise(rows, "notebook06", ("option", "n"))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, CPU only"
    suffix = "_quick" if args.quick else ""
    RESULTS.mkdir(exist_ok=True)
    blob = {
        "machine": machine,
        **record("process" if "process" in scopes else None),
        "wall_seconds": wall,
        "peak_rss_mib_workers": peak_workers,
        "workers": args.workers,
        "T": T,
        "C": C,
        "n": N,
        "d": D,
        "m": M,
        "options": {k: {kk: (str(vv) if vv is not None else None) for kk, vv in v.items()} for k, v in OPTIONS.items()},
        "default": DEFAULT,
        "summary": [{"option": k[0], "process": k[1], **v} for k, v in sweep.items()],
        "notebook06": [{"option": k[0], "n": k[1], **v} for k, v in ref.items()],
        "runs": rows,
    }
    (RESULTS / f"fem_omd_defaults{suffix}.json").write_text(json.dumps(blob, indent=1))

    seeds = sorted({r["seed"] for r in rows if r["part"] == "sweep"})
    lines = [
        f"# FEM-OMD: default step size and weight floor ({machine})",
        "",
        f"C = {C} clients, n = {N} rows per client and step, d = {D}, m = {M}, K = 5, T = {T}; starts "
        f"`means_init = stream.means + shift`, shift 0.3 and 1.0, seeds {seeds} "
        f"({2 * len(seeds)} runs per cell); 100 evaluation points per client and step. "
        f"{len(jobs)} streams, {len(rows)} learner runs in {wall / 60:.0f} min with {args.workers} worker "
        f"processes (peak RSS of a worker during a job, the largest: {fmt_mib(peak_workers)} MiB) "
        "(`python benchmarks/fem_omd_defaults.py`; `--quick`: T = 150, one seed).",
        "",
        "Cell: median log-log slope (max) / median `R_T` (max) / sub-linear runs. Slope and `R_t / t` as "
        "`growth` computes them; a run whose `R_T <= 0` (better than the best fixed weights in hindsight: "
        "it happens when the weights switch) counts as sub-linear, marked `*k` with k such runs (its slope "
        "comes from the positive prefixes only). theory-T: `eta = sqrt(log m / T)`; theory-t: "
        "`sqrt(log m / t)` (no horizon); adaptive: `eta_t = sqrt(log m / sum_s r_s^2)`, `r_s` the range of "
        "the client's gradient at step s.",
        "",
        "| option | " + " | ".join(PROCESSES) + " |",
        "|---|" + "---|" * len(PROCESSES),
    ]
    for name in OPTIONS:
        cells = []
        for p in PROCESSES:
            s = sweep.get((name, p))
            if s is None:
                cells.append("")
                continue
            star = f" *{s['below_comparator']}" if s["below_comparator"] else ""
            cells.append(
                f"{_fmt(s['slope_median'])} ({_fmt(s['slope_max'])}) / {_fmt(s['regret_T_median'], 1)} "
                f"({_fmt(s['regret_T_max'], 1)}) / {s['sublinear']}/{s['runs']}{star}"
            )
        tag = (
            " **(new default)**"
            if name == DEFAULT
            else (" (old default)" if name in ("theory-T, floor 0", "theory-t, floor 0") else "")
        )
        lines.append(f"| {name}{tag} | " + " | ".join(cells) + " |")
    readme = [
        r for r in rows if r["part"] == "sweep" and r["process"] == "fixed" and r["shift"] == 0.3 and r["seed"] == 0
    ]
    if readme:
        lines += [
            "",
            "The issue's stream (fixed, shift 0.3, seed 0): "
            + "; ".join(f"{r['option']}: `R_T` {r['regret_T']:.1f}, slope {r['slope']:.2f}" for r in readme)
            + ".",
        ]
    lines += [
        "",
        f"## Notebook 06's settings (fixed weights, start within sep/16 of the truth, seeds "
        f"{sorted({r['seed'] for r in rows if r['part'] == 'notebook06'})}, T = {T})",
        "",
        "| option | n | median slope (max) | mean `R_T` (max) | sub-linear runs |",
        "|---|---|---|---|---|",
    ]
    for (name, n), s in sorted(ref.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        lines.append(
            f"| {name} | {n} | {_fmt(s['slope_median'])} ({_fmt(s['slope_max'])}) | "
            f"{_fmt(s['regret_T_mean'], 1)} ({_fmt(s['regret_T_max'], 1)}) | {s['sublinear']}/{s['runs']} |"
        )
    lines += [
        "",
        f"{rss_note(blob['peak_rss_scope'])} Here: of the worker process running a job (one stream). Written "
        f"{blob['written']} on {blob['machine_details']}.",
    ]
    (RESULTS / f"fem_omd_defaults{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
