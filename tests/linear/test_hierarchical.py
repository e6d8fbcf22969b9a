"""HM2 by federated EP: exactness against pooled closed forms, EP invariants, failures."""

import numpy as np
import pytest

from fedstats import FederatedData
from fedstats.data.disclosure import NO_RULES
from fedstats.federation import run
from fedstats.inference.ep import FederatedEP
from fedstats.inference.ep_checks import check_invariants
from fedstats.linear import HierarchicalLinearModel
from fedstats.linear.ep_model import ClientRows
from fedstats.linear.hierarchical import HierarchicalResult

TAU = np.array([0.5, 2.0, 1.0])
SIGMA = np.array([0.3, 0.5, 0.8, 0.4, 1.0])


def make_data(K=5, d=3, seed=0, n=None):
    rng = np.random.default_rng(seed)
    n = n or [8, 15, 4, 30, 11][:K]
    mu = rng.normal(size=d)
    Xs, ys = [], []
    for k in range(K):
        th = mu + np.sqrt(TAU[:d]) * rng.normal(size=d)
        X = rng.normal(size=(n[k], d))
        Xs.append(X)
        ys.append(X @ th + SIGMA[k] * rng.normal(size=n[k]))
    return FederatedData.from_arrays(Xs, ys, clients=[f"c{k}" for k in range(K)], **NO_RULES)


def pooled_exact(data, tau, sigma, s0=1.0):
    """Posterior of (mu, theta_1..K) from the joint Gaussian on pooled data (the oracle)."""
    K, d = data.n_clients, data.n_features
    P = np.zeros(((K + 1) * d,) * 2)
    h = np.zeros((K + 1) * d)
    Dinv = np.diag(1 / tau)
    P[:d, :d] = np.eye(d) / s0**2
    for k, c in enumerate(data.clients):
        X, y = data[c].X, data[c].y
        i = slice((k + 1) * d, (k + 2) * d)
        # theta_k | mu ~ N(mu, D): quadratic form (theta - mu)^T D^-1 (theta - mu)
        P[:d, :d] += Dinv
        P[i, i] += Dinv + X.T @ X / sigma[k] ** 2
        P[:d, i] -= Dinv
        P[i, :d] -= Dinv
        h[i] += X.T @ y / sigma[k] ** 2
    cov = np.linalg.inv(P)
    return cov @ h, cov


def exact_model(**kw):
    sig = {f"c{k}": s for k, s in enumerate(SIGMA)}
    return HierarchicalLinearModel(standardize=False, tau=TAU, sigma=sig, fit_intercept=False, estimator="exact", **kw)


def test_exact_one_round_equals_pooled_posterior():
    data = make_data()
    res = exact_model(rounds=1).fit(data)
    mean, cov = pooled_exact(data, TAU, SIGMA)
    g = res.global_posterior()
    np.testing.assert_allclose(g.mean, mean[:3], atol=1e-10, rtol=0)
    np.testing.assert_allclose(g.cov, cov[:3, :3], atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    "schedule",
    [
        [["c4", "c3", "c2", "c1", "c0"]],
        [["c1", "c3"], ["c0", "c2", "c4"]],
        [["c0"], ["c1"], ["c2"], ["c3"], ["c4"]],
        [["c2", "c4"], [], ["c0", "c1", "c3"]],
    ],
)
def test_exact_any_order_and_covering_pattern_then_fixed(schedule):
    data = make_data()
    mean, cov = pooled_exact(data, TAU, SIGMA)
    extra = [["c0", "c1", "c2", "c3", "c4"]] * 2  # further rounds must leave it fixed
    res = exact_model(participation=lambda r, rng: (schedule + extra)[r], rounds=len(schedule) + 2, tol=0).fit(data)
    np.testing.assert_allclose(res.global_posterior().mean, mean[:3], atol=1e-10, rtol=0)
    np.testing.assert_allclose(res.global_posterior().cov, cov[:3, :3], atol=1e-10, rtol=0)


