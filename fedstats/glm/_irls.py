"""Federated IRLS (Fisher scoring) and its one-off rounds, as :class:`FederatedAlgorithm` s.

* :class:`DesignCheck`: one round; every client checks its rows against the family (a bad
  outcome raises there, naming the client and column) and sends its row count, the sum of
  its outcomes (statsmodels' starting mean), its weighted row count, per-column minima and
  maxima and ``X'X`` (to name constant or collinear predictors before any fit), and how many
  of its counts are not whole numbers (warned about). An outcome at the edge of the family's
  range on every row (all 0, or all 1 for binomial) is refused before any round.
* :class:`IRLS`: round 0 starts from statsmodels' starting means; round ``r`` evaluates the
  broadcast coefficients ``beta_r`` on every client, which sends the weighted cross-products
  ``X'WX``, ``X'Wz`` at ``beta_r``, its deviance, Pearson statistic and log-likelihood sums,
  and how many of its rows sit at the edge of the mean's range. The server sums them,
  stops when the deviance changed by at most ``tol`` (statsmodels' criterion), and
  otherwise solves for ``beta_{r+1}``. Exactly statsmodels' iterations, one round later:
  the deviance of a solve is known only when the clients have evaluated it.
* :class:`Sandwich`: one round at the final coefficients: the observed information and the
  outer product of the scores (``cov_type="HC0"``).

Under differential privacy (``FederatedGLM(dp=...)``) every release is a sum of per-row
contributions, clipped on the client and carrying Gaussian noise
(:class:`~fedstats.privacy.DifferentialPrivacy`):

* :class:`DPDesignCheck`: one round; each row's frequency weight (``n``) and weighted outcome
  (``sum_y``): the noisy row count and mean outcome, for the start and the degrees of freedom;
* :class:`DPIRLS`: a fixed number of Newton (Fisher scoring) rounds, each releasing the
  information ``X'WX`` (``xtwx``, a row: ``w_i x_i x_i'``) and the score (``score``, a row:
  ``x_i f_i n_i (y_i - mu_i) / (g'(mu_i) V(mu_i))``) at the broadcast coefficients; the server
  repairs the noisy information to positive definite (:func:`repair_pd`) and steps
  ``beta + I^-1 u`` (the IRLS step ``I^-1 X'Wz`` written with the score);
* :class:`DPDispersion`: one round at the final coefficients, for the families whose dispersion
  is estimated: each row's Pearson term (``pearson``);
* :class:`Sandwich` (``cov_type="HC0"``): its two matrices, row by row.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..data import DataError
from ..federation import FederatedAlgorithm, run
from ..federation.records import in_fit
from ._design import check_rows

#: a fitted mean closer than this to the edge of its range (0, or 1 for binomial) on a row
#: whose outcome sits at that edge counts as perfectly predicted (separation)
EDGE = 1e-8


#: families whose outcome is a count (a non-integer one is warned about, as R does)
COUNTS = ("poisson", "negative_binomial")


class DesignCheck(FederatedAlgorithm):
    reply_keys = ("n_rows", "sum_y", "wnobs", "xtx", "non_integer")
    # the server sees each client's row count, the rest only summed (no row's value: a constant
    # column is found from the summed X'X)
    summed_keys = ("sum_y", "wnobs", "xtx", "non_integer")
    psd_keys = ("xtx",)

    def __init__(self, family, trials_given: bool):
        self.family, self.trials_given = family, trials_given

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        r = check_rows(data, self.family, self.trials_given)
        X = r.X
        counts = r.y * r.n if self.trials_given else r.y  # binomial with trials: the successes
        count_family = self.family.name in COUNTS or (self.family.name == "binomial" and self.trials_given)
        non_integer = float(np.sum(np.abs(counts - np.round(counts)) > 1e-8)) if count_family else 0.0
        return {
            "n_rows": np.array([float(len(r.y))]),
            "sum_y": np.array([r.y.sum()]),
            "wnobs": np.array([r.f.sum()]),
            "xtx": X.T @ X,
            "non_integer": np.array([non_integer]),
        }, None

    def server_step(self, server_state, replies, round):
        return replies, {}


def design_check(family, design, trials_given: bool, seed: int, *, mle: bool = True) -> dict:
    """Run :class:`DesignCheck` (one counted round) and the server's checks of its sums.

    Returns ``n_obs`` (rows per client), ``n_rows``, ``wnobs`` (rows counted by their
    weights), ``ybar`` (the mean outcome over rows, statsmodels' start) and ``xtx``. Raises
    :class:`~fedstats.data.DataError` with the first client's message for a bad outcome,
    naming the predictor that is constant at every client or collinear with others, and
    (``mle``: a maximum likelihood fit) for an outcome at the edge of the family's range on
    every row; warns when counts are not whole numbers."""
    check = run(
        DesignCheck(family, trials_given),
        design,
        rounds=1,
        seed=seed,
        progress=False,
        batched=False,
        kind="design check",
    )
    failed = [(c, why) for rec in check.history for c, why in rec.failed.items()]
    for c, why in failed:  # a client's bad data stops the fit, naming the client and the column
        if why.split(":", 1)[0] in ("DataError", "ValueError"):
            raise DataError(why.split(": ", 1)[1])
    if failed and not (in_fit() and check.server_state):
        c, why = failed[0]
        raise DataError(f"client {c!r}: {why}")
    # in a fit, a client whose node failed otherwise (lost, refused by its policy) drops out
    reps = check.server_state
    if not reps:
        raise DataError("no client is left in the fit to answer the design check (see the warnings)")
    n_obs = {c: int(r["n_rows"][0]) for c, r in reps.items()}
    n_rows = sum(n_obs.values())
    ybar = float(reps.sums["sum_y"][0]) / n_rows
    if mle:  # a prior keeps the intercept finite: only the maximum likelihood fit has no answer
        check_outcome_varies(family, ybar, design)
    non_integer = int(reps.sums["non_integer"][0])
    if non_integer:
        warnings.warn(
            f"{non_integer} row(s) of outcome {design.data.target_name!r} are not whole numbers, which the "
            f"{family.name} family counts: the fit goes on (a quasi-likelihood, as R's glm does), but check the "
            "outcome column",
            UserWarning,
            stacklevel=4,
        )
    xtx = np.array(reps.sums["xtx"], dtype=float)
    check_identified(design.names, xtx, design.intercept)
    return {"n_obs": n_obs, "n_rows": n_rows, "wnobs": float(reps.sums["wnobs"][0]), "ybar": ybar, "xtx": xtx}


def check_outcome_varies(family, ybar: float, design) -> None:
    """Refuse an outcome that sits at the edge of the family's range on every row (every count
    0, every binomial outcome 0 or every one 1): the fitted mean would have to reach the edge,
    so the intercept (or the coefficients) diverge and the maximum likelihood estimate does
    not exist. Named as that, not as separation by a predictor."""
    edges = {0.0: ("0", "-inf")} if family.name in COUNTS else {}
    if family.name == "binomial":
        edges = {0.0: ("0", "-inf"), 1.0: ("1", "+inf")}
    for edge, (value, inf) in edges.items():
        if ybar == edge:
            what = f"the intercept diverges to {inf}" if design.intercept else "the coefficients diverge"
            raise DataError(
                f"every outcome {design.data.target_name!r} is {value} at every client: the fitted mean would have "
                f"to be exactly {value}, so {what} and the maximum likelihood estimate does not exist (BayesianGLM's "
                "prior keeps it finite)"
            )


def check_identified(names, xtx, intercept) -> None:
    """Refuse, by name, a predictor the pooled rows cannot identify: constant at every client
    (with an intercept, the first column: its pooled variance from the summed ``X'X`` is 0 up
    to rounding) or a linear combination of the predictors before it."""
    n = xtx[0, 0]
    for j in range(1 if intercept else len(names), len(names)):
        mean, square = xtx[0, j] / n, xtx[j, j] / n
        if square > 0 and square - mean**2 <= 1e-12 * square:
            raise DataError(
                f"predictor {names[j]!r} is constant ({mean:g}) at every client: the intercept already "
                "covers it; drop it"
            )
    d = np.sqrt(np.diag(xtx))
    if np.any(d == 0):
        j = int(np.flatnonzero(d == 0)[0])
        raise DataError(f"predictor {names[j]!r} is 0 on every row at every client; drop it")
    C = xtx / np.outer(d, d)
    for j in range(1, len(names)):
        ev = np.linalg.eigvalsh(C[: j + 1, : j + 1])
        if ev[0] < 1e-10 * ev[-1]:
            raise DataError(
                f"predictor {names[j]!r} is a linear combination of {names[:j]} on the pooled rows: its "
                "coefficient is not identified; drop it"
            )


def evaluate(family, r, beta, start: bool, ybar: float):
    """One client's IRLS quantities at ``beta`` (or at the starting means)."""
    if start:
        mu = family.start_mu(r.y, ybar)
        eta = family.link(mu)
    else:
        eta = r.X @ beta + r.offset
        mu = family.fitted(eta)
    upper = 1.0 if family.name == "binomial" else np.inf
    lower = -np.inf if family.name == "gaussian" else 0.0
    out = (mu < lower) | (mu > upper) | ~np.isfinite(mu)
    if not start and out.any():  # e.g. a negative rate under the identity link
        raise ValueError(
            f"the fitted mean left the {family.name} family's range under the {family.link.name} link "
            f"(e.g. {mu[out][0]:.3g}); use the family's default link"
        )
    g1 = family.link.deriv(mu)
    var = family.variance(mu)
    w = r.f * r.n / (g1**2 * var)
    z = eta + g1 * (r.y - mu) - r.offset
    Xw = r.X * w[:, None]
    dev = np.sum(r.f * family.resid_dev(r.y, mu, r.n))
    pearson = np.sum(r.f * r.n * (r.y - mu) ** 2 / var)
    edge = ((mu < EDGE) & (r.y == 0)) | ((mu > upper - EDGE) & (r.y == upper))
    if family.name not in COUNTS and family.name != "binomial":  # an unbounded mean has no edge
        edge = np.zeros_like(edge)
    return {
        "xtwx": r.X.T @ Xw,
        "xtwz": Xw.T @ z,
        "dev": np.array([dev]),
        "pearson": np.array([pearson]),
        "ll": family.loglike_sums(r.y, mu, r.f, r.n),
        "edge": np.array([float(np.sum(edge & (r.f > 0)))]),
    }


