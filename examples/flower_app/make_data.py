"""Write a synthetic federation as one CSV per client (what each SuperNode would hold).

    python make_data.py data/            # 2 clients of a 3-component Gaussian mixture
    python make_data.py data/ --clients 4 --target   # regression data (column y) instead
"""

import argparse
from pathlib import Path

import pandas as pd

from fedstats.datasets.synthetic import gmm_federation, hm2_federation


def write(folder, clients=2, target=False, seed=0):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if target:
        data, _ = hm2_federation(n_clients=clients, n_obs=60, seed=seed)
    else:
        data, _ = gmm_federation(n_clients=clients, n_components=3, d=2, n_obs=(80, 120), seed=seed)
    paths = []
    for i, c in enumerate(data.clients):
        cd = data[c]
        frame = pd.DataFrame(cd.X, columns=data.feature_names)
        if target:
            frame["y"] = cd.y
        paths.append(folder / f"site_{chr(97 + i)}.csv")
        frame.to_csv(paths[-1], index=False)
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--target", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for path in write(a.folder, a.clients, a.target, a.seed):
        print(path)
