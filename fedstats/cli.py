"""The ``fedstats`` command.

``fedstats fit DATA.csv --by CLIENT --target Y [--features A B ...] [--model MODEL]
[--level 0.9] [--rounds N] [--seed S] [--output OUT.json] [--predict TEST.csv]`` fits a
federated model with one client per value of ``--by``. Every model (hm2, lasso, ridge, hm1,
fgpr, gmm, glm) goes through one path, the result contract of :mod:`fedstats.results`: the
printed tables and the JSON's ``"global"`` and ``"client"`` are ``summary(level)`` and
``client_summary(level)`` (records ``name, mean, sd, lower, upper, p_value``, ``null`` where
the model has no distribution, then the model's own columns such as HM1's ``estimate``,
the lasso's ``selected`` or the GLM's ``z`` and ``se``), ``"predictions"`` come from ``predict`` (regressions: ``mean``,
the predictive band ``lower``/``upper``, the credible band of the mean
``mean_lower``/``mean_upper``; mixtures, with scikit-learn's meaning: ``component``,
``proba``, ``logdensity``), and ``"communication"`` is the fit's one ledger with its
per-kind breakdown. What differs per model is only the estimator's construction
(:func:`_estimator`), the header line and a few model-specific JSON fields
(:func:`_extras`). A client not in the fit is predicted as a new client (``new_client``)
where the model has a rule for one, and refused before the fit by hm1 and fgpr.
``fedstats demo`` simulates a federation, fits it and prints the fit beside the pooled gold
standard.

Bad input gives a one-line error on stderr and exit status 2 (1 for a failed fit).

Size: one module for now (about 700 lines, over the 650 we aim for): it grew by the three GLM
models' options; issue 20, the next open issue after the GLMs, splits reading and checking
the CSV (about 150 lines) and the per-model adapters (_estimator, _header, _extras) from the
command itself.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

MODELS = ("hm2", "lasso", "ridge", "hm1", "fgpr", "gmm", "glm", "bglm", "hglm")
GLMS = ("glm", "bglm", "hglm")
from .glm._design import SPECIAL as GLM_ROLES  # noqa: E402 - the GLMs' column roles, one list

MIN_ROWS = 3


class CLIError(Exception):
    """An input problem reported as one line, without a traceback."""


def _read_csv(path: str, decimal: str = ".") -> pd.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise CLIError(f"file not found: {path}")
    try:
        # decimal commas go with semicolon-separated files (the convention where "1,5" is 1.5)
        df = pd.read_csv(p, sep=None if decimal == "." else ";", engine="python", decimal=decimal)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's file
        raise CLIError(f"cannot read {path} as CSV: {exc}") from None
    if df.empty:
        raise CLIError(f"{path} has no rows")
    return df


_DECIMAL_COMMA = r"^\s*[-+]?\d+,\d+(?:[eE][-+]?\d+)?\s*$"


def _check_columns(df: pd.DataFrame, features: list[str], target: str | None, by: str, path: str) -> None:
    """Refuse what would be fitted as silent nonsense, and warn about what may be: numbers
    written with decimal commas, text with so many levels that one-hot encoding would fit one
    coefficient per few rows, values too large to square in float64; duplicated columns and
    columns that are linearly dependent at every client. (Missing columns and values are
    reported by :func:`_data_from`.)"""
    cols = [*features, *([target] if target else [])]
    if by not in df.columns or any(c not in df.columns for c in cols):
        return
    n = len(df)
    for c in cols:
        v = df[c]
        if v.dtype == object or isinstance(v.dtype, pd.StringDtype):
            text = v.dropna().astype(str)
            if len(text) and text.str.match(_DECIMAL_COMMA).mean() >= 0.5:
                raise CLIError(f"{path}: column {c!r} holds numbers written with a decimal comma (e.g. "
                               f"{text[text.str.match(_DECIMAL_COMMA)].iloc[0]!r}): pass --decimal ,")
            if len(text) and pd.to_numeric(text, errors="coerce").notna().mean() >= 0.5:
                bad = text[pd.to_numeric(text, errors="coerce").isna()].iloc[0]
                raise CLIError(f"{path}: column {c!r} is mostly numbers but holds text such as {bad!r}: fix or "
                               "remove those values (missing values must be empty)")
            levels = text.nunique()
            if levels > 20 and levels > n / 5:
                raise CLIError(f"{path}: column {c!r} is text with {levels} distinct values in {n} rows; one-hot "
                               f"encoding it would fit {levels - 1} coefficients: drop it (--features) or encode it")
        elif pd.api.types.is_numeric_dtype(v) and not pd.api.types.is_bool_dtype(v):
            big = np.abs(v.to_numpy(dtype=float))
            if np.any(np.isfinite(big) & (big > 1e150)):
                raise CLIError(f"{path}: column {c!r} has a value ({v.iloc[int(np.nanargmax(big))]:g}) too large to "
                               "square in float64: rescale it or check for a sentinel value")
    numeric = [c for c in features if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
    for i, a in enumerate(numeric):
        for b in numeric[i + 1:]:
            if df[a].equals(df[b]):
                print(f"warning: columns {a!r} and {b!r} are identical (a duplicated column?): their coefficients "
                      "cannot be told apart", file=sys.stderr)
    if len(numeric) > 1:
        dependent = True
        for _, g in df.groupby(by, sort=False):
            X = g[numeric].to_numpy(dtype=float)
            if not np.all(np.isfinite(X)):
                dependent = False
                break
            X = X - X.mean(axis=0)
            if len(g) <= len(numeric) or np.linalg.matrix_rank(X) == len(numeric):
                dependent = False
                break
        if dependent:
            print(f"warning: the predictors {numeric} are linearly dependent at every client: their coefficients "
                  "are not identified by the data (the prior decides how an effect is split between them)",
                  file=sys.stderr)


def _data_from(df: pd.DataFrame, by: str, target: str | None, features, *, path: str):
    from .data import DataError, FederatedData

    missing = [c for c in [by, *([target] if target else []), *(features or [])] if c not in df.columns]
    if missing:
        raise CLIError(f"{path}: column(s) not found: {', '.join(missing)} (columns: {', '.join(map(str, df.columns))})")
    try:
        return FederatedData.from_dataframe(df, by=by, target=target, features=features or None,
                                            categorical="onehot", min_rows=MIN_ROWS)
    except DataError as exc:
        raise CLIError(f"{path}: {exc}") from None


def _fmt_p(p) -> str:
    """A p-value as printed: blank where the model states no null hypothesis, ``< 1e-4``
    rather than a misleading ``0.0000``."""
    if p is None or pd.isna(p):
        return ""
    return "< 1e-4" if p < 1e-4 else f"{p:.4f}"


def _table(df: pd.DataFrame) -> str:
    if "p_value" in df.columns:
        df = df.assign(p_value=[_fmt_p(v) for v in df["p_value"]])
    return df.to_string()


def _progress(args):
    """The ``progress`` argument of a fit: ``False`` under ``--quiet`` (no tqdm bar even on a
    terminal), else ``None``: per-round lines where :func:`main` opened ``round_lines``."""
    return False if args.quiet else None


def _communication(res) -> dict:
    """The JSON of a fit's communication: totals and the per-kind breakdown (every exchange of
    the fit, one-off rounds included)."""
    c = res.communication
    return {"bytes_up": int(c.bytes_up), "bytes_down": int(c.bytes_down),
            "by_kind": {k: {"bytes_up": int(v["bytes_up"]), "bytes_down": int(v["bytes_down"]),
                            "rounds": int(v["rounds"])} for k, v in c.by_kind.items()}}


def _converged_text(res) -> str:
    return "converged" if res.converged else "NOT converged: stopped at the round limit (raise --rounds)"


def json_ready(out):
    """``out`` with every non-finite float replaced by ``None`` (JSON has no NaN or Infinity;
    strict parsers reject them), and where that happened: ``"section name field"`` strings
    such as ``"global mean[3][x1] sd"``."""
    found: list[str] = []

    def walk(x, path):
        if isinstance(x, dict):
            here = path + ([x["name"]] if isinstance(x.get("name"), str) else [])
            return {k: walk(v, here + [str(k)]) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, path if isinstance(v, dict) else path + [str(i)]) for i, v in enumerate(x)]
        if isinstance(x, (float, np.floating)) and not np.isfinite(x):
            found.append(" ".join(path))
            return None
        return x.item() if isinstance(x, np.generic) else x

    return walk(out, []), found


def _nonfinite_warning(model: str, where: list[str]) -> str:
    import re

    comps = sorted({int(m.group(1)) for w in where if (m := re.search(r"\b(?:mean|var|weight)\[(\d+)\]", w))})
    if model == "gmm" and comps:
        why = (f"component(s) {', '.join(map(str, comps))} are (almost) empty: no client gives them weight, so "
               "their posterior is the prior and some sds are infinite")
    else:
        why = ", ".join(where[:6]) + (" ..." if len(where) > 6 else "")
    return f"warning: {len(where)} non-finite value(s) written as null (JSON has no NaN or Infinity): {why}"


def _records(df: pd.DataFrame) -> list[dict]:
    """One JSON record per row: ``name``, the contract's columns (``null`` where the model has
    no value), then the table's own columns (HM1's ``estimate``, the lasso's ``selected``)."""
    from .results import SUMMARY_COLUMNS

    cols = [*SUMMARY_COLUMNS, *(c for c in df.columns if c not in SUMMARY_COLUMNS)]
    out = []
    for name, row in df.iterrows():
        rec = {"name": str(name)}
        for c in cols:
            v = row.get(c, np.nan)
            rec[c] = v if isinstance(v, (bool, np.bool_)) or v is None else (None if pd.isna(v) else float(v))
        out.append(rec)
    return out


