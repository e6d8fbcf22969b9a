"""Generators of the linear-models paper's simulated federations."""

from __future__ import annotations

import numpy as np

from ..data import FederatedData

#: The HM2 uncertainty example of the paper (spec §4.2, Figure 4 right).
UQ_MU = np.array([1.0, 3.0, 0.5, 2.0])
UQ_TAU = np.array([1.17, 2.35, 2.52, 0.67])


def hm2_federation(*, n_clients: int = 100, n_obs: int | list[int] = 100, mu=UQ_MU, tau=UQ_TAU,
                   sigma: float = 0.05, seed: int = 0) -> tuple[FederatedData, dict]:
    """Simulate ``theta_k ~ N(mu, diag tau)``, ``X ~ N(0, I)``, ``y = X theta_k + N(0, sigma^2)``.

    Returns the federation and the truth ``{"mu", "tau", "log_tau", "theta", "sigma"}``.
    The defaults are the paper's uncertainty example (K = 100, d = 4, 100 points each).

    Example
    -------
    >>> data, truth = hm2_federation(n_clients=3, n_obs=5, seed=1)
    >>> data.n_clients, data.n_features
    (3, 4)
    """
    rng = np.random.default_rng(seed)
    mu, tau = np.asarray(mu, dtype=float), np.asarray(tau, dtype=float)
    d = mu.size
    ns = [int(n_obs)] * n_clients if np.isscalar(n_obs) else [int(v) for v in n_obs]
    theta = mu + np.sqrt(tau) * rng.standard_normal((n_clients, d))
    Xs = [rng.standard_normal((n, d)) for n in ns]
    ys = [X @ th + sigma * rng.standard_normal(len(X)) for X, th in zip(Xs, theta)]
    data = FederatedData.from_arrays(Xs, ys, feature_names=[f"x{i + 1}" for i in range(d)])
    return data, {"mu": mu, "tau": tau, "log_tau": np.log(tau), "theta": theta, "sigma": sigma}


#: The variable-selection cases of the paper (spec §4.2, Table 2; after van Erp et al. 2019).
SELECTION_CASES = {
    "I": {"K": 10, "theta": [3, 1.5, 0, 0, 2, 0, 0, 0], "n_train": [100] * 10, "n_test": 1000},
    "II": {"K": 10, "theta": [3, 1.5, 0, 0, 2, 0, 0, 0], "n_train": [20, 20] + [200] * 8, "n_test": 1000},
    "III": {"K": 20, "theta": [3] * 10 + [0] * 10 + [3] * 10, "n_train": [40] * 20, "n_test": 400},
}


def selection_case(case: str = "I", *, sigma: float = 0.05, seed: int = 0):
    """One run of a Table 2 case: the same theta on every device, ``X ~ N(0, I)``, noise sd
    ``sigma`` (0.05, spec §9 item 5) on training and test targets alike.

    Returns ``(train, test, theta)``: two :class:`FederatedData` with the same clients, and
    the true coefficients.

    >>> train, test, theta = selection_case("III", seed=0)
    >>> train.n_clients, train.n_features, test["c0"].n
    (20, 30, 400)
    """
    if case not in SELECTION_CASES:
        raise ValueError(f"case must be one of {sorted(SELECTION_CASES)}, got {case!r}")
    spec = SELECTION_CASES[case]
    rng = np.random.default_rng(seed)
    theta = np.asarray(spec["theta"], dtype=float)
    d = theta.size
    names = [f"x{i + 1}" for i in range(d)]
    clients = [f"c{k}" for k in range(spec["K"])]
    parts = []
    for ns in (spec["n_train"], [spec["n_test"]] * spec["K"]):
        Xs = [rng.standard_normal((n, d)) for n in ns]
        ys = [X @ theta + sigma * rng.standard_normal(n) for X, n in zip(Xs, ns)]
        parts.append(FederatedData.from_arrays(Xs, ys, clients=clients, feature_names=names))
    return parts[0], parts[1], theta
