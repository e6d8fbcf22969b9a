"""What each client hands the GLM algorithms: its design, outcome, offset, weights and trials.

The special columns (offset, exposure, frequency weights, binomial trials) are named
columns of the client's own data; :class:`GLMDesign` takes them out of the predictors on the
client, so that the same specification works in process and on a Flower deployment (where
the node applies it to its own file). Rows are checked on the client (:func:`check_rows`):
a bad value raises :class:`~fedstats.data.DataError` naming the client and the column.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..data import DataError
from ..estimator import BOOL, NONE, Constraint, Estimator, Real

SPECIAL = ("offset", "exposure", "weights", "trials")
#: a special column's constraint: a column name, or None
COLUMN = NONE | Constraint(lambda v: isinstance(v, str), "a column name")


@dataclass(eq=False, repr=False)
class GLMOptions(Estimator):
    """The parameters every federated GLM has, declared once (the models are dataclasses whose
    constructors add their own): the family and link, the intercept, the negative binomial's
    fixed dispersion ``alpha`` and the special columns (:data:`SPECIAL`)."""

    family: str = "gaussian"
    link: str | None = None
    _: KW_ONLY
    fit_intercept: bool = True
    alpha: float = 1.0
    offset: str | None = None
    exposure: str | None = None
    weights: str | None = None
    trials: str | None = None

    _constraints = {"fit_intercept": BOOL, "alpha": Real(0, closed=(False, True)), **dict.fromkeys(SPECIAL, COLUMN)}


@dataclass(frozen=True)
class Rows:
    """One client's GLM data. ``y`` is the outcome (binomial with trials: the proportion of
    successes), ``n`` the binomial trials (1 elsewhere), ``f`` the frequency weights,
    ``offset`` the linear-predictor offset (log exposure included)."""

    X: np.ndarray
    y: np.ndarray
    n: np.ndarray
    f: np.ndarray
    offset: np.ndarray
    client: object
    target: str
    columns: tuple  # the special columns actually used, for messages: {role: column}


class GLMDesign:
    """The runtime's view of the data for a GLM: ``clients`` and ``[client] -> Rows``.

    ``roles`` maps ``offset``/``exposure``/``weights``/``trials`` to a column name of the data
    (or None). The predictors are the other columns, after an intercept column of ones when
    ``intercept``; with ``scaling`` (a :class:`~fedstats.federation.scaling.LinearScaling` of the
    predictors), standardised by each client; with ``family``, checked by :func:`check_rows`
    (binomial successes out of trials become proportions).
    """

    def __init__(self, data, intercept: bool, roles: dict, scaling=None, family=None):
        self.data, self.intercept, self.roles, self.scaling = data, intercept, dict(roles), scaling
        self.family = family  # given: rows come checked, binomial successes as proportions (check_rows)
        self.clients = list(data.clients)
        names = list(data.feature_names)
        for role, col in self.roles.items():
            if col is not None and col not in names:
                raise DataError(f"{role}={col!r} is not a column of the data (columns: {names[:10]})")
        used = [c for c in self.roles.values() if c is not None]
        if len(set(used)) < len(used):
            raise DataError(f"one column has two roles: {self.roles}")
        self.keep = [j for j, c in enumerate(names) if c not in used]
        self.index = {c: names.index(c) for c in used}
        self.predictors = [names[j] for j in self.keep]
        if not self.predictors and not intercept:
            raise DataError("no predictors: every column has a role (offset, weights, ...) and there is no intercept")

    @property
    def names(self) -> list[str]:
        return (["intercept"] if self.intercept else []) + self.predictors

    def _column(self, X, role):
        col = self.roles.get(role)
        return None if col is None else np.asarray(X[:, self.index[col]], dtype=float)

    def __getitem__(self, client) -> Rows:
        cd = self.data[client]
        X = np.asarray(cd.X, dtype=float)
        m = X.shape[0]
        design = X[:, self.keep]
        if self.scaling is not None:  # the client standardises its own rows (federated moments)
            design = self.scaling.transform_X(design)
        if self.intercept:
            design = np.column_stack([np.ones(m), design])
        offset, exposure = self._column(X, "offset"), self._column(X, "exposure")
        weights, trials = self._column(X, "weights"), self._column(X, "trials")
        y = np.asarray(cd.y, dtype=float)
        where = f"client {client!r}"
        if exposure is not None and np.any(exposure <= 0):
            raise DataError(
                f"{where}: exposure column {self.roles['exposure']!r} has values <= 0 (such as "
                f"{exposure[exposure <= 0][0]:g}); exposure must be positive"
            )
        if weights is not None and np.any(weights < 0):
            raise DataError(
                f"{where}: weights column {self.roles['weights']!r} has negative values (such as "
                f"{weights[weights < 0][0]:g})"
            )
        if trials is not None and (np.any(trials <= 0) or np.any(trials != np.round(trials))):
            bad = trials[(trials <= 0) | (trials != np.round(trials))][0]
            raise DataError(
                f"{where}: trials column {self.roles['trials']!r} must hold positive whole numbers (found {bad:g})"
            )
        off = np.zeros(m) if offset is None else offset.copy()
        if exposure is not None:
            off = off + np.log(exposure)
        n = np.ones(m) if trials is None else trials
        rows = Rows(
            design,
            y,
            n,
            np.ones(m) if weights is None else weights,
            off,
            client,
            str(self.data.target_name),
            tuple((k, v) for k, v in self.roles.items() if v is not None),
        )
        return rows if self.family is None else check_rows(rows, self.family, trials is not None)


class GLMSetup(NamedTuple):
    """What a Bayesian GLM's fit prepares before its EP rounds (``_setup`` of :mod:`fedstats.glm.bayes`)."""

    family: Any
    roles: dict
    design: GLMDesign
    scaling: Any
    n_rows: dict
    ybar: float
    y_sd: float