class IRLS(FederatedAlgorithm):
    reply_keys = ("xtwx", "xtwz", "dev", "pearson", "ll", "edge")
    # the server uses every reply only through its sum over the clients
    summed_keys = reply_keys
    psd_keys = ("xtwx",)  # Fisher scoring's weights are >= 0

    def __init__(self, family, trials_given: bool, p: int, ybar: float, tol: float, df_resid: float):
        self.family, self.trials_given, self.p, self.ybar, self.tol = family, trials_given, p, ybar, tol
        self.df_resid = df_resid

    def init_server(self, clients, rng):
        return {
            "beta": np.zeros(self.p),
            "start": True,
            "dev": [],
            "crit": [],
            "scale": [],
            "betas": [],
            "stats": [],
            "converged": False,
            "singular": None,
        }

    def init_client(self, client, data, rng):
        return None  # nothing kept: a client's final state goes to the server on Flower

    def broadcast(self, server_state, client, round):
        return {
            "beta": server_state["beta"],
            "start": np.array([float(server_state["start"])]),
            "ybar": np.array([self.ybar]),
        }

    def client_step(self, message, state, data, rng):
        rows = check_rows(data, self.family, self.trials_given)
        return evaluate(self.family, rows, message["beta"], bool(message["start"][0]), float(message["ybar"][0])), None

    def server_step(self, server_state, replies, round):
        s = dict(server_state)
        if not replies:  # every client failed: the fit reports the first failure
            return s, {}
        tot = {k: np.array(replies.sums[k], dtype=float) for k in self.reply_keys}
        dev = float(tot["dev"][0])
        s["dev"] = s["dev"] + [dev]
        # statsmodels' criterion: the deviance scaled by the dispersion estimated one step
        # earlier (at the start, at the starting means); 1 for the fixed-dispersion families
        scale = 1.0 if self.family.fixed_scale else float(tot["pearson"][0]) / self.df_resid
        s["scale"] = s["scale"] + [scale]
        s["crit"] = s["crit"] + [dev / s["scale"][max(len(s["scale"]) - 2, 0)]]
        s["betas"] = s["betas"] + [s["beta"]]
        s["stats"] = (s["stats"] + [tot])[-2:]  # this round's and the last round's sums
        metrics = {"deviance": dev}
        if len(s["crit"]) >= 2 and abs(s["crit"][-1] - s["crit"][-2]) <= self.tol:
            s["converged"] = True
            return s, metrics
        try:
            L = np.linalg.cholesky(tot["xtwx"])
            beta = np.linalg.solve(L.T, np.linalg.solve(L, tot["xtwz"]))
        except np.linalg.LinAlgError:
            beta = np.linalg.lstsq(tot["xtwx"], tot["xtwz"], rcond=None)[0]
            s["singular"] = round
        s["beta"], s["start"] = beta, False
        metrics["step"] = float(np.max(np.abs(beta - s["betas"][-1]))) if round else float("nan")
        return s, metrics

    def converged(self, server_state, metrics):
        return server_state["converged"]

    def leave_one_out(self, totals, own):
        """The Newton step's coefficients from the summed information with and without each
        client (``own``: one row per client): the largest change in the standard errors of the
        fit without it, and that change over what a client with its share of the information
        (trace of ``X'WX``) typically causes."""
        H, b = totals["xtwx"], totals["xtwz"]
        beta = np.linalg.solve(H, b)
        H_without = H - own["xtwx"]
        without = np.linalg.solve(H_without, (b - own["xtwz"])[..., None])[..., 0]
        scale = 1.0 if self.family.fixed_scale else max(float(totals["pearson"][0]) / self.df_resid, 1e-300)
        # the standard errors of the fit without the client
        se = np.sqrt(np.diagonal(np.linalg.inv(H_without), axis1=1, axis2=2) * scale)
        shift = np.max(np.abs(without - beta) / se, axis=1)
        share = np.clip(np.trace(own["xtwx"], axis1=1, axis2=2) / np.trace(H), 1e-12, 1 - 1e-12)
        return shift, shift / np.sqrt(share / (1 - share))


