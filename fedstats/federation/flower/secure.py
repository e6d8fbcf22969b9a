"""Secure aggregation of the declared sums on Flower: Flower's own SecAgg+ (pairwise masks,
Shamir shares of the mask seeds, recovery of nodes that drop out), with fedstats's exact
fixed-point encoding.

An algorithm's :attr:`~fedstats.federation.FederatedAlgorithm.summed_keys` are what the server
uses only through their sum. With :class:`SecureAggregation` on a session, a node does not put
them in its reply: it encodes them (:func:`encode`) and keeps them, and the server then runs
Flower's ``SecAggPlusWorkflow`` over the nodes that answered the round, each of which hands its
encoded arrays to Flower's ``secaggplus_mod``. The server receives masked vectors whose masks
cancel only in the sum, so it learns the sum over the nodes that completed the protocol and
nothing about one node's arrays (beyond what the sum and the other nodes' values give away:
with two nodes, the sum minus one's own value is the other's, so at least 3 are required).

Fixed point. Flower quantizes each value into ``[0, 2**22]`` (values outside its clipping
range saturate silently) and sums modulo ``2**32``. fedstats instead writes each value ``x``
with ``|x| < bound`` as ``limbs`` signed base-``2**21`` digits of ``x / (2 bound)``, each digit
shifted into ``[0, 2**21]`` and placed exactly on Flower's quantization grid, so Flower's
quantization is exact and the unmasked digit sums are exact integers (for fewer than 1024
nodes). The server rebuilds the sums from them. A value at or beyond ``bound``, NaN or inf is
an error on that node, never a clipped value. The only error is the rounding of the last
digit: at most ``bound * 2**(-21 * limbs)`` per node and value (``2**-44``, about 6e-14, with
the defaults ``bound=2**40``, ``limbs=4``), so a sum over ``n`` nodes is within
``n * bound * 2**(-21 * limbs)`` of the plain sum. The masked vectors carry ``4 * limbs``
bytes per value (16 with the defaults; the plain sum sends 8), plus Flower's keys and shares.

Example
-------
>>> import numpy as np
>>> sa = SecureAggregation()
>>> x = {"a": np.array([1e6 / 3, -2.5e-9]), "b": np.array([[7.0]])}
>>> parts = [encode(x, ("a", "b"), sa), encode(x, ("a", "b"), sa)]
>>> total = decode(np.mean(parts, axis=0), 2, {"a": (2,), "b": (1, 1)}, sa)
>>> bool(np.allclose(total["a"], 2 * x["a"], rtol=0, atol=1e-12)), float(total["b"][0, 0])
(True, 14.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SecureAggregation", "encode", "decode", "secure_sum", "SecureAggregationError"]

#: Flower's quantization: values in [-CLIP, CLIP] map onto integers 0 .. QUANT
CLIP, QUANT, MODULUS = 8.0, 2**22, 2**32
#: bits per digit; digits are shifted into [0, 2**DIGIT], inside Flower's [0, QUANT]
DIGIT = 21
STEP = 2 * CLIP / QUANT  # Flower's grid: integer m <-> m * STEP - CLIP
MAX_NODES = MODULUS // QUANT - 1  # Flower's sum of the quantized values must stay below MODULUS


class SecureAggregationError(RuntimeError):
    """Secure aggregation could not give the sum (too few nodes, a failed protocol stage)."""


@dataclass(frozen=True)
class SecureAggregation:
    """Options of secure aggregation on Flower (see the module docs).

    Parameters
    ----------
    bound : float
        Every value of a summed array on every node must satisfy ``|x| < bound`` (a power of
        two; a larger value is an error on that node). Default ``2**40``.
    limbs : int
        Base-``2**21`` digits per value: the precision is ``bound * 2**(-21 * limbs)`` per
        node and value. Default 4.
    threshold : float
        Flower's ``reconstruction_threshold`` as a fraction of the nodes in a round (at least
        ``min_nodes`` of them): the sum survives nodes that drop out as long as this many are
        left to reveal their shares. Default 2/3 (3 of 4 nodes: one may drop out).
    min_nodes : int
        Fewest nodes a secure sum may have, dropouts included (at least 3: with 2 the sum
        gives each node the other's value). Default 3.
    timeout : float, optional
        Seconds for each of SecAgg+'s four stages (default: the session's timeout).
    """

    bound: float = 2.0**40
    limbs: int = 4
    threshold: float = 2 / 3
    min_nodes: int = 3
    timeout: float | None = None

    def __post_init__(self) -> None:
        b = self.bound
        if not (isinstance(b, (int, float)) and b > 0 and math.isfinite(b) and math.frexp(b)[0] == 0.5):
            raise ValueError(f"bound must be a positive power of two, got {b!r}")
        if not (isinstance(self.limbs, int) and 1 <= self.limbs <= 6):
            raise ValueError(f"limbs must be an int in 1..6, got {self.limbs!r}")
        if not (0 < self.threshold <= 1):
            raise ValueError(f"threshold must lie in (0, 1], got {self.threshold!r}")
        if not (isinstance(self.min_nodes, int) and self.min_nodes >= 3):
            raise ValueError(f"min_nodes must be an int >= 3, got {self.min_nodes!r}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 or None, got {self.timeout!r}")

    @property
    def resolution(self) -> float:
        """The largest error of one node's encoded value."""
        return float(self.bound) * 2.0 ** (-DIGIT * self.limbs)


