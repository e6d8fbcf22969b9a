"""The privacy ledger's bookkeeping, none of which needs dp-accounting: recording and merging
releases, an empty ledger (epsilon 0), a release without noise (epsilon inf), bad records, and
the install hint when dp-accounting is missing."""

from __future__ import annotations

import math
import sys

import pytest

from fedstats.privacy import NEIGHBOURING, PrivacyLedger, Release


def test_records_merge_consecutive_releases_of_one_kind():
    ledger = PrivacyLedger()
    ledger.record("design check", 2.0)
    for _ in range(5):
        ledger.record("round", 1.0)
    ledger.record("round", 0.5, count=2)  # fewer answered: less noise, a new entry
    ledger.record("sandwich", 2.0)
    ledger.record("round", 1.0, count=3)
    assert ledger.releases == (
        Release("design check", 2.0, 1),
        Release("round", 1.0, 5),
        Release("round", 0.5, 2),
        Release("sandwich", 2.0, 1),
        Release("round", 1.0, 3),
    )


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_nothing_released_spends_nothing(accountant):
    ledger = PrivacyLedger(accountant)
    assert ledger.epsilon(1e-6) == 0.0
    assert ledger.summary(1e-6) == {
        "epsilon": 0.0,
        "delta": 1e-6,
        "accountant": accountant,
        "neighbouring": NEIGHBOURING,
        "releases": [],
        "noiseless_releases": [],
    }


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_a_release_without_noise_gives_an_infinite_epsilon_and_says_which(accountant):
    ledger = PrivacyLedger(accountant)
    ledger.record("round", 0.0, count=4)
    assert ledger.epsilon(1e-6) == math.inf
    s = ledger.summary(1e-5)
    assert s["epsilon"] == math.inf and s["delta"] == 1e-5
    assert s["releases"] == [{"name": "round", "noise_multiplier": 0.0, "count": 4}]
    assert s["noiseless_releases"] == ["round"]


def test_bad_records_and_deltas_raise_clearly():
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match="accountant must be 'rdp' or 'pld'"):
        PrivacyLedger("gdp")
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        ledger.record("", 1.0)
    with pytest.raises(ValueError, match="noise_multiplier must be a finite number >= 0"):
        ledger.record("round", -1.0)
    with pytest.raises(ValueError, match="noise_multiplier must be a finite number >= 0"):
        ledger.record("round", math.inf)
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        ledger.record("round", 1.0, count=0)
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        ledger.record("round", 1.0, count=2.5)  # type: ignore[arg-type]
    for bad in (0.0, 1.0, -1e-6, math.nan):
        with pytest.raises(ValueError, match=r"delta must be a number in \(0, 1\)"):
            ledger.epsilon(bad)
    assert ledger.releases == ()


def test_missing_dp_accounting_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import dp_accounting now fails
    ledger = PrivacyLedger()
    ledger.record("round", 1.0)
    with pytest.raises(ImportError, match=r"pip install 'fedstats\[privacy\]'"):
        ledger.epsilon(1e-6)


def test_a_results_privacy_survives_save_and_load(tmp_path):
    import pickle

    from fedstats.privacy import DifferentialPrivacy, PrivacySpent
    from fedstats.results import FederatedResult, load_result, register, save_result

    @register
    class _WithPrivacy(FederatedResult):
        pass

    dp = DifferentialPrivacy(noise_multiplier=1.0, clip={"n": 1.0, "s": 2.0}, placement="central")
    ledger = PrivacyLedger("pld")
    ledger.record("EM rounds", 1.0, count=3)
    res = _WithPrivacy()
    res.privacy = PrivacySpent(dp, ledger)
    back = load_result(save_result(res, tmp_path / "r.fedstats"))
    assert back.privacy.option == dp and hash(back.privacy.option) == hash(dp)
    assert back.privacy.ledger.releases == ledger.releases and back.privacy.ledger.accountant == "pld"
    assert back.privacy.epsilon == res.privacy.epsilon
    assert pickle.loads(pickle.dumps(dp)) == dp
    assert "exclude the differential-privacy noise" in res.privacy.note()
