"""Pointwise log-likelihood at posterior draws, and LOO and WAIC from sums over the clients.

Leave-one-out cross-validation by Pareto-smoothed importance sampling (PSIS-LOO) and WAIC
are sums over rows: a row's term needs only that row's log-likelihood at the posterior draws
(and, for PSIS, one number shared by every row, the draws' relative efficiency). So each
client computes its own rows' terms on its own rows, and sends their sums (and sums of squares,
for the standard errors, and counts of rows whose Pareto shape or variance ArviZ would warn
about); the server adds them up. No row and no per-row value leaves a client, the sums can
travel under secure aggregation, and the answer is ``arviz.loo`` / ``arviz.waic`` on the
pooled pointwise log-likelihood of the same draws (:meth:`PointwiseLikelihood.loo`,
:meth:`~PointwiseLikelihood.waic`).

Where the caller holds the rows (in process, or a client exporting its own), the pointwise
values themselves go into the ArviZ export: ``result.to_arviz(log_likelihood=data)``, which
``arviz.loo``, ``arviz.waic`` and ``arviz.compare`` read.

Which log-likelihood: that of each row given the parameters it depends on. In the
hierarchical models (HM2, the lasso and ridge, ``HierarchicalGLM``) those are its client's
own coefficients (and noise), drawn from that client's posterior: leaving a row out of its
client (not a client out of the federation). In ``BayesianGLM`` they are the shared
coefficients.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from .. import arviz_export
from ..federation.oneshot import OneShotSums, run_once
from ..federation.protocol import Message, client_function

__all__ = ["PointwiseLikelihood", "pointwise_log_likelihood", "normal_rows", "ELPD_KEYS", "stream"]

#: what each client sends for LOO and WAIC: sums over its rows (:func:`fedstats.arviz_export.elpd_terms`)
ELPD_KEYS = ("n", "loo", "loo_sq", "lppd", "bad_k", "waic", "waic_sq", "p_waic", "high_var")
#: the draws' stream: apart from the export's posterior draws, the same in the export and in LOO
_STREAM = 7


def pointwise_log_likelihood(spec: Mapping[str, Any], X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``(draws, rows)`` log-likelihood of one client's rows ``(X, y)`` at the posterior draws
    in ``spec`` (built by the result's ``_loglik_specs``), by the model's function
    ``spec["loglik"]`` (:func:`normal_rows` for the linear models; the GLMs' in
    :mod:`fedstats.glm.sites`)."""
    return np.asarray(spec["loglik"](spec, np.asarray(X, dtype=float), np.asarray(y, dtype=float)), dtype=float)


