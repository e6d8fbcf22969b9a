"""A hierarchical Cox model across clients, by federated EP: :class:`HierarchicalCox`.

The baseline hazard is piecewise constant: ``h_k(t | x) = exp(a_kj + x'b_k)`` for ``t`` in the
``j``-th interval ``(e_(j-1), e_j]`` (the last open to the right), and every client ``k`` has
its own log baseline hazards ``a_k`` and coefficients ``b_k`` around a population:
``theta_k = (a_k, b_k) ~ N(mu, diag(tau))``, with ``mu ~ N(0, prior_mu_sd^2)`` and ``log tau ~
N(0, prior_log_tau_sd^2)`` on the standardised scale (below). Its likelihood is that of a
Poisson GLM (Holford 1980; Laird and Olivier 1981): each client splits each of its rows into
one piece per interval the row lived through, with outcome 1 where its event fell in that
interval, the interval's dummy as predictors beside the row's own, and the log of the time
spent in the interval as offset. So the model is :class:`~fedstats.glm.HierarchicalGLM`'s,
Poisson family, on those pieces, and its EP sites and client posteriors are that model's. The
pieces are made by each client from its own rows inside its steps (on a Flower node too); no
piece leaves it.

Before the EP rounds (every reply summed over the clients):

* one round checks the rows and sums the rows, the events and the predictors' moments (the
  predictors are centred and scaled by their pooled mean and sd), one more sums the times:
  time is measured in units of the pooled time per event (``time_scale``), so that the log
  baseline hazards are near 0, where their prior is;
* unless ``cuts=`` gives the interval edges, the pooled quantiles ``1/J, ..., (J-1)/J`` of the
  event times (``J = intervals``) become the edges: an exact search on summed counts (at most
  17 rounds, as :func:`fedstats.stats.quantiles`), so the server learns those order statistics
  of the event times, which are some rows' times; with ``cuts=`` it learns no time;
* the GLM's design check counts each client's pieces.

Results are reported on the data's scale: ``log_hazard_j`` per unit of the data's time and the
predictors' coefficients per unit of each predictor. The pooled NUTS oracle of the same model is
:func:`fedstats.reference.glm.pooled_nuts` on the fit's :class:`PiecewiseDesign`.

Example
-------
>>> from fedstats.survival import HierarchicalCox
>>> from fedstats.survival.simulate import proportional_hazards
>>> fd = proportional_hazards(6, rows=150, beta=(0.6,), client_effect=0.3)
>>> res = HierarchicalCox(event="event", intervals=3).fit(fd, progress=False)
>>> hr = res.hazard_ratios()
>>> bool(1.4 < hr.loc["x0", "ratio"] < 2.3)
True
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from ..data import DataError, FederatedData, require_target
from ..estimator import NONE, Constraint, Estimator, Int
from ..fitting import RunOptions, federated_fit
from ..glm import HierarchicalGLM, HierarchicalGLMResult
from ..glm._design import GLMSetup, Rows
from ..glm._irls import design_check
from ..glm.families import family_of
from ..glm.hypotheses import posterior_ratios
from ..result_file import register
from ..results import check_level, prediction_frame
from ..stats._columns import Column, with_categories
from ..stats._rounds import _GroupMoments
from ..stats.quantiles import quantile_values
from ._data import SurvivalColumns, columns_of, predictor_rows
from ._exchanges import _CoxCheck
from .cox import _check_predictors, _Rounds, without_dropped

__all__ = ["HierarchicalCox", "HierarchicalCoxResult", "PiecewiseDesign", "PiecewiseScaling"]


@register
@dataclass(repr=False)
class PiecewiseScaling:
    """The map between the fitted scale and the data's: predictors centred by ``x_mean`` and
    scaled by ``x_sd``, time in units of ``time_scale``; ``intervals`` log baseline hazards
    come first in the coefficient vector. ``theta = A theta' + c`` (:meth:`coef_map`): a
    predictor's coefficient is divided by its sd, and each log baseline hazard takes the
    centring and the time unit."""

    x_mean: np.ndarray
    x_sd: np.ndarray
    time_scale: float
    intervals: int

    def transform_X(self, X: np.ndarray) -> np.ndarray:
        return (np.asarray(X, dtype=float) - self.x_mean) / self.x_sd

    def coef_map(self) -> tuple[np.ndarray, np.ndarray]:
        J, p = self.intervals, len(self.x_sd)
        A = np.eye(J + p)
        A[J:, J:] = np.diag(1 / self.x_sd)
        A[:J, J:] = -self.x_mean / self.x_sd
        c = np.r_[np.full(J, -np.log(self.time_scale)), np.zeros(p)]
        return A, c

    def coef_back(self, theta: ArrayLike) -> np.ndarray:
        A, c = self.coef_map()
        return np.asarray(theta) @ A.T + c


def interval_names(J: int) -> list[str]:
    return [f"log_hazard_{j + 1}" for j in range(J)]


class PiecewiseDesign:
    """The runtime's view of the data for :class:`HierarchicalCox` (as
    :class:`~fedstats.glm._design.GLMDesign` for a GLM): ``[client]`` reads the client's rows
    (checked, :class:`~fedstats.survival._data.SurvivalColumns`), standardises its predictors
    and splits every row into its pieces (:func:`pieces`): the Poisson rows of the model."""

    def __init__(self, data: Any, spec: SurvivalColumns, edges: np.ndarray, scaling: PiecewiseScaling) -> None:
        self.data, self.spec, self.edges, self.scaling = data, spec, np.asarray(edges, dtype=float), scaling
        self.clients = list(data.clients)
        self.predictors = list(spec.names)
        self.intercept = False  # the intervals' dummies hold it

    @property
    def names(self) -> list[str]:
        return interval_names(len(self.edges)) + self.predictors

    def __getitem__(self, client: Hashable) -> Rows:
        r = self.spec.rows(self.data[client], client)
        if np.any(r.event & (r.time == 0)):
            raise DataError(
                f"client {client!r}: {int(np.sum(r.event & (r.time == 0)))} event(s) at time 0: a piecewise-constant "
                f"hazard cannot give an event no time ({self.spec.time_name!r} must be > 0 where an event happened)"
            )
        X, y, offset = pieces(r.time, r.event, self.scaling.transform_X(r.X), self.edges, self.scaling.time_scale)
        one = np.ones(len(y))
        return Rows(X, y, one, one, offset, client, self.spec.time_name, ())


def pieces(
    time: np.ndarray, event: np.ndarray, Z: np.ndarray, edges: np.ndarray, time_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, offset)``: one Poisson row per row and interval ``(e_j, e_(j+1)]`` it lived into
    (``edges`` start at 0, the last interval is open): the interval's dummy then the row's
    predictors ``Z``, 1 where its event is in that interval, and the log of its time there (in
    units of ``time_scale``)."""
    J = len(edges)
    width = np.r_[np.diff(edges), np.inf]
    spent = np.clip(time[:, None] - edges[None, :], 0.0, width[None, :])
    row, j = np.nonzero(spent > 0)
    at = np.searchsorted(edges, time, side="left") - 1  # t in (e_j, e_(j+1)] -> j
    y = (event[row] & (at[row] == j)).astype(float)
    X = np.column_stack([np.eye(J)[j], Z[row]])
    return X, y, np.log(spent[row, j] / time_scale)


