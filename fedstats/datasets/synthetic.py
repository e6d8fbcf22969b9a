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
