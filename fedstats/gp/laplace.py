"""Uncertainty of FGPR's shared hyperparameters: a Laplace approximation at the federated optimum.

The shared prior's hyperparameters ``h`` (lengthscales, outputscale, noise variance and the
constant mean) are estimated by maximum marginal likelihood. With a flat prior on
``theta`` (the logarithms of the positive hyperparameters, the mean as it is), the
posterior ``p(theta | data)`` is proportional to ``exp(-sum_k L_k(theta))``, ``L_k`` the
exact negative log marginal likelihood of client k's full data (clients are independent
GPs given ``theta``). Its Laplace approximation at the fitted ``theta_hat`` is the normal
``N(theta_hat, H^{-1})`` with ``H = sum_k d^2 L_k / d theta^2`` at ``theta_hat``.

Each client computes its term of ``H`` (and of the gradient ``g = sum_k dL_k / d theta``)
once, after the rounds, on its own rows (:class:`HessianShare`): one ``p x p`` matrix and
one ``p``-vector, both declared summed (the server uses only their sums, so they can travel
under secure aggregation). ``g`` measures how far the federated point is from the maximum:
a Newton step ``H^{-1} g`` longer than about one posterior sd means the rounds stopped short
and the intervals are centred at a point that is not the maximum (a warning says so).

Derivatives are in closed form (:func:`curvature`), in float64: the cost is one Cholesky
factorisation and inverse of the client's ``N_k x N_k`` kernel matrix, one matrix product per
lengthscale, and memory for about ``n_l + 8`` such matrices (``n_l`` lengthscales).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..federation import FederatedAlgorithm, Message
from ..inference.gaussian import is_pd
from ._core import HyperSpec, small_work
from .fgpr_algorithm import standardize_y

__all__ = [
    "LAPLACE_BYTES",
    "memory",
    "theta_names",
    "to_theta",
    "from_theta",
    "curvature",
    "HessianShare",
    "federated_curvature",
    "pooled_curvature",
    "newton_sds",
    "newton_offset",
]

#: the longest Newton step on the log scale (a factor e in a hyperparameter)
MAX_STEP = 1.0
#: the most memory a client's curvature may need for ``laplace=None`` (FGPR's default) to compute it
LAPLACE_BYTES = 2 * 2**30


def theta_names(spec: HyperSpec, feature_names: Sequence[str] | None = None) -> list[str]:
    """``log_lengthscale`` (or ``log_lengthscale[x0]``... under ARD), ``log_outputscale``,
    ``log_noise`` and ``mean`` (the constant mean is not logged)."""
    return [lab if lab == "mean" else "log_" + lab for lab in spec.labels(feature_names)]


def to_theta(spec: HyperSpec, hyper: Mapping[str, Any]) -> np.ndarray:
    """The hyperparameters as the vector ``theta``: logs of the positive ones, the mean as it is."""
    parts = [np.asarray(hyper[n], dtype=float).reshape(-1) for n in spec.names]
    return np.concatenate([p if n == "mean" else np.log(p) for n, p in zip(spec.names, parts)])


def from_theta(spec: HyperSpec, theta: np.ndarray) -> dict[str, np.ndarray]:
    """The inverse of :func:`to_theta`; a positive value at or below its floor (possible in a
    draw from the approximation, never at the fit) is set just above the floor."""
    out, i = {}, 0
    for n in spec.names:
        k = spec.size(n)
        v = np.asarray(theta[i : i + k], dtype=float)
        if n != "mean":
            v = np.exp(v)
            fl = spec.floor(n) or 0.0
            v = np.maximum(v, fl * (1 + 1e-6) + 1e-300)
        out[n], i = v, i + k
    return out


def _kernel_terms(spec: HyperSpec, X: torch.Tensor, ls: torch.Tensor):
    """The unit-outputscale kernel ``B`` at ``X`` and its first and second derivatives with
    respect to the log lengthscales, in closed form.

    With ``u = sum_j u_j``, ``u_j = ((x_j - x'_j) / l_j)^2``, ``S = c sqrt(u)`` (``c = 1`` for
    RBF, ``sqrt(2 nu)`` for Matern) and ``B = f(S)``, ``w_j = u_j / u`` (1 without ARD):
    ``dB/dlog l_j = -g1 w_j`` and ``d2B/dlog l_j dlog l_k = (g2 - g1) w_j w_k + 2 [j = k] g1 w_j``,
    ``g1 = S f'(S)``, ``g2 = S^2 f''(S)``, finite at ``S = 0``. Returns ``B``, ``g1``, ``g2``
    and a function ``w(j)``."""
    Z = (X - X.mean(0)) / ls
    diff2 = lambda j: (Z[:, j, None] - Z[None, :, j]) ** 2  # noqa: E731
    u = diff2(0)
    for j in range(1, Z.shape[1]):
        u = u + diff2(j)
    if spec.kernel == "rbf":
        f = torch.exp(-0.5 * u)
        B, g1, g2 = f, -u * f, u * (u - 1) * f
    else:
        S = math.sqrt(2 * spec.nu) * u.sqrt()
        e, S2 = torch.exp(-S), S * S
        if spec.nu == 0.5:
            B, g1, g2 = e, -S * e, S2 * e
        elif spec.nu == 1.5:
            B, g1, g2 = (1 + S) * e, -S2 * e, S2 * (S - 1) * e
        else:
            B, g1, g2 = (1 + S + S2 / 3) * e, -S2 * (1 + S) * e / 3, S2 * (S2 - S - 1) * e / 3
    if not spec.ard:
        return B, g1, g2, lambda j: 1.0
    safe = torch.where(u > 0, u, 1.0)
    return B, g1, g2, lambda j: torch.where(u > 0, diff2(j) / safe, 0.0)


def curvature(
    spec: HyperSpec, hyper: Mapping[str, Any], X: np.ndarray, y: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """Value, gradient ``(p,)`` and Hessian ``(p, p)`` of one data set's negative log marginal
    likelihood ``L = r' K^{-1} r / 2 + log|K| / 2 + n log(2 pi) / 2`` with respect to ``theta``
    (:func:`to_theta`) at ``hyper``, in closed form, in float64 on the CPU (``y`` as the model
    sees it: standardised where the fit standardises). With ``K_i = dK/dtheta_i``,
    ``alpha = K^{-1} r`` and ``A_i = K^{-1} K_i``:
    ``dL_i = -alpha' K_i alpha / 2 + tr(A_i) / 2`` and
    ``d2L_ij = alpha' K_i K^{-1} K_j alpha - alpha' K_ij alpha / 2 + tr(K^{-1} K_ij) / 2 - tr(A_i A_j) / 2``;
    the constant mean enters through ``r = y - m``. The outputscale's and noise's terms use
    ``K_s = K - v I`` and ``K_v = v I`` in closed form, so the memory is about ``n_l + 8``
    matrices of ``n x n`` (:func:`memory`; ``n_l`` lengthscales) and the time one
    factorisation, one inverse and one product per lengthscale."""
    with small_work("cpu", len(y)):  # one thread for small clients (a second costs more than it saves)
        return _curvature(spec, hyper, X, y)


def _curvature(spec: HyperSpec, hyper: Mapping[str, Any], X: np.ndarray, y: np.ndarray):
    h = {n: np.asarray(hyper[n], dtype=float).reshape(-1) for n in spec.names}
    dt = torch.float64
    Xt = torch.as_tensor(np.array(X, dtype=float), dtype=dt).reshape(len(y), -1)
    yt = torch.as_tensor(np.array(y, dtype=float), dtype=dt)
    n, nl = len(yt), spec.size("lengthscale")
    s, v = float(h["outputscale"][0]), float(h["noise"][0])
    B, g1, g2, w = _kernel_terms(spec, Xt, torch.as_tensor(h["lengthscale"], dtype=dt))
    K = B.mul_(s)  # B is not needed again
    K.diagonal().add_(v)
    L = torch.linalg.cholesky(K)
    del K, B
    Kinv = torch.cholesky_inverse(L)
    logdet = 2 * torch.log(torch.diagonal(L)).sum()
    del L
    r = yt - float(h["mean"][0]) if "mean" in h else yt
    alpha = Kinv @ r
    trK, sKK = torch.trace(Kinv), torch.sum(Kinv * Kinv)
    # lengthscales: K_j dense, A_j = K^{-1} K_j kept; outputscale S and noise V in closed form
    As, b, trA, tAK = [], [], [], []
    for j in range(nl):
        Kj = -s * g1 * w(j)
        b.append(Kj @ alpha)
        As.append(Kinv @ Kj)
        del Kj
        trA.append(torch.trace(As[j]))
        tAK.append(torch.sum(As[j] * Kinv))  # tr(A_j K^{-1})
    S = nl  # the outputscale; the noise is nl + 1
    b += [r - v * alpha, v * alpha]  # K_s alpha = r - v alpha, K_v alpha = v alpha
    trA += [n - v * trK, v * trK]
    p = nl + 2 + int("mean" in h)
    grad, hess = torch.zeros(p, dtype=dt), torch.zeros((p, p), dtype=dt)
    for i in range(nl + 2):
        grad[i] = -0.5 * alpha @ b[i] + 0.5 * trA[i]
        for j in range(i + 1):
            if i < nl:  # two lengthscales: tr(A_i A_j), and K_ij = s d2B / dlog l_i dlog l_j
                tAA = torch.sum(As[i] * As[j].mT)
                Kij = s * (g2 - g1) * w(i) * w(j) + (2 * s * g1 * w(i) if i == j else 0.0)
                second = alpha @ (Kij @ alpha) - torch.sum(Kinv * Kij)
                del Kij
            elif j < nl:  # outputscale or noise with a lengthscale; K_sj = K_j, K_vj = 0
                tAA = trA[j] - v * tAK[j] if i == S else v * tAK[j]
                second = alpha @ b[j] - trA[j] if i == S else 0.0
            elif i == j:  # K_ss = K_s, K_vv = K_v
                tAA = n - 2 * v * trK + v * v * sKK if i == S else v * v * sKK
                second = alpha @ b[i] - trA[i]
            else:  # noise and outputscale: K_sv = 0
                tAA, second = v * trK - v * v * sKK, 0.0
            hess[i, j] = hess[j, i] = b[i] @ (Kinv @ b[j]) - 0.5 * tAA - 0.5 * second
    if "mean" in h:  # dr/dm = -1
        c = Kinv.sum(1)
        grad[-1] = -alpha.sum()
        hess[-1, -1] = c.sum()
        for i in range(nl + 2):
            hess[-1, i] = hess[i, -1] = c @ b[i]
    nll = 0.5 * (r @ alpha + logdet + n * math.log(2 * math.pi))
    return float(nll), grad.numpy(), hess.numpy()


class HessianShare(FederatedAlgorithm):
    """The one exchange after FGPR's rounds: the server broadcasts the fitted hyperparameters;
    every client replies the gradient and Hessian of its full-data negative log marginal
    likelihood in ``theta`` (:func:`curvature`), both declared summed."""

    reply_keys = ("nll", "gradient", "hessian")
    summed_keys = ("nll", "gradient", "hessian")
    random_client_steps = False

    def __init__(self, spec: HyperSpec, hyper: Mapping[str, Any], standardize: bool) -> None:
        self.spec, self.standardize = spec, bool(standardize)
        self.hyper = {n: np.asarray(hyper[n], dtype=float) for n in spec.names}

    def init_server(self, clients, rng):
        return None

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return dict(self.hyper)

    def client_step(self, message: Message, state, data, rng):
        hyper = self.spec.check({n: message[n] for n in self.spec.names}, "the broadcast hyperparameters")
        y = np.array(data.y, dtype=float)
        y = standardize_y(y)[0] if self.standardize else y
        f, g, H = curvature(self.spec, hyper, np.asarray(data.X), y)
        return {"nll": np.array([f]), "gradient": g, "hessian": H}, state

    def server_step(self, server_state, replies, round):
        if not replies:
            return None, {}
        return {k: np.asarray(replies.sums[k]) for k in self.summed_keys}, {}


def memory(spec: HyperSpec, n: int) -> int:
    """Bytes :func:`curvature` holds at its peak for a client of ``n`` rows: about
    ``n_l + 8`` float64 matrices of ``n x n`` (``n_l`` lengthscales)."""
    return (spec.size("lengthscale") + 8) * n * n * 8


def wanted(option: bool | None, counts: Mapping[Any, int], spec: HyperSpec) -> str | None:
    """``None`` when the curvature is to be computed under FGPR's ``laplace`` option, else
    why not (``laplace=None`` computes it when every client's :func:`memory` is at most
    :data:`LAPLACE_BYTES`: about 5,400 rows with one lengthscale, 3,000 with ARD over 20 inputs)."""
    if option is False:
        return "the fit was run with laplace=False"
    big = max(counts.values())
    if option is None and memory(spec, big) > LAPLACE_BYTES:
        return (
            f"a client has {big} rows: its curvature (one exact factorisation of its rows) would hold about "
            f"{memory(spec, big) / 2**30:.1f} GiB, above the {LAPLACE_BYTES / 2**30:g} GiB up to which laplace=None "
            "computes it; set laplace=True to compute it anyway"
        )
    return None


def at_boundary(spec: HyperSpec, hyper: Mapping[str, Any]) -> str | None:
    """Why there is no Laplace approximation when a positive hyperparameter sits at its floor
    (within 0.1%): the maximum is on the boundary, where the likelihood is not locally normal
    (e.g. noise at ``noise_floor`` for a noiseless or linear signal); else None."""
    for n in spec.names:
        fl = spec.floor(n)
        v = np.asarray(hyper[n], dtype=float)
        if fl and np.any(v <= fl * 1.001):
            return (
                f"{n} is at its floor {fl:g} (the likelihood's maximum is on the boundary, where no Laplace "
                f"approximation applies): no hyperparameter intervals"
            )
    return None


def federated_curvature(
    spec: HyperSpec, hyper: Mapping[str, Any], data: Any, *, standardize: bool, seed: int, newton_steps: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | str]:
    """The hyperparameters and the clients' summed value, gradient and Hessian there (one
    :class:`HessianShare` exchange), or why there are none (a client that failed: its term
    would be missing from the sum).

    ``newton_steps`` > 0 first moves the hyperparameters to the maximum of the exact
    likelihood by up to that many Newton steps ``theta <- theta - t H^{-1} g``, each one
    exchange (``t`` halved until the summed negative log likelihood decreases; where
    ``H`` is not positive definite it is shifted by a multiple of the identity until it is,
    Levenberg-Marquardt's way, and no step changes a hyperparameter by more than a factor e);
    it stops when a step is below 1e-3 posterior sd."""
    start = dict(hyper)
    boundary = at_boundary(spec, start)
    if boundary is not None:
        if newton_steps == 0:  # no intervals at a boundary: nothing to ask the clients
            return start, boundary
        start = from_theta(spec, to_theta(spec, start))  # a value rounded onto its floor: just above it
    theta = to_theta(spec, start)
    cur = _exchange(spec, theta, data, standardize, seed)
    for _ in range(newton_steps):
        if isinstance(cur, str) or not np.all(np.isfinite(cur["hessian"])) or newton_offset(cur) < 1e-3:
            break  # a client failed, or there already
        H = cur["hessian"]
        low = np.linalg.eigvalsh(H).min()
        if low <= 0:  # not a maximum yet: shift the curvature (Levenberg-Marquardt) to step downhill
            H = H - 2 * low * np.eye(len(H)) + 1e-9 * np.abs(np.diag(H)).max() * np.eye(len(H))
        step = -np.linalg.solve(H, cur["gradient"])
        step *= min(1.0, MAX_STEP / np.abs(step).max())  # at most a factor e^MAX_STEP per step
        accepted = None
        for t in 0.5 ** np.arange(8):
            cand = to_theta(spec, from_theta(spec, theta + t * step))
            if np.array_equal(cand, theta):  # the step is clipped away at the floors
                break
            new = _exchange(spec, cand, data, standardize, seed)
            # a client that fails at a candidate (a factorisation that breaks) counts as a worse point
            if not isinstance(new, str) and new["nll"][0] < cur["nll"][0]:
                accepted = (cand, new)
                break
        if accepted is None:  # no step length decreased the objective: keep the point
            break
        theta, cur = accepted
        start = from_theta(spec, theta)
    return start, at_boundary(spec, start) or cur


def newton_sds(curv: Mapping[str, np.ndarray]) -> np.ndarray:
    """The Newton step ``-H^{-1} g`` in posterior sds, component by component (NaN where ``H``
    is not positive definite): how far the point is from the likelihood's maximum."""
    H, g = np.asarray(curv["hessian"], dtype=float), np.asarray(curv["gradient"], dtype=float)
    if not is_pd(H):
        return np.full(len(g), np.nan)
    return -np.linalg.solve(H, g) / np.sqrt(np.diag(np.linalg.inv(H)))


def newton_offset(curv: Mapping[str, np.ndarray]) -> float:
    """The longest component of :func:`newton_sds` (NaN where ``H`` is not positive definite)."""
    return float(np.max(np.abs(newton_sds(curv))))


def _exchange(spec: HyperSpec, theta: np.ndarray, data: Any, standardize: bool, seed: int):
    from ..federation import run
    from ..federation.records import excluded_now

    algorithm = HessianShare(spec, from_theta(spec, theta), standardize)
    # a client that fails here stays in the fit (its data chose the hyperparameters): only the
    # intervals are lost
    out = run(algorithm, data, kind="hyperparameter curvature", rounds=1, seed=seed, progress=False, drop_silent=False)
    failed = {c: why for rec in out.history for c, why in rec.failed.items()}
    gone = excluded_now()  # clients that dropped out of the fit before: not asked, not missed
    asked = [c for c in data.clients if c not in gone]
    missing = [c for c in asked if c not in out.history[-1].answered] if out.history else asked
    if failed or missing or out.server_state is None:
        c = next(iter(failed)) if failed else missing[0]
        return f"client {c!r} did not send its curvature ({failed.get(c, 'no reply')}): no hyperparameter intervals"
    return out.server_state


def pooled_curvature(spec: HyperSpec, hyper: Mapping[str, Any], data: Any, *, standardize: bool) -> dict | str:
    """The same sums computed in one place (the centralised fit's), or why there are none."""
    why = at_boundary(spec, hyper)
    if why is not None:
        return why
    parts = []
    for c in data.clients:
        y = np.array(data[c].y, dtype=float)
        try:
            parts.append(curvature(spec, hyper, np.asarray(data[c].X), standardize_y(y)[0] if standardize else y))
        except (RuntimeError, np.linalg.LinAlgError) as exc:  # torch's LinAlgError is a RuntimeError
            return f"the curvature of client {c!r} failed ({type(exc).__name__}: {exc}): no hyperparameter intervals"
    return {
        "nll": np.array([sum(f for f, _, _ in parts)]),
        "gradient": np.sum([g for _, g, _ in parts], axis=0),
        "hessian": np.sum([H for _, _, H in parts], axis=0),
    }