def test_the_ep_server_step_sees_only_sums_of_the_site_changes(monkeypatch):
    """FederatedEP declares the site changes summed: its server step never holds one client's
    ``dr`` or ``dQ``, only their sums over the clients that answered; the exact fit, over
    rounds of different participants, still equals the pooled posterior."""
    seen = []
    real = FederatedEP.server_step

    def spy(self, state, replies, round):
        seen.append(([set(r) for r in replies.values()], set(replies.sums), sorted(replies)))
        return real(self, state, replies, round)

    monkeypatch.setattr(FederatedEP, "server_step", spy)
    data = make_data()
    schedule = [["c1", "c3"], ["c0", "c2", "c4"], ["c0", "c1", "c2", "c3", "c4"]]
    res = exact_model(participation=lambda r, rng: schedule[r], rounds=3, tol=0).fit(data)
    monkeypatch.undo()
    mean, cov = pooled_exact(data, TAU, SIGMA)
    np.testing.assert_allclose(res.global_posterior().mean, mean[:3], atol=1e-10, rtol=0)
    np.testing.assert_allclose(res.global_posterior().cov, cov[:3, :3], atol=1e-10, rtol=0)
    assert [who for _, _, who in seen] == schedule
    for per_client, sums, who in seen:
        assert per_client == [set()] * len(who) and sums == {"dr", "dQ"}


def test_exact_client_posteriors_equal_pooled_marginals_and_q_double_counts():
    data = make_data()
    res = exact_model(rounds=2).fit(data)
    mean, cov = pooled_exact(data, TAU, SIGMA)
    for k, c in enumerate(data.clients):
        post = res.client_posterior(c)
        i = slice((k + 1) * 3, (k + 2) * 3)
        np.testing.assert_allclose(post.mean, mean[i], atol=1e-10, rtol=0)
        np.testing.assert_allclose(post.cov, cov[i, i], atol=1e-10, rtol=0)
    # Using q instead of the cavity counts the client's data twice: detectably over-confident.
    alg = res.algorithm
    sites = alg.committed_sites(res.server, res.client_states)
    wrong = alg.local_tilted(
        res.server.q,
        [sites[c] for c in data.clients],
        [res.client_states[c].stats for c in data.clients],
        [0] * 5,
        use_cavity=False,
    )
    right = alg.local_tilted(
        res.server.q, [sites[c] for c in data.clients], [res.client_states[c].stats for c in data.clients], [0] * 5
    )
    for w, r in zip(wrong, right):
        assert np.all(np.diag(w.cov) < 0.95 * np.diag(r.cov))


def test_damping_to_zero_leaves_q_unchanged():
    data = make_data()
    res = exact_model(rounds=3, damping=1e-12, tol=0).fit(data)
    prior_mean, prior_cov = np.zeros(3), np.eye(3)
    np.testing.assert_allclose(res.global_posterior().mean, prior_mean, atol=1e-9)
    np.testing.assert_allclose(res.global_posterior().cov, prior_cov, atol=1e-9)


def _ep_run(data, rounds, est="importance", participation=1.0, fail=None, checkpoint=None, resume=False):
    model = HierarchicalLinearModel(
        standardize=False,
        tau="diag",
        sigma=None,
        fit_intercept=False,
        estimator=est,
        estimator_options={"num_draws": 400} if est == "importance" else None,
    )
    site = model._site(data.n_features)

    class Flaky(FederatedEP):
        calls = 0

        def client_steps(self, messages, states, datas, rngs):
            out = super().client_steps(messages, states, datas, rngs)
            Flaky.calls += 1
            if fail is not None and Flaky.calls == fail[1] + 1:
                i = [np.array_equal(d[1], data[fail[0]].y) for d in datas].index(True)
                out[i] = RuntimeError("client went offline")
            return out

    alg = Flaky(site, model._prior(site), model._estimator(site), damping=0.7)
    dev = ClientRows(data, False)
    return alg, run(alg, dev, rounds=rounds, participation=participation, seed=3, checkpoint=checkpoint, resume=resume)