# What differs between the models is only how the estimator is built, how the run is
# described and a few model-specific JSON fields; everything else goes through the result
# contract (fedstats.results): summary / client_summary / predict / communication.
REGRESSIONS = ("hm2", "lasso", "ridge")


def _estimator(args):
    """``--model``'s estimator with the command's options, and its extra ``fit`` arguments."""
    if args.model in REGRESSIONS:
        from .linear import BayesianLasso, BayesianRidge, HierarchicalLinearModel

        cls = {"hm2": HierarchicalLinearModel, "lasso": BayesianLasso, "ridge": BayesianRidge}[args.model]
        return cls(rounds=args.rounds, standardize=args.standardize, fit_intercept=args.intercept), {}
    if args.model == "hm1":
        from .linear import StructuralCovarianceModel

        return (StructuralCovarianceModel(rounds=args.rounds, fit_intercept=args.intercept),
                {"uncertainty": True if args.uncertainty else "auto"})
    if args.model == "fgpr":
        from .gp import FGPR

        return FGPR(rounds=args.rounds, kernel=args.kernel, ard=args.ard), {}
    if args.model in GLMS:
        from .glm import BayesianGLM, FederatedGLM, HierarchicalGLM

        cls = {"glm": FederatedGLM, "bglm": BayesianGLM, "hglm": HierarchicalGLM}[args.model]
        extra = {"cov_type": "HC0" if args.robust else "nonrobust"} if args.model == "glm" else {}
        return cls(args.family, args.link, alpha=args.alpha, fit_intercept=args.intercept, rounds=args.rounds,
                   **extra, **{r: getattr(args, r) for r in GLM_ROLES}), {}
    from .mixture import FederatedGaussianMixture, VariationalGaussianMixture

    if args.bayesian:
        return VariationalGaussianMixture(args.components, covariance_type=args.covariance_type, rounds=args.rounds), {}
    return (FederatedGaussianMixture(args.components, covariance_type=args.covariance_type, rounds=args.rounds),
            {"uncertainty": args.uncertainty})


