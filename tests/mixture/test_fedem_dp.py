"""Differentially private FedEM (FederatedGaussianMixture(dp=...), fedstats.mixture.dp): the
noiseless fit equals the plain one, the ledger holds every release and its epsilon is
dp-accounting's, the noise has the declared size, the means are close to the truth at a
moderate epsilon and worse at a small one, clear errors, the tables' notes, save/load."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats.federation import run
from fedstats.mixture import FederatedGaussianMixture, VariationalGaussianMixture
from fedstats.mixture._common import as_federated
from fedstats.mixture.dp import DPFedEMAlgorithm, contributions
from fedstats.privacy import DifferentialPrivacy

dpa = pytest.importorskip("dp_accounting")

MU = np.array([[-3.0, 0.0], [3.0, 0.0], [0.0, 4.0]])


def _federation(n_clients=50, n=200, seed=0):
    """Clients with their own weights over three unit-variance components (sd 1)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_clients):
        z = rng.choice(3, n, p=rng.dirichlet(np.full(3, 2.0)))
        out.append(MU[z] + rng.normal(size=(n, 2)))
    return out


XS = _federation()
START = MU + np.array([[0.5, -0.4], [-0.3, 0.6], [0.4, 0.5]])  # a public start, off by ~0.6 sd


def _fit(dp, seed=0, Xs=XS, **kw):
    kw = {"means_init": START, "dp_rounds": 10, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return FederatedGaussianMixture(3, dp=dp, **kw).fit(Xs, seed=seed)


def _mean_error(res):
    return float(np.abs(res.means - MU).max())  # components stay in the order of the start


# ---------------------------------------------------------------- (a) no noise: the plain fit
@pytest.mark.parametrize(
    "cov_type, shared, placement",
    [("full", False, "client"), ("diag", True, "central"), ("tied", False, "central"), ("spherical", True, "client")],
)
def test_noiseless_private_fit_with_a_loose_bound_is_the_plain_fit(cov_type, shared, placement):
    # The private rounds send every client's full statistics; the plain ones send changes to
    # running totals moved between means (reshift). Both are the same sums, so they differ by
    # floating-point rounding only (the plain start's hard statistics too).
    Xs = XS[:12]
    dp = DifferentialPrivacy(noise_multiplier=0.0, clip=1e3, placement=placement)
    kw = {"covariance_type": cov_type, "shared_weights": shared, "means_init": START}
    plain = FederatedGaussianMixture(3, rounds=8, tol=None, **kw).fit(Xs, seed=1)
    private = FederatedGaussianMixture(3, dp=dp, dp_rounds=8, **kw).fit(Xs, seed=1)
    np.testing.assert_allclose(private.means, plain.means, rtol=0, atol=1e-10)
    np.testing.assert_allclose(private.covariances, plain.covariances, rtol=0, atol=1e-10)
    for c in plain.weights:
        np.testing.assert_allclose(private.weights[c], plain.weights[c], rtol=0, atol=1e-10)
    assert private.privacy.epsilon == np.inf and private.converged


def test_clipping_winsorises_each_deviation_and_bounds_every_key():
    rng = np.random.default_rng(0)
    X, means = rng.normal(0, 5, (40, 3)), rng.normal(0, 1, (2, 3))
    resp = rng.dirichlet(np.ones(2), 40)
    for ct in ("full", "diag", "spherical"):
        rows = contributions(X, resp, means, ct, 2.0, 1.0)
        norms = {k: np.linalg.norm(v.reshape(40, -1), axis=1) for k, v in rows.items()}
        assert norms["N"].max() <= 1 + 1e-12 and norms["S1"].max() <= 2 + 1e-12 and norms["S2"].max() <= 4 + 1e-12
    # a row inside the radius is left as it is
    rows = contributions(means[:1] + 0.1, np.array([[0.3, 0.7]]), means, "full", 1e3, 1.0)
    np.testing.assert_allclose(rows["S1"][0], np.array([[0.3], [0.7]]) * (means[0] + 0.1 - means))


# ---------------------------------------------------------------- (b) the ledger
@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_ledger_holds_every_release_and_epsilon_is_dp_accountings(accountant):
    z = 3.0
    dp = DifferentialPrivacy(noise_multiplier=z, clip=4.0, placement="central", accountant=accountant)
    res = _fit(dp, Xs=XS[:10], dp_rounds=6)
    rel = res.privacy.ledger.releases
    assert [(r.name, r.count, r.noise_multiplier) for r in rel] == [
        ("covariance initialisation", 1, z),
        ("EM rounds", 6, z),
    ]
    rel_ = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    acct = dpa.rdp.RdpAccountant(neighboring_relation=rel_) if accountant == "rdp" else dpa.pld.PLDAccountant(rel_)
    acct.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 7))
    assert res.privacy.epsilon == pytest.approx(acct.get_epsilon(dp.delta), rel=1e-9)
    # a given start costs nothing; client noise read per reply in process: one share's noise
    dpc = DifferentialPrivacy(noise_multiplier=z, clip=4.0, placement="client")
    cov0 = np.stack([np.eye(2)] * 3)
    res = _fit(dpc, Xs=XS[:10], dp_rounds=4, covariances_init=cov0)
    ((r,),) = [res.privacy.ledger.releases]
    assert (r.name, r.count) == ("EM rounds", 4) and r.noise_multiplier == pytest.approx(z / np.sqrt(10))


