"""Write the README's GLM example data: ``examples/events.csv``.

Six clinics (the clients) follow patients for ``years`` (0.5 to 5) and record their ``age``,
whether they smoke (``smoker``: no/yes), whether they fell ``sick`` (0/1, logistic in age and
smoking with a clinic-specific intercept) and how many ``visits`` they made (Poisson with
mean ``years * exp(-2 + 0.02 age + 0.5 smoker)``: a rate per year of follow-up). The file is
committed; this script re-creates it exactly::

    .venv/bin/python examples/make_events.py          # run from the repository root
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

CLINICS = {"north": 150, "south": 90, "east": 120, "west": 70, "central": 180, "coast": 60}


def main() -> None:
    rng = np.random.default_rng(2026)
    rows = []
    for clinic, n in CLINICS.items():
        shift = rng.normal(0, 0.4)  # the clinic's own baseline risk
        age = np.round(rng.normal(52, 11, n), 1)
        smoker = rng.uniform(size=n) < 0.3
        years = np.round(rng.uniform(0.5, 5, n), 2)
        p = 1 / (1 + np.exp(-(-6 + shift + 0.1 * age + 0.8 * smoker)))
        rows.append(
            pd.DataFrame(
                {
                    "clinic": clinic,
                    "age": age,
                    "smoker": np.where(smoker, "yes", "no"),
                    "years": years,
                    "sick": (rng.uniform(size=n) < p).astype(int),
                    "visits": rng.poisson(years * np.exp(-2 + 0.02 * age + 0.5 * smoker)),
                }
            )
        )
    out = Path(__file__).parent / "events.csv"
    pd.concat(rows, ignore_index=True).to_csv(out, index=False)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
