"""The one result contract of fedstats, and its safe file format.

Every fitted model returns a result that keeps the same verbs and columns (the base class
:class:`FederatedResult`) and saves to one versioned format (:func:`save_result`,
:func:`load_result`, re-exported from :mod:`fedstats.result_file`: a zip of JSON and arrays
that rebuilds only the classes fedstats registered as plain data, :func:`register`, so loading
a file never runs code it names; anything else is refused with :class:`ResultFileError`).

The contract every result keeps (:class:`FederatedResult`):

* ``summary(level=0.95, kind="eti")``: the global parameters, one row each (index
  ``parameter``), columns ``mean, sd, lower, upper, p_value`` first. ``mean`` is the
  posterior mean, or the estimate where the model has no distribution for the parameter;
  a column the model has no distribution for holds NaN, the column set never changes.
  Model-specific columns follow. A model without global parameters returns no rows.
* ``client_summary(level=0.95, kind="eti")``: one long table ``client, parameter, mean, sd,
  lower, upper, p_value`` (then model-specific columns) of every client's own parameters.
* ``global_posterior()`` and ``client_posterior(client)``: the posterior objects of
  :mod:`fedstats.inference.posterior` (intervals, hdi, prob, tail probability, draws,
  ``to_arviz``); a result without one raises :class:`NoPosteriorError`, whose message names
  the option or model that gives one.
* ``predict(X, client=None, *, level=0.95)``: columns ``mean, lower, upper, pred_lower,
  pred_upper`` first (credible band of the mean response, predictive band of a new
  observation), NaN where the model has no distribution. ``client=None`` asks for a client
  that took no part in the fit: models with a population (HM2, the lasso and ridge) predict
  from it, FedAvg and distributed ridge from their shared model, FGPR from the new client's
  own ``data=``, the others (HM1, Separate, Ditto) refuse. A client name the
  fit has not seen is always refused (:class:`UnknownClientError`, a ``KeyError``), never
  silently predicted from the population. ``frame.attrs["predicted_for"]`` says which
  (``"client"`` or ``"new client"``). Mixtures keep scikit-learn's meaning instead:
  ``predict`` gives component labels and ``predict_proba`` the responsibilities.
* ``to_arviz(n=4000, seed=0, n_chains=4)``: every posterior of the result in one ``InferenceData``.
* ``history``, ``rounds``, ``converged``, ``seconds``, ``communication`` (every exchange of
  the fit, with ``communication.by_kind``), ``save``/``load`` and a short ``repr``.
* ``privacy``: what a differentially private fit spent (:class:`~fedstats.privacy.PrivacySpent`:
  ``epsilon``, ``delta``, every release), ``None`` for the others. Its tables' intervals exclude
  the noise unless the model's ``include_dp_noise`` option says otherwise
  (``frame.attrs["privacy"]`` says which).
"""

from __future__ import annotations

import copy
import functools
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from ._tails import chi2_sf, norm_ppf, norm_sf
from .data import UnknownClientError  # a KeyError (and a DataError) naming the client
from .data.validation import ClientId

# the file format's names, re-exported for every model
from .result_file import FORMAT, MAX_ARRAY_BYTES, VERSION, ResultFileError, load_result, register, save_result  # noqa: F401
from .summary_table import SummaryTable, labelled  # noqa: F401 (SummaryTable: what summary returns)

if TYPE_CHECKING:
    from arviz import InferenceData

#: a posterior object of :mod:`fedstats.inference.posterior` (the contract does not import the
#: inference package, which sits above it: its custom-model EP returns a result)
Posterior = Any

_F = TypeVar("_F", bound=Callable[..., Any])


SUMMARY_COLUMNS = ("mean", "sd", "lower", "upper", "p_value")
CLIENT_SUMMARY_COLUMNS = ("client", "parameter", *SUMMARY_COLUMNS)
PREDICT_COLUMNS = ("mean", "lower", "upper", "pred_lower", "pred_upper")


