"""The contract between a model and the tilted-moment estimators: what a model's EP site
provides (:class:`SiteModel` and the optional capabilities some estimators use), what an
estimator returns (:class:`TiltedResult`), and the estimator base class."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ..gaussian import NaturalGaussian, chol_solve, cholesky, symmetrize

#: one client's statistics: fixed-shape arrays by name (numpy outside a kernel, jax inside)
Stats = dict[str, Any]


@runtime_checkable
class SiteModel(Protocol):
    """What every estimator needs from a model's site (all jax functions pure).

    ``stats`` is one client's dict of fixed-shape arrays (e.g. sufficient statistics, or its
    rows padded to a common length), so that clients stack into a batch. ``phi`` has
    ``phi_dim`` entries, the client's coefficients ``theta`` ``theta_dim``, its local
    nuisances ``z`` (e.g. a log noise sd) ``local_dim``.
    """

    if TYPE_CHECKING:  # read only: a site may compute them (properties)

        @property
        def phi_dim(self) -> int: ...

        @property
        def theta_dim(self) -> int: ...

        @property
        def local_dim(self) -> int: ...

    else:
        phi_dim: int
        theta_dim: int
        local_dim: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # what typing gives a protocol (which it cannot annotate): no instances of the
        # protocol itself, the next ``__init__`` of the class for a class that subclasses it
        if getattr(type(self), "_is_protocol", False):
            raise TypeError("Protocols cannot be instantiated")
        super().__init__(*args, **kwargs)

    def cache_key(self) -> tuple:
        """Everything that determines the compiled kernels (structure and static options)."""
        ...

    def client_stats(self, data: Any) -> Stats:
        """A client's statistics from its data (on the client)."""
        ...

    def log_collapsed(self, phi: Any, z: Any, stats: Stats) -> Any:
        """``log p(Y_k | phi, z) + log p(z)`` with ``theta_k`` integrated out (jax scalar)."""
        ...

    def init_local(self, stats: Stats) -> tuple[np.ndarray, np.ndarray]:
        """``(theta0, z0)``: starting values of the client's own variables for samplers."""
        ...


@runtime_checkable
class AugmentedSite(SiteModel, Protocol):
    """A site that also gives the joint with ``theta_k`` (``NUTSTilted(target="augmented")``)."""

    def log_augmented(self, phi: Any, theta: Any, z: Any, stats: Stats) -> Any:
        """``log p(Y_k | theta, z) + log p(theta | phi) + log p(z)`` (jax scalar)."""
        ...


@runtime_checkable
class ExactSite(SiteModel, Protocol):
    """A site exactly Gaussian in ``phi`` (``ExactTilted``)."""

    def exact_site(self, stats: Stats) -> NaturalGaussian: ...


@runtime_checkable
class ConditionallyGaussianSite(SiteModel, Protocol):
    """A site whose ``log_collapsed`` is Gaussian in the first ``gaussian_dim`` entries of
    ``phi`` (``beta``) given the rest (``psi``) and the locals ``z`` (``RaoBlackwellTilted``):
    ``log_collapsed(phi, z) = -beta' P beta / 2 + beta' h + c`` with ``(P, h, c)`` functions
    of ``x = (psi, z)``.

    ``gaussian_given(x, stats)`` (numpy) takes ``x`` of shape ``(D, B, M)`` (coordinates
    leading; B clients, M points each) and the clients' statistics stacked along a leading
    axis (arrays ``(B, ...)``), and returns ``P`` (g, g, B, M), ``h`` (g, B, M) and ``c``
    (B, M), ``g = gaussian_dim``. ``P`` need not be positive definite (only ``P`` plus the
    cavity's conditional precision is)."""

    if TYPE_CHECKING:  # read only: a site may compute it (property)

        @property
        def gaussian_dim(self) -> int: ...

    else:
        gaussian_dim: int

    def gaussian_given(self, x: np.ndarray, stats: Stats) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


