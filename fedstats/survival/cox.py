"""The Cox proportional hazards model across clients, by Newton's method on the pooled partial
likelihood: :class:`CoxPH`.

Unstratified, the server first finds the pooled event times and the number of events at each
(a search on summed counts), then every Newton step takes two rounds: each client sends its
risk-set sums at the event times (``S0``, ``S1``, and at tied times under Efron's ties the events'
own ``D0``, ``D1``), the server forms the log partial likelihood, the score and the outer-product
part of the information, and sends back one weight per event time, with which each client
sends its rows' weighted second moments (one ``p x p`` matrix). The sums are those of the pooled
rows, so the fit is lifelines' ``CoxPHFitter`` (Efron) and statsmodels' ``PHReg`` (Efron and
Breslow) on the pooled rows, to rounding.

``stratify=True`` gives every client its own baseline hazard: the partial likelihood is the sum
of the clients' own, each computed where its rows are, and a client sends only its value,
score and information (summed): no time, count or risk-set sum leaves it. ``robust=True``:
the sandwich covariance with the rows' score residuals (Lin and Wei; statsmodels' definition,
lifelines' where no times are tied), from one more summed round.

What the server learns (unstratified): the pooled event times, the events at each, and the
summed risk-set sums. Two consecutive risk-set sums differ by the rows that left the risk set
between the two times, so each such group's sum is set apart: the data's ``min_cell_count``
applies to those groups (and to the tied events of Efron's ties), checked on their counts
before any sum is sent. A refusal names ``bins=`` (coarser times), ``stratify=True`` and the
rule.

Example
-------
>>> import numpy as np
>>> from fedstats.data import FederatedData
>>> from fedstats.survival import CoxPH
>>> rng = np.random.default_rng(0)
>>> Xs, ts = [], []
>>> for _ in range(3):
...     x = rng.normal(size=(300, 1))
...     t = rng.exponential(1 / np.exp(0.7 * x[:, 0]))
...     Xs.append(np.column_stack([x, (t < 2).astype(float)]))
...     ts.append(np.minimum(t, 2.0))
>>> fd = FederatedData.from_arrays(Xs, ts, feature_names=["x", "E"], target_name="T")
>>> res = CoxPH(event="E", stratify=True).fit(fd)
>>> bool(abs(res.params["x"] - 0.7) < 0.15)
True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .._tails import chi2_sf, norm_ppf
from ..data import DataError, FederatedData, require_target
from ..data.disclosure import DisclosureError
from ..estimator import BOOL, NONE, Constraint, Estimator, Int, OneOf, Real
from ..federation import Communication, History, run
from ..federation.records import exclude, excluded_now
from ..fitting import RunOptions, federated_fit
from ..result_file import register
from ..results import Coefficients, FederatedResult, check_level, prediction_frame
from ..stats._columns import Column
from ..stats._rounds import Exchanges, released_rules
from ._data import check_bins, columns_of, predictor_rows
from ._exchanges import NEWTON_TOL, _CoxCheck, _CoxNewton, _CoxScores, _CoxStrata, _Leaving, _Schoenfeld
from .concordance import Concordance
from .km import time_counts

__all__ = ["CoxPH", "CoxResult", "CoxConvergenceWarning"]


_R = TypeVar("_R")


class CoxConvergenceWarning(UserWarning):
    """Newton's method stopped at the step limit before the coefficients settled."""


#: failures of a client's step that come from the model or the data, not from its node: the fit
#: stops, naming the client, instead of leaving it out
MODEL_FAILURES = ("DataError", "ValueError", "FloatingPointError", "LinAlgError", "ProtocolError")


class _Dropped(Exception):
    """Clients whose nodes failed in an exchange of the fit: it starts again without them."""

    def __init__(self, failed: dict[Hashable, str]) -> None:
        super().__init__(failed)
        self.failed = failed


def _failures(history: Any, what: str = "CoxPH") -> None:
    """Raise for the failures of a run: a client's bad data or a model failure stop the fit
    (a :class:`DataError` with the client's own message); a node that failed drops out
    (:class:`_Dropped`)."""
    failed = {c: why for rec in history for c, why in rec.failed.items()}
    for c, why in failed.items():
        if why.startswith("DataError: "):
            msg = why.removeprefix("DataError: ")
            raise DataError(msg if msg.startswith("client ") else f"client {c!r}: {msg}")
        if why.split(":", 1)[0] in MODEL_FAILURES:
            raise RuntimeError(f"{what}: client {c!r} failed: {why}")
    if failed:
        raise _Dropped(failed)