class NoPosteriorError(RuntimeError):
    """The result has no posterior distribution for what was asked; the message names the
    option or the model that gives one."""


class ExcludedClientError(NoPosteriorError):
    """A client of the data that is not in the fit (it never answered, was refused by its
    node, failed or was lost): it has no numbers, and the message says why."""


def excluded_message(client: ClientId, reason: str) -> str:
    """The one sentence every model uses for a client that is not in the fit."""
    return f"client {client!r} is not in the fit, so it has no estimates or predictions: {reason}"


def warn_excluded(excluded: Mapping[ClientId, str], *, stacklevel: int = 3) -> None:
    """Warn that the clients of ``excluded`` (client -> reason) are not in the fit, naming
    each with its reason (at most five, then a count)."""
    if not excluded:
        return
    items = list(excluded.items())
    named = "; ".join(f"{c!r}: {why}" for c, why in items[:5])
    more = f"; and {len(items) - 5} more (see result.excluded)" if len(items) > 5 else ""
    warnings.warn(
        f"{len(items)} client(s) are not in the fit and have no estimates (NaN rows in "
        f"client_summary, predict refuses them): {named}{more}",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


def check_level(level: float) -> float:
    """``level`` as a float in (0, 1), or a ValueError in the style of every model."""
    try:
        v = float(level)
    except (TypeError, ValueError):
        raise ValueError(f"level must be a number in (0, 1), got {level!r}") from None
    if not 0 < v < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    return v


def check_kind(kind: str) -> str:
    if kind not in ("eti", "hdi"):
        raise ValueError(f"kind must be 'eti' (equal-tailed) or 'hdi' (highest density), got {kind!r}")
    return kind


def contract_frame(df: pd.DataFrame, leading: Sequence[str]) -> pd.DataFrame:
    """``df`` with the columns ``leading`` first (NaN where ``df`` has none of them), the
    others after in their order."""
    out = df.copy()
    for c in leading:
        if c not in out.columns:
            out[c] = np.nan
    rest = [c for c in out.columns if c not in leading]
    return out[list(leading) + rest]


def prediction_frame(
    mean: ArrayLike,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    pred_lower: ArrayLike | None = None,
    pred_upper: ArrayLike | None = None,
    *,
    predicted_for: str = "client",
    **extra: Any,
) -> pd.DataFrame:
    """The ``predict`` table of the contract: the five leading columns (NaN where None), then
    ``extra`` columns; ``attrs["predicted_for"]`` says whether a fitted client's posterior or
    a new client's was used."""
    mean = np.asarray(mean, dtype=float)
    nan = np.full(mean.shape, np.nan)
    cols: dict[str, np.ndarray] = {"mean": mean}
    for name, v in (("lower", lower), ("upper", upper), ("pred_lower", pred_lower), ("pred_upper", pred_upper)):
        cols[name] = nan if v is None else np.asarray(v, dtype=float)
    df = pd.DataFrame({**cols, **extra})
    df.attrs["predicted_for"] = predicted_for
    return df


def _empty_table(columns: Iterable[str], index_name: str | None = "parameter") -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in columns}, index=pd.Index([], name=index_name, dtype=object))


