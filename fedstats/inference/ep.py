"""Federated expectation propagation with Gaussian sites (Algorithms 2-3 of the linear-models paper).

The server holds the global approximation ``q(phi) = prior(phi) * prod_k site_k(phi)`` in
natural parameters and broadcasts it. Each client keeps its own site (never sent), forms
the cavity ``q / site_k``, computes the moments of its tilted distribution
``cavity * f_k`` with a pluggable estimator (:mod:`fedstats.inference.tilted`), moves its
site towards ``tilted / cavity`` by a damping factor ``delta`` and sends only the change
``(dr, dQ)``. The server adds the changes of the clients that answered: it uses them only
through their sum, which the runtime forms (:attr:`FederatedEP.summed_keys`), so no server
code sees one client's change.

Positive-definiteness repair. If the summed changes would make the global precision
indefinite (Monte-Carlo noise, large simultaneous steps), the server backs off: it applies
``gamma * sum dQ_k`` with ``gamma`` halved until the result is PD, and tells each client
the accepted fraction ``gamma`` with its next broadcast. A client keeps its last change
as *pending* until then, so ``q = prior * prod_k (site_k + accept_k * pending_k)`` holds
exactly after every round, also for clients that miss rounds or fail.

Example
-------
>>> import numpy as np
>>> from fedstats.inference.ep import FederatedEP
>>> from fedstats.inference.gaussian import NaturalGaussian
>>> # see fedstats.linear.HierarchicalLinearModel for a complete model
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from ..federation.protocol import ClientId, FederatedAlgorithm, Message, Replies, SkipRound
from ..federation.records import in_fit
from ..result_file import register
from .gaussian import NaturalGaussian, NotPositiveDefinite, symmetrize
from .tilted import SiteModel, TiltedEstimator, TiltedResult


@register
@dataclass(frozen=True)
class EPServerState:
    """What the server holds: the prior, the global approximation and the round count."""

    prior: NaturalGaussian
    q: NaturalGaussian
    round: int = 0
    converged: bool = False
    accept: dict = field(default_factory=dict)  # client -> accepted fraction of its pending change
    clients: tuple = ()
    quiet: frozenset = frozenset()  # clients that answered since the last round that moved q by >= tol
    #: clients whose last answer to a broadcast was a refusal (a skipped or failed step): the
    #: fit can converge without them, since their site no longer moves
    declining: frozenset = frozenset()
    stage: int = 0  # which of the algorithm's estimators the clients use
    stage_round: int = 0  # the round in which that stage began


@register
@dataclass(frozen=True)
class EPClientState:
    """What stays on a client: its sufficient statistics, its site and its last diagnostics."""

    stats: dict[str, np.ndarray]
    site: NaturalGaussian
    pending: NaturalGaussian | None = None  # last change sent, until the server says how much it took
    n_updates: int = 0
    diagnostics: dict[str, float] = field(default_factory=dict)
    #: where the client's sampler stopped in its last round (a resumable estimator's state)
    tilted_state: dict[str, np.ndarray] | None = None


@register
class FederatedEP(FederatedAlgorithm):
    """Federated Gaussian EP over global parameters ``phi``.

    Parameters
    ----------
    model : SiteModel
        Supplies the client likelihood ``f_k(phi)`` and ``client_stats(data)``.
    prior : NaturalGaussian
        Gaussian prior of ``phi`` (PD).
    estimator : TiltedEstimator or a sequence of them
        How a client computes its tilted moments. A sequence runs in stages: EP with the
        first until it has converged (by ``tol``), then from there with the next, and so on;
        the fit has converged when the last stage has. E.g. ``(LaplaceTilted(),
        ImportanceTilted())``: cheap deterministic rounds to near the fixed point, then
        sampled rounds remove the Laplace approximation's bias.
    damping : float in (0, 1]
        ``delta``: new site = (1 - delta) old + delta proposed, in natural parameters
        (1 reproduces the paper).
    tol : float
        Convergence: the largest change of a component of the global mean, in units of
        its posterior sd, and of a log sd, must fall below ``tol`` in consecutive rounds
        in which every client has answered at least once (a client whose last answer was a
        refusal, a skipped or failed step, is not waited for).
    max_backoff : int
        Halvings of the server's step ``gamma`` for the PD repair before the round's
        update is dropped altogether.
    stage_tol, stage_rounds : float, int or None
        The stages before the last end when they have converged by ``stage_tol`` (default
        ``tol``) or after ``stage_rounds`` rounds (default: no limit): a warm-up stage has
        to bring EP near the fixed point, which the last stage then reaches.
    """

    reply_keys = ("dr", "dQ")
    # the server adds the site changes of the clients that answered: it sees only their sums
    summed_keys = reply_keys
    symmetric_keys = ("dQ",)  # a change of a precision matrix
    # a reply is a change of the client's site: the runtime adds them up for the influence
    cumulative_replies = True
    influence_unit = "posterior sd"

    def __init__(
        self,
        model: SiteModel,
        prior: NaturalGaussian,
        estimator: TiltedEstimator | Sequence[TiltedEstimator],
        *,
        damping: float = 1.0,
        tol: float = 1e-3,
        max_backoff: int = 20,
        stage_tol: float | None = None,
        stage_rounds: int | None = None,
    ) -> None:
        if not (0.0 < damping <= 1.0):
            raise ValueError(f"damping must lie in (0, 1], got {damping}")
        if prior.dim != model.phi_dim:
            raise ValueError(f"prior has dimension {prior.dim}, model's phi has {model.phi_dim}")
        if not prior.is_proper():
            raise ValueError("the prior's precision must be positive definite")
        self.stages = tuple(estimator) if isinstance(estimator, (list, tuple)) else (estimator,)
        if not self.stages:
            raise ValueError("at least one tilted estimator is needed")
        # the estimator of the fit's final stage (client posteriors after the fit use it)
        self.model, self.prior, self.estimator = model, prior, self.stages[-1]
        self.damping, self.tol, self.max_backoff = float(damping), float(tol), int(max_backoff)
        self.stage_tol = self.tol if stage_tol is None else float(stage_tol)
        if stage_rounds is not None and int(stage_rounds) < 1:
            raise ValueError(f"stage_rounds must be >= 1, got {stage_rounds}")
        self.stage_rounds = None if stage_rounds is None else int(stage_rounds)

    # ---------------------------------------------------------------- server side
    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> EPServerState:
        return EPServerState(prior=self.prior, q=self.prior, clients=tuple(clients))

    def broadcast(self, state: EPServerState, client: ClientId, round: int) -> Message:
        msg = {"r": state.q.r, "Q": state.q.Q, "accept": np.array(state.accept.get(client, 1.0))}
        if len(self.stages) > 1:
            msg["stage"] = np.array(state.stage)
        return msg

    def server_step(
        self, state: EPServerState, replies: Mapping[ClientId, Message], round: int
    ) -> tuple[EPServerState, dict[str, float]]:
        old = state.q
        declined = frozenset(getattr(replies, "declined", {}))
        declining = (state.declining | declined) - frozenset(replies)
        if not replies:
            return replace(state, round=state.round + 1, declining=declining), {}
        sums = cast(Replies, replies).sums  # the runtime's sums of the declared summed keys
        dr, dQ = np.asarray(sums["dr"]), np.asarray(sums["dQ"])
        gamma = 1.0
        for _ in range(self.max_backoff + 1):
            q = NaturalGaussian(old.r + gamma * dr, old.Q + gamma * dQ)
            if q.is_proper():
                break
            gamma /= 2
        else:  # nothing usable this round: accept none of it
            gamma, q = 0.0, old
        accept = dict(state.accept)
        accept.update({k: gamma for k in replies})
        (m0, c0), (m1, c1) = old.moments(), q.moments()
        sd0, sd1 = np.sqrt(np.diag(c0)), np.sqrt(np.diag(c1))
        metrics = {
            "max_mean_change_sd": float(np.max(np.abs(m1 - m0) / sd1)),
            "max_log_sd_change": float(np.max(np.abs(np.log(sd1 / sd0)))),
            "gamma": gamma,
        }
        stage = state.stage
        last_stage = stage + 1 >= len(self.stages)
        small = (
            state.round >= 1
            and gamma == 1.0
            and max(metrics["max_mean_change_sd"], metrics["max_log_sd_change"])
            < (self.tol if last_stage else self.stage_tol)
        )
        # With partial participation a quiet round says little about the clients that sat
        # it out: converged only once every client has answered in quiet rounds.
        # A client that declines every broadcast (it cannot form its tilted moments) would
        # otherwise keep the fit from converging: the others converge without it.
        quiet = state.quiet | frozenset(replies) if small else frozenset()
        done = small and quiet.issuperset(frozenset(state.clients) - declining)
        stage_round = state.stage_round
        if len(self.stages) > 1:
            metrics["stage"] = stage
        out_of_rounds = self.stage_rounds is not None and state.round + 1 - stage_round >= self.stage_rounds
        if not last_stage and (done or out_of_rounds):  # this stage is over: the next starts from here
            stage, done, quiet, stage_round = stage + 1, False, frozenset(), state.round + 1
        return replace(
            state,
            q=q,
            round=state.round + 1,
            converged=bool(done),
            accept=accept,
            quiet=quiet,
            stage=stage,
            stage_round=stage_round,
            declining=declining,
        ), metrics

    def converged(self, state: EPServerState, metrics: Mapping[str, float]) -> bool:
        return state.converged

    def leave_one_out(
        self, totals: Mapping[str, np.ndarray], own: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact EP leave-one-client-out: ``q`` (the prior times every site: the prior plus the
        summed site changes, in natural parameters) against the cavity without each client's
        site (the sum of its changes, one row per client in ``own``): the largest change of a
        global mean in the cavity's posterior sds, and that over what a client with its share
        of the sites' precision (their traces) typically causes. A cavity that is not a proper
        Gaussian, or a site of negative precision, cannot be measured (NaN)."""
        r, Q = self.prior.r + totals["dr"], self.prior.Q + totals["dQ"]
        mean = np.linalg.solve(Q, r)
        cov = np.linalg.inv(symmetrize(Q - own["dQ"]))
        var = np.diagonal(cov, axis1=1, axis2=2)
        without = np.einsum("cij,cj->ci", cov, r - own["dr"])
        with np.errstate(invalid="ignore"):
            shift = np.max(np.abs(without - mean) / np.sqrt(var), axis=1)
        shift = np.where(np.all(var > 0, axis=1), shift, np.nan)
        info = np.trace(own["dQ"], axis1=1, axis2=2)
        share = np.clip(info / max(float(np.trace(totals["dQ"])), 1e-300), 1e-12, 1 - 1e-12)
        # a site of negative precision (EP allows them) has no share to compare with
        return shift, np.where(info > 0, shift / np.sqrt(share / (1 - share)), np.nan)

    # ---------------------------------------------------------------- client side
    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> EPClientState:
        return EPClientState(stats=self.model.client_stats(data), site=NaturalGaussian.flat(self.model.phi_dim))

    def client_step(
        self, message: Message, state: EPClientState, data: Any, rng: np.random.Generator
    ) -> tuple[Message, EPClientState]:
        out = self.client_steps([message], [state], [data], [rng])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def client_steps(
        self,
        messages: Sequence[Message],
        states: Sequence[EPClientState],
        datas: Sequence[Any],
        rngs: Sequence[np.random.Generator],
    ) -> list[tuple[Message, EPClientState] | BaseException]:
        """All participating clients at once: one vectorised tilted-moment call, and the
        cavities and site updates as stacked arrays (one client's failure is its own)."""
        results: list[Any] = [None] * len(states)
        states = [self._commit(m, st) for m, st in zip(messages, states)]
        # cavity = q / site_k, in natural parameters
        cav_r = np.stack([np.asarray(m["r"], dtype=float) - st.site.r for m, st in zip(messages, states)])
        cav_Q = symmetrize(np.stack([np.asarray(m["Q"], dtype=float) - st.site.Q for m, st in zip(messages, states)]))
        proper, cav_means, cav_covs = _moments(cav_r, cav_Q)
        todo = np.flatnonzero(proper)
        for i in np.flatnonzero(~proper):
            results[i] = SkipRound("cavity precision is not positive definite")
        if len(todo):
            seeds = np.array([rngs[int(i)].integers(2**63 - 1) for i in todo])
            # every client of a round gets the same broadcast stage (one estimator per call)
            est = self.stages[min(int(messages[todo[0]].get("stage", 0)), len(self.stages) - 1)]
            # A skipped client's place is filled with a copy of the first (its result dropped),
            # as the estimators pad a batch: the batch keeps the round's size, so a round in
            # which some cavities are improper reuses the compiled kernels (a new batch size
            # is a new compilation).
            batch = np.r_[todo, np.full(len(states) - len(todo), todo[0])]
            resume = _resume(est, [getattr(states[i], "tilted_state", None) for i in batch])
            try:
                tilted: list[Any] = est.estimate(
                    self.model,
                    cav_means[batch],
                    cav_covs[batch],
                    [states[i].stats for i in batch],
                    np.r_[seeds, np.full(len(batch) - len(todo), seeds[0])],
                    **resume,
                )[: len(todo)]
            except Exception as exc:  # noqa: BLE001 - reported per client by the runtime
                tilted = [exc] * len(todo)
            good = [k for k, t in enumerate(tilted) if not isinstance(t, BaseException) and t.ok]
            for k, t in enumerate(tilted):
                if isinstance(t, BaseException):
                    results[todo[k]] = t
                elif not t.ok:
                    results[todo[k]] = SkipRound(t.message or "tilted moments unavailable")
            if good:
                idx = todo[good]
                pd, t_r, t_Q = _naturals(
                    np.stack([tilted[k].mean for k in good]), np.stack([tilted[k].cov for k in good])
                )
                for j, i in enumerate(idx):
                    if not pd[j]:
                        results[i] = NotPositiveDefinite("the tilted covariance is not positive definite")
                        continue
                    try:
                        results[i] = self._update_site(states[i], t_r[j] - cav_r[i], t_Q[j] - cav_Q[i], tilted[good[j]])
                    except Exception as exc:  # noqa: BLE001 - one client's failure is its own
                        results[i] = exc
        return results

    def _update_site(
        self, state: EPClientState, prop_r: np.ndarray, prop_Q: np.ndarray, tilted: TiltedResult
    ) -> tuple[Message, EPClientState]:
        """Move the site towards ``tilted / cavity`` (natural parameters ``prop_r, prop_Q``)
        by the damping factor; the reply is the change."""
        d = self.damping
        site = state.site
        change = NaturalGaussian(((1 - d) * site.r + d * prop_r) - site.r, ((1 - d) * site.Q + d * prop_Q) - site.Q)
        reply = {"dr": change.r, "dQ": change.Q}
        new_state = replace(
            state,
            pending=change,
            n_updates=state.n_updates + 1,
            diagnostics=dict(tilted.diagnostics),
            tilted_state=tilted.state,
        )
        return reply, new_state

    @staticmethod
    def _commit(msg: Message, state: EPClientState) -> EPClientState:
        """Apply the accepted fraction of the pending change to the site (client side)."""
        if state.pending is None:
            return state
        return replace(state, site=state.site * (state.pending ** float(msg["accept"])), pending=None)

    def committed_sites(
        self, server: EPServerState, states: Mapping[ClientId, EPClientState]
    ) -> dict[ClientId, NaturalGaussian]:
        """Each client's site as the server's ``q`` counts it (pending changes accepted)."""
        msg = lambda k: {"accept": np.array(server.accept.get(k, 1.0))}  # noqa: E731
        return {k: self._commit(msg(k), st).site for k, st in states.items()}

    # ---------------------------------------------------------------- after the fit
    def local_tilted(
        self,
        q: NaturalGaussian,
        sites: Sequence[NaturalGaussian],
        stats: Sequence[dict[str, np.ndarray]],
        seeds: Sequence[int],
        *,
        use_cavity: bool = True,
        resume: Sequence[dict[str, np.ndarray] | None] | None = None,
    ) -> list[TiltedResult]:
        """Each client's tilted distribution at the final ``q``, from the clients' final
        states (with the in-process runtime, or a Flower run that returned them: on Flower a
        client's final state, including its sufficient statistics, goes to the server once).

        ``sites`` are the committed sites (:meth:`committed_sites`). With
        ``use_cavity=True`` (correct) the client combines its likelihood with the cavity
        ``q / site_k``. ``use_cavity=False`` combines it with ``q`` itself, counting the
        client's data twice; it exists only to demonstrate that error in tests. ``resume``:
        the clients' last ``tilted_state`` (a resumable estimator continues from there).
        """
        cavs = [fractional_cavity(q, s) if use_cavity else (q, 0.0) for s in sites]
        partial = sum(1 for _, a in cavs if a < 1.0) if use_cavity else 0
        if partial:
            warnings.warn(
                f"{partial} client(s) had a cavity that is not positive definite; their posteriors "
                "use q / site**alpha with the largest alpha < 1 that is (see fractional_cavity)",
                RuntimeWarning,
                stacklevel=2,
            )
        moments = [c.moments() for c, _ in cavs]
        return self.estimator.estimate(
            self.model,
            np.stack([m for m, _ in moments]),
            np.stack([c for _, c in moments]),
            list(stats),
            np.asarray(seeds),
            keep_draws=True,
            **_resume(self.estimator, resume),
        )