# Models without a prediction for a client that took no part in the fit (checked before the
# fit, so that nobody waits for a fit that then cannot predict); the others predict such a
# client from the population (hm2, lasso, ridge) or from its own rows' weights (gmm).
NO_NEW_CLIENTS = {"hm1": "HM1 has no model of a client that took no part in the fit",
                  "fgpr": "FGPR predicts a client from its own training rows"}


def _header(args, res, runtime: float) -> str:
    conv = _converged_text(res)
    if args.model in REGRESSIONS:
        return (f"Global posterior ({100 * args.level:g}% credible intervals), {res.rounds} EP rounds ({conv}), "
                f"{runtime:.1f} s")
    if args.model == "hm1":
        return f"HM1 (Algorithm 1): {res.rounds} rounds ({conv}), learning rate {res.lr:.3g}, {runtime:.1f} s"
    if args.model == "fgpr":
        return (f"FGPR ({args.kernel}{', ARD' if args.ard else ''}): {res.rounds} rounds, {len(res.clients)} clients, "
                f"{runtime:.1f} s. Shared hyperparameters (outputscale and noise are variances on each client's "
                "standardised scale):")
    if args.model == "glm":
        errors = "HC0 sandwich" if args.robust else "model-based"
        return (f"GLM, {res.family} family, {res.link} link, maximum likelihood by federated IRLS: {res.rounds} rounds "
                f"({conv}), {len(res.clients)} clients, {runtime:.1f} s; Wald {100 * args.level:g}% intervals, "
                f"{errors} standard errors (sd); deviance {res.deviance:.4f} on {res.df_resid:g} df, "
                f"AIC {res.aic:.2f}, dispersion {res.scale:.4g}")
    if args.model in ("bglm", "hglm"):
        what = ("coefficients shared by every client" if args.model == "bglm" else
                "each client's coefficients around the population mean mu (tau: their variances)")
        return (f"Bayesian GLM, {res.family} family, {res.link} link, {what}, by federated EP: {res.rounds} rounds "
                f"({conv}), {len(res.clients)} clients, {runtime:.1f} s; {100 * args.level:g}% credible intervals")
    kind = "variational FedEM" if args.bayesian else "FedEM"
    what = ("credible intervals" if args.bayesian else "Wald intervals" if args.uncertainty else "point estimates")
    return (f"Gaussian mixture, {args.components} components ({args.covariance_type}), {kind}: {res.rounds} rounds "
            f"({conv}), {len(res.clients)} clients, {runtime:.1f} s; {what}")


