"""A user-written NumPyro likelihood fitted by federated EP (fedstats.inference.custom),
against pooled NUTS of the same model: the robust Student-t regression of the docs."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.inference.custom import federated_ep
from fedstats.inference.tilted import NUTSTilted
from fedstats.reference.custom import pooled_nuts


def student_t(X, y=None):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    log_sigma = numpyro.sample("log_sigma", dist.Normal(0, 1))
    log_nu = numpyro.sample("log_nu", dist.Normal(1, 1))
    numpyro.sample("y", dist.StudentT(jnp.exp(log_nu), X @ beta, jnp.exp(log_sigma)), obs=y)


PRIOR = {"beta": (0.0, 3.0), "log_sigma": (0.0, 1.0), "log_nu": (1.0, 1.0)}


def test_student_t_regression_with_a_shared_df_equals_pooled_nuts():
    rng = np.random.default_rng(0)
    Xs, ys = [], []
    for n in (80, 150, 60, 120):
        X = np.column_stack([np.ones(n), rng.normal(size=n)])
        Xs.append(X)
        ys.append(X @ [1.0, 2.0] + 0.5 * rng.standard_t(3, size=n))  # heavy tails, 3 df
    data = FederatedData.from_arrays(Xs, ys, feature_names=["one", "x"])
    res = federated_ep(student_t, data, prior=PRIOR, seed=1)
    g = res.global_posterior()
    assert g.names == ["beta[0]", "beta[1]", "log_sigma", "log_nu"]
    ref = pooled_nuts(student_t, data, prior=PRIOR, num_samples=1500)
    assert np.max(np.abs(g.mean - ref.mean(0)) / ref.std(0)) < 0.25
    assert np.all((g.sd / ref.std(0) > 0.8) & (g.sd / ref.std(0) < 1.25))
    assert res.summary().index.tolist() == g.names and res.communication.bytes_up > 0


def test_the_model_and_prior_are_checked():
    data = FederatedData.from_arrays([np.ones((5, 1))], [np.arange(5.0)])
    with pytest.raises(ValueError, match="missing \\['log_nu'\\]"):
        federated_ep(student_t, data, prior={"beta": (0, 1), "log_sigma": (0, 1)})

    def no_obs(X, y=None):
        import numpyro
        import numpyro.distributions as dist

        numpyro.sample("a", dist.Normal(0, 1))

    with pytest.raises(ValueError, match="observe y in exactly one sample site"):
        federated_ep(no_obs, data, prior={"a": (0, 1)})


def test_the_result_saves_and_loads(tmp_path):
    rng = np.random.default_rng(1)
    Xs = [np.column_stack([np.ones(40), rng.normal(size=40)]) for _ in range(2)]
    data = FederatedData.from_arrays(Xs, [X @ [0.5, -1.0] + rng.normal(size=40) for X in Xs])
    res = federated_ep(student_t, data, prior=PRIOR, rounds=2, num_draws=400)
    back = type(res).load(res.save(tmp_path / "custom.fedstats"))
    np.testing.assert_allclose(back.summary().to_numpy(), res.summary().to_numpy())
    assert back.model == "student_t" and back.client_summary().empty


def random_intercept(X, y=None):
    """Logistic regression with a slope shared by every client and each client's own
    intercept around a population mean (a local latent)."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0, 1))
    log_sd = numpyro.sample("log_sd", dist.Normal(0, 1))
    slope = numpyro.sample("slope", dist.Normal(0, 1))
    b = numpyro.sample("b", dist.Normal(mu, jnp.exp(log_sd)))  # this client's intercept
    numpyro.sample("y", dist.Bernoulli(logits=b + slope * X[:, 0]), obs=y)


RI_PRIOR = {"mu": (0.0, 1.0), "log_sd": (0.0, 1.0), "slope": (0.0, 1.0)}


