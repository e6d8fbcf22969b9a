"""What the four multi-fidelity results share (:mod:`fedstats.gp.ar1_result`,
:mod:`fedstats.gp.nargp_result`): a chain of fidelities, lowest first, each a GP fitted on
its own standardised outputs, reported and predicted on the data's scale.

* :class:`ChainResult`: the result contract for a chain (``summary`` of every fidelity's
  parameters on the data's scale, ``predict`` of any fidelity with credible and predictive bands,
  ``save``/``load``); the models fill in how a fidelity's moments are computed.
* :class:`Wire`: the in-process accounting of a federated chain's queries after its fit (every
  array sent to or from a fidelity's client, by kind and by client, as a
  :class:`~fedstats.federation.Communication`), with a log of what crossed; the fit itself is a
  run of the runtime (:mod:`fedstats.gp.chain_fit`).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike

from .._deprecation import renamed_attributes, warn_renamed
from ..data import DataError
from ..federation import Communication
from ..federation.records import record
from ..results import FederatedResult, UnknownClientError, check_level
from ._core import band_frame
from .fgpr_algorithm import standardize_y

__all__ = ["ChainResult", "Wire", "check_queries", "check_fidelities"]

SCALES = ("original", "standardized")


def check_queries(X: ArrayLike, d: int) -> np.ndarray:
    """``X`` as a finite float array of shape ``(n, d)`` (a 1-D ``X`` is one column)."""
    Xs = np.asarray(X, dtype=float)
    Xs = Xs[:, None] if Xs.ndim == 1 else Xs
    if Xs.ndim != 2 or Xs.shape[1] != d or len(Xs) == 0 or not np.all(np.isfinite(Xs)):
        raise DataError(f"X must be finite with at least one row and {d} column(s), got shape {np.shape(Xs)}")
    return Xs


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"scale must be 'original' or 'standardized', got {scale!r}")
    return scale


#: fidelities for a centralised fit, lowest first: a list of ``(X, y)`` or a dict ``name -> (X, y)``
Fidelities: TypeAlias = "Sequence[tuple[ArrayLike, ArrayLike]] | Mapping[str, tuple[ArrayLike, ArrayLike]]"


def check_fidelities(fidelities: Fidelities, model: str) -> tuple[list[str], list[tuple[np.ndarray, np.ndarray]]]:
    """The fidelities of a centralised fit, lowest first: a list of ``(X, y)`` (named
    ``fidelity0``, ``fidelity1``, ...) or a dict ``name -> (X, y)`` in that order; checked (at least
    two fidelities, finite, matching rows, the same inputs on every fidelity, two rows or more)."""
    if isinstance(fidelities, Mapping):
        names, pairs = [str(k) for k in fidelities], list(fidelities.values())
    else:
        pairs = list(fidelities)
        names = [f"fidelity{t}" for t in range(len(pairs))]
    if len(pairs) < 2:
        raise ValueError(f"{model} needs at least two fidelities, got {len(pairs)}")
    out, d = [], None
    for name, pair in zip(names, pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise DataError(f"fidelity {name!r}: expected a pair (X, y)")
        X = np.asarray(pair[0], dtype=float)
        X = X[:, None] if X.ndim == 1 else X
        y = np.asarray(pair[1], dtype=float).reshape(-1)
        if X.ndim != 2 or len(X) != len(y) or len(y) < 2:
            raise DataError(
                f"fidelity {name!r}: X must be (n, d) with n >= 2 rows matching y, got {X.shape} and {y.shape}"
            )
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
            raise DataError(f"fidelity {name!r}: X or y contains NaN or inf")
        if d is not None and X.shape[1] != d:
            raise DataError(f"fidelity {name!r} has {X.shape[1]} input column(s), the fidelities below {d}")
        d = X.shape[1]
        out.append((X, y))
    return names, out


def fit_pooled_chain(model: Any, result: type, fidelities: Fidelities, seed: int, what: str) -> Any:
    """The centralised fit of a chain (``model`` an AR1 or NARGP model, ``what`` its name in
    messages): its parameters checked, then each fidelity's GP (``model._fidelity``) fitted in
    turn given the fitted ones below (``model._lower``), every fidelity's rows in one place."""
    model._validate_params()
    t0 = time.perf_counter()
    names, pairs = check_fidelities(fidelities, what)
    fitted: list[Any] = []
    for t, (X, y) in enumerate(pairs):
        lv = model._fidelity(X, y, t, seed)
        fitted.append(lv.fit(None if t == 0 else model._lower(fitted, lv.X, t, seed)))
    return result(
        fidelities=fitted,
        names=names,
        feature_names=[f"x{j}" for j in range(pairs[0][0].shape[1])],
        options=model.get_params(),
        seed=seed,
        seconds=time.perf_counter() - t0,
    )


