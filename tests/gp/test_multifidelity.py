"""Multi-fidelity: the test functions against published values, the federation layouts, AR1
co-kriging against its closed form, and the paper-protocol gate (spec fgpr.md §9 item 12)."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.experiments.multifidelity_paper import mf_run
from fedstats.gp import testfunctions as tf
from fedstats.gp.multifidelity import AR1CoKriging, SeparateGP, fidelity_data

# --------------------------------------------------------------------------- test functions


def test_branin_and_hartmann_reach_their_published_minima():
    # Branin: 0.397887 at (-pi, 12.275), (pi, 2.275), (9.42478, 2.475)
    X = np.array([[-np.pi, 12.275], [np.pi, 2.275], [9.42478, 2.475]])
    np.testing.assert_allclose(tf.branin_hf(X), 0.397887, atol=1e-5)
    # Hartmann-3 (usual negative sign): -3.86278 at (0.114614, 0.555649, 0.852547)
    np.testing.assert_allclose(
        tf.hartmann3(np.array([[0.114614, 0.555649, 0.852547]]), 3, code_compat=True), -3.86278, atol=1e-5
    )


def test_known_values_of_the_other_simulators():
    # CURRIN at (0.5, 0.5): (1 - e^-1) * 1868.5 / 159.5
    np.testing.assert_allclose(tf.currin_hf(np.array([[0.5, 0.5]])), (1 - np.exp(-1)) * 1868.5 / 159.5, rtol=1e-12)
    x1 = 0.3  # at x2 = 0, exp(-1 / (2 x2)) = exp(-inf) = 0: the factor is 1
    ratio = (2300 * x1**3 + 1900 * x1**2 + 2092 * x1 + 60) / (100 * x1**3 + 500 * x1**2 + 4 * x1 + 20)
    np.testing.assert_allclose(tf.currin_hf(np.array([[x1, 0.0]])), ratio, rtol=1e-12)
    # 1-D examples
    np.testing.assert_allclose(tf.linear_1d_hf(np.array([[0.75]])), 6.25 * np.sin(5), rtol=1e-12)
    np.testing.assert_allclose(tf.nonlinear_1d_hf(np.array([[0.1]])), 0.1 * np.exp(1.0) - 1, rtol=1e-12)
    # Borehole at the centre of its box: finite and positive, LF above HF (5 pi / 2 pi numerator)
    box = tf.problem("borehole").bounds
    c = box.mean(1)[None]
    assert 0 < tf.borehole_hf(c)[0] < tf.borehole_lf(c)[0]


def test_code_compat_variants_differ_only_where_the_spec_says():
    rng = np.random.default_rng(0)
    X = tf.problem("branin").sample(50, rng)
    assert not np.allclose(tf.branin_mf(X), tf.branin_mf(X, code_compat=True))
    assert not np.allclose(tf.branin_lf(X), tf.branin_lf(X, code_compat=True))
    # MF: the code drops the square root of y_h(x - 2); LF: the code takes -3 x2 at z = 1.2 (x + 2)
    h = tf.branin_hf(X - 2)
    np.testing.assert_allclose(tf.branin_mf(X, code_compat=True) - tf.branin_mf(X), 10 * (h - np.sqrt(h)), rtol=1e-10)
    Z = 1.2 * (X + 2)
    np.testing.assert_allclose(tf.branin_lf(X), tf.branin_mf(Z) - 3 * X[:, 1] + 1, rtol=1e-12)
    np.testing.assert_allclose(
        tf.branin_lf(X, code_compat=True), tf.branin_mf(Z, code_compat=True) - 3 * Z[:, 1] + 1, rtol=1e-12
    )
    H = rng.uniform(size=(20, 3))
    np.testing.assert_allclose(tf.hartmann3(H, 2), -tf.hartmann3(H, 2, code_compat=True))
    # the fidelity shift alpha_t = alpha + (3 - t) delta, written out for t = 1 at one point
    x = np.array([[0.2, 0.5, 0.8]])
    alpha1 = np.array([1.0, 1.2, 3.0, 3.2]) + 2 * np.array([0.01, -0.01, -0.1, 0.1])
    A = np.array([[3, 10, 30], [0.1, 10, 35], [3, 10, 30], [0.1, 10, 35]])
    P = np.array(
        [[0.3689, 0.1170, 0.2673], [0.4699, 0.4387, 0.7470], [0.1091, 0.8732, 0.5547], [0.0381, 0.5743, 0.8828]]
    )
    np.testing.assert_allclose(
        tf.hartmann3(x, 1), sum(alpha1[i] * np.exp(-(A[i] * (x[0] - P[i]) ** 2).sum()) for i in range(4)), rtol=1e-12
    )
    # PARK and Borehole low fidelities from the high ones (spec §4.3)
    Xp = tf.problem("park").sample(10, rng)
    np.testing.assert_allclose(
        tf.park_lf(Xp),
        (1 + np.sin(Xp[:, 0]) / 10) * tf.park_hf(Xp) - 2 * Xp[:, 0] + Xp[:, 1] ** 2 + Xp[:, 2] ** 2 + 0.5,
        rtol=1e-12,
    )


def test_correlations_between_fidelities_match_the_spec():
    rng = np.random.default_rng(1)
    for name, lo in (("currin", 0.99), ("park", 0.99), ("hartmann", 0.99), ("borehole", 0.999)):
        p = tf.problem(name)
        X = p.sample(5000, rng)
        assert np.corrcoef(p.fidelities["HF"](X), p.fidelities["LF"](X))[0, 1] > lo, name
    p = tf.problem("branin")
    X = p.sample(5000, rng)
    assert abs(np.corrcoef(p.fidelities["HF"](X), p.fidelities["MF"](X))[0, 1]) < 0.4  # strongly non-linear


def test_the_forrester_pair():
    # its published minimum, -6.02074 at x = 0.75725 (Forrester et al. 2008), and the low fidelity's formula
    x = np.linspace(0, 1, 200_001)
    f = tf.forrester_hf(x)
    assert f.min() == pytest.approx(-6.02074, abs=1e-5) and x[f.argmin()] == pytest.approx(0.75725, abs=1e-4)
    np.testing.assert_allclose(tf.forrester_lf(x), 0.5 * f + 10 * (x - 0.5) - 5)
    np.testing.assert_allclose(tf.linear_1d_lf(x) - tf.forrester_lf(x), 10.0)  # Cutajar et al.'s C = +5
    mf = fidelity_data("forrester")
    assert mf.train.n_obs == {"HF": 4, "LF": 11}


def test_against_botorch_when_installed():
    bt = pytest.importorskip("botorch.test_functions")
    import torch

    rng = np.random.default_rng(2)
    X = tf.problem("branin").sample(20, rng)
    np.testing.assert_allclose(tf.branin_hf(X), bt.Branin()(torch.as_tensor(X)).numpy(), rtol=1e-10)
    H = rng.uniform(size=(20, 3))
    # BoTorch keeps Hartmann's constants in torch's default float32 (ALPHA's 1.2 is 1.2000000477):
    # equal to its rounding of them
    np.testing.assert_allclose(
        tf.hartmann3(H, 3, code_compat=True), bt.Hartmann(dim=3)(torch.as_tensor(H)).numpy(), rtol=1e-6
    )


# --------------------------------------------------------------------------- federation


def test_fidelity_layouts():
    mf = fidelity_data("branin", seed=0)
    assert mf.train.clients == ["HF", "MF", "LF"] and mf.train.n_obs == {"HF": 20, "MF": 40, "LF": 200}
    assert mf.X_test.shape == (1000, 2) and mf.X_test.min() >= 0 and mf.X_test.max() <= 1
    code = fidelity_data("currin", seed=0, layout="code")
    assert code.train.n_obs == {"HF1": 40, "HF2": 40, "LF1": 200, "LF2": 200} and code.hf_client == "HF1"
    grid = fidelity_data("nonlinear_1d", seed=0)
    np.testing.assert_allclose(np.asarray(grid.train["HF"].X)[:, 0], np.linspace(0, 1, 20))
    with pytest.raises(ValueError, match="unknown problem"):
        fidelity_data("rosenbrock")


# --------------------------------------------------------------------------- AR1


def test_ar1_with_exact_lower_fidelity_recovers_an_affine_link():
    # f_h = 2 f_l + 0.5 with f_l smooth: AR1 must find rho near 2 (on standardised scales, 1) and predict well
    rng = np.random.default_rng(3)
    f_l = lambda X: np.sin(20 * X[:, 0])  # noqa: E731
    Xl, Xh = rng.uniform(size=(80, 1)), rng.uniform(size=(8, 1))
    ar = AR1CoKriging().fit([(Xl, f_l(Xl)), (Xh, 2 * f_l(Xh) + 0.5)])
    Xs = np.linspace(0, 1, 200)[:, None]
    pred = ar.predict(Xs, scale="original")
    assert np.sqrt(np.mean((pred["mean"] - (2 * f_l(Xs) + 0.5)) ** 2)) < 0.05
    sep = SeparateGP(protocol="converged").fit(Xh, 2 * f_l(Xh) + 0.5)
    sep_rmse = np.sqrt(np.mean((sep.predict(Xs, client="HF")["mean"] - (2 * f_l(Xs) + 0.5)) ** 2))
    assert sep_rmse > 0.2  # eight points alone cannot follow three periods
    # rho is reported on the data's scale: the true link, 2
    assert len(ar.rho) == 1 and abs(ar.rho[0] / 2 - 1) < 0.05, ar.rho
    # as fitted, on standardised scales, it is 2 sd(f_l at the LF points) / sd(y_h) = sd_l / sd(f_l(Xh))
    expected = np.std(f_l(Xl)) / np.std(f_l(Xh))
    fitted = ar.summary().loc["rho[fidelity1]", "standardized"]
    assert abs(fitted / expected - 1) < 0.05, (fitted, expected)


# --------------------------------------------------------------------------- paper protocol (§9 item 12)


def _gate(name, reps):
    rows = [mf_run(name, seed=s) for s in range(reps)]
    return {k: np.array([r[k] for r in rows]) for k in ("FGPR", "Separate", "AR1")}


def test_paper_protocol_currin_and_park_quick():
    cur = _gate("currin", 4)
    assert cur["FGPR"].mean() / cur["Separate"].mean() <= 0.8, cur
    assert 0.10 <= cur["FGPR"].mean() <= 0.30, cur  # the 30-run gate below is [0.10, 0.26]
    park = _gate("park", 2)
    assert park["FGPR"].mean() <= 0.03, park


@pytest.mark.slow
def test_paper_protocol_currin_and_park_30_runs():
    cur = _gate("currin", 30)
    assert cur["FGPR"].mean() / cur["Separate"].mean() <= 0.8, cur
    assert 0.10 <= cur["FGPR"].mean() <= 0.26, cur
    park = _gate("park", 30)
    assert park["FGPR"].mean() <= 0.03, park


def test_one_dimensional_examples_run_under_both_protocols():
    for proto in ("paper", "converged"):
        r = mf_run("nonlinear_1d", seed=0, protocol=proto, rounds=11)
        assert set(r) >= {"FGPR", "Separate", "AR1"} and all(np.isfinite(r[k]) for k in ("FGPR", "Separate", "AR1"))


def test_federated_ar1_equals_centralised_ar1_and_shares_only_inputs_and_predictions():
    from fedstats.gp.multifidelity import FederatedAR1

    mf = fidelity_data("branin", seed=1, sizes={"LF": 60})
    order = ["LF", "MF", "HF"]
    cen = AR1CoKriging(restarts=2).fit([mf.fidelity_data(lv) for lv in order], seed=3)
    fed = FederatedAR1(restarts=2).fit(mf.train, order=order, seed=3)
    Xs = mf.X_test[:200]
    a, b = cen.predict(Xs, scale="standardized"), fed.predict(Xs, scale="standardized")
    np.testing.assert_allclose(b["mean"], a["mean"], atol=1e-10)
    np.testing.assert_allclose(b["sd"], a["sd"], atol=1e-10)
    np.testing.assert_allclose(fed.rho, cen.rho, atol=1e-12)
    # the fit, one run of the runtime (kind "chain", 9 rounds: LF fits; MF asks, LF answers, MF
    # fits; HF asks, LF and MF answer, HF fits; all release). Down: each broadcast's task code
    # (8 one-client rounds, 3 clients in the release), the queries to the answering fidelities, the
    # mean to each fitting fidelity and LF's moments to MF with HF's queries. Up: MF's and HF's
    # inputs, the answers' means and variances, and each fidelity's release: lengthscale,
    # outputscale, noise, row count, mean, sd and rho (7 numbers)
    n_mf, n_hf = 40, 20
    comm = fed.communication
    assert set(comm.by_kind) == {"chain"} and comm.rounds == 9
    assert comm.bytes_down == 11 * 8 + (n_mf * 2 + n_hf * 2 * 2) * 8 + (n_mf + n_hf) * 8 + n_hf * 2 * 8
    assert comm.bytes_up == (n_mf * 2 + n_hf * 2) * 8 + (n_mf * 2 + n_hf * 2 * 2) * 8 + 3 * 7 * 8
    # predict (asked by HF): 200 x 2 to LF and MF, LF's moments to MF: in query_communication,
    # after the fidelities rebuilt their GPs from their rows and releases (in process)
    q = fed.query_communication.by_kind
    assert set(q) == {"rebuild", "predict"}
    assert (q["predict"]["bytes_down"], q["predict"]["bytes_up"]) == ((200 * 2 * 2 + 200 * 2) * 8, 200 * 2 * 2 * 8)


def test_ar1_options_reach_every_fidelity_and_bad_ones_are_refused_at_fit():
    from fedstats.gp.multifidelity import FederatedAR1

    mf = fidelity_data("branin", seed=1)
    order = ["LF", "MF", "HF"]
    opts = {"kernel": "matern", "nu": 2.5, "noise_floor": 1e-8, "restarts": 2}
    cen = AR1CoKriging(**opts).fit([mf.fidelity_data(lv) for lv in order], seed=0)
    fed = FederatedAR1(**opts).fit(mf.train, order=order, seed=0)
    for spec in [lv.spec for lv in cen.fidelities + fed.fidelities]:
        assert (spec.kernel, spec.nu, spec.noise_floor) == ("matern", 2.5, 1e-8)
    # the noise-free simulator's smooth lowest fidelity: a noise variance below the default floor of 1e-4
    assert float(cen.fidelities[0].hyper["noise"][0]) < 1e-4
    np.testing.assert_allclose(
        fed.predict(mf.X_test, scale="standardized")["mean"],
        cen.predict(mf.X_test, scale="standardized")["mean"],
        atol=1e-8,
    )
    # the estimator conventions: stored as given, refused when fit starts, in one error style
    fidelities = [mf.fidelity_data(lv) for lv in order]
    for cls, fit in ((AR1CoKriging, lambda m: m.fit(fidelities)), (FederatedAR1, lambda m: m.fit(mf.train, order))):
        for bad, message in (
            ({"kernel": "cubic"}, "kernel must be one of 'rbf', 'matern', got 'cubic'"),
            ({"kernel": "matern", "nu": 2.0}, "nu must be one of 0.5, 1.5, 2.5, got 2.0"),
            ({"noise_floor": -1.0}, "noise_floor must be a number >= 0, got -1.0"),
        ):
            model = cls(**bad)
            with pytest.raises(ValueError, match=f"^{cls.__name__}: {message}$"):
                fit(model)
