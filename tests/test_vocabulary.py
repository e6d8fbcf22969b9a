"""One vocabulary (issue 42, item 6): "client" for a data holder, ``level`` only for an
interval's level, one spelling of public names, one style of result attributes; and every
renamed public name still works for one release, with a DeprecationWarning naming the new one,
including in result files written before the rename."""

import ast
import json
import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedstats.data import FederatedData
from fedstats.data.disclosure import NO_RULES

ROOT = Path(__file__).resolve().parent.parent / "fedstats"
#: the lines outside fedstats.gp that may say "device": torch's (FGPR's ``device="cpu"``, the
#: torch names a message may not carry) and the former value of the shrinkage's ``noise``
ALLOWED = re.compile(r'device="cpu"|_TORCH = \{"device"|\{"device": "client"\}|``noise="device"``')
#: British spellings of the verbs whose public names fedstats spells with -ize
LEVEL_OK = {"level", "stacklevel", "check_level", "level_moments", "level_data"}
BRITISH = re.compile(
    r"(?:standard|central|normal|optim|initial|vector|regular|summar|serial|parameter)is(?:e|ed|es|ing|ation|er)"
)


def _sources():
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in ROOT.rglob("*.py")}


def _public_names(tree):
    """Every public name a module declares: top-level functions and classes, their methods,
    properties and class fields, and the parameters of each public function or method."""
    out = []

    def visit(body, owner):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                if node.name != "__init__":
                    out.append((f"{owner}{node.name}", node.lineno))
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if arg.arg not in ("self", "cls") and not arg.arg.startswith("_"):
                        out.append((f"{owner}{node.name}({arg.arg})", node.lineno))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out.append((f"{owner}{node.name}", node.lineno))
                visit(node.body, f"{owner}{node.name}.")
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and owner:
                if not node.target.id.startswith("_"):
                    out.append((f"{owner}{node.target.id}", node.lineno))

    visit(tree.body, "")
    return out


def test_a_data_holder_is_a_client_and_a_device_is_torchs():
    """Outside the GP package "device" is only torch's (FGPR's ``device=`` passed on) or the
    former value ``noise="device"``; inside it, never "devices" (a GP's data holders are
    clients too)."""
    found = []
    for name, text in _sources().items():
        for i, line in enumerate(text.splitlines(), 1):
            if not re.search(r"\bdevices?\b", line, re.IGNORECASE):
                continue
            if re.search(r"\bdevices\b", line, re.IGNORECASE) or not (name.startswith("gp/") or ALLOWED.search(line)):
                found.append(f"{name}:{i}: {line.strip()}")
    assert not found, "a client called a device:\n" + "\n".join(found)


def test_public_names_have_one_spelling_and_level_means_an_intervals_level():
    """Public names spell -ize; no public name or parameter says "device" outside the GP
    package; ``level`` names only an interval's level (a float), never a fidelity or an EP
    way of adapting (their words: ``fidelities``, ``method``)."""
    bad = []
    for name, text in _sources().items():
        tree = ast.parse(text)
        for public, line in _public_names(tree):
            where = f"{name}:{line}: {public}"
            if BRITISH.search(public.lower()):
                bad.append(f"{where} (spelled -ise)")
            if "device" in public.lower() and not name.startswith("gp/"):
                bad.append(f"{where} (a client called a device)")
            # ``level`` and ``check_level`` (an interval's); the former names level_moments, level_data
            last = public[public.rfind("(") + 1 : -1] if public.endswith(")") else public.rsplit(".", 1)[-1]
            if "level" in last and last not in LEVEL_OK:
                bad.append(f"{where} (level for something other than an interval's level)")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                for arg in [*node.args.args, *node.args.kwonlyargs]:
                    if (
                        arg.arg == "level"
                        and arg.annotation is not None
                        and ast.unparse(arg.annotation) not in ("float", "Any")
                    ):
                        bad.append(f"{name}:{node.lineno}: {node.name}(level: {ast.unparse(arg.annotation)})")
    assert not bad, "\n".join(bad)


def test_results_attributes_have_one_style(fitted):
    """No fitted result has a public attribute with scikit-learn's trailing underscore (the
    contract's style: ``params``, ``means``, ``loglik``); the former names are aliases only."""
    from fedstats._deprecation import renamed_attribute
    from fedstats.registry import declarations

    online = {ex.name for d in declarations().values() for ex in d.examples if ex.data == "stream"}
    results, _, _ = fitted
    bad = {}
    for name, res in results.items():
        if name in online:  # an online estimator (its running state keeps scikit-learn's names); its result is checked
            continue
        own = [k for k in vars(res) if k.endswith("_") and not k.startswith("_")]
        declared = [
            k
            for cls in type(res).__mro__
            for k, v in vars(cls).items()
            if k.endswith("_") and not k.startswith("_") and not isinstance(v, renamed_attribute)
        ]
        if own or declared:
            bad[name] = own + declared
    assert not bad, bad


# ------------------------------------------------------------------ the former names, one release
def _mixture_data():
    rng = np.random.default_rng(0)
    X = [np.vstack([rng.normal(-3, 1, (30, 2)), rng.normal(3, 1, (30, 2))]) for _ in range(4)]
    return FederatedData.from_arrays(X, **NO_RULES)


def _warns(new):
    return pytest.warns(DeprecationWarning, match=rf"deprecated and goes in the next release: use .*{re.escape(new)}")


def test_renamed_mixture_attributes_warn_and_give_the_new_ones():
    from fedstats.mixture import DecentralizedGaussianMixture, FederatedGaussianMixture, VariationalGaussianMixture

    data = _mixture_data()
    res = FederatedGaussianMixture(2, rounds=20).fit(data, seed=0)
    for old, new in {"means_": "means", "covariances_": "covariances", "weights_": "weights"}.items():
        with _warns(f".{new}"):
            got = getattr(res, old)
        assert got is getattr(res, new)
    with _warns(".loglik"):
        assert res.loglik_ == res.loglik
    with _warns(".client_loglik"):
        assert res.client_loglik_ is res.client_loglik
    with _warns(".precisions_cholesky"):
        np.testing.assert_array_equal(res.precisions_cholesky_, res.precisions_cholesky)
    with _warns(".means"):  # setting a former name sets the new one
        before = res.means.copy()
        res.means_ = before + 1.0
    np.testing.assert_array_equal(res.means, before + 1.0)

    vb = VariationalGaussianMixture(2, rounds=10).fit(data, seed=0)
    for old in ("weight_concentration_", "mean_precision_", "degrees_of_freedom_"):
        with _warns(f".{old[:-1]}"):
            assert getattr(vb, old) is getattr(vb, old[:-1])
    dfem = DecentralizedGaussianMixture(2, rounds=10, graph="ring").fit(data, seed=0)
    for old in ("client_means_", "client_covariances_", "mixing_matrix_", "slem_"):
        with _warns(f".{old[:-1]}"):
            assert getattr(dfem, old) is getattr(dfem, old[:-1])


