"""HM1's defaults on data-poor clients (issue 18, item 6; issue 40, item 4): does HM1 do worse
than each data-poor client's own least squares, and do its intervals hold their level?

Part 1, ``hm1_clusters`` (unit-scale predictors with mean 1, no intercept in the truth):
federations of K clients in two clusters (coefficients correlated ``rho`` within a cluster,
independent across), a common mean of the coefficients (0 or 2), d = 4 predictors, half the
clients data-poor (8 rows) and half data-rich (100 rows), noise sd ``sigma``; K = 4 (K <= d) and
K = 20 (K > d). For each federation and 20 seeds: the RMSE of the d slopes on the data-poor
clients of

* the default estimate, ``StructuralCovarianceModel().fit(data)`` (``mean`` of
  ``client_summary``: the posterior mean; the defaults standardise and fit an intercept),
* Algorithm 1's estimate at the model's defaults (``theta``; the column ``estimate``, what
  ``coef`` and ``rmse`` use),
* the oracle posterior mean with the true Omega and noise variance and no intercept
  (``PooledOracle``),

each divided by the RMSE of the clients' own least squares with an intercept (1.0 = no better
than alone), averaged over the seeds, with the standard error of that average; and whether every
default fit converged without a warning.

Part 2, the issue's held-out federation in natural units (``natural_clusters`` of
``tests/linear/test_hm1_natural_units.py``: 20 sites in two clusters of correlation 0.95, half
with 8 rows for 4 coefficients, feature sds 1e-3 to 1e4, noise sd 0.5 or 2 on the standardised
scale; 40 seeds): the coverage of the data-poor sites' coefficients by 90% intervals and the
RMSE of their coefficients (each divided by its population scale) over that of their own least
squares, for the defaults, the defaults with plugged-in noise variances
(``noise_variance="plug-in"``), the paper's algorithm in the data's units with an intercept (the
fit the issue measured), and the oracle posterior with the true covariance between sites,
common mean and noise on the population's standardised scale.

Writes ``benchmarks/results/hm1_defaults.json`` (``{"machine", ..., "rows": [...],
"natural": [...]}``) and ``.md``.

    python benchmarks/hm1_defaults.py
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import platform
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from _measure import fmt_mib, measure, mib, record, rss_note

from fedstats.datasets.synthetic import hm1_clusters
from fedstats.linear import StructuralCovarianceModel
from fedstats.linear.baselines import PooledOracle
from fedstats.linear.hm1_posterior import conditional_posterior

OUT = Path(__file__).parent / "results"
SEEDS = 20
NATURAL_SEEDS = 40
#: the fit the issue measured: the paper's algorithm (its defaults before issue 40) in the data's units
BEFORE = {"rounds": 30, "alpha": 0.1, "eig_floor": 0.0, "stop_early": False, "standardize": False}


def _natural_clusters():
    """The simulator of the natural-units tests (one definition for the tests and this study)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "linear" / "test_hm1_natural_units.py"
    spec = importlib.util.spec_from_file_location("_hm1_natural_units", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.natural_clusters


def rmse(est, theta, rows):
    return float(np.sqrt(np.mean((est[rows] - theta[rows]) ** 2)))


def own_least_squares(data):
    return np.stack(
        [np.linalg.lstsq(np.c_[np.ones(data[c].n), data[c].X], data[c].y, rcond=None)[0] for c in data.clients]
    )


def main():
    with measure() as m_run:
        rows = study()
        natural = natural_study()
    df, nat = pd.DataFrame(rows), pd.DataFrame(natural)
    OUT.mkdir(exist_ok=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, CPU only",
        **record(m_run.scope),
        "seeds": SEEDS,
        "natural_seeds": NATURAL_SEEDS,
        "seconds": round(m_run.seconds, 1),
        "peak_rss_mib": mib(m_run),
    }
    (OUT / "hm1_defaults.json").write_text(json.dumps({**meta, "rows": rows, "natural": natural}, indent=1))
    shown = df.drop(columns=["converged"])
    lines = [
        f"# HM1 defaults on data-poor clients ({SEEDS} seeds; {NATURAL_SEEDS} in natural units)",
        "",
        "## Slopes' RMSE / own least squares (with an intercept)",
        "",
        "d = 4, data-poor clients 8 rows, data-rich 100, two clusters; `StructuralCovarianceModel()` defaults "
        f"(standardised, with an intercept); every default fit converged without a warning: {bool(df.converged.all())}.",
        "",
        "| " + " | ".join(shown.columns) + " |",
        "|" + "---|" * len(shown.columns),
        *("| " + " | ".join(f"{v:.3g}" for v in r) + " |" for r in shown.itertuples(index=False)),
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
        "## The issue's held-out federation in natural units",
        "",
        "20 sites in two clusters (correlation 0.95), half with 8 rows for 4 coefficients, feature sds 1e-3 to "
        "1e4; 90% intervals; coefficients' RMSE (each in units of its population scale) over the data-poor "
        "sites' own least squares; in brackets the standard error over the seeds.",
        "",
        "| noise sd | fit | coverage (data-poor) | coverage (all) | RMSE / own least squares | converged |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.sigma:g} | {r.fit} | {r.coverage_poor:.3f} | {r.coverage:.3f} | {r.ratio:.3f} ({r.ratio_se:.3f}) "
            f"| {r.converged:.2f} |"
            for r in nat.itertuples()
        ),
        "",
        f"Run time {meta['seconds']:.0f} s, peak RSS {fmt_mib(meta['peak_rss_mib'])} MiB ({meta['machine']}). "
        f"{rss_note(meta['peak_rss_scope'])} Written {meta['written']} on {meta['machine_details']}.",
    ]
    (OUT / "hm1_defaults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def study():
    """Part 1's rows: every federation, averaged over the seeds."""
    rows = []
    for K, rho, sigma, mean in itertools.product((4, 20), (0.0, 0.95), (0.5, 2.0), (0.0, 2.0)):
        ratios, converged = [], True
        for seed in range(SEEDS):
            data, theta, poor, omega = hm1_clusters(
                n_clients=K, d=4, n_poor=8, n_rich=100, rho=rho, sigma=sigma, mean=mean, seed=seed
            )
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                res = StructuralCovarianceModel().fit(data, seed=seed)  # the defaults
            converged &= res.converged and not caught
            oracle = PooledOracle(omega=omega, noise_var=sigma**2).fit(data).theta.T
            base = rmse(own_least_squares(data)[:, 1:], theta, poor)
            ratios.append(
                [
                    rmse(res.posterior_mean[:, 1:], theta, poor) / base,
                    rmse(res.theta.T[:, 1:], theta, poor) / base,
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
                "converged": bool(converged),
            }
        )
        print(rows[-1], flush=True)
    return rows


def natural_oracle(data, truth, sigma):
    """The posterior of every site's coefficients (data's scale) that knows the population's
    scale, the common mean, the covariance between sites and the noise sd."""
    m, s, m_y, s_y, mu = truth["m"], truth["s"], truth["m_y"], truth["s_y"], truth["mu"]
    info, score = [], []
    for c in data.clients:
        X = np.c_[np.ones(data[c].n), (data[c].X - m) / s]
        y = (data[c].y - m_y) / s_y - X @ mu
        info.append(X.T @ X / sigma**2)
        score.append(X.T @ y / sigma**2)
    mean, cov = conditional_posterior(truth["omega"], np.stack(info), np.stack(score))
    d = len(s)
    A = np.zeros((d + 1, d + 1))
    A[0, 0], A[0, 1:], A[1:, 1:] = s_y, -s_y * m / s, np.diag(s_y / s)
    return (mean + mu) @ A.T + np.r_[m_y, np.zeros(d)], np.einsum("ij,kjl,ml->kim", A, cov, A)


def natural_study():
    """Part 2's rows: per noise sd and fit, coverage and RMSE ratio over the seeds."""
    natural_clusters = _natural_clusters()
    fits = {
        "defaults": {},
        "defaults, noise plugged in": {"noise_variance": "plug-in"},
        "before: the data's units": {**BEFORE, "noise_variance": "plug-in"},
    }
    rows = []
    for sigma in (0.5, 2.0):
        out: dict[str, list] = {name: [] for name in [*fits, "oracle"]}
        for seed in range(NATURAL_SEEDS):
            data, theta, poor, truth = natural_clusters(seed, sigma=sigma)
            scale = np.r_[truth["s_y"], truth["s_y"] / truth["s"]]
            base = rmse(own_least_squares(data) / scale, theta / scale, poor)
            got = {}
            for name, opts in fits.items():
                with warnings.catch_warnings(record=True):
                    warnings.simplefilter("always")
                    res = StructuralCovarianceModel(**opts).fit(data, seed=seed)
                sd = np.sqrt(np.einsum("kii->ki", res.posterior_cov))
                got[name] = (res.posterior_mean, sd, res.converged)
            mean, cov = natural_oracle(data, truth, sigma)
            got["oracle"] = (mean, np.sqrt(np.einsum("kii->ki", cov)), True)
            for name, (mean, sd, conv) in got.items():
                hit = np.abs(mean - theta) <= 1.6448536269514722 * sd
                out[name].append((hit[poor].mean(), hit.mean(), rmse(mean / scale, theta / scale, poor) / base, conv))
        for name, vals in out.items():
            v = np.array(vals, dtype=float)
            rows.append(
                {
                    "sigma": sigma,
                    "fit": name,
                    "coverage_poor": v[:, 0].mean(),
                    "coverage": v[:, 1].mean(),
                    "ratio": v[:, 2].mean(),
                    "ratio_se": v[:, 2].std(ddof=1) / np.sqrt(len(v)),
                    "converged": v[:, 3].mean(),
                }
            )
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
