"""The privacy a fit spent across its releases: :class:`PrivacyLedger`.

Every round and every one-off exchange that releases noisy sums is one Gaussian mechanism
(:mod:`fedstats.privacy.mechanism`), recorded with the noise multiplier it actually had. The
releases compose adaptively (each round's query depends on the earlier rounds' answers), and
composition does not depend on the order, so the ledger hands dp-accounting one
``ComposedDpEvent`` with a ``SelfComposedDpEvent(GaussianDpEvent(z), count)`` per distinct
noise multiplier ``z`` (in the order first seen), under the add-or-remove-one-row relation.
No amplification by the sampling of clients is claimed: every release counts in full.

dp-accounting is imported only when an epsilon is computed (``pip install 'fedstats[privacy]'``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import streams
from ..estimator import is_int
from ..result_file import register
from .mechanism import _is_real, check_noise_multiplier

#: the neighbouring relation of every guarantee reported here
NEIGHBOURING = "add or remove one row"


def _dp_accounting() -> Any:
    try:
        import dp_accounting
    except ImportError as e:
        raise ImportError(
            "privacy accounting needs Google's dp-accounting package: pip install 'fedstats[privacy]'"
        ) from e
    return dp_accounting


@register
@dataclass(frozen=True)
class Release:
    """Consecutive releases of one kind: their ``name`` (a round's or an exchange's), the noise
    multiplier each actually had (noise standard deviation over sensitivity) and how many."""

    name: str
    noise_multiplier: float
    count: int


def _check_delta(delta: Any) -> float:
    if not _is_real(delta) or not math.isfinite(float(delta)) or not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def run_seed(seed: int, kind: str) -> int:
    """The seed of a fit's private run ``kind`` ("IRLS rounds", "design check", ...): apart for
    every kind, so that no two runs of one fit draw the same noise (:meth:`PrivacyLedger.claim`)."""
    return streams.run_seed(int(seed), kind)


@register
class PrivacyLedger:
    """Records every release of a fit and reports the ``(epsilon, delta)`` spent.

    Parameters
    ----------
    accountant : {"rdp", "pld"}
        dp-accounting's ``RdpAccountant`` (its default orders, 1.1 to 1024) or
        ``PLDAccountant`` (its default discretisation, 1e-4, pessimistic): both report an upper
        bound on the epsilon of the composed mechanisms; PLD's is the tighter.

    Examples
    --------
    >>> ledger = PrivacyLedger("rdp")
    >>> ledger.epsilon(1e-6)  # nothing released yet
    0.0
    >>> ledger.record("round", 0.0, count=3)  # no noise: no guarantee (needs no dp-accounting)
    >>> ledger.epsilon(1e-6)
    inf
    >>> ledger.releases
    (Release(name='round', noise_multiplier=0.0, count=3),)
    """

    def __init__(self, accountant: str = "rdp") -> None:
        if accountant not in ("rdp", "pld"):
            raise ValueError(f"accountant must be 'rdp' or 'pld', got {accountant!r}")
        self._accountant = accountant
        self._releases: list[Release] = []
        self._seeds: set[int] = set()

    @property
    def accountant(self) -> str:
        """``"rdp"`` or ``"pld"``."""
        return self._accountant

    @property
    def releases(self) -> tuple[Release, ...]:
        """The releases so far; consecutive ones of the same name and noise merged."""
        return tuple(self._releases)

    def record(self, name: str, noise_multiplier: float, count: int = 1) -> None:
        """Record ``count`` releases of one kind.

        Parameters
        ----------
        name : str
            What was released (``"round"``, ``"design check"``): for the summary.
        noise_multiplier : float
            The noise multiplier each release actually had (``z >= 0``; after dropouts, see
            :meth:`DifferentialPrivacy.effective_noise_multiplier`). ``0``: no noise, so no
            guarantee: the epsilon is then ``inf``.
        count : int
            How many such releases (rounds), ``>= 1``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        z = check_noise_multiplier(noise_multiplier)
        if not is_int(count) or count < 1:
            raise ValueError(f"count must be an integer >= 1, got {count!r}")
        last = self._releases[-1] if self._releases else None
        if last is not None and last.name == name and last.noise_multiplier == z:
            self._releases[-1] = Release(name, z, last.count + int(count))
        else:
            self._releases.append(Release(name, z, int(count)))

    def claim(self, seed: int) -> None:
        """Record that a run drew its noise from ``seed``. A second run of the same fit with
        the same seed would draw the same noise (the runtime's streams depend on the seed and
        the round), so the difference of two releases would be noise-free: refused. A fit
        gives each of its private runs its own seed (:func:`run_seed`)."""
        seeds = self.__dict__.setdefault("_seeds", set())
        if int(seed) in seeds:
            raise ValueError(
                f"two private runs of one fit use seed {seed}: their noise would repeat and cancel "
                "in a difference (give each run its own seed, see fedstats.privacy.run_seed)"
            )
        seeds.add(int(seed))

    def extend(self, other: PrivacyLedger) -> None:
        """Record every release of ``other`` here too (a fit's ledger collects those of its runs)."""
        for r in other.releases:
            self.record(r.name, r.noise_multiplier, r.count)

    def dp_event(self) -> Any:
        """The composed mechanism as dp-accounting's ``DpEvent``: a ``ComposedDpEvent`` of one
        ``SelfComposedDpEvent(GaussianDpEvent(z), count)`` per distinct ``z``."""
        dpa = _dp_accounting()
        counts: dict[float, int] = {}
        for r in self._releases:
            counts[r.noise_multiplier] = counts.get(r.noise_multiplier, 0) + r.count
        return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), n) for z, n in counts.items()])

    def epsilon(self, delta: float) -> float:
        """The ``epsilon`` spent at ``delta`` by all the releases recorded: ``0.0`` for none,
        ``inf`` when any release had no noise, else dp-accounting's bound."""
        d = _check_delta(delta)
        if not self._releases:
            return 0.0
        if any(r.noise_multiplier == 0.0 for r in self._releases):
            return math.inf
        dpa = _dp_accounting()
        relation = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
        if self._accountant == "rdp":
            acct = dpa.rdp.RdpAccountant(neighboring_relation=relation)
        else:
            acct = dpa.pld.PLDAccountant(neighboring_relation=relation)
        acct.compose(self.dp_event())
        return float(acct.get_epsilon(d))

    def summary(self, delta: float) -> dict[str, Any]:
        """The spent budget for a result object: ``epsilon`` (``inf`` when a release had no
        noise), ``delta``, ``accountant``, ``neighbouring`` (the relation), ``releases`` (a list
        of ``{"name", "noise_multiplier", "count"}``) and ``noiseless_releases`` (the names of
        releases with no noise, whose presence makes ``epsilon`` infinite)."""
        d = _check_delta(delta)
        return {
            "epsilon": self.epsilon(d),
            "delta": d,
            "accountant": self._accountant,
            "neighbouring": NEIGHBOURING,
            "releases": [
                {"name": r.name, "noise_multiplier": r.noise_multiplier, "count": r.count} for r in self._releases
            ],
            "noiseless_releases": sorted({r.name for r in self._releases if r.noise_multiplier == 0.0}),
        }