@client_function
def normal_rows(spec: Mapping[str, Any], X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Normal rows ``y ~ N(b + X beta, sigma^2)`` at draws ``spec["coef"]`` (``(draws, p)``,
    the intercept ``b`` first when ``spec["intercept"]``) and ``spec["sigma"]`` (``(draws,)``)."""
    D = np.column_stack([np.ones(len(X)), X]) if spec["intercept"] else X
    mu = np.asarray(spec["coef"], dtype=float) @ D.T
    sigma = np.asarray(spec["sigma"], dtype=float)[:, None]
    return -0.5 * ((y - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)


@client_function
def elpd_sums(message: Message, data: Any, rng: np.random.Generator, spec: Any) -> Message:
    """A client's reply for LOO and WAIC: the sums of :func:`fedstats.arviz_export.elpd_terms`
    over its own rows at the draws it holds (``spec``), with the relative efficiency the
    server sends."""
    ll = pointwise_log_likelihood(spec, data.X, data.y)
    terms = arviz_export.elpd_terms(ll, float(np.asarray(message["reff"])[0]))
    return {k: np.array([terms[k]]) for k in ELPD_KEYS}


class _ELPDRound(OneShotSums):
    """One round in which every client answers :func:`elpd_sums` from its rows and its draws."""

    def client_step(self, message: Message, state: Any, data: Any, rng: np.random.Generator) -> tuple[Message, Any]:
        return self.client_fn(message, data, rng, state), state


class PointwiseLikelihood:
    """The pointwise log-likelihood of a Bayesian regression's rows, for ArviZ's model
    comparison: ``to_arviz(log_likelihood=data)``, and ``loo(data)`` / ``waic(data)`` from
    sums over the clients (this module's docs). A model gives ``_loglik_specs``."""

    def _loglik_specs(self, data: Any, n: int, seed: int) -> dict[Hashable, dict[str, Any]]:
        raise NotImplementedError

    def _check_data(self, data: Any) -> Any:
        from ..data import FederatedData

        if not isinstance(data, FederatedData):
            raise TypeError(f"the pointwise log-likelihood needs the fit's FederatedData, got {type(data).__name__}")
        fitted = list(self._fitted_clients())  # type: ignore[attr-defined]
        if not set(fitted) <= set(data.clients):  # clients the fit excluded may stay in the data
            raise ValueError(
                f"data's clients {list(data.clients)[:5]} are not the fit's {fitted[:5]}: pass the fit's data"
            )
        n_obs = getattr(self, "n_obs", None)
        if isinstance(n_obs, Mapping) and any(int(data.n_obs[c]) != int(n_obs[c]) for c in fitted if c in n_obs):
            raise ValueError("data's row counts differ from the fit's: pass the data the model was fitted to")
        return data

    def to_arviz(self, n: int = 4000, seed: int = 0, *, n_chains: int = 4, log_likelihood: Any = None) -> Any:
        """Every posterior of the result in one :class:`arviz.InferenceData` (see
        :meth:`fedstats.results.FederatedResult.to_arviz`); with ``log_likelihood=data`` (the
        data of the fit, held by the caller: in process, or a client's own rows) also the
        group ``log_likelihood``: variable ``y`` of shape ``(chain, draw, obs)``, each row's
        log-likelihood at ``n`` posterior draws (each client's rows at its own draws, computed
        from its own rows), observations named ``client[i]``. ``arviz.loo`` and ``arviz.waic``
        then run on it; :meth:`loo` gives the same numbers without moving any row."""
        idata = super().to_arviz(n, seed, n_chains=n_chains)  # type: ignore[misc]
        if log_likelihood is None:
            return idata
        data = self._check_data(log_likelihood)
        specs = self._loglik_specs(data, n, seed)
        parts, obs = [], []
        for c in self._fitted_clients():  # type: ignore[attr-defined]
            parts.append(pointwise_log_likelihood(specs[c], data[c].X, data[c].y))
            obs += [f"{c}[{i}]" for i in range(parts[-1].shape[1])]
        ll = np.concatenate(parts, axis=1).reshape(n_chains, n // n_chains, -1)
        return arviz_export.add_log_likelihood(idata, ll, obs)

    def _elpd(self, data: Any, n: int, seed: int, n_chains: int, kind: str) -> Any:
        data = self._check_data(data)
        reff = arviz_export.relative_efficiency(super().to_arviz(n, seed, n_chains=n_chains))  # type: ignore[misc]
        specs = self._loglik_specs(data, n, seed)
        algo = _ELPDRound(ELPD_KEYS, ELPD_KEYS, {"reff": np.array([reff])}, elpd_sums, private=specs)
        replies, _ = run_once(algo, data.subset(list(specs)), seed=seed, what="the LOO and WAIC sums")
        sums = {k: float(np.asarray(replies.sums[k])[0]) for k in ELPD_KEYS}
        return arviz_export.elpd_data(sums, n, kind)

    def loo(self, data: Any, n: int = 4000, seed: int = 0, *, n_chains: int = 4) -> Any:
        """PSIS leave-one-out cross-validation (``elpd_loo``, its ``se``, ``p_loo``), as
        ``arviz.loo`` returns it (without pointwise values), from one counted round in which
        every client sends sums over its own rows (this module's docs): equal to ``arviz.loo``
        on ``to_arviz(n, seed, n_chains=n_chains, log_likelihood=data)``. ``warning`` is True
        when a row's Pareto shape exceeds ArviZ's threshold (a count per client is summed)."""
        return self._elpd(data, n, seed, n_chains, "loo")

    def waic(self, data: Any, n: int = 4000, seed: int = 0, *, n_chains: int = 4) -> Any:
        """WAIC (``elpd_waic``, its ``se``, ``p_waic``) from the same round as :meth:`loo`:
        equal to ``arviz.waic`` on the export with ``log_likelihood=data``."""
        return self._elpd(data, n, seed, n_chains, "waic")


def stream(seed: int, *index: int) -> np.random.Generator:
    """The generator of the draws at which the log-likelihood is evaluated: the same in the
    export and in :meth:`PointwiseLikelihood.loo` (``index``: the client's position)."""
    return np.random.default_rng([seed, _STREAM, *index])
