"""``fedstats demo``: simulate a federation, fit it, and print the fit beside the pooled gold standard."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd


def command(args) -> None:
    """Run the demo (``--seed``)."""
    from ..datasets.synthetic import hm2_federation
    from ..linear import HierarchicalLinearModel
    from ..reference.hierarchical import pooled_nuts

    K, n = 20, 40
    data, truth = hm2_federation(
        n_clients=K, n_obs=n, mu=[1.0, -0.5, 2.0], tau=[0.5, 1.0, 0.3], sigma=0.5, seed=args.seed
    )
    print(
        f"Simulated federation: {K} clients x {n} rows, 3 features; theta_k ~ N(mu, diag tau), "
        "noise sd unknown to the model."
    )
    print("Federated EP (raw rows never leave their client):")
    t0 = time.perf_counter()
    # the simulated data are on unit scale and the pooled reference fits them as they are
    res = HierarchicalLinearModel(fit_intercept=False, standardize=False).fit(data, seed=args.seed, progress=True)
    t_fed = time.perf_counter() - t0
    print("Pooled gold standard: NUTS on all rows of the full hierarchical model ...", flush=True)
    t0 = time.perf_counter()
    ref = pooled_nuts(data, fit_intercept=False, num_warmup=500, num_samples=1000, num_chains=2, seed=args.seed)
    t_pool = time.perf_counter() - t0
    g = res.global_posterior()
    lo, hi = g.credible_interval(0.9)
    rlo, rhi = np.quantile(ref["phi"], [0.05, 0.95], axis=0)
    table = pd.DataFrame(
        {
            "truth": np.r_[truth["mu"], truth["log_tau"]],
            "federated": g.mean,
            "fed 90% CI": [f"[{a:.2f}, {b:.2f}]" for a, b in zip(lo, hi)],
            "pooled": ref["phi"].mean(0),
            "pooled 90% CI": [f"[{a:.2f}, {b:.2f}]" for a, b in zip(rlo, rhi)],
            "|diff|/sd": np.abs(g.mean - ref["phi"].mean(0)) / ref["phi"].std(0),
            "sd ratio": g.sd / ref["phi"].std(0),
        },
        index=g.names,
    )
    with pd.option_context("display.width", 140, "display.float_format", "{:.3f}".format):
        print(table.to_string())
    c = res.communication
    print(
        f"Federated: {res.rounds} rounds, {t_fed:.1f} s, {c.bytes_up / 1e3:.1f} kB up, {c.bytes_down / 1e3:.1f} kB down. "
        f"Pooled NUTS: {t_pool:.1f} s."
    )
