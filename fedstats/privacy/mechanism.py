"""Per-row clipping and the Gaussian mechanism for one release of summed keys.

A *release* is the set of arrays of one round (or one-off exchange) that the server uses only
through their sums over the clients: the summed keys. Each row ``i`` of a client contributes
``x[k][i]`` to the sum of key ``k`` (its outer product to ``X'X``, its value to a sum, ``1`` to
a row count), and the client sends ``sum_i x[k][i]``.

Neighbouring relation: two data sets are neighbours when one is the other with **one row added
or removed** (one record of one client; dp-accounting's ``ADD_OR_REMOVE_ONE``). Clipping acts on
each row alone, so adding or removing a row changes each released sum by exactly that row's
clipped contribution, whatever the other rows are.

Clipping and calibration (one scheme, two forms of the bound):

* one bound ``C`` (a float): each row's contributions to all the keys, concatenated into one
  vector, are scaled down to L2 norm at most ``C``; the L2 sensitivity of the concatenated
  released sums is ``C``, and every key gets Gaussian noise of standard deviation ``z C``;
* a bound per key ``C_k`` (a mapping): each row's contribution to key ``k`` is scaled down to
  L2 norm at most ``C_k``, key by key; the sums divided by ``sqrt(K) C_k`` (``K`` keys) have
  joint L2 sensitivity at most 1, and key ``k`` gets noise of standard deviation
  ``z sqrt(K) C_k``: noise in proportion to each key's own bound.

In both forms key ``k`` has a *noise scale* ``s_k`` (:func:`noise_scales`: ``C``, or
``sqrt(K) C_k``) such that the vector of the sums divided by their scales has L2 sensitivity
at most 1 and carries independent ``N(0, z^2)`` noise in every coordinate: the release is one
Gaussian mechanism of noise multiplier ``z`` (dp-accounting's ``GaussianDpEvent(z)``).
A row count is a key like the others (each row contributes 1); give it its own bound of 1 with
a per-key mapping, so that clipping never makes a row count as less than one row.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from ..estimator import is_int

#: where the noise is added: on every client (its share, summed under secure aggregation) or
#: once on the aggregate by the server
Placement = Literal["client", "central"]
PLACEMENTS: tuple[str, ...] = ("client", "central")


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def check_noise_multiplier(z: Any) -> float:
    """``z`` as a float, checked finite and ``>= 0`` (0: no noise)."""
    if not _is_real(z) or not math.isfinite(float(z)) or float(z) < 0:
        raise ValueError(f"noise_multiplier must be a finite number >= 0 (0 adds no noise), got {z!r}")
    return float(z)


def check_clip(clip: Any) -> float | dict[str, float]:
    """The clipping bound(s) checked: a finite float > 0, or a non-empty mapping from key names
    to finite floats > 0 (as a new dict)."""
    if isinstance(clip, Mapping):
        if not clip:
            raise ValueError("clip mapping is empty: give a bound for every summed key")
        out: dict[str, float] = {}
        for key, bound in clip.items():
            if not isinstance(key, str):
                raise TypeError(f"clip mapping keys must be key names (str), got {key!r}")
            if not _is_real(bound) or not math.isfinite(float(bound)) or float(bound) <= 0:
                raise ValueError(f"clip bound of key {key!r} must be a finite number > 0, got {bound!r}")
            out[key] = float(bound)
        return out
    if not _is_real(clip) or not math.isfinite(float(clip)) or float(clip) <= 0:
        raise ValueError(
            f"clip must be a finite number > 0 (one L2 bound per row) or a mapping key -> bound, got {clip!r}"
        )
    return float(clip)


def check_placement(placement: Any) -> str:
    """``placement`` checked: ``"client"`` or ``"central"``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be 'client' or 'central', got {placement!r}")
    return str(placement)


def _bounds_for(clip: Mapping[str, float], keys: Iterable[str]) -> dict[str, float]:
    keys = list(keys)
    missing = [k for k in keys if k not in clip]
    extra = [k for k in clip if k not in keys]
    if missing or extra:
        raise ValueError(
            f"clip mapping must name exactly the released keys {keys}: missing {missing}, not released {extra}"
        )
    return {k: float(clip[k]) for k in keys}


@dataclass(frozen=True)
class ClippedSums:
    """The sums of one client's clipped per-row contributions.

    Attributes
    ----------
    sums : dict of str to ndarray
        Key -> the sum over rows of the clipped contributions (shape: a row's shape), float64.
    n_rows : int
        How many rows contributed.
    n_clipped : int
        How many rows were scaled down (by the joint bound, or by any key's bound). This count
        depends on the data: it is for the client's own diagnostics and is *not* protected by
        the mechanism; do not send it to the server as it is.
    """

    sums: dict[str, np.ndarray]
    n_rows: int
    n_clipped: int