#: the options HierarchicalCox hands to the HierarchicalGLM that runs its EP
_EP_OPTIONS = (
    "prior_mu_sd", "prior_log_tau_sd", "standardize", "rounds", "tol", "damping", "num_draws", "tilted", "quadrature",
)  # fmt: skip
_CUTS = NONE | Constraint(
    lambda v: bool(np.ndim(v) == 1 and len(v) >= 1 and np.all(np.isfinite(v)) and np.all(np.diff(v) > 0) and v[0] > 0),
    "increasing finite times > 0",
)


@dataclass(eq=False, repr=False, kw_only=True)
class HierarchicalCox(Estimator):
    """Each client's own log baseline hazards and coefficients around a population (a
    piecewise-constant baseline hazard), by federated EP (see the module's docs).

    Parameters
    ----------
    event : str
        The 0/1 column of events, taken out of the predictors on each client; the time is the
        data's target and every other column a predictor.
    intervals : int, default 4
        Intervals of the baseline hazard, cut at the pooled quantiles of the event times.
    cuts : sequence of float, optional
        The interval edges instead (increasing, > 0; the first interval starts at 0, the last
        is open): public, so the server learns no event time.
    prior_mu_sd, prior_log_tau_sd : float, default 1
        Prior sds of ``mu`` and ``log tau`` (standardised scale).
    standardize : bool, default True
        Centre and scale the predictors and measure time per pooled event time (the priors'
        scale); False: the data's own units (time too).
    rounds, tol, damping, num_draws, tilted, quadrature
        As :class:`~fedstats.glm.HierarchicalGLM` (with 4 + p coefficients ``quadrature="auto"``
        is the Laplace approximation).
    """

    _constraints = {
        "event": Constraint(lambda v: isinstance(v, str), "a column name"),
        "intervals": Int(1),
        "cuts": _CUTS,
        # the EP options: HierarchicalGLM's
        **{k: v for k, v in HierarchicalGLM._constraints.items() if k in _EP_OPTIONS},
    }

    event: str = "event"
    intervals: int = 4
    cuts: Sequence[float] | None = None
    prior_mu_sd: float = 1.0
    prior_log_tau_sd: float = 1.0
    standardize: bool = True
    rounds: int = 30
    tol: float = 0.05
    damping: float = 0.5
    num_draws: int = 512
    tilted: str = "laplace+importance"
    quadrature: int | str = "auto"

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> HierarchicalCoxResult:
        """Fit by federated EP, then one counted round of client posteriors; returns a
        :class:`HierarchicalCoxResult`. Raises :class:`~fedstats.data.DataError` for a bad
        time or event (naming the client), a constant or collinear predictor, or no events."""
        require_target(data, "HierarchicalCox")
        setup = without_dropped(lambda: self.design(data, run.seed), "HierarchicalCox")
        ep = {k: getattr(self, k) for k in _EP_OPTIONS if k != "standardize"}  # the pieces come standardised
        glm = HierarchicalGLM("poisson", fit_intercept=False, standardize=False, **ep)
        state = glm._ep_fit(setup, run)
        design = cast(PiecewiseDesign, setup.design)
        return HierarchicalCoxResult(
            **{**state, "model": "HierarchicalCox", "n_obs": {c: int(data.n_obs[c]) for c in state["clients"]}},
            edges=design.edges,
            event_name=self.event,
            time_name=design.spec.time_name,
            feature_names=list(data.feature_names),
            event_index=design.spec.event,
            events=int(round(setup.ybar * sum(setup.n_rows.values()))),
        )

    def design(self, data: FederatedData, seed: int = 0) -> GLMSetup:
        """The rounds before EP (see the module's docs): the checks, the scaling, the interval
        edges and the piece counts; ``design`` of the returned setup is the
        :class:`PiecewiseDesign` (what :func:`fedstats.reference.glm.pooled_nuts` reads for
        the pooled oracle)."""
        spec = columns_of(data, self.event, "HierarchicalCox")
        if not spec.predictors:
            raise DataError(
                "HierarchicalCox: no predictors (every column but the event is one; the time is the target)"
            )
        event = with_categories(Column(self.event, (spec.event,)), (0.0, 1.0))
        ex = _Rounds(data, [event], seed=seed, what="HierarchicalCox")
        chk = ex.sums(_CoxCheck(spec), "design check")
        n, events = float(chk["rows"][0]), float(chk["events"][0])
        if events == 0:
            raise DataError(f"HierarchicalCox: no row has an event ({self.event!r} is 0 everywhere): nothing to fit")
        _check_predictors(spec.names, chk["sx"], chk["sxx"], n, "HierarchicalCox")
        time = Column(spec.time_name, None)
        if self.cuts is not None:
            edges = np.r_[0.0, np.asarray(self.cuts, dtype=float)]
        else:
            q = np.arange(1, int(self.intervals)) / int(self.intervals)
            found, _ = quantile_values(ex, [(time, event, 1)], [int(events)], q, "lower")
            edges = np.unique(np.r_[0.0, found[0]])
        J = len(edges)
        p = len(spec.names)
        if self.standardize:
            mean = chk["sx"] / n
            sd = np.sqrt(np.maximum(np.diag(chk["sxx"]) / n - mean**2, 0.0))
            total = float(ex.sums(_GroupMoments([time]), "time sum")["s1"][0, 0])
            scaling = PiecewiseScaling(mean, sd, total / events, J)
        else:
            scaling = PiecewiseScaling(np.zeros(p), np.ones(p), 1.0, J)
        design = PiecewiseDesign(data, spec, edges, scaling)
        fam = family_of("poisson", "log")
        try:
            chk2 = design_check(fam, design, False, seed, mle=False)
        except DataError as exc:
            empty = re.search(r"'log_hazard_(\d+)' is 0 on every row", str(exc))
            if empty:
                start = edges[int(empty.group(1)) - 1]
                raise DataError(
                    f"HierarchicalCox: no row lives into the interval after {start:g} ({spec.time_name!r}): give cuts "
                    "below the largest time, or fewer intervals"
                ) from None
            raise
        return GLMSetup(fam, {}, cast(Any, design), scaling, chk2["n_obs"], chk2["ybar"], 1.0)