def _extras(args, res, data, scaler) -> dict:
    """The model-specific fields of the JSON (beside the contract's)."""
    if args.model == "hm1":
        out = {"learning_rate": res.lr}
        if args.output:
            omega_path = Path(args.output).with_suffix(".omega.csv")
            om = res.posterior_omega if res.has_uncertainty else res.omega
            om.index = om.columns = [_id_key(c) for c in data.clients]
            try:
                om.to_csv(omega_path)
            except OSError as exc:
                raise CLIError(f"cannot write {omega_path}: {exc.strerror}") from None
            out["omega_file"] = omega_path.name
        return out
    if args.model == "fgpr":
        return {"kernel": args.kernel, "ard": bool(args.ard),
                "input_scaling": {"mean": scaler.mean.tolist(), "sd": scaler.sd.tolist()}}
    if args.model == "gmm":
        return {"components": args.components, "covariance_type": args.covariance_type, "bayesian": bool(args.bayesian),
                "intervals": "credible" if args.bayesian else ("wald" if args.uncertainty else None),
                "loglik": None if args.bayesian else res.loglik_,
                "elbo": float(res.elbo_trace()[-1]) if args.bayesian else None}
    if args.model in ("bglm", "hglm"):
        return {"family": res.family, "link": res.link,
                "alpha": res.alpha if res.family == "negative_binomial" else None,
                "roles": {r: getattr(args, r) for r in GLM_ROLES if getattr(args, r) is not None}}
    if args.model == "glm":
        return {"family": res.family, "link": res.link, "alpha": res.alpha if res.family == "negative_binomial" else None,
                "cov_type": res.cov_type, "deviance": res.deviance, "pearson_chi2": res.pearson_chi2, "llf": res.llf,
                "aic": res.aic, "bic": res.bic, "dispersion": res.scale, "df_model": res.df_model,
                "df_resid": res.df_resid, "n_iter": res.n_iter,
                "roles": {r: getattr(args, r) for r in GLM_ROLES if getattr(args, r) is not None}}
    return {}


def _check_args(args) -> None:
    if args.model not in MODELS:
        raise CLIError(f"unknown model {args.model!r}; choose one of: {', '.join(MODELS)}")
    if not 0 < args.level < 1:
        raise CLIError(f"--level must lie in (0, 1), got {args.level}")
    if args.model == "gmm":
        if args.target is not None:
            raise CLIError("--model gmm takes no --target (a mixture models all feature columns)")
        if args.components is None or args.components < 1:
            raise CLIError("--model gmm needs --components M (M >= 1)")
    else:
        if args.target is None:
            raise CLIError(f"--model {args.model} needs --target")
        if args.components is not None or args.bayesian or args.covariance_type != "full":
            raise CLIError("--components, --bayesian and --covariance-type apply to --model gmm only")
    if not args.standardize and args.model not in REGRESSIONS:
        raise CLIError("--no-standardize applies to --model hm2, lasso and ridge only")
    if not args.intercept and args.model not in (*REGRESSIONS, "hm1", *GLMS):
        raise CLIError("--no-intercept applies to the regressions (hm2, lasso, ridge, hm1, glm, bglm, hglm) only")
    glm_only = [f"--{o}" for o in ("family", "link", "alpha", *GLM_ROLES, "robust")
                if getattr(args, o) not in (None, False)]
    if args.model not in GLMS and glm_only:
        raise CLIError(f"{', '.join(glm_only)}: for --model glm, bglm and hglm only")
    if args.robust and args.model != "glm":
        raise CLIError("--robust (sandwich standard errors) is for --model glm only")
    if args.model in GLMS:
        from .glm._sites import BAYES_LINKS
        from .glm.families import FAMILIES

        links = {f: FAMILIES[f].links for f in FAMILIES} if args.model == "glm" else dict(BAYES_LINKS)
        if args.model == "hglm":
            links = {f: links[f] for f in ("binomial", "poisson", "negative_binomial")}
        if args.family is None or args.family not in links:
            raise CLIError(f"--model {args.model} needs --family, one of: {', '.join(links)}")
        if args.link is not None and args.link not in links[args.family]:
            raise CLIError(f"the {args.family} family takes --link {', '.join(links[args.family])} with --model "
                           f"{args.model}, got {args.link}")
        if args.trials is not None and args.family != "binomial":
            raise CLIError("--trials is for --family binomial")
        if args.alpha is not None and args.family != "negative_binomial":
            raise CLIError("--alpha is for --family negative_binomial")
        args.alpha = 1.0 if args.alpha is None else args.alpha
        if args.alpha <= 0:
            raise CLIError(f"--alpha must be positive, got {args.alpha}")
        used = [c for c in (getattr(args, r) for r in GLM_ROLES) if c is not None]
        if args.features and any(c not in args.features for c in used):
            args.features = [*args.features, *(c for c in used if c not in args.features)]
    if args.rounds is None:
        args.rounds = {"hm1": 30, "fgpr": 100, "gmm": 200, "glm": 100, "hglm": 30}.get(args.model, 15)
    if args.rounds < 1:
        raise CLIError(f"--rounds must be at least 1, got {args.rounds}")
    if args.uncertainty and args.model not in ("hm1", "gmm"):
        raise CLIError("--uncertainty applies to --model hm1 and gmm only (the Bayesian models always give intervals)")
    if args.uncertainty and args.bayesian:
        raise CLIError("--uncertainty (Wald intervals) and --bayesian (credible intervals) exclude each other")
    if (args.kernel != "rbf" or args.ard) and args.model != "fgpr":
        raise CLIError("--kernel and --ard apply to --model fgpr only")