def test_renamed_parameters_methods_and_classes_warn_and_do_what_the_new_ones_do():
    import fedstats.inference.diagnostics as diagnostics
    import fedstats.linear as linear
    from fedstats.glm import FederatedGLM
    from fedstats.gp.multifidelity import AR1CoKriging, fidelity_data
    from fedstats.linear import BayesianLasso, StructuralCovarianceModel

    with _warns("noise='client'"):
        assert BayesianLasso(noise="device").noise == "client"
    with _warns("linear.CentralizedShrinkageResult"):
        assert linear.CentralisedShrinkageResult is linear.CentralizedShrinkageResult
    x = np.random.default_rng(1).normal(size=(2, 50))
    with _warns("diagnostics.rank_normalize"):
        np.testing.assert_array_equal(diagnostics.rank_normalise(x), diagnostics.rank_normalize(x))
    with pytest.raises(AttributeError):
        diagnostics.no_such_name  # noqa: B018 - an unknown name stays an AttributeError

    rng = np.random.default_rng(2)
    X = [rng.normal(size=(20, 3)) for _ in range(3)]
    data = FederatedData.from_arrays(X, [x @ [1.0, -1.0, 0.5] + rng.normal(0, 0.1, 20) for x in X], **NO_RULES)
    model = StructuralCovarianceModel(rounds=5)
    with _warns(".fit_centralized"):
        old = model.fit_centralised(data, seed=0)
    np.testing.assert_array_equal(old.theta, model.fit_centralized(data, seed=0).theta)
    with _warns(".omega_array"):
        assert old.omega_ is old.omega_array
    with pytest.raises(AttributeError):
        model.fit_centralised_by_a_typo  # noqa: B018

    glm = FederatedGLM(family="poisson").fit(
        FederatedData.from_arrays(X, [rng.poisson(2.0, 20).astype(float) for _ in X], **NO_RULES)
    )
    with _warns("._family"):
        assert type(glm.family_) is type(glm._family)

    mf = fidelity_data("forrester")
    with _warns(".fidelities"):
        assert mf.levels is mf.fidelities
    with _warns(".fidelities"):
        assert mf.problem.levels is mf.problem.fidelities
    with _warns(".fidelity_data"):
        lf = mf.level_data("LF")
    hf = mf.fidelity_data("HF")
    with _warns("fidelities="):
        res = AR1CoKriging().fit(levels=[lf, hf])
    assert res.names == ["fidelity0", "fidelity1"]
    with _warns(".fidelities"):
        assert res.levels is res.fidelities
    with _warns(".fidelity_moments"):
        old_m = res.level_moments(mf.X_test[:5], 0)
    np.testing.assert_array_equal(old_m[0], res.fidelity_moments(mf.X_test[:5], 0)[0])
    with pytest.raises(TypeError, match="pass fidelities= only"):
        AR1CoKriging().fit(levels=[lf, hf], fidelities=[lf, hf])


def _as_former(path, out, classes, attributes):
    """The result file ``path`` rewritten as a release before the renames wrote it: class
    names and attribute names back to their former ones."""
    with zipfile.ZipFile(path) as z:
        body, arrays = json.loads(z.read("fedstats.json")), z.read("arrays.npz")

    def walk(x):
        if isinstance(x, list):
            return [walk(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__object__" in x:
            x = {**x, "__object__": classes.get(x["__object__"], x["__object__"])}
            x["state"] = {"__dict__": [[attributes.get(k, k), walk(v)] for k, v in x["state"]["__dict__"]]}
            return x
        return {k: walk(v) for k, v in x.items()}

    body["result"] = walk(body["result"])
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("fedstats.json", json.dumps(body))
        z.writestr("arrays.npz", arrays)
    return out


def test_result_files_written_with_the_former_names_load(tmp_path):
    from fedstats.gp.multifidelity import AR1CoKriging, fidelity_data
    from fedstats.mixture import FederatedGaussianMixture
    from fedstats.result_file import FORMER_NAMES, _index
    from fedstats.results import load_result

    mf = fidelity_data("forrester")
    res = AR1CoKriging().fit([mf.fidelity_data("LF"), mf.fidelity_data("HF")])
    path = _as_former(
        res.save(tmp_path / "now.zip"), tmp_path / "old.zip", {"AR1Fidelity": "AR1Level"}, {"fidelities": "levels"}
    )
    assert b"AR1Level" in zipfile.ZipFile(path).read("fedstats.json")
    back = load_result(path)
    assert [type(f).__name__ for f in back.fidelities] == ["AR1Fidelity", "AR1Fidelity"]
    np.testing.assert_array_equal(back.predict(mf.X_test[:5])["mean"], res.predict(mf.X_test[:5])["mean"])

    gm = FederatedGaussianMixture(2, rounds=10).fit(_mixture_data(), seed=0)
    former = {
        "means": "means_",
        "covariances": "covariances_",
        "weights": "weights_",
        "client_loglik": "client_loglik_",
    }
    old = load_result(_as_former(gm.save(tmp_path / "gm.zip"), tmp_path / "gm_old.zip", {}, former))
    assert not any(k.endswith("_") and not k.startswith("_") for k in vars(old))
    np.testing.assert_array_equal(old.means, gm.means)
    assert old.loglik == gm.loglik

    # every former class name leads to a class fedstats registers today
    assert all(new in _index() for new in FORMER_NAMES.values()), FORMER_NAMES
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading an old file is not a deprecated use: no warning
        load_result(path)
