"""Shared pieces of the GP code: the hyperparameter layout, the batched exact negative log
marginal likelihood on GPyTorch kernels, closed-form prediction (the local steps' loss and
gradient, written out, are in :mod:`._local`).

Hyperparameters travel as *constrained* values (lengthscale, outputscale and noise
variance, and a constant mean when there is one), each a float64 numpy vector. Inside,
the optimisers work on GPyTorch's raw parameters: ``value = softplus(raw) + floor``
(:class:`gpytorch.constraints.GreaterThan`), the parameterisation of the published code.

Every computation that the acceptance checks compare to closed forms uses an explicit
Cholesky factorisation (never conjugate gradients), whatever the size; prediction for clients
above a few thousand rows factorises in tiles (:mod:`._tiled`) to hold half the matrix.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass

import gpytorch
import numpy as np
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from scipy import stats as sst

from .. import streams
from ..result_file import register
from ..results import prediction_frame
from . import _tiled

KERNELS = ("rbf", "matern")
MEANS = ("zero", "constant")
NUS = (0.5, 1.5, 2.5)
LOG2 = math.log(2.0)


def resolve_device(device) -> torch.device:
    """``"auto"`` -> CUDA when present, else the CPU; otherwise ``torch.device(device)``."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, str):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or a torch.device, got {device!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but CUDA is not available; use device='auto' or 'cpu'")
    return dev


#: matrices up to this size are factorised with one CPU thread (see :func:`small_work`)
SMALL = 512


@contextmanager
def small_work(device, size: int):
    """Run small CPU linear algebra on one thread, then restore torch's thread count.

    For the 20-500 point matrices of local steps, a second intra-op thread costs more in
    synchronisation than it saves (2-3x slower on a 2-core machine); larger problems and the
    GPU keep torch's setting.
    """
    if torch.device(device).type != "cpu" or size > SMALL or torch.get_num_threads() == 1:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def resolve_dtype(dtype) -> torch.dtype:
    table = {
        "float64": torch.float64,
        "float32": torch.float32,
        torch.float64: torch.float64,
        torch.float32: torch.float32,
    }
    if dtype not in table:
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    return table[dtype]


