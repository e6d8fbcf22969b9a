"""Exact maximum likelihood GLMs across clients: :class:`FederatedGLM`, by federated IRLS.

Every round each client evaluates the broadcast coefficients on its own rows and sends
``X'WX``, ``X'Wz``, its deviance, Pearson statistic and log-likelihood sums (a few numbers
and one ``p x p`` matrix); the server sums them and solves the weighted least-squares step.
The sums are exactly those of the pooled rows, so the fit is statsmodels'
``GLM(...).fit()`` on the pooled rows: same iterations, same coefficients, standard errors,
deviance, log-likelihood, AIC and BIC to rounding (the tests hold it to 1e-8).

Example
-------
>>> import numpy as np
>>> from fedstats.data import FederatedData
>>> from fedstats.glm import FederatedGLM
>>> rng = np.random.default_rng(0)
>>> Xs = [rng.normal(size=(200, 2)) for _ in range(3)]
>>> ys = [rng.binomial(1, 1 / (1 + np.exp(-(0.5 + X @ [1.0, -1.0])))) for X in Xs]
>>> res = FederatedGLM("binomial").fit(FederatedData.from_arrays(Xs, ys))
>>> res.summary().round(2).columns.tolist()[:5]
['mean', 'sd', 'lower', 'upper', 'p_value']
>>> res.converged
True

Differential privacy (opt-in, ``dp=``)
--------------------------------------
``FederatedGLM(..., dp=DifferentialPrivacy(...))`` makes every release of the fit a Gaussian
mechanism on sums of per-row contributions clipped on the client (neighbouring data sets: one
row added or removed; :mod:`fedstats.privacy`). The fit then makes these releases, each one
run of the runtime recorded in one :class:`~fedstats.privacy.PrivacyLedger`:

====================  ===============  ========================================================
exchange              keys             a row's contribution
====================  ===============  ========================================================
design check (once)   ``n``            its frequency weight ``f_i`` (1 without weights)
                      ``sum_y``        ``f_i y_i`` (``y_i``: the proportion, with trials)
IRLS rounds           ``xtwx``         ``w_i x_i x_i'`` (``w_i = f_i n_i / (g'(mu_i)^2 V(mu_i))``)
(``dp_rounds``)       ``score``        ``x_i f_i n_i (y_i - mu_i) / (g'(mu_i) V(mu_i))``
dispersion round      ``pearson``      ``f_i n_i (y_i - mu_i)^2 / V(mu_i)`` (gaussian, gamma only)
sandwich round        ``hessian``,     the row's observed information and score outer product
(``cov_type="HC0"``)  ``meat``         (see :class:`~fedstats.glm._irls.Sandwich`)
====================  ===============  ========================================================

``dp.clip`` is one L2 bound for each row's contributions to all the keys of a release
together (a float), or a mapping naming exactly the keys this fit releases (the union of the
rows above that apply), one bound each: a row's ``xtwx`` contribution has Frobenius norm
``w_i |x_i|^2`` and its ``score`` contribution norm ``|x_i| |r_i|``; for logistic regression
``w_i <= 1/4`` and ``|r_i| < 1``, so ``|x_i|^2 / 4`` and ``|x_i|`` bound them (Poisson and
gaussian rows are unbounded: the clipping is what bounds them). With per-key bounds the key's
noise has standard deviation ``z sqrt(K) C_k`` (``K`` keys in that release); with one bound
``z C``. A row within its bounds is left as it is, so with ``noise_multiplier=0`` and bounds
above every row's contribution the fit is the plain maximum likelihood fit (to rounding, once
``dp_rounds`` Newton steps have converged). With clipping active the fixed point solves the
clipped score equations (biased toward zero for the rows clipped).

``placement="client"``: every client adds its ``1/n`` share of the noise (summed under secure
aggregation; without it, in process, the server reads each share and the ledger charges that);
``"central"``: the server adds it once to the sums. Every client must answer every round.

The rounds rule: IRLS runs exactly ``dp_rounds`` Newton steps from a start with the intercept at
the link of the noisy mean outcome (no deviance is released, so no convergence test; ``rounds``
and ``tol`` are not used). Each round's noisy information is symmetrised and its eigenvalues
raised to ``2 sqrt(p)`` noise standard deviations (the size of the noise matrix) before the
solve. The estimated dispersion's noisy Pearson sum is raised to one noise standard deviation
if it falls below. The deviance, log-likelihood, AIC and BIC are not released (NaN); the row
counts are the noisy weighted count (``nobs``, ``wnobs``; ``n_obs`` is empty); no design or
separation check is made. ``converged`` says whether the last step moved every coefficient by
no more than the DP noise explains (4 standard deviations of the noise of the two scores it
involves) plus a tenth of its standard error; else a :class:`GLMConvergenceWarning`.

The result's ``privacy`` is the spent ``(epsilon, delta)`` (:class:`~fedstats.privacy.PrivacySpent`);
its tables carry ``attrs["privacy"]``. Its standard errors and intervals exclude the DP noise
unless ``include_dp_noise=True``, which adds ``dp_noise_cov``, the delta-method covariance of
the noise in the last Newton step: ``beta = beta_prev + I^-1 (u + e)`` with ``e`` the score's
noise (``N(0, s^2)`` per coordinate) gives ``s^2 I^-2`` (the information's own noise enters at
second order only).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .._deprecation import renamed_attributes
from .._tails import norm_ppf
from ..data import DataError, FederatedData, require_target
from ..estimator import BOOL, NONE, Constraint, Int, OneOf, Real
from ..federation import Communication, History
from ..federation import run as federation_run
from ..federation.influence import to_leave_out
from ..federation.records import exclude, excluded_now
from ..fitting import RunOptions, federated_fit
from ..privacy import DifferentialPrivacy
from ..result_file import register
from ..results import FederatedResult, check_level, prediction_frame
from ._design import SPECIAL, GLMDesign, GLMOptions, frame_rows, prediction_rows
from ._irls import IRLS, Sandwich, design_check
from ._private import fit_private
from .families import FAMILIES, LINKS, Family, family_of
from .hypotheses import GLMTests

__all__ = ["FederatedGLM", "GLMResult", "SeparationError", "GLMConvergenceWarning"]


class SeparationError(DataError):
    """The outcome is perfectly predicted on some rows (complete or quasi-complete
    separation): the maximum likelihood estimate does not exist, a coefficient runs off to
    infinity. The message names the predictor and the clients."""


class GLMConvergenceWarning(UserWarning):
    """IRLS stopped at the round limit before the deviance settled."""


_DP = NONE | Constraint(lambda v: isinstance(v, DifferentialPrivacy), "a fedstats.privacy.DifferentialPrivacy")


@dataclass(eq=False, repr=False, kw_only=True)
class FederatedGLM(GLMOptions):
    """Generalised linear model fitted by federated IRLS (exact maximum likelihood).

    Parameters
    ----------
    family : {"gaussian", "binomial", "poisson", "gamma", "negative_binomial"}
    link : str, optional
        None: the canonical link (gaussian identity, binomial logit, poisson log, gamma
        inverse, negative binomial log). Others: gaussian ``log``/``inverse``; binomial
        ``probit``/``cloglog``/``log``; poisson ``identity``; gamma ``log``/``identity``;
        negative binomial ``identity``.
    fit_intercept : bool, default True
    alpha : float, default 1.0
        The negative binomial's fixed dispersion (variance ``mu + alpha mu^2``).
    offset, exposure, weights, trials : str, optional
        Columns of the data with these roles (taken out of the predictors on each client):
        an offset added to the linear predictor, an exposure whose log is added, frequency
        weights (a row counts that many times), and the binomial number of trials (the
        target then counts successes).
    cov_type : {"nonrobust", "HC0"}
        ``"HC0"``: sandwich standard errors from one more counted round.
    robust : bool, default False
        Leave out the clients whose influence the fit warns of (each moves the coefficients
        by more than 5 times, and 3 times the median client's, what a client of its size
        typically does: :mod:`fedstats.federation.influence`) and fit the others again, until
        none is flagged or half the clients are out. The estimate stays the exact GLM of the
        clients kept; each client left out is in ``excluded`` with its influence. Not with
        ``dp`` (no client's influence is measured under differential privacy); under secure
        aggregation it leaves nobody out (no client's statistics are seen).
    rounds : int, default 100
        Most IRLS iterations (statsmodels' ``maxiter``); the fit takes one round more.
    tol : float, default 1e-8
        Stop when the deviance changes by at most this (statsmodels' criterion).
    dp : DifferentialPrivacy, optional
        Opt-in differential privacy (see the module docs for the keys released, the bounds,
        the rounds rule and the repairs): every release is clipped per row on the client and
        noised; the result's ``privacy`` holds the spent ``(epsilon, delta)``.
    dp_rounds : int, default 6
        With ``dp``: the fixed number of Newton rounds (each one release).
    include_dp_noise : bool, default False
        With ``dp``: make the covariance, standard errors, intervals, tests and prediction
        bands include the DP noise of the last Newton step (delta method, ``dp_noise_cov``);
        by default they exclude it, and the tables say so (``attrs["privacy"]``).
    """

    _constraints = {
        **GLMOptions._constraints,
        "family": OneOf(*FAMILIES),
        "link": NONE | OneOf(*LINKS),
        "cov_type": OneOf("nonrobust", "HC0"),
        "robust": BOOL,
        "rounds": Int(1),
        "tol": Real(0, closed=(False, True)),
        "dp": _DP,
        "dp_rounds": Int(1),
        "include_dp_noise": BOOL,
    }

    cov_type: str = "nonrobust"
    robust: bool = False
    rounds: int = 100
    tol: float = 1e-8
    dp: DifferentialPrivacy | None = None
    dp_rounds: int = 6
    include_dp_noise: bool = False

    def _family(self) -> Family:
        self._validate_params()
        try:
            fam = family_of(self.family, self.link, self.alpha)
        except ValueError as exc:
            raise ValueError(f"FederatedGLM: {exc}") from None
        if self.trials is not None and fam.name != "binomial":
            raise ValueError(f"FederatedGLM: trials= is for the binomial family, not {fam.name}")
        return fam

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions) -> GLMResult:
        """Fit by federated IRLS; returns a :class:`GLMResult`.

        Raises :class:`~fedstats.data.DataError` (one line naming the client and column) for
        an outcome the family cannot take, a constant or collinear predictor, and
        :class:`SeparationError` when the outcome is perfectly predicted on some rows."""
        seed = run.seed
        require_target(data, "FederatedGLM")
        fam = self._family()
        if self.include_dp_noise and self.dp is None:
            raise ValueError("FederatedGLM: include_dp_noise=True needs dp= (there is no noise to include)")
        if self.robust and self.dp is not None:
            raise ValueError("FederatedGLM: robust=True needs each client's influence, which dp= does not measure")
        roles = {r: getattr(self, r) for r in SPECIAL}
        design = GLMDesign(data, self.fit_intercept, roles)
        trials = self.trials is not None
        if self.dp is not None:
            if run.checkpoint is not None:
                raise ValueError(
                    "FederatedGLM: checkpoint= is not available with dp= (a resumed fit would spend twice)"
                )
            return self._fit_private(design, fam, roles, trials, seed, run.progress)
        names = design.names
        p = len(names)
        while True:
            chk = design_check(fam, design, trials, seed)
            n_rows, wnobs = float(chk["n_rows"]), chk["wnobs"]
            if wnobs <= p:
                raise DataError(f"{wnobs:g} weighted rows for {p} coefficients: nothing left to estimate the fit from")
            alg = IRLS(fam, trials, p, chk["ybar"], float(self.tol), wnobs - p)
            out = run.run(alg, design, rounds=int(self.rounds) + 1, kind="IRLS rounds")
            failed = {c: (rec.round, why) for rec in out.history for c, why in rec.failed.items()}
            if not failed and self.robust and (far := to_leave_out(out.influence, design.clients, excluded_now())):
                exclude(far)  # robust=True: the exact fit of the others
                continue
            if not failed:
                break
            # the model or the data failed, not the node: stop, naming every client that failed
            model = {c: rw for c, rw in failed.items() if rw[1].split(":", 1)[0] in MODEL_FAILURES}
            if model:
                named = "; ".join(f"client {c!r} in round {r}: {why}" for c, (r, why) in list(model.items())[:5])
                raise RuntimeError(f"FederatedGLM: {len(model)} client(s) failed: {named}")
            # A client that failed in some round left the sums of the others: the fit is
            # redone without it, so that every number comes from one set of clients.
            exclude({c: f"its step failed in IRLS round {r} ({why})" for c, (r, why) in failed.items()})
            warnings.warn(
                f"FederatedGLM: client(s) {list(failed)[:5]} failed during the IRLS rounds; fitting again without them",
                RuntimeWarning,
                stacklevel=3,
            )
        s = out.server_state
        if s["singular"] is not None:
            raise DataError(
                "the weighted information X'WX became singular in round "
                f"{s['singular']}: a predictor is (almost) collinear with others under the fitted weights"
            )
        beta, prev, last = s["betas"][-1], s["stats"][-2], s["stats"][-1]
        rms_x = np.sqrt(np.diag(chk["xtx"]) / n_rows)  # a predictor's scale, to name the one that moves
        if last["edge"][0] > 0:
            raise SeparationError(
                _separation_message(names, s["betas"], rms_x, self.fit_intercept, fam, int(last["edge"][0]))
            )
        df_model = p - 1
        df_resid = wnobs - p
        scale = 1.0 if fam.fixed_scale else float(last["pearson"][0]) / df_resid
        cov = np.linalg.inv(prev["xtwx"]) * scale
        cov = (cov + cov.T) / 2
        if not s["converged"]:
            warnings.warn(
                GLMConvergenceWarning(
                    f"IRLS did not converge in {self.rounds} iterations (deviance change "
                    f"{abs(s['crit'][-1] - s['crit'][-2]):.3g} > tol={self.tol:g}); the coefficient still moving most is "
                    f"{_moving(names, s['betas'], rms_x, self.fit_intercept)!r}: raise rounds=, or check that predictor"
                )
            )
        if self.cov_type == "HC0":
            sw_run = federation_run(
                Sandwich(fam, trials, beta),
                design,
                rounds=1,
                seed=seed,
                progress=False,
                batched=False,
                kind="sandwich round",
            )
            lost = {c: why for rec in sw_run.history for c, why in rec.failed.items()}
            if lost:  # a sandwich without a client's meat is not the fit's covariance
                c, why = next(iter(lost.items()))
                raise RuntimeError(f"FederatedGLM: client {c!r} failed in the sandwich round: {why}")
            sw = sw_run.server_state
            h_inv = np.linalg.inv(sw["hessian"])
            cov = h_inv @ sw["meat"] @ h_inv
            cov = (cov + cov.T) / 2
        gaussian_identity = fam.name == "gaussian" and fam.link.name == "identity"
        llf = fam.loglike(last["ll"], scale, wnobs, rss_mle=gaussian_identity)
        k = df_model + 1
        res = GLMResult(
            model="FederatedGLM",
            family=fam.name,
            link=fam.link.name,
            alpha=float(self.alpha),
            names=names,
            predictors=design.predictors,
            fit_intercept=bool(self.fit_intercept),
            roles=roles,
            clients=list(design.clients),
            coef=np.asarray(beta, dtype=float),
            cov=cov,
            cov_type=self.cov_type,
            scale=scale,
            deviance=float(s["dev"][-1]),
            pearson_chi2=float(last["pearson"][0]),
            llf=llf,
            aic=float(-2 * llf + 2 * k),
            bic=float(-2 * llf + k * np.log(wnobs)),
            df_model=df_model,
            df_resid=float(df_resid),
            nobs=int(n_rows),
            wnobs=wnobs,
            n_obs=chk["n_obs"],
            converged=bool(s["converged"]),
            n_iter=len(s["dev"]) - 1,
            rounds=len(out.history),
            deviance_history=list(map(float, s["dev"])),
            history=out.history,
            communication=out.communication,
        )
        return res

    def _fit_private(self, design, fam: Family, roles: dict, trials: bool, seed: int, progress) -> GLMResult:
        """The differentially private fit (see the module docs; :func:`~fedstats.glm._private.fit_private`)."""
        fields, warning = fit_private(self, design, fam, seed, progress)
        if warning:
            warnings.warn(GLMConvergenceWarning(warning))
        return GLMResult(
            model="FederatedGLM",
            family=fam.name,
            link=fam.link.name,
            alpha=float(self.alpha),
            predictors=design.predictors,
            fit_intercept=bool(self.fit_intercept),
            roles=roles,
            clients=list(design.clients),
            cov_type=self.cov_type,
            **fields,
        )


#: failures of a client's step that come from the model or the data (a mean outside the family's
#: range, non-finite statistics), not from its node: the fit stops instead of leaving it out
# (a BrokenReply, the runtime's verdict on a reply that breaks the others' sum, is its sender's:
# that client sits the fit out, as one whose node failed)
MODEL_FAILURES = ("DataError", "ValueError", "FloatingPointError", "LinAlgError", "ProtocolError")


def _moving(names, betas, rms_x, intercept) -> str:
    if len(betas) < 2:
        return names[0]
    change = np.abs(betas[-1] - betas[-2]) * np.where(rms_x > 0, rms_x, 1.0)
    if intercept and len(names) > 1 and np.any(change[1:] > 0):
        return names[1 + int(np.argmax(change[1:]))]
    return names[int(np.argmax(change))]


def _separation_message(names, betas, rms_x, intercept, fam, edge) -> str:
    who = _moving(names, betas, rms_x, intercept)
    what = "probabilities of exactly 0 or 1" if fam.name == "binomial" else "means of exactly 0"
    return (
        f"separation: {edge} row(s) are perfectly predicted ({what}), so the maximum likelihood estimate does "
        f"not exist and the coefficient of {who!r} runs off to infinity; drop or merge {who!r} (or the sparse "
        "categories behind it), or fit BayesianGLM, whose prior keeps it finite"
    )


@register
@renamed_attributes(family_="_family")
class GLMResult(GLMTests, FederatedResult):
    """A federated GLM fit: statsmodels' ``GLMResults`` quantities under the result contract.

    ``summary(level)``: ``mean`` (the estimate), ``sd`` (its standard error), the Wald
    interval ``lower``/``upper``, ``p_value`` (two-sided Wald test of 0), then ``z``. There
    is no posterior (a frequentist fit: see ``BayesianGLM``) and no per-client parameter.
    Attributes as statsmodels: ``params``, ``bse``, ``tvalues``, ``pvalues``, ``cov_params()``,
    ``conf_int()``, ``deviance``, ``pearson_chi2``, ``llf``, ``aic``, ``bic``, ``scale``,
    ``df_model``, ``df_resid``, ``nobs`` (rows), ``wnobs`` (rows counted by their frequency weights), ``n_iter``; tests: :meth:`lr_test`, :meth:`wald_test`.

    A differentially private fit (``FederatedGLM(dp=...)``) also has ``privacy`` (the spent
    ``(epsilon, delta)``, :class:`~fedstats.privacy.PrivacySpent`), ``dp_noise_cov`` (the
    covariance of the DP noise in the coefficients, delta method), ``dp_noise_included``
    (whether ``cov`` and every interval include it) and ``dp_repairs`` (the eigenvalues raised
    in each round's noisy information, whether the dispersion was floored); its tables carry
    ``attrs["privacy"]``, the sentence saying whether their intervals include the noise.
    """

    estimates = "estimate"  # maximum likelihood: estimate, standard error, p-value

    #: differentially private fits only (None / False otherwise)
    dp_noise_cov: np.ndarray | None = None
    dp_noise_included: bool = False
    dp_repairs: dict[str, Any] | None = None

    # set from the fit's keyword arguments
    model: str
    family: str
    link: str
    alpha: float
    names: list[str]
    predictors: list[str]
    fit_intercept: bool
    roles: dict[str, str | None]
    clients: list[Hashable]
    coef: np.ndarray
    cov: np.ndarray
    cov_type: str
    scale: float
    deviance: float
    pearson_chi2: float
    llf: float
    aic: float
    bic: float
    df_model: int
    df_resid: float
    nobs: int
    wnobs: float
    n_obs: dict[Hashable, int]
    converged: bool
    n_iter: int
    rounds: int
    deviance_history: list[float]
    history: History
    communication: Communication
    seconds: float

    def __init__(self, **state: Any) -> None:
        self.__dict__.update(state)
        self.seconds = 0.0

    @property
    def _family(self) -> Family:
        return family_of(self.family, self.link, self.alpha)

    # -- the contract
    def _privacy_note(self, frame: pd.DataFrame) -> pd.DataFrame:
        if self.privacy is not None:
            frame.attrs["privacy"] = self.privacy.note(included=bool(self.dp_noise_included))
        return frame

    def summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        return self._privacy_note(super().summary(level, kind))

    def client_summary(self, level: float = 0.95, kind: str = "eti") -> pd.DataFrame:
        return self._privacy_note(super().client_summary(level, kind))

    summary.__doc__ = FederatedResult.summary.__doc__
    client_summary.__doc__ = FederatedResult.client_summary.__doc__

    def _no_posterior(self, what: str) -> str:
        return (
            f"FederatedGLM is a maximum likelihood fit: no {what} posterior (its summary gives Wald intervals); "
            "BayesianGLM and HierarchicalGLM give posteriors"
        )

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        return self._wald_table(level)

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        # the coefficients are shared by every client: a client has none of its own
        return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))

    def predict(
        self,
        X: ArrayLike,
        client: Hashable | None = None,
        *,
        level: float = 0.95,
        offset: ArrayLike | None = None,
        exposure: ArrayLike | None = None,
    ) -> pd.DataFrame:
        """The mean response (probabilities, rates, ...) at the rows of ``X`` (a data frame,
        read by column name, categories encoded as in the fit; or an array of the predictors
        in the order of ``predictors``), with its Wald band (``lower``,
        ``upper``: the linear predictor's interval mapped through the inverse link). The
        predictive band of a new observation is given for the gaussian identity model only
        (NaN otherwise). ``offset``/``exposure``: per row, where the fit had them.
        ``client`` (a fitted one, or None) does not change the prediction."""
        q = norm_ppf(0.5 + check_level(level) / 2)
        if client is not None:
            self._check_client(client)
        X, offset, exposure = frame_rows(self, X, offset, exposure)
        D, off = prediction_rows(X, self.predictors, self.fit_intercept, self.roles, offset, exposure)
        eta = D @ self.coef + off
        se = np.sqrt(np.einsum("ij,jk,ik->i", D, self.cov, D))
        fam = self._family
        mean = fam.fitted(eta)
        a, b = fam.fitted(eta - q * se), fam.fitted(eta + q * se)
        pred = {}
        if fam.name == "gaussian" and fam.link.name == "identity":
            s = np.sqrt(se**2 + self.scale)
            pred = {"pred_lower": mean - q * s, "pred_upper": mean + q * s}
        return self._privacy_note(
            prediction_frame(
                mean,
                np.minimum(a, b),
                np.maximum(a, b),
                **pred,
                predicted_for="client" if client is not None else "new client",
            )
        )