def without_dropped(fit: Callable[[], _R], what: str) -> _R:
    """``fit()``; when clients' nodes fail in it (:class:`_Dropped`), again without them (every
    number of a fit from one set of clients), with a warning naming them."""
    while True:
        try:
            return fit()
        except _Dropped as exc:
            exclude(exc.failed)
            warnings.warn(
                f"{what}: client(s) {list(exc.failed)[:5]} failed; fitting again without them",
                RuntimeWarning,
                stacklevel=4,
            )


class _Rounds(Exchanges):
    """The one-off rounds of a fit (see :func:`_failures`)."""

    def _run(self, algorithm: Any, rounds: int, kind: str, privacy_ledger: Any = None) -> Any:
        r = run(algorithm, self.data, rounds=rounds, seed=self.seed, progress=False, batched=False, kind=kind)
        _failures(r.history, self.what)
        self.parts.append(r.communication)
        return r


_BINS = NONE | Constraint(lambda v: check_bins(v, "CoxPH") is not None, "increasing bin edges >= 0")


@dataclass(eq=False, repr=False, kw_only=True)
class CoxPH(Estimator):
    """Cox proportional hazards model fitted across clients (exact maximum partial likelihood).

    Parameters
    ----------
    event : str
        The 0/1 column of events (1: the event at the time; 0: censored then), taken out of the
        predictors on each client. The time is the data's target; every other column is a
        predictor (no intercept: the baseline hazard holds it).
    ties : {"efron", "breslow"}, default "efron"
        How tied event times enter the partial likelihood (lifelines: Efron; R: Efron).
    stratify : bool, default False
        Every client its own baseline hazard (R's ``strata(site)``): only each client's summed
        score and information leave it.
    robust : bool, default False
        Sandwich standard errors from the rows' score residuals (one more round).
    bins : sequence of float, optional
        Coarsen every time to the upper edge of its bin on the client (``(e_(k-1), e_k]``):
        the fit of the coarsened times (their ties by ``ties``).
    rounds : int, default 50
        Most Newton steps.
    tol : float, default 1e-9
        Stop when no coefficient would move by more than this.
    """

    _constraints = {
        "event": Constraint(lambda v: isinstance(v, str), "a column name"),
        "ties": OneOf("efron", "breslow"),
        "stratify": BOOL,
        "robust": BOOL,
        "bins": _BINS,
        "rounds": Int(1),
        "tol": Real(0, closed=(False, True)),
    }

    event: str = "event"
    ties: str = "efron"
    stratify: bool = False
    robust: bool = False
    bins: Sequence[float] | None = None
    rounds: int = 50
    tol: float = NEWTON_TOL

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> CoxResult:
        """Fit by federated Newton steps; returns a :class:`CoxResult`. Raises
        :class:`~fedstats.data.DataError` for a bad time or event (naming the client and the
        column), a constant or collinear predictor, or no events. A client whose node fails
        drops out, and the fit starts again without it (every number from one set of clients)."""
        require_target(data, "CoxPH")
        return without_dropped(lambda: self._fit(data, run), "CoxPH")

    def _fit(self, data: FederatedData, run: RunOptions) -> CoxResult:
        spec = columns_of(data, self.event, "CoxPH", bins=self.bins)
        if not spec.predictors:
            raise DataError("CoxPH: no predictors (every column but the event is one; the time is the target)")
        ex = _Rounds(data, [Column(self.event, (spec.event,))], seed=run.seed, what="CoxPH")
        chk = ex.sums(_CoxCheck(spec), "design check")
        n, events = float(chk["rows"][0]), float(chk["events"][0])
        if events == 0:
            raise DataError(f"CoxPH: no row has an event ({self.event!r} is 0 everywhere): nothing to fit")
        mean = chk["sx"] / n
        _check_predictors(spec.names, chk["sx"], chk["sxx"], n)
        xd = chk["xd"] - events * mean
        efron = self.ties == "efron"
        times = d = leaving = None
        if self.stratify:
            alg: Any = _CoxStrata(spec, mean, efron, self.tol, self.rounds)
        else:
            times, d = time_counts(ex, spec, events_only=True)
            d = d[:, 0]
            leaving = ex.sums(_Leaving(spec, times), "risk-set counts")["leaving"]
            _check_groups(leaving, d, efron, released_rules(data)[1])
            alg = _CoxNewton(spec, times, d, mean, xd, efron, self.tol, self.rounds)
        out = run.run(alg, data, rounds=4 * int(self.rounds) + 4, kind="Newton rounds")
        _failures(out.history)
        s = out.server_state
        acc = s["accepted"]
        if s["info"] is None or not np.all(np.isfinite(s["info"])):
            raise DataError(f"CoxPH: {s['why'] or 'the fit stopped before its information was known'}")
        if not s["converged"]:
            if "singular" in s["why"]:
                raise DataError(f"CoxPH: {s['why']}")
            warnings.warn(CoxConvergenceWarning(f"CoxPH: {s['why']}; raise rounds= or check the predictors"))
        beta, info = acc["beta"], s["info"]
        cov = np.linalg.inv(info)
        cov = (cov + cov.T) / 2
        hazard = None
        if not self.stratify:
            hazard = d / acc["s0"]
        if self.robust:
            if self.stratify:
                scores = _CoxScores(spec, beta, mean)
            else:
                scores = _CoxScores(spec, beta, mean, times, acc["s1"] / acc["s0"][:, None], hazard)
            meat = ex.sums(scores, "score residuals")["meat"]
            cov = cov @ meat @ cov
            cov = (cov + cov.T) / 2
        return CoxResult(
            model="CoxPH",
            names=list(spec.names),
            predictors=list(spec.names),
            clients=[c for c in data.clients if c not in excluded_now()],
            feature_names=list(data.feature_names),
            event_index=spec.event,
            coef=np.asarray(beta, float),
            cov=cov,
            cov_type="robust" if self.robust else "nonrobust",
            ties=self.ties,
            stratified=bool(self.stratify),
            llf=float(s["lls"][-1]),
            llf_null=float(s["lls"][0]),
            nobs=int(n),
            n_events=int(events),
            mean=mean,
            times=times,
            hazard=hazard,
            events=d,
            information=info,
            at_risk=None if leaving is None else np.cumsum(leaving[::-1])[::-1],
            risk_mean=None if self.stratify else acc["wm"],
            time_name=spec.time_name,
            event_name=self.event,
            bins=spec.bins,
            converged=bool(s["converged"]),
            n_iter=int(s["steps"]),
            rounds=len(out.history),
            history=out.history,
            communication=out.communication,
        )


