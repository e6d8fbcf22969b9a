"""HM1 on data in natural units (issue 40, item 4): the standardised fit reported on the data's
scale, defaults that converge (the README's example, Grunfeld's firms), intervals that hold the
truth at their level when features range from 1e-3 to 1e4, and the estimated noise variances
integrated out of the posteriors."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedstats.data import FederatedData
from fedstats.data.disclosure import NO_RULES
from fedstats.linear import StructuralCovarianceModel
from fedstats.linear.hm1_posterior import conditional_posterior, integrate_noise

ROOT = Path(__file__).resolve().parents[2]


def natural_clusters(
    seed: int,
    *,
    n_clients: int = 20,
    d: int = 3,
    rho: float = 0.95,
    sigma: float = 0.5,
    n_poor: int = 8,
    n_rich: int = 100,
    shift: float = 0.5,
):
    """A federation in natural units: ``d`` predictors with sds ``1e-3``, ..., ``1e4`` (the
    first and last fixed, the others log-uniform between) and means up to 3 sds from 0, a target
    whose sd is between 0.1 and 1000, coefficients to match. On the population's standardised
    scale the clients' coefficient vectors (intercept first) are a common vector ``mu ~ N(0, I)``
    plus deviations whose rows are ``N(0, Omega)``, clients in two clusters (even and odd
    index; correlation ``rho`` within a cluster, 0 across), noise sd ``sigma`` (standardised);
    every other client is data-poor (``n_poor`` rows, the others ``n_rich``), and each client's
    predictors are shifted by ``shift`` sds of its own.

    Returns ``(data, theta (K, d + 1) on the data's scale, poor (K,) bool, truth)`` with
    ``truth`` the population's scale (``m``, ``s``, ``m_y``, ``s_y``), ``mu`` and ``omega``."""
    rng = np.random.default_rng(seed)
    K = n_clients
    s = 10.0 ** np.r_[-3.0, rng.uniform(-3, 4, d - 2), 4.0] if d >= 2 else np.array([10.0 ** rng.uniform(-3, 4)])
    m = s * rng.uniform(-3, 3, d)
    s_y = 10.0 ** rng.uniform(-1, 3)
    m_y = s_y * rng.uniform(-3, 3)
    lab = np.arange(K) % 2
    omega = np.where(lab[:, None] == lab[None, :], rho, 0.0) + (1 - rho) * np.eye(K)
    mu = rng.standard_normal(d + 1)
    std = mu + np.linalg.cholesky(omega) @ rng.standard_normal((K, d + 1))
    slopes = s_y * std[:, 1:] / s
    theta = np.c_[s_y * std[:, 0] + m_y - slopes @ m, slopes]
    poor = lab == 0
    Xs, ys = [], []
    for k in range(K):
        n = n_poor if poor[k] else n_rich
        X = m + s * (shift * rng.standard_normal(d) + rng.standard_normal((n, d)))
        Xs.append(X)
        ys.append(theta[k, 0] + X @ theta[k, 1:] + s_y * sigma * rng.standard_normal(n))
    truth = {"m": m, "s": s, "m_y": m_y, "s_y": s_y, "mu": mu, "omega": omega}
    return FederatedData.from_arrays(Xs, ys, **NO_RULES), theta, poor, truth


def coverage(seeds, level=0.9, unconverged=0, **federation):
    """The fraction of true coefficients inside their ``level`` interval (``client_summary``
    of a default fit), over all clients and over the data-poor ones. Every fit must converge
    without a warning, but for at most ``unconverged`` fits whose Algorithm 1 needs more than the
    default rounds (its warning; the posteriors do not depend on it)."""
    every, poor_hits, slow = [], [], 0
    for seed in seeds:
        data, theta, poor, _ = natural_clusters(seed, **federation)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = StructuralCovarianceModel().fit(data, seed=seed)
        slow += not res.converged
        assert slow <= unconverged, f"seed {seed}: {[str(w.message) for w in caught]}"
        assert len(caught) == (not res.converged), [str(w.message) for w in caught]
        s = res.client_summary(level)
        hit = (s["lower"].to_numpy() <= theta.ravel()) & (theta.ravel() <= s["upper"].to_numpy())
        hit = hit.reshape(theta.shape)
        every.append(hit.ravel())
        poor_hits.append(hit[poor].ravel())
    return float(np.mean(np.concatenate(every))), float(np.mean(np.concatenate(poor_hits)))


# --------------------------------------------------------------------------- the data's scale


def test_the_standardised_fit_is_the_fit_of_standardised_rows_mapped_back_exactly():
    # Oracle: scale the rows by hand with the pooled mean and sd (numpy), fit in the data's
    # units there (standardize=False) and map every number back with the affine map written
    # out here; the default fit must give the same numbers.
    data, _, _, _ = natural_clusters(3, n_clients=6, n_poor=12, n_rich=40)
    model = StructuralCovarianceModel()
    res = model.fit(data, seed=1)
    X = np.vstack([data[c].X for c in data.clients])
    y = np.concatenate([data[c].y for c in data.clients])
    m, s, my, sy = X.mean(0), X.std(0, ddof=1), y.mean(), y.std(ddof=1)
    np.testing.assert_allclose(res.scaling.x_mean, m, rtol=1e-12)
    np.testing.assert_allclose(res.scaling.x_sd, s, rtol=1e-12)
    assert res.scaling.y_mean == pytest.approx(my, rel=1e-12) and res.scaling.y_sd == pytest.approx(sy, rel=1e-12)
    scaled = FederatedData.from_arrays(
        [(data[c].X - m) / s for c in data.clients], [(data[c].y - my) / sy for c in data.clients], **NO_RULES
    )
    ref = StructuralCovarianceModel(standardize=False).fit(scaled, seed=1)
    d = X.shape[1] + 1
    A = np.zeros((d, d))
    A[0, 0], A[0, 1:], A[1:, 1:] = sy, -sy * m / s, np.diag(sy / s)
    c = np.r_[my, np.zeros(d - 1)]
    assert res.rounds == ref.rounds and res.converged and ref.converged
    np.testing.assert_allclose(res.theta, A @ ref.theta + c[:, None], rtol=1e-9)
    np.testing.assert_allclose(res.omega_array, ref.omega_array, rtol=1e-9)
    np.testing.assert_allclose(res.posterior_omega_array, ref.posterior_omega_array, rtol=1e-9)
    np.testing.assert_allclose(res.posterior_mean, ref.posterior_mean @ A.T + c, rtol=1e-9)
    for k in range(data.n_clients):
        np.testing.assert_allclose(res.posterior_cov[k], A @ ref.posterior_cov[k] @ A.T, rtol=1e-8)
    np.testing.assert_allclose(res.noise_var, ref.noise_var * sy**2, rtol=1e-9)
    # predictions on the data's scale: the same rows through either fit
    c0 = data.clients[0]
    p, q = res.predict(data[c0].X[:5], c0, level=0.9), ref.predict((data[c0].X[:5] - m) / s, c0, level=0.9)
    for col in ("mean", "lower", "upper", "pred_lower", "pred_upper", "estimate"):
        np.testing.assert_allclose(p[col], my + sy * q[col], rtol=1e-9, atol=1e-9 * sy)
    # the moments cost one counted exchange (two rounds of sums), as HM2's
    assert res.communication.by_kind["federated scaling"]["rounds"] == 2
    assert "federated scaling" not in ref.communication.by_kind


def test_changing_units_changes_the_numbers_by_the_units_only():
    # Features in metres -> millimetres and the target in dollars -> thousands: every reported
    # number moves by the change of units alone (the standardised fit is the same fit).
    data, _, _, _ = natural_clusters(5, n_clients=5, n_poor=15, n_rich=40)
    a = np.array([1e3, 1.0, 1e-3])  # per feature
    b, shift = 1e-3, 250.0
    other = FederatedData.from_arrays(
        [data[c].X * a for c in data.clients], [b * data[c].y + shift for c in data.clients], **NO_RULES
    )
    r1, r2 = StructuralCovarianceModel().fit(data, seed=0), StructuralCovarianceModel().fit(other, seed=0)
    slope = b / a
    np.testing.assert_allclose(r2.posterior_mean[:, 1:], r1.posterior_mean[:, 1:] * slope, rtol=1e-7)
    np.testing.assert_allclose(r2.posterior_mean[:, 0], b * r1.posterior_mean[:, 0] + shift, rtol=1e-7)
    s1, s2 = r1.client_summary(0.9), r2.client_summary(0.9)
    scale = np.tile(np.r_[b, slope], data.n_clients)
    np.testing.assert_allclose(s2["sd"], s1["sd"] * scale, rtol=1e-7)
    np.testing.assert_allclose(s2["p_value"], s1["p_value"], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(r2.theta[1:], r1.theta[1:] * slope[:, None], rtol=1e-7)
    np.testing.assert_allclose(r2.omega_array, r1.omega_array, rtol=1e-7)  # units-free


def test_theta_init_and_callback_are_on_the_datas_scale_and_federated_equals_centralised():
    data, _, _, _ = natural_clusters(7, n_clients=5, n_poor=15, n_rich=30)
    model = StructuralCovarianceModel(rounds=40, stop_early=False)
    seen = []
    fed = model.fit(data, seed=2, uncertainty=False, callback=lambda r, t, o: seen.append(t))
    np.testing.assert_allclose(seen[-1], fed.theta, rtol=1e-12)  # the callback sees the reported scale
    cen = model.fit_centralized(data, seed=2)
    np.testing.assert_allclose(fed.theta, cen.theta, rtol=1e-10)
    np.testing.assert_allclose(fed.omega_array, cen.omega_array, rtol=1e-10)
    # a start given on the data's scale is where the iteration starts: with no steps and no
    # prior step (shrink_scale = 0) one round leaves it where it was
    still = StructuralCovarianceModel(rounds=1, lr=1e-300, shrink_scale=0.0, tol=0)
    start = fed.theta + 1.0
    np.testing.assert_allclose(still.fit(data, uncertainty=False, theta_init=start).theta, start, rtol=1e-9)
    np.testing.assert_allclose(still.fit_centralized(data, theta_init=start).theta, start, rtol=1e-9)


def test_a_standardised_fit_saves_and_loads_with_its_scaling(tmp_path):
    data, _, _, _ = natural_clusters(4, n_clients=4, n_poor=12, n_rich=30)
    res = StructuralCovarianceModel().fit(data, seed=0)
    res.save(tmp_path / "hm1.fedstats")
    back = type(res).load(tmp_path / "hm1.fedstats")
    for name in ("x_mean", "x_sd", "binary"):
        np.testing.assert_array_equal(getattr(back.scaling, name), getattr(res.scaling, name))
    assert (back.scaling.y_mean, back.scaling.y_sd) == (res.scaling.y_mean, res.scaling.y_sd)
    X = data[data.clients[1]].X[:3]
    np.testing.assert_array_equal(
        back.predict(X, data.clients[1]).to_numpy(), res.predict(X, data.clients[1]).to_numpy()
    )


def test_known_noise_sds_are_given_on_the_datas_scale():
    data, _, _, truth = natural_clusters(2, n_clients=4, n_poor=10, n_rich=30)
    sd = 0.5 * truth["s_y"]
    res = StructuralCovarianceModel().fit(data, seed=0, noise_sd=sd)
    np.testing.assert_allclose(res.noise_var, sd**2, rtol=1e-12)  # known: kept, on the data's scale
    raw = StructuralCovarianceModel(standardize=False).fit(data, seed=0, noise_sd=sd, uncertainty=True)
    np.testing.assert_allclose(raw.noise_var, sd**2, rtol=1e-12)


# --------------------------------------------------------------------------- the issue's cases


def grunfeld():
    import statsmodels.api as sm
    from statsmodels.datasets import grunfeld

    df = grunfeld.load_pandas().data
    data = FederatedData.from_dataframe(df, by="firm", target="invest", features=["value", "capital"], **NO_RULES)
    ols = {}
    for firm, g in df.groupby("firm"):
        fit = sm.OLS(g["invest"], sm.add_constant(g[["value", "capital"]])).fit()
        ols[firm] = (fit.params.to_numpy(), fit.bse.to_numpy())
    return data, ols


def test_grunfeld_with_the_defaults_converges_and_keeps_every_firms_intercept():
    # Issue 40 acceptance: by firm, invest ~ value + capital, defaults. Before: lr 1.25e-9,
    # every intercept near 0 with a 95% interval of about +-0.35 (Atlantic Refining: least
    # squares 22.7, se 6.9), and a warning. Measured now: 493 rounds, converged, the posterior
    # means within 0.66 least-squares se of each firm's estimate (Algorithm 1's within 1.30).
    data, ols = grunfeld()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = StructuralCovarianceModel().fit(data, seed=0)
    assert res.converged and res.has_uncertainty and res.lr > 1e-4
    s = res.client_summary(0.95).query("parameter == 'intercept'").set_index("client")
    for firm, (params, se) in ols.items():
        assert abs(s.loc[firm, "mean"] - params[0]) <= 2 * se[0], firm
        assert abs(s.loc[firm, "estimate"] - params[0]) <= 2 * se[0], firm
        assert s.loc[firm, "lower"] <= params[0] <= s.loc[firm, "upper"], firm
    atlantic = s.loc["Atlantic Refining"]
    assert atlantic["lower"] > 10 and atlantic["upper"] - atlantic["lower"] > 10


def test_grunfeld_in_its_own_units_is_the_issues_failure():
    # what the issue met (the paper's algorithm in the data's units): kept as the reason for
    # the default, and to show that standardize=False still gives it
    data, ols = grunfeld()
    with pytest.warns(RuntimeWarning, match="did not converge in 30 rounds"):
        res = StructuralCovarianceModel(standardize=False, alpha=0.1, eig_floor=0.0, rounds=30, stop_early=False).fit(
            data, seed=0
        )
    assert res.lr < 1e-8
    s = res.client_summary(0.95).query("parameter == 'intercept'").set_index("client")
    assert (s["upper"] - s["lower"]).max() < 1.0 and s["mean"].abs().max() < 0.1
    assert (
        not s.loc["Atlantic Refining", "lower"] <= ols["Atlantic Refining"][0][0] <= s.loc["Atlantic Refining", "upper"]
    )


def test_the_readmes_example_converges_with_the_defaults():
    df = pd.read_csv(ROOT / "examples" / "sites.csv")
    train, _ = FederatedData.from_dataframe(df, by="site", target="y", **NO_RULES).train_test_split(0.3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = StructuralCovarianceModel().fit(train, seed=0)
    assert res.converged and res.rounds < 100 and res.has_uncertainty
    assert res.feature_names == ["intercept", "x1", "x2", "x3"]


# --------------------------------------------------------------------------- intervals


def test_intervals_cover_at_their_level_in_natural_units():
    # Issue 40 acceptance (fast): 90% intervals, 10 federations of 8 clients in two clusters,
    # half with 8 rows for 4 coefficients, feature sds 1e-3 to 1e4: 320 intervals.
    # Measured 0.909 (data-poor 0.913); the slow test below runs 40 seeds on five designs.
    every, poor = coverage(range(10), n_clients=8)
    assert abs(every - 0.9) <= 0.07 and abs(poor - 0.9) <= 0.07, (every, poor)


@pytest.mark.slow
@pytest.mark.parametrize(
    "federation",
    [
        {},  # the issue's held-out federation: 20 sites, two clusters, half with 8 rows
        {"rho": 0.0},
        {"sigma": 2.0},
        {"n_clients": 4},
        # 6-row clients shifted from the federation's means: ill-conditioned designs on its
        # scale, where Algorithm 1 needs 66 to 2182 rounds (one of 40 fits more than 1000)
        {"n_clients": 50, "d": 2, "n_poor": 6, "n_rich": 40, "unconverged": 1},
    ],
)
def test_intervals_cover_at_their_level_in_natural_units_across_federations(federation):
    # 40 seeds each (7.5 minutes in all on 2 cores). Measured (all / data-poor): 0.902 / 0.903,
    # 0.898 / 0.898, 0.886 / 0.873, 0.877 / 0.847, 0.885 / 0.869
    every, poor = coverage(range(40), **federation)
    assert abs(every - 0.9) <= 0.05 and abs(poor - 0.9) <= 0.07, (every, poor)


def test_integrating_the_noise_variance_gives_the_student_t_covariance_under_a_flat_prior():
    # Oracle: with a prior that does not matter (Omega = 1e8 I) a client's posterior is its
    # least squares, and with its noise variance integrated out (Jeffreys prior) its
    # covariance is s^2 (X'X)^-1 (n - p) / (n - p - 2), the Student-t's. A client whose noise
    # sd is known keeps its conditional posterior.
    rng = np.random.default_rng(0)
    n, p, K = [8, 11, 30], 4, 3
    X = [rng.standard_normal((m, p)) for m in n]
    y = [x @ rng.standard_normal(p) + 0.3 * rng.standard_normal(len(x)) for x in X]
    ols = [np.linalg.lstsq(x, t, rcond=None)[0] for x, t in zip(X, y)]
    s2 = np.array([np.sum((t - x @ b) ** 2) / (len(t) - p) for x, t, b in zip(X, y, ols)])
    info = np.stack([x.T @ x / v for x, v in zip(X, s2)])
    score = np.stack([x.T @ t / v for x, t, v in zip(X, y, s2)])
    mean, cov = conditional_posterior(1e8 * np.eye(K), info, score)
    m2, c2, nv = integrate_noise(mean, cov, info, score, s2, np.array(n, float), np.array([True, True, False]))
    for k in range(2):
        dof = n[k] - p
        np.testing.assert_allclose(m2[k], ols[k], rtol=1e-6, atol=1e-8)
        t_cov = s2[k] * np.linalg.inv(X[k].T @ X[k]) * dof / (dof - 2)
        np.testing.assert_allclose(c2[k], t_cov, rtol=1e-4)
        assert nv[k] == pytest.approx(s2[k] * dof / (dof - 2), rel=1e-4)  # E[sigma^2 | y]
    np.testing.assert_array_equal(m2[2], mean[2])
    np.testing.assert_array_equal(c2[2], cov[2])
    assert nv[2] == s2[2]


def test_integrating_the_noise_variance_widens_the_intervals_of_data_poor_clients_to_their_level():
    # 8-row clients with 4 coefficients (4 residual degrees of freedom): plugged-in noise
    # variances give too narrow intervals, integrated ones hold their level. Measured on these
    # 6 federations of 10 clients (120 intervals of data-poor clients): 0.858 plugged in,
    # 0.900 integrated; on 20 federations of 20 clients 0.81 and 0.86 (the exact t interval of
    # each client's own least squares: 0.885 there).
    seeds = range(6)
    hits = {}
    for how in ("integrate", "plug-in"):
        h = []
        for seed in seeds:
            data, theta, poor, _ = natural_clusters(seed, n_clients=10)
            res = StructuralCovarianceModel(noise_variance=how).fit(data, seed=seed)
            s = res.client_summary(0.9)
            ok = ((s["lower"].to_numpy() <= theta.ravel()) & (theta.ravel() <= s["upper"].to_numpy())).reshape(
                theta.shape
            )
            h.append(ok[poor].ravel())
        hits[how] = float(np.mean(np.concatenate(h)))
    assert hits["integrate"] >= 0.83 and hits["integrate"] > hits["plug-in"] + 0.02, hits
    with pytest.raises(ValueError, match="noise_variance"):
        StructuralCovarianceModel(noise_variance="known").fit(data)