def _read_test(args, df, data):
    """The prediction file: its rows and their design (checked before the fit)."""
    tdf = _read_csv(args.predict, args.decimal)
    cols = [args.by, *data_columns(df, args)]
    missing = [c for c in cols if c not in tdf.columns]
    if missing:
        raise CLIError(f"{args.predict}: column(s) not found: {', '.join(missing)}")
    if tdf[args.by].isna().any():
        lines = ", ".join(str(i + 2) for i in np.flatnonzero(tdf[args.by].isna().to_numpy())[:5])
        raise CLIError(f"{args.predict}: column {args.by!r} has missing client ids (line(s) {lines})")
    known = {_id_key(c) for c in data.clients}
    unknown = sorted({_id_key(v) for v in tdf[args.by]} - known)
    if unknown and args.model in NO_NEW_CLIENTS:
        raise CLIError(f"{args.predict}: {NO_NEW_CLIENTS[args.model]}; client(s) not in the fit: "
                       f"{', '.join(unknown[:5])}")
    return tdf, _design(tdf, list(data.feature_names), args.predict)


def _fit(args) -> dict:
    from .data import DataError

    _check_args(args)
    df = _read_csv(args.data, args.decimal)
    _check_columns(df, data_columns(df, args), args.target, args.by, args.data)
    data = _data_from(df, args.by, args.target, args.features, path=args.data)
    if args.model == "hm1" and data.n_clients < 2:
        raise CLIError("--model hm1 learns a covariance between clients: it needs at least 2 clients")
    test = _read_test(args, df, data) if args.predict else None  # schema errors before the fit
    scaler, fit_data = None, data
    if args.model == "fgpr":  # federated moments: every client uses the same input scale
        fit_data, scaler = data.standardize()
    estimator, options = _estimator(args)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = estimator.fit(fit_data, seed=args.seed, progress=_progress(args), **options)
        except DataError as exc:  # the data, not the program: one line naming the column and client
            raise CLIError(f"{args.data}: {exc}") from None
        except np.linalg.LinAlgError:
            if args.model != "gmm":
                raise
            raise CLIError("the information matrix is singular (a weight at 0 or components that cannot be "
                           "told apart): no Wald intervals; try fewer --components or --bayesian") from None
    runtime = time.perf_counter() - t0
    for wmsg in caught:
        print(f"warning: {wmsg.message}", file=sys.stderr)
    g = res.summary(level=args.level)
    cs = res.client_summary(level=args.level)
    selection = res.selected(args.level) if hasattr(res, "selected") else None
    tables = {}
    for c in data.clients:
        t = cs[cs["client"] == c].drop(columns="client").set_index("parameter")
        if selection is not None:
            chosen = selection.loc[selection["client"] == c].set_index("parameter")["selected"]
            t = t.assign(selected=[bool(chosen[n]) if n in chosen.index else None for n in t.index])
        tables[c] = t
    out = {
        "model": args.model,
        "level": args.level,
        "clients": [_id_key(c) for c in data.clients],
        "n_obs": {_id_key(c): int(data.n_obs[c]) for c in data.clients},
        "global": _records(g),
        "client": {_id_key(c): _records(t) for c, t in tables.items()},
        "rounds": res.rounds,
        "converged": bool(res.converged),
        "communication": _communication(res),
        "runtime_s": round(runtime, 3),
        **_extras(args, res, data, scaler),
    }
    if args.model == "glm":  # the frequentist names beside the contract's: se is sd, the standard error
        out["global"] = [{**r, "se": r["sd"]} for r in out["global"]]
    if test is not None:
        tdf, X = test
        out["predictions"] = _predict(res, data, tdf, X if scaler is None else scaler.transform_X(X), args)
    _print_tables(g, tables, res, args, runtime)
    return out


