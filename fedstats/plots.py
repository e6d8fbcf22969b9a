"""Plots of fitted models: each function takes a result (and, where a plot shows data, the
rows the caller holds) and returns a :class:`matplotlib.figure.Figure`.

* :func:`forest`: every client's estimate with its interval, and the population's, per
  parameter (every regression model);
* :func:`densities`: the posterior densities of the parameters every client shares;
* :func:`predictive_band`: the mean with its credible band and the predictive band of a new
  observation along one input (FGPR, the multi-fidelity chains, and any model with ``predict``);
* :func:`mixture`: rows coloured by component, with each component's 2-sd ellipse (the
  Gaussian mixtures);
* :func:`regret`: regret curves (:func:`fedstats.experiments.regret.simulate`, FEM-OMD);
* :func:`convergence`: the model's own per-round quantities over the rounds (every iterative
  model);
* :func:`plot`: the plot that suits a result (what ``fedstats fit --plot FILE`` writes).

matplotlib is imported when a function is called (the ``plots`` extra: ``pip install -e
".[plots]"``). Nothing here reads a client's rows unless the caller passes them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["forest", "densities", "predictive_band", "mixture", "regret", "convergence", "plot"]

#: the runtime's own per-round columns (the rest of a history's numbers are the model's)
_RUNTIME_COLUMNS = {"n_participants", "n_answered", "n_failed", "n_skipped", "bytes_up", "bytes_down", "seconds"}


def _figure(n_panels: int, *, width: float = 4.0, height: float = 3.0, cols: int = 3) -> tuple[Figure, list[Any]]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "fedstats.plots needs matplotlib: pip install -e '.[plots]' (or pip install matplotlib)"
        ) from None

    cols = max(1, min(cols, n_panels))
    rows = -(-n_panels // cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    return fig, axes


def _as_list(x: str | Sequence[str] | None) -> list[str] | None:
    return [x] if isinstance(x, str) else (None if x is None else list(x))


def forest(result: Any, parameters: str | Sequence[str] | None = None, level: float = 0.95) -> Figure:
    """Each client's estimate of each parameter with its ``level`` interval, one panel per
    parameter, and the population's (its mean ``mu[p]`` where the model has one, or the
    shared parameter ``p`` itself) as a diamond below the clients. A client that is not in the
    fit is listed with no interval; a model without per-client parameters (the exact GLM)
    shows its shared ones. ``parameters``: which (default: every client parameter, or every
    shared one)."""
    clients = result.client_summary(level)
    glob = result.summary(level)
    per_client = len(clients) > 0
    names = list(dict.fromkeys(clients["parameter"])) if per_client else list(glob.index)
    chosen = _as_list(parameters) or names
    unknown = [p for p in chosen if p not in names]
    if unknown:
        raise ValueError(f"no parameter(s) {unknown} to plot; the parameters are {names}")
    kind = "posterior mean" if getattr(result, "_estimates", lambda: "")() == "posterior" else "estimate"
    fig, axes = _figure(len(chosen), height=0.35 * (clients["client"].nunique() + 3) if per_client else 3.0)
    for ax, p in zip(axes, chosen, strict=True):
        rows = clients[clients["parameter"] == p] if per_client else pd.DataFrame()
        labels = [str(c) for c in rows.get("client", [])]
        means = list(rows.get("mean", []))
        lows, highs = list(rows.get("lower", [])), list(rows.get("upper", []))
        pop = f"mu[{p}]" if f"mu[{p}]" in glob.index else (p if p in glob.index else None)
        y = np.arange(len(labels))[::-1] + 1.0
        if len(labels):
            ax.hlines(y, lows, highs, color="C0", lw=1.5)
            ax.plot(means, y, "o", color="C0", label="client")
        if pop is not None:
            r = glob.loc[pop]
            ax.hlines(0.0, r["lower"], r["upper"], color="C3", lw=2.5)
            ax.plot([r["mean"]], [0.0], "D", color="C3", ms=7, label="population" if per_client else "estimate")
            labels.append(pop if per_client else p)
            y = np.r_[y, 0.0]
        ax.set_yticks(y, labels)
        shown = np.asarray([*lows, *highs, *means] + ([] if pop is None else list(glob.loc[pop, ["lower", "upper"]])))
        shown = shown[np.isfinite(shown)]
        if len(shown) and shown.min() - 0.1 * np.ptp(shown) <= 0.0 <= shown.max() + 0.1 * np.ptp(shown):
            ax.axvline(0.0, color="0.6", lw=0.8, ls=":")  # 0 where it is in view, not squashing the rest
        ax.set_title(p)
        ax.set_xlabel(f"{kind}, {100 * level:g}% interval")
    return fig


def densities(result: Any, parameters: str | Sequence[str] | None = None, level: float = 0.95) -> Figure:
    """The posterior density of each parameter every client shares (the population's, in the
    hierarchical models), one panel each, with its ``level`` equal-tailed interval shaded: the
    exact curve of a Gaussian posterior, a histogram of a sampled one."""
    from scipy import stats

    post = result.global_posterior()
    names = list(post.names)
    chosen = _as_list(parameters) or names
    unknown = [p for p in chosen if p not in names]
    if unknown:
        raise ValueError(f"no shared parameter(s) {unknown}; the posterior's are {names}")
    lo, hi = post.credible_interval(level)
    fig, axes = _figure(len(chosen))
    draws = post.sample(4000, seed=0) if hasattr(post, "draws") else None  # a sampled posterior
    for ax, p in zip(axes, chosen, strict=True):
        j = names.index(p)
        if draws is None:
            m, s = float(post.mean[j]), float(np.sqrt(post.cov[j, j]))
            x = np.linspace(m - 4 * s, m + 4 * s, 300)
            ax.plot(x, stats.norm.pdf(x, m, s), color="C0")
            inside = (x >= lo[j]) & (x <= hi[j])
            ax.fill_between(x[inside], stats.norm.pdf(x[inside], m, s), color="C0", alpha=0.3)
        else:
            ax.hist(draws[:, j], bins=60, density=True, color="C0", alpha=0.6)
            ax.axvspan(lo[j], hi[j], color="C0", alpha=0.15)
        ax.set_title(p)
        ax.set_yticks([])
    return fig


def predictive_band(
    result: Any,
    X: Any,
    *,
    client: Hashable | None = None,
    feature: int | str = 0,
    level: float = 0.95,
    data: tuple[Any, Any] | None = None,
    transform: Any = None,
    names: Sequence[str] | None = None,
    **predict_options: Any,
) -> Figure:
    """The prediction at the rows ``X`` along one input (``feature``, a position or a column
    name of a data frame): the mean, its ``level`` credible band and the predictive band of a
    new observation, for ``client`` (FGPR: the client's personal predictor; the multi-fidelity
    chains: the highest fidelity). ``data=(X_k, y_k)`` adds the client's own points;
    ``transform`` maps ``X`` to the inputs the model was fitted on (a scaler's
    ``transform_X``), the axis staying in ``X``'s units; ``names`` names the inputs."""
    kwargs = dict(predict_options, level=level)
    if client is not None:
        kwargs["client"] = client
    pred = result.predict(X if transform is None else transform(X), **kwargs)
    rows = np.asarray(X.to_numpy() if isinstance(X, pd.DataFrame) else X, dtype=float)
    rows = rows[:, None] if rows.ndim == 1 else rows
    j = list(X.columns).index(feature) if isinstance(feature, str) and isinstance(X, pd.DataFrame) else int(feature)
    order = np.argsort(rows[:, j])
    x = rows[order, j]
    fig, (ax,) = _figure(1, width=6.0, height=4.0)
    bands = [("lower", "upper", 0.35, "band of the mean")]
    if {"pred_lower", "pred_upper"} <= set(pred.columns) and pred["pred_lower"].notna().all():
        bands.insert(0, ("pred_lower", "pred_upper", 0.15, "predictive band"))
    for lo, hi, alpha, what in bands:
        ax.fill_between(
            x,
            pred[lo].to_numpy()[order],
            pred[hi].to_numpy()[order],
            color="C0",
            alpha=alpha,
            label=f"{100 * level:g}% {what}",
        )
    ax.plot(x, pred["mean"].to_numpy()[order], color="C0", label="mean")
    if data is not None:
        Xd = np.asarray(data[0], dtype=float)
        Xd = Xd[:, None] if Xd.ndim == 1 else Xd
        ax.plot(Xd[:, j], np.asarray(data[1], dtype=float), "k.", ms=4, label="observed")
    if isinstance(X, pd.DataFrame):
        names = [str(c) for c in X.columns]
    ax.set_xlabel(names[j] if names is not None and len(names) > j else f"x{j}")
    ax.set_title("prediction" + ("" if client is None else f" for client {client!r}"))
    ax.legend(loc="best", fontsize="small")
    return fig