class RowsEP(FederatedEP):
    """Federated EP whose clients rebuild their statistics (``model.client_stats``) from their
    data at every step and keep only their site. For sites whose statistics are the rows
    themselves (GLMs, user models): nothing of a row is in the state Flower returns to the
    server at the end of a run."""

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> EPClientState:
        return EPClientState(stats={}, site=NaturalGaussian.flat(self.model.phi_dim))

    def client_steps(
        self,
        messages: Sequence[Message],
        states: Sequence[EPClientState],
        datas: Sequence[Any],
        rngs: Sequence[np.random.Generator],
    ) -> list[tuple[Message, EPClientState] | BaseException]:
        full = [replace(s, stats=self.model.client_stats(d)) for s, d in zip(states, datas)]
        out = super().client_steps(messages, full, datas, rngs)
        return [o if isinstance(o, BaseException) else (o[0], replace(o[1], stats={})) for o in out]


def _resume(estimator: Any, states: Sequence[Any] | None) -> dict[str, Any]:
    """``estimate``'s ``resume`` argument: the clients' last sampler states, for an estimator
    that takes them (:attr:`TiltedEstimator.resumable`; duck-typed estimators may lack it)."""
    return {"resume": list(states)} if states is not None and getattr(estimator, "resumable", False) else {}


