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

import os
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike

from ..data import DataLike, FederatedData
from ..estimator import BOOL, NONE, Constraint, Int
from ..federation import FederatedAlgorithm, run
from ..federation.backend import accepts_backend
from ..federation.influence import to_leave_out
from ..federation.records import exclude, excluded_now
from ..privacy import DifferentialPrivacy
from ..results import counted, register
from ._common import (
    SERVER_CONSTRAINTS,
    WEIGHTS,
    MixtureEstimator,
    RowStack,
    as_federated,
    check_failures,
    initial_weights,
    log_weights,
    norm,
    still_in_fit,
)
from ._init import federated_loglik
from .gmm import (
    check_cov_type,
    estep_statistics,
    expected_loglik_terms,
    m_step,
    means_and_variances,
    precision_cholesky,
    reshift,
    s2_shape,
)
from .result import GaussianMixtureResult

_DP = NONE | Constraint(lambda v: isinstance(v, DifferentialPrivacy), "a fedstats.privacy.DifferentialPrivacy")

# helpers shared by the three mixtures (their names here are kept for the modules that import them)
_log_weights, _norm = log_weights, norm


@register
@dataclass
class SentStatistics:
    """What a client last added to the server's running totals: its statistics about
    ``shift`` (the means it was sent then), its weight term and its entropy."""

    N: np.ndarray
    S1: np.ndarray
    S2: np.ndarray
    shift: np.ndarray
    weight_term: float
    entropy: float


@register
@dataclass
class ClientMixtureState:
    """What a client keeps between rounds: its log-weights (never sent), row count, and what
    it last sent (``None`` before its first reply)."""

    log_weights: np.ndarray
    n: int
    sent: SentStatistics | None = None


