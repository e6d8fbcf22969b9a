"""fedstats.survival against the pooled references: CoxPH, Kaplan-Meier and the log-rank test against
lifelines, HierarchicalCox against pooled NUTS of the same model.

The issue's scale: CoxPH at 50 clients x 2,000 rows x 10 covariates within 2x of lifelines'
``CoxPHFitter`` on the pooled rows (continuous times, Efron's ties); also stratified by client
(lifelines with ``strata``), and the Kaplan-Meier curve and the log-rank test of a two-level
group; HierarchicalCox (4 intervals, 3 covariates, 20 clients of 200 rows with a client effect)
against NUTS of the same model on the pooled pieces (500 warm-up draws, 1,000 draws, 2 chains),
each compiled before it is timed. In one run, per case: the pooled reference (the rows concatenated first, not timed) and
the federated call over the clients in process (every exchange counted), each the best of
``--repeats`` runs; then the wall-time ratio federated / pooled, the largest difference from the
reference, the rounds and the bytes sent up per client, and the peak resident memory of each
side. Writes ``benchmarks/results/survival.json`` and ``.md`` (``survival_quick.*`` with ``--quick``).

    python benchmarks/survival.py [--quick] [--repeats R] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from _measure import fmt_mib, measured, mib, record
from lifelines import CoxPHFitter, KaplanMeierFitter
from lifelines.statistics import logrank_test as lifelines_logrank

from fedstats import FederatedData
from fedstats.reference.glm import pooled_nuts
from fedstats.survival import CoxPH, HierarchicalCox, KaplanMeier, logrank_test
from fedstats.survival.simulate import proportional_hazards

RESULTS = Path(__file__).parent / "results"


def coef_diff(frame: pd.DataFrame, kw: dict, res) -> float:
    """The largest coefficient difference from lifelines converged tightly (not timed: the timed
    fit keeps lifelines' default tolerance, 1e-7, which alone moves its coefficients ~1e-6)."""
    tight = CoxPHFitter().fit(frame, "time", "event", fit_options={"precision": 1e-12}, **kw)
    return float(np.max(np.abs(tight.params_.to_numpy() - res.coef)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 clients x 200 rows x 5 covariates (a smoke run)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    K, n, p = (10, 200, 5) if a.quick else (50, 2000, 10)
    fd = proportional_hazards(K, seed=a.seed, rows=n, beta=np.linspace(-0.5, 0.5, p))
    X = {c: np.asarray(fd[c].X) for c in fd.clients}
    arm = {c: (np.arange(len(x)) % 2).astype(float) for c, x in X.items()}
    y = {c: np.asarray(fd[c].y) for c in fd.clients}
    names = [*fd.feature_names[:-1], "event"]
    km_data = FederatedData(
        {c: np.column_stack([arm[c], X[c][:, -1]]) for c in fd.clients}, y, feature_names=["arm", "event"],
        target_name="time", min_rows=1, min_cell_count=1,
    )  # fmt: skip
    df = pd.concat(
        [pd.DataFrame(X[c], columns=names).assign(time=y[c], site=k, arm=arm[c]) for k, c in enumerate(fd.clients)],
        ignore_index=True,
    )
    cox_df = df.drop(columns=["site", "arm"])
    g = df.arm == 0
    cases = {
        "CoxPH, Efron": (
            lambda: CoxPHFitter().fit(cox_df, "time", "event"),
            lambda: CoxPH(event="event").fit(fd, progress=False),
            lambda ref, res: coef_diff(cox_df, {}, res),
        ),
        "CoxPH, stratified by client": (
            lambda: CoxPHFitter().fit(df.drop(columns="arm"), "time", "event", strata=["site"]),
            lambda: CoxPH(event="event", stratify=True).fit(fd, progress=False),
            lambda ref, res: coef_diff(df.drop(columns="arm"), {"strata": ["site"]}, res),
        ),
        "Kaplan-Meier, two groups": (
            lambda: [KaplanMeierFitter().fit(df.time[m], df.event[m]) for m in (g, ~g)],
            lambda: KaplanMeier(event="event", group="arm").fit(km_data),
            lambda ref, res: max(
                float(np.max(np.abs(r.survival_function_.iloc[:, 0].to_numpy() - res.table(k)["survival"].to_numpy())))
                for r, k in zip(ref, (0, 1))
            ),
        ),
        "log-rank test": (
            lambda: lifelines_logrank(df.time[g], df.time[~g], df.event[g], df.event[~g]),
            lambda: logrank_test(km_data, "event", "arm"),
            lambda ref, res: abs(res.statistic - ref.test_statistic) / ref.test_statistic,
        ),
    }
    hK, hn = (6, 60) if a.quick else (20, 200)
    hfd = proportional_hazards(hK, seed=a.seed, rows=hn, beta=(0.5, -0.3, 0.2), client_effect=0.3)
    hmodel = HierarchicalCox(event="event")
    hdesign = hmodel.design(hfd).design
    nuts = {"num_warmup": 500, "num_samples": 1000} if not a.quick else {"num_warmup": 200, "num_samples": 400}
    cases["HierarchicalCox, against pooled NUTS"] = (
        lambda: pooled_nuts(hdesign, "poisson", "log", hierarchical=True, **nuts),
        lambda: hmodel.fit(hfd, progress=False),
        lambda ref, res: float(
            np.max(np.abs(res._fitted_q().mean - ref["phi"].mean(0)) / ref["phi"].std(0))
        ),  # in NUTS posterior sds
    )
    shapes = {"HierarchicalCox, against pooled NUTS": (hK, hn, 3, "pooled NUTS")}
    pooled_nuts(hdesign, "poisson", "log", hierarchical=True, num_warmup=10, num_samples=10)  # compiled first
    hmodel.fit(hfd, progress=False)
    rows = []
    for name, (pooled, federated, diff) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref, m_pool = measured(pooled, a.repeats)
            res, m_fed = measured(federated, a.repeats)
        comm = res.communication
        k_, n_, p_, reference = shapes.get(name, (K, n, p, "lifelines"))
        rows.append(
            {
                "case": name,
                "reference": reference,
                "clients": k_,
                "rows_per_client": n_,
                "covariates": p_,
                "pooled_s": round(m_pool.seconds, 4),
                "federated_s": round(m_fed.seconds, 4),
                "ratio": round(m_fed.seconds / m_pool.seconds, 2),
                "max_diff": float(diff(ref, res)),
                "rounds": int(comm.rounds),
                "bytes_up_per_client": int(comm.bytes_up / k_),
                "peak_rss_mib_pooled": mib(m_pool),
                "peak_rss_mib_federated": mib(m_fed),
            }
        )
        print(rows[-1], flush=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "lifelines": __import__("lifelines").__version__,
        "quick": a.quick,
        "repeats": a.repeats,
        "seed": a.seed,
        **record(),
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "survival_quick" if a.quick else "survival"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# fedstats.survival against the pooled references ({meta['machine']})",
        "",
        f"{K} clients x {n} rows, {p} standard-normal covariates, exponential event and censoring times "
        f"(continuous: about {int(cox_df.event.sum())} distinct event times). Best of {a.repeats} run(s) each; the "
        "federated call runs every client in this process and counts every exchange. Ratio: federated / pooled "
        "wall time (lifelines at its default tolerance); difference: the largest from lifelines (coefficients, "
        "lifelines converged to 1e-12; the curve; the statistic, relative). HierarchicalCox: "
        f"{hK} clients x {hn} rows, 3 covariates, a client effect of sd 0.3, 4 intervals; against NUTS of the "
        "same model on the pooled pieces, both compiled before timing; difference: the largest of (mu, log tau) "
        "in NUTS posterior sds.",
        "",
        "| case | clients x rows x covariates | reference | pooled s | federated s | ratio | max difference "
        "| rounds | MB up per client | peak RSS MiB pooled / federated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['clients']} x {r['rows_per_client']} x {r['covariates']} | {r['reference']} "
            f"| {r['pooled_s']:.3f} | {r['federated_s']:.3f} | {r['ratio']:.2f} | {r['max_diff']:.1e} "
            f"| {r['rounds']} | {r['bytes_up_per_client'] / 1e6:.1f} "
            f"| {fmt_mib(r['peak_rss_mib_pooled'])} / {fmt_mib(r['peak_rss_mib_federated'])} |"
        )
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