def mixture(result: Any, X: Any, *, client: Hashable | None = None, features: tuple[int, int] = (0, 1)) -> Figure:
    """Rows ``X`` (the caller's: a client's own, say) coloured by their most likely component
    under ``client``'s weights (or the components alone), with each component's mean and the
    ellipse of 2 sds of its covariance, projected on two ``features`` (positions)."""
    from matplotlib.patches import Ellipse

    rows = np.asarray(X.to_numpy() if isinstance(X, pd.DataFrame) else X, dtype=float)
    a, b = features
    means = np.asarray(result.means, dtype=float)
    covs = _full_covariances(result, means.shape)
    fig, (ax,) = _figure(1, width=6.0, height=5.0)
    label = result.predict(rows, client=client) if client is not None else _nearest(result, rows)
    ax.scatter(rows[:, a], rows[:, b], c=[f"C{k % 10}" for k in label], s=8, alpha=0.5)
    weights = result.weights[client] if client is not None else None
    for k in range(len(means)):
        C = covs[k][np.ix_([a, b], [a, b])]
        vals, vecs = np.linalg.eigh(C)
        angle = float(np.degrees(np.arctan2(vecs[1, 1], vecs[0, 1])))
        w, h = 4 * np.sqrt(np.maximum(vals[::-1], 0.0))
        ax.add_patch(Ellipse((means[k, a], means[k, b]), w, h, angle=angle, fill=False, color=f"C{k % 10}", lw=2))
        tag = f"component {k}" + ("" if weights is None else f" (weight {float(np.asarray(weights)[k]):.2f})")
        ax.plot(means[k, a], means[k, b], "x", color=f"C{k % 10}", ms=10, mew=2, label=tag)
    names = list(getattr(result, "feature_names", []) or [])
    ax.set_xlabel(names[a] if len(names) > a else f"x{a}")
    ax.set_ylabel(names[b] if len(names) > b else f"x{b}")
    ax.legend(loc="best", fontsize="small")
    return fig


