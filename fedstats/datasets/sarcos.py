"""SARCOS robot-arm inverse dynamics as a federation of 25 clients (the FGPR paper's Application III).

Only the public **test** split (``sarcos_inv_test.mat``, 4,449 rows) is available to
fedstats; the FGPR paper trained on the 44,484-row training split. :func:`load_sarcos_federation`
therefore partitions the 4,449 rows at random into clients and splits each client's rows
into its own train and test parts: say so wherever results are reported.

The file is not shipped: pass its path (or folder) or set ``FEDSTATS_DATA`` to a folder
with a ``sarcos/`` sub-folder. Columns: 21 inputs (7 joint positions, 7 velocities, 7
accelerations), then the 7 joint torques.

A robot arm's data are about no one: the federations come without disclosure rules
(``NO_RULES``, :mod:`fedstats.data.disclosure`).
"""

from __future__ import annotations

import numpy as np

from ..data import FederatedData
from ..data.disclosure import NO_RULES
from ._files import DataPath, find_data_file

FILE = "sarcos_inv_test.mat"
INPUTS = [f"{kind}{j}" for kind in ("pos", "vel", "acc") for j in range(1, 8)]


def read_sarcos(path: DataPath = None) -> tuple[np.ndarray, np.ndarray]:
    """``(X, Y)``: the 21 inputs and the 7 torques of ``sarcos_inv_test.mat``."""
    from scipy.io import loadmat

    file = find_data_file(path, FILE, "sarcos")
    mat = loadmat(file)
    if "sarcos_inv_test" not in mat or mat["sarcos_inv_test"].shape[1] != 28:
        raise ValueError(f"{file.name}: expected a variable 'sarcos_inv_test' with 28 columns")
    A = np.asarray(mat["sarcos_inv_test"], dtype=float)
    return A[:, :21], A[:, 21:]


def load_sarcos_federation(
    path: DataPath = None, *, output: int = 1, n_clients: int = 25, test_fraction: float = 0.3, seed: int = 0
) -> tuple[FederatedData, FederatedData]:
    """Random partition of the rows into ``n_clients`` clients, each split into train and test.

    Inputs and the torque of joint ``output`` (1-7) are standardised with the mean and sd of
    all clients' *training* rows (the FGPR paper does not say how it scales; these are the
    statistics a federation would compute from per-client sums). Returns ``(train, test)``
    with clients ``"client1"`` ...
    """
    if not isinstance(output, (int, np.integer)) or not 1 <= output <= 7:
        raise ValueError(f"output must be a joint number 1..7, got {output!r}")
    if not isinstance(n_clients, (int, np.integer)) or not 1 <= n_clients <= 2000:
        raise ValueError(f"n_clients must be an integer between 1 and 2000 (at least 2 rows each), got {n_clients!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    X, Y = read_sarcos(path)
    y = Y[:, output - 1]
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(len(y)), n_clients)
    tr, te = [], []
    for part in parts:
        n_test = int(round(test_fraction * len(part)))
        te.append(part[:n_test])
        tr.append(part[n_test:])
    allt = np.concatenate(tr)
    mx, sx = X[allt].mean(0), X[allt].std(0)
    my, sy = y[allt].mean(), y[allt].std()
    Xs, ys = (X - mx) / sx, (y - my) / sy
    names = [f"client{i + 1}" for i in range(n_clients)]
    train = FederatedData.from_arrays(
        [Xs[i] for i in tr],
        [ys[i] for i in tr],
        clients=names,
        feature_names=INPUTS,
        target_name=f"torque{output}",
        **NO_RULES,
    )
    test = FederatedData.from_arrays(
        [Xs[i] for i in te],
        [ys[i] for i in te],
        clients=names,
        feature_names=INPUTS,
        target_name=f"torque{output}",
        **NO_RULES,
    )
    return train, test
