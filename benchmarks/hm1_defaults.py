"""HM1's defaults on data-poor clients (issue 18, item 6): does HM1 ever do worse than each
data-poor client's own least squares?

Federations of K clients in two clusters (coefficients correlated ``rho`` within a cluster,
independent across), a common mean of the coefficients (0 or 2), d = 4 predictors with mean
1, half the clients data-poor (8 rows) and half data-rich (100 rows), noise sd ``sigma``; K = 4
(K <= d) and K = 20 (K > d). For each federation and 20 seeds: coefficient RMSE on the
data-poor clients of

* the default estimate, ``StructuralCovarianceModel().fit(data)`` (``mean`` of
  ``client_summary``: the posterior mean given the EM estimate of Omega, since by default
  every client that can shares its information matrix),
* Algorithm 1's estimate at the model's defaults (``theta``; the column ``estimate``, what
  ``coef`` and ``rmse`` use),
* the oracle posterior mean with the true Omega and noise variance (``PooledOracle``),

each divided by the RMSE of the clients' own least squares (1.0 = no better than alone),
averaged over the seeds, with the standard error of that average; and the run's wall time and peak
resident memory. Writes ``benchmarks/results/hm1_defaults.json`` (``{"machine", ..., "rows": [...]}``;
before the run time was recorded, the file was the list of rows alone) and ``.md``.

    python benchmarks/hm1_defaults.py
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from _measure import fmt_mib, measure, mib, record, rss_note

from fedstats.datasets.synthetic import hm1_clusters
from fedstats.linear import StructuralCovarianceModel
from fedstats.linear.baselines import PooledOracle

OUT = Path(__file__).parent / "results"
SEEDS = 20


def rmse(est, theta, rows):
    return float(np.sqrt(np.mean((est[rows] - theta[rows]) ** 2)))


def main():
    with measure() as m_run:
        rows = study()
    df = pd.DataFrame(rows)
    OUT.mkdir(exist_ok=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, CPU only",
        **record(m_run.scope),
        "seeds": SEEDS,
        "seconds": round(m_run.seconds, 1),
        "peak_rss_mib": mib(m_run),
    }
    (OUT / "hm1_defaults.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [
        f"# HM1 defaults on data-poor clients (coefficient RMSE / own least squares; {SEEDS} seeds)",
        "",
        "d = 4, data-poor clients 8 rows, data-rich 100, two clusters; `StructuralCovarianceModel()` defaults.",
        "",
        "| " + " | ".join(df.columns) + " |",
        "|" + "---|" * len(df.columns),
        *("| " + " | ".join(f"{v:.3g}" for v in r) + " |" for r in df.itertuples(index=False)),
        "",
        f"Worst: default (posterior mean) {df.default.max():.3f}, Algorithm 1 {df.algorithm1.max():.3f}, "
        f"oracle {df.oracle.max():.3f}. Federations where the default exceeds 1.0: "
        + (
            ", ".join(
                f"K={r.K}, rho={r.rho:g}, sigma={r.sigma:g}, mean={r.mean:g} ({r.default:.3f} +- "
                f"{r.default_se:.3f}; oracle {r.oracle:.3f})"
                for r in df[df.default > 1].itertuples()
            )
            or "none"
        )
        + ".",
        "",
        f"Run time {meta['seconds']:.0f} s, peak RSS {fmt_mib(meta['peak_rss_mib'])} MiB ({meta['machine']}). "
        f"{rss_note(meta['peak_rss_scope'])} Written {meta['written']} on {meta['machine_details']}.",
    ]
    (OUT / "hm1_defaults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def study():
    """The table's rows: every federation, averaged over the seeds."""
    rows = []
    for K, rho, sigma, mean in itertools.product((4, 20), (0.0, 0.95), (0.5, 2.0), (0.0, 2.0)):
        ratios = []
        for seed in range(SEEDS):
            data, theta, poor, omega = hm1_clusters(
                n_clients=K, d=4, n_poor=8, n_rich=100, rho=rho, sigma=sigma, mean=mean, seed=seed
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = StructuralCovarianceModel().fit(data, seed=seed)  # the defaults
                oracle = PooledOracle(omega=omega, noise_var=sigma**2).fit(data).theta.T
            ols = np.stack([np.linalg.lstsq(data[c].X, data[c].y, rcond=None)[0] for c in data.clients])
            base = rmse(ols, theta, poor)
            cs = res.client_summary()
            default = np.stack([cs.loc[cs["client"] == c, "mean"].to_numpy() for c in data.clients])
            ratios.append(
                [
                    rmse(default, theta, poor) / base,
                    rmse(res.theta.T, theta, poor) / base,
                    rmse(oracle, theta, poor) / base,
                ]
            )
        r = np.array(ratios)
        a, se = r.mean(axis=0), r.std(axis=0, ddof=1) / np.sqrt(len(r))
        rows.append(
            {
                "K": K,
                "rho": rho,
                "sigma": sigma,
                "mean": mean,
                "default": a[0],
                "default_se": se[0],
                "algorithm1": a[1],
                "oracle": a[2],
                "oracle_se": se[2],
            }
        )
    return rows


if __name__ == "__main__":
    main()
