"""The registry (fedstats.registry): one declaration per model, each complete and resolvable, read
without importing a model, and consistent with the command line, the file format and the
threat-model page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedstats.registry import MODULES, commands, declarations
from fedstats.registry.spec import load

DECLARATIONS = declarations()
SITES = Path(__file__).resolve().parent.parent / "examples" / "sites.csv"


def test_reading_the_registry_imports_no_model():
    code = (
        "import sys; from fedstats.registry import declarations, commands; declarations(); commands(); "
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['fedstats', p] for p in "
        "('glm', 'gp', 'mixture')) or m in ('torch', 'numpyro', 'flwr')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_every_declaration_resolves(name):
    d = DECLARATIONS[name]
    assert d.name == name and d.summary and len(d.summary) < 160
    assert callable(d.estimator_class)
    assert isinstance(d.result_class, type)
    if d.reference is not None:  # the pooled fit it is tested against (statsmodels and scikit-learn in tests)
        assert callable(load(d.reference)), d.reference
    if d.bad_parameter is not None:
        assert d.bad_parameter[0] in d.estimator_class._param_names()
    for ex in d.examples:
        assert set(ex.params) <= set(d.estimator_class._param_names()), ex.name


def test_every_result_class_can_be_written_to_a_file():
    from fedstats.result_file import _index

    index = _index()
    missing = [d.result for d in DECLARATIONS.values() if d.result_class.__module__ != "builtins"]
    missing = [r for r in missing if load(r).__qualname__ not in index]
    assert not missing, f"result classes the file format cannot rebuild (no @register): {missing}"


def test_names_are_unique_and_the_modules_are_listed_once():
    assert len(MODULES) == len(set(MODULES))
    titles = [t.title for d in DECLARATIONS.values() for t in d.disclosure]
    shared = {t.title for d in DECLARATIONS.values() for t in d.disclosure if titles.count(t.title) > 1}
    for title in shared:  # a table two models share is one object, not two copies
        assert len({id(t) for d in DECLARATIONS.values() for t in d.disclosure if t.title == title}) == 1, title
    examples = [ex.name for d in DECLARATIONS.values() for ex in d.examples]
    assert len(examples) == len(set(examples))


def test_the_command_options_are_declared_alike_by_every_model_that_takes_them():
    from fedstats.cli.models import options

    opts = options()  # raises where two models declare one flag differently
    assert "--rounds" in opts and set(opts["--rounds"][1]) == set(commands())
    for flag, (o, _) in opts.items():
        assert flag.startswith("--") and o.help and o.dest


#: a model family declared outside fedstats, in one module: the Bayesian GLM under another name
TOY = """
from fedstats.registry.exchanges import exchange
from fedstats.registry.spec import Array, Command, Declaration, Disclosure, Example


def build(args):
    from fedstats.glm import BayesianGLM

    return BayesianGLM(family="gaussian", rounds=3, num_draws=200), {}


DECLARATIONS = (
    Declaration(
        "toy",
        "fedstats.glm:BayesianGLM",
        "fedstats.glm:BayesianGLMResult",
        "a toy family declared in one module",
        (Disclosure("ToyModel", (exchange("toy rounds", "Toy", "every round", (Array("s", "its sums", "its sums"),), "all"),), "nothing"),),
        Command("toy", "the toy family", (), build, lambda args, res, seconds: f"toy: {res.rounds} rounds"),
        examples=(Example("toy", {"family": "binomial", "rounds": 2, "num_draws": 200},
                          data="fedstats.datasets.synthetic:hierarchical_logistic"),),
    ),
)
"""


def test_a_new_family_is_one_module_and_one_registration(tmp_path):
    """Registering a declaration module (one line in ``MODULES``) is all a new model needs: the
    command line fits it by name, the threat-model page has its table, and its example's own
    data source (a ``module:function`` path) feeds the tests that run every example."""
    (tmp_path / "toy_family.py").write_text(TOY, encoding="utf-8")
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
import fedstats.registry as registry
registry.MODULES = (*registry.MODULES, "toy_family")
from fedstats.cli import main
from fedstats.registry.threat_page import threat_model_tables
assert "ToyModel" in threat_model_tables()
ex = registry.declarations()["toy"].examples[0]
data = ex.data_for({{}}, n_clients=5)
res = registry.declarations()["toy"].estimator_class(**ex.params).fit(data, seed=0)
assert len(data.clients) == 5 and res.rounds == 2
sys.exit(main(["fit", {str(SITES)!r}, "--by", "site", "--target", "y", "--model", "toy"]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "toy: 3 rounds" in out.stdout