class _AtBeta:
    """What the one-off rounds at the fitted coefficients share (the sandwich, the private
    dispersion): no state on either side, ``beta`` broadcast, optionally private sums."""

    def __init__(self, family, trials_given: bool, beta, privacy=None, n_clients: int = 1):
        self.family, self.trials_given, self.beta = family, trials_given, np.asarray(beta, dtype=float)
        self.privacy, self.n_clients = privacy, n_clients

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {"beta": self.beta}


class Sandwich(_AtBeta, FederatedAlgorithm):
    """At the final ``beta``: the observed information ``X' diag(h) X`` and the meat
    ``sum_i f_i s_i^2 x_i x_i'`` of the scores (statsmodels' GLM HC0, frequency weights not
    squared); both at dispersion 1, which cancels in the sandwich.

    With ``privacy`` (a :class:`~fedstats.privacy.DifferentialPrivacy` for the keys
    ``hessian`` and ``meat``) each row's two outer products are clipped and noised on the
    client (:meth:`~fedstats.privacy.DifferentialPrivacy.client_sums`)."""

    reply_keys = ("hessian", "meat")
    summed_keys = reply_keys

    def client_step(self, message, state, data, rng):
        fam, r = self.family, check_rows(data, self.family, self.trials_given)
        mu = fam.fitted(r.X @ message["beta"] + r.offset)
        g1, var = fam.link.deriv(mu), fam.variance(mu)
        sf = (r.y - mu) / (g1 * var)  # score factor per unit weight
        eim = r.f * r.n / (g1**2 * var)
        oim = eim * (1 + sf * (var * fam.link.deriv2(mu) + fam.variance_deriv(mu) * g1))
        meat_w = r.f * (r.n * sf) ** 2
        if self.privacy is not None:
            outer = r.X[:, :, None] * r.X[:, None, :]
            rows = {"hessian": outer * _finite(oim)[:, None, None], "meat": outer * _finite(meat_w)[:, None, None]}
            return _private_sums(self.privacy, rows, rng, self.n_clients), None
        return {"hessian": r.X.T @ (r.X * oim[:, None]), "meat": r.X.T @ (r.X * meat_w[:, None])}, None

    def server_step(self, server_state, replies, round):
        # no client answered: zeros, as an empty sum (the caller reports the failures)
        return {k: np.array(replies.sums[k]) if k in replies.sums else 0 for k in self.reply_keys}, {}


