"""Federated moments: the counts, means and sds of clients' columns in two rounds whose
replies the server receives only summed over the clients (:func:`federated_moments`), each
client's arithmetic from :mod:`fedstats.data.scaling`; with ``dp=`` both rounds run on the
runtime as differentially private releases (:class:`_DPMomentSums`, :class:`_DPMomentSquares`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data.scaling import two_round_moments
from ..data.validation import DataError
from ..privacy import DifferentialPrivacy, PrivacyLedger, PrivacySpent, release_option, run_seed
from .oneshot import raise_failures
from .protocol import FederatedAlgorithm
from .runner import run

__all__ = ["federated_moments"]


def federated_moments(
    rows: Sequence[tuple[np.ndarray, np.ndarray | None]], *, dp: Any = None, seed: int = 0, privacy_ledger: Any = None
) -> dict[str, Any]:
    """:func:`aggregate_moments` of clients' rows ``[(X_k, y_k or None), ...]`` in two
    federated rounds whose replies the server receives only summed over the clients: the
    counts and sums (:func:`client_sums`), then the squared deviations about the means
    they give (:func:`client_moments` with ``about``). Each client's function sees only
    that client's rows.

    Parameters
    ----------
    rows : sequence of (X, y or None)
        One pair per client (every client with or every client without ``y``).
    dp : DifferentialPrivacy, optional
        Opt-in differential privacy (:mod:`fedstats.privacy`; neighbours: one row added or
        removed). The two rounds then run on the runtime (:func:`fedstats.federation.run`,
        every client in both) as two releases, each of per-row contributions clipped on the
        client and summed with Gaussian noise (``placement="client"``: each client adds its
        share; ``"central"``: the server adds it):

        * ``"moments: sums"``: ``n`` (each row: 1), ``sum_x`` (the row ``x``), ``sum_y`` (``y``);
        * ``"moments: squares"``, about the noisy means of the first: ``m2_x`` (the row's
          ``(x - mean_x)**2``, per column) and ``m2_y`` (``(y - mean_y)**2``).

        ``dp.clip`` is one bound for each row's contributions to a release's keys together, or
        a mapping naming exactly the keys above (without ``y``: no ``sum_y``, ``m2_y``); give
        ``n`` a bound of 1 (a row counts once). The noisy count is raised to 2 if below;
        a noisy sum of squares below one noise standard deviation of its sum (or below 0 without
        noise) is raised to it (so every sd is positive under noise) and the column is
        listed in ``"floored"``, with a warning. The result then also has ``"privacy"`` (a
        :class:`~fedstats.privacy.PrivacySpent`), ``"n_noisy"`` (the noisy count) and
        ``"floored"``; ``"n"`` is the noisy count rounded. Means and sds are those of the
        clipped rows (a row's ``x`` outside its bound is scaled down).
    seed : int
        With ``dp``: the seed of the noise (the runtime's streams).
    privacy_ledger : PrivacyLedger, optional
        With ``dp``: a fit's ledger that records the two releases too.
    """
    if dp is not None:
        return _private_moments(rows, dp, seed, privacy_ledger)
    return two_round_moments(rows)


def _private_moments(rows: Sequence[tuple[np.ndarray, np.ndarray | None]], dp: Any, seed: int, ledger: Any) -> dict:
    if not isinstance(dp, DifferentialPrivacy):
        raise TypeError(
            f"federated_moments: dp must be a fedstats.privacy.DifferentialPrivacy, got {type(dp).__name__}"
        )
    rows = list(rows)
    if not rows:
        raise DataError("federated_moments needs the rows of at least one client")
    has_y = rows[0][1] is not None
    if any((y is not None) != has_y for _, y in rows):
        raise DataError("federated_moments: give y for every client or for none")
    first_keys = ("n", "sum_x", "sum_y") if has_y else ("n", "sum_x")
    second_keys = ("m2_x", "m2_y") if has_y else ("m2_x",)
    every = first_keys + second_keys
    opt1 = release_option(dp, first_keys, every, "federated_moments")
    opt2 = release_option(dp, second_keys, every, "federated_moments")
    own = PrivacyLedger(dp.accountant)
    data = {k: _Rows(np.atleast_2d(np.asarray(X, dtype=np.float64)), y) for k, (X, y) in enumerate(rows)}
    K = len(data)
    common: dict[str, Any] = {"rounds": 1, "progress": False, "batched": False, "privacy_ledger": own}
    # each run its own seed: two runs with one seed would draw the same noise
    out = run(_DPMomentSums(opt1, K, has_y), data, kind="moments: sums", seed=run_seed(seed, "moments: sums"), **common)
    raise_failures(out.history, "the private moments' first round")
    sums = out.server_state
    n_noisy = float(sums["n"][0])
    n = max(n_noisy, 2.0)
    mean_x = sums["sum_x"] / n
    mean_y = float(sums["sum_y"][0]) / n if has_y else None
    out = run(
        _DPMomentSquares(opt2, K, mean_x, mean_y),
        data,
        kind="moments: squares",
        seed=run_seed(seed, "moments: squares"),
        **common,
    )
    raise_failures(out.history, "the private moments' second round")
    squares = out.server_state
    noise = opt2.noise_std(second_keys, n_clients=K, n_answered=K)
    floored: dict[str, list[int]] = {}
    res: dict[str, Any] = {"n": int(round(n)), "n_noisy": n_noisy, "mean_x": np.asarray(mean_x)}
    names = [("x", "m2_x")] + ([("y", "m2_y")] if has_y else [])
    for name, key in names:
        m2 = np.asarray(squares[key], dtype=np.float64)
        floor = noise[key]
        low = m2 < floor if floor > 0 else m2 < 0
        floored[name] = [int(j) for j in np.flatnonzero(low)]
        sd = np.sqrt(np.maximum(m2, floor) / (n - 1))
        if name == "y":
            res["mean_y"], res["sd_y"] = float(mean_y), float(sd[0])  # type: ignore[arg-type]
        else:
            res["sd_x"] = sd
    if any(floored.values()):
        warnings.warn(
            f"federated_moments: the noisy sums of squares of {floored} fell below one noise standard "
            "deviation of their sum: raised to it (those sds are floors, not estimates)",
            UserWarning,
            stacklevel=3,
        )
    if ledger is not None:
        ledger.extend(own)
    res["floored"] = floored
    res["privacy"] = PrivacySpent(dp, own)
    return res


@dataclass(frozen=True)
class _Rows:
    X: np.ndarray
    y: np.ndarray | None


class _DPMomentSums(FederatedAlgorithm):
    """The first release of differentially private moments: each row's 1 (``n``), ``x``
    (``sum_x``) and ``y`` (``sum_y``, with a target), clipped and noised."""

    reply_keys: tuple[str, ...] = ("n", "sum_x", "sum_y")
    summed_keys: tuple[str, ...] = reply_keys

    def __init__(self, privacy: Any, n_clients: int, has_y: bool) -> None:
        self.privacy, self.n_clients = privacy, n_clients
        if not has_y:
            self.reply_keys = self.summed_keys = ("n", "sum_x")

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        X = np.asarray(data.X, dtype=float)
        rows = {"n": np.ones(X.shape[0]), "sum_x": X}
        if "sum_y" in self.reply_keys:
            rows["sum_y"] = np.asarray(data.y, dtype=float)
        return _noisy_reply(self.privacy, rows, rng, self.n_clients), state

    def server_step(self, server_state, replies, round):
        return {k: np.array(v, dtype=float) for k, v in replies.sums.items()}, {}


class _DPMomentSquares(FederatedAlgorithm):
    """The second release: each row's squared deviations about the broadcast (noisy) means,
    ``m2_x`` per column and ``m2_y``, clipped and noised."""

    reply_keys: tuple[str, ...] = ("m2_x", "m2_y")
    summed_keys: tuple[str, ...] = reply_keys

    def __init__(self, privacy: Any, n_clients: int, mean_x: np.ndarray, mean_y: float | None) -> None:
        self.privacy, self.n_clients = privacy, n_clients
        self.mean_x, self.mean_y = np.asarray(mean_x, dtype=float), mean_y
        if mean_y is None:
            self.reply_keys = self.summed_keys = ("m2_x",)

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        out = {"mean_x": self.mean_x}
        if self.mean_y is not None:
            out["mean_y"] = np.array([self.mean_y])
        return out

    def client_step(self, message, state, data, rng):
        X = np.asarray(data.X, dtype=float)
        rows = {"m2_x": (X - message["mean_x"]) ** 2}
        if "mean_y" in message:
            rows["m2_y"] = (np.asarray(data.y, dtype=float) - float(message["mean_y"][0])) ** 2
        return _noisy_reply(self.privacy, rows, rng, self.n_clients), state

    def server_step(self, server_state, replies, round):
        return {k: np.array(v, dtype=float) for k, v in replies.sums.items()}, {}


def _noisy_reply(privacy: Any, rows: dict[str, np.ndarray], rng: np.random.Generator, n_clients: int) -> dict:
    out = privacy.client_sums(rows, rng, n_clients=n_clients)
    return {k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in out.sums.items()}