def random_intercept_clients(K=10, seed=2):
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for n in rng.integers(40, 120, K):
        x = rng.normal(size=(n, 1))
        b = -0.5 + 0.7 * rng.normal()
        Xs.append(x)
        ys.append(rng.binomial(1, 1 / (1 + np.exp(-(b + 0.8 * x[:, 0])))).astype(float))
    return FederatedData.from_arrays(Xs, ys, feature_names=["x"])


GLOBAL = ["mu", "log_sd", "slope"]


@pytest.fixture(scope="module")
def ri_reference():
    """The random-intercept data and pooled NUTS of the same model (shared by both tests)."""
    data = random_intercept_clients()
    return data, *pooled_nuts(
        random_intercept, data, prior=RI_PRIOR, global_sites=GLOBAL, num_samples=1500, return_local=True
    )


@pytest.mark.parametrize("tilted", ["importance", "nuts"])
def test_local_latents_equal_pooled_nuts(tilted, ri_reference):
    """A per-client random intercept as a local latent (``global_sites=``): the global
    parameters within 0.25 sd of pooled NUTS of the same model (every client's intercept
    sampled with them), sd ratios in [0.8, 1.25], and each client's intercept posterior
    (one more counted round) within 0.3 sd."""
    data, ref, local = ri_reference
    if tilted == "nuts":  # the option's estimator, shorter chains (the test's time)
        tilted = NUTSTilted(num_warmup=200, num_samples=300, num_chains=2, target="collapsed")
    res = federated_ep(
        random_intercept,
        data,
        prior=RI_PRIOR,
        global_sites=GLOBAL,
        tilted=tilted,
        damping=0.5,
        rounds=30,
        num_draws=1024,
        seed=3,
    )
    g = res.global_posterior()
    assert g.names == GLOBAL and res.converged
    assert np.max(np.abs(g.mean - ref.mean(0)) / ref.std(0)) < 0.25
    assert np.all((g.sd / ref.std(0) > 0.8) & (g.sd / ref.std(0) < 1.25))
    for k, c in enumerate(data.clients):
        post = res.client_posterior(c)
        assert post.names == ["b"]
        assert abs(post.mean[0] - local[:, k, 0].mean()) / local[:, k, 0].std() < 0.3, c
        assert 0.8 < post.sd[0] / local[:, k, 0].std() < 1.25, c
    cs = res.client_summary()
    assert len(cs) == len(data.clients) and set(cs["parameter"]) == {"b"}
    assert res.communication.by_kind["client posteriors"]["rounds"] == 1


def test_local_latents_are_checked():
    data = random_intercept_clients(K=2)
    with pytest.raises(ValueError, match="not latent sample sites"):
        federated_ep(random_intercept, data, prior=RI_PRIOR, global_sites=["mu", "nope"])

    def per_row(X, y=None):
        import numpyro
        import numpyro.distributions as dist

        a = numpyro.sample("a", dist.Normal(0, 1))
        e = numpyro.sample("e", dist.Normal(0, 1).expand([X.shape[0]]).to_event(1))
        numpyro.sample("y", dist.Normal(a + e, 1.0), obs=y)

    with pytest.raises(ValueError, match="one value per row"):
        federated_ep(per_row, data, prior={"a": (0, 1)}, global_sites=["a"])

    def positive(X, y=None):
        import numpyro
        import numpyro.distributions as dist

        s = numpyro.sample("s", dist.HalfNormal(1.0))
        numpyro.sample("y", dist.Normal(0.0, s), obs=y)

    with pytest.raises(ValueError, match="must be real-valued"):
        federated_ep(positive, data, prior={"s": (0, 1)})
    with pytest.raises(ValueError, match="tilted must be one of"):
        federated_ep(random_intercept, data, prior=RI_PRIOR, tilted="mcmc")
    res = federated_ep(student_t, data, prior=PRIOR, rounds=2, num_draws=400)
    with pytest.raises(Exception, match="global_sites="):
        res.client_posterior(data.clients[0])