# ---------------------------------------------------------------- (c) the noise's size
class _Recorder(DPFedEMAlgorithm):
    """The hard start's round repeated: the same exact sums every round, so their spread is the noise's."""

    def server_step(self, state, replies, round):
        self.seen.append({k: np.array(v) for k, v in replies.sums.items()})
        return super().server_step(state, replies, round)


@pytest.mark.parametrize("placement", ["central", "client"])
def test_noise_has_the_declared_size(placement):
    Xs = as_federated(XS[:8])

    def rec(z):
        dp = DifferentialPrivacy(noise_multiplier=z, clip=3.0, placement=placement)
        alg = _Recorder(START, np.stack([np.eye(2)] * 3), dp=dp, n_clients=8, hard=True)
        alg.seen = []
        run(alg, Xs, rounds=300 if z else 1, seed=4, progress=False)
        return alg

    exact = rec(0.0).seen[0]
    alg = rec(2.0)
    for k in ("N", "S1", "S2"):
        # one radius B = 3: bounds (1, B, B^2), noise z sqrt(3) C_k on each key's sum
        assert alg.sum_sd[k] == pytest.approx(2.0 * np.sqrt(3) * {"N": 1, "S1": 3, "S2": 9}[k])
        zs = np.array([(s[k] - exact[k]).ravel() for s in alg.seen]) / alg.sum_sd[k]
        assert abs(zs.mean()) < 4 / np.sqrt(zs.size)
        assert abs(zs.std() - 1) < 0.05
    # with per-client weights the clients' own noisy counts are a fourth block: sqrt(4) C_k each
    em = DPFedEMAlgorithm(START, np.stack([np.eye(2)] * 3), dp=alg.user_dp, n_clients=8)
    assert em.sum_sd["S1"] == pytest.approx(2.0 * 2 * 3) and em.own_sd == pytest.approx(2.0 * 2 * 1)


# ---------------------------------------------------------------- (d) utility
def test_means_are_close_to_the_truth_at_a_moderate_epsilon_and_worse_at_a_small_one():
    errors, eps = {}, {}
    for z in (5.0, 60.0):
        dp = DifferentialPrivacy(noise_multiplier=z, clip=4.0, placement="central")
        fits = [_fit(dp, seed=s) for s in range(3)]
        errors[z] = np.mean([_mean_error(f) for f in fits])
        eps[z] = fits[0].privacy.epsilon
    assert 1 < eps[5.0] < 10 and eps[60.0] < 0.5
    # 10,000 rows: the pooled sampling error alone is about 0.02 sd
    assert errors[5.0] < 0.15
    assert errors[60.0] > errors[5.0]