def printed_p_values(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its ``p_value`` column as printed: blank where the model states no null
    hypothesis, ``< 1e-4`` rather than a misleading ``0.0000``."""
    if "p_value" not in df.columns:
        return df
    return df.assign(p_value=["" if pd.isna(p) else "< 1e-4" if p < 1e-4 else f"{p:.4f}" for p in df["p_value"]])


# --------------------------------------------------------------------------- base
class FederatedResult:
    """Base of the results of fitted models: ``save``/``load`` in the format of this module.

    ``_transient`` names attributes that are caches or references to data (never written):
    a loaded result gets a fresh copy of the value given there.
    """

    _transient: Mapping[str, Any] = {}
    #: a :class:`~fedstats.privacy.PrivacySpent` for a differentially private fit (the spent
    #: ``(epsilon, delta)`` and every release); ``None`` otherwise
    privacy: Any = None
    #: the clients of the data that are not in the fit, each with the reason (client ->
    #: reason: it never answered, its node refused or was lost, its steps failed). They have
    #: NaN rows in :meth:`client_summary` (column ``excluded``) and no posterior or prediction
    #: (:class:`ExcludedClientError`)
    excluded: Mapping[ClientId, str] = {}
    #: how the fit's feature columns were encoded (:mod:`fedstats.data.encoding`): ``predict``
    #: reads a data frame's columns by name through it (``None``: by the feature names)
    encoding: dict[str, Any] | None = None
    #: each client's influence (:mod:`fedstats.federation.influence`): a data frame by client,
    #: ``shift`` (how far the estimate moves without the client, in its standard errors) and
    #: ``relative`` (that shift over what a client of its size typically causes); ``None``
    #: where the model or the fit (secure aggregation, differential privacy) has none
    influence: pd.DataFrame | None = None
    #: what the summary tables' numbers are: ``"posterior"`` (posterior mean, sd, credible
    #: interval, tail probability) or ``"estimate"`` (estimate, standard error, confidence
    #: interval, p-value); their printed form says so (:mod:`fedstats.summary_table`)
    estimates: str = "posterior"

    def _estimates(self) -> str:
        """What this fit's summary numbers are (see :attr:`estimates`); a model whose answer
        depends on the fit (posteriors computed or not) overrides it."""
        return self.estimates

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._transient}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)
        for k, v in self._transient.items():
            setattr(self, k, copy.copy(v))

    def __repr__(self) -> str:
        """Model, clients, rounds, convergence: never a dump of states or arrays."""
        parts = []
        model = getattr(self, "model", None)
        if model is not None:
            parts.append(f"model={model!r}")
        clients = getattr(self, "clients", None)
        if clients is not None:
            parts.append(f"clients={len(clients)}")
        for name in ("rounds", "converged"):
            value = getattr(self, name, None)
            if value is not None:
                parts.append(f"{name}={value}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # ------------------------------------------------------------------ the contract
    def _no_posterior(self, what: str) -> str:
        """Why this result has no posterior for ``what`` ("global" or "client") and which
        option or model gives one (the message of :class:`NoPosteriorError`)."""
        return f"{type(self).__name__} has no {what} posterior"

    def global_posterior(self) -> Posterior:
        """Posterior of the global parameters (a posterior object of
        :mod:`fedstats.inference.posterior`); :class:`NoPosteriorError` where the model has none."""
        raise NoPosteriorError(self._no_posterior("global"))

    def client_posterior(self, client: ClientId) -> Posterior:
        """Posterior of client ``client``'s own parameters; :class:`NoPosteriorError` where
        the model has none, :class:`UnknownClientError` for a client the fit has not seen."""
        self._check_client(client)
        raise NoPosteriorError(self._no_posterior("client"))

    def _feature_rows(self, X: Any, names: Sequence[str] | None = None) -> Any:
        """``X`` as the float array of the fit's features ``names`` (default: every feature of
        its encoding): a data frame by column name, categories encoded as in the fit, unknown
        or missing columns refused by name (:func:`~fedstats.data.encoding.encode_rows`); an
        array as it is (by position)."""
        from .data.encoding import encode_rows

        enc = self.encoding
        if names is None:
            names = enc["names"] if enc is not None else getattr(self, "feature_names")
        return encode_rows(X, enc, names)

    def _all_clients(self) -> list[ClientId]:
        """Every client of the data: those of ``clients`` (an attribute or a property by
        subclass: this base class declares none), then any :attr:`excluded` client a model
        leaves out of ``clients``."""
        clients = list(getattr(self, "clients"))
        return clients + [c for c in (self.excluded or {}) if c not in clients]

    def _fitted_clients(self) -> list[ClientId]:
        """The clients in the fit: every client but the :attr:`excluded` ones."""
        excluded = self.excluded or {}
        return [c for c in self._all_clients() if c not in excluded]

    def _check_client(self, client: ClientId) -> None:
        """Raise for a client the fit has not seen (:class:`UnknownClientError`) or that is not
        in it (:class:`ExcludedClientError`, with the reason)."""
        excluded = self.excluded or {}
        if isinstance(client, Hashable) and client in excluded:
            raise ExcludedClientError(excluded_message(client, excluded[client]))
        known = list(getattr(self, "clients", []) or [])
        if client not in known:
            raise UnknownClientError(
                f"unknown client {client!r}: the fit has not seen it (known clients include "
                f"{known[:5]}); pass client=None for a new client where the model has one"
            )

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        return self.global_posterior().summary(level=level, kind=kind)

    def _client_table(self, client: ClientId, level: float, kind: str) -> pd.DataFrame:
        return self.client_posterior(client).summary(level=level, kind=kind)

    def summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        """The global parameters, one row each: ``mean, sd, lower, upper, p_value`` (NaN where
        the model has no distribution for a column), then model-specific columns. ``lower``
        and ``upper`` bound the ``level`` credible interval, equal-tailed (``kind="eti"``) or
        of highest density (``"hdi"``); ``p_value`` is the two-sided posterior tail
        probability of 0, NaN for scale parameters. No rows where the model has no global
        parameters (see :meth:`client_summary`)."""
        level, kind = check_level(level), check_kind(kind)
        table = self._global_table(level, kind)
        return labelled(contract_frame(table, SUMMARY_COLUMNS).rename_axis("parameter"), self._estimates(), level)

    def client_summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        """Every client's own parameters in one long table: ``client, parameter, mean, sd,
        lower, upper, p_value`` (as in :meth:`summary`), then model-specific columns. A client
        that is not in the fit (:attr:`excluded`) keeps its rows with every number NaN, and the
        last column ``excluded`` (present only then) says why; it is ``None`` for the others."""
        level, kind = check_level(level), check_kind(kind)
        excluded = dict(self.excluded or {})
        tables: dict[ClientId, pd.DataFrame] = {}
        for c in self._fitted_clients():
            t = self._client_table(c, level, kind)
            tables[c] = contract_frame(t, SUMMARY_COLUMNS).rename_axis("parameter").reset_index()
        if not tables or all(len(f) == 0 for f in tables.values()):
            return labelled(_empty_table(CLIENT_SUMMARY_COLUMNS, None).reset_index(drop=True), self._estimates(), level)
        frames = []
        template = next(iter(tables.values()))
        for c in self._all_clients():
            if c in tables:
                t = tables[c]
            else:  # not in the fit: its parameters' rows, every number NaN, and why
                t = template[["parameter"]].copy()
                for col in template.columns[1:]:
                    t[col] = np.nan if pd.api.types.is_numeric_dtype(template[col]) else None
            t.insert(0, "client", c)
            if excluded:
                t["excluded"] = excluded.get(c)
            frames.append(t)
        table = contract_frame(pd.concat(frames, ignore_index=True), CLIENT_SUMMARY_COLUMNS)
        return labelled(table, self._estimates(), level)

    def to_arviz(self, n: int = 4000, seed: int = 0, *, n_chains: int = 4) -> InferenceData:
        """Every posterior of the result in one :class:`arviz.InferenceData`: variable
        ``global`` (dims ``chain, draw, global_parameter``) and ``local``, every client's own
        parameters (``chain, draw, client, parameter``), as far as the model has them.

        ``n`` seeded draws in all, in ``n_chains`` chains of ``n // n_chains`` (``n`` a
        multiple of it): independent draws from each posterior (Gaussian approximations
        sampled directly, weighted or MCMC draws resampled by weight), so the chains agree up
        to Monte-Carlo error and ArviZ's R-hat and ESS are defined; they diagnose the export,
        not the fit (the fit's own sampler diagnostics are on the models that sample, such as
        the lasso's ``sampler_diagnostics()``). :class:`NoPosteriorError` without any
        posterior. The Bayesian regressions also add the pointwise log-likelihood
        (``log_likelihood=data``) for ``arviz.loo`` and ``arviz.waic``."""
        from .arviz_export import to_inference_data

        if not isinstance(n_chains, int) or n_chains < 1 or not isinstance(n, int) or n < n_chains or n % n_chains:
            raise ValueError(
                f"n must be a positive multiple of n_chains (an int >= 1), got n={n!r}, n_chains={n_chains!r}"
            )
        rng = np.random.default_rng(seed)
        shape = (n_chains, n // n_chains)
        variables: dict[str, np.ndarray] = {}
        coords: dict[str, list[Any]] = {}
        dims: dict[str, list[str]] = {}
        g: Posterior | None
        try:
            g = self.global_posterior()
        except NoPosteriorError:
            g = None
        if g is not None:
            variables["global"] = g.sample(n, seed=rng).reshape(*shape, -1)
            coords["global_parameter"], dims["global"] = list(g.names), ["global_parameter"]
        clients = self._fitted_clients()
        try:
            posts = [self.client_posterior(c) for c in clients]
        except NoPosteriorError:
            posts = []
        if posts:
            names = list(posts[0].names)
            if any(list(p.names) != names for p in posts):
                raise ValueError(
                    "the clients' posteriors have different parameters; export each with client_posterior(c).to_arviz()"
                )
            variables["local"] = np.stack([p.sample(n, seed=rng) for p in posts], axis=1).reshape(
                *shape, len(posts), -1
            )
            coords["client"], coords["parameter"] = [str(c) for c in clients], names
            dims["local"] = ["client", "parameter"]
        if not variables:
            raise NoPosteriorError(self._no_posterior("global") + "; " + self._no_posterior("client"))
        return to_inference_data(variables, coords=coords, dims=dims)

    def save(self, path: str | PathLike[str]) -> Path:
        """Write the result to ``path``: a zip of JSON and arrays that :meth:`load` reads back
        and that never holds client rows or code (:mod:`fedstats.results`)."""
        return save_result(self, path)

    @classmethod
    def load(cls, path: str | PathLike[str], *, max_bytes: int = MAX_ARRAY_BYTES) -> Self:
        """The result that :meth:`save` wrote to ``path`` (it must be a ``cls``). Loading never
        runs code named in the file and is bounded (arrays of at most ``max_bytes`` together):
        see :func:`fedstats.result_file.load_result`."""
        return load_result(path, expected=cls, max_bytes=max_bytes)


class Coefficients:
    """The statsmodels-style view of a maximum likelihood fit's coefficients ``coef`` (named
    ``names``) with covariance ``cov``: ``params``, ``bse``, ``tvalues``, ``pvalues`` (two-sided
    Wald), ``cov_params()``, ``conf_int(level)`` (normal quantiles), :meth:`wald_test`, and the
    summary's Wald table (:meth:`_wald_table`). A base of the results that have them (the exact
    GLM, the Cox model)."""

    names: list[str]
    coef: np.ndarray
    cov: np.ndarray

    @property
    def params(self) -> pd.Series:
        return pd.Series(self.coef, index=self.names, name="params")

    @property
    def bse(self) -> pd.Series:
        return pd.Series(np.sqrt(np.diag(self.cov)), index=self.names, name="bse")

    @property
    def tvalues(self) -> pd.Series:
        return (self.params / self.bse).rename("z")

    @property
    def pvalues(self) -> pd.Series:
        return pd.Series(2 * norm_sf(np.abs(self.tvalues.to_numpy())), index=self.names, name="p_value")

    def cov_params(self) -> pd.DataFrame:
        return pd.DataFrame(self.cov, index=self.names, columns=self.names)

    def conf_int(self, level: float = 0.95) -> pd.DataFrame:
        """Wald intervals at ``level`` (normal quantiles, as statsmodels' GLM)."""
        q = norm_ppf(0.5 + check_level(level) / 2)
        b, se = self.params, self.bse
        return pd.DataFrame({"lower": b - q * se, "upper": b + q * se})

    def wald_test(self, names: str | Sequence[str], value: ArrayLike = 0.0) -> pd.Series:
        """Joint Wald test that the coefficients ``names`` equal ``value`` (a number or one
        per name): ``statistic`` (chi-square on ``len(names)`` df), ``df``, ``p_value``."""
        names = [names] if isinstance(names, str) else list(names)
        unknown = [n for n in names if n not in self.names]
        if unknown or not names:
            raise ValueError(f"unknown coefficient(s) {unknown}; the coefficients are {self.names}")
        idx = [self.names.index(n) for n in names]
        diff = self.coef[idx] - np.broadcast_to(np.asarray(value, dtype=float), (len(idx),))
        stat = float(diff @ np.linalg.solve(self.cov[np.ix_(idx, idx)], diff))
        return pd.Series({"statistic": stat, "df": float(len(idx)), "p_value": float(chi2_sf(stat, len(idx)))})

    def _wald_table(self, level: float) -> pd.DataFrame:
        """The summary's columns: the estimate (``mean``), its standard error (``sd``), the Wald
        interval, ``p_value`` and ``z``."""
        ci = self.conf_int(level)
        return pd.DataFrame(
            {
                "mean": self.params,
                "sd": self.bse,
                "lower": ci["lower"],
                "upper": ci["upper"],
                "p_value": self.pvalues,
                "z": self.tvalues,
            }
        )


def counted(fit: _F) -> _F:
    """Decorator for every model's ``fit``, the common entry: ``data`` (the first argument) may be
    anything :func:`fedstats.data.as_federated` converts, and every client of it must pass its
    disclosure rules (:func:`fedstats.data.disclosure.check_disclosure`); the result's ``communication`` counts
    every exchange of the fit (its rounds and every one-off round: starts, checks, scoring,
    shared information), with a per-kind breakdown (``communication.by_kind``); ``seconds`` is
    the wall time of the whole fit; warnings point at the caller's line."""

    @functools.wraps(fit)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from .data import as_federated
        from .data.disclosure import check_disclosure
        from .federation import counting
        from .federation.influence import report_influence

        if args:
            args = (as_federated(args[0]), *args[1:])
        elif "data" in kwargs:
            kwargs["data"] = as_federated(kwargs["data"])
        if args or "data" in kwargs:  # its disclosure rules, before the first exchange
            check_disclosure(args[0] if args else kwargs["data"], type(self).__name__)
        t0 = time.perf_counter()
        with counting() as ledger, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = fit(self, *args, **kwargs)
        for w in caught:  # re-issued at the caller's line of fit(), not at this wrapper's
            warnings.warn(w.message, w.category, stacklevel=2)
        too_much = getattr(getattr(res, "privacy", None), "warning", None)  # a PrivacySpent's check
        message = too_much() if callable(too_much) else None
        if message:
            warnings.warn(f"{type(self).__name__}: {message}", UserWarning, stacklevel=2)
        if ledger.parts and hasattr(res, "communication"):
            res.communication = ledger.communication()
        if isinstance(res, FederatedResult):
            data = args[0] if args else kwargs.get("data")
            if res.encoding is None and data is not None:  # to read new rows by name
                res.encoding = getattr(data, "encoding", None)
            # the clients that dropped out anywhere in the fit (its runs recorded them), then
            # those the model itself found not in it
            excluded = {
                **ledger.excluded,
                **{c: w for c, w in (res.excluded or {}).items() if c not in ledger.excluded},
            }
            res.excluded = excluded
            warn_excluded(excluded, stacklevel=3)
            if res.influence is None and ledger.influence:  # each client's leave-one-out shift, warned when large
                report_influence(res, *ledger.influence, model=type(self).__name__)
        res.seconds = time.perf_counter() - t0
        return res

    return cast(_F, wrapper)  # the same signature: wraps() copies it