class FedEMAlgorithm(FederatedAlgorithm):
    """Client-server FedEM for a Gaussian mixture (closed-form M-step on summed statistics).

    A client's reply, every array summed over the clients (see the module docs): the change
    of its statistics ``N``, ``S1``, ``S2`` about :attr:`ref` since its previous reply
    (the first time: the statistics), the change of its ``entropy`` and of its
    ``weight_term`` ``sum_j N_cj log pi_cj`` (not sent with ``shared_weights``: the server
    forms that term from the totals), its ``loglik`` at the broadcast parameters and ``n``,
    its soft-count total (for the metrics).

    Parameters
    ----------
    means, covariances : initial components (scikit-learn layout, see :mod:`fedstats.mixture.gmm`).
    covariance_type : "full" | "tied" | "diag" | "spherical".
    reg_covar : added to the diagonal of every covariance after the M-step.
    shared_weights : one weight vector for all clients (the server aggregates the soft
        counts and broadcasts it): pooled EM, i.e. scikit-learn on the pooled data.
    weights_init : (M,) initial weights for every client, or a dict client -> (M,);
        default uniform.
    tol : convergence when the free energy per point changes by less than ``tol``.
    """

    reply_keys: tuple[str, ...] = ("N", "S1", "S2", "loglik", "entropy", "weight_term", "n")
    summed_keys: tuple[str, ...] = reply_keys
    cumulative_replies = True  # each reply is the change since the client's previous one
    row_count_keys = ("N",)  # each row's responsibilities add up to one
    random_client_steps = False
    per_client_fields: tuple[str, ...] = ("weights_init",)

    def __init__(
        self,
        means,
        covariances,
        *,
        covariance_type="full",
        reg_covar=1e-6,
        shared_weights=False,
        weights_init=None,
        tol=1e-6,
    ):
        self.cov_type = check_cov_type(covariance_type)
        self.means0 = np.array(means, dtype=float)
        self.cov0 = np.array(covariances, dtype=float)
        self.reg_covar = float(reg_covar)
        self.shared = bool(shared_weights)
        self.weights_init = weights_init
        self.tol = tol
        self.M, self.d = self.means0.shape
        #: the fixed point about which the clients take their moments (the starting means'
        #: average, in the data's region): no client moves its statistics from round to round
        self.ref = self.means0.mean(0)
        self._ref_m = np.repeat(self.ref[None], self.M, axis=0)  # as every component's shift
        self._ref_m.setflags(write=False)
        self._stack = RowStack()
        if self.shared:  # the weight term is the server's: it holds the weights
            self.reply_keys = self.summed_keys = tuple(k for k in type(self).reply_keys if k != "weight_term")

    def final_state(self, state):
        """At the end of a run the client's weights and row count leave it, not the statistics
        it last sent (kept for resuming only)."""
        return replace(state, sent=None) if getattr(state, "sent", None) is not None else state

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_stack"] = RowStack()
        return s

    def _ref_shift(self) -> np.ndarray:
        """:attr:`ref` as a shift of every component's statistics, ``(M, d)`` (one object, read-only)."""
        return self._ref_m

    def _w0(self, client) -> np.ndarray:
        return initial_weights(self.weights_init, client, self.M)

    # ---------------------------------------------------------------- server side
    def init_server(self, clients, rng):
        return {
            "clients": list(clients),
            "means": self.means0.copy(),
            "cov": self.cov0.copy(),
            "log_w": _log_weights(self._w0(None)) if self.shared else None,
            "seen": np.zeros(len(clients), bool),
            # running totals, over the clients seen so far, of their latest statistics (about
            # "shift"), entropies and weight terms
            "N": np.zeros(self.M),
            "S1": np.zeros((self.M, self.d)),
            "S2": np.zeros(s2_shape(self.cov_type, self.M, self.d)),
            "shift": self._ref_shift(),
            "H": 0.0,
            "weight_term": 0.0,
            "F": None,
            "F_prev": None,
            "empty": [],
        }

    def broadcast(self, state, client, round):
        msg = {"means": state["means"], "covariances": state["cov"]}
        if self.shared:
            msg["log_weights"] = state["log_w"]
        return msg

    def absorb(self, state, replies, shift):
        """The server's running totals after this round's replies, about ``shift`` (:attr:`ref`,
        about which the clients send their changes; totals of a checkpoint taken about another
        point are moved there first).

        Returns ``(new_state, metrics, (N, S1, S2) totals about shift)``; the last item is
        ``None`` before any client answered.
        """
        st = dict(state)
        if "weight_term" not in st:  # a checkpoint of the per-client cache that came before the totals
            raise ValueError("this checkpoint holds FedEM's former per-client statistics: start the fit afresh")
        # reshift is linear in (N, S1, S2): moving the total moves every client's part
        N, (S1, S2) = st["N"], reshift(st["N"], st["S1"], st["S2"], st["shift"], shift, self.cov_type)
        sums = replies.sums
        if sums:
            N, S1, S2 = N + sums["N"], S1 + sums["S1"], S2 + sums["S2"]
            st["H"] = st["H"] + float(sums["entropy"][0])
            if not self.shared:
                st["weight_term"] = st["weight_term"] + float(sums["weight_term"][0])
        st["N"], st["S1"], st["S2"], st["shift"] = N, S1, S2, np.array(shift, dtype=float)
        idx = {c: i for i, c in enumerate(st["clients"])}
        st["seen"] = st["seen"].copy()
        st["seen"][[idx[c] for c in replies]] = True
        ll = float(sums["loglik"][0]) if sums else 0.0
        n_ans = float(sums["n"][0]) if sums else 0.0
        metrics = {
            "loglik": ll,
            "n_points": n_ans,
            "answered": float(len(replies)),
            "mean_loglik": ll / n_ans if n_ans else float("nan"),
        }
        return st, metrics, ((N, S1, S2) if st["seen"].any() else None)

    def server_step(self, state, replies, round):
        old = state["means"]
        ref = self._ref_shift()
        st, metrics, stats = self.absorb(state, replies, ref)
        if stats is None:
            metrics.update(free_energy=float("nan"), empty_components=0.0)
            return st, metrics
        N, S1, S2 = stats
        means, cov, empty = m_step(N, S1, S2, ref, self.cov_type, self.reg_covar, prev_means=old, prev_cov=state["cov"])
        st["means"], st["cov"], st["empty"] = means, cov, empty.tolist()
        if self.shared:
            st["log_w"] = _log_weights(N / N.sum())
            weight_term = float(np.sum(N * st["log_w"]))
        else:  # sum_c sum_j N_cj log pi_cj, each client's term formed on the client
            weight_term = st["weight_term"]
        # the expected log-densities are linear in the statistics: evaluated on the totals
        q = expected_loglik_terms(N[None], S1[None], S2[None], ref, means, cov, self.cov_type)[0]
        F = float(weight_term + q + st["H"])
        st["F_prev"], st["F"] = state["F"], F
        metrics.update(free_energy=F, empty_components=float(len(empty)))
        return st, metrics

    def leave_one_out(self, totals, own):
        """The M-step's means from the totals with and without each client's statistics (one
        row per client in ``own``; its replies are changes: a row is all it sent): the largest
        change of a mean coordinate in the standard errors of the fit without it
        (``sd / sqrt(N_j)``), and that over what a client with its share of the rows typically
        causes."""
        ref, cov_type, reg = self._ref_shift(), self.cov_type, self.reg_covar
        means = means_and_variances(totals["N"], totals["S1"], totals["S2"], ref, cov_type, reg)[0]
        N = totals["N"] - own["N"]
        without, var = means_and_variances(N, totals["S1"] - own["S1"], totals["S2"] - own["S2"], ref, cov_type, reg)
        z = np.abs(without - means) / np.sqrt(var / N[..., None])
        shift = np.max(np.where(np.isnan(means), 0.0, z), axis=(1, 2))  # components empty in the fit: no mean
        # a component of the fit that has no mass without the client rests on it alone
        alone = np.any(np.isnan(without) & ~np.isnan(means), axis=(1, 2))
        share = np.clip(own["N"].sum(axis=1) / totals["N"].sum(), 1e-12, 1 - 1e-12)
        shift = np.where(alone, np.inf, shift)
        return shift, shift / np.sqrt(share / (1 - share))

    def converged(self, state, metrics):
        if self.tol is None or state["F_prev"] is None or not state["seen"].all():
            return False
        n = state["N"].sum()
        return abs(state["F"] - state["F_prev"]) / n < self.tol

    # ---------------------------------------------------------------- client side
    def init_client(self, client, data, rng):
        w = self._w0(client)
        return ClientMixtureState(log_weights=_log_weights(w), n=int(data.n))

    def _unpack(self, msg):
        means, cov = msg["means"], msg["covariances"]
        return means, cov, precision_cholesky(cov, self.cov_type)

    def _estep_log_weights(self, message, states):
        """The E-step's log-weights: the broadcast ones (M,), or every client's own (C, M)."""
        return message["log_weights"] if self.shared else np.stack([s.log_weights for s in states])

    def _updated_many(self, states, N):
        """Every client's new private state (weights ``pi_c = N_c / n_c``) and its weight term
        ``sum_j N_cj log pi_cj`` (0 with shared weights: the server's), ``N`` stacked ``(C, M)``."""
        lw = _log_weights(N / np.array([s.n for s in states], dtype=float)[:, None])
        terms = np.zeros(len(states)) if self.shared else np.sum(N * lw, axis=1)
        return [ClientMixtureState(log_weights=lw[i].copy(), n=s.n) for i, s in enumerate(states)], terms

    def _replies(self, states, N, S1, S2, loglik, entropy):
        """Each client's reply (changes since its previous reply, see the module docs) and new
        state, from its statistics about :attr:`ref` stacked over clients (``N (C, M)``...).

        The server's totals hold exactly what every client remembers sending: the runtime
        commits a client's new state only with a reply that reaches the server step (a client
        that fails keeps its old state; a lost node never answers again).
        """
        news, terms = self._updated_many(states, N)
        ref = self._ref_shift()
        prevs = [s.sent for s in states]
        # the scalar changes at once (a first reply changes from 0)
        dterm = terms - [0.0 if p is None else p.weight_term for p in prevs]
        dH = np.asarray(entropy, dtype=float) - [0.0 if p is None else p.entropy for p in prevs]
        ns, L, dterm, dH = (np.reshape(a, (-1, 1)) for a in (N.sum(1), loglik, dterm, dH))
        out = []
        for i, (prev, new) in enumerate(zip(prevs, news)):
            # copies: a state must not keep this round's stacked arrays alive
            now = SentStatistics(N[i].copy(), S1[i].copy(), S2[i].copy(), ref, float(terms[i]), float(entropy[i]))
            new.sent = now
            if prev is None:
                dN, dS1, dS2 = now.N, now.S1, now.S2
            else:
                S1p, S2p = (
                    (prev.S1, prev.S2)
                    if prev.shift is ref or np.array_equal(prev.shift, ref)
                    else self._moved(prev, ref)
                )
                dN, dS1, dS2 = now.N - prev.N, now.S1 - S1p, now.S2 - S2p
            reply = {"N": dN, "S1": dS1, "S2": dS2, "loglik": L[i], "entropy": dH[i], "n": ns[i]}
            if not self.shared:
                reply["weight_term"] = dterm[i]
            out.append((reply, new))
        return out

    def _moved(self, prev, ref):
        """What a client sent about another point (a checkpoint of an earlier version), moved to ``ref``."""
        return reshift(prev.N, prev.S1, prev.S2, prev.shift, ref, self.cov_type)

    def client_step(self, message, state, data, rng):
        return self.client_steps([message], [state], [data], [rng])[0]

    def client_steps(self, messages, states, datas, rngs):
        # FedEM broadcasts the same components to everybody: one E-step over the stacked rows.
        first = messages[0]
        if any(not all(m[k] is first[k] or np.array_equal(m[k], first[k]) for k in first) for m in messages[1:]):
            return super().client_steps(messages, states, datas, rngs)
        means, cov, pc = self._unpack(first)
        X, starts = self._stack.get([np.asarray(d.X) for d in datas])
        logw = self._estep_log_weights(first, states)
        N, S1, S2, L, H = estep_statistics(X, starts, means, pc, logw, self.cov_type, self._stack.centred_on(self.ref))
        return self._replies(states, N, S1, S2, L, H)