# ---------------------------------------------------------------- (e) errors
def test_clear_errors():
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip=4.0)
    with pytest.raises(ValueError, match="participation=1.0"):
        _fit(dp, participation=0.5, Xs=XS[:4])
    with pytest.raises(ValueError, match="needs means_init"):
        _fit(dp, means_init=None, Xs=XS[:4])
    with pytest.raises(ValueError, match="uncertainty=True is not available"):
        FederatedGaussianMixture(3, dp=dp, means_init=START).fit(XS[:4], uncertainty=True)
    with pytest.raises(ValueError, match="dp must be None or a fedstats.privacy.DifferentialPrivacy"):
        _fit({"noise_multiplier": 1.0}, Xs=XS[:4])
    with pytest.raises(ValueError, match="name exactly the keys"):
        _fit(DifferentialPrivacy(noise_multiplier=1.0, clip={"N": 1.0, "S1": 2.0}), Xs=XS[:4])
    with pytest.raises(ValueError, match="include_dp_noise=True needs dp="):
        FederatedGaussianMixture(3, include_dp_noise=True, means_init=START).fit(XS[:4])
    with pytest.raises(TypeError, match="dp"):  # the variational and decentralised siblings have no dp
        VariationalGaussianMixture(3, dp=dp)
    res = _fit(dp, Xs=XS[:4], dp_rounds=2)
    with pytest.raises(ValueError, match="does not make them"):
        res.wald_intervals(XS[:4])
    with pytest.raises(AttributeError, match="no final log-likelihood"):
        res.bic()


# ---------------------------------------------------------------- (f) tables, noise in intervals, save/load
def test_tables_say_the_intervals_exclude_the_noise_and_the_result_saves(tmp_path):
    dp = DifferentialPrivacy(noise_multiplier=5.0, clip=4.0, placement="central")
    res = _fit(dp, Xs=XS[:10], dp_rounds=4)
    s, cs = res.summary(), res.client_summary()
    for t in (s, cs):
        assert t.attrs["privacy"].startswith("intervals exclude the differential-privacy noise (epsilon=")
    assert s["sd"].isna().all() and res.n_obs == {}
    back = type(res).load(res.save(tmp_path / "fit.fedstats"))
    assert back.privacy.epsilon == pytest.approx(res.privacy.epsilon)
    assert back.privacy.ledger.releases == res.privacy.ledger.releases
    np.testing.assert_array_equal(back.means, res.means)


def test_include_dp_noise_gives_intervals_of_the_noise_of_its_size():
    # central noise large against the sampling error: refits on the same data with other
    # seeds spread by the DP noise; the propagated sd must match that spread
    # (noise 0.15 sd in each mean: the final M-step's noise is then nearly all of it; at 0.5 sd
    # the trajectory's noise doubles it and the propagated sd is too small)
    dp = DifferentialPrivacy(noise_multiplier=30.0, clip=4.0, placement="central")
    Xs = XS[:20]
    res = _fit(dp, Xs=Xs, include_dp_noise=True, shared_weights=True, dp_rounds=10)
    t = res.summary(0.9)
    assert t.attrs["privacy"].startswith("intervals include the differential-privacy noise")
    rows = [f"mean[{j}][x{i}]" for j in range(3) for i in range(2)]
    assert t.loc[rows, "sd"].gt(0).all() and t["lower"].lt(t["mean"]).all()
    with pytest.raises(ValueError, match="cannot include the DP noise of the per-client weights"):
        res.client_summary()
    means = np.array([_fit(dp, seed=s, Xs=Xs, shared_weights=True, dp_rounds=10).means for s in range(1, 21)])
    ratio = means.std(0, ddof=1).ravel() / res.dp_noise_sd["means"].ravel()
    # 20 refits: a spread estimated within about +-35% (earlier rounds' noise adds a little)
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio
