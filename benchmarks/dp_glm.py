"""Differentially private FederatedGLM (dp=): coefficient error against epsilon.

50 clients x 200 rows x 3 standard normal predictors, logistic and Poisson, with known
coefficients. For each noise multiplier z (0 = no DP: the plain fit) and each placement of the
noise, ``--seeds`` federations (data and noise seeded together) are fitted with
``FederatedGLM(family, dp=DifferentialPrivacy(z, clip=..., placement=...))`` (6 Newton
rounds and the design check: 7 releases). Reported, averaged over the seeds: the spent epsilon
(delta = 1e-6, RDP); the largest coefficient error against the truth and against the plain
(non-private) fit, each in units of the plain fit's standard errors; the DP noise's standard
deviation over the sampling one (``dp_noise_cov`` against ``cov``); and how often the 95%
intervals with ``include_dp_noise=True`` cover the truth. In process nothing is summed securely,
so with ``placement="client"`` the ledger charges each release with one client's share of the
noise (``z / sqrt(50)``): its epsilon is that of a server reading every reply; under secure
aggregation it is the central one. Each row's fits (and each family's plain fits) are timed, with
their peak resident memory, and so is the whole run. Writes ``benchmarks/results/dp_glm.json`` and
``.md`` (``dp_glm_quick.*`` with ``--quick``).

    python benchmarks/dp_glm.py [--quick] [--seeds S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import numpy as np
from _measure import fmt_mib, measure, mib, record, rss_note

from fedstats.data import FederatedData
from fedstats.glm import FederatedGLM
from fedstats.privacy import DifferentialPrivacy

RESULTS = Path(__file__).parent / "results"
BETA = {"binomial": np.array([-0.5, 1.0, -0.5, 0.25]), "poisson": np.array([0.5, 0.5, -0.3, 0.2])}
#: per-row bounds: logistic rows have w <= 1/4 and |y - mu| < 1, so |x|^2 / 4 and |x| bound
#: them (|x|^2 = 1 + chi2_3, mean 4); Poisson rows are unbounded: the clipping bounds them
CLIP = {
    "binomial": {"n": 1.0, "sum_y": 1.0, "xtwx": 5.0, "score": 4.0},
    "poisson": {"n": 1.0, "sum_y": 10.0, "xtwx": 40.0, "score": 15.0},
}
Z = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)


def federation(family, K, n, seed):
    rng = np.random.default_rng(seed)
    beta = BETA[family]
    Xs = [rng.normal(size=(n, len(beta) - 1)) for _ in range(K)]
    eta = [beta[0] + X @ beta[1:] for X in Xs]
    ys = [rng.binomial(1, 1 / (1 + np.exp(-e))) if family == "binomial" else rng.poisson(np.exp(e)) for e in eta]
    return FederatedData.from_arrays(Xs, [y.astype(float) for y in ys])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 clients, 2 seeds (a smoke run)")
    ap.add_argument("--seeds", type=int, default=20)
    a = ap.parse_args(argv)
    K, n = (10, 200) if a.quick else (50, 200)
    seeds = 2 if a.quick else a.seeds
    rows, plain_fits = [], {}
    with measure() as m_run:
        for family in ("binomial", "poisson"):
            rows += family_rows(family, K, n, seeds, plain_fits)
    seconds = m_run.seconds
    meta = {
        "clients": K,
        "rows_per_client": n,
        "predictors": 3,
        "seeds": seeds,
        "dp_rounds": 6,
        "delta": 1e-6,
        "accountant": "rdp",
        "clip": CLIP,
        "truth": {k: v.tolist() for k, v in BETA.items()},
        "seconds": round(seconds, 1),
        "peak_rss_mib": mib(m_run),
        "plain_fits": plain_fits,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        **record(m_run.scope),
    }
    stem = "dp_glm_quick" if a.quick else "dp_glm"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    md = [
        f"# Differentially private FederatedGLM: coefficient error against epsilon ({meta['machine']})",
        "",
        f"{K} clients x {n} rows x 3 standard normal predictors, known coefficients; {seeds} seeds "
        "(data and noise) per row of the table, averaged. `dp=DifferentialPrivacy(z, clip=...)` with "
        f"per-key bounds {CLIP['binomial']} (logistic) and {CLIP['poisson']} (Poisson); 6 Newton rounds "
        "plus the design check: 7 releases; epsilon at delta = 1e-6 (RDP). Errors are the largest "
        "coefficient error in units of the plain fit's standard errors; `dp sd / se`: the DP noise's "
        "standard deviation over the sampling one (mean over coefficients); coverage: the 95% intervals "
        "with `include_dp_noise=True` (all coefficients, all seeds). In process nothing is summed "
        "securely: with client placement the ledger charges one client's share of the noise (z / sqrt(K)), "
        "so its epsilon is what a server reading every reply would face; under secure aggregation it "
        "equals the central row's. Seconds and peak RSS: the row's fits, all seeds (the plain rows: the "
        "family's plain fits).",
        "",
        "| family | placement | z | epsilon | max err vs truth / se | max err vs plain / se | dp sd / se | coverage "
        "| seconds | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['family']} | {r['placement']} | {r['noise_multiplier']:g} | {r['epsilon']:.3g} | "
            f"{r['max_err_truth_over_se']:.2f} | {r['max_err_plain_over_se']:.2f} | {r['dp_sd_over_se']:.2f} | "
            f"{r['coverage_95']:.2f} | {r['seconds']:.1f} | {fmt_mib(r['peak_rss_mib'])} |"
        )
    md += [
        "",
        f"Run time {seconds:.0f} s, peak RSS {fmt_mib(meta['peak_rss_mib'])} MiB.",
        "",
        f"{rss_note(meta['peak_rss_scope'])} Written {meta['written']} on {meta['machine_details']}.",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


def family_rows(family, K, n, seeds, plain_fits):
    """The table's rows of one family; its plain fits' time and peak into ``plain_fits``."""
    rows = []
    beta = BETA[family]
    datasets = [federation(family, K, n, 1000 + s) for s in range(seeds)]
    with measure() as m_plain:
        plains = [FederatedGLM(family).fit(d, progress=False) for d in datasets]
    plain_fits[family] = {"seconds": round(m_plain.seconds, 2), "peak_rss_mib": mib(m_plain)}
    for placement in ("central", "client"):
        for z in Z:
            if z == 0.0 and placement == "client":
                continue  # the no-DP row once per family
            with measure() as m_row:
                eps, err_truth, err_plain, ratio, cover, floored = [], [], [], [], [], 0
                for s, (data, plain) in enumerate(zip(datasets, plains)):
                    se = np.sqrt(np.diag(plain.cov))
                    if z == 0.0:
                        res, e = plain, float("inf")
                        dp_sd = np.zeros_like(se)
                        ci = plain.conf_int().to_numpy()
                    else:
                        dp = DifferentialPrivacy(z, clip=CLIP[family], placement=placement)
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            res = FederatedGLM(family, dp=dp, include_dp_noise=True).fit(data, seed=s, progress=False)
                        e = res.privacy.epsilon
                        dp_sd = np.sqrt(np.diag(res.dp_noise_cov))
                        ci = res.conf_int().to_numpy()
                        floored += sum(res.dp_repairs["information_eigenvalues_raised"]) > 0
                    eps.append(e)
                    err_truth.append(float(np.max(np.abs(res.coef - beta) / se)))
                    err_plain.append(float(np.max(np.abs(res.coef - plain.coef) / se)))
                    ratio.append(float(np.mean(dp_sd / se)))
                    cover.append(float(np.mean((ci[:, 0] <= beta) & (beta <= ci[:, 1]))))
            m = m_plain if z == 0.0 else m_row  # the plain row's fits are the plain fits
            rows.append(
                {
                    "family": family,
                    "placement": "none (plain fit)" if z == 0.0 else placement,
                    "noise_multiplier": z,
                    "epsilon": float(np.mean(eps)),
                    "max_err_truth_over_se": round(float(np.mean(err_truth)), 3),
                    "max_err_plain_over_se": round(float(np.mean(err_plain)), 3),
                    "dp_sd_over_se": round(float(np.mean(ratio)), 3),
                    "coverage_95": round(float(np.mean(cover)), 3),
                    "fits_with_information_repaired": int(floored),
                    "seconds": round(m.seconds, 2),
                    "peak_rss_mib": mib(m),
                }
            )
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
