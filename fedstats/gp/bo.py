"""BoTorch models of fedstats's GP surrogates (the optional extra ``fedstats[bo]``).

* :func:`exact_gp`: a BoTorch ``SingleTaskGP`` that *is* a GP with fedstats hyperparameters,
  conditioned on data on its natural scale. FGPR standardises a client's targets
  (``y = mu + sd z``) and models ``z`` with outputscale ``s`` and noise ``v``; that is the GP
  on ``y`` with constant mean ``mu``, outputscale ``sd^2 s`` and noise ``sd^2 v``, which is
  what this builds: no outcome or input transform, hyperparameters fixed (eval mode), so
  BoTorch's acquisition functions, ``optimize_acqf``, fantasies and
  ``condition_on_observations`` work on it as on any ``SingleTaskGP``.
  :meth:`FGPRResult.to_botorch <fedstats.gp.FGPRResult.to_botorch>` returns one.
* :func:`joint_model`: a one-output BoTorch ``Model`` whose ``posterior(X)`` is the joint
  normal over the query batch that a function of ``X`` gives, differentiable in ``X``. The
  autoregressive multi-fidelity predictor ``f_T = rho_T f_{T-1} + delta_T`` (each fidelity's
  ``delta_t`` an exact GP on its residuals) has mean ``rho_T m_{T-1} + m_T`` and covariance
  ``rho_T^2 S_{T-1} + S_T`` over the batch (:func:`chain`):
  :meth:`AR1Result.to_botorch <fedstats.gp.ar1_result.AR1Result.to_botorch>` (a fitted
  ``AR1CoKriging``) computes it from every fidelity in one place,
  :meth:`FederatedAR1Result.to_botorch <fedstats.gp.ar1_result.FederatedAR1Result.to_botorch>`
  (a fitted ``FederatedAR1``) asks each fidelity's client in turn. These models have
  no fantasies (``fantasize``, ``condition_on_observations``): acquisition functions built on
  them (``qKnowledgeGradient``, the analytic ``LogNoisyExpectedImprovement``) do not apply;
  the analytic and Monte-Carlo ones that only ask for posteriors (``LogExpectedImprovement``,
  ``UpperConfidenceBound``, ``qLogExpectedImprovement``, ``qLogNoisyExpectedImprovement``,
  ``qUpperConfidenceBound``) do.

BoTorch computes posteriors with GPyTorch's settings, which importing BoTorch changes for the
whole process: Cholesky factorisations up to 4,096 training rows (``max_cholesky_size``;
conjugate gradients above: raise it for exact answers on larger clients), and up to 6 jitter
tries on a matrix that is not positive definite (``cholesky_max_tries``; GPyTorch's default is
3), which fedstats's own Cholesky factorisations follow as well.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._core import HyperSpec

if TYPE_CHECKING:  # the optional extra fedstats[bo]
    from botorch.models import SingleTaskGP


def require_botorch():
    """The ``botorch`` module, or an ImportError that says how to install it."""
    try:
        import botorch
    except ImportError as exc:  # pragma: no cover - the tests install the extra
        raise ImportError("BoTorch models need the optional extra: pip install 'fedstats[bo]'") from exc
    return botorch


def _kernel(spec: HyperSpec, hyper: dict, scale: float, dtype):
    import gpytorch

    dims = spec.d if spec.ard else None
    if spec.kernel == "rbf":
        base = gpytorch.kernels.RBFKernel(ard_num_dims=dims)
    else:
        base = gpytorch.kernels.MaternKernel(nu=spec.nu, ard_num_dims=dims)
    kernel = gpytorch.kernels.ScaleKernel(base).to(dtype)
    kernel.base_kernel.lengthscale = torch.as_tensor(hyper["lengthscale"], dtype=dtype).reshape(1, -1)
    kernel.outputscale = torch.as_tensor(scale**2 * float(hyper["outputscale"][0]), dtype=dtype)
    return kernel


def exact_gp(
    spec: HyperSpec, hyper: dict, X, y, *, offset: float = 0.0, scale: float = 1.0, dtype=torch.float64
) -> SingleTaskGP:
    """A BoTorch ``SingleTaskGP`` of ``offset + scale * f``, where ``f`` is the GP of ``spec``
    with hyperparameters ``hyper`` (constrained values, :class:`~._core.HyperSpec`'s names)
    conditioned on ``(X, y)`` (``y`` on ``f``'s scale): training targets ``offset + scale * y``,
    constant mean ``offset + scale * mean`` (``mean`` 0 without one), outputscale
    ``scale^2 * outputscale``, noise ``scale^2 * noise``, all fixed. In eval mode."""
    botorch = require_botorch()
    import gpytorch
    from botorch.models import SingleTaskGP

    X = torch.as_tensor(np.array(X, dtype=float), dtype=dtype)
    X = X[:, None] if X.ndim == 1 else X
    Y = offset + scale * torch.as_tensor(np.array(y, dtype=float), dtype=dtype).reshape(-1, 1)
    mean = gpytorch.means.ConstantMean().to(dtype)
    mean.constant = torch.as_tensor(offset + scale * float(hyper.get("mean", [0.0])[0]), dtype=dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(0.0))
    likelihood = likelihood.to(dtype)
    likelihood.noise = torch.as_tensor(scale**2 * float(hyper["noise"][0]), dtype=dtype)
    with botorch.settings.validate_input_scaling(False), warnings.catch_warnings():
        warnings.simplefilter("ignore", category=botorch.exceptions.InputDataWarning)
        model = SingleTaskGP(
            X,
            Y,
            likelihood=likelihood,
            covar_module=_kernel(spec, hyper, scale, dtype),
            mean_module=mean,
            outcome_transform=None,
        )
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    return model


def latent(model, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean ``[..., q]`` and covariance ``[..., q, q]`` of the latent ``f`` of ``model``
    (a ``SingleTaskGP``) at a query batch ``X`` (``[..., q, d]``), differentiable in ``X``."""
    mvn = model.posterior(X).distribution
    return mvn.mean, mvn.covariance_matrix


Answer = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor]]


