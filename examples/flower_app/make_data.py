"""Write a synthetic federation: one CSV per site (what each SuperNode reads) and all sites in one CSV.

    python examples/flower_app/make_data.py data/              # data/site_a.csv, data/site_b.csv, data/all_sites.csv
    python examples/flower_app/make_data.py data/ --target     # the same rows plus a response column y (for hm2)
    python examples/flower_app/make_data.py data/ --clients 4  # site_a ... site_d

The rows come from three well-separated Gaussian components in two dimensions (features
``x1``, ``x2``; centres 5 to 5.7 apart, standard deviations 0.7 to 1.1), shared by every
site; the sites hold them in different proportions (site_a 60/30/10 %, site_b 15/30/55 %, a
third site 30/50/20 %, then again) and have 300 to 600 rows each. FedEM with
``components=3`` converges in a handful of rounds (3 to 7 for data seeds 0 to 5) and finds them.

Columns of every CSV: ``site`` (the client the row belongs to: the same value on every row
of a site's file, equal to its file name), ``x1``, ``x2`` and, with ``--target``, ``y``
(``y = b0 + b1 x1 + b2 x2 + noise``, coefficients varying around a common mean from site to
site). The SuperNode's reader (``fedstats_app/client_app.py``) takes ``site`` as the client
id, never as a feature; ``y`` is the response only where the node config says ``target='y'``
(the Gaussian mixture is fitted on files without a ``y`` column).
"""

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

#: the shared components: means and covariances (2 features)
MEANS = np.array([[0.0, 0.0], [5.0, 0.5], [1.5, 5.0]])
COVARIANCES = np.array([[[1.0, 0.3], [0.3, 0.8]], [[0.7, -0.2], [-0.2, 1.2]], [[1.2, 0.0], [0.0, 0.6]]])
#: site i holds the components in proportions WEIGHTS[i % 3]
WEIGHTS = np.array([[0.6, 0.3, 0.1], [0.15, 0.3, 0.55], [0.3, 0.5, 0.2]])
#: the regression (--target): y = COEF @ (1, x1, x2) + noise, COEF varying by site
COEF, COEF_SD, NOISE_SD = np.array([1.0, 0.5, -0.8]), np.array([0.5, 0.2, 0.2]), 0.5
FEATURES = ["x1", "x2"]


def site_name(i: int) -> str:
    return f"site_{chr(97 + i)}"


def frames(clients=2, target=False, seed=0) -> dict[str, pd.DataFrame]:
    """One data frame per site: columns ``site``, ``x1``, ``x2`` (and ``y`` with ``target``)."""
    if not 1 <= clients <= 26:
        raise ValueError(f"clients must be between 1 and 26, got {clients}")
    rng = np.random.default_rng(seed)
    rng_y = np.random.default_rng([seed, 1])  # its own stream: --target adds y to the very same rows
    chol = np.linalg.cholesky(COVARIANCES)
    out = {}
    for i in range(clients):
        n = int(rng.integers(300, 600))
        z = rng.choice(len(MEANS), size=n, p=WEIGHTS[i % len(WEIGHTS)])
        X = MEANS[z] + np.einsum("nij,nj->ni", chol[z], rng.standard_normal((n, len(FEATURES))))
        frame = pd.DataFrame(X, columns=FEATURES).round(6)
        frame.insert(0, "site", site_name(i))
        if target:
            b = COEF + COEF_SD * rng_y.standard_normal(COEF.size)
            frame["y"] = (b[0] + frame[FEATURES].to_numpy() @ b[1:] + NOISE_SD * rng_y.standard_normal(n)).round(6)
        out[site_name(i)] = frame
    return out


def write(folder, clients=2, target=False, seed=0, combined=True) -> list[Path]:
    """Write ``<folder>/site_a.csv``, ... (one per SuperNode) and, with ``combined``,
    ``<folder>/all_sites.csv`` (every row, for an in-process fit: ``--by site``).

    Returns the per-site paths (in site order).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sites = frames(clients, target, seed)
    paths = []
    for name, frame in sites.items():
        paths.append(folder / f"{name}.csv")
        frame.to_csv(paths[-1], index=False)
    if combined:
        pd.concat(sites.values(), ignore_index=True).to_csv(folder / "all_sites.csv", index=False)
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--clients", type=int, default=2, help="number of sites (default 2)")
    p.add_argument("--target", action="store_true", help="add a response column y (for model='hm2')")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    total = 0
    for path in write(a.folder, a.clients, a.target, a.seed):
        frame = pd.read_csv(path)
        total += len(frame)
        print(f"wrote {path}: {len(frame)} rows, columns {', '.join(frame.columns)}")
    print(f"wrote {Path(a.folder) / 'all_sites.csv'}: all {total} rows (for an in-process fit, by site)")
