"""FedEM for Gaussian mixtures: shared components, private per-client weights.

Model (Algorithm 7 of Marfoq's thesis with a Gaussian mixture's closed-form M-step): client ``c`` draws ``x ~ sum_j pi_cj N(mu_j, Sigma_j)``; the
components ``(mu_j, Sigma_j)`` are shared, the weights ``pi_c`` belong to the client.

One round (client-server, :class:`FedEMAlgorithm`):

* the server broadcasts the components (and, with ``shared_weights=True``, the weights);
* each client runs an exact E-step on its own rows with its own weights, updates its
  weights ``pi_c = N_c / n_c`` (they never leave the client) and replies with its
  statistics: soft counts ``N_c``, moments ``S1_c``, ``S2_c`` about a fixed point ``g``
  (the starting means' average, :attr:`FedEMAlgorithm.ref`), its log-likelihood at the
  broadcast parameters, the entropy ``H_c`` of its responsibilities, its weight term
  ``sum_j N_cj log pi_cj`` and its soft-count total;
* the server adds the statistics and does the closed-form M-step. It never averages
  parameters (averaging the clients' local closed-form means with weights ``n_c/N`` is not the
  EM update: a component's mean must be weighted by each client's responsibility mass).

So a federated round *is* an EM iteration of the per-client-weights model on the pooled
data: federated equals centralised exactly, and the log-likelihood never decreases.

Partial participation is incremental EM (Neal & Hinton): a client that sits out a round
still counts with its latest statistics; the free energy (ELBO) the server reports after each
M-step never decreases. The first round always asks every client, so the M-step always sees
the whole federation.

Every reply array is declared summed (:attr:`FedEMAlgorithm.summed_keys`): the server only
ever holds totals over the clients, so secure aggregation can hide each client's values. For
the stale statistics of incremental EM the server keeps *running totals*, and a client sends
the change of its own contribution: its new statistics minus those it sent last time, both
about ``g``; the first time, its full statistics. The server moves the totals to the
components' means (:func:`~fedstats.mixture.gmm.reshift`) for its M-step. Moments about a
fixed ``g`` lose about ``log10((max_j ||mu_j - g|| / sigma)^2)`` digits for components
``||mu_j - g||`` from ``g`` relative to their spread ``sigma`` (two digits at ten standard
deviations), as moments about the current means' average would; an offset of the data
itself (1e8, say) costs nothing, since ``g`` starts in the data's region.
The free energy's nonlinear per-client parts (the weight term, the entropy) are computed by
each client and sent the same way; the expected log-density part is linear in the statistics
and is evaluated on the totals.

Opt-in differential privacy (``dp=``): the rounds release every client's full clipped
statistics with Gaussian noise, for a fixed number of rounds; see :mod:`fedstats.mixture.dp`.

The variational model (:mod:`fedstats.mixture.bayes`) and D-FedEM
(:mod:`fedstats.mixture.decentralized`) are sibling estimators; what they share is in
:mod:`fedstats.mixture._common`.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike

from ..data import FederatedData
from ..estimator import BOOL, NONE, Constraint, Int
from ..federation.influence import to_leave_out
from ..federation.records import exclude, excluded_now
from ..fitting import RunOptions, federated_fit
from ..privacy import DifferentialPrivacy
from ._common import WEIGHTS, ServerMixture, check_failures, log_weights, norm, still_in_fit
from ._init import federated_loglik
from .fedem_algorithm import ClientMixtureState, FedEMAlgorithm, SentStatistics
from .result import GaussianMixtureResult

__all__ = ["ClientMixtureState", "FedEMAlgorithm", "FederatedGaussianMixture", "SentStatistics"]

_DP = NONE | Constraint(lambda v: isinstance(v, DifferentialPrivacy), "a fedstats.privacy.DifferentialPrivacy")


@dataclass(eq=False, repr=False, kw_only=True)
class FederatedGaussianMixture(ServerMixture):
    """Gaussian mixture fitted by FedEM: shared components, private per-client weights
    (maximum likelihood; :class:`~fedstats.mixture.bayes.VariationalGaussianMixture` is the
    variational sibling, :class:`~fedstats.mixture.decentralized.DecentralizedGaussianMixture`
    the serverless one).

    Parameters
    ----------
    n_components : int
        Number of components M.
    covariance_type : {"full", "tied", "diag", "spherical"}, default "full"
    reg_covar : float, default 1e-6
        Added to every covariance's diagonal after the M-step (scikit-learn's meaning).
    rounds : int, default 100
        Communication rounds of EM (each is one exact EM iteration).
    tol : float or None, default 1e-6
        Stop when the free energy per point changes by less than ``tol`` (``None`` or 0:
        run ``rounds``).
    shared_weights : bool, default False
        One weight vector for all clients: pooled EM (scikit-learn on the pooled rows).
    n_init : int, default 10
        Candidates of the federated k-means initialisation (ranked by federated
        log-likelihood) when no ``means_init`` is given.
    means_init, covariances_init, weights_init : optional
        Explicit start. ``weights_init`` is (M,) for every client or a dict client -> (M,).
        ``covariances_init`` defaults to the federated within-cluster covariance at
        ``means_init``.
    participation : float in (0, 1], default 1.0
        Fraction of clients asked in each round after the first (incremental EM).
    dp : DifferentialPrivacy, optional
        Opt-in differential privacy (:mod:`fedstats.privacy`; neighbours: one row added or
        removed). Every release is clipped per row on the client and gets Gaussian noise; the
        result's ``privacy`` holds the spent ``(epsilon, delta)`` and every release
        (:class:`~fedstats.privacy.PrivacySpent`). Details in :mod:`fedstats.mixture.dp`:

        * ``dp.clip``: the clipping radius ``B`` in data units: a row's deviation from each
          broadcast mean is shortened to length ``B`` at most before it enters that
          component's statistics, so a row adds at most ``1`` to ``N`` (L2), ``B`` to ``S1``
          and ``B^2`` to ``S2`` (or a mapping of these three keys' bounds). Rows within ``B``
          of their component's mean are used as they are; choose ``B`` a few component sds.
        * released per round, by every client (full participation, every round): its full
          statistics ``N``, ``S1``, ``S2`` about the broadcast means (no log-likelihood,
          entropy or row count); with per-client weights each client also draws its weights
          from its own noisy counts (the same mechanism, on the client).
        * rounds: exactly ``dp_rounds`` EM rounds (``rounds`` and ``tol`` are not used: no
          likelihood is released to test convergence). ``converged`` says whether the last
          round moved every mean by no more than the noise explains.
        * start: ``means_init`` is required (public knowledge or an earlier fit: the
          federated k-means start sends clients' local centres, which are not sums); without
          ``covariances_init`` one private round of hard-assignment statistics gives them.
        * ``dp.placement="client"``: every client adds ``1/n`` of the noise variance (summed
          under secure aggregation: the sum carries all of it; in process the server reads
          each reply and the ledger is charged the share's noise only); ``"central"``: the
          server adds the noise once to the sums (it is trusted with the exact sums).
        * not available with ``participation < 1``, ``uncertainty=True`` (the Wald rounds
          are not private) or the final scoring round (``loglik`` and ``bic`` are absent);
          ``n_obs`` is empty (row counts are not released).
    dp_rounds : int, default 20
        With ``dp``: the fixed number of EM rounds (each one release).
    include_dp_noise : bool, default False
        With ``dp``: give ``summary`` an ``sd`` and intervals of the DP noise in the means,
        variances (and shared weights), propagated by simulation through the final M-step.
        They hold the DP noise only (a private fit has no sampling intervals); without it the
        tables have point estimates only. The final M-step's noise is most of it only when the noise
        is small against the components' separation (see :mod:`fedstats.mixture.dp`).
        ``client_summary`` cannot include the noise of the
        per-client weights (ValueError). Tables say which in ``attrs["privacy"]``.
    robust : bool, default False
        Leave out the clients the influence warning names (each client's exact
        leave-one-client-out shift of the components, ``result.influence``) and fit the others
        afresh, start included, until none is named or half the clients are out. The result is
        FedEM on the remaining clients; ``result.excluded`` names the clients left out and why.
        Not with ``dp`` (ValueError); under secure aggregation it leaves nobody out (no
        client's statistics are seen, so no influence is measured).

    Example
    -------
    >>> import numpy as np
    >>> from fedstats.mixture import FederatedGaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> Xs = [np.r_[rng.normal(0, 1, (40, 2)), rng.normal(6, 1, (10 + 20 * k, 2))] for k in range(3)]
    >>> res = FederatedGaussianMixture(2, n_init=3).fit(Xs, seed=0)
    >>> [round(float(v)) for v in np.sort(res.means[:, 0])]
    [0, 6]
    """

    _constraints = {
        **ServerMixture._constraints,
        "weights_init": NONE | WEIGHTS,
        "dp": _DP,
        "dp_rounds": Int(1),
        "include_dp_noise": BOOL,
        "robust": BOOL,
    }

    weights_init: ArrayLike | Mapping[Hashable, ArrayLike] | None = None
    dp: DifferentialPrivacy | None = None
    dp_rounds: int = 20
    include_dp_noise: bool = False
    robust: bool = False

    def _check(self, data: FederatedData) -> None:
        super()._check(data)
        if isinstance(self.weights_init, Mapping) and self.shared_weights:
            raise ValueError("shared_weights=True takes one weights_init vector (M,), not one per client")

    @federated_fit
    def fit(self, data: FederatedData, run: RunOptions, *, uncertainty: bool = False) -> GaussianMixtureResult:
        """Fit by FedEM. ``data``: FederatedData (``y`` ignored), or per-client arrays.

        Returns a :class:`GaussianMixtureResult`. ``uncertainty=True`` adds the Wald rounds
        (:meth:`GaussianMixtureResult.wald_intervals`): the result's ``summary(level)`` and
        ``client_summary(level)`` then carry observed-information sd and intervals of the
        means and weights.
        """
        seed = run.seed
        self._check(data)
        if self.include_dp_noise and self.dp is None:
            raise ValueError("FederatedGaussianMixture: include_dp_noise=True needs dp= (there is no noise to include)")
        if self.dp is not None:
            if uncertainty:
                raise ValueError(
                    "FederatedGaussianMixture(dp=...): uncertainty=True is not available (the Wald rounds "
                    "release the clients' information matrices without noise)"
                )
            if self.robust:
                raise ValueError(
                    "FederatedGaussianMixture(dp=...): robust=True needs each client's influence, which dp= does not measure"
                )
            from .dp import fit_private

            return fit_private(self, data, run)
        everyone = data.clients
        while True:
            data = still_in_fit(data)
            means, cov, info = self._start(data, seed)
            algo = FedEMAlgorithm(
                means,
                cov,
                covariance_type=self.covariance_type,
                reg_covar=self.reg_covar,
                shared_weights=self.shared_weights,
                weights_init=self.weights_init,
                tol=self.tol or None,
            )
            res = replace(run, resume=run.resume and data.clients == everyone).run(  # a robust refit starts afresh
                algo,
                data,
                kind="EM rounds",
                rounds=self.rounds,
                participation=self._participation(data.clients),
                min_rounds=min(2, self.rounds),
            )
            if not (self.robust and (far := to_leave_out(res.influence, everyone, excluded_now()))):
                break
            exclude(far)  # robust=True: FedEM on the others, from their own start
        st = res.server_state
        check_failures(res.history, st["seen"], st["clients"], "FedEM")
        data = still_in_fit(data)
        weights = (
            {c: np.exp(st["log_w"]) / np.exp(st["log_w"]).sum() for c in data.clients}
            if self.shared_weights
            else {c: norm(np.exp(s.log_weights)) for c, s in res.client_states.items() if c in data.clients}
        )
        # one more round: the log-likelihood at the final parameters (for bic, the CLI, ...)
        ll = federated_loglik(
            data, st["means"], st["cov"], self.covariance_type, {c: log_weights(w) for c, w in weights.items()}, seed
        )
        if st["empty"]:
            warnings.warn(
                f"component(s) {st['empty']} received (almost) no mass in the last round and kept their "
                "previous parameters; consider fewer components",
                RuntimeWarning,
                stacklevel=2,
            )
        self._warn_unconverged(res, "FedEM")
        out = GaussianMixtureResult(
            means=st["means"],
            covariances=st["cov"],
            weights=weights,
            covariance_type=self.covariance_type,
            **self._run_fields(data, res, info),
            shared_weights=self.shared_weights,
            loglik=ll,
        )
        if uncertainty:
            out.wald_intervals(data, seed=seed)
        return out
