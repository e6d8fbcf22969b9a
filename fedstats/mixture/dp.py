"""Differentially private FedEM (``FederatedGaussianMixture(dp=...)``): the rounds, the clipping
and the repairs after the noise.

Neighbouring data sets differ by one row of one client (added or removed). A private fit makes
these releases, each a run of the runtime recorded in one :class:`~fedstats.privacy.PrivacyLedger`:

* ``covariance initialisation`` (once, unless ``covariances_init`` is given): hard-assignment
  statistics at ``means_init`` (each row wholly in its nearest mean's component);
* ``EM rounds`` (``dp_rounds`` of them): every client's *full* statistics of the round (no
  incremental deltas: noise must not accumulate in running totals).

Both release the summed keys ``N``, ``S1``, ``S2`` about the broadcast means ``a_j``, every
client every round. A row ``x`` with responsibilities ``r`` (soft, or one-hot in the start)
contributes, with ``e_j = x - a_j`` *winsorised* at the clipping radius ``B`` (scaled to length
``min(|e_j|, B)``, the same direction):

========  ==================================  =====================================
key       a row's contribution                its L2 (Frobenius) norm, at most
========  ==================================  =====================================
``N``     ``r_j``                             ``|r|_2 <= 1``
``S1``    ``r_j e_j``                         ``B |r|_2 <= B``
``S2``    ``r_j e_j e_j'`` (full, tied);      ``B^2``
          ``r_j e_j^2`` (diag);
          ``r_j |e_j|^2`` (spherical)
========  ==================================  =====================================

so the per-key bounds ``C = (1, B, B^2)`` hold (``dp.clip=B``); ``dp.clip`` may instead name
the three keys' bounds (the radius is then ``min(C_S1, sqrt(C_S2))`` and a row's ``N`` is scaled
to ``C_N``). Each key's noise has standard deviation ``z sqrt(K) C_k`` (:mod:`fedstats.privacy.mechanism`).

Per-client weights (the default): client ``c``'s weights enter its next E-step, so they must be
a release too, or one row would move every other row's responsibilities through them. Each
round the client adds ``N(0, (z sqrt(4) C_N)^2)`` to its own clipped soft counts ``N_c`` (on
the client, whatever the placement) and takes its weights from them; with the sums that is one
Gaussian mechanism of four blocks (``K = 4``: the three sums and the client's own counts, one
row touching one client only), so each round is one release of multiplier ``z`` (the sums are
noised at ``sqrt(4) C_k`` rather than ``sqrt(3) C_k``). With ``shared_weights=True`` the server
forms the weights from the noisy ``N`` (``K = 3``).

Repairs after the noise (the server's M-step; ``s_k`` the noise sd of the summed key ``k``):
a component whose noisy count is below ``3 s_N`` keeps its previous parameters (reported as
empty); every covariance is symmetrised and its eigenvalues raised to
``reg_covar + 2 sqrt(d) s_S2 / N_j`` (the size of the noise in it; ``1`` for diag, ``1/d`` for
spherical in place of ``sqrt(d)``); counts below their noise sd are raised to it before the
weights are normalised. With ``noise_multiplier=0`` nothing is repaired: the M-step is the plain one.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import streams
from ..data import FederatedData
from ..federation import FederatedAlgorithm
from ..federation import run as federation_run
from ..privacy import DifferentialPrivacy, PrivacyLedger, PrivacySpent
from ._common import initial_weights, log_weights, norm
from .gmm import centre, check_cov_type, e_step, log_gaussian, m_step, precision_cholesky

if TYPE_CHECKING:
    from ..fitting import RunOptions
    from .result import GaussianMixtureResult

KEYS = ("N", "S1", "S2")


def start_seed(seed: int) -> int:
    """The seed of the private start's run, apart from the EM rounds' ``seed`` (the start's
    releases must not reuse the EM rounds' noise): :mod:`fedstats.streams`' ``dp start``."""
    return streams.seed_of(seed, "dp start", 0)


def bounds(dp: DifferentialPrivacy) -> tuple[float, dict[str, float]]:
    """``(radius B, per-key bounds {N, S1, S2})`` of ``dp.clip`` (see the module docs)."""
    clip = dp.clip
    if isinstance(clip, Mapping):
        if set(clip) != set(KEYS):
            raise ValueError(
                f"FederatedGaussianMixture: dp.clip must be one radius B (a float) or name exactly the keys "
                f"{list(KEYS)}, got {sorted(clip)}"
            )
        b = {k: float(clip[k]) for k in KEYS}
        return min(b["S1"], math.sqrt(b["S2"])), b
    B = float(clip)
    return B, {"N": 1.0, "S1": B, "S2": B * B}


def round_option(dp: DifferentialPrivacy, per_client_weights: bool) -> DifferentialPrivacy:
    """The option one release of ``N, S1, S2`` runs under: the per-key bounds, scaled by
    ``sqrt(4/3)`` when the clients' own noisy counts are a fourth block of the same mechanism
    (so that every block gets ``z sqrt(4) C_k``)."""
    _, b = bounds(dp)
    f = math.sqrt(4.0 / 3.0) if per_client_weights else 1.0
    return dataclasses.replace(dp, clip={k: b[k] * f for k in KEYS})


def contributions(X, resp, means, cov_type, radius, n_bound):
    """Each row's contributions ``{N (n, M), S1 (n, M, d), S2 (n, ...)}`` about ``means``, the
    deviations winsorised at ``radius`` and ``N`` scaled to ``n_bound`` (see the module docs)."""
    E = X[:, None, :] - means[None]  # (n, M, d)
    dist = np.sqrt(np.einsum("nmd,nmd->nm", E, E))
    f = np.ones_like(dist)
    over = dist > radius
    f[over] = radius / dist[over]
    E = E * f[..., None]
    r = resp
    rn = np.linalg.norm(r, axis=1)
    if np.any(rn > n_bound):
        r = r * np.minimum(1.0, n_bound / np.maximum(rn, 1e-300))[:, None]
    S1 = r[..., None] * E
    if cov_type in ("full", "tied"):
        S2 = r[..., None, None] * np.einsum("nmd,nme->nmde", E, E)
    elif cov_type == "diag":
        S2 = r[..., None] * E**2
    else:
        S2 = r * np.einsum("nmd,nmd->nm", E, E)
    return {"N": r, "S1": S1, "S2": S2}


def eigen_floor(cov, floor):
    """``cov`` (d, d) symmetrised, its eigenvalues raised to ``floor``: ``(cov, raised)``."""
    c = 0.5 * (cov + cov.T)
    w, V = np.linalg.eigh(c)
    low = w < floor
    if not low.any():
        return c, 0
    return (V * np.maximum(w, floor)) @ V.T, int(low.sum())


def private_m_step(N, S1, S2, shift, cov_type, reg_covar, prev_means, prev_cov, sd, min_count=None):
    """The M-step on noisy sums, repaired (module docs): ``(means, cov, empty, raised)``.

    ``sd``: the noise sd of each summed key; all zero: the plain :func:`m_step` (with
    ``min_count``), nothing repaired."""
    if sd["N"] == 0 and sd["S1"] == 0 and sd["S2"] == 0:
        means, cov, empty = m_step(N, S1, S2, shift, cov_type, reg_covar, prev_means, prev_cov, min_count)
        return means, cov, empty, 0
    M, d = S1.shape
    floor_n = max(3.0 * sd["N"], 0.0 if min_count is None else float(min_count))
    means, cov, empty = m_step(N, S1, S2, shift, cov_type, reg_covar, prev_means, prev_cov, floor_n)
    live = np.setdiff1d(np.arange(M), empty)
    Nl = np.maximum(N, floor_n)
    raised = 0
    if cov_type == "tied":
        tot = max(float(N[live].sum()), floor_n)
        cov, raised = eigen_floor(cov, reg_covar + 2 * math.sqrt(d * max(len(live), 1)) * sd["S2"] / tot)
        return means, cov, empty, raised
    cov = cov.copy()
    for j in live:
        if cov_type == "full":
            cov[j], k = eigen_floor(cov[j], reg_covar + 2 * math.sqrt(d) * sd["S2"] / Nl[j])
        else:
            fl = reg_covar + 2 * (1.0 if cov_type == "diag" else 1.0 / d) * sd["S2"] / Nl[j]
            k = int(np.sum(cov[j] < fl))
            cov[j] = np.maximum(cov[j], fl)
        raised += k
    return means, cov, empty, raised


def noisy_weights(N, sd_n):
    """Weights from noisy counts: each raised to its noise sd (to 0 without noise), normalised."""
    w = np.maximum(N, sd_n)
    return w / w.sum()


class DPFedEMAlgorithm(FederatedAlgorithm):
    """FedEM's differentially private rounds (see the module docs): each client releases its
    clipped full statistics ``N``, ``S1``, ``S2`` about the broadcast means every round, with
    its share of the noise (placement ``"client"``); with per-client weights it also draws its
    new weights from its own noisy counts. The server does the repaired M-step. ``hard=True``:
    the one-round covariance start (hard assignments to the nearest broadcast mean, means kept).

    Parameters
    ----------
    means, covariances : the components broadcast in the first round.
    dp : the option of the user (``dp.clip``: the radius ``B`` or the three keys' bounds).
    n_clients : the number of clients (each adds ``1/n_clients`` of the noise variance).
    covariance_type, reg_covar, shared_weights, weights_init : as :class:`FedEMAlgorithm`.
    """

    reply_keys: tuple[str, ...] = KEYS
    summed_keys: tuple[str, ...] = KEYS
    per_client_fields: tuple[str, ...] = ("weights_init",)

    def __init__(
        self,
        means,
        covariances,
        *,
        dp: DifferentialPrivacy,
        n_clients: int,
        covariance_type="full",
        reg_covar=1e-6,
        shared_weights=False,
        weights_init=None,
        hard=False,
    ):
        self.cov_type = check_cov_type(covariance_type)
        self.means0 = np.array(means, dtype=float)
        self.cov0 = np.array(covariances, dtype=float)
        self.reg_covar = float(reg_covar)
        self.shared = bool(shared_weights)
        self.weights_init = weights_init
        self.hard = bool(hard)
        self.n_clients = int(n_clients)
        self.M, self.d = self.means0.shape
        self.own_counts = not (self.shared or self.hard)  # per-client weights: a fourth block
        self.user_dp = dp
        self.radius, self.bounds = bounds(dp)
        self.privacy = round_option(dp, self.own_counts)
        K = self.n_clients
        #: the noise sd of each summed key (all clients answering), and of a client's own counts
        self.sum_sd = self.privacy.noise_std(KEYS, n_clients=K, n_answered=K)
        self.own_sd = self.privacy.noise_multiplier * self.privacy.noise_scales(KEYS)["N"] if self.own_counts else 0.0

    # ---------------------------------------------------------------- server side
    def init_server(self, clients, rng):
        log_w = log_weights(initial_weights(self.weights_init, None, self.M)) if self.shared else None
        return {
            "clients": list(clients),
            "means": self.means0.copy(),
            "cov": self.cov0.copy(),
            "log_w": log_w,
            "empty": [],
            "raised": [],
            "last": None,  # the last round's noisy sums and the means they are about
        }

    def broadcast(self, state, client, round):
        msg = {"means": state["means"], "covariances": state["cov"]}
        if self.shared:
            msg["log_weights"] = state["log_w"]
        return msg

    def server_step(self, state, replies, round):
        st = dict(state)
        s = replies.sums
        if not s:  # nobody answered (the fit raises the clients' failure after the run)
            return st, {"answered": 0.0}
        N, S1, S2 = (np.asarray(s[k], dtype=float) for k in KEYS)
        old = state["means"]
        if self.hard:  # the start: covariances at the given means, a thin component gets the pooled one
            from ._init import _pooled_cov

            fallback = _pooled_cov(np.maximum(N, 1e-300), S1, S2, old, self.cov_type, self.reg_covar)
            _, cov, empty, raised = private_m_step(
                N, S1, S2, old, self.cov_type, self.reg_covar, old, fallback, self.sum_sd, min_count=self.d + 1
            )
            if self.cov_type != "tied" and len(empty):
                cov = np.array(cov)
                for j in empty:  # the pooled covariance may itself need the floor
                    cov[j] = _floor_one(cov[j], self.cov_type, self.reg_covar, self.sum_sd, float(N.sum()), self.d)
            means = old
        else:
            means, cov, empty, raised = private_m_step(
                N, S1, S2, old, self.cov_type, self.reg_covar, old, state["cov"], self.sum_sd
            )
        st["means"], st["cov"], st["empty"] = means, cov, [int(j) for j in empty]
        st["raised"] = [*state["raised"], int(raised)]
        st["last"] = {"N": N, "S1": S1, "S2": S2, "shift": np.array(old, dtype=float)}
        if self.shared and not self.hard:
            st["log_w"] = log_weights(noisy_weights(N, self.sum_sd["N"]))
        nan = float("nan")
        metrics = {
            "loglik": nan,  # not released under differential privacy
            "n_points": float(N.sum()),
            "answered": float(len(replies)),
            "mean_loglik": nan,
            "free_energy": nan,
            "empty_components": float(len(empty)),
            "eigenvalues_raised": float(raised),
        }
        return st, metrics

    # ---------------------------------------------------------------- client side
    def init_client(self, client, data, rng):
        from .fedem_algorithm import ClientMixtureState

        return ClientMixtureState(log_weights=log_weights(initial_weights(self.weights_init, client, self.M)), n=0)

    def final_state(self, state):
        return state  # its noisy weights only (the row count is not kept: n=0)

    def client_step(self, message, state, data, rng):
        from .fedem_algorithm import ClientMixtureState

        X = np.asarray(data.X, dtype=float)
        means, cov = message["means"], message["covariances"]
        Xg, mg, _ = centre(X, means)
        if self.hard:
            d2 = np.sum(Xg**2, 1)[:, None] - 2 * Xg @ mg.T + np.sum(mg**2, 1)[None, :]
            resp = np.zeros((X.shape[0], self.M))
            resp[np.arange(X.shape[0]), np.argmin(d2, axis=1)] = 1.0
        else:
            logw = message["log_weights"] if self.shared else state.log_weights
            ld = log_gaussian(Xg, mg, precision_cholesky(cov, self.cov_type), self.cov_type)
            resp = e_step(ld, logw)[0]
        rows = contributions(Xg, resp, mg, self.cov_type, self.radius, self.bounds["N"])
        out = self.privacy.client_sums(rows, rng, n_clients=self.n_clients)
        reply = {k: np.asarray(out.sums[k], dtype=float) for k in KEYS}
        if not self.own_counts:
            return reply, state
        own = rows["N"].sum(0)
        if self.own_sd > 0:
            own = own + rng.standard_normal(self.M) * self.own_sd
        return reply, ClientMixtureState(log_weights=log_weights(noisy_weights(own, self.own_sd)), n=0)


def _floor_one(c, cov_type, reg_covar, sd, n, d):
    if sd["S2"] == 0:
        return c
    if cov_type == "full":
        return eigen_floor(c, reg_covar + 2 * math.sqrt(d) * sd["S2"] / n)[0]
    fl = reg_covar + 2 * (1.0 if cov_type == "diag" else 1.0 / d) * sd["S2"] / n
    return np.maximum(c, fl)


def noise_sd_of_parameters(result_last, cov_type, reg_covar, prev_means, prev_cov, sd, shared, n_draws=200, seed=0):
    """The DP noise's effect on the final parameters: the repaired M-step redone on the last
    round's noisy sums plus fresh noise of the declared size, ``n_draws`` times (seeded).
    Returns ``{"means": (M, d), "var": (M, d), "weights": (M,) or None}`` standard deviations.

    This is the noise of the final M-step given the final E-step. The noise of earlier rounds
    also moves the final responsibilities (through the EM map, in proportion to the fraction of
    missing information): small for well-separated components and noise small against their
    separation (measured: refits' spread within about 30% of this sd at 0.15 component sds of
    noise in a mean), but at 0.5 sds of noise the spread was up to 3 times this sd."""
    from .gmm import full_covariances

    rng = streams.stream(seed, "dp start", 1)
    N, S1, S2, shift = (result_last[k] for k in ("N", "S1", "S2", "shift"))
    M, d = S1.shape
    draws_m, draws_v, draws_w = [], [], []
    for _ in range(n_draws):
        Nn = N + rng.standard_normal(N.shape) * sd["N"]
        S1n = S1 + rng.standard_normal(S1.shape) * sd["S1"]
        S2n = S2 + rng.standard_normal(S2.shape) * sd["S2"]
        if cov_type in ("full", "tied"):
            S2n = 0.5 * (S2n + np.swapaxes(S2n, -1, -2))
        m, c, _, _ = private_m_step(Nn, S1n, S2n, shift, cov_type, reg_covar, prev_means, prev_cov, sd)
        draws_m.append(m)
        draws_v.append(np.diagonal(full_covariances(c, cov_type, M, d), axis1=1, axis2=2))
        if shared:
            draws_w.append(noisy_weights(Nn, sd["N"]))
    return {
        "means": np.std(draws_m, axis=0, ddof=1),
        "var": np.std(draws_v, axis=0, ddof=1),
        "weights": np.std(draws_w, axis=0, ddof=1) if shared else None,
    }


def fit_private(self, data: FederatedData, run: RunOptions) -> GaussianMixtureResult:
    """The differentially private fit of the :class:`~fedstats.mixture.FederatedGaussianMixture` ``self``
    (its main run one client step at a time: each adds its share of the noise)."""
    from .result import GaussianMixtureResult

    dp = self.dp
    assert dp is not None
    if self.participation < 1:
        raise ValueError(
            "FederatedGaussianMixture(dp=...) needs participation=1.0: every client releases its full "
            "statistics every round (its 1/n share of the noise; no accounting for subsampled clients)"
        )
    if self.means_init is None:
        raise ValueError(
            "FederatedGaussianMixture(dp=...) needs means_init (from public knowledge or an earlier fit): "
            "the federated k-means start sends each client's local centres, which are not sums and "
            "cannot be made differentially private"
        )
    K = len(data.clients)
    ledger = PrivacyLedger(dp.accountant)
    common: dict[str, Any] = {
        "dp": dp,
        "n_clients": K,
        "covariance_type": self.covariance_type,
        "reg_covar": self.reg_covar,
        "shared_weights": self.shared_weights,
        "weights_init": self.weights_init,
    }
    means = np.array(self.means_init, dtype=float)
    info: dict = {}
    if self.covariances_init is None:
        start = DPFedEMAlgorithm(means, _unit_cov(self.covariance_type, *means.shape), hard=True, **common)
        r0 = federation_run(
            start,
            data,
            kind="covariance initialisation",
            rounds=1,
            seed=start_seed(run.seed),
            progress=False,
            batched=False,
            privacy_ledger=ledger,
        )
        _raise_failed(r0.history)
        cov = r0.server_state["cov"]
        info = {"covariance_start": {"eigenvalues_raised": r0.server_state["raised"][0]}}
    else:
        cov = np.array(self.covariances_init, dtype=float)
    algo = DPFedEMAlgorithm(means, cov, **common)
    res = dataclasses.replace(run, batched=False).run(
        algo, data, kind="EM rounds", rounds=int(self.dp_rounds), privacy_ledger=ledger
    )
    _raise_failed(res.history)
    st = res.server_state
    dp.check_delta(max(1, int(round(float(st["last"]["N"].sum())))))
    weights = (
        {c: np.exp(st["log_w"]) / np.exp(st["log_w"]).sum() for c in data.clients}
        if self.shared_weights
        else {c: norm(np.exp(s.log_weights)) for c, s in res.client_states.items()}
    )
    noise = noise_sd_of_parameters(
        st["last"],
        self.covariance_type,
        self.reg_covar,
        st["last"]["shift"],
        st["cov"],
        algo.sum_sd,
        self.shared_weights,
        seed=run.seed,
    )
    # converged: the last round moved no mean by more than its noise explains (4 sds of the
    # noise of two rounds' means) plus a thousandth of the component's sd
    moved = np.abs(st["means"] - st["last"]["shift"])
    sds = np.sqrt(np.diagonal(_full(st["cov"], self.covariance_type, *st["means"].shape), axis1=1, axis2=2))
    converged = bool(np.all(moved <= 4 * np.sqrt(2) * noise["means"] + 1e-3 * sds))
    if not converged:
        warnings.warn(
            f"FedEM (dp): the last of dp_rounds={self.dp_rounds} rounds moved a mean by more than the DP "
            "noise explains; increase dp_rounds",
            RuntimeWarning,
            stacklevel=2,
        )
    if st["empty"]:
        warnings.warn(
            f"component(s) {st['empty']} had a noisy count below 3 noise sds in the last round and kept "
            "their previous parameters; consider fewer components or less noise",
            RuntimeWarning,
            stacklevel=2,
        )
    info = {**info, "dp_repairs": {"eigenvalues_raised": list(st["raised"]), "empty_components": list(st["empty"])}}
    out = GaussianMixtureResult(
        means=st["means"],
        covariances=st["cov"],
        weights=weights,
        covariance_type=self.covariance_type,
        feature_names=data.feature_names,
        n_obs={},
        history=res.history,
        communication=res.communication,
        rounds=res.rounds,
        converged=converged,
        shared_weights=self.shared_weights,
        init_info=info,
        reg_covar=self.reg_covar,
        loglik=None,
    )
    out.privacy = PrivacySpent(dp, ledger)
    out.dp_noise_sd = noise
    out.dp_noise_included = bool(self.include_dp_noise)
    return out


def _unit_cov(cov_type: str, M: int, d: int) -> np.ndarray:
    """Identity covariances (only for the broadcast of the hard start, which ignores them)."""
    return {"full": np.stack([np.eye(d)] * M), "tied": np.eye(d), "diag": np.ones((M, d)), "spherical": np.ones(M)}[
        cov_type
    ]


def _full(cov, cov_type, M, d):
    from .gmm import full_covariances

    return full_covariances(cov, cov_type, M, d)


def _raise_failed(history) -> None:
    failed = {c: why for rec in history for c, why in rec.failed.items()}
    if failed:
        c, why = next(iter(failed.items()))
        raise RuntimeError(f"FedEM (dp): client {c!r} failed: {why}")


# ====================================================================== results
