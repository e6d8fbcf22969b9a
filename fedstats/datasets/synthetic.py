"""Generators of simulated federations (the papers' and others). Their data are about no one, so
they come without disclosure rules (``NO_RULES``: clients of any size);
``data.with_rules(min_rows=10, min_cell_count=5)`` puts the defaults back
(:mod:`fedstats.data.disclosure`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from ..data import FederatedData
from ..data.disclosure import NO_RULES

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's from Python 3.13

#: The HM2 uncertainty example of the linear-models paper (Section 5.2, Figure 4 right).
UQ_MU = np.array([1.0, 3.0, 0.5, 2.0])
UQ_TAU = np.array([1.17, 2.35, 2.52, 0.67])


def _one_count(n_obs: int | Sequence[int]) -> TypeIs[int]:
    """Whether ``n_obs`` is one row count for every client, not one per client."""
    return bool(np.isscalar(n_obs))


def hm2_federation(
    *,
    n_clients: int = 100,
    n_obs: int | list[int] = 100,
    mu: ArrayLike = UQ_MU,
    tau: ArrayLike = UQ_TAU,
    sigma: float = 0.05,
    seed: int = 0,
) -> tuple[FederatedData, dict[str, Any]]:
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
    ns = [int(n_obs)] * n_clients if _one_count(n_obs) else [int(v) for v in n_obs]
    theta = mu + np.sqrt(tau) * rng.standard_normal((n_clients, d))
    Xs = [rng.standard_normal((n, d)) for n in ns]
    ys = [X @ th + sigma * rng.standard_normal(len(X)) for X, th in zip(Xs, theta)]
    data = FederatedData.from_arrays(Xs, ys, feature_names=[f"x{i + 1}" for i in range(d)], **NO_RULES)
    return data, {"mu": mu, "tau": tau, "log_tau": np.log(tau), "theta": theta, "sigma": sigma}


#: The variable-selection cases of the linear-models paper (Section 5.2, Table 2; after van Erp et al. 2019).
SELECTION_CASES: dict[str, dict[str, Any]] = {
    "I": {"K": 10, "theta": [3, 1.5, 0, 0, 2, 0, 0, 0], "n_train": [100] * 10, "n_test": 1000},
    "II": {"K": 10, "theta": [3, 1.5, 0, 0, 2, 0, 0, 0], "n_train": [20, 20] + [200] * 8, "n_test": 1000},
    "III": {"K": 20, "theta": [3] * 10 + [0] * 10 + [3] * 10, "n_train": [40] * 20, "n_test": 400},
}


def selection_case(
    case: str = "I", *, sigma: float = 0.05, seed: int = 0
) -> tuple[FederatedData, FederatedData, np.ndarray]:
    """One run of a Table 2 case: the same theta on every client, ``X ~ N(0, I)``, noise sd
    ``sigma`` (0.05; the paper does not state it) on training and test targets alike.

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
        parts.append(FederatedData.from_arrays(Xs, ys, clients=clients, feature_names=names, **NO_RULES))
    return parts[0], parts[1], theta


#: The HM1 cases of the linear-models paper (Section 5.1, Table 1): K, d, training rows per client, noise
#: variance, and which clients enter the A-RMSE.
HM1_CASES: dict[str, dict[str, Any]] = {
    "I": {"K": 2, "d": 5, "n_train": [20, 200], "noise_var": 0.05, "evaluate": [0]},
    "II": {"K": 100, "d": 8, "n_train": [40] * 30 + [275] * 70, "noise_var": 0.1, "evaluate": list(range(30))},
    "III": {"K": 100, "d": 8, "n_train": [20] * 100, "noise_var": 0.1, "evaluate": list(range(100))},
    "IV": {"K": 100, "d": 8, "n_train": [200] * 100, "noise_var": 0.1, "evaluate": list(range(100))},
}


def random_covariance(K: int, rng: np.random.Generator, low: float = 1.0, ratio: float = 10.0) -> np.ndarray:
    """``Q diag(lambda) Q^T`` with ``lambda ~ U[low, low * ratio]`` and a Haar-random
    orthogonal ``Q``: the defaults of R's ``clusterGeneration::genPositiveDefMat``
    (``covMethod="eigen"``), which the paper used for Cases II-IV."""
    Z = rng.standard_normal((K, K))
    Q, R = np.linalg.qr(Z)
    Q = Q * np.sign(np.diag(R))  # Haar measure
    lam = rng.uniform(low, low * ratio, K)
    omega = (Q * lam) @ Q.T
    return (omega + omega.T) / 2