def test_invariants_hold_after_every_round(tmp_path):
    data = make_data(n=[40, 40, 40, 40, 40])
    ckpt = tmp_path / "run.ckpt"
    for r in range(1, 5):
        alg, out = _ep_run(data, r, checkpoint=ckpt, resume=True)
        sites = alg.committed_sites(out.server_state, out.client_states)
        check_invariants(out.server_state, list(sites.values()))
        assert out.server_state.q.is_proper()
    assert len(out.history) == 4


class _Overshooting:
    """Exact tilted moments, but every other call reports covariances 6x too wide: the sites
    then step far negative together and the server must back off to keep q PD."""

    name, sampled = "exact", False

    def __init__(self):
        from fedstats.inference.tilted import ExactTilted

        self.inner, self.calls = ExactTilted(), 0

    def estimate(self, model, m, c, stats, seeds, *, keep_draws=False):
        out = self.inner.estimate(model, m, c, stats, seeds, keep_draws=keep_draws)
        self.calls += 1
        if self.calls % 2 == 0:
            for r in out:
                r.cov = 6.0 * r.cov
        return out


@pytest.mark.parametrize(
    "participation",
    [
        1.0,
        [
            ["c0", "c1", "c2", "c3", "c4"],
            ["c0", "c1", "c2", "c3", "c4"],
            ["c1", "c3"],
            ["c0", "c1", "c2", "c3", "c4"],
            ["c2", "c4"],
            ["c0", "c1", "c2", "c3", "c4"],
        ],
    ],
)
def test_invariants_hold_through_server_backoff(participation):
    # Rounds with back-off (gamma < 1) leave pending changes that clients commit, by the
    # accepted fraction, at their next broadcast, also after sitting rounds out.
    data = make_data(n=[40, 40, 40, 40, 40])
    model = exact_model()
    site = model._site(3)
    sig = {f"c{k}": s for k, s in enumerate(SIGMA)}
    gammas = []
    for r in range(1, 7):
        alg = FederatedEP(site, model._prior(site), _Overshooting(), damping=1.0, tol=0.0)
        out = run(alg, ClientRows(data, False, sig), rounds=r, participation=participation, seed=0)
        sites = alg.committed_sites(out.server_state, out.client_states)
        check_invariants(out.server_state, list(sites.values()))
        assert out.server_state.q.is_proper()
        gammas.append(out.history[-1].metrics["gamma"])
    assert min(gammas) < 0.5 and gammas[0] == 1.0


def test_fractional_cavity_removes_as_much_of_the_site_as_stays_pd():
    from fedstats.inference.ep import fractional_cavity
    from fedstats.inference.gaussian import NaturalGaussian

    q = NaturalGaussian(np.array([1.0, 0.0]), np.diag([2.0, 1.0]))
    mild = NaturalGaussian(np.array([0.5, 0.0]), np.diag([1.0, 0.5]))
    cav, a = fractional_cavity(q, mild)
    assert a == 1.0 and np.allclose(cav.Q, np.diag([1.0, 0.5]))
    strong = NaturalGaussian(np.zeros(2), np.diag([2.5, 0.5]))  # more precise than q in x0
    cav, a = fractional_cavity(q, strong)
    assert a == 0.75 and cav.is_proper()
    np.testing.assert_allclose(cav.Q, q.Q - 0.75 * strong.Q)
    with pytest.raises(FloatingPointError):
        fractional_cavity(NaturalGaussian(np.zeros(2), -np.eye(2)), mild)


def test_partial_participation_converges_only_after_every_client_answered():
    data = make_data()
    res = exact_model(rounds=20, tol=10.0, participation=1).fit(data, seed=4)
    answered = [set(rec.answered) for rec in res.history]
    assert res.converged and len(answered) >= 5
    # quiet from round 2 on (tol is huge): converged in the first round by which all 5 answered
    seen, first_all = set(), None
    for i, a in enumerate(answered):
        seen |= a if i >= 1 else set()
        if first_all is None and seen == set(data.clients):
            first_all = i
    assert len(res.history) == first_all + 1


