"""HM2 and the Bayesian lasso with many predictors, against 4 predictors and pooled NUTS (issue 40, item 7).

The issue's federation: 50 clients x 100 rows, standard normal predictors, theta_k ~ N(mu, 0.5 I),
noise sd 1 (``hm2_federation``), with d = 4 and d = 16 predictors (plus the intercept). In one run:

* HM2 (:class:`~fedstats.linear.HierarchicalLinearModel`) with its defaults at d = 4 and 16
  (and 40, without a reference), each the first fit of its size in the process;
* pooled NUTS of the same model on the same standardised rows (4 chains x 1000 warm-up + 1000
  draws), against which HM2's q(mu, log tau) on the standardised scale is compared: max |mean
  difference| / NUTS sd and the range of sd ratios;
* HM2 at d = 16 with the previous default (importance sampling of all of phi; unless
  ``--no-previous``);
* the lasso (:class:`~fedstats.linear.BayesianLasso`) with its defaults at d = 4 and 16, each
  the first fit of its size (its kernels' compilation included);

then the acceptance's ratios: HM2's time at d = 16 over d = 4 (at most 5), pooled NUTS's over
HM2's at d = 16 (at least 5, with max |mean diff| <= 0.1 sd), the lasso's d = 16 over d = 4 (at
most 10). The machine is shared: the load average before and after is recorded, and the ratios
compare fits of the same run. Writes ``benchmarks/results/many_predictors.json`` and ``.md``
(``many_predictors_quick.*`` with ``--quick``).

    python benchmarks/many_predictors.py [--quick] [--seed S] [--no-previous] [--no-d40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import jax
import numpy as np
from _measure import fmt_mib, measure, mib, record, rss_note, start_jax

from fedstats import FederatedData
from fedstats.datasets.synthetic import hm2_federation
from fedstats.linear import BayesianLasso, HierarchicalLinearModel
from fedstats.reference.hierarchical import pooled_nuts

RESULTS = Path(__file__).parent / "results"


def federation(d: int, K: int, seed: int):
    mu = np.random.default_rng(1).normal(size=d)
    return hm2_federation(n_clients=K, n_obs=100, mu=mu, tau=np.full(d, 0.5), sigma=1.0, seed=seed)[0]


def standardised_rows(data, scaling) -> FederatedData:
    """The rows HM2 fitted: each client's predictors and target on the fit's federated scale."""
    return FederatedData.from_arrays(
        [scaling.transform_X(np.asarray(data[c].X)) for c in data.clients],
        [scaling.transform_y(np.asarray(data[c].y)) for c in data.clients],
        feature_names=list(data.feature_names),
    )


def fit(model, data, seed: int) -> dict:
    """One fit, timed: the result and its record (a warning that it did not converge is kept)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with measure() as m:
            res = model.fit(data, seed=seed, progress=False)
    unconverged = [str(w.message) for w in caught if "did not converge" in str(w.message)]
    rec = {
        "estimator": repr(res.algorithm.estimator),
        "rounds": res.rounds,
        "converged": bool(res.converged),
        "seconds": round(m.seconds, 2),
        "seconds_per_round": round(m.seconds / max(res.rounds, 1), 3),
        "peak_rss_mib": mib(m),
    }
    if unconverged:
        rec["warning"] = unconverged[0][:200]
    return {"result": res, "record": rec}


