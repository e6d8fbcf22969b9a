"""The user's differential-privacy option: :class:`DifferentialPrivacy`."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from ..estimator import is_int
from ..result_file import register
from .mechanism import (
    ClippedSums,
    Placement,
    _is_real,
    check_clip,
    check_noise_multiplier,
    check_placement,
    clip_rows,
    effective_noise_multiplier,
    gaussian_noise,
    noise_scales,
)

#: the accountants: Renyi DP (dp-accounting's ``RdpAccountant``) or privacy loss distributions
#: (``PLDAccountant``)
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")
#: the default ``delta``: well under ``1 / n`` for up to about 100,000 rows
DEFAULT_DELTA = 1e-6
#: a fit warns when it spent more epsilon than this (``DifferentialPrivacy(warn_epsilon=)``):
#: beyond about 10 the bound on what one row changes (a factor ``e^epsilon``) protects little
WARN_EPSILON = 10.0


@register
@dataclass(frozen=True)
class DifferentialPrivacy:
    """Opt-in differential privacy for the sums a model releases.

    Every summed key of every round is clipped per row on the client (:func:`clip_rows`) and
    released through the Gaussian mechanism; the rounds and one-off exchanges compose, and a
    :class:`PrivacyLedger` adds up the spent ``(epsilon, delta)`` with Google's dp-accounting.
    The neighbouring relation is adding or removing one row (one record of one client).
    The noise is *not* part of a model's intervals unless the model says it includes it.

    Parameters
    ----------
    noise_multiplier : float
        ``z >= 0``: the noise's standard deviation over the sensitivity. ``0`` adds no noise
        (the fit then equals the non-private fit when no row exceeds its bound) and spends
        ``epsilon = inf``.
    clip : float or mapping of str to float
        The per-row L2 bound: one bound for each row's contributions to all the keys of a
        release together (a float), or one bound per key (a mapping that names exactly the
        released keys); see :mod:`fedstats.privacy.mechanism` for the noise each gets.
    delta : float
        The ``delta`` at which ``epsilon`` is reported, in ``(0, 1)``. The default ``1e-6`` is
        well under ``1 / n`` for up to about 100,000 rows; with more rows choose a smaller one
        (:meth:`check_delta` warns when ``delta >= 1 / n``: a mechanism that publishes one
        random row in the clear satisfies ``(0, 1/n)``-DP).
    accountant : {"rdp", "pld"}
        Renyi DP (dp-accounting's default orders 1.1 to 1024; an upper bound on epsilon) or
        privacy loss distributions (tighter, also an upper bound by its pessimistic
        discretisation).
    placement : {"client", "central"}
        ``"client"``: each of the ``n_clients`` clients asked adds ``N(0, (z s)^2 / n_clients)``
        to its sums, so the sum over all of them carries ``N(0, (z s)^2)``, and the server
        never needs the exact sums under secure aggregation. Fewer clients answering means less
        noise: a release is recorded in the ledger with the noise actually present
        (:meth:`effective_noise_multiplier`), and without secure aggregation with one
        client's share only (the server reads each reply). ``"central"``: the server adds ``N(0, (z s)^2)`` once to the
        aggregate; it is trusted with the exact sums.
    warn_epsilon : float
        The fit warns when the epsilon it spent exceeds this (default 10: beyond it the
        guarantee bounds little; ``inf``: never). With ``placement="client"`` and no secure
        aggregation the server reads each client's reply, which carries only that client's
        share of the noise, so the epsilon is far larger than ``noise_multiplier`` suggests.

    Examples
    --------
    >>> import numpy as np
    >>> dp = DifferentialPrivacy(noise_multiplier=0.0, clip={"n": 1.0, "s": 10.0})
    >>> rows = {"n": np.ones(3), "s": np.array([1.0, 2.0, 3.0])}
    >>> dp.client_sums(rows, np.random.default_rng(0), n_clients=2).sums
    {'n': array(3.), 's': array(6.)}
    >>> dp.noise_scales(["n", "s"])
    {'n': 1.4142135623730951, 's': 14.142135623730951}
    >>> DifferentialPrivacy(noise_multiplier=1.0, clip=1.0, placement="client").effective_noise_multiplier(
    ...     n_clients=10, n_answered=10, secure_aggregation=True)
    1.0
    """

    noise_multiplier: float
    clip: float | Mapping[str, float]
    delta: float = DEFAULT_DELTA
    accountant: Literal["rdp", "pld"] = "rdp"
    placement: Placement = "client"
    warn_epsilon: float = WARN_EPSILON

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        clip = check_clip(self.clip)
        set_(self, "clip", MappingProxyType(clip) if isinstance(clip, dict) else clip)
        d = self.delta
        if not _is_real(d) or not math.isfinite(float(d)) or not 0.0 < float(d) < 1.0:
            raise ValueError(f"delta must be a number in (0, 1) (typically well under 1 / n_rows), got {d!r}")
        set_(self, "delta", float(d))
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be 'rdp' or 'pld', got {self.accountant!r}")
        set_(self, "placement", check_placement(self.placement))
        w = self.warn_epsilon
        if not _is_real(w) or not float(w) > 0.0:
            raise ValueError(f"warn_epsilon must be a number > 0 (inf: never warn), got {w!r}")
        set_(self, "warn_epsilon", float(w))

    def __hash__(self) -> int:
        clip = tuple(sorted(self.clip.items())) if isinstance(self.clip, Mapping) else self.clip
        return hash((self.noise_multiplier, clip, self.delta, self.accountant, self.placement, self.warn_epsilon))

    def __getstate__(self) -> dict[str, Any]:  # plain values, for result files and pickles
        return self.as_dict()

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        clip = state["clip"]
        for k, v in state.items():
            object.__setattr__(
                self, k, MappingProxyType(dict(clip)) if k == "clip" and isinstance(clip, Mapping) else v
            )

    def as_dict(self) -> dict[str, Any]:
        """The option as plain values (for a result's metadata)."""
        clip = dict(self.clip) if isinstance(self.clip, Mapping) else self.clip
        return {
            "noise_multiplier": self.noise_multiplier,
            "clip": clip,
            "delta": self.delta,
            "accountant": self.accountant,
            "placement": self.placement,
            "warn_epsilon": self.warn_epsilon,
        }

    def noise_scales(self, keys: Iterable[str]) -> dict[str, float]:
        """Each released key's noise scale ``s_k`` (:func:`noise_scales`)."""
        return noise_scales(self.clip, keys)

    def noise_std(self, keys: Iterable[str], *, n_clients: int = 1, n_answered: int = 1) -> dict[str, float]:
        """The standard deviation of the noise in each coordinate of each released *sum*.

        ``z s_k`` for ``"central"``; ``z s_k sqrt(n_answered / n_clients)`` for ``"client"``
        (the shares of the clients that answered). A model that makes its intervals include
        the DP noise propagates this.
        """
        scales = self.noise_scales(keys)
        f = 1.0
        if self.placement == "client":
            # the shares of the answering clients: what the sum carries, whoever sees it
            f = effective_noise_multiplier(1.0, "client", n_clients, n_answered, secure_aggregation=True)
        return {k: self.noise_multiplier * s * f for k, s in scales.items()}

    def client_sums(
        self, contributions: Mapping[str, ArrayLike], rng: np.random.Generator, *, n_clients: int
    ) -> ClippedSums:
        """What one client sends for one release: its per-row contributions clipped and summed,
        plus its share of the noise when the placement is ``"client"``.

        Parameters
        ----------
        contributions : mapping of str to array_like
            Key -> per-row contributions ``(n_rows, ...)`` (:func:`clip_rows`).
        rng : numpy.random.Generator
            The client's own stream for this release.
        n_clients : int
            The number of clients asked in this release (each adds ``1 / n_clients`` of the
            noise variance).
        """
        out = clip_rows(contributions, self.clip)
        if self.placement != "client":
            return out
        shapes = {k: v.shape for k, v in out.sums.items()}
        noise = gaussian_noise(
            shapes, self.noise_scales(out.sums), self.noise_multiplier, rng, placement="client", n_clients=n_clients
        )
        sums = {k: np.asarray(v + noise[k]) for k, v in out.sums.items()}
        return ClippedSums(sums=sums, n_rows=out.n_rows, n_clipped=out.n_clipped)

    def server_sums(self, sums: Mapping[str, ArrayLike], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The sums the server uses: with the noise added once when the placement is
        ``"central"``, as they are (copied, float64) for ``"client"``."""
        arrays = {k: np.array(v, dtype=np.float64) for k, v in sums.items()}
        if self.placement != "central":
            return arrays
        shapes = {k: v.shape for k, v in arrays.items()}
        noise = gaussian_noise(shapes, self.noise_scales(arrays), self.noise_multiplier, rng, placement="central")
        return {k: np.asarray(v + noise[k]) for k, v in arrays.items()}

    def effective_noise_multiplier(self, *, n_clients: int, n_answered: int, secure_aggregation: bool) -> float:
        """The noise multiplier a release actually had, to record in the ledger
        (:func:`effective_noise_multiplier`)."""
        return effective_noise_multiplier(
            self.noise_multiplier, self.placement, n_clients, n_answered, secure_aggregation=secure_aggregation
        )

    def check_delta(self, n_rows: int) -> None:
        """Warn when ``delta >= 1 / n_rows`` (a guarantee too weak to mean much)."""
        if not is_int(n_rows) or n_rows < 1:
            raise ValueError(f"n_rows must be an integer >= 1, got {n_rows!r}")
        if self.delta >= 1.0 / n_rows:
            warnings.warn(
                f"delta={self.delta:g} is not below 1/n = {1.0 / n_rows:g} for {n_rows} rows: "
                "choose a smaller delta (e.g. under 1/n^1.1)",
                UserWarning,
                stacklevel=2,
            )


def release_option(dp: Any, keys: Sequence[str], every: Sequence[str], who: str) -> Any:
    """The :class:`~fedstats.privacy.DifferentialPrivacy` one release of ``keys`` runs under:
    ``dp`` for one joint bound; ``dp`` with its bounds restricted to ``keys`` for a mapping,
    which must name exactly ``every`` key of the caller's releases (ValueError otherwise)."""
    if not isinstance(dp.clip, Mapping):
        return dp
    missing = [k for k in every if k not in dp.clip]
    extra = [k for k in dp.clip if k not in every]
    if missing or extra:
        raise ValueError(
            f"{who}: dp.clip must give one bound for each key released, {list(every)}: missing {missing}, "
            f"not released {extra}"
        )
    return replace(dp, clip={k: dp.clip[k] for k in keys})
