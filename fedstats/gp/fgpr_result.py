"""The result of an FGPR fit (:class:`FGPRResult`): the shared hyperparameters, each client's
personal predictions from its own rows, and the federated objective."""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike

from .. import streams
from ..data import DataError, FederatedData
from ..federation import Communication, History
from ..inference.gaussian import is_pd
from ..inference.posterior import GaussianPosterior
from ..inference.posterior.tables import log_scale_rows
from ..result_file import register
from ..results import FederatedResult, NoPosteriorError, UnknownClientError, check_level
from ._core import HyperSpec, band_frame, mixture, posterior, resolve_device, resolve_dtype, single_model
from .fgpr_algorithm import standardize_y
from .laplace import from_theta, newton_sds, theta_names, to_theta

if TYPE_CHECKING:  # the optional extra fedstats[bo]
    from botorch.models import SingleTaskGP

# --------------------------------------------------------------------------- the result


@register
class FGPRResult(FederatedResult):
    """A fitted FGPR: the shared hyperparameters, and personal predictions.

    ``hyperparameters`` maps names to constrained values (``noise`` and ``outputscale`` are
    variances, on the standardised scale when ``standardize=True``). ``predict`` conditions
    the shared prior on one client's own data; in this in-process simulation the result
    keeps a reference to the training data for that (a real deployment predicts on the
    client). :meth:`save` writes the hyperparameters and history only, never data.

    ``laplace`` holds the summed ``gradient`` and ``hessian`` of the clients' negative log
    marginal likelihoods at the fit, in ``theta`` (:mod:`fedstats.gp.laplace`), or a sentence
    saying why there are none; from it :meth:`global_posterior` (the Laplace approximation on
    the log scale), :meth:`summary`'s sds and intervals, and ``predict(hyper_draws=S)``.
    """

    def _estimates(self) -> str:
        # the hyperparameters' Laplace approximation (flat prior) where the fit has one
        return "posterior" if isinstance(self.laplace, dict) else "estimate"

    _transient = {"_data": None}  # the training data of an in-process fit: never written
    laplace: dict[str, np.ndarray] | str | None = None  # None: a result saved before it existed

    def __init__(
        self,
        *,
        spec: HyperSpec,
        hyperparameters: Mapping[str, ArrayLike],
        feature_names: Sequence[str],
        clients: Sequence[Hashable],
        n_obs: Mapping[Hashable, int],
        options: dict[str, Any],
        history: History | None = None,
        communication: Communication | None = None,
        converged: bool | None = False,
        seconds: float = 0.0,
        seed: int = 0,
        data: FederatedData | None = None,
        laplace: Mapping[str, ArrayLike] | str | None = None,
    ) -> None:
        self.laplace = (
            laplace
            if laplace is None or isinstance(laplace, str)
            else {k: np.asarray(v, dtype=float) for k, v in laplace.items()}
        )
        self.spec, self.hyperparameters = spec, {k: np.asarray(v, dtype=float) for k, v in hyperparameters.items()}
        self.feature_names, self.clients, self.n_obs = list(feature_names), list(clients), dict(n_obs)
        self.options, self.history, self.communication = options, history, communication
        self.seconds, self.seed = seconds, seed
        #: whether the hyperparameters are at the likelihood's maximum (within 1 posterior sd, from
        #: the clients' summed curvature); None where there is none to tell (``laplace`` off)
        self.converged = None if converged is None else bool(converged)
        self._data = data

    model = "FGPR"

    @property
    def rounds(self) -> int:
        return 0 if self.history is None else len(self.history)

    def global_posterior(self) -> GaussianPosterior:
        """The Laplace approximation of the shared hyperparameters' posterior (flat prior on
        ``theta``): ``N(theta_hat, H^{-1})`` over ``log_lengthscale``..., ``log_outputscale``,
        ``log_noise`` (and ``mean``), ``H`` the summed Hessian of the clients' negative log
        marginal likelihoods at the fit. :class:`NoPosteriorError` where the fit has none."""
        cov = np.linalg.inv(self._hessian())
        names = theta_names(self.spec, self.feature_names)
        return GaussianPosterior(to_theta(self.spec, self.hyperparameters), 0.5 * (cov + cov.T), names=names)

    def _hessian(self) -> np.ndarray:
        if not isinstance(self.laplace, dict):
            raise NoPosteriorError(self._no_posterior("global"))
        H = np.asarray(self.laplace["hessian"], dtype=float)
        if not is_pd(H):
            raise NoPosteriorError(
                "the summed Hessian of the clients' negative log marginal likelihoods is not positive definite at "
                "the fitted hyperparameters (not a maximum: more rounds?), so FGPR has no Laplace approximation"
            )
        return H

    def newton_step(self) -> pd.Series:
        """How far one Newton step ``-H^{-1} g`` from the fitted ``theta`` would move each
        component, in posterior sds: near 0 when the rounds reached the maximum of the
        likelihood; beyond about 1 the intervals are centred off the maximum."""
        self._hessian()  # NoPosteriorError where there is no approximation
        return pd.Series(newton_sds(self.laplace), index=theta_names(self.spec, self.feature_names))  # type: ignore[arg-type]

    def _global_table(self, level: float, kind: str) -> pd.DataFrame:
        """One row per hyperparameter scalar (``lengthscale[x0]``... under ARD), on its natural
        scale: from the Laplace approximation (log-normal mean and sd, interval mapped from the
        log scale; the constant mean normal) where the fit has one, else the estimate only (NaN
        sd and interval); ``estimate`` is the fitted (maximum-likelihood) value. The positive
        hyperparameters' intervals are equal-tailed whatever ``kind`` (it applies to the mean's)."""
        labels = self.spec.labels(self.feature_names)
        vals = np.concatenate([self.hyperparameters[n] for n in self.spec.names])
        try:
            g = self.global_posterior()
        except NoPosteriorError:
            return pd.DataFrame({"mean": vals, "estimate": vals}, index=pd.Index(labels, name="parameter"))
        rows = log_scale_rows(g, "log_", level, "")
        if "mean" in g.names:
            rows = pd.concat([rows, g.marginal(["mean"]).summary(level=level, kind=kind)])
        return rows.loc[labels].assign(estimate=vals).rename_axis("parameter")

    def _client_table(self, client: Hashable, level: float, kind: str) -> pd.DataFrame:
        # FGPR's parameters are all shared: a client has none of its own
        return pd.DataFrame(index=pd.Index([], name="parameter", dtype=object))

    def _no_posterior(self, what: str) -> str:
        if what != "global":
            return (
                "FGPR's clients have no parameters of their own; its predictions carry credible and predictive "
                "bands: predict(X, client)"
            )
        if isinstance(self.laplace, str):
            return f"this FGPR fit has no Laplace approximation of its hyperparameters: {self.laplace}"
        return (
            "this FGPR result has no Laplace approximation of its hyperparameters (saved before FGPR computed one: "
            "fit it again)"
        )

    def _device(self) -> torch.device:
        # a result fitted on a GPU still predicts on a machine without one
        try:
            return resolve_device(self.options.get("device", "auto"))
        except ValueError:
            return torch.device("cpu")

    def _client_data(
        self, client: Hashable | None, data: tuple[ArrayLike, ArrayLike] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if data is not None:
            if isinstance(data, tuple) and len(data) == 2:
                X, y = data
                X = np.asarray(X, dtype=float)
                X = X[:, None] if X.ndim == 1 else X
                y = np.asarray(y, dtype=float).reshape(-1)
                if X.ndim != 2 or X.shape[1] != self.spec.d or len(y) != len(X) or len(y) < 1:
                    raise DataError(
                        f"data must be (X, y) with X of shape (n, {self.spec.d}) and n >= 1 targets, "
                        f"got X {X.shape} and y {y.shape}"
                    )
                if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
                    raise DataError("data (X, y) contains NaN or inf")
                return X, y
            raise TypeError("data must be a tuple (X, y) of the client's own points")
        if client is None:
            raise ValueError(
                "FGPR predicts for a client from that client's data: give a fitted client, or the new "
                "client's own points as data=(X, y)"
            )
        if client in (self.excluded or {}):
            self._check_client(client)  # not in the fit: refused with the reason
        if client not in self.clients:
            raise UnknownClientError(
                f"unknown client {client!r}: the fit has not seen it; pass its own data as "
                "data=(X, y) to predict for a new client"
            )
        if self._data is None:
            raise ValueError("this result holds no client data (loaded from disk?): pass data=(X, y)")
        cd = self._data[client]
        return np.asarray(cd.X), np.asarray(cd.y)

    def predict(
        self,
        X: ArrayLike,
        client: Hashable | None = None,
        *,
        data: tuple[ArrayLike, ArrayLike] | None = None,
        level: float = 0.95,
        scale: str = "original",
        seed: int = 0,
        progress: bool | None = None,
        hyper_draws: int = 0,
    ) -> pd.DataFrame:
        """Personal prediction of ``client`` at the rows of ``X``.

        The shared prior is conditioned on the client's own training data, or on ``data``
        = (X_k, y_k) for a client that took no part in training (no training happens). Returns
        ``mean``, ``lower``/``upper`` (credible interval of f), ``pred_lower``/``pred_upper``
        (predictive interval of a new noisy y), then ``sd`` (of f) and ``pred_sd``
        (``attrs["predicted_for"]`` is ``"new client"`` when ``data`` is given). With
        ``standardize=True`` the targets are standardised by the client's own mean and sd
        and the results mapped back (``scale="original"``) or left standardised
        (``scale="standardized"``, the multi-fidelity metric's scale).

        All of the client's rows are used, by the exact (Cholesky) formulas at every size:
        above 4,096 rows the factor is computed and held in tiles, half of the dense matrix
        (about 2 GB at 20,000 rows; the host memory is checked first), with a progress bar
        (``progress``: True, False, or None for "when stderr is a terminal"). Only when the
        fit's ``condition_limit`` is set (an opt-in, also kept by results saved with it,
        including those of versions whose default was 2000) does a larger client condition on
        a random subset of that size drawn with ``seed``, with a warning.

        ``hyper_draws=S > 0`` adds the hyperparameters' uncertainty: the prediction is the
        mixture over ``S`` draws (seeded by ``seed``) from their Laplace approximation
        (:meth:`global_posterior`), one exact conditioning per draw; its mean and variance
        (``mean_s m_s``, ``mean_s v_s + var_s m_s``) give the columns, with normal bands. 0
        (default) plugs in the fitted hyperparameters.
        """
        level = check_level(level)
        if scale not in ("original", "standardized"):
            raise ValueError(f"scale must be 'original' or 'standardized', got {scale!r}")
        Xk, yk = self._client_data(client, data)
        Xs = np.asarray(self._feature_rows(X, self.feature_names), dtype=float)
        Xs = Xs[:, None] if Xs.ndim == 1 else Xs
        if Xs.ndim != 2 or Xs.shape[1] != self.spec.d or len(Xs) == 0:
            raise DataError(f"X must have at least one row and {self.spec.d} column(s), got shape {Xs.shape}")
        if not np.all(np.isfinite(Xs)):
            raise DataError("X contains NaN or inf")
        if len(yk) < 5:
            warnings.warn(
                f"conditioning on only {len(yk)} point(s): the prediction is close to the prior",
                UserWarning,
                stacklevel=2,
            )
        if not isinstance(hyper_draws, (int, np.integer)) or isinstance(hyper_draws, bool) or hyper_draws < 0:
            raise ValueError(f"hyper_draws must be an int >= 0, got {hyper_draws!r}")
        hypers = [self.hyperparameters]
        if hyper_draws:
            draws = self.global_posterior().sample(int(hyper_draws), seed=streams.stream(seed, "hyper draws"))
            hypers = [from_theta(self.spec, t) for t in draws]
        Xk, yk, mu_y, sd_y = self._conditioning(Xk, yk, seed)
        dtype = resolve_dtype(self.options.get("dtype", "float64"))
        paths = [
            posterior(self.spec, h, Xk, yk, Xs, device=self._device(), dtype=dtype, progress=progress) for h in hypers
        ]
        means, var = np.array([m for m, _ in paths]), np.array([v for _, v in paths])
        noise = np.array([float(h["noise"][0]) for h in hypers])[:, None]
        mean, var_f = mixture((means, var))
        var_y = mixture((means, var + noise))[1]
        if scale == "original":
            mean, var_f, var_y = mu_y + sd_y * mean, var_f * sd_y**2, var_y * sd_y**2
        out = band_frame(mean, var_f, level, var_y)
        out.attrs["predicted_for"] = "client" if data is None else "new client"
        return out

    def _conditioning(self, Xk: np.ndarray, yk: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, float, float]:
        """The rows a client's predictions condition on (standardised when the fit standardised,
        with the mean and sd that map back; a random subset of ``condition_limit`` rows only
        when that opt-in is set and exceeded, with a warning)."""
        mu_y, sd_y = 0.0, 1.0
        if self.options.get("standardize", True):
            yk, mu_y, sd_y = standardize_y(yk)
        limit = self.options.get("condition_limit")
        if limit is not None and len(yk) > limit:
            warnings.warn(
                f"client has {len(yk)} points; conditioning on a random subset of {limit} "
                f"(condition_limit, an opt-in; set it to None to use all rows) instead of the exact formula",
                UserWarning,
                stacklevel=3,
            )
            keep = np.sort(np.random.default_rng(seed).choice(len(yk), size=limit, replace=False))
            Xk, yk = Xk[keep], yk[keep]
        return Xk, yk, mu_y, sd_y

    def to_botorch(
        self, client: Hashable | None = None, *, data: tuple[ArrayLike, ArrayLike] | None = None, seed: int = 0
    ) -> SingleTaskGP:
        """``client``'s personal predictor as a BoTorch model (the optional extra
        ``fedstats[bo]``): a ``SingleTaskGP`` conditioned on the same rows as :meth:`predict`
        (the client's own, or ``data`` = (X_k, y_k) for a new client), on the targets'
        original scale, with the shared hyperparameters fixed (:func:`fedstats.gp.bo.exact_gp`:
        a client that standardises ``y = mu + sd z`` has constant mean ``mu``, outputscale
        ``sd^2 s`` and noise ``sd^2 v``). Its posterior mean and variance of f equal
        :meth:`predict`'s; BoTorch's acquisition functions and ``optimize_acqf`` take it as
        it is. Float64 on the CPU (``.to(device)`` moves it); above 4,096 rows BoTorch's
        settings solve by conjugate gradients (see :mod:`fedstats.gp.bo`)."""
        from .bo import exact_gp

        Xk, yk = self._client_data(client, data)
        Xk, yk, mu_y, sd_y = self._conditioning(Xk, yk, seed)
        return exact_gp(self.spec, self.hyperparameters, Xk, yk, offset=mu_y, scale=sd_y)

    def rmse(self, test: FederatedData, train: FederatedData | None = None, *, scale: str = "original") -> pd.Series:
        """RMSE of each client of ``test``, predicting by conditioning on that client's data in
        ``train`` (default: the training data of the fit); with ``scale="standardized"`` the
        test targets are standardised by the conditioning data's mean and sd."""
        out = {}
        for c in test.clients:
            data = None if train is None else (np.asarray(train[c].X), np.asarray(train[c].y))
            pred = self.predict(np.asarray(test[c].X), client=c, data=data, scale=scale)
            y = np.asarray(test[c].y, dtype=float)
            if scale == "standardized" and self.options.get("standardize", True):
                _, mu, sd = standardize_y(self._client_data(c, data)[1])  # the conditioning data's scale
                y = (y - mu) / sd
            out[c] = float(np.sqrt(np.mean((pred["mean"].to_numpy() - y) ** 2)))
        return pd.Series(out, name="rmse")

    def objective(self, data: FederatedData | None = None) -> float:
        """The global objective ``sum_k p_k L_k / N_k`` (mean negative log marginal likelihood of
        each client's full data, standardised as in training) at the fitted hyperparameters
        (the objective of ``loss_normalization="mean"``, whatever the fit used).
        Each client would send one number; computed here in-process."""
        data = self._data if data is None else data
        if data is None:
            raise ValueError("pass data: this result holds none")
        return weighted_objective(
            self.spec,
            self.hyperparameters,
            data,
            standardize=self.options.get("standardize", True),
            device=self._device(),
            dtype=resolve_dtype(self.options.get("dtype", "float64")),
        )


def weighted_objective(
    spec: HyperSpec, hyper: dict, data: FederatedData, *, standardize: bool = True, device="cpu", dtype=torch.float64
) -> float:
    """``sum_k (N_k/N) L_k(theta) / N_k`` over the clients of ``data`` (exact, full data)."""
    N = sum(data.n_obs.values())
    total = 0.0
    model = single_model(spec, hyper, device, dtype)
    with torch.no_grad():
        for c in data.clients:
            y = np.array(data[c].y, dtype=float)
            y = standardize_y(y)[0] if standardize else y
            X = torch.as_tensor(np.array(data[c].X, dtype=float), device=device, dtype=dtype)[None]
            nll = model.nll(X, torch.as_tensor(y, device=device, dtype=dtype)[None])[0].item()
            total += (len(y) / N) * nll / len(y)
    return total
