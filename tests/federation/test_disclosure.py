"""The threat-model tables (the disclosures of the registry's declarations) against the code:
every exchange a fit makes is listed with its exact arrays and summed arrays, every listed
exchange is made by some fit (or declared so by its class), every algorithm class is listed,
and the docs page asks for the generated tables."""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats import FederatedData
from fedstats.federation import FederatedAlgorithm
from fedstats.registry import declarations
from fedstats.registry.threat_page import MARKER, disclosures, threat_model_tables

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "threat-model.md"
SITES = ROOT / "examples" / "sites.csv"


TABLES = {t.title: t for t in disclosures()}
#: each example fit of the registry -> the table of its declaration's exchanges (its first)
FITS = {ex.name: d.disclosure[0].title for d in declarations().values() for ex in d.examples}
FITTED = set(FITS.values())


def declared(title):
    return {(e.kind, e.algorithm, frozenset(e.keys), frozenset(e.summed)) for e in TABLES[title].exchanges}


def as_declared(rec):
    kind, algorithm, keys, summed = rec
    return (kind, algorithm, frozenset(keys), frozenset(summed))


@pytest.fixture(scope="module")
def extra_exchanges(record_exchanges):
    """Fits that make the optional exchanges (a robust GLM, Wald intervals, FEM-OMD's own start,
    the LOO and WAIC sums of the Bayesian regressions)."""
    from fedstats import HierarchicalLinearModel
    from fedstats.experiments.regret import MixtureStream
    from fedstats.glm import BayesianGLM, FederatedGLM
    from fedstats.linear import BayesianRidge
    from fedstats.mixture import FEMOMD, FederatedGaussianMixture

    df = pd.read_csv(SITES)
    data = FederatedData.from_dataframe(df, by="site", target="y")
    gm = FederatedData.from_dataframe(df[["site", "x1", "x2"]], by="site")
    out = {}
    with record_exchanges() as seen, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FederatedGLM("gaussian", cov_type="HC0").fit(data)
        out["FederatedGLM"], seen[:] = set(seen), []
        FederatedGaussianMixture(2).fit(gm, seed=0).wald_intervals(gm)
        out["FederatedGaussianMixture (FedEM)"], seen[:] = set(seen), []
        stream = MixtureStream(n_clients=4, n=40, d=2, n_components=2, process="fixed", seed=1)
        FEMOMD(2, horizon=2).partial_fit(stream.batch(1))
        out["FEMOMD"], seen[:] = set(seen), []
        for model, name in (
            (HierarchicalLinearModel(), "HierarchicalLinearModel (HM2)"),
            (BayesianRidge(), "BayesianLasso, BayesianRidge"),
            (BayesianGLM("gaussian"), "BayesianGLM, HierarchicalGLM"),
        ):
            res = model.fit(data, seed=0)
            seen[:] = []
            res.loo(data, n=40)
            out[name] = set(seen)
            seen[:] = []
    return out


def test_every_exchange_of_every_fit_is_listed_as_it_is(exchanges, extra_exchanges):
    made = {m: set() for m in TABLES}
    for fit, recs in exchanges.items():  # an online model's steps are recorded under "<name>-result"
        made[FITS[fit.removesuffix("-result")]] |= {as_declared(r) for r in recs}
    for model, recs in extra_exchanges.items():
        made[model] |= {as_declared(r) for r in recs}
    for model, recs in made.items():
        undeclared = recs - declared(model)
        assert not undeclared, f"{model}: exchanges made but not listed as made: {sorted(map(str, undeclared))}"
    for model in FITTED:
        unmade = declared(model) - made[model]
        assert not unmade, f"{model}: listed exchanges no fit made: {sorted(map(str, unmade))}"


def algorithm_classes():
    for info in pkgutil.walk_packages(fedstats.__path__, "fedstats."):
        if "flower" in info.name or info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    out, todo = {}, [FederatedAlgorithm]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("fedstats."):
                out[sub.__name__] = sub
    return out


def test_every_algorithm_class_is_listed_and_unfitted_entries_match_their_class():
    classes = algorithm_classes()
    listed = {e.algorithm for d in TABLES.values() for e in d.exchanges}
    assert listed <= set(classes), f"unknown classes {sorted(listed - set(classes))}"
    # bases no model runs as they are: of the client-posterior rounds, and of LinearEP and RowsEP
    missing = set(classes) - listed - {"PosteriorRound", "FederatedEP"}
    assert not missing, f"algorithms missing from the threat model: {sorted(missing)}"
    for model, d in TABLES.items():
        if model in FITTED:
            continue
        for e in d.exchanges:  # not fitted in the tests: the class's own declaration
            cls = classes[e.algorithm]
            assert set(cls.reply_keys) == set(e.keys), (model, e.kind)
            assert set(cls.summed_keys) == set(e.summed), (model, e.kind)


def test_the_docs_page_asks_for_the_generated_tables():
    """The docs build puts the tables where the page has the marker (docs/_ext/threat_model.py)."""
    text = PAGE.read_text()
    assert text.count(MARKER) == 1
    assert "docs/_ext/threat_model.py" in (ROOT / "mkdocs.yml").read_text()
    tables = threat_model_tables()
    for t in TABLES.values():
        assert f"### {t.title}\n" in tables


def test_the_tables_mark_sums_and_refuse_bad_entries():
    from fedstats.registry.spec import Array, Exchange

    text = threat_model_tables()
    assert "| `dr`: " in text and "the sum over the clients" in text and "each client's" in text
    with pytest.raises(ValueError, match="not reply arrays"):
        Exchange("k", "A", "w", (Array("a", "x"),), ("b",))
    with pytest.raises(ValueError, match="twice"):
        Exchange("k", "A", "w", (Array("a", "x"), Array("a", "y")))
    assert np.all([isinstance(d.final_state, str) and d.final_state for d in TABLES.values()])