def _full_covariances(result: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Every component's ``d x d`` covariance, whatever the fit's covariance type."""
    M, d = shape
    c = np.asarray(result.covariances, dtype=float)
    if c.ndim == 3:
        return c
    if c.ndim == 2 and c.shape == (d, d):  # tied
        return np.broadcast_to(c, (M, d, d))
    if c.ndim == 2:  # diagonal
        return np.stack([np.diag(v) for v in c])
    return np.stack([np.eye(d) * v for v in c])  # spherical


def _nearest(result: Any, rows: np.ndarray) -> np.ndarray:
    d = ((rows[:, None, :] - np.asarray(result.means)[None]) ** 2).sum(-1)
    return np.argmin(d, axis=1)


def regret(curves: pd.DataFrame, *, log: bool = True) -> Figure:
    """Regret against time, one line per learner (``curves``: the long table of
    :func:`fedstats.experiments.regret.simulate`, columns ``learner``, ``t``, ``regret``), on
    log-log axes by default, with the linear reference ``R_t ∝ t`` through the last point of
    the first learner."""
    missing = {"learner", "t", "regret"} - set(curves.columns)
    if missing:
        raise ValueError(f"curves need the columns learner, t, regret (simulate's output); missing {sorted(missing)}")
    fig, (ax,) = _figure(1, width=6.0, height=4.0)
    for name, c in curves.groupby("learner", sort=False):
        ax.plot(c["t"], np.maximum(c["regret"], 1e-12) if log else c["regret"], marker=".", label=str(name))
    first = curves[curves["learner"] == curves["learner"].iloc[0]]
    t_end, r_end = float(first["t"].iloc[-1]), float(first["regret"].iloc[-1])
    if r_end > 0:
        t = np.asarray(first["t"], dtype=float)
        ax.plot(t, r_end * t / t_end, color="0.6", ls="--", label="linear growth")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("time step t")
    ax.set_ylabel("regret R_t")
    ax.legend(loc="best", fontsize="small")
    return fig


def convergence(result: Any) -> Figure:
    """The model's own per-round quantities (the numbers of ``result.history`` that are not the
    runtime's counts: EP's changes in posterior sds, the deviance, the log-likelihood, FGPR's
    hyperparameters, ...), one panel each, against the round."""
    h = result.history.to_dataframe()
    cols = [c for c in h.select_dtypes("number").columns if c not in _RUNTIME_COLUMNS and not c.startswith("metric:")]
    cols = [c for c in cols if h[c].notna().any()]
    if not cols:
        raise ValueError(f"{type(result).__name__}'s history has no per-round quantity to plot")
    fig, axes = _figure(len(cols), width=3.6, height=2.8)
    rounds = np.asarray(h.index, dtype=float) + 1
    for ax, c in zip(axes, cols, strict=True):
        ax.plot(rounds, h[c].to_numpy(dtype=float), marker=".")
        ax.set_title(c)
        ax.set_xlabel("round")
    fig.suptitle(f"{type(result).__name__}: {len(h)} rounds" + (", converged" if result.converged else ""))
    return fig


def plot(result: Any, data: Any = None, client: Hashable | None = None, transform: Any = None) -> Figure:
    """The plot that suits ``result``: a mixture's components over ``data``'s rows of
    ``client`` (default: the first); a Gaussian process's predictive band along its first
    input for ``client`` over the range of its rows (the other inputs at the client's means);
    otherwise a forest plot of the estimates (every regression), or the convergence trace.
    ``data``: the fit's :class:`~fedstats.data.FederatedData`, where the plot shows rows
    (``transform``: what maps its inputs to the model's, as in :func:`predictive_band`)."""
    if hasattr(result, "means") and hasattr(result, "covariances"):
        if data is None:
            raise ValueError("a mixture's plot shows rows: pass the data")
        c = data.clients[0] if client is None else client
        X = data[c].X if transform is None else transform(data[c].X)
        return mixture(result, X, client=c if c in list(result.weights) else None)
    if hasattr(result, "hyperparameters") and data is not None:
        c = data.clients[0] if client is None else client
        X = np.asarray(data[c].X, dtype=float)
        grid = np.repeat(X.mean(axis=0, keepdims=True), 200, axis=0)
        grid[:, 0] = np.linspace(X[:, 0].min(), X[:, 0].max(), 200)
        fig = predictive_band(
            result, grid, client=c, data=(X, data[c].y), transform=transform, names=list(data.feature_names)
        )
        fig.axes[0].set_title(f"prediction for client {c!r}, the other inputs at its means")
        return fig
    if len(result.client_summary()) or len(result.summary()):
        return forest(result)
    return convergence(result)  # no parameters to show (Separate, Ditto): the rounds