def encode(arrays: Mapping[str, np.ndarray], keys: Sequence[str], options: SecureAggregation) -> np.ndarray:
    """The arrays ``keys`` of ``arrays`` as one flat vector of exact points of Flower's
    quantization grid (``limbs`` per value); raises ``ValueError`` naming the array if a value
    is NaN, infinite or not below ``options.bound`` in absolute value."""
    flat = []
    for k in keys:
        a = np.asarray(arrays[k], dtype=float).ravel()
        if not np.isfinite(a).all():
            raise ValueError(f"secure aggregation: {k!r} holds NaN or inf")
        big = float(np.max(np.abs(a), initial=0.0))
        if big >= options.bound:
            raise ValueError(
                f"secure aggregation: |{k}| reaches {big:.6g}, not below the declared bound {options.bound:.6g} "
                "(raise SecureAggregation(bound=...)); nothing is clipped"
            )
        flat.append(a)
    y = np.concatenate(flat) / (2 * options.bound) if flat else np.zeros(0)  # in (-1/2, 1/2), exact
    digits = np.empty((options.limbs, y.size))
    r = y
    for j in range(options.limbs):  # every operation below is exact in floating point
        t = r * 2.0**DIGIT
        digits[j] = np.rint(t)
        r = t - digits[j]
    return ((digits + 2 ** (DIGIT - 1)) * STEP - CLIP).ravel()


def decode(mean: np.ndarray, n: int, shapes: Mapping[str, tuple[int, ...]], options: SecureAggregation) -> dict:
    """The sums over ``n`` nodes from the mean of their :func:`encode` vectors (what Flower's
    workflow returns), split into arrays of ``shapes`` (in order)."""
    m = np.rint((np.asarray(mean, dtype=float) * n + n * CLIP) / STEP)  # sums of the shifted digits: exact
    d = (m - n * 2 ** (DIGIT - 1)).reshape(options.limbs, -1)
    y = np.zeros(d.shape[1])
    for j in reversed(range(options.limbs)):
        y = (y + d[j]) / 2.0**DIGIT
    total = y * (2 * options.bound)
    out, at = {}, 0
    for k, shape in shapes.items():
        size = int(np.prod(shape, dtype=int))
        out[k] = total[at : at + size].reshape(shape)
        at += size
    if at != total.size:
        raise SecureAggregationError(f"the secure sum has {total.size} values, the declared shapes {at}")
    return out