class ChainFidelity:
    """What one fidelity of either chain (AR1's or NARGP's) holds and does alike: its GP's
    prior ``spec`` and hyperparameters ``hyper`` on its standardised scale, the mean and sd that
    standardise its outputs (``mu``, ``sd``), its number of rows ``n`` and, where the holder
    keeps them, its rows (the attributes ``_rows``: its inputs ``X``, standardised outputs ``z``
    and what its GP conditions on). A subclass fits (``fit``) and conditions its GP on the
    fidelity below (``_condition``); ``_link`` names the fitted parameters besides ``hyper``."""

    #: the attributes that hold the client's rows (none in a release)
    _rows: tuple[str, ...] = ("X", "z")
    #: fitted parameters besides ``hyper`` (copied from a release when restoring)
    _link: tuple[str, ...] = ()
    #: caches, not written to files
    _transient: tuple[str, ...] = ()

    def __init__(self, X: ArrayLike, y: ArrayLike, spec: Any, *, restarts: int = 1, seed: int = 0) -> None:
        X = np.asarray(X, dtype=float)
        self.X: np.ndarray = X[:, None] if X.ndim == 1 else X  # None once released
        z, self.mu, self.sd = standardize_y(np.asarray(y, dtype=float).reshape(-1))
        self.z: np.ndarray = z  # None once released
        self.n, self.spec, self.restarts, self.seed = len(z), spec, int(restarts), int(seed)
        self.hyper: dict[str, np.ndarray] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._transient}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.update(dict.fromkeys(self._transient))

    def _condition(self, lower_mean: np.ndarray | None) -> None:
        raise NotImplementedError

    def released(self) -> Any:
        """What the fidelity's client releases: everything but its rows (``_rows``)."""
        out = object.__new__(type(self))
        out.__setstate__({**self.__getstate__(), **dict.fromkeys(self._rows)})
        out.hyper = {k: np.array(v, copy=True) for k, v in self.hyper.items()}
        return out

    def check_rows(self, released: ChainFidelity, name: Hashable) -> Any:
        """Refuse rows that are not the fit's: another count, mean or sd of its outputs than
        ``released``'s (the client checks its own rows before anything is exchanged)."""
        if (self.n, self.mu, self.sd) != (released.n, released.mu, released.sd):
            raise DataError(
                f"client {name!r} holds other rows than the fit's: {self.n} rows of mean {self.mu:.6g} and sd "
                f"{self.sd:.6g}, the fit had {released.n} of mean {released.mu:.6g} and sd {released.sd:.6g}"
            )
        return self

    def restore(self, released: ChainFidelity, lower_mean: np.ndarray | None, name: Hashable) -> Any:
        """The fitted fidelity again from its own rows (this fidelity, checked by
        :meth:`check_rows`) and its release: no refit, conditioned as in the fit
        (``lower_mean``, the fidelity below's mean at its inputs)."""
        self.check_rows(released, name)
        self.hyper = {k: np.array(v, copy=True) for k, v in released.hyper.items()}
        for k in self._link:
            setattr(self, k, getattr(released, k))
        self._condition(lower_mean)
        return self


class Wire:
    """The exchanges of a federated chain, in process: :meth:`send` counts an array to
    (``"down"``) or from (``"up"``) a fidelity's client under a kind (bytes by client and kind, as
    :class:`~fedstats.federation.Communication`: ``comm``), :meth:`exchange` counts one
    exchange (a round: one client asked and answering), and ``messages`` logs each array's
    ``(client, direction, what, shape)``."""

    def __init__(self) -> None:
        self.comm = Communication()
        self.messages: list[tuple[Hashable, str, str, tuple]] = []

    def _kind(self, kind: str) -> dict[str, int]:
        return self.comm.by_kind.setdefault(kind, {"bytes_up": 0, "bytes_down": 0, "rounds": 0, "runs": 0})

    def exchange(self, client: Hashable, kind: str) -> None:
        self.comm.rounds += 1
        b = self._kind(kind)
        b["rounds"] += 1
        b["runs"] += 1
        self.comm.per_client.setdefault(client, {"bytes_up": 0, "bytes_down": 0})

    def send(self, client: Hashable, direction: str, what: str, a: Any, kind: str) -> None:
        nbytes = int(a.numel() * a.element_size()) if isinstance(a, torch.Tensor) else int(np.asarray(a).nbytes)
        key = "bytes_down" if direction == "down" else "bytes_up"
        setattr(self.comm, key, getattr(self.comm, key) + nbytes)
        self.comm.per_client.setdefault(client, {"bytes_up": 0, "bytes_down": 0})[key] += nbytes
        self._kind(kind)[key] += nbytes
        self.messages.append((client, direction, what, tuple(a.shape)))


