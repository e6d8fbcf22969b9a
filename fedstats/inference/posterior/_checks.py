"""Validation and drawing helpers shared by the posterior classes (package-internal)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Seed = int | np.random.Generator | np.random.SeedSequence | None
Predicate = Callable[[np.ndarray], Any]
#: components of a posterior: an index, a name, a slice, or a sequence (or array) of indices / names
Selection = int | str | slice | Sequence[int | str] | np.ndarray

KINDS = ("eti", "hdi")
# Relative tolerances for accepting a covariance-like matrix: asymmetry up to this
# fraction of its largest entry is rounding noise and is symmetrised away; negative
# eigenvalues up to this fraction of the largest eigenvalue are rounding noise of a
# positive semi-definite matrix (e.g. A @ cov @ A.T with more rows than columns).
SYM_RTOL = 1e-8
PSD_RTOL = 1e-8
# Jitter (relative to the mean variance) tried in turn when a Cholesky factorisation of
# a singular or nearly singular covariance fails.
JITTERS = (1e-12, 1e-10, 1e-8)


def as_rng(seed: Seed) -> np.random.Generator:
    """A Generator from an int / SeedSequence / None, or the Generator itself."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not (seed is None or isinstance(seed, (numbers.Integral, np.random.SeedSequence))):
        raise TypeError(f"seed must be an int, a numpy.random.Generator or None, got {type(seed).__name__}")
    return np.random.default_rng(seed)


def check_n(n: Any, what: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return int(n)


def default_names(p: int, prefix: str = "theta") -> list[str]:
    return [f"{prefix}[{i}]" for i in range(p)]


def check_names(names: Sequence[str] | None, p: int) -> list[str]:
    if names is None:
        return default_names(p)
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not all(isinstance(s, str) for s in names):
        raise TypeError("names must be strings")
    if len(names) != p:
        raise ValueError(f"got {len(names)} names for {p} components")
    if len(set(names)) != p:
        raise ValueError(f"names must be unique, got {names}")
    return names


def check_level(level: Any) -> float:
    if isinstance(level, bool) or not isinstance(level, numbers.Real):
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    return level


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return kind


def finite_array(x: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be numeric") from exc
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains NaN or infinite values")
    return arr


def symmetrised(m: np.ndarray, what: str) -> np.ndarray:
    """``(m + m.T) / 2`` if ``m`` is symmetric up to rounding noise, else ValueError."""
    scale = np.max(np.abs(m)) if m.size else 0.0
    if np.max(np.abs(m - m.T), initial=0.0) > SYM_RTOL * scale:
        raise ValueError(f"{what} is not symmetric")
    return 0.5 * (m + m.T)


def check_cov(cov: Any, p: int) -> np.ndarray:
    cov = finite_array(cov, "cov")
    if cov.ndim == 0 and p == 1:
        cov = cov.reshape(1, 1)
    if cov.ndim == 1:
        raise ValueError("cov must be a (p, p) matrix; for independent components pass np.diag(variances)")
    if cov.shape != (p, p):
        raise ValueError(f"cov must have shape ({p}, {p}), got {cov.shape}")
    cov = symmetrised(cov, "cov")
    eig = np.linalg.eigvalsh(cov)
    if eig[0] < -PSD_RTOL * max(abs(eig[-1]), abs(eig[0])):
        raise ValueError(f"cov is not positive semi-definite (smallest eigenvalue {eig[0]:.3g}, largest {eig[-1]:.3g})")
    return cov


def cov_factor(cov: np.ndarray) -> np.ndarray:
    """A matrix ``L`` with ``L @ L.T == cov`` (up to rounding), for drawing normals.

    Cholesky first; a singular (positive semi-definite) covariance makes it fail, so
    retry with a tiny diagonal jitter and, failing that, use the symmetric square root
    from an eigendecomposition (exact for PSD matrices, just slower).
    """
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        pass
    p = cov.shape[0]
    scale = max(float(np.mean(np.diag(cov))), np.finfo(float).tiny)
    for jitter in JITTERS:
        try:
            return np.linalg.cholesky(cov + jitter * scale * np.eye(p))
        except np.linalg.LinAlgError:
            continue
    eig, vec = np.linalg.eigh(cov)
    if eig[0] < -PSD_RTOL * max(abs(eig[-1]), abs(eig[0])):
        raise ValueError("cov is not positive semi-definite")
    return vec * np.sqrt(np.clip(eig, 0.0, None))


def mvn_draw(mean: np.ndarray, factor: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    z = rng.standard_normal((n, mean.shape[0]))
    return mean + z @ factor.T


def check_pred_output(out: Any, n: int) -> np.ndarray:
    out = np.asarray(out)
    if out.shape != (n,):
        raise ValueError(f"pred must return one boolean per draw, shape ({n},), got shape {out.shape}")
    if out.dtype != bool:
        # 0/1 integers or floats are fine; anything else is probably not an event
        if not np.isin(out, (0, 1)).all():
            raise ValueError("pred must return booleans (or 0/1 values)")
        out = out.astype(bool)
    return out


def check_affine(A: Any, b: Any, p: int) -> tuple[np.ndarray, np.ndarray]:
    A = finite_array(A, "A")
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2 or A.shape[1] != p:
        raise ValueError(f"A must have shape (q, {p}), got {A.shape}")
    q = A.shape[0]
    if b is None:
        return A, np.zeros(q)
    b = finite_array(b, "b")
    if b.ndim == 0:
        b = np.full(q, float(b))
    if b.shape != (q,):
        raise ValueError(f"b must have shape ({q},), got {b.shape}")
    return A, b
