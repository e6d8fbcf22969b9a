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
from fedstats.gp import FGPR
from fedstats.linear import BayesianLasso, HierarchicalLinearModel, StructuralCovarianceModel
from fedstats.mixture import DecentralizedGaussianMixture, FederatedGaussianMixture, VariationalGaussianMixture


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


MODELS = {
    "hm2": (lambda r: HierarchicalLinearModel(rounds=r), regression),
    "hm1": (lambda r: StructuralCovarianceModel(rounds=r), regression),
    "lasso": (lambda r: BayesianLasso(rounds=r), regression),
    "fgpr": (lambda r: FGPR(rounds=r), regression),
    "fedem": (lambda r: FederatedGaussianMixture(2, rounds=r), blobs),
    "fedem-vb": (lambda r: VariationalGaussianMixture(2, rounds=r), blobs),
    "d-fedem": (lambda r: DecentralizedGaussianMixture(2, rounds=r), blobs),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_checkpointing_model_writes_a_safe_file_and_resumes(name, tmp_path):
    make, data = MODELS[name]
    path = tmp_path / "run.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2 rounds do not converge
        make(2).fit(data(), seed=0, progress=False, checkpoint=path)
        assert zipfile.is_zipfile(path)
        with zipfile.ZipFile(path) as z:
            assert sorted(z.namelist()) == ["arrays.npz", "fedstats.json"]
        saved = read_checkpoint(str(path))
        assert saved["format"] == 2 and saved["completed"] >= 1
        make(3).fit(data(), seed=0, progress=False, checkpoint=path, resume=True)
    assert read_checkpoint(str(path))["completed"] > saved["completed"]


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