def test_failing_client_changes_only_its_own_update():
    data = make_data(n=[40, 40, 40, 40, 40])
    _, failed = _ep_run(data, 3, fail=("c2", 1))
    assert "c2" in failed.history[1].failed
    # The same run in which c2 simply did not take part in round 1.
    schedule = [list(data.clients), ["c0", "c1", "c3", "c4"], list(data.clients)]
    _, skipped = _ep_run(data, 3, participation=schedule)
    np.testing.assert_allclose(failed.server_state.q.r, skipped.server_state.q.r, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(failed.server_state.q.Q, skipped.server_state.q.Q, rtol=1e-12, atol=1e-12)


def test_result_api_predict_save_load(tmp_path):
    data = make_data(n=[40, 40, 40, 40, 40])
    res = HierarchicalLinearModel(estimator_options={"num_draws": 800}, rounds=4).fit(data, seed=1)
    s = res.summary(level=0.9)
    assert list(s.columns) == ["mean", "sd", "lower", "upper", "p_value"]
    assert "mu[intercept]" in s.index and "tau[x0]" in s.index
    cs = res.client_summary(level=0.9)
    assert len(cs) == 5 * 4 and set(cs["client"]) == set(data.clients)
    X = data["c1"].X[:3]
    p = res.predict(X, client="c1", level=0.9)
    assert np.all(p["pred_lower"] <= p["lower"]) and np.all(p["upper"] <= p["pred_upper"])
    assert np.all((p["lower"] <= p["mean"]) & (p["mean"] <= p["upper"]))
    new = res.predict(X, client=None, level=0.9)
    assert np.all(new["pred_upper"] - new["pred_lower"] > p["pred_upper"] - p["pred_lower"])
    path = tmp_path / "fit.fedstats"
    res.save(path)
    back = HierarchicalResult.load(path)
    np.testing.assert_allclose(back.global_posterior().mean, res.global_posterior().mean)
    with pytest.raises(ValueError, match="columns"):
        res.predict(np.ones((2, 7)), client="c1")
    with pytest.raises(KeyError, match="unknown client"):
        res.client_posterior("nope")


def test_predictive_draws_are_joint_and_weighted():
    # Unknown noise, importance moments: a predictive draw pairs theta_k with the sigma_k of
    # the same tilted draw and resamples by the importance weights. The oracle is the
    # weighted mixture sum_i w_i N(x theta_i, sigma_i^2), whose quantiles we solve for.
    from scipy.optimize import brentq
    from scipy.stats import norm

    data = make_data(n=[40, 40, 40, 40, 40])
    res = HierarchicalLinearModel(fit_intercept=False, estimator_options={"num_draws": 800}, rounds=4).fit(data, seed=1)
    post, noise = res.client_posterior("c2"), res.client_noise("c2")
    assert post.weights is not None and np.ptp(post.weights) > 0
    theta, sig = res._joint_draws("c2", 3000, np.random.default_rng(0))
    idx = [int(np.flatnonzero(np.all(post.draws == t, axis=1))[0]) for t in theta[:200]]
    np.testing.assert_array_equal(sig[:200], noise.draws[idx, 0])
    assert np.all(post.weights[idx] > 0)
    x = data["c2"].X[:2]
    p = res.predict(x, client="c2", level=0.9, n=40000, seed=2)
    w = post.weights
    for r in range(2):
        loc = post.draws @ x[r]

        def cdf(t):
            return w @ norm.cdf((t - loc) / noise.draws[:, 0])

        lo, hi = (brentq(lambda t, a=a: cdf(t) - a, -50, 50) for a in (0.05, 0.95))
        width = hi - lo
        assert abs(p["pred_lower"][r] - lo) < 0.03 * width and abs(p["pred_upper"][r] - hi) < 0.03 * width


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(tau="full"), "tau must be"),
        (dict(tau=-1.0), "positive"),
        (dict(prior_mu=(0, -1)), "prior_mu"),
        (dict(estimator="bogus"), "unknown tilted estimator"),
        (dict(estimator="gibbs"), "closed-form conditionals"),
        (dict(damping=0.0), "damping"),
        (dict(estimator="exact"), "needs known tau and sigma"),
        (dict(estimator="exact", tau=1.0), "needs known tau and sigma"),
    ],
)
def test_bad_options_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        HierarchicalLinearModel(**bad).fit(make_data())