# ====================================================================== the model
class FederatedGaussianMixture(MixtureEstimator):
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
          are not private) or the final scoring round (``loglik_`` and ``bic`` are absent);
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
    >>> [round(float(v)) for v in np.sort(res.means_[:, 0])]
    [0, 6]
    """

    _constraints = {
        **MixtureEstimator._constraints,
        **SERVER_CONSTRAINTS,
        "weights_init": NONE | WEIGHTS,
        "dp": _DP,
        "dp_rounds": Int(1),
        "include_dp_noise": BOOL,
        "robust": BOOL,
    }

    def __init__(
        self,
        n_components: int,
        *,
        covariance_type: str = "full",
        reg_covar: float = 1e-6,
        rounds: int = 100,
        tol: float | None = 1e-6,
        shared_weights: bool = False,
        n_init: int = 10,
        means_init: ArrayLike | None = None,
        covariances_init: ArrayLike | None = None,
        weights_init: ArrayLike | Mapping[Hashable, ArrayLike] | None = None,
        participation: float = 1.0,
        dp: DifferentialPrivacy | None = None,
        dp_rounds: int = 20,
        include_dp_noise: bool = False,
        robust: bool = False,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.reg_covar = reg_covar
        self.rounds = rounds
        self.tol = tol
        self.shared_weights = shared_weights
        self.n_init = n_init
        self.means_init = means_init
        self.covariances_init = covariances_init
        self.weights_init = weights_init
        self.participation = participation
        self.dp = dp
        self.dp_rounds = dp_rounds
        self.include_dp_noise = include_dp_noise
        self.robust = robust

    def _check(self, data: FederatedData) -> None:
        super()._check(data)
        if isinstance(self.weights_init, Mapping) and self.shared_weights:
            raise ValueError("shared_weights=True takes one weights_init vector (M,), not one per client")

    @counted
    @accepts_backend
    def fit(
        self,
        data: DataLike,
        *,
        seed: int = 0,
        progress: bool | None = None,
        checkpoint: str | os.PathLike | None = None,
        resume: bool = False,
        uncertainty: bool = False,
    ) -> GaussianMixtureResult:
        """Fit by FedEM. ``data``: FederatedData (``y`` ignored), or per-client arrays.

        Returns a :class:`GaussianMixtureResult`. ``uncertainty=True`` adds the Wald rounds
        (:meth:`GaussianMixtureResult.wald_intervals`): the result's ``summary(level)`` and
        ``client_summary(level)`` then carry observed-information sd and intervals of the
        means and weights.
        """
        data = as_federated(data)
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

            return fit_private(self, data, seed, progress, checkpoint, resume)
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
            res = run(
                algo,
                data,
                kind="EM rounds",
                rounds=self.rounds,
                participation=self._participation(data.clients),
                seed=seed,
                progress=progress,
                checkpoint=checkpoint,
                resume=resume and data.clients == everyone,  # a robust refit starts afresh
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
        if not res.converged and self.tol:
            warnings.warn(
                f"FedEM did not converge in {self.rounds} rounds (tol={self.tol}); increase rounds",
                RuntimeWarning,
                stacklevel=2,
            )
        out = GaussianMixtureResult(
            means=st["means"],
            covariances=st["cov"],
            weights=weights,
            covariance_type=self.covariance_type,
            feature_names=data.feature_names,
            n_obs=data.n_obs,
            history=res.history,
            communication=res.communication,
            rounds=res.rounds,
            converged=res.converged,
            shared_weights=self.shared_weights,
            init_info=info,
            reg_covar=self.reg_covar,
            loglik=ll,
        )
        if uncertainty:
            out.wald_intervals(data, seed=seed)
        return out