@register
@dataclass(frozen=True)
class HyperSpec:
    """The shared GP prior's form: kernel family, ARD, mean and the constraint floors."""

    d: int
    kernel: str = "rbf"
    nu: float = 1.5
    ard: bool = False
    mean: str = "zero"
    lengthscale_floor: float = 1e-6
    outputscale_floor: float = 1e-6
    noise_floor: float = 1e-4

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.kernel == "matern" and self.nu not in NUS:
            raise ValueError(f"nu must be one of {NUS} for the Matern kernel, got {self.nu!r}")
        if self.mean not in MEANS:
            raise ValueError(f"mean must be one of {MEANS}, got {self.mean!r}")
        if not isinstance(self.ard, bool):
            raise ValueError(f"ard must be True or False, got {self.ard!r}")
        for name in ("lengthscale_floor", "outputscale_floor", "noise_floor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return ("lengthscale", "outputscale", "noise") + (("mean",) if self.mean == "constant" else ())

    def size(self, name: str) -> int:
        return self.d if (name == "lengthscale" and self.ard) else 1

    def floor(self, name: str) -> float | None:
        return {
            "lengthscale": self.lengthscale_floor,
            "outputscale": self.outputscale_floor,
            "noise": self.noise_floor,
        }.get(name)

    def labels(self, feature_names=None) -> list[str]:
        """One label per scalar: ``lengthscale`` or ``lengthscale[x0]``..., then the rest."""
        out = []
        for name in self.names:
            if self.size(name) > 1:
                feats = feature_names if feature_names is not None else [f"x{j}" for j in range(self.d)]
                out += [f"{name}[{f}]" for f in feats]
            else:
                out.append(name)
        return out

    def default(self) -> dict[str, np.ndarray]:
        """log 2 for every positive hyperparameter (softplus(0), GPyTorch's and the published
        code's start), 0 for the mean."""
        return {n: np.full(self.size(n), 0.0 if n == "mean" else LOG2) for n in self.names}

    def check(self, hyper, what: str = "hyperparameters") -> dict[str, np.ndarray]:
        """Validated float64 copies of ``hyper`` (a mapping name -> value)."""
        if not hasattr(hyper, "keys"):
            raise ValueError(f"{what} must be a mapping of {self.names}, got {type(hyper).__name__}")
        if set(hyper) != set(self.names):
            raise ValueError(f"{what} must name exactly {self.names}, got {sorted(hyper)}")
        out = {}
        for n in self.names:
            v = np.atleast_1d(np.asarray(hyper[n], dtype=float)).copy()
            if v.shape == (1,) and self.size(n) > 1:
                v = np.full(self.size(n), v[0])
            if v.shape != (self.size(n),):
                raise ValueError(f"{what}: {n} must have {self.size(n)} value(s), got shape {v.shape}")
            if not np.all(np.isfinite(v)):
                raise ValueError(f"{what}: {n} is not finite ({v})")
            fl = self.floor(n)
            if fl is not None and np.any(v <= fl):
                raise ValueError(f"{what}: {n} must exceed its floor {fl:g}, got {v}")
            out[n] = v
        return out

    # ---- transforms between constrained values and GPyTorch's raw parameters
    def constraint(self, name: str):
        fl = self.floor(name)
        return None if fl is None else gpytorch.constraints.GreaterThan(fl)

    def to_raw(self, name: str, value: torch.Tensor) -> torch.Tensor:
        fl = self.floor(name)
        return value if fl is None else _bound(fl).inverse_transform(value)

    def from_raw(self, name: str, raw: torch.Tensor) -> torch.Tensor:
        fl = self.floor(name)
        return raw if fl is None else _bound(fl).transform(raw)

    def slope(self, name: str, raw: torch.Tensor) -> torch.Tensor:
        """``d from_raw / d raw``: softplus's slope ``sigmoid(raw)`` (1 above its threshold 20,
        where softplus is the identity), 1 for the mean."""
        if self.floor(name) is None:
            return torch.ones_like(raw)
        return torch.where(raw > 20, 1.0, torch.sigmoid(raw))


@functools.lru_cache(maxsize=None)
def _bound(floor: float) -> gpytorch.constraints.GreaterThan:
    """The constraint of :meth:`HyperSpec.from_raw` / ``to_raw``, built once (0.2 ms each time);
    a module gets its own (:meth:`HyperSpec.constraint`): ``.to()`` converts its buffers."""
    return gpytorch.constraints.GreaterThan(floor)


class BatchGP(torch.nn.Module):
    """G independent zero- or constant-mean GPs with their own hyperparameters (batch mode).

    The kernel is GPyTorch's ``ScaleKernel(RBFKernel | MaternKernel)`` with
    ``batch_shape=[G]``; the noise variance and the constant mean are raw parameters of this
    module with the same softplus-plus-floor transform. :meth:`nll` evaluates the exact
    negative log marginal likelihood of G data sets of equal size at once.
    """

    def __init__(self, spec: HyperSpec, G: int, device, dtype):
        super().__init__()
        self.spec, self.G = spec, G
        bs = torch.Size([G])
        ard = spec.d if spec.ard else None
        lc = spec.constraint("lengthscale")
        if spec.kernel == "rbf":
            base = gpytorch.kernels.RBFKernel(ard_num_dims=ard, batch_shape=bs, lengthscale_constraint=lc)
        else:
            base = gpytorch.kernels.MaternKernel(
                nu=spec.nu, ard_num_dims=ard, batch_shape=bs, lengthscale_constraint=lc
            )
        self.kernel = gpytorch.kernels.ScaleKernel(
            base, batch_shape=bs, outputscale_constraint=spec.constraint("outputscale")
        )
        self.raw_noise = torch.nn.Parameter(torch.zeros(G))
        self.raw_mean = torch.nn.Parameter(torch.zeros(G)) if spec.mean == "constant" else None
        self.to(device=device, dtype=dtype)

    def leaves(self) -> dict[str, torch.Tensor]:
        """The raw parameters by hyperparameter name (views of the module's parameters)."""
        out = {
            "lengthscale": self.kernel.base_kernel.raw_lengthscale,
            "outputscale": self.kernel.raw_outputscale,
            "noise": self.raw_noise,
        }
        if self.raw_mean is not None:
            out["mean"] = self.raw_mean
        return out

    def set_raw(self, raw: dict[str, torch.Tensor]) -> None:
        """Copy raw values (each ``[G, size]``) into the parameters."""
        with torch.no_grad():
            for n, p in self.leaves().items():
                p.copy_(raw[n].reshape(p.shape))

    def values(self) -> dict[str, torch.Tensor]:
        """Constrained values, each ``[G, size]`` (differentiable)."""
        return {n: self.spec.from_raw(n, p).reshape(self.G, -1) for n, p in self.leaves().items()}

    def covariance(self, X1: torch.Tensor, X2: torch.Tensor | None = None) -> torch.Tensor:
        """Dense kernel matrix ``[G, n1, n2]`` (the kernel's ``forward``, without GPyTorch's lazy
        tensor wrapper)."""
        out = self.kernel.forward(X1, X1 if X2 is None else X2)
        return out.to_dense() if hasattr(out, "to_dense") else out

    def nll(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Exact negative log marginal likelihood of each of the G data sets: ``[G]``.

        ``X`` is ``[G, M, d]`` and ``y`` is ``[G, M]``; computed by a Cholesky factorisation
        (GPyTorch's ``psd_safe_cholesky``, which adds jitter only if the plain one fails).
        """
        M = X.shape[-2]
        base = self.kernel.base_kernel.forward(X, X)
        base = base.to_dense() if hasattr(base, "to_dense") else base
        noise = self.spec.from_raw("noise", self.raw_noise)
        r = y if self.raw_mean is None else y - self.raw_mean[:, None]
        return _GaussianNLL.apply(base, self.kernel.outputscale, noise, r) + 0.5 * M * math.log(2 * math.pi)


class _GaussianNLL(torch.autograd.Function):
    """``0.5 r^T K^{-1} r + 0.5 log det K`` with ``K = s B + v I``, for a batch of base kernel
    matrices ``B`` ``[G, M, M]``, outputscales ``s`` and noise variances ``v`` ``[G]`` and
    residuals ``r`` ``[G, M]``, by a Cholesky factorisation of ``K``.

    The backward pass uses the closed form ``dL/dK = (K^{-1} - a a^T) / 2`` (``a = K^{-1} r``),
    hence ``dL/dB = s dL/dK``, ``dL/ds = <dL/dK, B>``, ``dL/dv = tr dL/dK`` and ``dL/dr = a``:
    the gradients of differentiating through the factorisation, at a fraction of the cost (one
    ``cholesky_inverse`` instead of the generic Cholesky and triangular-solve backward passes,
    and no elementwise passes for the scale and the noise)."""

    @staticmethod
    def forward(ctx, base, scale, noise, r):
        value, Kinv, alpha = _factor(base, scale, noise, r, any(ctx.needs_input_grad))
        if Kinv is not None:
            ctx.save_for_backward(base, scale, Kinv, alpha)
        return value

    @staticmethod
    def backward(ctx, grad):
        base, scale, Kinv, alpha = ctx.saved_tensors
        W = torch.baddbmm(Kinv, alpha.unsqueeze(-1), alpha.unsqueeze(-2), alpha=-1.0)  # dL/dK = grad W / 2
        half = 0.5 * grad
        g_base = g_scale = g_noise = g_r = None
        if ctx.needs_input_grad[0]:
            g_base = W * (half * scale)[:, None, None]
        if ctx.needs_input_grad[1]:
            g_scale = half * (W.reshape(len(W), 1, -1) @ base.reshape(len(W), -1, 1)).reshape(-1)
        if ctx.needs_input_grad[2]:
            g_noise = half * torch.diagonal(W, dim1=-2, dim2=-1).sum(-1)
        if ctx.needs_input_grad[3]:
            g_r = alpha * grad[:, None]
        return g_base, g_scale, g_noise, g_r


def _buffer(work: dict | None, name: str, like: torch.Tensor, shape, column_major: bool = False) -> torch.Tensor | None:
    """``work[name]``, a ``[G, M, M]`` buffer kept between calls (None without ``work``): fresh
    tensors of that size every local step cost more in page faults than in arithmetic."""
    if work is None:
        return None
    t = work.get(name)
    if t is None or t.shape != shape or t.dtype != like.dtype or t.device != like.device:
        t = work[name] = like.new_empty(shape).mT if column_major else like.new_empty(shape)
    return t


def _factor(base, scale, noise, r, inverse: bool, work: dict | None = None):
    """``0.5 r^T K^{-1} r + 0.5 log det K`` (``[G]``) with ``K = s B + v I`` by GPyTorch's
    ``psd_safe_cholesky`` (jitter only if the plain Cholesky fails), ``K^{-1}`` (``inverse``;
    else None) and ``a = K^{-1} r``, in the buffers of ``work`` (:func:`_buffer`) if given."""
    K = torch.mul(base, scale[:, None, None], out=_buffer(work, "K", base, base.shape))
    K.diagonal(dim1=-2, dim2=-1).add_(noise[:, None])
    # K is symmetric (LAPACK reads one triangle): its transpose is column-major, as LAPACK needs
    L = psd_safe_cholesky(K.mT, out=_buffer(work, "L", base, base.shape, True))
    del K
    logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    Kinv = None
    if inverse:  # K^{-1} is symmetric (exactly, from LAPACK): its transpose is it, row-major
        Kinv = torch.cholesky_inverse(L, out=_buffer(work, "Kinv", base, base.shape, True)).mT
        # K's buffer is free: faster than the triangular solves, or than bmm
        alpha = torch.mul(Kinv, r.unsqueeze(-2), out=_buffer(work, "K", base, base.shape)).sum(-1)
    else:
        alpha = torch.cholesky_solve(r.unsqueeze(-1), L).squeeze(-1)
    return 0.5 * (r * alpha).sum(-1) + logdet, Kinv, alpha


def raw_tensors(spec: HyperSpec, hypers: list[dict], device, dtype) -> dict[str, torch.Tensor]:
    """Stack the constrained values of G hyperparameter sets into raw ``[G, size]`` tensors."""
    out = {}
    for n in spec.names:
        v = torch.as_tensor(np.stack([np.asarray(h[n], dtype=float) for h in hypers]), dtype=torch.float64)
        out[n] = spec.to_raw(n, v).to(device=device, dtype=dtype)
    return out


def single_model(spec: HyperSpec, hyper: dict, device, dtype) -> BatchGP:
    """A one-member :class:`BatchGP` holding ``hyper``."""
    m = BatchGP(spec, 1, device, dtype)
    m.set_raw(raw_tensors(spec, [hyper], device, dtype))
    return m


# --------------------------------------------------------------------------- prediction


def posterior(
    spec: HyperSpec,
    hyper: dict,
    X: np.ndarray,
    y: np.ndarray,
    Xs: np.ndarray,
    *,
    device,
    dtype,
    chunk: int = 4096,
    dense_max: int | None = None,
    tile: int | None = None,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and latent variance of f at ``Xs`` given ``(X, y)`` under ``hyper`` (the GP predictive):
    ``mu = m + K*^T (K + s I)^{-1} (y - m)``, ``var_f = k** - K*^T (K + s I)^{-1} K*``.

    Exact (Cholesky) on all rows at every size. Up to ``dense_max`` rows (default
    :data:`._tiled.DENSE_MAX`, 4096) one dense factorisation, ``Xs`` in chunks of ``chunk``;
    above, the tiled factorisation of :func:`._tiled.tiled_posterior` (tiles of ``tile`` rows,
    default 2048), which holds half the matrix, checks the host memory first and shows a
    progress bar (``progress``: True, False, or None for "when stderr is a terminal")."""
    model = single_model(spec, hyper, device, dtype)
    n = len(y)
    limit = _tiled.DENSE_MAX if dense_max is None else dense_max
    with torch.no_grad(), small_work(device, n):
        Xt = torch.as_tensor(np.array(X, dtype=float), device=device, dtype=dtype).unsqueeze(0)
        yt = torch.as_tensor(np.array(y, dtype=float), device=device, dtype=dtype).unsqueeze(0)
        vals = model.values()
        noise, os_ = vals["noise"][0, 0], vals["outputscale"][0, 0]
        m0 = vals["mean"][0, 0] if "mean" in vals else torch.zeros((), dtype=dtype, device=device)
        if n > limit:
            return _tiled.tiled_posterior(
                lambda A, B: model.covariance(A.unsqueeze(0), B.unsqueeze(0))[0],
                Xt[0],
                yt[0] - m0,
                Xs,
                noise=noise,
                prior_var=os_,
                mean=m0,
                tile=_tiled.TILE if tile is None else tile,
                progress=progress,
            )
        K = model.covariance(Xt)[0]
        K.diagonal().add_(noise)  # in place: no second N x N matrix for the noise
        L = psd_safe_cholesky(K)
        del K
        alpha = torch.cholesky_solve((yt[0] - m0).unsqueeze(-1), L).squeeze(-1)
        means, vars_ = [], []
        for s in range(0, len(Xs), chunk):
            xs = torch.as_tensor(np.array(Xs[s : s + chunk], dtype=float), device=device, dtype=dtype).unsqueeze(0)
            Ks = model.covariance(Xt, xs)[0]  # (N, n*)
            means.append((m0 + Ks.T @ alpha).cpu().numpy())
            v = torch.linalg.solve_triangular(L, Ks, upper=False)
            vars_.append(torch.clamp(os_ - (v * v).sum(0), min=0).cpu().numpy())
    return np.concatenate(means), np.concatenate(vars_)


def band_frame(mean, var_f, level: float, var_y=None):
    """The prediction table of the result contract: ``mean``, ``lower``/``upper`` (the central
    ``level`` band of f), ``pred_lower``/``pred_upper`` (given the predictive variance
    ``var_y``; NaN without), then ``sd`` and ``pred_sd``."""
    z = sst.norm.ppf(0.5 + level / 2)
    sd = np.sqrt(var_f)
    if var_y is None:
        return prediction_frame(mean, mean - z * sd, mean + z * sd, sd=sd)
    psd = np.sqrt(var_y)
    return prediction_frame(mean, mean - z * sd, mean + z * sd, mean - z * psd, mean + z * psd, sd=sd, pred_sd=psd)


def hyper_to_numpy(spec: HyperSpec, values: dict[str, torch.Tensor], i: int) -> dict[str, np.ndarray]:
    return {n: values[n][i].detach().to(torch.float64).cpu().numpy().reshape(spec.size(n)).copy() for n in spec.names}


# --------------------------------------------------------------------------- exact MLE


def random_start(spec: HyperSpec, X: np.ndarray, rng: np.random.Generator) -> dict:
    """A random starting point: lengthscale log-uniform on [0.02, 2] times the input span,
    outputscale on [0.1, 10], noise on [1e-3, 0.5] (for standardised targets), mean 0."""
    span = np.ptp(np.asarray(X, dtype=float), axis=0)
    span = np.where(span > 0, span, 1.0)
    span = span if spec.ard else np.array([span.max()])
    lu = lambda lo, hi, n=1: np.exp(rng.uniform(np.log(lo), np.log(hi), n))  # noqa: E731
    start = {"lengthscale": lu(0.02, 2, len(span)) * span, "outputscale": lu(0.1, 10), "noise": lu(1e-3, 0.5)}
    if spec.mean == "constant":
        start["mean"] = np.zeros(1)
    return {k: np.maximum(v, 2 * (spec.floor(k) or 0)) if k != "mean" else v for k, v in start.items()}


def fit_mle(
    spec: HyperSpec,
    X: np.ndarray,
    y: np.ndarray,
    *,
    init: dict | None = None,
    feature=None,
    restarts: int = 1,
    seed: int = 0,
    max_iter: int = 500,
    device="cpu",
    dtype=torch.float64,
) -> tuple[dict, float, float]:
    """Maximum marginal-likelihood hyperparameters of one exact GP by L-BFGS (centralised).

    ``feature`` (n,) adds a mean ``rho * feature`` with a free coefficient rho (the
    autoregressive link of AR1 co-kriging). Starts from ``init`` (default log 2) and, for
    ``restarts > 1``, from :func:`random_start` draws seeded by ``seed``; keeps the best.
    Returns ``(hyper, rho, mean nll)`` (rho is 0 without a feature).
    """
    return fit_mle_sum(
        spec,
        [X],
        [y],
        init=init,
        features=None if feature is None else [feature],
        restarts=restarts,
        seed=seed,
        max_iter=max_iter,
        device=device,
        dtype=dtype,
    )


def fit_mle_sum(
    spec: HyperSpec,
    Xs,
    ys,
    *,
    init: dict | None = None,
    features=None,
    restarts: int = 1,
    seed: int = 0,
    max_iter: int = 500,
    device="cpu",
    dtype=torch.float64,
) -> tuple[dict, float, float]:
    """Shared hyperparameters maximising ``sum_k p_k L_k / N_k`` over data sets ``(X_k, y_k)``
    with ``p_k = N_k / N``: the FGPR objective optimised centrally by L-BFGS, each
    data set an independent GP. See :func:`fit_mle` for ``features``, ``init`` and ``restarts``."""
    rng = streams.stream(seed, "hyperparameter")
    as_t = lambda a: torch.as_tensor(np.array(a, dtype=float), device=device, dtype=dtype)[None]  # noqa: E731
    Xt, yt = [as_t(X) for X in Xs], [as_t(y) for y in ys]
    ft = None if features is None else [as_t(f) for f in features]
    ns = [y.shape[-1] for y in yt]
    N = sum(ns)
    best = None
    for r in range(max(1, restarts)):
        start = (
            init
            if (r == 0 and init is not None)
            else spec.default()
            if r == 0
            else random_start(
                spec, np.vstack([np.asarray(X, dtype=float).reshape(len(y), -1) for X, y in zip(Xs, ys)]), rng
            )
        )
        model = single_model(spec, start, device, dtype)
        rho = torch.zeros((), device=device, dtype=dtype, requires_grad=True)
        params = list(model.parameters()) + ([rho] if ft is not None else [])
        opt = torch.optim.LBFGS(
            params, lr=1, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe"
        )

        def objective():
            total = 0
            for k, (X, y) in enumerate(zip(Xt, yt)):
                target = y if ft is None else y - rho * ft[k]
                total = total + model.nll(X, target)[0] / N  # p_k L_k / N_k = L_k / N
            return total

        def closure():
            opt.zero_grad()
            loss = objective()
            loss.backward()
            return loss

        try:
            with small_work(device, max(ns)):
                opt.step(closure)
            with torch.no_grad():
                loss = float(objective())
        except Exception:  # noqa: BLE001 - a start that breaks the factorisation is skipped
            continue
        if np.isfinite(loss) and (best is None or loss < best[2]):
            best = (hyper_to_numpy(spec, model.values(), 0), float(rho.detach()), loss)
    if best is None:
        raise FloatingPointError("the maximum-likelihood fit failed from every start")
    return best


def mixture(paths: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the equal-weight mixture over paths (means and variances, each
    ``(paths, points)``): ``mean_s m_s``, ``mean_s v_s + var_s m_s``."""
    M, V = paths
    return M.mean(0), V.mean(0) + M.var(0)