def test_fit_raises_when_no_client_ever_answers(monkeypatch):
    from fedstats.inference.tilted import RaoBlackwellTilted  # the default here

    def broken(self, *a, **k):
        raise FloatingPointError("sampler exploded")

    monkeypatch.setattr(RaoBlackwellTilted, "estimate", broken)
    with pytest.raises(RuntimeError, match="no client answered.*sampler exploded"):
        HierarchicalLinearModel(rounds=2).fit(make_data())


def test_fast_adaptation_three_levels():
    """Spec A13: a new client adapts from q(phi) at the three levels of spec §2.6.

    The spec suggests N = 5 points; with d = 4 and noise sd 0.05, five points identify theta
    and any prior gives the same answer to about 1e-3, so we use N = 3 < d, where the prior
    has to fill a direction the data do not see. Interval width is no virtue here: the
    population variances reach 2.5, so N(0, I) gives narrow intervals that under-cover. The
    exact check of level 3 is calibration: clients drawn from the fitted population (level
    2) get 90% intervals that cover their theta 90% of the time.
    """
    from fedstats.datasets.synthetic import UQ_MU, UQ_TAU, hm2_federation

    data, truth = hm2_federation(n_clients=30, n_obs=100, sigma=0.05, seed=5)
    res = HierarchicalLinearModel(standardize=False, fit_intercept=False, sigma=0.05, rounds=6).fit(data, seed=0)
    q = res.global_posterior()
    # method "mean" (the paper's level 1): plug-in population mean, E_q[mu], near the generator's mu
    point = res.new_client_posterior(method="mean")
    np.testing.assert_allclose(point, q.mean[:4])
    with pytest.warns(DeprecationWarning, match=r"level=.*use method="):  # the former name, one release
        np.testing.assert_array_equal(res.new_client_posterior(level=1), point)
    assert np.all(np.abs(point - UQ_MU) < 3 * q.sd[:4])
    # method "prior" (level 2): prior predictive of theta_new; its variance adds E[tau] to Var(mu)
    pp = res.new_client_posterior(method="prior", n=20000)
    np.testing.assert_allclose(pp.mean, q.mean[:4], atol=0.05)
    expected_var = np.exp(q.mean[4:] + q.sd[4:] ** 2 / 2) + q.sd[:4] ** 2
    np.testing.assert_allclose(pp.sd**2, expected_var, rtol=0.1)
    # method "data" (level 3) against the N(0, I)-prior conjugate posterior
    rng = np.random.default_rng(11)
    population = pp.sample(60, seed=rng)
    rmse_q, rmse_0, cover_q, cover_0 = [], [], [], []
    for i in range(60):
        th_true = UQ_MU + np.sqrt(UQ_TAU) * rng.standard_normal(4)  # the generator's population
        for th, rec in ((th_true, "rmse"), (population[i], "cover")):
            X = rng.standard_normal((3, 4))
            y = X @ th + 0.05 * rng.standard_normal(3)
            post = res.new_client_posterior(X, y, sigma=0.05, seed=i)
            P0 = np.eye(4) + X.T @ X / 0.05**2
            m0 = np.linalg.solve(P0, X.T @ y / 0.05**2)
            if rec == "rmse":
                Xt = rng.standard_normal((200, 4))
                rmse_q.append(np.sqrt(np.mean((Xt @ (post.mean - th)) ** 2)))
                rmse_0.append(np.sqrt(np.mean((Xt @ (m0 - th)) ** 2)))
            else:
                lo, hi = post.credible_interval(0.9)
                cover_q.append((lo <= th) & (th <= hi))
                cover_0.append(np.abs(th - m0) <= 1.645 * np.sqrt(np.diag(np.linalg.inv(P0))))
    assert np.mean(rmse_q) < 0.8 * np.mean(rmse_0), (np.mean(rmse_q), np.mean(rmse_0))
    # 240 intervals, correlated within a client: allow 0.06 around 0.9
    assert abs(np.mean(cover_q) - 0.9) < 0.06, np.mean(cover_q)
    assert np.mean(cover_0) < np.mean(cover_q) - 0.1, (np.mean(cover_0), np.mean(cover_q))


