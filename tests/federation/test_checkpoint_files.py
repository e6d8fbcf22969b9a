"""Checkpoints are written in the safe result format (issue 41, item 6): every model that
checkpoints writes a zip of JSON and arrays (no pickle), reads it back and resumes; a pickle
or a crafted file is refused without running anything it names."""

from __future__ import annotations

import pickle
import warnings
import zipfile

import numpy as np
import pandas as pd
import pytest

from fedstats import FederatedData
from fedstats.federation.checkpoints import read_checkpoint
from fedstats.gp.multifidelity import FederatedAR1
from fedstats.gp.nargp import FederatedNARGP
from fedstats.mixture import FederatedGaussianMixture


def regression(K=6, n=30, d=2):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(K * n, d))
    df = pd.DataFrame(X, columns=[f"x{i}" for i in range(d)])
    df["y"] = X @ np.ones(d) + rng.normal(size=K * n)
    df["c"] = np.repeat([f"s{k}" for k in range(K)], n)
    return FederatedData.from_dataframe(df, by="c", target="y")


def blobs(K=4, n=50):
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(size=(n, 2)) + (k % 2) * 4 for k in range(K)])
    df = pd.DataFrame(X, columns=["a", "b"])
    df["c"] = np.repeat([f"s{k}" for k in range(K)], n)
    return FederatedData.from_dataframe(df, by="c")


def binary():
    data = regression()
    rng = np.random.default_rng(2)
    Xs = [np.asarray(data[c].X) for c in data.clients]
    ys = [(X @ np.ones(2) + rng.normal(size=len(X)) > 0).astype(float) for X in Xs]
    return FederatedData.from_arrays(Xs, ys, clients=list(data.clients))


def chain():
    from fedstats.gp.multifidelity import fidelity_data

    return fidelity_data("branin", seed=1, sizes={"LF": 30, "MF": 20, "HF": 10}).train


FIDELITIES = ["LF", "MF", "HF"]


def survival():
    from fedstats.survival.simulate import proportional_hazards

    return proportional_hazards(6, seed=0, rows=30, resolution=0.1)


SOURCES = {"regression": regression, "binary": binary, "features": blobs, "survival": survival}


def _from_examples():
    """name -> (the model with a round budget r, its data, its fit's arguments, whether more
    rounds means more completed rounds): every registered model's first example that is
    federated and not online; a model declared to run long (``long``) gets r rounds and never
    stops early, the others (one-shot fits, IRLS) keep their example's budget."""
    from fedstats.registry import declarations

    out = {}
    for name, d in declarations().items():
        ex = next((e for e in d.examples if e.method == "fit" and e.data != "stream"), None)
        if ex is None:
            continue
        grows = "rounds" in ex.long
        fit = {k: v for k, v in ex.fit.items() if k not in ("seed", "progress")}

        def make(r, d=d, ex=ex, grows=grows):
            return d.estimator_class(**{**ex.params, **ex.long, **({"rounds": r} if grows else {})})

        out[name] = (make, lambda ex=ex: ex.data_for(SOURCES, n_clients=6), fit, grows)
    return out


#: every model whose fit is the one skeleton (fedstats.fitting): the registry's examples, and
#: the federated chains of fidelities, which have no example of their own (their data are
#: fidelities); each a model with a round budget r, its data, its fit's arguments, and whether more
#: rounds means more completed rounds of its main run
MODELS = {
    **_from_examples(),
    "federated-ar1": (lambda r: FederatedAR1(restarts=1), chain, {"order": FIDELITIES}, False),
    "federated-nargp": (lambda r: FederatedNARGP(restarts=1, samples=10), chain, {"order": FIDELITIES}, False),
}


def test_every_federated_model_of_the_registry_is_here():
    """Every model of the registry whose fit is the one skeleton (a fit that takes
    ``checkpoint``) is tested here; the others are FEM-OMD (online: one step per call), your own
    NumPyro model's federated_ep and federated_moments (functions, not estimators) and the
    centralised multi-fidelity models."""
    import inspect

    from fedstats.registry import declarations

    def skeleton(d):
        fit = getattr(d.estimator_class, "fit", None)
        return (
            isinstance(d.estimator_class, type)
            and fit is not None
            and "checkpoint" in inspect.signature(fit).parameters
        )

    assert set(MODELS) == {name for name, d in declarations().items() if skeleton(d)}
    assert {"fem-omd", "custom-ep", "moments", "ar1", "nargp"}.isdisjoint(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_federated_model_checkpoints_to_a_safe_file_and_resumes(name, tmp_path):
    make, data, extra, grows = MODELS[name]
    path = tmp_path / "run.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2 rounds do not converge
        first = make(2).fit(data(), seed=0, progress=False, checkpoint=path, **extra)
        assert zipfile.is_zipfile(path)
        with zipfile.ZipFile(path) as z:
            assert sorted(z.namelist()) == ["arrays.npz", "fedstats.json"]
        saved = read_checkpoint(str(path))
        assert saved["format"] == 2 and saved["completed"] >= 1
        # a budget that drives the main run: it ran the 2 rounds given (Separate's rounds are
        # local steps in one round)
        grows = grows and saved["completed"] == 2
        again = make(3).fit(data(), seed=0, progress=False, checkpoint=path, resume=True, **extra)
    done = read_checkpoint(str(path))["completed"]
    assert done > saved["completed"] if grows else done == saved["completed"]
    if not grows:  # a finished run resumed: nothing is run again, the same result
        pd.testing.assert_frame_equal(again.summary(), first.summary())


def test_a_pickled_checkpoint_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "old.ckpt"
    path.write_bytes(pickle.dumps({"format": 1, "completed": 1, "server_state": Payload()}))
    with pytest.raises(ValueError, match="could not read checkpoint .* not a fedstats result file"):
        FederatedGaussianMixture(2, rounds=3).fit(blobs(), seed=0, progress=False, checkpoint=path, resume=True)
    assert not marker.exists()