@register
class HierarchicalCoxResult(HierarchicalGLMResult):
    """A :class:`HierarchicalCox` fit: the EP posterior of ``(mu, log tau)`` and every client's
    posterior of its log baseline hazards and coefficients (Gaussian), on the data's scale
    (``log_hazard_j``: per unit of the data's time in the interval ``(edges[j-1], edges[j]]``).
    ``summary``, ``client_summary``, ``global_posterior``, ``client_posterior`` as
    :class:`~fedstats.glm.HierarchicalGLMResult`."""

    edges: np.ndarray
    scaling: PiecewiseScaling  # type: ignore[assignment]
    event_name: str
    time_name: str
    feature_names: list[str]
    event_index: int
    events: int

    def intervals(self) -> pd.DataFrame:
        """The intervals of the baseline hazard: ``start`` (exclusive) and ``end``."""
        e = np.asarray(self.edges, dtype=float)
        return pd.DataFrame(
            {"start": e, "end": np.r_[e[1:], np.inf]}, index=pd.Index(interval_names(len(e)), name="parameter")
        )

    def hazard_ratios(self, client: Hashable | None = None, level: float = 0.95) -> pd.DataFrame:
        """``exp`` of the predictors' coefficients: the population's (``mu``) or a fitted
        client's own, with their credible intervals: ``ratio``, ``lower``, ``upper``,
        ``p_value`` (the posterior tail probability of a ratio of 1)."""
        level = check_level(level)
        J = len(self.edges)
        names = self.names[J:]
        if client is None:
            table = self.summary(level).rename(index=lambda r: r[3:-1] if r.startswith("mu[") else r)
        else:
            self._check_client(client)
            table = self.client_posterior(client).summary(level=level)
        out = posterior_ratios(table, names, "poisson", "log")
        out.attrs["ratio"] = "hazard ratio"
        return out

    def baseline_hazard(self, client: Hashable | None = None, level: float = 0.95) -> pd.DataFrame:
        """The hazard in each interval at the pooled mean predictors (``standardize=False``: at
        predictors 0), per unit of the data's time: a fitted client's, or (``client=None``) a new
        client's (drawn from the population): ``start``, ``end``, ``hazard`` (posterior median),
        ``lower``, ``upper``."""
        level = check_level(level)
        J = len(self.edges)
        theta = self._draws(client, 4000, 0)
        log_h = theta[:, :J] + (theta[:, J:] @ self.scaling.x_mean)[:, None]
        a = (1 - level) / 2
        lo, med, hi = np.quantile(log_h, [a, 0.5, 1 - a], axis=0)
        return self.intervals().assign(hazard=np.exp(med), lower=np.exp(lo), upper=np.exp(hi))

    def _draws(self, client: Hashable | None, n: int, seed: int) -> np.ndarray:
        """``n`` seeded draws of the coefficients on the data's scale: a fitted client's, or
        (None) a new client's, ``theta ~ N(mu, diag tau)`` with ``(mu, log tau)`` from q."""
        rng = np.random.default_rng(seed)
        if client is not None:
            self._check_client(client)
            return self.client_posterior(client).sample(n, seed=rng)
        p = len(self.names)
        phi = self._fitted_q().sample(n, seed=rng)
        beta = phi[:, :p] + np.exp(0.5 * phi[:, p:]) * rng.standard_normal((n, p))
        return beta if self.scaling is None else self.scaling.coef_back(beta)

    def predict(  # type: ignore[override]
        self, X: ArrayLike, client: Hashable | None = None, *, level: float = 0.95, n: int = 4000, seed: int = 0
    ) -> pd.DataFrame:
        """Each row's hazard relative to a row of predictors 0 (``exp(x'b)``, the ratio of
        their hazards at any time), with its credible band: the fitted client's coefficients,
        or a new client's (``client=None``)."""
        level = check_level(level)
        J = len(self.edges)
        D = predictor_rows(self, X)
        eta = self._draws(client, n, seed)[:, J:] @ D.T
        a = (1 - level) / 2
        lo, hi = np.quantile(np.exp(eta), [a, 1 - a], axis=0)
        return prediction_frame(
            np.exp(eta).mean(axis=0), lo, hi, predicted_for="client" if client is not None else "new client"
        )

    def predict_survival(
        self,
        X: ArrayLike,
        times: ArrayLike,
        client: Hashable | None = None,
        *,
        level: float = 0.95,
        n: int = 4000,
        seed: int = 0,
    ) -> pd.DataFrame:
        """The survival probability of each row of ``X`` at each of ``times`` under the fitted
        client's baseline hazard and coefficients (or a new client's, ``client=None``):
        one row per (row, time) with ``row``, ``time``, ``mean``, ``lower``, ``upper``."""
        level = check_level(level)
        t = np.atleast_1d(np.asarray(times, dtype=float))
        if t.ndim != 1 or not np.all(np.isfinite(t)) or np.any(t < 0):
            raise ValueError("times must be finite and >= 0")
        J = len(self.edges)
        D = predictor_rows(self, X)
        theta = self._draws(client, n, seed)
        e = np.asarray(self.edges, dtype=float)
        spent = np.clip(t[:, None] - e[None, :], 0.0, np.r_[np.diff(e), np.inf][None, :])  # (times, J)
        H0 = np.exp(theta[:, :J]) @ spent.T  # (draws, times)
        S = np.exp(-H0[:, None, :] * np.exp(theta[:, J:] @ D.T)[:, :, None])  # (draws, rows, times)
        a = (1 - level) / 2
        lo, hi = np.quantile(S, [a, 1 - a], axis=0)
        rows, ts = np.meshgrid(np.arange(len(D)), t, indexing="ij")
        return pd.DataFrame(
            {"row": rows.ravel(), "time": ts.ravel(), "mean": S.mean(axis=0).ravel(), "lower": lo.ravel(),
             "upper": hi.ravel()}
        )  # fmt: skip

    def _loglik_specs(self, data: Any, n: int, seed: int) -> dict[Hashable, dict[str, Any]]:
        raise ValueError(
            "HierarchicalCox has no pointwise log-likelihood per row yet (a row's is the sum of its pieces'): LOO "
            "and WAIC are not available for it"
        )