def data_columns(df, args) -> list[str]:
    return list(args.features) if args.features else [c for c in df.columns if c not in (args.by, args.target)]


def _design(test: pd.DataFrame, names: list[str], path: str) -> np.ndarray:
    """Rows of ``test`` encoded with the training schema (numeric columns and ``col[level]`` dummies)."""
    cols = []
    for name in names:
        if name in test.columns:
            v = pd.to_numeric(test[name], errors="coerce")
            if v.isna().any():
                raise CLIError(f"{path}: column {name!r} has missing or non-numeric values")
            cols.append(v.to_numpy(dtype=float))
        elif name.endswith("]") and "[" in name:
            col, level = name[:-1].split("[", 1)
            if col not in test.columns:
                raise CLIError(f"{path}: column not found: {col}")
            cols.append((test[col].astype(str) == level).to_numpy(dtype=float))
        else:
            raise CLIError(f"{path}: column not found: {name}")
    return np.column_stack(cols) if cols else np.empty((len(test), 0))


def _id_key(value) -> str:
    """A client id as text; a float that is a whole number reads like the int (1.0 -> "1")."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    return str(value)


def _predict(res, data, test: pd.DataFrame, X: np.ndarray, args) -> list[dict]:
    """One record per row of ``test``, in its order. Regressions: ``mean``, ``lower``/``upper``
    (predictive band of a new observation), ``mean_lower``/``mean_upper`` (credible band of the
    mean), then the model's own columns. Mixtures (scikit-learn's meaning of predict): the most
    probable ``component``, ``proba`` and ``logdensity``. Every record says ``new_client``."""
    ids = test[args.by]
    # Ids are matched as text, so 3, 3.0 and "3" name the same client whatever the column types.
    known = {_id_key(c): c for c in data.clients}
    keys = np.array([_id_key(v) for v in ids])
    rows: list[dict] = [{} for _ in range(len(test))]
    mixture = hasattr(res, "predict_proba")
    seed = {"seed": args.seed} if "seed" in inspect.signature(res.predict).parameters else {}
    for key in pd.unique(keys):
        idx = np.flatnonzero(keys == key)
        client = known.get(key)
        if mixture:  # an unseen client: its weights from its own rows, the components frozen
            kw = {"client": client} if client is not None else {"weights": res.new_client_weights(X[idx])}
            for i, p_, l_ in zip(idx, res.predict_proba(X[idx], **kw), res.score_samples(X[idx], **kw)):
                rows[i] = {"client": key, "component": int(np.argmax(p_)), "proba": [float(v) for v in p_],
                           "logdensity": float(l_), "new_client": client is None}
            continue
        if args.model in GLMS:  # the offset and exposure columns are not predictors
            names = list(data.feature_names)
            kw = {r: X[idx, names.index(res.roles[r])] for r in ("offset", "exposure") if res.roles.get(r)}
            p = res.predict(X[idx][:, [names.index(c) for c in res.predictors]], client=client, level=args.level,
                            **kw, **seed)
        else:
            p = res.predict(X[idx], client=client, level=args.level, **seed)
        extra = [c for c in p.columns if c not in ("mean", "lower", "upper", "pred_lower", "pred_upper")]
        for i, (_, r) in zip(idx, p.iterrows()):
            rows[i] = {"client": key, "mean": r["mean"], "lower": r["pred_lower"], "upper": r["pred_upper"],
                       "mean_lower": r["lower"], "mean_upper": r["upper"], **{c: r[c] for c in extra},
                       "new_client": client is None}
            rows[i] = {k: ((None if np.isnan(v) else float(v)) if isinstance(v, (float, np.floating)) else v)
                       for k, v in rows[i].items()}  # NaN: no band (HM1 without uncertainty)
    new = sorted({k for k in keys if k not in known})
    if new:
        how = "their weights fitted on their own rows, the components frozen" if mixture else "from the population"
        print(f"note: {len(new)} client(s) of {args.predict} took no part in the fit ({', '.join(new[:5])}): predicted "
              f"as new clients, {how} (new_client: true)", file=sys.stderr)
    return rows


def _print_tables(g, tables, res, args, runtime) -> None:
    def shown(t):  # the columns with a value somewhere
        return t[[c for c in t.columns if t[c].notna().any()]]

    pct = f"{100 * args.level:g}%"
    with pd.option_context("display.width", 120, "display.max_columns", 10, "display.max_rows", 60,
                           "display.float_format", "{:.4f}".format):
        print(_header(args, res, runtime))
        if getattr(res, "scaling", None) is not None and args.model in GLMS:
            print("(fitted on predictors standardised with federated moments, the priors on that scale; reported on "
                  "the data's scale; 0/1 predictors keep their coding)")
        elif getattr(res, "scaling", None) is not None:
            print("(fitted on predictors and target standardised with federated moments, reported on the data's "
                  "scale" + ("; lambda penalises the standardised coefficients" if args.model != "hm2" else "")
                  + "; --no-standardize fits the data as given)")
        if args.model == "hm1" and res.has_uncertainty:
            print(f"estimate: Algorithm 1's point; mean, sd, {pct} interval: the posterior given Omega re-estimated "
                  "from the shared information (the interval is centred at mean)")
        if len(g):
            print(_table(shown(g)))
        for c, s in tables.items():
            if len(s):
                print(f"\nClient {c}")
                print(_table(shown(s).assign(**({"selected": s["selected"].map({True: "yes", False: "no"}).fillna("")}
                                                 if "selected" in s.columns else {}))))
        if any("selected" in s.columns for s in tables.values()):
            print(f"\nselected: the {pct} credible interval excludes 0 (the intercept is never penalised or selected)")


def _demo(args) -> None:
    from .datasets.synthetic import hm2_federation
    from .linear import HierarchicalLinearModel
    from .linear.hierarchical import pooled_nuts

    K, n = 20, 40
    data, truth = hm2_federation(n_clients=K, n_obs=n, mu=[1.0, -0.5, 2.0], tau=[0.5, 1.0, 0.3],
                                 sigma=0.5, seed=args.seed)
    print(f"Simulated federation: {K} clients x {n} rows, 3 features; theta_k ~ N(mu, diag tau), "
          "noise sd unknown to the model.")
    print("Federated EP (raw rows never leave their client):")
    t0 = time.perf_counter()
    # the simulated data are on unit scale and the pooled reference fits them as they are
    res = HierarchicalLinearModel(fit_intercept=False, standardize=False).fit(data, seed=args.seed, progress=True)
    t_fed = time.perf_counter() - t0
    print("Pooled gold standard: NUTS on all rows of the full hierarchical model ...", flush=True)
    t0 = time.perf_counter()
    ref = pooled_nuts(data, fit_intercept=False, num_warmup=500, num_samples=1000, num_chains=2, seed=args.seed)
    t_pool = time.perf_counter() - t0
    g = res.global_posterior()
    lo, hi = g.credible_interval(0.9)
    rlo, rhi = np.quantile(ref["phi"], [0.05, 0.95], axis=0)
    table = pd.DataFrame({
        "truth": np.r_[truth["mu"], truth["log_tau"]],
        "federated": g.mean, "fed 90% CI": [f"[{a:.2f}, {b:.2f}]" for a, b in zip(lo, hi)],
        "pooled": ref["phi"].mean(0), "pooled 90% CI": [f"[{a:.2f}, {b:.2f}]" for a, b in zip(rlo, rhi)],
        "|diff|/sd": np.abs(g.mean - ref["phi"].mean(0)) / ref["phi"].std(0),
        "sd ratio": g.sd / ref["phi"].std(0),
    }, index=g.names)
    with pd.option_context("display.width", 140, "display.float_format", "{:.3f}".format):
        print(table.to_string())
    c = res.communication
    print(f"Federated: {res.rounds} rounds, {t_fed:.1f} s, {c.bytes_up / 1e3:.1f} kB up, {c.bytes_down / 1e3:.1f} kB down. "
          f"Pooled NUTS: {t_pool:.1f} s.")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="fedstats", description="Federated statistics from the command line.")
    p.add_argument("--version", action="version", version=f"fedstats {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="fit a federated model to a CSV with one client per value of --by")
    f.add_argument("data", help="CSV file (separator detected)")
    f.add_argument("--by", required=True, help="column naming each row's client")
    f.add_argument("--target", help="response column (every model but gmm)")
    f.add_argument("--features", nargs="+", help="feature columns (default: all but --by and --target)")
    f.add_argument("--model", default="hm2", help=f"model: {', '.join(MODELS)} (default hm2: hierarchical "
                   "regression; lasso, ridge: Bayesian shrinkage with per-client variable selection; hm1: per-client "
                   "regressions sharing a learned covariance between clients; fgpr: federated Gaussian process regression; "
                   "gmm: Gaussian mixture with per-client weights, by FedEM; glm: generalised linear model (logistic, "
                   "Poisson, ...) by exact maximum likelihood, needs --family; bglm: the same with a prior and "
                   "posteriors; hglm: each client's own coefficients around a population, with posteriors)")
    f.add_argument("--level", type=float, default=0.95, help="credible level (default 0.95)")
    f.add_argument("--rounds", type=int, default=None,
                   help="maximum EP rounds (default 15), or the communication rounds of hm1 (default 30), "
                   "fgpr (default 100), gmm (at most; default 200), glm (IRLS iterations, at most; default 100), "
                   "bglm (EP, default 15) and hglm (EP, default 30)")
    f.add_argument("--uncertainty", action="store_true",
                   help="hm1: require the conditional posteriors (each client shares X^T X / sigma^2 once; by default "
                   "they are given whenever every client can share, else Algorithm 1's point with a warning); gmm: Wald "
                   "intervals from the observed information (each client shares a Schur complement once)")
    f.add_argument("--family", choices=("gaussian", "binomial", "poisson", "gamma", "negative_binomial"),
                   help="glm, bglm, hglm: the outcome's distribution (binomial: 0/1 rows, or successes with --trials)")
    f.add_argument("--link", choices=("identity", "log", "inverse", "logit", "probit", "cloglog"),
                   help="glm, bglm, hglm: the link (default: the family's canonical link)")
    f.add_argument("--alpha", type=float, help="glm, bglm, hglm with negative_binomial: the fixed dispersion (default 1)")
    f.add_argument("--offset", help="glm, bglm, hglm: a column added to the linear predictor (not a predictor)")
    f.add_argument("--exposure", help="glm, bglm, hglm: a column whose log is added to the linear predictor (rates)")
    f.add_argument("--weights", help="glm, bglm, hglm: a column of frequency weights")
    f.add_argument("--trials", help="glm, bglm, hglm with binomial: a column of trials (the target then counts successes)")
    f.add_argument("--robust", action="store_true", help="glm only: HC0 sandwich standard errors (one more round)")
    f.add_argument("--kernel", default="rbf", choices=("rbf", "matern"), help="fgpr only: GP kernel (default rbf)")
    f.add_argument("--ard", action="store_true", help="fgpr only: one lengthscale per feature")
    f.add_argument("--components", type=int, help="gmm only: number of mixture components")
    f.add_argument("--covariance-type", default="full", choices=("full", "tied", "diag", "spherical"),
                   help="gmm only: covariance structure (default full)")
    f.add_argument("--bayesian", action="store_true",
                   help="gmm only: variational FedEM with credible intervals for components and weights")
    f.add_argument("--no-standardize", dest="standardize", action="store_false",
                   help="hm2, lasso, ridge: fit the data in its own units (default: standardise predictors and target "
                        "with federated moments, report on the data's scale; the priors then act on the "
                        "standardised scale)")
    f.add_argument("--no-intercept", dest="intercept", action="store_false",
                   help="hm2, lasso, ridge, hm1, glm: no intercept (default: one per client; glm: one shared)")
    f.add_argument("--decimal", default=".", choices=(".", ","),
                   help="decimal separator of the CSVs (',' reads semicolon-separated files with decimal commas)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    f.add_argument("--progress", action="store_true",
                   help="a progress line per round on stderr even when it is not a terminal (default: only on a terminal)")
    f.add_argument("--output", help="write the results as JSON here")
    f.add_argument("--predict", help="CSV of rows to predict (same client and feature columns)")
    d = sub.add_parser("demo", help="simulate a federation, fit it, compare with the pooled gold standard")
    d.add_argument("--seed", type=int, default=0)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    # argparse prints usage on errors; turn its errors into our one-line form.
    parser.error = lambda msg: (_ for _ in ()).throw(CLIError(msg))  # type: ignore[method-assign]
    for sp in parser._subparsers._group_actions[0].choices.values():  # noqa: SLF001
        sp.error = parser.error
    try:
        args = parser.parse_args(argv)
        if args.command == "demo":
            _demo(args)
            return 0
        if args.quiet and args.progress:
            raise CLIError("--quiet and --progress exclude each other")
        show = args.progress or (not args.quiet and sys.stderr.isatty())
        from .federation import round_lines

        with round_lines(label=f"fedstats {args.model}") if show else contextlib.nullcontext():
            if show:
                print(f"fedstats {args.model}: reading {args.data} and fitting (the first round includes "
                      "compilation)", file=sys.stderr, flush=True)
            out = _fit(args)
        out, nonfinite = json_ready(out)
        if nonfinite and args.output:
            print(_nonfinite_warning(args.model, nonfinite), file=sys.stderr)
        if args.output:
            try:
                Path(args.output).write_text(json.dumps(out, indent=2, allow_nan=False))
            except OSError as exc:
                raise CLIError(f"cannot write {args.output}: {exc.strerror}") from None
            print(f"\nwrote {args.output}")
        return 0
    except CLIError as exc:
        print(f"fedstats: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedstats: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - no tracebacks for users; the message says what failed
        print(f"fedstats: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