def joint_model(answer: Answer) -> Any:
    """A one-output BoTorch ``Model`` whose ``posterior(X)`` is the joint normal with the mean
    ``[..., q]`` and covariance ``[..., q, q]`` that ``answer(X, observation_noise)`` gives
    (differentiable in ``X``; with ``observation_noise`` the covariance of new observations)."""
    return _joint_class()(answer)


@functools.cache
def _joint_class():
    import gpytorch
    from botorch.models.model import Model
    from botorch.posteriors.gpytorch import GPyTorchPosterior
    from linear_operator.operators import DenseLinearOperator

    class JointModel(Model):
        """A BoTorch ``Model`` of one output from a function of the query batch (see
        :func:`joint_model`)."""

        def __init__(self, answer: Answer):
            super().__init__()
            self._answer = answer

        @property
        def num_outputs(self) -> int:
            return 1

        @property
        def batch_shape(self) -> torch.Size:
            return torch.Size([])

        def posterior(self, X, output_indices=None, observation_noise=False, posterior_transform=None, **kwargs):
            if output_indices not in (None, [0]):
                raise ValueError(f"the model has one output, got output_indices={output_indices}")
            if isinstance(observation_noise, torch.Tensor):
                raise NotImplementedError("observation_noise: True or False (the model's own noise)")
            mean, cov = self._answer(X, bool(observation_noise))
            # as a linear operator, the covariance is factorised with GPyTorch's jitter when it
            # is nearly singular (a batch that repeats a point, candidates on the baseline)
            post = GPyTorchPosterior(gpytorch.distributions.MultivariateNormal(mean, DenseLinearOperator(cov)))
            return post if posterior_transform is None else posterior_transform(post)

    return JointModel


def chain(lower: tuple[torch.Tensor, torch.Tensor] | None, rho: float, own: tuple[torch.Tensor, torch.Tensor]):
    """One fidelity of the autoregressive chain: ``(rho m + m_t, rho^2 S + S_t)``, or the fidelity's
    own term at the lowest fidelity (``lower`` None)."""
    if lower is None:
        return own
    return rho * lower[0] + own[0], rho**2 * lower[1] + own[1]


def natural(mean: torch.Tensor, cov: torch.Tensor, mu: float, sd: float, noise: float | None):
    """``mu + sd f`` of a standardised ``f``; with ``noise`` (the standardised noise variance)
    the covariance of new observations."""
    cov = sd**2 * cov
    if noise is not None:
        cov = cov + sd**2 * noise * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    return mu + sd * mean, cov
