"""The estimator conventions (fedstats.estimator), the same for every model: parameters stored
as given and exposed (get_params / set_params / clone), a generated repr, no **options, one
error style for bad parameters, and fit taking what converts to a FederatedData."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedstats.estimator import Estimator
from fedstats.linear import BayesianShrinkage
from fedstats.linear.baselines import PooledOracle
from fedstats.registry import declarations

#: the registry's estimators (their first example's parameters), and two estimators that are not
#: models of their own: the shrinkage base class of the lasso and the ridge, and the pooled oracle
REGISTERED = {n: d for n, d in declarations().items() if d.examples}
MODELS = {n: (lambda d=d: d.estimator_class(**d.examples[0].params)) for n, d in REGISTERED.items()}
MODELS |= {
    "shrinkage": lambda: BayesianShrinkage("ridge", rounds=3),
    "oracle": lambda: PooledOracle(omega=np.eye(3), noise_var=1.0),
}
# (parameter, bad value) declared in each model's constraints
BAD = {n: d.bad_parameter for n, d in REGISTERED.items() if d.bad_parameter} | {"shrinkage": ("penalty", "elastic")}


def test_every_estimator_is_registered_or_named_here():
    """A new estimator class gets a declaration (fedstats.registry), or is named here as not a
    model of its own."""
    import importlib
    import pkgutil

    import fedstats

    for info in pkgutil.walk_packages(fedstats.__path__, "fedstats."):
        if "flower" not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found, todo = set(), [Estimator]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("fedstats.") and not sub.__name__.startswith("_"):
                found.add(sub)
    registered = {d.estimator_class for d in declarations().values()}
    from fedstats.glm._design import GLMOptions  # the GLMs' parameters, declared once
    from fedstats.mixture._common import MixtureEstimator, ServerMixture  # the mixtures' base classes

    others = {BayesianShrinkage, PooledOracle, MixtureEstimator, ServerMixture, GLMOptions}
    assert found - registered - others == set(), "estimators with no declaration in fedstats.registry"


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
    if name in REGISTERED and REGISTERED[name].examples[0].data == "features":
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
    data = [X for X, _ in pairs] if REGISTERED[name].examples[0].data == "features" else pairs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = MODELS[name]().fit(data, seed=0)
        res2 = MODELS[name]().fit(dict(enumerate(data)), seed=0)
    assert res.clients == [0, 1, 2] and res2.clients == [0, 1, 2]


#: the options every federated fit takes (fedstats.fitting), backend= included
RUN_OPTIONS = ("seed", "progress", "checkpoint", "resume", "batched", "backend")


def test_every_federated_fit_has_the_one_skeleton():
    """Every registered estimator whose fit runs rounds takes the same run options, and none
    repeats the skeleton's opening (its fit is decorated by fedstats.fitting.federated_fit)."""
    import inspect

    from fedstats.estimator import Estimator

    federated = [d for d in declarations().values() if d.disclosure and isinstance(d.estimator_class, type)]
    federated = [d for d in federated if d.name != "fem-omd"]  # online: partial_fit, one step per call
    assert len(federated) >= 15
    for d in federated:
        assert issubclass(d.estimator_class, Estimator)
        fit = d.estimator_class.fit
        params = inspect.signature(fit).parameters
        assert all(o in params or o == "backend" for o in RUN_OPTIONS), (d.name, list(params))
        assert (
            inspect.unwrap(fit).__qualname__.endswith(".fit")
            and "run" in inspect.signature(inspect.unwrap(fit)).parameters
        ), d.name


def test_rounds_has_one_home_and_the_old_fit_argument_warns():
    from fedstats import HierarchicalLinearModel

    rng = np.random.default_rng(0)
    data = [(rng.normal(size=(20, 2)), rng.normal(size=20)) for _ in range(3)]
    with pytest.warns(DeprecationWarning, match=r"HierarchicalLinearModel.fit\(rounds=...\) is deprecated"):
        res = HierarchicalLinearModel().fit(data, rounds=2, progress=False)
    assert res.rounds <= 2