@renamed_attributes(levels="fidelities")
class ChainResult(FederatedResult):
    """A fitted multi-fidelity chain (see the module docs): ``fidelities`` (one fitted state per
    fidelity, lowest first, named ``names``), on each fidelity's standardised scale as fitted;
    tables and predictions on the data's scale.

    Subclasses give ``model``, ``_moments(Xs, t, kind)`` (the mean and latent variance of
    fidelity ``t`` at ``Xs`` on its standardised scale) and ``_fidelity_rows(t)`` (fidelity ``t``'s
    parameters: ``(label, value on the data's scale, value as fitted)``).

    Contract attributes: ``history`` None for a centralised fit (a federated one's is its run's
    rounds),
    ``converged`` True (a one-pass fit: each fidelity's maximum likelihood by L-BFGS, the best of
    its starts), ``rounds`` the exchanges of the fit, ``communication`` the bytes of the fit
    (zero for a centralised fit), ``query_communication`` those of the queries answered after
    it (federated models only: their predictions travel the chain).
    """

    estimates = "estimate"  # maximum-likelihood hyperparameters

    model = "multi-fidelity chain"
    federated = False

    def __init__(
        self,
        *,
        fidelities: Sequence[Any],
        names: Sequence[str],
        feature_names: Sequence[str],
        options: Mapping[str, Any],
        seed: int,
        communication: Communication | None = None,
        seconds: float = 0.0,
    ) -> None:
        self.fidelities, self.names = list(fidelities), [str(n) for n in names]
        self.feature_names = [str(f) for f in feature_names]
        self.n_obs = {n: int(lv.n) for n, lv in zip(self.names, self.fidelities)}
        self.options, self.seed = dict(options), int(seed)
        self.communication = Communication() if communication is None else communication
        self.query_communication = Communication()
        self.history = None
        self.converged, self.seconds = True, float(seconds)

    @property
    def rounds(self) -> int:
        """The exchanges of the fit with a fidelity's client (0 for a centralised fit)."""
        return int(self.communication.rounds)

    @property
    def clients(self) -> list[str]:
        """The fidelity clients of a federated fit; none for a centralised one."""
        return list(self.names) if self.federated else []

    @property
    def d(self) -> int:
        return len(self.feature_names)

    # ------------------------------------------------------------------ queries
    def _moments(self, Xs: np.ndarray, t: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _fidelity_of(self, client: Hashable | None) -> int:
        if client is None:
            return len(self.fidelities) - 1
        if self.federated and client in self.names:
            return self.names.index(str(client))
        if self.federated:
            raise UnknownClientError(f"unknown client {client!r}: the fidelities' clients are {self.names}")
        raise UnknownClientError(
            f"{self.model} is centralised and has no clients (got client={client!r}): client=None predicts "
            "the highest fidelity, fidelity_moments(X, t) a lower fidelity"
        )

    def _to_scale(self, t: int, scale: str, mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if check_scale(scale) == "standardized":
            return mean, var
        lv = self.fidelities[t]
        return lv.mu + lv.sd * mean, var * lv.sd**2

    def fidelity_moments(self, X: ArrayLike, t: int, *, scale: str = "original") -> tuple[np.ndarray, np.ndarray]:
        """Mean and latent variance of fidelity ``t`` (0: the lowest) at the rows of ``X``,
        on that fidelity's data scale (``scale="original"``) or on its standardised training
        scale (``"standardized"``: its outputs' own mean and sd)."""
        if not (isinstance(t, (int, np.integer)) and 0 <= t < len(self.fidelities)):
            raise ValueError(f"t must be a fidelity index in 0..{len(self.fidelities) - 1}, got {t!r}")
        check_scale(scale)
        mean, var = self._moments(check_queries(X, self.d), int(t), "fidelity moments")
        return self._to_scale(int(t), scale, mean, var)

    def level_moments(self, X: ArrayLike, t: int, *, scale: str = "original") -> tuple[np.ndarray, np.ndarray]:
        """Former name of :meth:`fidelity_moments` (one release)."""
        warn_renamed(f"{type(self).__name__}.level_moments", ".fidelity_moments")
        return self.fidelity_moments(X, t, scale=scale)

    def predict(
        self, X: ArrayLike, client: Hashable | None = None, *, level: float = 0.95, scale: str = "original"
    ) -> pd.DataFrame:
        """The highest fidelity at the rows of ``X`` (an array by position, or a data frame by
        column name; a federated fit: ``client`` may name a
        lower level's client for that level): ``mean``, ``lower``/``upper`` (the ``level``
        credible band of f), ``pred_lower``/``pred_upper`` (the predictive band of a new
        observation, adding the fidelity's fitted noise), then ``sd`` and ``pred_sd``; on the
        data's scale (``scale="original"``, default) or on the fidelity's standardised training
        scale (``"standardized"``, the FGPR paper's metric)."""
        level, scale = check_level(level), check_scale(scale)
        t = self._fidelity_of(client)
        Xs = check_queries(self._feature_rows(X, self.feature_names), self.d)  # a data frame by column name
        mean, var = self._moments(Xs, t, "predict")
        var_y = var + float(self.fidelities[t].hyper["noise"][0])  # a new observation: the fidelity's noise added
        _, var_y = self._to_scale(t, scale, mean, var_y)
        mean, var = self._to_scale(t, scale, mean, var)
        out = band_frame(mean, var, level, var_y)
        out.attrs["predicted_for"] = "client"
        out.attrs["scale"] = scale
        return out

    # ------------------------------------------------------------------ tables
    def _fidelity_rows(self, t: int) -> list[tuple[str, float, float]]:
        raise NotImplementedError

    def _lengthscale_labels(self, t: int, extra: str | None = None) -> list[str]:
        name, spec = self.names[t], self.fidelities[t].spec
        if not spec.ard:
            return [f"lengthscale[{name}]"]
        return [f"lengthscale[{name}, {f}]" for f in self.feature_names] + (
            [f"lengthscale[{name}, {extra}]"] * (extra is not None)
        )

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        """Every fidelity's parameters, lowest fidelity first (see the model's ``summary``): ``mean``
        and ``estimate`` the maximum-likelihood value on the data's scale, ``standardized`` the
        same parameter on the fidelity's standardised scale, as fitted; no sd or interval (the
        fit has no distribution for them)."""
        rows = [r for t in range(len(self.fidelities)) for r in self._fidelity_rows(t)]
        labels = [r[0] for r in rows]
        values = np.array([r[1] for r in rows], dtype=float)
        fitted = np.array([r[2] for r in rows], dtype=float)
        return pd.DataFrame(
            {"mean": values, "estimate": values, "standardized": fitted}, index=pd.Index(labels, name="parameter")
        )

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        # every parameter belongs to the one chain (summary); a fidelity's client has none of its own
        return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))

    def _no_posterior(self, what: str) -> str:
        if what != "global":
            return (
                f"{self.model}'s fidelities have no parameters of their own beyond the chain's (summary()); "
                "predictions carry credible and predictive bands: predict(X)"
            )
        return (
            f"{self.model} has no posterior of its hyperparameters and links (maximum-likelihood estimates: "
            "summary() lists them); its predictions carry credible and predictive bands: predict(X)"
        )


