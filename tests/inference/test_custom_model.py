"""A user-written NumPyro likelihood fitted by federated EP (fedstats.inference.custom),
against pooled NUTS of the same model: the robust Student-t regression of the docs."""

from __future__ import annotations

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.inference.custom import federated_ep, pooled_nuts


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
