"""Opt-in differential privacy for the sums a federated model releases.

The pieces a sum-based model (FedEM, federated moments, FederatedGLM) needs to make its
released sums differentially private under the add-or-remove-one-row relation:

* :class:`DifferentialPrivacy`: the user's option: noise multiplier ``z``, per-row L2 bound(s)
  ``clip``, ``delta``, the accountant (``"rdp"`` or ``"pld"``) and where the noise is added
  (``"client"``: every client adds its share, summed under secure aggregation; ``"central"``:
  the server adds it once).
* :func:`clip_rows`: a client's per-row contributions to the summed keys of one release,
  clipped to the bound(s) and summed; :func:`noise_scales`: each key's noise scale, so that the
  release is one Gaussian mechanism of noise multiplier ``z``; :func:`gaussian_noise`: that
  mechanism's noise (or one client's share of it); :func:`effective_noise_multiplier`: the
  noise a release actually had when fewer clients answered than were asked.
* :class:`PrivacyLedger`: every release (round or one-off exchange) with its noise, and the
  spent ``(epsilon, delta)`` from Google's dp-accounting (``pip install 'fedstats[privacy]'``;
  imported only when an epsilon is computed).

* :class:`PrivacySpent`: a fit's option and ledger, the ``privacy`` attribute of its result
  (``None`` for a fit without differential privacy).

The noise is not part of a model's intervals unless the model says it includes it
(:meth:`DifferentialPrivacy.noise_std` gives its size on each released sum).

Examples
--------
>>> import numpy as np
>>> from fedstats.privacy import DifferentialPrivacy, PrivacyLedger
>>> dp = DifferentialPrivacy(noise_multiplier=0.0, clip={"n": 1.0, "s": 5.0}, placement="central")
>>> clients = [np.array([1.0, 2.0]), np.array([3.0, 4.0, 9.0])]
>>> replies = [dp.client_sums({"n": np.ones(len(x)), "s": x}, np.random.default_rng(i), n_clients=2)
...            for i, x in enumerate(clients)]
>>> [r.n_clipped for r in replies]  # the client's own diagnostics, never sent
[0, 1]
>>> sums = dp.server_sums({k: sum(r.sums[k] for r in replies) for k in ("n", "s")}, np.random.default_rng(9))
>>> float(sums["s"] / sums["n"])  # the mean, with the row of 9 clipped to 5
3.0
>>> ledger = PrivacyLedger(dp.accountant)
>>> ledger.record("mean", dp.effective_noise_multiplier(n_clients=2, n_answered=2, secure_aggregation=False))
>>> ledger.summary(dp.delta)["epsilon"]  # no noise: no guarantee
inf
"""

from .ledger import NEIGHBOURING, PrivacyLedger, PrivacySpent, Release, run_seed, spent_together
from .mechanism import ClippedSums, clip_rows, effective_noise_multiplier, gaussian_noise, noise_scales
from .options import DEFAULT_DELTA, WARN_EPSILON, DifferentialPrivacy, release_option

__all__ = [
    "DifferentialPrivacy",
    "DEFAULT_DELTA",
    "WARN_EPSILON",
    "spent_together",
    "clip_rows",
    "ClippedSums",
    "noise_scales",
    "gaussian_noise",
    "effective_noise_multiplier",
    "PrivacyLedger",
    "PrivacySpent",
    "run_seed",
    "release_option",
    "Release",
    "NEIGHBOURING",
]
