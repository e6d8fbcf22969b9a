"""Federated IRLS (FederatedGLM) against statsmodels' GLM on the pooled rows.

The issue's scale: 50 clients x 20,000 rows x 20 predictors, logistic and Poisson. In one run,
per family: statsmodels ``GLM(...).fit()`` on the pooled rows (the rows concatenated first,
not timed) and ``FederatedGLM(...).fit`` over the clients in process (every exchange
counted), each the best of ``--repeats`` runs; then the wall-time ratio federated / pooled,
the largest differences in coefficients, standard errors and deviance, the rounds against
statsmodels' iterations, the bytes sent up, and the peak resident memory of each side (the largest
over its runs). Writes ``benchmarks/results/glm.json`` and ``.md`` (``glm_quick.*`` with
``--quick``).

    python benchmarks/glm.py [--quick] [--repeats R] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import numpy as np
import statsmodels.api as sm
from _measure import fmt_mib, measured, mib, record, rss_note

from fedstats.data import FederatedData
from fedstats.glm import FederatedGLM

RESULTS = Path(__file__).parent / "results"


def federation(family, K, n, d, seed):
    rng = np.random.default_rng(seed)
    beta = rng.normal(scale=0.3, size=d) / np.sqrt(d / 4)
    Xs, ys = [], []
    for _ in range(K):
        X = rng.normal(size=(n, d))
        eta = -0.5 + X @ beta
        y = rng.binomial(1, 1 / (1 + np.exp(-eta))) if family == "binomial" else rng.poisson(np.exp(eta))
        Xs.append(X)
        ys.append(y.astype(float))
    return Xs, ys


def best(f, repeats):
    """The result, the best wall time and the largest peak RSS of ``repeats`` runs."""
    return measured(f, repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 clients x 2,000 rows (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    K, n, d = (10, 2000, 20) if a.quick else (50, 20_000, 20)
    rows = []
    for family in ("binomial", "poisson"):
        Xs, ys = federation(family, K, n, d, a.seed)
        data = FederatedData.from_arrays(Xs, ys)
        X, y = sm.add_constant(np.vstack(Xs)), np.concatenate(ys)
        fam = sm.families.Binomial() if family == "binomial" else sm.families.Poisson()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref, m_pool = best(lambda: sm.GLM(y, X, family=fam).fit(), a.repeats)
        res, m_fed = best(lambda: FederatedGLM(family).fit(data, progress=False), a.repeats)
        t_pool, t_fed = m_pool.seconds, m_fed.seconds
        rows.append(
            {
                "family": family,
                "clients": K,
                "rows_per_client": n,
                "predictors": d,
                "pooled_s": round(t_pool, 3),
                "federated_s": round(t_fed, 3),
                "peak_rss_mib_pooled": mib(m_pool),
                "peak_rss_mib_federated": mib(m_fed),
                "ratio": round(t_fed / t_pool, 3),
                "max_abs_coef_diff": float(np.max(np.abs(res.params.to_numpy() - ref.params))),
                "max_abs_se_diff": float(np.max(np.abs(res.bse.to_numpy() - ref.bse))),
                "abs_deviance_diff": float(abs(res.deviance - ref.deviance)),
                "rounds": res.rounds,
                "statsmodels_iterations": int(ref.fit_history["iteration"]),
                "bytes_up": int(res.communication.bytes_up),
            }
        )
        print(rows[-1], flush=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "statsmodels": sm.__version__ if hasattr(sm, "__version__") else __import__("statsmodels").__version__,
        "quick": a.quick,
        "repeats": a.repeats,
        "seed": a.seed,
        **record(),
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "glm_quick" if a.quick else "glm"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# Federated IRLS against statsmodels on the pooled rows ({meta['machine']})",
        "",
        "Best of %d runs each; the federated fit runs every client in this process and counts every "
        "exchange. Ratio: federated / pooled wall time." % a.repeats,
        "",
        "| family | clients x rows x predictors | pooled s | federated s | ratio | max coef diff | max se diff "
        "| rounds / sm iterations | MB up | peak RSS MiB pooled / federated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['clients']} x {r['rows_per_client']} x {r['predictors']} | "
            f"{r['pooled_s']:.2f} | {r['federated_s']:.2f} | {r['ratio']:.2f} | {r['max_abs_coef_diff']:.1e} | "
            f"{r['max_abs_se_diff']:.1e} | {r['rounds']} / {r['statsmodels_iterations']} | "
            f"{r['bytes_up'] / 1e6:.2f} | {fmt_mib(r['peak_rss_mib_pooled'])} / {fmt_mib(r['peak_rss_mib_federated'])} |"
        )
    lines += [
        "",
        f"{rss_note(meta['peak_rss_scope'])} Both include the pooled rows, built before either fit. "
        f"Written {meta['written']} on {meta['machine_details']}.",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