def _check_predictors(names: Sequence[str], sx: np.ndarray, sxx: np.ndarray, n: float, what: str = "CoxPH") -> None:
    """Refuse, by name, a predictor that is constant on the pooled rows (the baseline hazard
    absorbs it: its spread about the mean is 0 up to rounding, from the summed ``X'X``) or a
    linear combination of others."""
    mean = sx / n
    scatter = sxx - n * np.outer(mean, mean)
    var = np.diag(scatter)
    for j, name in enumerate(names):
        if var[j] <= 1e-12 * sxx[j, j]:
            raise DataError(
                f"{what}: predictor {name!r} is constant ({mean[j]:g}) on the pooled rows: the baseline hazard "
                "absorbs it; drop it"
            )
    sd = np.sqrt(var)
    C = scatter / np.outer(sd, sd)
    for j in range(1, len(names)):
        ev = np.linalg.eigvalsh(C[: j + 1, : j + 1])
        if ev[0] < 1e-10 * ev[-1]:
            raise DataError(
                f"{what}: predictor {names[j]!r} is a linear combination of {list(names[:j])} on the pooled rows: "
                "its coefficient is not identified; drop it"
            )


def _check_groups(leaving: np.ndarray, d: np.ndarray, efron: bool, min_cell_count: int) -> None:
    """Refuse risk-set sums that would set apart a group of 1 .. ``min_cell_count - 1`` rows:
    the rows leaving the risk set between two event times, and with Efron's ties the tied
    events at a time (and the others that leave with them)."""
    k = int(min_cell_count)
    groups = [leaving]
    if efron:
        tied = d >= 2
        groups += [np.where(tied, d, 0), np.where(tied, leaving - d, 0)]
    small = np.zeros(len(d), dtype=bool)
    for g in groups:
        small |= (g > 0) & (g < k)
    if small.any():
        raise DisclosureError(
            f"CoxPH refuses risk-set sums that would set apart fewer than min_cell_count={k} rows: at "
            f"{int(small.sum())} of {len(d)} event times the rows leaving the risk set (or the tied events) are "
            f"fewer (rule min_cell_count). Coarsen the times with bins=[...] (--bins), fit stratify=True (--stratify: "
            "each client's own baseline, no risk-set sum leaves it), or allow it with "
            "data.with_rules(min_cell_count=1) (--min-cell-count 1)",
            "min_cell_count",
            None,
        )


