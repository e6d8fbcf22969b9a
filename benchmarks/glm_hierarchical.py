"""Hierarchical logistic regression: federated EP (HierarchicalGLM) against pooled NUTS of the same model.

K clients of unequal size (30 to 150 rows, 2 predictors and an intercept, each client's
coefficients drawn around a population mean). In one run: ``HierarchicalGLM`` (compilation
included) and NumPyro NUTS on the pooled rows of the same model (2 chains of 500 warm-up and
1,000 draws, compilation included); then the wall-time ratio and the accuracy the issue
asks for: the largest |mean difference| / NUTS sd over phi = (mu, log tau), the range of sd
ratios, and the largest difference of a client's coefficient means in NUTS sds. Writes
``benchmarks/results/glm_hierarchical.json`` and ``.md``.

    python benchmarks/glm_hierarchical.py [--clients K ...] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from fedstats.data import FederatedData
from fedstats.glm import HierarchicalGLM
from fedstats.glm._design import GLMDesign
from fedstats.glm.reference import pooled_nuts

RESULTS = Path(__file__).parent / "results"


def federation(K, seed):
    rng = np.random.default_rng(seed)
    mu, tau = np.array([-0.3, 0.6, -0.4]), np.array([0.3, 0.1, 0.05])
    Xs, ys = [], []
    for n in rng.integers(30, 150, K):
        X = rng.normal(size=(n, 2))
        th = mu + np.sqrt(tau) * rng.normal(size=3)
        Xs.append(X)
        ys.append(rng.binomial(1, 1 / (1 + np.exp(-(th[0] + X @ th[1:])))).astype(float))
    return FederatedData.from_arrays(Xs, ys)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rows = []
    for K in a.clients:
        data = federation(K, a.seed)
        t0 = time.perf_counter()
        res = HierarchicalGLM("binomial", standardize=False).fit(data, seed=a.seed, progress=False)
        t_ep = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = pooled_nuts(GLMDesign(data, True, {}), "binomial", "logit", hierarchical=True, seed=a.seed)
        t_nuts = time.perf_counter() - t0
        q, phi = res._fitted_q(), ref["phi"]
        client = max(np.max(np.abs(res.client_posterior(c).mean - ref["theta"][:, k].mean(0)) / ref["theta"][:, k].std(0))
                     for k, c in enumerate(data.clients))
        rows.append({"clients": K, "rows": int(sum(data.n_obs.values())), "ep_s": round(t_ep, 2),
                     "nuts_s": round(t_nuts, 2), "nuts_over_ep": round(t_nuts / t_ep, 3), "ep_rounds": res.rounds,
                     "max_phi_diff_sd": round(float(np.max(np.abs(q.mean - phi.mean(0)) / phi.std(0))), 3),
                     "sd_ratio_min": round(float(np.min(q.sd / phi.std(0))), 3),
                     "sd_ratio_max": round(float(np.max(q.sd / phi.std(0))), 3),
                     "max_client_diff_sd": round(float(client), 3)})
        print(rows[-1], flush=True)
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "seed": a.seed}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "glm_hierarchical.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [f"# Hierarchical logistic regression: federated EP against pooled NUTS ({meta['machine']})", "",
             "Wall time with compilation; NUTS: 2 chains x (500 warm-up + 1,000 draws) on the pooled rows. Accuracy "
             "against NUTS: phi = (mu, log tau) mean differences in NUTS sds and sd ratios; client coefficient means.",
             "", "| clients | rows | EP s (rounds) | NUTS s | NUTS / EP | max phi diff / sd | sd ratios | max client diff / sd |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['clients']} | {r['rows']} | {r['ep_s']:.1f} ({r['ep_rounds']}) | {r['nuts_s']:.1f} | "
                     f"{r['nuts_over_ep']:.2f} | {r['max_phi_diff_sd']:.3f} | {r['sd_ratio_min']:.3f}-{r['sd_ratio_max']:.3f} | "
                     f"{r['max_client_diff_sd']:.3f} |")
    (RESULTS / "glm_hierarchical.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
