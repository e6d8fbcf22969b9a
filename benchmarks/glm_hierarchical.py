"""Hierarchical logistic regression: federated EP (HierarchicalGLM) against pooled NUTS of the same model.

K clients of unequal size (30 to 150 rows, 2 predictors and an intercept, each client's
coefficients drawn around a population mean). Each K runs in a fresh process, so that
"first" times include every compilation. In that process: NumPyro NUTS on the pooled rows of
the same model (2 chains of 500 warm-up and 1,000 draws, run one after the other as NumPyro's
default), three times (first, then again: NumPyro recompiles part of its work for a new run;
"again" is the median of the second and third); ``HierarchicalGLM`` with its default tilted
moments (Laplace rounds, then quasi-Monte Carlo importance rounds), four times (first; warm:
the median of the next three, the process's compiled kernels reused, as in every later fit
of data of that shape); then, warm, the other tilted options (importance only; Laplace
only). Medians, because the timings of one run on a shared 2-core machine vary by up to 30%. Accuracy against the first NUTS run
(4,000 draws in all): the largest |mean difference| / NUTS sd over phi = (mu, log tau), the
range of sd ratios, and the largest difference of a client's coefficient means in NUTS sds.
Next to every time, the peak resident memory of that process during those fits (the largest of the
runs a time summarises). Writes ``benchmarks/results/glm_hierarchical.json`` and ``.md``.

    python benchmarks/glm_hierarchical.py [--clients K ...] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
from _measure import fmt_mib, measure, mib, record, rss_note

RESULTS = Path(__file__).parent / "results"
TILTED = ("laplace+importance", "importance", "laplace")


def one(K, seed):
    """Every measurement of one K (run in its own process)."""
    from fedstats.datasets.synthetic import hierarchical_logistic
    from fedstats.glm import HierarchicalGLM
    from fedstats.glm._design import GLMDesign
    from fedstats.reference.glm import pooled_nuts

    data = hierarchical_logistic(K, seed)
    nuts, refs, nuts_peak = [], [], []
    for _ in range(3):
        with measure() as m:
            refs.append(pooled_nuts(GLMDesign(data, True, {}), "binomial", "logit", hierarchical=True, seed=seed))
        nuts.append(m.seconds)
        nuts_peak.append(m.peak_rss_mib)
    nuts_ref = refs[0]
    phi = nuts_ref["phi"]
    row = {
        "clients": K,
        "rows": int(sum(data.n_obs.values())),
        "nuts_first_s": round(nuts[0], 2),
        "nuts_again_s": round(float(np.median(nuts[1:])), 2),
        "peak_rss_mib_nuts_first": mib(nuts_peak[0]),
        "peak_rss_mib_nuts_again": mib(max(nuts_peak[1:])),
        "peak_rss_scope": m.scope,
    }
    for tilted in TILTED:
        times, peaks = [], []
        for _ in range(4 if tilted == TILTED[0] else 1):
            with measure() as m:
                res = HierarchicalGLM("binomial", standardize=False, tilted=tilted).fit(data, seed=seed, progress=False)
            times.append(m.seconds)
            peaks.append(m.peak_rss_mib)
        q = res._fitted_q()
        client = max(
            np.max(
                np.abs(res.client_posterior(c).mean - nuts_ref["theta"][:, k].mean(0)) / nuts_ref["theta"][:, k].std(0)
            )
            for k, c in enumerate(data.clients)
        )
        key = {"laplace+importance": "ep", "importance": "is", "laplace": "laplace"}[tilted]
        if len(times) > 1:
            row[f"{key}_first_s"] = round(times[0], 2)
            row[f"peak_rss_mib_{key}_first"] = mib(peaks[0])
        row.update(
            {
                f"{key}_warm_s": round(float(np.median(times[1:] or times)), 2),
                f"peak_rss_mib_{key}_warm": mib(max(peaks[1:] or peaks)),
                f"{key}_rounds": res.rounds,
                f"{key}_max_phi_diff_sd": round(float(np.max(np.abs(q.mean - phi.mean(0)) / phi.std(0))), 3),
                f"{key}_sd_ratio_min": round(float(np.min(q.sd / phi.std(0))), 3),
                f"{key}_sd_ratio_max": round(float(np.max(q.sd / phi.std(0))), 3),
                f"{key}_max_client_diff_sd": round(float(client), 3),
            }
        )
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: measure one K, print JSON
    a = ap.parse_args(argv)
    if a.one is not None:
        print(json.dumps(one(a.one, a.seed)))
        return
    rows = []
    for K in a.clients:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(K), "--seed", str(a.seed)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "seed": a.seed,
        **record(rows[0].get("peak_rss_scope") if rows else None),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "glm_hierarchical.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# Hierarchical logistic regression: federated EP against pooled NUTS ({meta['machine']})",
        "",
        "Each K in a fresh process. NUTS: 2 chains x (500 warm-up + 1,000 draws) on the pooled rows, one after "
        "the other, first run and again (median of two more runs in the same process). EP: `HierarchicalGLM` "
        "defaults (Laplace rounds, then importance rounds), first fit (every compilation included) and warm "
        "(median of three more fits, compiled kernels reused); the other `tilted=` options warm, one fit each. Ratios: NUTS time / EP time, like for like (first / first, second / warm). Accuracy "
        "against NUTS: phi = (mu, log tau) mean differences in NUTS sds, sd ratios, client coefficient means.",
        "",
        "| clients | rows | tilted | EP s first / warm (rounds) | NUTS s first / again | NUTS / EP first, warm "
        "| max phi diff / sd | sd ratios | max client diff / sd | peak RSS MiB EP first / warm "
        "| NUTS first / again |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for key, name in (("ep", "laplace+importance"), ("is", "importance"), ("laplace", "laplace")):
            first = f"{r[key + '_first_s']:.1f} / " if key + "_first_s" in r else "- / "
            ratio_first = f"{r['nuts_first_s'] / r[key + '_first_s']:.1f}x, " if key + "_first_s" in r else "-, "
            peak_first = fmt_mib(r.get(f"peak_rss_mib_{key}_first")) + " / " if key + "_first_s" in r else "- / "
            lines.append(
                f"| {r['clients']} | {r['rows']} | {name} | {first}{r[key + '_warm_s']:.1f} ({r[key + '_rounds']}) "
                f"| {r['nuts_first_s']:.1f} / {r['nuts_again_s']:.1f} | {ratio_first}"
                f"{r['nuts_again_s'] / r[key + '_warm_s']:.1f}x | {r[key + '_max_phi_diff_sd']:.3f} | "
                f"{r[key + '_sd_ratio_min']:.3f}-{r[key + '_sd_ratio_max']:.3f} | "
                f"{r[key + '_max_client_diff_sd']:.3f} | {peak_first}{fmt_mib(r.get(f'peak_rss_mib_{key}_warm'))} "
                f"| {fmt_mib(r.get('peak_rss_mib_nuts_first'))} / {fmt_mib(r.get('peak_rss_mib_nuts_again'))} |"
            )
    lines += [
        "",
        f"{rss_note(meta['peak_rss_scope'])} Peaks of the process of that K; first / again and warm: the "
        f"largest of the runs the time summarises. Written {meta['written']} on {meta['machine_details']}.",
    ]
    (RESULTS / "glm_hierarchical.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