@register
class CoxResult(Coefficients, FederatedResult):
    """A fitted :class:`CoxPH`: the coefficients (log hazard ratios) with their standard errors,
    ``summary(level)`` (``mean``: the estimate, ``sd``: its standard error, Wald ``lower``,
    ``upper``, ``p_value``, then ``z`` and the hazard ratio ``exp_coef`` with its interval),
    :meth:`hazard_ratios`, :meth:`wald_test`, :meth:`lr_test`, the baseline survival at the
    mean predictors (unstratified fits) and :meth:`predict_survival` of new rows.
    statsmodels' and lifelines' names: ``params``, ``bse``, ``pvalues``, ``conf_int()``,
    ``cov_params()``, ``llf`` (the log partial likelihood; ``llf_null`` at no predictor),
    :meth:`baseline_hazard`, :meth:`baseline_survival`."""

    estimates = "estimate"

    model: str
    names: list[str]
    predictors: list[str]
    feature_names: list[str]
    event_index: int
    clients: list[Hashable]
    coef: np.ndarray
    cov: np.ndarray
    cov_type: str
    ties: str
    stratified: bool
    llf: float
    llf_null: float
    nobs: int
    n_events: int
    mean: np.ndarray
    times: np.ndarray | None
    hazard: np.ndarray | None  # the Breslow baseline hazard increments at the event times
    events: np.ndarray | None  # the events at the event times
    information: np.ndarray  # the observed information at the fit
    at_risk: np.ndarray | None  # the rows at risk at the event times
    risk_mean: np.ndarray | None  # the Schoenfeld residuals' weighted means at the event times
    time_name: str
    event_name: str
    bins: tuple[float, ...] | None
    converged: bool
    n_iter: int
    rounds: int
    history: History
    communication: Communication
    seconds: float

    def __init__(self, **state: Any) -> None:
        self.__dict__.update(state)
        self.seconds = 0.0

    def _no_posterior(self, what: str) -> str:
        return (
            f"CoxPH is a maximum partial likelihood fit: no {what} posterior (its summary gives Wald intervals); "
            "HierarchicalCox gives posteriors"
        )

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        t = self._wald_table(level)
        return t.assign(exp_coef=np.exp(t["mean"]), exp_lower=np.exp(t["lower"]), exp_upper=np.exp(t["upper"]))

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        # the coefficients are shared by every client: a client has none of its own
        return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))

    def hazard_ratios(self, level: float = 0.95) -> pd.DataFrame:
        """``exp`` of the coefficients with their Wald intervals mapped the same way and the
        test of a ratio of 1: ``ratio``, ``lower``, ``upper``, ``p_value``."""
        ci = self.conf_int(level)
        out = pd.DataFrame(
            {"ratio": np.exp(self.params), "lower": np.exp(ci["lower"]), "upper": np.exp(ci["upper"]),
             "p_value": self.pvalues}
        ).rename_axis("parameter")  # fmt: skip
        out.attrs["ratio"] = "hazard ratio"
        return out

    def lr_test(self, other: CoxResult | None = None) -> pd.Series:
        """Likelihood-ratio test against ``other`` (a nested fit of the same rows, ties and
        strata), or, without, against the model with no predictor (lifelines'
        ``log_likelihood_ratio_test``): ``statistic``, ``df``, ``p_value``."""
        if other is None:
            stat, df = 2 * (self.llf - self.llf_null), len(self.names)
        else:
            if not isinstance(other, CoxResult):
                raise TypeError(f"lr_test compares two CoxResult fits, got {type(other).__name__}")
            big, small = (self, other) if len(self.names) >= len(other.names) else (other, self)
            if not set(small.names) < set(big.names):
                raise ValueError(f"the models are not nested: {small.names} is not a subset of {big.names}")
            if (big.nobs, big.n_events, big.ties, big.stratified) != (small.nobs, small.n_events, small.ties,
                                                                      small.stratified):  # fmt: skip
                raise ValueError("lr_test needs fits of the same rows, ties and strata")
            stat, df = 2 * (big.llf - small.llf), len(big.names) - len(small.names)
        return pd.Series({"statistic": float(stat), "df": float(df), "p_value": float(chi2_sf(stat, df))})

    def proportional_hazards_test(
        self, data: FederatedData, transform: str = "km", *, seed: int = 0, backend: Any = None
    ) -> pd.DataFrame:
        """The test that each coefficient is constant in time (Grambsch and Therneau's, from the
        scaled Schoenfeld residuals against a transform of the event times; lifelines'
        ``proportional_hazard_test``): per predictor ``statistic`` (chi-square on 1 df) and
        ``p_value``. ``transform``: ``"km"`` (1 minus the pooled Kaplan-Meier curve), ``"rank"``
        (the events' order; tied events share their mean rank), ``"identity"`` or ``"log"`` (the
        time); a stratified fit takes ``"identity"`` or ``"log"`` (the pooled curve and ranks need
        the event times, which stay on the clients). One more round over ``data``, the data of the
        fit: each client sends its events' summed residuals and their products with the
        transformed times."""
        from ..federation.backend import use_backend

        if transform not in ("km", "rank", "identity", "log"):
            raise ValueError(f"transform must be 'km', 'rank', 'identity' or 'log', got {transform!r}")
        spec = columns_of(data, self.event_name, "proportional_hazards_test", bins=self.bins)
        if list(spec.names) != list(self.predictors) or spec.time_name != self.time_name:
            raise ValueError(
                f"proportional_hazards_test needs the data of the fit: its predictors are {list(spec.names)} and "
                f"its time {spec.time_name!r}, the fit's {self.predictors} and {self.time_name!r}"
            )
        efron = self.ties == "efron"
        if self.stratified or self.times is None:
            if transform in ("km", "rank"):
                raise ValueError(
                    f"a stratified fit keeps its event times on the clients: transform={transform!r} needs the pooled "
                    "ones; use 'identity' or 'log'"
                )
            alg = _Schoenfeld(spec, self.coef, self.mean, efron, transform)
        else:
            d, at_risk = np.asarray(self.events), np.asarray(self.at_risk)
            if transform == "km":  # 1 - the pooled Kaplan-Meier curve at the event times
                g = 1 - np.cumprod(1 - d / at_risk)
            elif transform == "rank":
                g = np.cumsum(d) - (d - 1) / 2
            else:
                g = None
            alg = _Schoenfeld(spec, self.coef, self.mean, efron, transform, self.times, self.risk_mean, g)
        with use_backend(backend):
            s = _Rounds(data, [], seed=seed, what="proportional_hazards_test").sums(alg, "Schoenfeld residuals")
        events = float(s["d"][0])
        gbar = float(s["g"][0]) / events
        sgg = float(s["gg"][0]) - events * gbar**2
        u = s["gr"] - gbar * s["r"]
        # the scaled residuals n V r (V: the inverse information), their variance from the standard errors
        stat = events * (np.linalg.solve(self.information, u)) ** 2 / (np.diag(self.cov) * sgg)
        out = pd.DataFrame(
            {"statistic": stat, "p_value": chi2_sf(stat, 1)}, index=pd.Index(self.names, name="parameter")
        )
        out.attrs["transform"] = transform
        return out

    def concordance(
        self,
        data: FederatedData,
        *,
        within_clients: bool | None = None,
        bins: Sequence[float] | None = None,
        risk_bins: int = 20,
        seed: int = 0,
        backend: Any = None,
    ) -> Concordance:
        """Harrell's concordance index of the fit's risk scores on ``data`` (the fit's data, or new
        rows with the same columns), as :mod:`fedstats.survival.concordance` describes:
        ``within_clients=True`` (the default of a stratified fit) counts each client's own pairs,
        exactly; else every pair, from a table of counts per time cell and risk bin (time cells:
        the fit's event times, or ``bins=``; ``risk_bins`` bins of the risk scores), exactly
        where no pair is left unresolved and otherwise within the bounds it returns."""
        from ..federation.backend import use_backend
        from . import concordance as conc

        if risk_bins < 2:
            raise ValueError(f"risk_bins must be at least 2, got {risk_bins!r}")
        within = self.stratified if within_clients is None else bool(within_clients)
        edges = check_bins(bins, "concordance")
        spec = columns_of(data, self.event_name, "concordance", bins=self.bins if edges is None else None)
        if list(spec.names) != list(self.predictors):
            raise ValueError(
                f"concordance needs the fit's predictors {self.predictors}, the data has {list(spec.names)}"
            )
        if not within and edges is None and (self.stratified or self.times is None):
            raise ValueError(
                "a stratified fit keeps its event times on the clients: give bins=[...] (time bins) for the "
                "concordance over all pairs, or within_clients=True"
            )
        times = None if within or edges is not None else np.asarray(self.times)
        with use_backend(backend):
            ex = _Rounds(data, [], seed=seed, what="concordance")
            if within:
                return conc.within_clients(ex, spec, self.coef)
            return conc.over_all_pairs(ex, spec, self.coef, times, edges, int(risk_bins))

    def _baseline(self) -> tuple[np.ndarray, np.ndarray]:
        if self.stratified or self.hazard is None or self.times is None:
            raise ValueError(
                "a stratified fit has one baseline hazard per client, each kept by its client: no pooled baseline "
                "survival or survival prediction (fit stratify=False for one)"
            )
        return self.times, self.hazard

    def baseline_hazard(self) -> pd.DataFrame:
        """The Breslow baseline hazard at the event times, at the mean predictors (lifelines')."""
        t, h = self._baseline()
        return pd.DataFrame({"baseline hazard": h}, index=pd.Index(t, name=self.time_name))

    def baseline_survival(self) -> pd.DataFrame:
        """``exp(-cumulative baseline hazard)`` at the event times, at the mean predictors."""
        t, h = self._baseline()
        return pd.DataFrame({"baseline survival": np.exp(-np.cumsum(h))}, index=pd.Index(t, name=self.time_name))

    def _rows(self, X: Any) -> np.ndarray:
        return predictor_rows(self, X) - self.mean

    def predict(self, X: ArrayLike, client: Hashable | None = None, *, level: float = 0.95) -> pd.DataFrame:
        """Each row's partial hazard ``exp((x - mean)'b)`` (its hazard over that of a row at the
        mean predictors; lifelines' ``predict_partial_hazard``) with its Wald band. ``X``: a
        data frame read by column name, or an array of the predictors in the order of
        ``predictors`` (or of all the data's feature columns, the event's ignored). ``client``
        (a fitted one, or None) does not change it."""
        q = norm_ppf(0.5 + check_level(level) / 2)
        if client is not None:
            self._check_client(client)
        D = self._rows(X)
        eta = D @ self.coef
        se = np.sqrt(np.einsum("ij,jk,ik->i", D, self.cov, D))
        return prediction_frame(
            np.exp(eta), np.exp(eta - q * se), np.exp(eta + q * se),
            predicted_for="client" if client is not None else "new client",
        )  # fmt: skip

    def predict_survival(self, X: ArrayLike, times: ArrayLike | None = None) -> pd.DataFrame:
        """The survival curves of the rows of ``X`` at ``times`` (default: the event times):
        ``exp(-H0(t) exp((x - mean)'b))``, one column per row (lifelines'
        ``predict_survival_function``)."""
        t0, h = self._baseline()
        D = self._rows(X)
        t = t0 if times is None else np.atleast_1d(np.asarray(times, dtype=float))
        at = np.searchsorted(t0, t, side="right") - 1
        H = np.where(at >= 0, np.cumsum(h)[np.maximum(at, 0)], 0.0)
        return pd.DataFrame(np.exp(-np.outer(H, np.exp(D @ self.coef))), index=pd.Index(t, name=self.time_name))
