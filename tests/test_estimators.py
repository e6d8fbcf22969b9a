"""The estimator conventions (fedstats.estimator), the same for every model: parameters stored
as given and exposed (get_params / set_params / clone), a generated repr, no **options, one
error style for bad parameters, and fit taking what converts to a FederatedData."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats import HierarchicalLinearModel
from fedstats.estimator import Estimator
from fedstats.glm import BayesianGLM, FederatedGLM, HierarchicalGLM
from fedstats.gp import FGPR
from fedstats.linear import BayesianLasso, BayesianRidge, BayesianShrinkage, StructuralCovarianceModel
from fedstats.linear.baselines import DistributedRidge, Ditto, FedAvg, PooledOracle, Separate
from fedstats.mixture import FEMOMD, DecentralizedGaussianMixture, FederatedGaussianMixture, VariationalGaussianMixture

MODELS = {
    "hm2": lambda: HierarchicalLinearModel(rounds=3, tau="iso"),
    "shrinkage": lambda: BayesianShrinkage("ridge", rounds=3),
    "lasso": lambda: BayesianLasso(rounds=3, standardize=False),
    "ridge": lambda: BayesianRidge(rounds=3),
    "hm1": lambda: StructuralCovarianceModel(rounds=4, eig_floor=0.1),
    "separate": lambda: Separate(method="ols"),
    "fedavg": lambda: FedAvg(rounds=5),
    "ditto": lambda: Ditto(lam=0.1, rounds=5),
    "distributed-ridge": lambda: DistributedRidge(lam=0.01),
    "oracle": lambda: PooledOracle(omega=np.eye(3), noise_var=1.0),
    "fgpr": lambda: FGPR(rounds=2),
    "glm": lambda: FederatedGLM("gaussian", cov_type="HC0"),
    "bglm": lambda: BayesianGLM("gaussian", rounds=2, num_draws=200),
    "hglm": lambda: HierarchicalGLM("poisson", rounds=2, num_draws=200),
    "fedem": lambda: FederatedGaussianMixture(2, rounds=5, n_init=2),
    "vb-fedem": lambda: VariationalGaussianMixture(2, rounds=5, n_init=2),
    "d-fedem": lambda: DecentralizedGaussianMixture(2, rounds=5, n_init=2, graph="ring"),
    "fem-omd": lambda: FEMOMD(3, horizon=10, eta=None),  # online: partial_fit(batch, seed=...)
}
# (parameter, bad value) declared in each model's constraints
BAD = {
    "hm2": ("rounds", 0),
    "shrinkage": ("penalty", "elastic"),
    "lasso": ("damping", 1.5),
    "ridge": ("tol", -1),
    "hm1": ("posterior_omega", "mle"),
    "separate": ("method", "qr"),
    "fedavg": ("local_steps", 0),
    "ditto": ("grad_reduction", "max"),
    "fgpr": ("kernel", "cubic"),
    "glm": ("family", "weibull"),
    "bglm": ("prior_scale", 0.0),
    "hglm": ("family", "gaussian"),
    "fedem": ("n_components", 0),
    "vb-fedem": ("mean_precision_prior", -1.0),
    "d-fedem": ("mixing", "slow"),
}


@pytest.mark.parametrize("name", MODELS)
def test_parameters_as_given_clone_and_repr(name):
    model = MODELS[name]()
    assert isinstance(model, Estimator)
    params = model.get_params()
    assert set(params) == set(type(model)._param_names())
    twin = model.clone()
    assert type(twin) is type(model) and twin is not model
    for k, v in params.items():
        assert np.array_equal(twin.get_params()[k], v) if isinstance(v, np.ndarray) else twin.get_params()[k] == v
    # the repr names the class and the parameters that differ from their defaults, nothing else
    r = repr(model)
    assert r.startswith(type(model).__name__ + "(") and "\n" not in r and len(r) < 200
    assert repr(type(model)(**params)) == r
    with pytest.raises(ValueError, match="has no parameter"):
        model.set_params(not_a_parameter=1)
    key = next(iter(params))
    assert model.set_params(**{key: params[key]}) is model


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_parameters_one_error_style_at_fit(name):
    model = MODELS[name]()
    param, value = BAD[name]
    model.set_params(**{param: value})  # stored as given: nothing is checked before fit
    assert model.get_params()[param] == value
    rng = np.random.default_rng(0)
    data = [(rng.normal(size=(20, 2)), rng.normal(size=20)) for _ in range(3)]
    if name in ("fedem", "vb-fedem", "d-fedem"):
        data = [X for X, _ in data]
    with pytest.raises(ValueError, match=rf"^{type(model).__name__}: {param} must be .*, got {value!r}$"):
        model.fit(data)


def test_no_model_hides_parameters_behind_kwargs():
    class Opaque(Estimator):
        def __init__(self, **options):
            self.options = options

    with pytest.raises(TypeError, match="every parameter must be named"):
        Opaque().get_params()
    for make in MODELS.values():
        type(make())._param_names()  # raises for a **kwargs constructor


@pytest.mark.parametrize("name", ["hm2", "lasso", "hm1", "separate", "fgpr", "fedem"])
def test_fit_takes_what_converts_to_federated_data(name):
    rng = np.random.default_rng(1)
    pairs = [(rng.normal(size=(25, 2)), rng.normal(size=25)) for _ in range(3)]
    data = [X for X, _ in pairs] if name == "fedem" else pairs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = MODELS[name]().fit(data, seed=0)
        res2 = MODELS[name]().fit(dict(enumerate(data)), seed=0)
    assert res.clients == [0, 1, 2] and res2.clients == [0, 1, 2]