def clip_rows(contributions: Mapping[str, ArrayLike], clip: float | Mapping[str, float]) -> ClippedSums:
    """Clip each row's contributions to the bound(s) and sum them over the rows.

    Parameters
    ----------
    contributions : mapping of str to array_like
        Key -> the per-row contributions, shape ``(n_rows, ...)``; every key has the same
        ``n_rows``. All values must be finite.
    clip : float or mapping of str to float
        One L2 bound for each row's contributions to all the keys together (the row's vector
        concatenated over the keys), or a bound per key (each row's contribution to that key
        alone); a mapping names exactly the keys of ``contributions``. A row is scaled by
        ``min(1, bound / norm)``: rows within their bound are left as they are.

    Returns
    -------
    ClippedSums
        The sums (shape ``contributions[k].shape[1:]``), the row count and how many rows were
        clipped.

    Examples
    --------
    >>> import numpy as np
    >>> rows = {"n": np.ones(3), "s": np.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]])}
    >>> out = clip_rows(rows, {"n": 1.0, "s": 1.0})
    >>> out.sums["n"], out.sums["s"], out.n_clipped
    (array(3.), array([1.5, 2. ]), 2)
    >>> float(np.linalg.norm(clip_rows({"s": [[3.0, 4.0]]}, 2.5).sums["s"]))
    2.5
    """
    if not isinstance(contributions, Mapping) or not contributions:
        raise ValueError("contributions must be a non-empty mapping key -> per-row array (n_rows, ...)")
    bound = check_clip(clip)
    blocks: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    n_rows: int | None = None
    for key, value in contributions.items():
        a = np.asarray(value, dtype=np.float64)
        if a.ndim == 0:
            raise ValueError(f"contributions of key {key!r} must have a first axis of rows, got a scalar")
        if n_rows is None:
            n_rows = a.shape[0]
        elif a.shape[0] != n_rows:
            raise ValueError(f"key {key!r} has {a.shape[0]} rows, the other keys {n_rows}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"contributions of key {key!r} are not all finite")
        blocks[key] = a.reshape(a.shape[0], math.prod(a.shape[1:]))  # (n_rows, a row's size), 0 rows too
        shapes[key] = a.shape[1:]
    assert n_rows is not None
    if isinstance(bound, Mapping):
        bounds = _bounds_for(bound, blocks)
        factors = {k: _factors(np.linalg.norm(x, axis=1), bounds[k]) for k, x in blocks.items()}
        clipped = np.zeros(n_rows, dtype=bool)
        for f in factors.values():
            clipped |= f < 1.0
    else:
        norm = np.sqrt(sum((np.einsum("ij,ij->i", x, x) for x in blocks.values()), np.zeros(n_rows)))
        f = _factors(norm, bound)
        factors = {k: f for k in blocks}
        clipped = f < 1.0
    # a factor of exactly 1 leaves a row's values as they are: with nothing clipped the sums
    # are the plain sums over the rows
    sums = {k: np.sum(x * factors[k][:, None], axis=0).reshape(shapes[k]) for k, x in blocks.items()}
    return ClippedSums(sums=sums, n_rows=int(n_rows), n_clipped=int(clipped.sum()))


def _factors(norm: np.ndarray, bound: float) -> np.ndarray:
    """``min(1, bound / norm)`` per row (1 for rows of norm 0)."""
    f = np.ones_like(norm)
    over = norm > bound
    f[over] = bound / norm[over]
    return f


def noise_scales(clip: float | Mapping[str, float], keys: Iterable[str]) -> dict[str, float]:
    """Each released key's noise scale ``s_k``: its noise has standard deviation ``z s_k``.

    ``s_k = C`` for one joint bound ``C``; ``s_k = sqrt(K) C_k`` for per-key bounds (``K``
    keys). The released sums divided by their scales have L2 sensitivity at most 1 under adding
    or removing one row, so the release is a Gaussian mechanism of noise multiplier ``z``.

    Examples
    --------
    >>> noise_scales(2.0, ["n", "s"])
    {'n': 2.0, 's': 2.0}
    >>> noise_scales({"n": 1.0, "s": 3.0, "ss": 9.0, "xy": 0.5}, ["n", "s", "ss", "xy"])
    {'n': 2.0, 's': 6.0, 'ss': 18.0, 'xy': 1.0}
    """
    bound = check_clip(clip)
    keys = list(keys)
    if not keys or any(not isinstance(k, str) for k in keys):
        raise ValueError(f"keys must be a non-empty sequence of key names, got {keys!r}")
    if isinstance(bound, Mapping):
        bounds = _bounds_for(bound, keys)
        root = math.sqrt(len(keys))
        return {k: root * bounds[k] for k in keys}
    return {k: bound for k in keys}


def gaussian_noise(
    shapes: Mapping[str, tuple[int, ...]],
    scales: float | Mapping[str, float],
    noise_multiplier: float,
    rng: np.random.Generator,
    *,
    placement: Placement = "central",
    n_clients: int = 1,
) -> dict[str, np.ndarray]:
    """The Gaussian noise of one release (central), or one client's share of it (client).

    Parameters
    ----------
    shapes : mapping of str to tuple of int
        Key -> the shape of its released sum.
    scales : float or mapping of str to float
        The noise scale ``s_k`` of each key (:func:`noise_scales`), or one for every key.
    noise_multiplier : float
        ``z >= 0``; with 0 the noise is exactly zero (and ``rng`` is not used).
    rng : numpy.random.Generator
        The stream the noise is drawn from, key by key in the order of ``shapes``.
    placement : {"central", "client"}
        ``"central"``: the noise of the aggregate, ``N(0, (z s_k)^2)`` in every coordinate.
        ``"client"``: one client's share, ``N(0, (z s_k)^2 / n_clients)``, so that the sum of
        the shares of ``n_clients`` clients carries ``N(0, (z s_k)^2)``.
    n_clients : int
        For ``"client"``: the number of clients expected to answer (those asked); ignored for
        ``"central"``.

    Returns
    -------
    dict of str to ndarray
        Key -> noise of the key's shape.

    Examples
    --------
    >>> import numpy as np
    >>> gaussian_noise({"s": (2,)}, 1.0, 0.0, np.random.default_rng(0))
    {'s': array([0., 0.])}
    """
    z = check_noise_multiplier(noise_multiplier)
    where = check_placement(placement)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if not is_int(n_clients) or n_clients < 1:
        raise ValueError(f"n_clients must be an integer >= 1, got {n_clients!r}")
    keys = list(shapes)
    if isinstance(scales, Mapping):
        missing = [k for k in keys if k not in scales]
        if missing:
            raise ValueError(f"no noise scale for keys {missing}")
        s = {k: float(scales[k]) for k in keys}
    else:
        s = {k: float(scales) for k in keys}
    bad = {k: v for k, v in s.items() if not (math.isfinite(v) and v > 0)}
    if bad:
        raise ValueError(f"noise scales must be finite and > 0, got {bad}")
    share = 1.0 / math.sqrt(n_clients) if where == "client" else 1.0
    out: dict[str, np.ndarray] = {}
    for k in keys:
        shape = tuple(int(d) for d in shapes[k])
        if z == 0.0:
            out[k] = np.zeros(shape)
        else:
            out[k] = rng.standard_normal(shape) * (z * s[k] * share)
    return out


def effective_noise_multiplier(
    noise_multiplier: float, placement: Placement, n_clients: int, n_answered: int, *, secure_aggregation: bool
) -> float:
    """The noise multiplier that one release actually had, for its privacy accounting.

    * ``"central"``: ``z``; the server adds the noise to the aggregate, so the guarantee is for
      what leaves the server (the server itself is trusted with the exact sums).
    * ``"client"`` under secure aggregation (the server sees only the sum of the answering
      clients' replies): each of the ``n_answered`` clients that answered added its share
      ``(z s)^2 / n_clients``, so the sum carries ``z^2 n_answered / n_clients``: the multiplier
      is ``z sqrt(n_answered / n_clients)``. When fewer clients answer than were asked, the sum
      has *less* noise than planned, and the ledger is charged with the noise actually there.
      (Clients that collude against another client can subtract their own shares: the bound
      then holds with the honest clients' noise only.)
    * ``"client"`` without secure aggregation: the server reads each client's reply, which
      carries only that client's share: ``z / sqrt(n_clients)``.

    Examples
    --------
    >>> effective_noise_multiplier(2.0, "client", 4, 1, secure_aggregation=True)
    1.0
    >>> effective_noise_multiplier(2.0, "central", 4, 1, secure_aggregation=False)
    2.0
    """
    z = check_noise_multiplier(noise_multiplier)
    where = check_placement(placement)
    for name, v in (("n_clients", n_clients), ("n_answered", n_answered)):
        if not is_int(v) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not isinstance(secure_aggregation, (bool, np.bool_)):
        raise TypeError(f"secure_aggregation must be True or False, got {secure_aggregation!r}")
    if where == "central":
        return z
    if secure_aggregation:
        return z * math.sqrt(n_answered / n_clients)
    return z / math.sqrt(n_clients)