# ---------------------------------------------------------------- differential privacy
def _finite(a) -> np.ndarray:
    """``a`` with non-finite entries set to 0: a row whose weight is not finite at the
    broadcast coefficients (a mean at the very edge of its range) contributes nothing."""
    a = np.asarray(a, dtype=float)
    return np.where(np.isfinite(a), a, 0.0)


def _private_sums(privacy, rows: dict, rng, n_clients: int) -> dict:
    """One client's reply for one private release: each row's contributions clipped, summed,
    with the client's share of the noise (placement "client")."""
    out = privacy.client_sums(rows, rng, n_clients=n_clients)
    return {k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in out.sums.items()}


def _mean_at(family, r, beta) -> np.ndarray:
    """The fitted means of a client's rows at ``beta`` (ValueError when they leave the
    family's range, as in :func:`evaluate`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        mu = family.fitted(r.X @ beta + r.offset)
    upper = 1.0 if family.name == "binomial" else np.inf
    lower = -np.inf if family.name == "gaussian" else 0.0
    out = (mu < lower) | (mu > upper) | ~np.isfinite(mu)
    if out.any():
        raise ValueError(
            f"the fitted mean left the {family.name} family's range under the {family.link.name} link "
            f"(e.g. {mu[out][0]:.3g}) at the noisy coefficients; use the family's default link"
        )
    return mu


def repair_pd(a: np.ndarray, floor: float) -> tuple[np.ndarray, int]:
    """The symmetric part of ``a`` with its eigenvalues below ``floor`` raised to ``floor``
    (post-processing of a noisy information matrix): ``(matrix, how many were raised)``."""
    a = (np.asarray(a, dtype=float) + np.asarray(a, dtype=float).T) / 2
    vals, vecs = np.linalg.eigh(a)
    low = vals < floor
    if not low.any():
        return a, 0
    fixed = (vecs * np.maximum(vals, floor)) @ vecs.T
    return (fixed + fixed.T) / 2, int(low.sum())


def info_floor(info: np.ndarray, noise_sd: float) -> float:
    """The eigenvalue floor of a noisy ``p x p`` information matrix: ``2 sqrt(p)`` times the
    noise standard deviation of one entry of the released sum (the symmetrised noise matrix's
    largest eigenvalue is about ``sqrt(2 p)`` of them), and never under ``1e-12`` of the
    matrix's largest eigenvalue (a noiseless matrix is left as it is unless near-singular)."""
    p = info.shape[0]
    top = float(np.max(np.abs(np.linalg.eigvalsh((info + info.T) / 2)))) if p else 0.0
    return max(2.0 * np.sqrt(p) * float(noise_sd), 1e-12 * top, np.finfo(float).tiny)


