"""HM1 (Algorithm 1): the federated run against the same iteration on pooled arrays.

For a few federations, in one run (the paper's settings, ``HM1_PAPER`` of
:mod:`fedstats.experiments.linear_paper`, for the paper's federations; the model's defaults,
standardised with an intercept and stopping when converged, for Grunfeld's firms and the
README's example):

* ``fit`` through the federated runtime with the clients' full-batch steps as one batched
  product (the default), and with one client at a time (``batched=False``);
* ``fit_centralized``: the same iteration on stacked arrays with no runtime, which the
  federated fit equals to 1e-12 (``tests/linear/test_structural.py``);

then the rounds run, seconds per round (the fit's one-off exchanges included), the ratios to
the centralised reference, the largest difference of the coefficients (relative to the largest
coefficient), the bytes each client sends and receives per round of Algorithm 1, and the peak
resident memory of each. Writes ``benchmarks/results/hm1.json`` and ``.md`` (``hm1_quick.*`` with ``--quick``).

    python benchmarks/hm1.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
from _measure import fmt_mib, measured, mib, record, rss_note

from fedstats.data import FederatedData
from fedstats.datasets.synthetic import hm1_case
from fedstats.experiments.linear_paper import HM1_PAPER
from fedstats.linear import StructuralCovarianceModel

RESULTS = Path(__file__).parent / "results"
DATA = Path(os.environ.get("FEDSTATS_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def timed(f, repeats=3):
    """The result, the best wall time and the largest peak RSS of ``repeats`` runs."""
    return measured(f, repeats)


def big(K, d=8, n=50, seed=0):
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal((d, K))
    Xs = [rng.standard_normal((n, d)) for _ in range(K)]
    ys = [X @ theta[:, k] + 0.3 * rng.standard_normal(n) for k, X in enumerate(Xs)]
    return FederatedData.from_arrays(Xs, ys)


def readme_example():
    import pandas as pd

    df = pd.read_csv(Path(__file__).resolve().parents[1] / "examples" / "sites.csv")
    return FederatedData.from_dataframe(df, by="site", target="y").train_test_split(0.3, seed=0)[0]


def grunfeld():
    from statsmodels.datasets import grunfeld as g

    return FederatedData.from_dataframe(g.load_pandas().data, by="firm", target="invest", features=["value", "capital"])


def rounds_kind(res) -> dict:
    """The bytes of Algorithm 1's rounds (not of the one-off exchanges)."""
    return res.communication.by_kind["HM1 rounds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small federations only (CI smoke run)")
    a = ap.parse_args()
    paper = dict(HM1_PAPER)
    cases = [
        ("Table 1 Case II (K=100, d=8)", hm1_case("II", seed=0, n_test=1)[0], {**paper, "lr": 1e-3}),
        ("README example (K=6, d=3), defaults", readme_example(), {}),
    ]
    if not a.quick:
        cases.append(("Grunfeld (K=11 firms, d=2), defaults", grunfeld(), {}))
        cases.append(("K=1000, d=8, 50 rows each", big(1000), {**paper, "rounds": 10, "lr": 1e-3}))
        if (DATA / "cmapss" / "train_FD001.txt").is_file():
            from fedstats.datasets import load_cmapss

            train, _ = load_cmapss(DATA, sensor=2)
            cases.append(
                (
                    "FD001 sensor 2 (K=100 engines, d=7)",
                    train,
                    {**paper, "rounds": 100, "lr": 2e-4, "alpha": 0.9, "eig_floor": 1e-2, "init": "zeros"},
                )
            )
    rows = []
    for name, data, opts in cases:
        model = StructuralCovarianceModel(**opts)
        reps = 1 if data.n_clients > 500 else 3
        fed, m_fed = timed(lambda: model.fit(data, seed=0, progress=False, uncertainty=False), reps)
        loop, m_loop = timed(lambda: model.fit(data, seed=0, progress=False, batched=False, uncertainty=False), reps)
        cen, m_cen = timed(lambda: model.fit_centralized(data, seed=0), reps)
        t_fed, t_loop, t_cen = m_fed.seconds, m_loop.seconds, m_cen.seconds
        r = fed.rounds
        assert loop.rounds == r
        rows.append(
            {
                "federation": name,
                "K": data.n_clients,
                "d": data.n_features,
                "rounds": r,
                "seconds_per_round": {
                    "federated_batched": round(t_fed / r, 5),
                    "federated_looped": round(t_loop / r, 5),
                    "centralised": round(t_cen / r, 5),
                },
                "peak_rss_mib": {
                    "federated_batched": mib(m_fed),
                    "federated_looped": mib(m_loop),
                    "centralised": mib(m_cen),
                },
                "federated_over_centralised": round(t_fed / t_cen, 2),
                "looped_over_batched": round(t_loop / t_fed, 2),
                "converged": bool(fed.converged),
                "max_abs_theta_diff": float(np.abs(fed.theta - cen.theta).max() / np.abs(cen.theta).max()),
                "bytes_per_client_per_round": {
                    "down": int(rounds_kind(fed)["bytes_down"] / r / data.n_clients),
                    "up": int(rounds_kind(fed)["bytes_up"] / r / data.n_clients),
                },
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only",
        **record(),
        "note": "best of 3 (1 for K=1000) wall times, initialisation and one-off exchanges included; max "
        "|theta diff| relative to the largest coefficient",
        # other work on the machine inflates the times (and their ratios): the load average after the run
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "results": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "hm1_quick" if a.quick else "hm1"
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=2))
    md = [
        f"# HM1: federated runtime against the same iteration on pooled arrays ({out['machine']})",
        "",
        "| federation | rounds (converged) | s/round federated (batched) | looped | centralised "
        "| federated / centralised "
        "| looped / batched | max \\|theta diff\\| | bytes down / up per client and round "
        "| peak RSS MiB batched / looped / centralised |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["seconds_per_round"]
        md.append(
            f"| {r['federation']} | {r['rounds']} ({'yes' if r['converged'] else 'no'}) "
            f"| {s['federated_batched']:.4f} | {s['federated_looped']:.4f} "
            f"| {s['centralised']:.4f} | {r['federated_over_centralised']} | {r['looped_over_batched']} "
            f"| {r['max_abs_theta_diff']:.1e} | {r['bytes_per_client_per_round']['down']} / "
            f"{r['bytes_per_client_per_round']['up']} | "
            + " / ".join(
                fmt_mib(r["peak_rss_mib"][k]) for k in ("federated_batched", "federated_looped", "centralised")
            )
            + " |"
        )
    md += [
        "",
        out["note"]
        + "; peak RSS: the largest of those runs. Load average (1, 5, 15 minutes) after the run: "
        + ", ".join(f"{v:g}" for v in out["load_average"])
        + f" on {os.cpu_count()} cores (above the core count, other work shared the machine and the times are inflated).",
        "",
        f"{rss_note(out['peak_rss_scope'])} Written {out['written']} on {out['machine_details']}.",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