def hm1_case(
    case: str = "I", *, n_test: int = 1000, noisy_test: bool = False, seed: int = 0
) -> tuple[FederatedData, FederatedData, dict[str, Any]]:
    """One run of a Table 1 case: ``Omega`` ([[1, .7], [.7, 1]] in Case I, else
    :func:`random_covariance`), the rows of Theta i.i.d. ``N(0, Omega)``, ``X ~ N(0, I)``,
    ``y = X theta_k + N(0, noise_var)``; test targets noise-free unless ``noisy_test``.

    Returns ``(train, test, truth)`` with ``truth = {"theta": (d, K), "omega": (K, K),
    "noise_var", "evaluate": the clients in the A-RMSE}``.

    >>> train, test, truth = hm1_case("I", seed=0)
    >>> train.n_obs, truth["theta"].shape
    ({'d0': 20, 'd1': 200}, (5, 2))
    """
    if case not in HM1_CASES:
        raise ValueError(f"case must be one of {sorted(HM1_CASES)}, got {case!r}")
    spec = HM1_CASES[case]
    rng = np.random.default_rng(seed)
    K, d = spec["K"], spec["d"]
    omega = np.array([[1.0, 0.7], [0.7, 1.0]]) if case == "I" else random_covariance(K, rng)
    theta = (np.linalg.cholesky(omega) @ rng.standard_normal((K, d))).T  # (d, K): rows ~ N(0, Omega)
    names = [f"x{i + 1}" for i in range(d)]
    clients = [f"d{k}" for k in range(K)]
    sd = np.sqrt(spec["noise_var"])
    parts = []
    for ns, noisy in ((spec["n_train"], True), ([n_test] * K, noisy_test)):
        Xs = [rng.standard_normal((n, d)) for n in ns]
        ys = [X @ theta[:, k] + (sd * rng.standard_normal(n) if noisy else 0.0) for k, (X, n) in enumerate(zip(Xs, ns))]
        parts.append(FederatedData.from_arrays(Xs, ys, clients=clients, feature_names=names, **NO_RULES))
    truth = {
        "theta": theta,
        "omega": omega,
        "noise_var": spec["noise_var"],
        "evaluate": [clients[k] for k in spec["evaluate"]],
    }
    return parts[0], parts[1], truth


def hm1_clusters(
    *,
    n_clients: int = 20,
    d: int = 4,
    n_poor: int = 8,
    n_rich: int = 100,
    rho: float = 0.95,
    sigma: float = 0.5,
    mean: float = 0.0,
    seed: int = 0,
) -> tuple[FederatedData, np.ndarray, np.ndarray, np.ndarray]:
    """A federation where HM1 can borrow strength (the study of HM1's defaults):
    clients in two clusters (even and odd index), coefficients ``mean + N(0, Omega)`` per
    predictor with correlation ``rho`` within a cluster and 0 across, ``X ~ N(1, I)``
    (predictors with mean 1), every other client data-poor (``n_poor`` rows, the rest
    ``n_rich``), noise sd ``sigma``.

    Returns ``(data, theta (K, d), poor (K,) bool, omega (K, K))``.

    >>> data, theta, poor, omega = hm1_clusters(n_clients=4, seed=0)
    >>> data.n_obs, theta.shape, poor.tolist()
    ({0: 8, 1: 100, 2: 8, 3: 100}, (4, 4), [True, False, True, False])
    """
    rng = np.random.default_rng(seed)
    K = n_clients
    lab = np.arange(K) % 2
    omega = np.where(lab[:, None] == lab[None, :], rho, 0.0) + (1 - rho) * np.eye(K)
    theta = mean + np.linalg.cholesky(omega) @ rng.standard_normal((K, d))
    poor = np.arange(K) % 2 == 0
    Xs, ys = [], []
    for k in range(K):
        n = n_poor if poor[k] else n_rich
        X = rng.standard_normal((n, d)) + 1.0
        Xs.append(X)
        ys.append(X @ theta[k] + sigma * rng.standard_normal(n))
    return FederatedData.from_arrays(Xs, ys, **NO_RULES), theta, poor, omega


