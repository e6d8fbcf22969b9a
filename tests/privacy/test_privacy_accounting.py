"""The privacy ledger's epsilon against computations written here: dp-accounting called
directly on the same mechanism and steps, the RDP bound of the Gaussian mechanism in closed
form (numpy only), and the exact epsilon of the Gaussian mechanism (Balle and Wang 2018,
"Improving the Gaussian mechanism for differential privacy", Theorem 8), which every valid
accountant must bound from above."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from fedstats.privacy import DifferentialPrivacy, PrivacyLedger

dpa = pytest.importorskip("dp_accounting")

#: dp-accounting's default RDP orders, written out (the ledger uses the library's default)
ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024], dtype=float)


def accountant(kind: str):
    return dpa.rdp.RdpAccountant() if kind == "rdp" else dpa.pld.PLDAccountant()


def rdp_epsilon(zs: list[float], delta: float) -> float:
    """Closed form: the Gaussian mechanism of multiplier z has RDP alpha / (2 z^2) at every
    order alpha; RDP adds up under composition; the conversion to (epsilon, delta) is
    Canonne, Kamath and Steinke (2020), Proposition 12, minimised over the orders."""
    rho = sum(1 / (2 * z**2) for z in zs)
    a = ORDERS
    return float(np.min(rho * a + np.log1p(-1 / a) - np.log(delta * a) / (a - 1)))


def exact_epsilon(sigma: float, delta: float) -> float:
    """The smallest epsilon of the Gaussian mechanism with sensitivity 1 and noise sigma:
    delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)."""

    def excess(eps: float) -> float:
        u, v = 1 / (2 * sigma), eps * sigma
        return math.exp(norm.logcdf(u - v)) - math.exp(eps + norm.logcdf(-u - v)) - delta

    return float(brentq(excess, 0.0, 500.0, xtol=1e-13))


@pytest.mark.parametrize("kind", ["rdp", "pld"])
@pytest.mark.parametrize("z, rounds", [(0.8, 1), (1.5, 10), (4.0, 50)])
def test_epsilon_equals_dp_accounting_on_the_same_mechanism(kind, z, rounds):
    ledger = PrivacyLedger(kind)
    for _ in range(rounds):
        ledger.record("round", z)
    expected = accountant(kind).compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), rounds)).get_epsilon(1e-6)
    assert ledger.epsilon(1e-6) == pytest.approx(expected, rel=1e-9)
    if kind == "rdp":
        assert ledger.epsilon(1e-6) == pytest.approx(rdp_epsilon([z] * rounds, 1e-6), rel=1e-9)


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_a_fit_of_several_kinds_of_release_composes_them_all(kind):
    # a design check, 8 rounds, 3 rounds with fewer clients answering, a one-off exchange
    dp = DifferentialPrivacy(noise_multiplier=1.2, clip=1.0, accountant=kind)
    z_short = dp.effective_noise_multiplier(n_clients=10, n_answered=7, secure_aggregation=True)
    ledger = PrivacyLedger(kind)
    ledger.record("design check", 2.0)
    ledger.record("round", 1.2, count=8)
    ledger.record("round", z_short, count=3)
    ledger.record("sandwich", 2.0)
    zs = [2.0] + [1.2] * 8 + [z_short] * 3 + [2.0]
    # dp-accounting on the releases one by one, in the order they happened
    expected = accountant(kind).compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(z) for z in zs])).get_epsilon(1e-6)
    got = ledger.epsilon(1e-6)
    # the ledger groups equal multipliers: the same for RDP (sums), within PLD's discretisation
    assert got == pytest.approx(expected, rel=1e-9 if kind == "rdp" else 1e-6)
    # composed Gaussian mechanisms are one Gaussian of multiplier (sum 1/z^2)^(-1/2)
    z_one = sum(1 / z**2 for z in zs) ** -0.5
    assert got >= exact_epsilon(z_one, 1e-6) * (1 - 1e-8)
    if kind == "rdp":
        assert got == pytest.approx(rdp_epsilon(zs, 1e-6), rel=1e-9)
    else:
        assert got == pytest.approx(exact_epsilon(z_one, 1e-6), abs=1e-3)


@pytest.mark.parametrize("z, rounds", [(0.8, 1), (2.0, 1), (10.0, 1), (3.0, 25)])
def test_accountants_bound_the_exact_gaussian_epsilon_and_pld_is_close_to_it(z, rounds):
    delta = 1e-5
    exact = exact_epsilon(z / math.sqrt(rounds), delta)  # T compositions: z / sqrt(T)
    eps = {}
    for kind in ("rdp", "pld"):
        ledger = PrivacyLedger(kind)
        ledger.record("round", z, count=rounds)
        eps[kind] = ledger.epsilon(delta)
    assert eps["rdp"] >= exact and eps["rdp"] <= exact * 1.25 + 0.1  # RDP: valid, somewhat loose
    assert exact * (1 - 1e-8) <= eps["pld"] <= exact + 1e-3  # PLD: valid, tight
    assert eps["pld"] <= eps["rdp"]
    if z == 10.0:  # the classical bound (Dwork and Roth, Theorem A.1) holds for epsilon < 1
        classical = math.sqrt(2 * math.log(1.25 / delta)) / z
        assert classical < 1 and exact <= classical and eps["pld"] <= classical


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    def eps(z: float, rounds: int) -> float:
        ledger = PrivacyLedger("rdp")
        ledger.record("round", z, count=rounds)
        return ledger.epsilon(1e-6)

    assert eps(1.0, 1) < eps(1.0, 2) < eps(1.0, 10)
    assert eps(4.0, 10) < eps(2.0, 10) < eps(1.0, 10)
    # the ledger's delta: a larger delta buys a smaller epsilon
    ledger = PrivacyLedger("rdp")
    ledger.record("round", 1.0, count=5)
    assert ledger.epsilon(1e-3) < ledger.epsilon(1e-6) < ledger.epsilon(1e-9)


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_no_noise_is_infinite_epsilon_as_dp_accounting_says(kind):
    ledger = PrivacyLedger(kind)
    ledger.record("round", 1.0, count=3)
    ledger.record("one-off", 0.0)
    assert ledger.epsilon(1e-6) == math.inf
    assert accountant(kind).compose(dpa.GaussianDpEvent(0.0)).get_epsilon(1e-6) == math.inf


def test_the_dp_event_and_the_summary():
    ledger = PrivacyLedger("pld")
    ledger.record("design check", 2.0)
    ledger.record("round", 1.0, count=4)
    ledger.record("sandwich", 2.0)
    assert ledger.dp_event() == dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 2), dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.0), 4)]
    )
    s = ledger.summary(1e-6)
    assert s["epsilon"] == ledger.epsilon(1e-6) and 0 < s["epsilon"] < math.inf
    assert s["accountant"] == "pld" and s["delta"] == 1e-6 and s["noiseless_releases"] == []
    assert s["releases"] == [
        {"name": "design check", "noise_multiplier": 2.0, "count": 1},
        {"name": "round", "noise_multiplier": 1.0, "count": 4},
        {"name": "sandwich", "noise_multiplier": 2.0, "count": 1},
    ]