@register
@dataclass(frozen=True)
class PrivacySpent:
    """What a differentially private fit spent: the user's option and the fit's ledger (every
    run and one-off exchange that released noisy sums). A result's ``privacy`` attribute.

    Examples
    --------
    >>> from fedstats.privacy import DifferentialPrivacy
    >>> ledger = PrivacyLedger()
    >>> ledger.record("EM rounds", 0.0, count=4)
    >>> spent = PrivacySpent(DifferentialPrivacy(noise_multiplier=0.0, clip=1.0), ledger)
    >>> spent
    PrivacySpent(epsilon=inf, delta=1e-06, accountant='rdp', releases=4)
    >>> spent.note()
    'intervals exclude the differential-privacy noise (epsilon=inf, delta=1e-06; releases without noise: EM rounds)'
    """

    option: Any  # DifferentialPrivacy (not imported here: options imports nothing from the ledger)
    ledger: PrivacyLedger

    @property
    def delta(self) -> float:
        return float(self.option.delta)

    @property
    def epsilon(self) -> float:
        """The epsilon spent at the option's delta (``inf`` when a release had no noise)."""
        return self.ledger.epsilon(self.delta)

    def summary(self) -> dict[str, Any]:
        """:meth:`PrivacyLedger.summary` at the option's delta, with the option itself."""
        return {**self.ledger.summary(self.delta), "option": self.option.as_dict()}

    def note(self, included: bool = False) -> str:
        """The sentence a result's tables carry: whether their intervals include the noise."""
        s = self.summary()
        what = "include" if included else "exclude"
        extra = f"; releases without noise: {', '.join(s['noiseless_releases'])}" if s["noiseless_releases"] else ""
        return (
            f"intervals {what} the differential-privacy noise (epsilon={s['epsilon']:.4g}, delta={s['delta']:g}{extra})"
        )

    def warning(self) -> str | None:
        """Why the fit's epsilon is too large to mean much, or ``None``: the epsilon exceeds the
        option's ``warn_epsilon``."""
        eps = self.epsilon
        level = float(getattr(self.option, "warn_epsilon", math.inf))
        if not eps > level:
            return None
        z = float(self.option.noise_multiplier)
        least = min((r.noise_multiplier for r in self.ledger.releases), default=z)
        why = ""
        if least < z:
            why = (
                f" The releases carried noise multipliers down to {least:.3g}, not {z:g}: with "
                "placement='client' and no secure aggregation the server reads each client's reply, "
                "which holds only that client's share of the noise (secure aggregation restores it)."
            )
        return (
            f"this fit spent epsilon={eps:.3g} at delta={self.delta:g}, more than warn_epsilon={level:g}: "
            f"the guarantee bounds little.{why} Spend less with a larger noise_multiplier, fewer rounds"
            " or secure aggregation; DifferentialPrivacy(warn_epsilon=...) sets this level."
        )

    def __repr__(self) -> str:
        n = sum(r.count for r in self.ledger.releases)
        return (
            f"PrivacySpent(epsilon={self.epsilon:.4g}, delta={self.delta:g}, "
            f"accountant={self.ledger.accountant!r}, releases={n})"
        )


