"""Federated EP against pooled NUTS on the paper's HM2 uncertainty example (spec §4.2).

K = 100 clients, d = 4, 100 points each, phi = (mu, log tau_1..4). In one run:

* federated EP with the defaults (Rao-Blackwellised tilted moments: mu integrated in
  closed form, log tau importance-sampled; numpy, nothing compiled), twice,
* federated EP with importance-sampled moments of all of phi (the previous default, two
  compiled kernels), and with NUTS moments (unless ``--no-nuts``), and
* NumPyro NUTS on the full hierarchical model with all rows pooled (4 chains x 1000
  warm-up x 1000 draws), the gold standard,

then the wall-time ratio (compilation included on both sides) and the accuracy of EP
against NUTS: max |mean difference| / NUTS sd, the range of sd ratios, and whether the
true phi lies in the 90% intervals, and the peak resident memory of each fit. Writes
``benchmarks/results/ep_vs_pooled.json`` and ``.md`` (``ep_vs_pooled_quick.*`` with ``--quick``).

    python benchmarks/ep_vs_pooled.py [--quick] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import jax
import numpy as np
from _measure import fmt_mib, measure, mib, record, rss_note, start_jax

from fedstats.datasets.synthetic import hm2_federation
from fedstats.linear import HierarchicalLinearModel
from fedstats.reference.hierarchical import pooled_nuts

RESULTS = Path(__file__).parent / "results"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="K = 20 and fewer draws (CI smoke run)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-nuts", action="store_true", help="skip EP with NUTS tilted moments (slow)")
    ap.add_argument("--out", help="path stem of the results (default: results/ep_vs_pooled[_quick])")
    a = ap.parse_args(argv)
    a.out = a.out or str(RESULTS / ("ep_vs_pooled_quick" if a.quick else "ep_vs_pooled"))
    K = 20 if a.quick else 100
    data, truth = hm2_federation(n_clients=K, n_obs=100, sigma=0.05, seed=a.seed)
    sigma = 0.05

    model = HierarchicalLinearModel(fit_intercept=False, sigma=sigma, standardize=False)
    start_jax()
    with measure() as m_ep:  # the first fit in this process: compilation included
        res = model.fit(data, seed=a.seed)
    t_ep = m_ep.seconds
    with measure() as m_warm:  # the same fit again (kernels a fit compiles would be reused)
        model.fit(data, seed=a.seed)
    t_warm = m_warm.seconds
    # EP's Monte Carlo error: the same fit with the next seeds (compared with NUTS below)
    others = [model.fit(data, seed=a.seed + k) for k in (1, 2)]

    # the previous default (importance sampling of all of phi from a Laplace proposal; two
    # compiled kernels), first fit in this process: compilation included
    with measure() as m_imp:
        res_imp = HierarchicalLinearModel(
            fit_intercept=False, sigma=sigma, standardize=False, estimator="importance", tol=0.1
        ).fit(data, seed=a.seed)
    t_imp = m_imp.seconds

    nw, ns = (300, 500) if a.quick else (1000, 1000)
    with measure() as m_nuts:
        ref = pooled_nuts(
            data, sigma=sigma, fit_intercept=False, num_warmup=nw, num_samples=ns, num_chains=4, seed=a.seed
        )
    t_nuts = m_nuts.seconds

    g = res.global_posterior()
    rm, rs = ref["phi"].mean(0), ref["phi"].std(0)
    lo, hi = g.credible_interval(0.9)
    rlo, rhi = np.quantile(ref["phi"], [0.05, 0.95], axis=0)
    tv = np.r_[truth["mu"], truth["log_tau"]]
    gi = res_imp.global_posterior()
    importance = {
        "estimator": repr(res_imp.algorithm.estimator),
        "tol": 0.1,
        "rounds": res_imp.rounds,
        "seconds": round(t_imp, 2),
        "peak_rss_mib": mib(m_imp),
        "max_abs_mean_diff_over_sd": round(float(np.max(np.abs(gi.mean - rm) / rs)), 3),
        "sd_ratio_min": round(float(np.min(gi.sd / rs)), 3),
        "sd_ratio_max": round(float(np.max(gi.sd / rs)), 3),
    }
    nuts = None
    if not a.no_nuts:
        with measure() as m_n:
            rn = HierarchicalLinearModel(
                fit_intercept=False,
                sigma=sigma,
                standardize=False,
                estimator="nuts",
                rounds=10,
                estimator_options=dict(num_warmup=200, num_samples=500, num_chains=2, target="augmented"),
            ).fit(data, seed=a.seed)
        t_n = m_n.seconds
        gn = rn.global_posterior()
        nlo, nhi = gn.credible_interval(0.9)
        nuts = {
            "estimator": repr(rn.algorithm.estimator),
            "damping": rn.algorithm.damping,
            "rounds": rn.rounds,
            "seconds": round(t_n, 2),
            "peak_rss_mib": mib(m_n),
            "speedup_pooled_over_ep_nuts": round(t_nuts / t_n, 2),
            "max_abs_mean_diff_over_sd": round(float(np.max(np.abs(gn.mean - rm) / rs)), 3),
            "sd_ratio_min": round(float(np.min(gn.sd / rs)), 3),
            "sd_ratio_max": round(float(np.max(gn.sd / rs)), 3),
            "truth_in_90": [bool(v) for v in (nlo <= tv) & (tv <= nhi)],
        }
    out = {
        "example": f"HM2 uncertainty example, K={K}, d=4, n=100 per client, sigma={sigma} known",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, jax backend {jax.default_backend()}",
        **record(m_ep.scope),
        "ep": {
            "estimator": repr(res.algorithm.estimator),
            "damping": res.algorithm.damping,
            "rounds": res.rounds,
            "seconds": round(t_ep, 2),
            "seconds_warm": round(t_warm, 2),
            "peak_rss_mib_warm": mib(m_warm),
            "peak_rss_mib": mib(m_ep),
            "bytes_up": res.communication.bytes_up,
            "bytes_down": res.communication.bytes_down,
        },
        "pooled_nuts": {
            "chains": 4,
            "warmup": nw,
            "samples": ns,
            "seconds": round(t_nuts, 2),
            "peak_rss_mib": mib(m_nuts),
        },
        "speedup_pooled_over_ep": round(t_nuts / t_ep, 2),
        "speedup_pooled_over_ep_warm": round(t_nuts / t_warm, 2),
        "max_abs_mean_diff_over_sd_other_seeds": [
            round(float(np.max(np.abs(o.global_posterior().mean - rm) / rs)), 3) for o in others
        ],
        "max_abs_mean_diff_over_sd": round(float(np.max(np.abs(g.mean - rm) / rs)), 3),
        "sd_ratio_min": round(float(np.min(g.sd / rs)), 3),
        "sd_ratio_max": round(float(np.max(g.sd / rs)), 3),
        "truth_in_ep_90": [bool(v) for v in (lo <= tv) & (tv <= hi)],
        "truth_in_pooled_nuts_90": [bool(v) for v in (rlo <= tv) & (tv <= rhi)],
        "ep_importance": importance,
        "ep_nuts": nuts,
        "per_component": {
            n: {"truth": float(t), "ep_mean": float(m), "ep_sd": float(s), "nuts_mean": float(r), "nuts_sd": float(q)}
            for n, t, m, s, r, q in zip(g.names, tv, g.mean, g.sd, rm, rs)
        },
    }
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(out, indent=2))
    md = [
        f"# EP vs pooled NUTS: {out['example']}",
        "",
        f"Machine: {out['machine']}.",
        "",
        "| method | seconds | time / federated EP | peak RSS (MiB) |",
        "|---|---|---|---|",
        f"| federated EP, default: Rao-Blackwellised moments ({res.rounds} rounds), first fit | {t_ep:.1f} | 1 | "
        f"{fmt_mib(mib(m_ep))} |",
        f"| federated EP, the same fit again | {t_warm:.1f} | {t_warm / t_ep:.2f} | {fmt_mib(mib(m_warm))} |",
        f"| pooled NUTS (4 x {nw}+{ns}) | {t_nuts:.1f} | {t_nuts / t_ep:.1f} | {fmt_mib(mib(m_nuts))} |",
        f"| federated EP, importance moments (the previous default, tol 0.1; {res_imp.rounds} rounds), "
        f"compilation included | {t_imp:.1f} | {t_imp / t_ep:.1f} | {fmt_mib(mib(m_imp))} |",
    ]
    if nuts:
        md.append(
            f"| federated EP, NUTS tilted moments ({nuts['rounds']} rounds) | {nuts['seconds']:.1f} | "
            f"{nuts['seconds'] / t_ep:.1f} | {fmt_mib(nuts['peak_rss_mib'])} |"
        )
    md += [
        "",
        "Accuracy against pooled NUTS (max |mean diff| / sd; sd ratio range):",
        f"- EP, default ({out['ep']['estimator']}): {out['max_abs_mean_diff_over_sd']}; "
        f"[{out['sd_ratio_min']}, {out['sd_ratio_max']}] "
        f"(max |mean diff| / sd with seeds {a.seed + 1} and {a.seed + 2}: "
        f"{', '.join(map(str, out['max_abs_mean_diff_over_sd_other_seeds']))})",
        f"- EP, importance (previous default): {importance['max_abs_mean_diff_over_sd']}; "
        f"[{importance['sd_ratio_min']}, {importance['sd_ratio_max']}]",
    ]
    if nuts:
        md.append(f"- EP, NUTS: {nuts['max_abs_mean_diff_over_sd']}; [{nuts['sd_ratio_min']}, {nuts['sd_ratio_max']}]")
    md += [
        "",
        f"True phi inside the 90% intervals: EP {sum(out['truth_in_ep_90'])}/8, "
        f"pooled NUTS {sum(out['truth_in_pooled_nuts_90'])}/8"
        + (f", EP-NUTS {sum(nuts['truth_in_90'])}/8" if nuts else "")
        + ".",
        "",
        f"{rss_note(out['peak_rss_scope'])} Written {out['written']} on {out['machine_details']}.",
        "",
    ]
    path.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
    return out


if __name__ == "__main__":
    main()