def gmm_federation(
    *,
    n_clients: int = 20,
    n_components: int = 3,
    d: int = 4,
    alpha: float = 0.4,
    n_obs: tuple[int, int] | int | list[int] = (20, 200),
    min_separation: float | None = 8.0,
    spread: float = 5.0,
    covariance: str = "identity",
    seed: int = 0,
) -> tuple[FederatedData, dict]:
    """A federated Gaussian mixture (a simulation of ours, not the FedEM thesis's): shared
    components, Dirichlet weights.

    Centres ``mu_j ~ N(0, spread I_d)``, redrawn until every pair is at least
    ``min_separation`` apart (``None``: no constraint); covariances ``I_d``
    (``covariance="identity"``) or random SPD with eigenvalues in [0.5, 1.5]
    (``"random"``); client weights ``pi_c ~ Dirichlet(alpha)``; ``n_c`` uniform on
    ``[lo, hi)`` for a pair, or as given. Rows are drawn component by component, each
    client's rows in random order.

    Returns the federation (no target) and the truth ``{"means", "covariances" (M, d, d),
    "weights" (C, M), "labels" (per-client arrays)}``.

    Example
    -------
    >>> data, truth = gmm_federation(n_clients=3, seed=1)
    >>> data.n_clients, truth["weights"].shape
    (3, (3, 3))
    """
    rng = np.random.default_rng(seed)
    M = n_components
    for _ in range(10_000):
        means = rng.normal(0.0, np.sqrt(spread), (M, d))
        gaps = [np.linalg.norm(means[i] - means[j]) for i in range(M) for j in range(i)]
        if min_separation is None or not gaps or min(gaps) >= min_separation:
            break
    else:
        raise ValueError(f"could not draw {M} centres {min_separation} apart with spread {spread} in d={d}")
    if covariance == "identity":
        covs = np.stack([np.eye(d)] * M)
    elif covariance == "random":
        blocks = []
        for _ in range(M):
            Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
            blocks.append(Q @ np.diag(rng.uniform(0.5, 1.5, d)) @ Q.T)
        covs = np.stack(blocks)
    else:
        raise ValueError(f"covariance must be 'identity' or 'random', got {covariance!r}")
    if isinstance(n_obs, tuple):
        ns = rng.integers(n_obs[0], n_obs[1], n_clients)
    elif _one_count(n_obs):
        ns = np.full(n_clients, int(n_obs))
    else:
        ns = np.asarray(n_obs, int)
    weights = rng.dirichlet(np.full(M, alpha), n_clients)
    chol = np.linalg.cholesky(covs)
    Xs, labels = [], []
    for c in range(n_clients):
        z = rng.choice(M, size=int(ns[c]), p=weights[c])
        eps = rng.standard_normal((int(ns[c]), d))
        Xs.append(means[z] + np.einsum("nij,nj->ni", chol[z], eps))
        labels.append(z)
    data = FederatedData.from_arrays(Xs, feature_names=[f"x{i + 1}" for i in range(d)], **NO_RULES)
    return data, {"means": means, "covariances": covs, "weights": weights, "labels": labels}


def hierarchical_logistic(n_clients: int, seed: int = 0) -> FederatedData:
    """Clients of unequal size (30 to 149 rows, two standard-normal predictors), each with its
    own logistic coefficients ``theta_k ~ N(mu, diag tau)``, ``mu = (-0.3, 0.6, -0.4)`` and
    ``tau = (0.3, 0.1, 0.05)`` (intercept first): the federation of the hierarchical GLM's
    speed benchmark and test."""
    rng = np.random.default_rng(seed)
    mu, tau = np.array([-0.3, 0.6, -0.4]), np.array([0.3, 0.1, 0.05])
    Xs, ys = [], []
    for n in rng.integers(30, 150, n_clients):
        X = rng.normal(size=(n, 2))
        th = mu + np.sqrt(tau) * rng.normal(size=3)
        Xs.append(X)
        ys.append(rng.binomial(1, 1 / (1 + np.exp(-(th[0] + X @ th[1:])))).astype(float))
    return FederatedData.from_arrays(Xs, ys, **NO_RULES)
