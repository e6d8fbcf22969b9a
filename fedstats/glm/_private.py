"""The differentially private fit of :class:`~fedstats.glm.FederatedGLM` (``dp=``).

The releases (:func:`dp_releases`), each under the user's option restricted to its keys
(:func:`release_options`), run as the algorithms of :mod:`fedstats.glm._irls` with one
:class:`~fedstats.privacy.PrivacyLedger`; :func:`fit_private` returns the result's fields.
The rules (keys, bounds, rounds, repairs, the DP noise's covariance) are documented in
:mod:`fedstats.glm.frequentist`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data import DataError
from ..federation import run
from ..privacy import DifferentialPrivacy, PrivacyLedger, PrivacySpent, release_option, run_seed
from ._irls import DPIRLS, DPDesignCheck, DPDispersion, Sandwich, info_floor, repair_pd
from .families import Family


def fit_private(self, design, fam: Family, seed: int, progress) -> tuple[dict[str, Any], str | None]:
    """The differentially private fit of the :class:`~fedstats.glm.FederatedGLM` ``self``
    (see :mod:`fedstats.glm.frequentist`): ``(the result's fields, a convergence warning or None)``."""
    dp = self.dp
    trials = self.trials is not None
    assert dp is not None
    names, p, K = design.names, len(design.names), len(design.clients)
    releases = dp_releases(fam, self.cov_type)
    opts = release_options(dp, releases, "FederatedGLM")
    ledger = PrivacyLedger(dp.accountant)
    common: dict[str, Any] = {"progress": False, "batched": False, "privacy_ledger": ledger}

    chk = run(
        DPDesignCheck(fam, trials, opts["design check"], K),
        design,
        rounds=1,
        kind="design check",
        seed=run_seed(seed, "design check"),
        **common,
    )
    _raise_failed(chk.history)
    wn, sum_y = chk.server_state["n"], chk.server_state["sum_y"]
    if not wn > p:
        raise DataError(
            f"the noisy weighted row count is {wn:.4g} for {p} coefficients: too few rows for this noise "
            "(or no rows); lower noise_multiplier or add rows"
        )
    dp.check_delta(max(1, int(round(wn))))
    beta0 = np.zeros(p)
    if self.fit_intercept:  # the intercept at the link of the noisy mean outcome
        beta0[0] = float(fam.link(np.asarray(_start_mean(fam, sum_y / wn))))
    irls_dp = opts["IRLS rounds"]
    sd = irls_dp.noise_std(["xtwx", "score"], n_clients=K, n_answered=K)
    alg = DPIRLS(fam, trials, beta0, irls_dp, K, sd["xtwx"])
    out = run(
        alg,
        design,
        rounds=int(self.dp_rounds),
        seed=run_seed(seed, "IRLS rounds"),
        progress=progress,
        kind="IRLS rounds",
        privacy_ledger=ledger,
    )
    _raise_failed(out.history)
    s = out.server_state
    beta, info = s["betas"][-1], s["info"][-1]
    df_resid = wn - p
    scale, pearson, scale_floored = 1.0, float("nan"), False
    if not fam.fixed_scale:
        disp_dp = opts["dispersion round"]
        d = run(
            DPDispersion(fam, trials, beta, disp_dp, K),
            design,
            rounds=1,
            kind="dispersion round",
            seed=run_seed(seed, "dispersion round"),
            **common,
        )
        _raise_failed(d.history)
        pearson = d.server_state["pearson"]
        floor = max(disp_dp.noise_std(["pearson"], n_clients=K, n_answered=K)["pearson"], np.finfo(float).tiny)
        scale_floored = pearson < floor
        scale = max(pearson, floor) / df_resid
    info_inv = np.linalg.inv(info)
    cov = (info_inv + info_inv.T) / 2 * scale
    floored_hc0 = 0
    if self.cov_type == "HC0":
        hc_dp = opts["sandwich round"]
        sw = run(
            Sandwich(fam, trials, beta, hc_dp, K),
            design,
            rounds=1,
            kind="sandwich round",
            seed=run_seed(seed, "sandwich round"),
            **common,
        )
        _raise_failed(sw.history)
        hsd = hc_dp.noise_std(["hessian", "meat"], n_clients=K, n_answered=K)
        hess, f1 = repair_pd(sw.server_state["hessian"], _floor_of(sw.server_state["hessian"], hsd["hessian"]))
        meat, f2 = repair_pd(sw.server_state["meat"], 0.0)
        floored_hc0 = f1 + f2
        h_inv = np.linalg.inv(hess)
        cov = h_inv @ meat @ h_inv
        cov = (cov + cov.T) / 2
    noise_cov = sd["score"] ** 2 * info_inv @ info_inv.T
    noise_cov = (noise_cov + noise_cov.T) / 2
    if self.include_dp_noise:
        cov = cov + noise_cov
    # the last step is the noise of two scores (this round's and the last's) once converged
    se_samp = np.sqrt(np.diag(cov - (noise_cov if self.include_dp_noise else 0)))
    allowed = 4 * np.sqrt(2 * np.diag(noise_cov)) + 0.1 * se_samp
    last_step = np.abs(s["betas"][-1] - s["betas"][-2])
    converged = bool(np.all(last_step <= allowed))
    warning = None
    if not converged:
        j = int(np.argmax(last_step / allowed))
        warning = (
            f"the last of the dp_rounds={self.dp_rounds} Newton rounds moved {names[j]!r} by "
            f"{last_step[j]:.3g}, more than the DP noise explains ({allowed[j]:.3g}): raise dp_rounds"
        )
    nan = float("nan")
    fields = dict(
        names=names,
        coef=np.asarray(beta, dtype=float),
        cov=cov,
        scale=float(scale),
        deviance=nan,
        pearson_chi2=float(pearson),
        llf=nan,
        aic=nan,
        bic=nan,
        df_model=p - 1,
        df_resid=float(df_resid),
        nobs=int(round(wn)),
        wnobs=float(wn),
        n_obs={},
        converged=converged,
        n_iter=int(self.dp_rounds),
        rounds=len(out.history),
        deviance_history=[],
        history=out.history,
        communication=out.communication,
        privacy=PrivacySpent(dp, ledger),
        dp_noise_cov=noise_cov,
        dp_noise_included=bool(self.include_dp_noise),
        dp_repairs={
            "information_eigenvalues_raised": [int(v) for v in s["floored"]],
            "dispersion_floored": bool(scale_floored),
            "sandwich_eigenvalues_raised": int(floored_hc0),
        },
    )
    return fields, warning


def dp_releases(fam: Family, cov_type: str) -> dict[str, tuple[str, ...]]:
    """The releases of a differentially private GLM fit: exchange -> its summed keys."""
    out: dict[str, tuple[str, ...]] = {"design check": ("n", "sum_y"), "IRLS rounds": ("xtwx", "score")}
    if not fam.fixed_scale:
        out["dispersion round"] = ("pearson",)
    if cov_type == "HC0":
        out["sandwich round"] = ("hessian", "meat")
    return out


def release_options(dp: DifferentialPrivacy, releases: dict[str, tuple[str, ...]], who: str) -> dict[str, Any]:
    """The option each release runs under (:func:`~fedstats.privacy.options.release_option`): a
    mapping ``dp.clip`` must name exactly the keys of all the releases."""
    every = [k for keys in releases.values() for k in keys]
    return {name: release_option(dp, keys, every, who) for name, keys in releases.items()}


def _start_mean(fam: Family, ybar: float) -> float:
    """The noisy mean outcome moved into the family's range, for the start."""
    if fam.name == "binomial":
        return float(np.clip(ybar, 0.01, 0.99))
    if fam.name == "gaussian":
        return float(ybar) if fam.link.name == "identity" else float(max(ybar, 1e-2))
    return float(max(ybar, 1e-2))


def _floor_of(a, noise_sd: float) -> float:
    return info_floor(np.asarray(a, dtype=float), noise_sd)


def _raise_failed(history) -> None:
    failed = {c: why for rec in history for c, why in rec.failed.items()}
    if failed:
        c, why = next(iter(failed.items()))
        if why.split(":", 1)[0] == "DataError":
            raise DataError(why.split(": ", 1)[1])
        raise RuntimeError(f"FederatedGLM: client {c!r} failed: {why}")