class DPDesignCheck(FederatedAlgorithm):
    """The design check of a differentially private fit: one release of each row's frequency
    weight (``n``; 1 without weights) and weighted outcome (``sum_y``: ``f_i y_i``, the
    proportion of successes for binomial with trials), clipped and noised. Rows are checked
    on the client as in :class:`DesignCheck` (a bad outcome fails the fit)."""

    reply_keys = ("n", "sum_y")
    summed_keys = reply_keys

    def __init__(self, family, trials_given: bool, privacy, n_clients: int):
        self.family, self.trials_given = family, trials_given
        self.privacy, self.n_clients = privacy, n_clients

    def init_server(self, clients, rng):
        return {}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {}

    def client_step(self, message, state, data, rng):
        r = check_rows(data, self.family, self.trials_given)
        return _private_sums(self.privacy, {"n": r.f, "sum_y": r.f * r.y}, rng, self.n_clients), None

    def server_step(self, server_state, replies, round):
        return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in replies.sums.items()}, {}


class DPIRLS(FederatedAlgorithm):
    """Newton (Fisher scoring) rounds on noisy sums: every round releases the information
    ``xtwx`` and the score ``score`` at the broadcast coefficients; the server symmetrises
    the information, raises its eigenvalues to :func:`info_floor` (:func:`repair_pd`) and
    steps ``beta + I^-1 u``. The run has a fixed number of rounds (no convergence test on
    noisy values). The server state keeps every round's coefficients, repaired information
    and score."""

    reply_keys = ("xtwx", "score")
    summed_keys = reply_keys

    def __init__(self, family, trials_given: bool, beta0, privacy, n_clients: int, info_noise_sd: float):
        self.family, self.trials_given = family, trials_given
        self.beta0 = np.asarray(beta0, dtype=float)
        self.privacy, self.n_clients, self.info_noise_sd = privacy, n_clients, float(info_noise_sd)

    def init_server(self, clients, rng):
        return {"beta": self.beta0, "betas": [self.beta0], "info": [], "score": [], "floored": []}

    def init_client(self, client, data, rng):
        return None

    def broadcast(self, server_state, client, round):
        return {"beta": server_state["beta"]}

    def client_step(self, message, state, data, rng):
        fam, r = self.family, check_rows(data, self.family, self.trials_given)
        mu = _mean_at(fam, r, message["beta"])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            g1, var = fam.link.deriv(mu), fam.variance(mu)
            w = _finite(r.f * r.n / (g1**2 * var))
            resid = _finite(r.f * r.n * (r.y - mu) / (g1 * var))
        rows = {"xtwx": r.X[:, :, None] * r.X[:, None, :] * w[:, None, None], "score": r.X * resid[:, None]}
        return _private_sums(self.privacy, rows, rng, self.n_clients), None

    def server_step(self, server_state, replies, round):
        s = dict(server_state)
        if not replies:  # every client failed: the fit reports the first failure
            return s, {}
        info, floored = repair_pd(replies.sums["xtwx"], info_floor(replies.sums["xtwx"], self.info_noise_sd))
        score = np.array(replies.sums["score"], dtype=float)
        step = np.linalg.solve(info, score)
        s["beta"] = s["beta"] + step
        s["betas"] = s["betas"] + [s["beta"]]
        s["info"], s["score"] = s["info"] + [info], s["score"] + [score]
        s["floored"] = s["floored"] + [floored]
        return s, {"step": float(np.max(np.abs(step)))}


class DPDispersion(_AtBeta, FederatedAlgorithm):
    """One release at the final coefficients, for the families whose dispersion is
    estimated (gaussian, gamma): each row's Pearson term ``f_i n_i (y_i - mu_i)^2 / V(mu_i)``
    (``pearson``), clipped and noised."""

    reply_keys = ("pearson",)
    summed_keys = reply_keys

    def client_step(self, message, state, data, rng):
        fam, r = self.family, check_rows(data, self.family, self.trials_given)
        mu = _mean_at(fam, r, message["beta"])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            terms = _finite(r.f * r.n * (r.y - mu) ** 2 / fam.variance(mu))
        return _private_sums(self.privacy, {"pearson": terms}, rng, self.n_clients), None

    def server_step(self, server_state, replies, round):
        return {"pearson": float(np.asarray(replies.sums["pearson"]).reshape(-1)[0])}, {}
