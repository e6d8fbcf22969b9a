"""The checks after a federated EP run (:class:`~fedstats.inference.ep.FederatedEP`): who took
part, whether it converged (and why not), and that the global approximation is the prior
times the clients' sites (in process, where every site is here), naming a client whose
replies were not its site's changes."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..federation.protocol import ClientId, ProtocolError
from ..federation.records import not_in_fit
from .gaussian import NaturalGaussian

if TYPE_CHECKING:
    from .ep import EPServerState, FederatedEP


def check_participation(history, clients, lost=None) -> dict:
    """The clients that are not in the fit, with the reason (:func:`~fedstats.federation.not_in_fit`;
    the fit's entry, :func:`~fedstats.results.counted`, warns about them); raises if no client
    ever answered (q would be the prior)."""
    excluded = not_in_fit(history, clients, lost)
    if len(excluded) == len(list(clients)):
        first = next(iter(excluded.items()), None)
        detail = f"; e.g. client {first[0]!r}: {first[1]}" if first else ""
        raise RuntimeError(f"no client answered in {len(history)} round(s), the fit is the prior{detail}")
    return excluded


def check_run(run: Any, algorithm: FederatedEP, clients: Sequence[ClientId], rounds: int, *, what: str = "EP") -> dict:
    """After an EP run: ``q = prior * prod sites`` checked where every site is here (on Flower
    they stay on the nodes; a lost client's last site is in ``q`` but nowhere else), warn if it
    stopped unconverged (:func:`warn_unconverged`), and return the clients not in the fit
    (:func:`check_participation`)."""
    from .ep import EPClientState

    states = run.client_states
    if not run.lost and all(isinstance(st, EPClientState) for st in states.values()):
        sites = algorithm.committed_sites(run.server_state, states)
        try:
            check_invariants(run.server_state, list(sites.values()))
        except AssertionError as exc:  # a client's replies are not the changes of its site
            raise ProtocolError(f"{what}: {exc}{_liars(sites, run.sent)}") from None
    excluded = check_participation(run.history, clients, run.lost)
    warn_unconverged(run, algorithm, rounds, what=what, stacklevel=5)
    return excluded


def warn_unconverged(run: Any, algorithm: FederatedEP, rounds: int, *, what: str = "EP", stacklevel: int = 4) -> None:
    """Warn when an EP run stopped without converging, saying which criterion was not met
    (the last round's changes against ``tol``, a repaired step, clients that never settled)
    and what to try. ``run`` is the :class:`~fedstats.federation.RunResult`."""
    if run.converged or not len(run.history):
        return
    last = run.history[-1].metrics
    state = run.server_state
    parts = []
    mean_sd, log_sd = last.get("max_mean_change_sd"), last.get("max_log_sd_change")
    stage_tol = algorithm.tol if state.stage + 1 >= len(algorithm.stages) else algorithm.stage_tol
    if mean_sd is not None and log_sd is not None:
        parts.append(
            f"in the last round the global mean moved by {mean_sd:.3g} posterior sd and a log sd by {log_sd:.3g} "
            f"(tol={stage_tol:g} for both)"
        )
    if last.get("gamma", 1.0) < 1.0:
        parts.append(f"the server had to shrink the last step to {last['gamma']:.3g} to keep q proper")
    waiting = sorted(set(state.clients) - set(state.quiet) - set(state.declining), key=repr)
    if mean_sd is not None and max(mean_sd, log_sd or 0.0) < stage_tol and waiting:
        parts.append(f"{len(waiting)} client(s) had not answered since the last large change (e.g. {waiting[:3]})")
    if len(algorithm.stages) > 1 and state.stage + 1 < len(algorithm.stages):
        parts.append(f"it was still in stage {state.stage + 1} of {len(algorithm.stages)}")
    detail = "; ".join(parts) or "the convergence rule was not met"
    warnings.warn(
        f"{what} did not converge in {rounds} rounds: {detail}. Its numbers are those of the last round; "
        "try more rounds, damping=0.5 (slower, steadier steps), a larger tol, or more draws for a sampled "
        "estimator (its Monte Carlo noise keeps the changes above tol)",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


def _liars(sites: Mapping[ClientId, NaturalGaussian], sent: Mapping[ClientId, Mapping[str, np.ndarray]]) -> str:
    """The clients whose summed replies differ from the site they hold, as the end of an error."""
    # how far each client's summed replies are from its site, relative to the site: a server
    # step cut short (a repaired q) leaves every client a little off, a lie far more than that
    off = {
        c: float(np.linalg.norm(np.r_[sent[c]["dr"] - site.r, np.ravel(sent[c]["dQ"] - site.Q)]))
        / max(float(np.linalg.norm(np.r_[site.r, np.ravel(site.Q)])), 1e-300)
        for c, site in sites.items()
        if c in sent
    }
    typical = float(np.median(list(off.values()))) if off else 0.0
    liars = [c for c, v in off.items() if v > max(1e-6, 10 * typical)] or [c for c, v in off.items() if v > 1e-6]
    if not liars:
        return ": the clients' replies do not add up to their sites"
    return (
        f": the changes client(s) {liars[:5]} sent do not add up to the site each holds (its replies were not "
        "its site's changes): a client that lies or a broken client step"
    )


def check_invariants(server: EPServerState, sites: Sequence[NaturalGaussian], *, atol: float = 1e-9) -> None:
    """Raise ``AssertionError`` unless ``q = prior * prod sites`` and ``q`` is PD."""
    r = server.prior.r + sum(s.r for s in sites)
    Q = server.prior.Q + sum(s.Q for s in sites)
    scale = max(1.0, float(np.max(np.abs(server.q.Q))))
    if not (
        np.allclose(r, server.q.r, atol=atol * scale, rtol=0) and np.allclose(Q, server.q.Q, atol=atol * scale, rtol=0)
    ):
        raise AssertionError("global approximation differs from prior times sites")
    if not server.q.is_proper():
        raise AssertionError("global precision is not positive definite")
