"""``fedstats fit``: one path for every model, on top of the result contract."""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CLIError
from .inputs import check_columns, client_key, data_columns, data_from, read_csv, read_test
from .models import command as declared_command
from .output import communication, json_ready, nonfinite_warning, print_predictions, print_tables, records


def command(args) -> None:
    """Fit, print the tables and write ``--output``; the per-round lines on stderr where shown."""
    if args.quiet and args.progress:
        raise CLIError("--quiet and --progress exclude each other")
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise CLIError(f"--plot writes .png, .svg or .pdf, got {args.plot}")
    show = args.progress or (not args.quiet and sys.stderr.isatty())
    from ..federation import round_lines

    with round_lines(label=f"fedstats {args.model}") if show else contextlib.nullcontext():
        if show:
            print(
                f"fedstats {args.model}: reading {args.data} and fitting (the first round includes compilation)",
                file=sys.stderr,
                flush=True,
            )
        out = fit(args)
    out, nonfinite = json_ready(out)
    if nonfinite and args.output:
        print(nonfinite_warning(nonfinite, out.get("components") is not None), file=sys.stderr)
    if args.predict and not args.output:  # the predictions are printed, not discarded
        print_predictions(out["predictions"], args)
    if args.output:
        try:
            Path(args.output).write_text(json.dumps(out, indent=2, allow_nan=False))
        except OSError as exc:
            raise CLIError(f"cannot write {args.output}: {exc.strerror}") from None
        print(f"\nwrote {args.output}")


def progress(args):
    """The ``progress`` argument of a fit: ``False`` under ``--quiet`` (no tqdm bar even on a
    terminal), else ``None``: per-round lines where :func:`main` opened ``round_lines``."""
    return False if args.quiet else None


def fit(args) -> dict:
    from ..data import DataError

    cmd = declared_command(args)
    df = read_csv(args.data, args.decimal)
    check_columns(df, data_columns(df, args), args.target, args.by, args.data)
    data = data_from(
        df,
        args.by,
        args.target,
        args.features,
        path=args.data,
        min_rows=args.min_rows,
        min_cell_count=args.min_cell_count,
    )
    if data.n_clients < cmd.min_clients:
        raise CLIError(f"--model {args.model} needs at least {cmd.min_clients} clients, got {data.n_clients}")
    # schema errors of the prediction file come before the fit
    test = read_test(args, df, data, cmd.new_clients) if args.predict else None
    scaler, fit_data = None, data
    if cmd.scale_inputs:  # federated moments: every client uses the same input scale
        fit_data, scaler = data.standardize()
    model, options = cmd.build(args)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = model.fit(fit_data, seed=args.seed, progress=progress(args), **options)
        except DataError as exc:  # the data, not the program: one line naming the column and client
            raise CLIError(f"{args.data}: {exc}") from None
        except Exception as exc:  # the model may say in one line what went wrong
            why = cmd.explain(exc) if cmd.explain is not None else None
            if why is None:
                raise
            raise CLIError(why) from None
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
        "clients": [client_key(c) for c in data.clients],
        "n_obs": {client_key(c): int(data.n_obs[c]) for c in data.clients},
        "global": records(g),
        "client": {client_key(c): records(t) for c, t in tables.items()},
        "rounds": res.rounds,
        "converged": None if res.converged is None else bool(res.converged),
        "communication": communication(res),
        "runtime_s": round(runtime, 3),
        **(cmd.extras(args, res, data, scaler) if cmd.extras is not None else {}),
    }
    if cmd.standard_errors:  # the frequentist names beside the contract's: se is sd, the standard error
        out["global"] = [{**r, "se": r["sd"]} for r in out["global"]]
    if test is not None:
        tdf, X = test
        out["predictions"] = predict(res, data, tdf, X if scaler is None else scaler.transform_X(X), args)
    notes = cmd.notes(args, res) if cmd.notes is not None else []
    print_tables(g, tables, res, args, [cmd.header(args, res, runtime), *notes])
    if args.plot:  # in the data's units; the model's inputs through the scaler it was fitted with
        write_plot(res, data, args.plot, None if scaler is None else scaler.transform_X)
    return out