def against(res, ref) -> dict:
    """HM2's q on the fit's scale against pooled NUTS draws of phi on the same rows."""
    q = res._q()
    rm, rs = ref["phi"].mean(0), ref["phi"].std(0)
    diff, ratio = np.abs(q.mean - rm) / rs, q.sd / rs
    return {
        "max_abs_mean_diff_over_sd": round(float(diff.max()), 3),
        "worst_component": q.names[int(diff.argmax())],
        "max_abs_mean_diff_over_sd_mu": round(float(diff[: res.site.d].max()), 3),
        "max_abs_mean_diff_over_sd_log_tau": round(float(diff[res.site.d :].max()), 3),
        "sd_ratio_min": round(float(ratio.min()), 3),
        "sd_ratio_max": round(float(ratio.max()), 3),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 clients, d = 4 and 8, short NUTS (smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-previous", action="store_true", help="skip HM2 with the previous default (minutes)")
    ap.add_argument("--no-d40", action="store_true", help="skip HM2 with 40 predictors")
    ap.add_argument("--out", help="path stem of the results (default: results/many_predictors[_quick])")
    a = ap.parse_args(argv)
    a.out = a.out or str(RESULTS / ("many_predictors_quick" if a.quick else "many_predictors"))
    K = 20 if a.quick else 50
    small, large = (4, 8) if a.quick else (4, 16)
    nw = 300 if a.quick else 1000
    load_before = os.getloadavg()
    start_jax()
    data = {d: federation(d, K, a.seed) for d in (small, large)}

    # HM2 and the lasso with defaults, each size's first fit in the process, in turn
    hm2 = {d: fit(HierarchicalLinearModel(), data[d], a.seed) for d in (small, large)}
    lasso = {d: fit(BayesianLasso(), data[d], a.seed) for d in (small, large)}
    hm2_40 = None
    if not a.no_d40 and not a.quick:
        hm2_40 = fit(HierarchicalLinearModel(), federation(40, K, a.seed), a.seed)["record"]

    # pooled NUTS of the same model on the rows HM2 fitted (standardised)
    nuts = {}
    for d in (small, large):
        rows = standardised_rows(data[d], hm2[d]["result"].scaling)
        with measure() as m:
            ref = pooled_nuts(rows, num_warmup=nw, num_samples=nw, num_chains=4, seed=a.seed)
        nuts[d] = {"seconds": round(m.seconds, 2), "peak_rss_mib": mib(m), **against(hm2[d]["result"], ref)}
    previous = None
    if not a.no_previous:
        previous = fit(HierarchicalLinearModel(estimator="importance"), data[large], a.seed)["record"]
    load_after = os.getloadavg()

    t = {d: hm2[d]["record"]["seconds"] for d in (small, large)}
    lt = {d: lasso[d]["record"]["seconds"] for d in (small, large)}
    out = {
        "example": f"hm2_federation, K={K} clients x 100 rows, tau 0.5, sigma 1, intercept; d = {small} and {large}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, jax backend {jax.default_backend()}",
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in load_after],
        **record(),
        "hm2": {str(d): hm2[d]["record"] for d in (small, large)},
        "hm2_d40": hm2_40,
        "hm2_previous_default": previous,
        "pooled_nuts": {str(d): {"chains": 4, "warmup": nw, "samples": nw, **nuts[d]} for d in (small, large)},
        "lasso": {str(d): lasso[d]["record"] for d in (small, large)},
        "hm2_time_ratio": round(t[large] / t[small], 2),
        "pooled_nuts_over_hm2": round(nuts[large]["seconds"] / t[large], 2),
        "pooled_nuts_over_hm2_small": round(nuts[small]["seconds"] / t[small], 2),
        "max_abs_mean_diff_over_sd": nuts[large]["max_abs_mean_diff_over_sd"],
        "max_abs_mean_diff_over_sd_small": nuts[small]["max_abs_mean_diff_over_sd"],
        "sd_ratio_min": nuts[large]["sd_ratio_min"],
        "sd_ratio_max": nuts[large]["sd_ratio_max"],
        "lasso_time_ratio": round(lt[large] / lt[small], 2),
    }
    out["acceptance"] = {
        "hm2_time_ratio_at_most_5": out["hm2_time_ratio"] <= 5,
        "pooled_nuts_over_hm2_at_least_5": out["pooled_nuts_over_hm2"] >= 5,
        "max_abs_mean_diff_at_most_0.1_sd": out["max_abs_mean_diff_over_sd"] <= 0.1,
        "lasso_time_ratio_at_most_10": out["lasso_time_ratio"] <= 10,
    }
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(out, indent=2))

    def row(label, r, base=None):
        ratio = "" if base is None else f"{r['seconds'] / base:.2f}"
        conv = "yes" if r["converged"] else "**no**"
        return (
            f"| {label} | {r['estimator'].split('(')[0]} | {r['rounds']} | {conv} | {r['seconds']:.1f} | "
            f"{r['seconds_per_round']:.2f} | {ratio} | {fmt_mib(r['peak_rss_mib'])} |"
        )

    hs, ls = hm2[small]["record"], lasso[small]["record"]
    md = [
        f"# Many predictors: {out['example']}",
        "",
        f"Machine: {out['machine']}; load average (1, 5, 15 min) {out['load_average_before']} before, "
        f"{out['load_average_after']} after (a shared machine: the ratios compare fits of this run).",
        "",
        "| fit | tilted moments | rounds | converged | seconds | seconds / round | time / d = 4 | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|",
        row(f"HM2, defaults, d = {small}", hs, hs["seconds"]),
        row(f"HM2, defaults, d = {large}", hm2[large]["record"], hs["seconds"]),
    ]
    if hm2_40:
        md.append(row("HM2, defaults, d = 40", hm2_40, hs["seconds"]))
    if previous:
        md.append(row(f"HM2, previous default (importance), d = {large}", previous, hs["seconds"]))
    md += [
        row(f"lasso, defaults, d = {small}", ls, ls["seconds"]),
        row(f"lasso, defaults, d = {large}", lasso[large]["record"], ls["seconds"]),
        "",
        "HM2 against pooled NUTS of the same model on the same standardised rows "
        f"(4 x {nw} + {nw}; q(mu, log tau) on the fit's scale):",
        "",
        "| d | pooled NUTS seconds | NUTS time / HM2 time | max \\|mean diff\\| / NUTS sd (mu; log tau) "
        "| HM2 sd / NUTS sd | peak RSS NUTS (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for d in (small, large):
        n = nuts[d]
        md.append(
            f"| {d} | {n['seconds']:.1f} | {n['seconds'] / t[d]:.1f} | {n['max_abs_mean_diff_over_sd']} "
            f"({n['max_abs_mean_diff_over_sd_mu']}; {n['max_abs_mean_diff_over_sd_log_tau']}) | "
            f"{n['sd_ratio_min']} to {n['sd_ratio_max']} | {fmt_mib(n['peak_rss_mib'])} |"
        )
    acc = out["acceptance"]
    md += [
        "",
        "Acceptance (issue 40): "
        f"HM2 time d = {large} / d = {small}: {out['hm2_time_ratio']} (at most 5: {acc['hm2_time_ratio_at_most_5']}); "
        f"pooled NUTS / HM2 at d = {large}: {out['pooled_nuts_over_hm2']} (at least 5: "
        f"{acc['pooled_nuts_over_hm2_at_least_5']}), max |mean diff| {out['max_abs_mean_diff_over_sd']} sd "
        f"(at most 0.1: {acc['max_abs_mean_diff_at_most_0.1_sd']}); lasso time d = {large} / d = {small}: "
        f"{out['lasso_time_ratio']} (at most 10: {acc['lasso_time_ratio_at_most_10']}).",
        "",
        f"{rss_note(out['peak_rss_scope'])} Written {out['written']} on {out['machine_details']}.",
        "",
    ]
    path.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
    return out


if __name__ == "__main__":
    main()
