"""FederatedGLM(dp=...): opt-in differential privacy of every release of the fit (clipped
per-row contributions, the Gaussian mechanism, one ledger), against the plain fit, a direct
dp-accounting computation, the declared noise and a seeded Monte-Carlo of refits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.federation import run
from fedstats.glm import BayesianGLM, FederatedGLM, GLMResult
from fedstats.glm._design import GLMDesign
from fedstats.glm._irls import DPIRLS
from fedstats.glm.families import family_of
from fedstats.privacy import DifferentialPrivacy

dpa = pytest.importorskip("dp_accounting")

BETA = np.array([-0.5, 1.0, -0.5, 0.25])
BIG = {"n": 1.0, "sum_y": 1e6, "xtwx": 1e6, "score": 1e6}
LOGIT = {"n": 1.0, "sum_y": 1.0, "xtwx": 5.0, "score": 4.0}


def federation(family="binomial", K=50, n=200, seed=0, beta=BETA):
    rng = np.random.default_rng(seed)
    Xs = [rng.normal(size=(n, len(beta) - 1)) for _ in range(K)]
    eta = [beta[0] + X @ beta[1:] for X in Xs]
    if family == "binomial":
        ys = [rng.binomial(1, 1 / (1 + np.exp(-e))) for e in eta]
    elif family == "poisson":
        ys = [rng.poisson(np.exp(e)) for e in eta]
    else:
        ys = [e + rng.normal(size=len(e)) for e in eta]
    return FederatedData.from_arrays(Xs, [y.astype(float) for y in ys])


@pytest.fixture(scope="module")
def logit_data():
    return federation("binomial")


def epsilon(counts, delta=1e-6):
    acct = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acct.compose(dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), c) for z, c in counts]))
    return acct.get_epsilon(delta)


# ---------------------------------------------------------------- (a) no noise: the plain fit
@pytest.mark.parametrize("family, cov_type", [("binomial", "nonrobust"), ("poisson", "nonrobust"), ("gaussian", "HC0")])
def test_no_noise_and_loose_bounds_give_the_plain_fit(family, cov_type):
    data = federation(family, K=8, n=150, seed=1)
    clip = dict(BIG, **({"pearson": 1e6} if family == "gaussian" else {}))
    if cov_type == "HC0":
        clip.update(hessian=1e6, meat=1e6)
    dp = DifferentialPrivacy(0.0, clip=clip, placement="central")
    plain = FederatedGLM(family, cov_type=cov_type).fit(data)
    res = FederatedGLM(family, cov_type=cov_type, dp=dp, dp_rounds=12).fit(data)
    np.testing.assert_allclose(res.coef, plain.coef, rtol=0, atol=1e-10)
    # the plain fit's covariance is at the coefficients one step before its last (a tol of
    # 1e-8 on the deviance), the private fit's after dp_rounds steps: equal to a few 1e-6
    np.testing.assert_allclose(res.cov, plain.cov, rtol=2e-5, atol=0)
    assert res.scale == pytest.approx(plain.scale, rel=1e-12)
    assert res.wnobs == plain.wnobs and res.df_resid == plain.df_resid
    assert np.all(res.dp_noise_cov == 0) and res.converged
    assert res.privacy.epsilon == np.inf


def test_no_noise_matches_statsmodels(logit_data):
    sm = pytest.importorskip("statsmodels.api")
    X = np.vstack([logit_data[c].X for c in logit_data.clients])
    y = np.concatenate([logit_data[c].y for c in logit_data.clients])
    ref = sm.GLM(y, sm.add_constant(X), family=sm.families.Binomial()).fit()
    res = FederatedGLM("binomial", dp=DifferentialPrivacy(0.0, clip=BIG), dp_rounds=10).fit(logit_data)
    np.testing.assert_allclose(res.coef, ref.params, atol=1e-9)
    np.testing.assert_allclose(res.bse, ref.bse, rtol=1e-6)


# ---------------------------------------------------------------- (b) the ledger
@pytest.mark.parametrize("placement", ["central", "client"])
def test_the_ledger_has_every_release_and_dp_accountings_epsilon(placement):
    data = federation("gaussian", K=6, n=80, seed=2)
    clip = {"n": 1.0, "sum_y": 5.0, "xtwx": 20.0, "score": 10.0, "pearson": 10.0, "hessian": 20.0, "meat": 50.0}
    dp = DifferentialPrivacy(3.0, clip=clip, placement=placement)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = FederatedGLM("gaussian", cov_type="HC0", dp=dp, dp_rounds=5).fit(data, seed=1)
    rel = res.privacy.ledger.releases
    assert [(r.name, r.count) for r in rel] == [
        ("design check", 1),
        ("IRLS rounds", 5),
        ("dispersion round", 1),
        ("sandwich round", 1),
    ]
    # in process nothing is summed securely: with client noise the server reads one share
    z = 3.0 if placement == "central" else 3.0 / np.sqrt(6)
    assert all(r.noise_multiplier == pytest.approx(z) for r in rel)
    assert res.privacy.epsilon == pytest.approx(epsilon([(z, 8)]), rel=1e-9)
    assert res.rounds == 5 and res.n_iter == 5
    assert res.communication.by_kind["IRLS rounds"]["rounds"] == 5


def test_one_joint_bound_and_fixed_scale_families_release_less():
    data = federation("binomial", K=5, n=60, seed=3)
    dp = DifferentialPrivacy(2.0, clip=6.0, placement="central")
    res = FederatedGLM("binomial", dp=dp, dp_rounds=4).fit(data)
    assert [(r.name, r.count) for r in res.privacy.ledger.releases] == [("design check", 1), ("IRLS rounds", 4)]
    assert res.privacy.epsilon == pytest.approx(epsilon([(2.0, 5)]), rel=1e-9)
    assert np.isnan(res.llf) and np.isnan(res.deviance) and res.n_obs == {}


# ---------------------------------------------------------------- (c) the noise has the declared size
def test_the_released_sums_carry_the_declared_noise():
    data = federation("binomial", K=5, n=60, seed=4)
    fam = family_of("binomial")
    design = GLMDesign(data, True, {"offset": None, "exposure": None, "weights": None, "trials": None})
    dp = DifferentialPrivacy(1.5, clip={"xtwx": 50.0, "score": 50.0}, placement="client")
    beta = np.array([0.1, 0.5, -0.2, 0.0])
    exact = run(DPIRLS(fam, False, beta, DifferentialPrivacy(0.0, clip=1e6), 5, 0.0), design, rounds=1)
    u0 = exact.server_state["score"][0]
    draws = np.array(
        [
            run(DPIRLS(fam, False, beta, dp, 5, 1.0), design, rounds=1, seed=s).server_state["score"][0]
            for s in range(150)
        ]
    )
    sd = dp.noise_std(["xtwx", "score"], n_clients=5, n_answered=5)["score"]
    assert sd == pytest.approx(1.5 * np.sqrt(2) * 50.0)
    z = (draws - u0) / sd
    assert np.all(np.abs(z.mean(axis=0)) < 4 / np.sqrt(150))
    assert np.all(np.abs(z.std(axis=0) - 1) < 0.2)


def test_the_noisy_row_count_has_the_declared_noise(logit_data):
    dp = DifferentialPrivacy(2.0, clip=LOGIT, placement="central")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wn = np.array([FederatedGLM("binomial", dp=dp, dp_rounds=1).fit(logit_data, seed=s).wnobs for s in range(60)])
    z = (wn - 10_000) / (2.0 * np.sqrt(2) * 1.0)
    assert abs(z.mean()) < 4 / np.sqrt(60) and abs(z.std() - 1) < 0.3


# ---------------------------------------------------------------- (d) utility and honest intervals
def test_coefficients_close_to_the_truth_and_error_grows_as_epsilon_shrinks(logit_data):
    plain = FederatedGLM("binomial").fit(logit_data)
    se = np.sqrt(np.diag(plain.cov))
    errs, eps = [], []
    for z in (1.0, 4.0, 16.0):
        dp = DifferentialPrivacy(z, clip=LOGIT, placement="central")
        e = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for seed in range(3):
                res = FederatedGLM("binomial", dp=dp).fit(logit_data, seed=seed)
                e.append(np.max(np.abs(res.coef - plain.coef) / se))
                total = np.sqrt(np.diag(plain.cov + res.dp_noise_cov))
                if z <= 4.0:  # epsilon about 14 and 3
                    assert np.all(np.abs(res.coef - BETA) < 4 * total)
        errs.append(np.mean(e))
        eps.append(res.privacy.epsilon)
    assert eps[0] > eps[1] > eps[2] and 1 < eps[1] < 10
    assert errs[0] < errs[1] < errs[2]
    assert errs[1] < 2.0  # at epsilon about 3, within two non-private standard errors of the plain fit


def test_dp_noise_cov_matches_a_monte_carlo_of_refits():
    data = federation("binomial", K=10, n=200, seed=5)
    dp = DifferentialPrivacy(4.0, clip=LOGIT, placement="central")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = [FederatedGLM("binomial", dp=dp).fit(data, seed=s) for s in range(300)]
    spread = np.array([f.coef for f in fits]).std(axis=0)
    predicted = np.sqrt(np.mean([np.diag(f.dp_noise_cov) for f in fits], axis=0))
    # the same rows, 300 noise draws: the sample sd is within about 8% (2 sd) of the truth, and
    # the delta method is first order (the information's own noise is left out)
    np.testing.assert_allclose(spread, predicted, rtol=0.15)


def test_include_dp_noise_intervals_cover_at_about_the_nominal_rate():
    dp = DifferentialPrivacy(6.0, clip=LOGIT, placement="central")
    hit_in, hit_out = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rep in range(150):
            data = federation("binomial", K=10, n=100, seed=100 + rep)
            res = FederatedGLM("binomial", dp=dp, include_dp_noise=True).fit(data, seed=rep)
            ci = res.conf_int(0.95).to_numpy()
            hit_in.append((ci[:, 0] <= BETA) & (BETA <= ci[:, 1]))
            se = np.sqrt(np.diag(res.cov - res.dp_noise_cov))
            hit_out.append(np.abs(res.coef - BETA) <= 1.96 * se)
    cover_in, cover_out = np.mean(hit_in), np.mean(hit_out)
    # 600 intervals (4 per fit, so not independent): binomial sd about 0.009 at 0.95
    assert 0.91 <= cover_in <= 0.98
    # here the DP noise's variance is about 6 times the sampling variance (epsilon about 2)
    assert cover_out < 0.8


# ---------------------------------------------------------------- (e) errors
def test_clear_errors_for_bad_input(logit_data):
    small = federation("binomial", K=3, n=30, seed=6)
    with pytest.raises(ValueError, match="dp must be None or a fedstats.privacy.DifferentialPrivacy"):
        FederatedGLM("binomial", dp={"noise_multiplier": 1.0}).fit(small)
    with pytest.raises(ValueError, match=r"missing \['score'\]"):
        FederatedGLM("binomial", dp=DifferentialPrivacy(1.0, clip={"n": 1.0, "sum_y": 1.0, "xtwx": 1.0})).fit(small)
    with pytest.raises(ValueError, match=r"not released \['pearson'\]"):
        FederatedGLM("binomial", dp=DifferentialPrivacy(1.0, clip=dict(LOGIT, pearson=1.0))).fit(small)
    with pytest.raises(ValueError, match="include_dp_noise=True needs dp="):
        FederatedGLM("binomial", include_dp_noise=True).fit(small)
    with pytest.raises(ValueError, match="dp_rounds must be an int >= 1"):
        FederatedGLM("binomial", dp=DifferentialPrivacy(1.0, clip=1.0), dp_rounds=0).fit(small)
    with pytest.raises(TypeError, match="dp"):
        BayesianGLM("binomial", dp=DifferentialPrivacy(1.0, clip=1.0))  # type: ignore[call-arg]
    # every client in every round: the runtime refuses a private run over part of them
    fam = family_of("binomial")
    design = GLMDesign(small, True, {"offset": None, "exposure": None, "weights": None, "trials": None})
    alg = DPIRLS(fam, False, np.zeros(4), DifferentialPrivacy(1.0, clip=1.0), 3, 1.0)
    with pytest.raises(ValueError, match="every client in every round"):
        run(alg, design, rounds=1, participation=0.5)
    res = FederatedGLM("binomial", dp=DifferentialPrivacy(1.0, clip=LOGIT)).fit(small)
    with pytest.raises(ValueError, match="does not release"):
        res.lr_test(FederatedGLM("binomial").fit(small))
    assert np.isfinite(res.wald_test("x0")["statistic"])


# ---------------------------------------------------------------- (f) tables and result files
def test_tables_say_whether_they_include_the_noise_and_files_keep_the_privacy(tmp_path, logit_data):
    dp = DifferentialPrivacy(4.0, clip=LOGIT, placement="central")
    res = FederatedGLM("binomial", dp=dp).fit(logit_data, seed=0)
    note = res.summary().attrs["privacy"]
    assert note.startswith("intervals exclude the differential-privacy noise (epsilon=")
    assert res.client_summary().attrs["privacy"] == note
    assert res.predict(np.zeros((2, 3))).attrs["privacy"] == note
    incl = FederatedGLM("binomial", dp=dp, include_dp_noise=True).fit(logit_data, seed=0)
    assert incl.summary().attrs["privacy"].startswith("intervals include")
    np.testing.assert_allclose(incl.cov, res.cov + res.dp_noise_cov)
    np.testing.assert_array_equal(incl.coef, res.coef)
    assert "privacy" not in FederatedGLM("binomial").fit(logit_data).summary().attrs
    back = GLMResult.load(res.save(tmp_path / "dp.fedstats"))
    assert back.privacy.epsilon == pytest.approx(res.privacy.epsilon)
    assert back.privacy.option == dp and back.privacy.ledger.releases == res.privacy.ledger.releases
    np.testing.assert_array_equal(back.dp_noise_cov, res.dp_noise_cov)
    assert back.summary().attrs["privacy"] == note
    assert back.dp_repairs == res.dp_repairs
