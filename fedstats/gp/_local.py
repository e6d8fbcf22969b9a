"""The local steps' arithmetic of FGPR: the batched exact negative log marginal likelihood of
G minibatches and its gradient with respect to the raw hyperparameters, written out (no
autograd graph), on GPyTorch's kernel arithmetic, in buffers kept between steps. Its oracle
(tests/gp/test_fgpr.py) is autodiff through torch's Cholesky factorisation of the dense
kernel matrix."""

from __future__ import annotations

import math

import torch

from ._core import HyperSpec, _buffer, _factor


def _sq_dist(Z: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """GPyTorch's ``sq_dist(Z, Z, x1_eq_x2=True)`` (the same operations), into ``out``."""
    Z = Z - Z.mean(-2, keepdim=True)
    norm = Z.pow(2).sum(dim=-1, keepdim=True)
    pad = torch.ones_like(norm)
    res = torch.matmul(torch.cat([-2.0 * Z, norm, pad], dim=-1), torch.cat([Z, pad, norm], dim=-1).mT, out=out)
    res.diagonal(dim1=-2, dim2=-1).fill_(0)
    return res.clamp_min_(0)


def _base_kernel(spec: HyperSpec, X: torch.Tensor, ls: torch.Tensor, work: dict | None = None):
    """The unit-outputscale kernel ``B`` (``[G, M, M]``) at inputs ``X`` (``[G, M, d]``) with
    lengthscales ``ls`` (``[G, 1, 1]``, or ``[G, 1, d]`` with ARD), by the arithmetic of
    GPyTorch's RBF and Matern covariance functions; with it ``D`` and the scaled inputs ``Z``.
    One lengthscale: ``dB/dl = D / l``. ARD: ``dB/dl_j = D * (z_j - z_j^T)^2 / l_j`` elementwise
    (``z_j``: column j of ``Z``, a column vector). ``work``: see :func:`_buffer` (``"K"`` is
    scratch space here)."""
    shape = X.shape[:-1] + X.shape[-2:-1]
    buf = lambda name: _buffer(work, name, X, shape)  # noqa: E731
    if spec.kernel == "rbf":
        Z = X.div(ls)
        D2 = _sq_dist(Z, buf("D"))
        B = torch.div(D2, -2.0, out=buf("B")).exp_()
        return B, (B if spec.ard else D2.mul_(B)), Z
    Z = (X - X.mean(dim=-2, keepdim=True)).div(ls)
    S = _sq_dist(Z, buf("D")).clamp_min_(1e-30).sqrt_().mul_(math.sqrt(2 * spec.nu))  # sqrt(2 nu) r
    E = torch.neg(S, out=buf("E")).exp_()
    if spec.nu == 0.5:  # B = exp(-S)
        return E, (torch.div(E, S, out=S) if spec.ard else S.mul_(E)), Z
    B = torch.add(S, 1, out=buf("B"))
    if spec.nu == 1.5:  # B = (1 + S) exp(-S)
        return B.mul_(E), (E.mul_(3) if spec.ard else S.square_().mul_(E)), Z
    quad = torch.square(S, out=buf("K")).div_(3)  # nu = 2.5: B = (1 + S + S^2 / 3) exp(-S)
    D = torch.mul(B, E, out=S).mul_(5 / 3 if spec.ard else quad)
    return B.add_(quad).mul_(E), D, Z


def nll_grad(
    spec: HyperSpec, raw: torch.Tensor, X: torch.Tensor, y: torch.Tensor, work: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`~._core.BatchGP.nll` of G data sets (``X`` ``[G, M, d]``, ``y`` ``[G, M]``) at the raw
    hyperparameters ``raw`` (``[G, P]``: the names of ``spec.names`` in order), and its gradient
    with respect to ``raw``, written out (no autograd graph): with ``W = K^{-1} - a a^T``,
    ``dL/dK = W / 2`` contracted with each hyperparameter's ``dK`` (:func:`_base_kernel`),
    times the slope of the raw transform. ``work``: a dict that keeps its buffers between calls."""
    G, M = y.shape
    raws = raw.split([spec.size(n) for n in spec.names], dim=1)
    val = {n: spec.from_raw(n, p) for n, p in zip(spec.names, raws)}
    ls, s, v = val["lengthscale"], val["outputscale"][:, 0], val["noise"][:, 0]
    r = y - val["mean"] if "mean" in val else y
    B, D, Z = _base_kernel(spec, X, ls[:, None, :], work)
    value, Kinv, a = _factor(B, s, v, r, True, work)
    # <W, dK> with W = K^-1 - a a^T, without forming W where a closed form exists: since
    # K a = r and s B = K - v I, <W, I> = tr K^-1 - |a|^2 and <W, B> = (M - a.r - v <W, I>) / s
    trace_W = torch.diagonal(Kinv, dim1=-2, dim2=-1).sum(-1) - (a * a).sum(-1)
    grad = {"noise": 0.5 * trace_W, "mean": -a.sum(-1)}
    grad["outputscale"] = 0.5 * (M - (a * r).sum(-1) - v * trace_W) / s
    if spec.ard:  # sum_ik P_ik (z_ij - z_kj)^2 = 2 sum_i z_ij^2 sum_k P_ik - 2 z_j^T P z_j (P symmetric)
        P = Kinv.addcmul_(a.unsqueeze(-1), a.unsqueeze(-2), value=-1.0).mul_(D)  # W * D, in place
        P.diagonal(dim1=-2, dim2=-1).zero_()  # z_ij - z_ij = 0: the diagonal adds nothing
        Zc = Z - Z.mean(dim=-2, keepdim=True)
        q = 2 * (P.sum(-1, keepdim=True) * Zc - P @ Zc).mul_(Zc).sum(-2)
    else:  # <K^-1 - a a^T, D>, W formed in place
        W = Kinv.addcmul_(a.unsqueeze(-1), a.unsqueeze(-2), value=-1.0)
        q = torch.mul(W, D, out=_buffer(work, "K", X, W.shape)).sum((-2, -1))[:, None]  # K is scratch here
    grad["lengthscale"] = 0.5 * s[:, None] * q / ls
    g = torch.cat([(grad[n].reshape(G, -1) * spec.slope(n, p)) for n, p in zip(spec.names, raws)], dim=1)
    return value + 0.5 * M * math.log(2 * math.pi), g