def _moments(r: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For stacked natural parameters (B, p), (B, p, p): which are proper, and the means and
    covariances (NaN where not proper)."""
    proper, Linv = _inverse_factors(Q)
    cov = symmetrize(np.swapaxes(Linv, 1, 2) @ Linv)
    return proper, (cov @ r[:, :, None])[:, :, 0], cov


def _naturals(mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For stacked moments (B, p), (B, p, p): which covariances are PD, and the natural
    parameters ``(Q mean, Q)`` (NaN where not PD)."""
    pd, Linv = _inverse_factors(symmetrize(cov))
    Q = symmetrize(np.swapaxes(Linv, 1, 2) @ Linv)
    return pd, (Q @ mean[:, :, None])[:, :, 0], Q


def _inverse_factors(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of the stacked symmetric matrices (B, p, p) are positive definite, and ``L^-1``
    for their Cholesky factors ``L`` (NaN for the others)."""
    ok = np.all(np.isfinite(M), axis=(1, 2))
    L = np.full_like(M, np.nan)
    try:
        L[ok] = np.linalg.cholesky(M[ok])
    except np.linalg.LinAlgError:  # some are not PD: one at a time
        for b in np.flatnonzero(ok):
            try:
                L[b] = np.linalg.cholesky(M[b])
            except np.linalg.LinAlgError:
                ok[b] = False
    Linv = np.full_like(M, np.nan)
    if ok.any():
        Linv[ok] = np.linalg.inv(L[ok])
    return ok, Linv


def fractional_cavity(
    q: NaturalGaussian, site: NaturalGaussian, alphas: Sequence[float] = (1.0, 0.9, 0.75, 0.5, 0.25, 0.0)
) -> tuple[NaturalGaussian, float]:
    """``q / site**alpha`` with the largest ``alpha`` in ``alphas`` that is positive definite.

    ``alpha = 1`` is the cavity. A site more precise than ``q`` in some direction (possible
    in EP when other sites are negative there) makes it improper; removing only part of the
    site keeps most of the correction for the client's own data (``alpha = 0`` is ``q``).
    """
    for a in alphas:
        c = q / (site**a)
        if c.is_proper():
            return c, a
    raise FloatingPointError("the global approximation q is not positive definite")


class PosteriorRound(FederatedAlgorithm):
    """One counted round after an EP fit in which every client forms its own posterior from
    its committed site and the fitted ``q`` (its cavity ``q / site_k``, see
    :func:`fractional_cavity`) and sends a mean and covariance. Subclasses implement
    ``client_steps``; :meth:`cavities` gives them every client's cavity moments. The replies
    stay per client (no :attr:`summed_keys`): each is that client's posterior, a result of
    the fit."""

    reply_keys = ("mean", "cov")
    per_client_fields = ("sites",)

    def __init__(self, site: SiteModel, q: NaturalGaussian, sites: Mapping[ClientId, NaturalGaussian]) -> None:
        self.site, self.q, self.sites = site, q, sites

    def init_server(self, clients: Sequence[ClientId], rng: np.random.Generator) -> dict[ClientId, Message]:
        return {}

    def init_client(self, client: ClientId, data: Any, rng: np.random.Generator) -> NaturalGaussian:
        return self.sites[client]

    def broadcast(self, server_state: Any, client: ClientId, round: int) -> Message:
        return {"r": self.q.r, "Q": self.q.Q}

    def client_step(
        self, message: Message, state: NaturalGaussian, data: Any, rng: np.random.Generator
    ) -> tuple[Message, Any]:
        out = self.client_steps([message], [state], [data], [rng])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    @staticmethod
    def cavities(messages: Sequence[Message], states: Sequence[NaturalGaussian]) -> tuple[np.ndarray, np.ndarray]:
        """Stacked cavity means and covariances of the clients of one call."""
        moments = [
            fractional_cavity(NaturalGaussian(np.asarray(m["r"]), np.asarray(m["Q"])), s)[0].moments()
            for m, s in zip(messages, states)
        ]
        return np.stack([m for m, _ in moments]), np.stack([C for _, C in moments])

    def server_step(
        self, server_state: Any, replies: Mapping[ClientId, Message], round: int
    ) -> tuple[dict[ClientId, Message], dict[str, float]]:
        return dict(replies), {}


def posterior_round(
    algorithm: PosteriorRound, data: Any, *, seed: int, batched: bool, who: str
) -> dict[ClientId, tuple[np.ndarray, np.ndarray]]:
    """Run ``algorithm`` for its one counted round ("client posteriors"); ``{client: (mean,
    cov)}``, or a ``RuntimeError`` naming the first client that could not form its posterior."""
    from ..federation import run

    out = run(algorithm, data, rounds=1, seed=seed, progress=False, batched=batched, kind="client posteriors")
    failed = {c: why for rec in out.history for c, why in rec.failed.items()}
    if failed and not (in_fit() and out.server_state):  # in a fit, such a client drops out of it
        c, why = next(iter(failed.items()))
        raise RuntimeError(f"{who}: client {c!r} could not form its posterior: {why}")
    return {c: (np.asarray(r["mean"]), np.asarray(r["cov"])) for c, r in out.server_state.items()}