def check_rows(rows: Rows, family, trials_given: bool) -> Rows:
    """Raise :class:`DataError` naming the client and the outcome column if ``rows.y`` is
    not an outcome of ``family``; binomial with trials: returns the rows with ``y`` as the
    proportion of successes."""
    why = family.check_outcome(rows.y, rows.n if trials_given else None)
    if why:
        raise DataError(f"client {rows.client!r}: outcome {rows.target!r} {why}")
    if trials_given:
        return Rows(rows.X, rows.y / rows.n, rows.n, rows.f, rows.offset, rows.client, rows.target, rows.columns)
    return rows


def frame_rows(result, X, offset=None, exposure=None):
    """``(X, offset, exposure)`` for :func:`prediction_rows` from what ``predict`` got: a data
    frame is read by column name (the result's ``_feature_rows``), and its offset or exposure
    column, where the fit had one, is used when ``offset=`` / ``exposure=`` is not given."""
    if isinstance(X, pd.DataFrame):
        cols = [str(c) for c in X.columns]
        given = {"offset": offset, "exposure": exposure}
        for role in given:
            col = result.roles.get(role)
            if given[role] is None and col is not None and str(col) in cols:
                given[role] = X.iloc[:, cols.index(str(col))].to_numpy(dtype=float)
        offset, exposure = given["offset"], given["exposure"]
        X = result._feature_rows(X, result.predictors)
    return X, offset, exposure


def prediction_rows(X, predictors, fit_intercept: bool, roles: dict, offset=None, exposure=None):
    """Rows to predict, as the fit saw them: ``(D, off)``, the design (intercept first) and
    the offset (with log exposure), checked against the fit's predictors and roles."""
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X[None, :]
    if X.ndim != 2 or X.shape[1] != len(predictors):
        raise ValueError(f"X must have {len(predictors)} columns ({predictors}), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X has NaN or inf")
    D = np.column_stack([np.ones(len(X)), X]) if fit_intercept else X
    off = np.zeros(len(X))
    for name, v, f in (("offset", offset, lambda a: a), ("exposure", exposure, np.log)):
        if v is not None:
            if roles.get(name) is None:
                raise ValueError(f"the fit had no {name}: do not pass {name}=")
            off = off + f(np.broadcast_to(np.asarray(v, dtype=float), (len(X),)))
        elif roles.get(name) is not None:
            raise ValueError(f"the fit had an {name} column ({roles[name]!r}): pass {name}= for these rows")
    return D, off
