"""Write the README's example data: ``examples/sites.csv`` and ``examples/sites_new.csv``.

Six sites (the clients) measure two predictors ``x1``, ``x2`` that fall in three clusters
shared by every site in site-specific proportions (a mixture with shared components and
private weights: what FedEM fits), a third predictor ``x3`` and a response

    y = b0_k + b1_k x1 + b2_k x2 + b3_k x3 + noise,   (b0_k, ..., b3_k) ~ N(mu, diag tau)

with site-specific coefficients drawn around population means (what HM2 fits; ``x3`` has
population mean 0, so the lasso has a predictor to drop). ``sites_new.csv`` holds a few
further rows of known sites without ``y``, for ``--predict``. The files are committed; this
script re-creates them exactly::

    .venv/bin/python examples/make_sites.py          # run from the repository root
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SITES = {"north": 120, "south": 80, "east": 100, "west": 60, "central": 140, "coast": 50}
CENTRES = np.array([[-2.0, 0.0], [2.0, 2.0], [1.5, -2.5]])
MU = np.array([1.0, 1.5, -1.0, 0.0])  # intercept, x1, x2, x3
TAU = np.array([0.25, 0.09, 0.04, 0.01])  # variances of the site coefficients around MU
NOISE_SD = 0.5


def make(seed: int = 2026) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    train, new = [], []
    for site, n in SITES.items():
        weights = rng.dirichlet(np.full(len(CENTRES), 1.5))
        beta = MU + np.sqrt(TAU) * rng.normal(size=MU.size)
        for part, m in ((train, n), (new, 3)):
            z = rng.choice(len(CENTRES), size=m, p=weights)
            x12 = CENTRES[z] + 0.6 * rng.normal(size=(m, 2))
            x3 = rng.normal(size=m)
            X = np.column_stack([np.ones(m), x12, x3])
            df = pd.DataFrame({"site": site, "x1": x12[:, 0], "x2": x12[:, 1], "x3": x3})
            df["y"] = X @ beta + NOISE_SD * rng.normal(size=m)
            part.append(df.round(4))
    return pd.concat(train, ignore_index=True), pd.concat(new, ignore_index=True).drop(columns="y")


if __name__ == "__main__":
    here = Path(__file__).parent
    train, new = make()
    train.to_csv(here / "sites.csv", index=False)
    new.to_csv(here / "sites_new.csv", index=False)
    print(
        f"wrote {here / 'sites.csv'} ({len(train)} rows, {train.site.nunique()} sites) and "
        f"{here / 'sites_new.csv'} ({len(new)} rows without y)"
    )