def test_a_round_with_an_improper_cavity_keeps_its_batch_size():
    """A client whose cavity is not positive definite sits the round out, and the estimator
    still receives the round's whole batch (the others, padded with a copy of the first, as
    the estimators pad): a new batch size would be a new compilation. The other clients'
    replies equal those of a round without it."""
    from dataclasses import replace

    from fedstats.federation import SkipRound
    from fedstats.inference.gaussian import NaturalGaussian
    from fedstats.inference.tilted import ExactTilted

    data = make_data(n=[40, 40, 40, 40, 40])
    model = exact_model()
    site = model._site(3)
    sizes = []

    class Spy(ExactTilted):
        def estimate(self, model, cavity_mean, cavity_cov, stats, seeds, **kw):
            sizes.append(len(stats))
            return super().estimate(model, cavity_mean, cavity_cov, stats, seeds, **kw)

    alg = FederatedEP(site, model._prior(site), Spy())
    sig = {f"c{k}": s for k, s in enumerate(SIGMA)}
    design = ClientRows(data, False, sig)
    rngs = lambda: [np.random.default_rng(k) for k in range(5)]  # noqa: E731
    datas = [design[c] for c in data.clients]
    states = [alg.init_client(c, d, r) for c, d, r in zip(data.clients, datas, rngs())]
    msg = alg.broadcast(alg.init_server(data.clients, np.random.default_rng(0)), "c0", 0)
    # c2's site is more precise than q: its cavity q / site is improper
    states[2] = replace(states[2], site=NaturalGaussian(np.zeros(3), 2 * np.asarray(msg["Q"])))
    out = alg.client_steps([msg] * 5, states, datas, rngs())
    assert sizes == [5] and isinstance(out[2], SkipRound)
    alone = alg.client_steps([msg] * 4, states[:2] + states[3:], datas[:2] + datas[3:], rngs()[:2] + rngs()[3:])
    for a, b in zip([o for i, o in enumerate(out) if i != 2], alone):
        for key in ("dr", "dQ"):
            np.testing.assert_allclose(a[0][key], b[0][key], rtol=0, atol=1e-12)


def test_nuts_mode_matches_exact_posterior_small_federation():
    """Spec A5 with sampled tilted moments: K <= 10, mean within 0.1 sd, sd within 10%."""
    data = make_data(n=[40, 40, 40, 40, 40])
    sig = {f"c{k}": s for k, s in enumerate(SIGMA)}
    res = HierarchicalLinearModel(
        standardize=False,
        tau=TAU,
        sigma=sig,
        fit_intercept=False,
        estimator="nuts",
        rounds=3,
        tol=0,
        damping=0.7,
        estimator_options=dict(num_warmup=300, num_samples=2000, num_chains=4),
    ).fit(data, seed=0)
    mean, cov = pooled_exact(data, TAU, SIGMA)
    sd = np.sqrt(np.diag(cov)[:3])
    g = res.global_posterior()
    assert np.all(np.abs(g.mean - mean[:3]) / sd < 0.1)
    assert np.all(np.abs(g.sd / sd - 1) < 0.1)
    for h in res.history:
        assert not h.failed
    diag = [st.diagnostics for st in res.client_states.values()]
    assert all(d["rhat_max"] < 1.05 and d["ess_min"] > 400 for d in diag)
    # Client posteriors (Rao-Blackwellised over the NUTS draws) match the exact marginals.
    for k, c in enumerate(data.clients):
        i = slice((k + 1) * 3, (k + 2) * 3)
        post = res.client_posterior(c)
        assert np.all(np.abs(post.mean - mean[i]) / np.sqrt(np.diag(cov)[i]) < 0.15)
