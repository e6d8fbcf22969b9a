"""The design check of the linear models: predictors the data cannot tell apart are named
before any fit, never fitted into meaningless coefficients.

One counted round (``"design check"``) in which every client sends, summed over the clients
only (:attr:`~fedstats.federation.FederatedAlgorithm.summed_keys`): its row count, the sums of
its predictors, their cross-products ``X'X`` and their scatter about its own means
``(X - xbar_k)'(X - xbar_k)``, and per predictor a 1 where its sums overflowed float64 (sent
as 0; the column is then named and refused); never a row, nor one client's value. From these the server knows
the pooled covariance of the predictors and their pooled within-client scatter ``W``:

* a predictor that is constant on the pooled rows (with an intercept), identical to another,
  or a linear combination of the ones before it cannot be estimated at all: refused by name
  (:class:`~fedstats.data.DataError`), with the combination;
* a combination that is constant within every client but varies between them (a client-level
  covariate, or columns that differ only by a client-level shift) leaves each client's own
  coefficients for it unidentified (``W`` is singular): the models with per-client
  coefficients warn, naming it (their prior decides how each client's effect is split), and
  ``strict`` models (the lasso, which would select between indistinguishable predictors)
  refuse it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from ..data import DataError
from ..federation.oneshot import one_shot_sums
from ..federation.protocol import client_function
from ..federation.scaling import overflow_message

__all__ = ["check_design", "unidentified"]

#: an eigenvalue below this fraction of the largest is a dependence (as the GLM's design check)
RTOL = 1e-10


@client_function
def _design_sums(msg, X, rng, _private=None):
    """A client's design sums: rows, column sums, ``X'X`` and its scatter about its own means."""
    X = np.asarray(X, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        centred = X - X.mean(axis=0) if len(X) else X
        sx, xtx, within = X.sum(axis=0), X.T @ X, centred.T @ centred
    # a column whose sums overflow float64 is flagged (summed: at how many clients) and sent as
    # 0, for the server to name it rather than refuse the whole reply as not finite
    bad = ~(np.isfinite(sx) & np.isfinite(xtx).all(axis=0) & np.isfinite(within).all(axis=0))
    zero = bad[:, None] | bad[None, :]
    return {
        "n": np.array([float(len(X))]),
        "sx": np.where(bad, 0.0, sx),
        "xtx": np.where(zero, 0.0, xtx),
        "within": np.where(zero, 0.0, within),
        "overflow": bad.astype(np.int8),
    }


def _combination(C: np.ndarray, j: int) -> np.ndarray:
    """The weights ``b`` with column ``j`` = ``b'`` (columns before it) on ``C`` (least squares)."""
    return np.linalg.lstsq(C[:j, :j], C[:j, j], rcond=None)[0] if j else np.zeros(0)


def _dependent(C: np.ndarray) -> int | None:
    """The first column of the Gram matrix ``C`` that is a combination of those before it."""
    d = np.sqrt(np.clip(np.diag(C), 0, None))
    scale = np.where(d > 0, d, 1.0)
    R = C / np.outer(scale, scale)
    for j in range(len(C)):
        if d[j] <= RTOL * max(float(d.max()), 1e-300):
            return j
        ev = np.linalg.eigvalsh(R[: j + 1, : j + 1])
        if ev[0] < RTOL * ev[-1]:
            return j
    return None


def _words(names: Sequence[str], j: int, C: np.ndarray, what: str, centred: bool) -> str:
    """Column ``j`` of ``C`` (a Gram matrix ``what``, of columns about their means when
    ``centred``) said as what it is: constant, a copy of another column, or the combination of
    the others."""
    shift = " + a constant" if centred else ""
    if C[j, j] <= RTOL * max(float(np.max(np.diag(C))), 1e-300):
        return f"predictor {names[j]!r} is constant {what}"
    b = _combination(C, j)
    big = np.flatnonzero(np.abs(b) > 1e-6 * max(float(np.abs(b).max()), 1e-300))
    if len(big) == 1 and abs(b[big[0]] - 1) < 1e-6:
        return (
            f"predictor {names[j]!r} duplicates {names[int(big[0])]!r}{' (up to a constant)' if centred else ''} {what}"
        )
    terms = " + ".join(f"{b[k]:.4g} * {names[int(k)]}" for k in big)
    return f"predictor {names[j]!r} = {terms}{shift} {what}"


def unidentified(
    names: Sequence[str], n: float, sx: np.ndarray, xtx: np.ndarray, within: np.ndarray, intercept: bool
) -> tuple[str | None, str | None]:
    """``(refusal, warning)`` from the pooled design sums: why a predictor cannot be estimated
    at all (``None``: every one can), and why some combination's per-client coefficients cannot
    be (constant within every client). Plain numpy: the check of :func:`check_design`.

    Example
    -------
    >>> import numpy as np
    >>> X = np.c_[np.arange(6.0), np.arange(6.0) % 2, 2 * np.arange(6.0) + 1]
    >>> refusal, _ = unidentified(["a", "b", "c"], 6, X.sum(0), X.T @ X, np.eye(3), True)
    >>> refusal
    "predictor 'c' = 2 * a + a constant on the pooled rows (with the intercept): its coefficient cannot be estimated; drop it"
    """
    names = list(names)
    if not names:
        return None, None
    sx, xtx = np.asarray(sx, dtype=float), np.asarray(xtx, dtype=float)
    C = xtx - np.outer(sx, sx) / n if intercept else xtx  # the pooled (centred) Gram matrix
    j = _dependent(C)
    if j is not None:
        where = "on the pooled rows" + (" (with the intercept)" if intercept else "")
        return f"{_words(names, j, C, where, intercept)}: its coefficient cannot be estimated; drop it", None
    j = _dependent(np.asarray(within, dtype=float)) if intercept else None  # no intercept: nothing to confound
    if j is None:
        return None, None
    return None, _words(names, j, np.asarray(within, dtype=float), "within every client", True)


def check_design(
    data, names: Sequence[str], intercept: bool, *, seed: int = 0, per_client: bool = True, strict: bool = False
) -> None:
    """Run the design round over ``data`` (features ``names``) and refuse, by name, a predictor
    that cannot be estimated (:func:`unidentified`); for models with per-client coefficients
    (``per_client``) warn about one whose per-client coefficients cannot be, or refuse it
    (``strict``)."""
    reps, _ = one_shot_sums(
        data,
        ("n", "sx", "xtx", "within", "overflow"),
        ("n", "sx", "xtx", "within", "overflow"),
        {},
        _design_sums,
        seed=seed,
        what="the design check",
    )
    s = reps.sums
    if not s:
        raise DataError("no client is left in the fit to answer the design check (see the warnings)")
    overflow = np.asarray(s["overflow"])
    if overflow.any():
        raise ValueError(overflow_message([repr(n) for n, k in zip(names, overflow) if k], int(overflow.max())))
    refusal, warning = unidentified(names, float(s["n"][0]), s["sx"], s["xtx"], s["within"], intercept)
    if refusal:
        raise DataError(refusal)
    if warning and per_client:
        if strict:
            raise DataError(f"{warning}: the clients' data cannot tell these predictors apart; drop one of them")
        warnings.warn(
            f"{warning}: each client's own coefficients for it cannot be told apart from the others' (its "
            "prior decides how the effect is split); the population's are estimated between clients",
            RuntimeWarning,
            stacklevel=4,
        )
