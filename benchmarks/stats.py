"""fedstats.stats against pandas / scipy on the pooled rows: ``describe`` and the classical tests.

The issue's scale: ``describe`` of 20 columns x 50 clients x 1,000 rows in process (target:
under 2 s), overall and per level of a two-level group; and each test on the same federation.
In one run, per case: the pooled reference (pandas ``describe`` / ``groupby().describe()``, a
scipy or statsmodels test; the rows concatenated first, not timed) and the federated call over
the clients in process (every exchange counted), each the best of ``--repeats`` runs; then the
wall-time ratio federated / pooled, the largest difference from the reference, the rounds and
the bytes sent up, and the peak resident memory of each side. Writes
``benchmarks/results/stats.json`` and ``.md`` (``stats_quick.*`` with ``--quick``).

    python benchmarks/stats.py [--quick] [--repeats R] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import pandas as pd
from _measure import fmt_mib, measured, mib, record
from scipy import stats as sps
from statsmodels.stats.contingency_tables import StratifiedTable

from fedstats import FederatedData
from fedstats.stats import anova, chi2_test, correlation, describe, mannwhitneyu, mantel_haenszel, ttest

RESULTS = Path(__file__).parent / "results"
STATS = ["n", "mean", "sd", "q1", "median", "q3"]
PANDAS = ["count", "mean", "std", "25%", "50%", "75%"]


def federation(K: int, n: int, d: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(K):
        X = rng.normal(loc=0.05 * k, size=(n, d)).round(2)  # ties, as measured data have
        part = pd.DataFrame(X, columns=[f"x{j}" for j in range(d)])
        part.insert(0, "site", f"site{k:02d}")
        part["arm"] = rng.choice(["c", "t"], size=n)
        part["grp"] = rng.choice(["a", "b", "c"], size=n)
        part["event"] = (rng.random(n) < 0.2 + 0.1 * (part.arm == "t")).astype(int).astype(str)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def describe_diff(t: pd.DataFrame, ref: pd.DataFrame, label: str, columns: list[str]) -> float:
    ours = np.array([[t.loc[(c, s), label] for s in STATS] for c in columns], dtype=float)
    theirs = ref.loc[PANDAS, columns].to_numpy(dtype=float).T
    return float(np.max(np.abs(ours - theirs) / np.maximum(1.0, np.abs(theirs))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 clients x 200 rows (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    K, n, d = (10, 200, 20) if a.quick else (50, 1000, 20)
    df = federation(K, n, d, a.seed)
    cols = [f"x{j}" for j in range(d)]
    data = FederatedData.from_dataframe(df, by="site")
    c, t = df.x0[df.arm == "c"], df.x0[df.arm == "t"]
    tables = np.dstack([pd.crosstab(p.arm, p.event).to_numpy() for _, p in df.groupby("site")]).astype(float)
    cases = {
        "describe, 20 columns": (
            lambda: df[cols].describe(),
            lambda: describe(data, cols),
            lambda ref, res: describe_diff(res.to_frame(), ref, "overall", cols),
        ),
        "describe, 20 columns by arm": (
            lambda: df.groupby("arm")[cols].describe(),
            lambda: describe(data, cols, by="arm"),
            lambda ref, res: describe_diff(res.to_frame(), ref.loc["t"].unstack().T, "arm = t", cols),
        ),
        "Welch t-test": (
            lambda: sps.ttest_ind(c, t, equal_var=False),
            lambda: ttest(data, "x0", "arm"),
            lambda ref, res: abs(res.p_value - ref.pvalue) + abs(res.statistic - ref.statistic),
        ),
        "one-way ANOVA": (
            lambda: sps.f_oneway(*[df.x0[df.grp == g] for g in "abc"]),
            lambda: anova(data, "x0", "grp"),
            lambda ref, res: abs(res.statistic - ref.statistic),
        ),
        "chi-square, 2 x 3": (
            lambda: sps.chi2_contingency(pd.crosstab(df.arm, df.grp).to_numpy()),
            lambda: chi2_test(data, "arm", "grp"),
            lambda ref, res: abs(res.statistic - ref.statistic),
        ),
        "Mantel-Haenszel, clients as strata": (
            lambda: StratifiedTable(tables).test_null_odds(),
            lambda: mantel_haenszel(data, "arm", "event"),
            lambda ref, res: abs(res.statistic - ref.statistic),
        ),
        "Mann-Whitney U (exact global ranks)": (
            lambda: sps.mannwhitneyu(c, t, method="asymptotic"),
            lambda: mannwhitneyu(data, "x0", "arm"),
            lambda ref, res: abs(res.statistic - ref.statistic) / ref.statistic,
        ),
        "Spearman correlation (exact global ranks)": (
            lambda: sps.spearmanr(df.x0, df.x1),
            lambda: correlation(data, "x0", "x1", method="spearman"),
            lambda ref, res: abs(res.statistic - ref.statistic),
        ),
    }
    rows = []
    for name, (pooled, federated, diff) in cases.items():
        ref, m_pool = measured(pooled, a.repeats)
        res, m_fed = measured(federated, a.repeats)
        comm = res.communication
        rows.append(
            {
                "case": name,
                "clients": K,
                "rows_per_client": n,
                "pooled_s": round(m_pool.seconds, 4),
                "federated_s": round(m_fed.seconds, 4),
                "ratio": round(m_fed.seconds / m_pool.seconds, 2),
                "max_diff": float(diff(ref, res)),
                "rounds": int(comm.rounds),
                "bytes_up_per_client": int(comm.bytes_up / K),
                "peak_rss_mib_pooled": mib(m_pool),
                "peak_rss_mib_federated": mib(m_fed),
            }
        )
        print(rows[-1], flush=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "quick": a.quick,
        "repeats": a.repeats,
        "seed": a.seed,
        **record(),
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "stats_quick" if a.quick else "stats"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# fedstats.stats against pandas and scipy on the pooled rows ({meta['machine']})",
        "",
        f"{K} clients x {n} rows, 20 numeric columns rounded to 2 decimals (ties), a two-level arm, a three-level "
        f"group and a binary event. Best of {a.repeats} runs each; the federated call runs every client in this "
        "process and counts every exchange. Ratio: federated / pooled wall time; difference: the largest from the "
        "reference (relative for describe's cells and U).",
        "",
        "| case | pooled s | federated s | ratio | max difference | rounds | kB up per client "
        "| peak RSS MiB pooled / federated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['pooled_s']:.4f} | {r['federated_s']:.3f} | {r['ratio']:.1f} | {r['max_diff']:.1e} "
            f"| {r['rounds']} | {r['bytes_up_per_client'] / 1e3:.1f} "
            f"| {fmt_mib(r['peak_rss_mib_pooled'])} / {fmt_mib(r['peak_rss_mib_federated'])} |"
        )
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
