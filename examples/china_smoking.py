"""Write ``china_smoking.csv``: statsmodels' study of smoking and lung cancer in eight Chinese
cities, one row per person (``city``, ``smoking``, ``cancer``), for ``fedstats describe`` and
``fedstats test`` (the docs' tutorial "Describe and test across sites").

    python examples/china_smoking.py [OUT.csv]
"""

from __future__ import annotations

import sys

import pandas as pd
import statsmodels.api as sm


def people() -> pd.DataFrame:
    counts = sm.datasets.china_smoking.load_pandas().data
    rows = []
    for city, r in counts.iterrows():
        for smoking in ("yes", "no"):
            for cancer in ("yes", "no"):
                n = int(r[f"smoking_{smoking}_cancer_{cancer}"])
                rows.append(pd.DataFrame({"city": [city] * n, "smoking": smoking, "cancer": cancer}))
    return pd.concat(rows, ignore_index=True)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "china_smoking.csv"
    people().to_csv(out, index=False)
    print(f"wrote {out}")