class FederatedChain:
    """Mixin of the federated chain results: built from the fidelities as released by the fit
    (``fidelities``) and, in process, the federation (``data``: each fidelity's client with its own
    rows; never written to a file). On the first query each fidelity's client rebuilds its fitted
    GP from its own rows and its release, without refitting (the chain below sends the moments
    at its inputs, counted as ``"rebuild"`` in ``query_communication``): in a deployment each
    node would keep its fitted fidelity. The queries' accounting: ``query_communication`` and
    ``messages`` (``(client, direction, what, shape)`` of every array a query sent)."""

    names: list[str]
    query_communication: Communication
    model: str
    _transient: Mapping[str, Any] = {"_clients": None, "_data": None, "messages": []}

    def __init__(self, *, fidelities: Sequence[Any], data: Any = None, history: Any = None, **kwargs: Any) -> None:
        super().__init__(fidelities=fidelities, **kwargs)  # type: ignore[call-arg]
        self._data: Any = data
        self._clients: list | None = None
        self.history = history  # the fit's run: one record per round
        self.messages: list = []

    def _rebuild(self, data: Any) -> list:
        raise NotImplementedError

    def attach(self, data: Any) -> Any:
        """Hand the result the federation it was fitted on (each fidelity's client with its own
        rows): each fidelity rebuilds its GP from its rows and its release (counted as
        ``"rebuild"`` in ``query_communication``), so a loaded result predicts again, exactly
        as before it was saved. Rows other than the fit's are refused. Returns the result."""
        self._clients = self._rebuild(data)
        self._data = data
        return self

    @contextmanager
    def _query(self) -> Iterator[Wire]:
        """A query after the fit: its exchanges are added to ``query_communication`` and
        ``messages``, and to every open :func:`~fedstats.federation.counting` ledger."""
        wire = Wire()
        try:
            yield wire
        finally:
            if wire.messages or wire.comm.rounds:
                parts = [c for c in (self.query_communication, wire.comm) if c.by_kind]  # none "unlabelled"
                self.query_communication = Communication.combine(parts)
                self.messages.extend(wire.messages)
                record(wire.comm)

    def _live(self) -> list:
        if self._clients is None and self._data is not None:
            self._clients = self._rebuild(self._data)
        if self._clients is None:
            raise ValueError(
                f"this {self.model} result holds no fidelity's rows (loaded from a file?): its predictions need each "
                "fidelity's client; attach the federation it was fitted on with result.attach(data)"
            )
        return self._clients