def write_plot(res, data, path: str, transform=None) -> None:
    """``fedstats.plots.plot`` of the fit, written to ``path``."""
    from ..plots import plot

    fig = plot(res, data, transform=transform)
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror}") from None
    print(f"\nwrote plot {path}")


def predict(res, data, test: pd.DataFrame, X: np.ndarray, args) -> list[dict]:
    """One record per row of ``test``, in its order. Regressions: the columns of the result's
    ``predict``, with the same names and meanings as in Python: ``mean``, ``lower``/``upper``
    (credible band of the mean), ``pred_lower``/``pred_upper`` (predictive band of a new
    observation), then the model's own columns. Mixtures (scikit-learn's meaning of predict):
    the most probable ``component``, ``proba`` and ``logdensity``. Every record says
    ``new_client``; a client that is not in the fit gets ``null`` numbers and ``excluded``, the
    reason."""
    from ..results import PREDICT_COLUMNS

    ids = test[args.by]
    # Ids are matched as text, so 3, 3.0 and "3" name the same client whatever the column types.
    known = {client_key(c): c for c in data.clients}
    keys = np.array([client_key(v) for v in ids])
    rows: list[dict] = [{} for _ in range(len(test))]
    mixture = hasattr(res, "predict_proba")
    seed = {"seed": args.seed} if "seed" in inspect.signature(res.predict).parameters else {}
    excluded = {client_key(c): why for c, why in (res.excluded or {}).items()}
    for key in pd.unique(keys):
        idx = np.flatnonzero(keys == key)
        client = known.get(key)
        if key in excluded:  # no numbers for a client that is not in the fit, and why
            for i in idx:
                rows[i] = {"client": key, "excluded": excluded[key], "new_client": False}
            continue
        if mixture:  # an unseen client: its weights from its own rows, the components frozen
            kw = {"client": client} if client is not None else {"weights": res.new_client_weights(X[idx])}
            for i, p_, l_ in zip(idx, res.predict_proba(X[idx], **kw), res.score_samples(X[idx], **kw)):
                rows[i] = {
                    "client": key,
                    "component": int(np.argmax(p_)),
                    "proba": [float(v) for v in p_],
                    "logdensity": float(l_),
                    "new_client": client is None,
                }
            continue
        if getattr(res, "roles", None) is not None:  # a GLM: the offset and exposure columns are not predictors
            names = list(data.feature_names)
            kw = {r: X[idx, names.index(res.roles[r])] for r in ("offset", "exposure") if res.roles.get(r)}
            p = res.predict(
                X[idx][:, [names.index(c) for c in res.predictors]], client=client, level=args.level, **kw, **seed
            )
        else:
            p = res.predict(X[idx], client=client, level=args.level, **seed)
        extra = [c for c in p.columns if c not in PREDICT_COLUMNS]
        for i, (_, r) in zip(idx, p.iterrows()):
            rows[i] = {
                "client": key,
                **{c: r[c] for c in PREDICT_COLUMNS},
                **{c: r[c] for c in extra},
                "new_client": client is None,
            }
            rows[i] = {
                k: ((None if np.isnan(v) else float(v)) if isinstance(v, (float, np.floating)) else v)
                for k, v in rows[i].items()
            }  # NaN: no band (HM1 without uncertainty)
    new = sorted({k for k in keys if k not in known})
    if new:
        how = "their weights fitted on their own rows, the components frozen" if mixture else "from the population"
        print(
            f"note: {len(new)} client(s) of {args.predict} took no part in the fit ({', '.join(new[:5])}): predicted "
            f"as new clients, {how} (new_client: true)",
            file=sys.stderr,
        )
    return rows