def _workflow_class() -> type:
    from flwr.server.workflow import SecAggPlusWorkflow

    class _Workflow(SecAggPlusWorkflow):
        """Flower's SecAgg+, with the nodes that dropped out before sharing their keys left out
        of the unmask stage. Flower keeps every node of its setup stage in the unmask stage's
        list, and demands shares of the secrets of those that never shared any (no survivor
        holds one), so one node lost before its shares were out halted the round ("Not enough
        shares to recover secret"). No survivor masks its vector with such a node (a node adds
        pairwise masks only for the nodes whose shares it received), so leaving it out is exact,
        and the nodes lost later are recovered from their shares as Flower designs."""

        def share_keys_stage(self, grid: Any, context: Any, state: Any) -> bool:
            ok = bool(super().share_keys_stage(grid, context, state))
            state.sampled_node_ids = set(state.active_node_ids)
            return ok

    return _Workflow


def secure_sum(
    grid: Any, node_ids: Sequence[int], options: SecureAggregation, rnd: int, timeout: float | None
) -> tuple[np.ndarray, list[int]]:
    """Run Flower's SecAgg+ over ``node_ids`` (each holding an :func:`encode` vector): the mean
    of the vectors of the nodes that completed it, and those nodes. Raises
    :class:`SecureAggregationError` when the protocol halts (too many dropped out)."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
    from flwr.common import FitIns, parameters_to_ndarrays
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import Strategy

    if len(node_ids) < options.min_nodes:
        raise SecureAggregationError(
            f"secure aggregation needs at least {options.min_nodes} nodes in a round, this round has {len(node_ids)}"
        )
    if len(node_ids) > MAX_NODES:
        raise SecureAggregationError(f"secure aggregation sums at most {MAX_NODES} nodes, got {len(node_ids)}")

    class _Sum(Strategy):  # just enough of a legacy Strategy for the workflow
        def __init__(self, proxies):
            self.proxies, self.mean, self.nodes = proxies, None, []

        def initialize_parameters(self, client_manager):
            return None

        def configure_fit(self, server_round, parameters, client_manager):
            return [(p, FitIns(parameters, {})) for p in self.proxies]

        def aggregate_fit(self, server_round, results, failures):
            if results:  # the workflow set every result's parameters to the weighted mean
                self.mean = parameters_to_ndarrays(results[0][1].parameters)[0]
                self.nodes = [int(proxy.node_id) for proxy, _ in results]
            return None, {}

        def configure_evaluate(self, *args):
            return []

        def aggregate_evaluate(self, *args):
            return None, {}

        def evaluate(self, *args):
            return None

    run_id = grid.run.run_id
    strategy = _Sum([GridClientProxy(int(n), grid, run_id) for n in node_ids])
    scratch = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config={})
    legacy = LegacyContext(scratch, strategy=strategy)
    legacy.state.config_records["config"] = ConfigRecord({"current_round": int(rnd) + 1})
    legacy.state.array_records["parameters"] = ArrayRecord()
    threshold = min(len(node_ids), max(int(options.min_nodes), round(float(options.threshold) * len(node_ids))))
    _workflow_class()(
        num_shares=1.0,
        # never fewer than min_nodes: the nodes themselves then refuse to mask for, and the
        # server cannot unmask, a sum over fewer nodes (dropouts included)
        reconstruction_threshold=threshold,
        max_weight=1.0,
        clipping_range=CLIP,
        quantization_range=QUANT,
        modulus_range=MODULUS,
        timeout=options.timeout if options.timeout is not None else timeout,
    )(grid, legacy)
    if strategy.mean is None:
        raise SecureAggregationError(
            f"secure aggregation halted at round {rnd}: too many of its {len(node_ids)} nodes dropped out "
            f"(the threshold is {options.threshold:.3g} of them)"
        )
    if len(strategy.nodes) < options.min_nodes:  # cannot happen with the threshold above
        raise SecureAggregationError(
            f"secure aggregation left {len(strategy.nodes)} nodes, fewer than {options.min_nodes}"
        )
    return np.asarray(strategy.mean, dtype=float), strategy.nodes