def spent_together(*spent: Any) -> PrivacyLedger:
    """The releases of several differentially private fits of the same data, composed: each
    fit reports its own epsilon, and analysing the same rows again spends more. Takes results
    (their ``privacy``), :class:`PrivacySpent` or ledgers, all with one accountant.

    >>> a, b = PrivacyLedger(), PrivacyLedger()
    >>> a.record("IRLS rounds", 2.0, count=5)
    >>> b.record("EM rounds", 2.0, count=5)
    >>> round(spent_together(a, b).epsilon(1e-6), 3) > round(a.epsilon(1e-6), 3)
    True
    """
    ledgers = []
    for s in spent:
        s = getattr(s, "privacy", s)
        s = getattr(s, "ledger", s)
        if not isinstance(s, PrivacyLedger):
            raise TypeError(
                f"spent_together takes results with a privacy attribute, PrivacySpent or ledgers, got {s!r}"
            )
        ledgers.append(s)
    if not ledgers:
        raise ValueError("spent_together needs at least one fit")
    kinds = {x.accountant for x in ledgers}
    if len(kinds) > 1:
        raise ValueError(f"the fits used different accountants {sorted(kinds)}: compose fits of one accountant")
    out = PrivacyLedger(ledgers[0].accountant)
    for x in ledgers:
        out.extend(x)
    return out
