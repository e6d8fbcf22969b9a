"""The building blocks of FEM-OMD's weights (:mod:`fedstats.mixture.online`): online mirror
descent on the probability simplex by exponentiated gradient, the gradient of the KL cost, and
the step sizes and floors."""

from __future__ import annotations

import math

import numpy as np

from ._common import log_weights as _log_weights

COV_TYPES_ONLINE = ("identity", "full", "tied", "diag", "spherical")


def lse(a: np.ndarray) -> np.ndarray:
    """log-sum-exp over the last axis (plain numpy: scipy's costs ~100 us a call here)."""
    amax = a.max(axis=-1, keepdims=True)
    return (amax + np.log(np.exp(a - amax).sum(axis=-1, keepdims=True)))[..., 0]


def eg_update(pi, grad, eta, floor=0.0) -> np.ndarray:
    """Exponentiated-gradient (entropic mirror-descent) step on the simplex.

    ``softmax(log pi - eta grad)``, i.e. ``argmin_q <q, eta grad> + KL(q || pi)``; then
    ``(1 - floor) q + floor / m``. Adding a constant to ``grad`` changes nothing. Works on
    one ``(m,)`` vector or a stack ``(C, m)`` (``eta`` and ``floor`` scalars, or ``(C, 1)``:
    one per row).
    """
    pi = np.asarray(pi, float)
    a = _log_weights(pi) - eta * np.asarray(grad, float)
    q = np.exp(a - lse(a)[..., None])
    if np.any(floor):
        q = (1.0 - floor) * q + floor / q.shape[-1]
    return q


def omd_gradient(log_dens, log_pi, starts=None) -> np.ndarray:
    """Monte-Carlo gradient of ``pi -> KL(P || sum_j pi_j f_j)`` at ``pi`` from draws of P.

    ``log_dens`` (S, m): ``log f_j(Z_s)``; returns ``g_j = -mean_s f_j(Z_s) / sum_l pi_l
    f_l(Z_s)``. For any draws ``sum_j pi_j g_j = -1`` (the ratios are responsibilities / pi).
    Stacked clients: ``starts`` (C,) row offsets and ``log_pi`` (C, m) give (C, m).
    """
    if starts is None:
        norm = lse(log_dens + log_pi)
        return -np.mean(np.exp(log_dens - norm[:, None]), axis=0)
    starts = np.asarray(starts)
    sizes = np.diff(np.r_[starts, log_dens.shape[0]])
    lp = np.repeat(log_pi, sizes, axis=0)
    norm = lse(log_dens + lp)
    return -np.add.reduceat(np.exp(log_dens - norm[:, None]), starts, axis=0) / sizes[:, None]


def step_size(t: int, n_components: int, eta=None, horizon=None) -> float:
    """``eta`` if given, else ``sqrt(log m / T)`` (horizon known) or ``sqrt(log m / t)``."""
    if eta is not None:
        return float(eta)
    m = max(n_components, 2)
    return math.sqrt(math.log(m) / (horizon if horizon is not None else max(t, 1)))


def adaptive_eta(grad_sq, n_components) -> np.ndarray:
    """The adaptive step ``sqrt(log m / sum_{s<=t} r_s^2)``, ``r_s = max_j g_sj - min_j g_sj``.

    ``grad_sq``: the running sum of squared gradient ranges, this step's included (scalar or
    one per client). The scale-free (AdaGrad) step of exponentiated gradient: it is the anytime
    ``sqrt(log m / t)`` when every range is 1, and ``eta_t r_t <= sqrt(log m)``, so no single
    gradient, however large, moves a weight ratio by more than ``exp(sqrt(log m))``. 0 while
    the sum is 0 (no gradient has told the weights apart yet).
    """
    m = max(n_components, 2)
    gs = np.asarray(grad_sq, float)
    return np.where(gs > 0, np.sqrt(math.log(m) / np.maximum(gs, 1e-300)), 0.0)


def floor_at(t: int, eta, weight_floor="auto"):
    """The weight floor of step ``t`` with step ``eta`` (scalar or one per client): ``weight_floor``
    if it is a number; ``"auto"``: ``min(eta, 1) / (t + 1)``.

    Mixing ``floor`` of the uniform vector into exponentiated-gradient weights that shrink by
    ``exp(-eta)`` per step holds a weight the gradients push down at ``~ floor / (m eta)``, and
    costs ``~ floor / eta`` nats per step (fixed share's ``log(1 / (1 - alpha)) / eta``). The
    ``"auto"`` floor keeps the first at ``1 / (m (t + 1))`` and the second, summed over T steps,
    of the order of ``log(T + 1)`` nats, whatever the step; a constant floor under a shrinking
    step would let both grow with ``t``.
    """
    if isinstance(weight_floor, str):
        return np.minimum(eta, 1.0) / (t + 1)
    return float(weight_floor)