@runtime_checkable
class ConvolvedGaussianSite(ConditionallyGaussianSite, Protocol):
    """A conditionally Gaussian site that also gives, in closed form, ``log_collapsed``
    averaged over a Gaussian ``beta ~ N(a, C)`` and its first two derivatives in ``(a, x)``
    (``RaoBlackwellTilted`` then finds the mode of ``x``'s marginal by Newton steps with exact
    derivatives instead of finite differences: with 16 predictors, one Hessian costs a
    factorisation per client instead of 649).

    ``convolved(a, C, x, stats, order=2)`` (numpy) takes ``a`` (B, M, g), ``C`` (B, g, g),
    ``x`` (B, M, D) and the clients' statistics stacked along a leading axis, and returns
    ``log E[exp(log_collapsed(beta, x))]`` under ``beta ~ N(a, C)`` (B, M), its gradient
    (B, M, g + D) and Hessian (B, M, g + D, g + D) in ``(a, x)`` (``None`` beyond ``order``)."""

    def convolved(
        self, a: np.ndarray, C: np.ndarray, x: np.ndarray, stats: Stats, *, order: int = 2
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]: ...


@runtime_checkable
class GibbsSite(SiteModel, Protocol):
    """A site with conditionals to sample ``theta_k`` and the locals exactly (``GibbsTilted``).

    ``collapsed_factor(phi, z, stats)`` returns ``log_collapsed`` and a factor of
    ``theta_k``'s Gaussian conditional at that point (e.g. its Cholesky factor), which
    ``draw_theta`` reuses: one factorisation per point visited. Optionally
    ``invariant_direction()``, a direction of ``(phi, locals)`` along which the likelihood is
    constant, with ``log_locals_prior(phi, z)`` (the part of ``log_collapsed`` that changes
    along it), for an extra Metropolis move that factorises nothing."""

    mh_locals: int

    def collapsed_factor(self, phi: Any, z: Any, stats: Stats) -> tuple[Any, Any]: ...

    def draw_theta(self, factor: Any, key: Any) -> Any: ...

    def draw_locals(self, phi: Any, theta: Any, z: Any, stats: Stats, key: Any) -> Any: ...


@runtime_checkable
class PreparedSite(SiteModel, Protocol):
    """A site with per-client quantities that depend on the statistics only: ``prepare`` adds
    them, once per client inside each compiled kernel, before any loop or batch over phi
    (``HierarchicalGLM``'s client estimate, the start of its inner Newton solves)."""

    def prepare(self, stats: Stats) -> Stats: ...


@dataclass
class TiltedResult:
    """Moments of phi under one client's tilted distribution, and what produced them.

    ``draws`` (when the estimator samples) maps ``"phi"``, ``"z"`` and possibly
    ``"theta"`` to arrays with a leading draw axis; ``weights`` are normalised importance
    weights (``None`` for equally weighted MCMC draws). ``state``: where a resumable
    estimator's chains stopped (:attr:`TiltedEstimator.resumable`), kept by the client for
    its next call.
    """

    mean: np.ndarray
    cov: np.ndarray
    ok: bool = True
    message: str = ""
    diagnostics: dict[str, float] = field(default_factory=dict)
    draws: dict[str, np.ndarray] | None = None
    weights: np.ndarray | None = None
    state: dict[str, np.ndarray] | None = None

    def natural(self) -> NaturalGaussian:
        """Natural parameters of N(mean, cov)."""
        L = cholesky(self.cov)
        Q = symmetrize(chol_solve(L, np.eye(self.mean.size)))
        return NaturalGaussian(Q @ self.mean, Q)


class TiltedEstimator(ABC):
    """Base class: ``estimate`` maps a batch of cavities and client statistics to moments."""

    name: str = "?"
    sampled: bool = False  # whether results carry draws (and Monte-Carlo noise)
    #: whether ``estimate`` takes ``resume``: per client, the ``state`` of its previous result
    #: (or None), from which its chains continue (a warm start: a short warm-up instead of a
    #: full one)
    resumable: bool = False

    @abstractmethod
    def estimate(
        self,
        model: SiteModel,
        cavity_mean: np.ndarray,
        cavity_cov: np.ndarray,
        stats: list[dict[str, np.ndarray]],
        seeds: np.ndarray,
        *,
        keep_draws: bool = False,
    ) -> list[TiltedResult]:
        """Tilted moments for B clients: ``cavity_mean`` (B, p), ``cavity_cov`` (B, p, p)."""

    def check_model(self, model: SiteModel) -> None:
        """Raise ``ValueError`` when this estimator cannot handle ``model`` (checked before a fit)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
