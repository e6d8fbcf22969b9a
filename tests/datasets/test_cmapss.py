"""The C-MAPSS loader: the NASA text format, the per-engine polynomial design, the
chronological split and both scaling conventions (spec §5.2, §9 item 18)."""

import os
from pathlib import Path

import numpy as np
import pytest

from fedstats.datasets.cmapss import COLUMNS, load_cmapss, polynomial_design, read_cmapss

DATA = Path(os.environ.get("FEDSTATS_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
HAVE = (DATA / "cmapss" / "train_FD001.txt").is_file()
needs_data = pytest.mark.skipif(not HAVE, reason="C-MAPSS data absent (set FEDSTATS_DATA)")


def _write(tmp_path, units=(1, 2), n=10):
    rng = np.random.default_rng(0)
    lines = []
    for u in units:
        for c in range(1, n + 1):
            row = [u, c, 0.001, -0.0002, 100.0] + list(600 + c * 0.1 * np.arange(1, 22) + rng.normal(0, 0.01, 21))
            lines.append(" ".join(str(v) for v in row) + "  ")  # NASA rows end with spaces
    (tmp_path / "train_FD001.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_format_design_split_and_scaling(tmp_path):
    path = _write(tmp_path)
    df = read_cmapss(path)
    assert list(df.columns) == COLUMNS and len(df) == 20
    train, test = load_cmapss(path, sensor=3, order=2)
    assert train.clients == ["engine1", "engine2"] and train.feature_names == ["t^0", "t^1", "t^2"]
    assert train.n_obs == {"engine1": 6, "engine2": 6} and test.n_obs == {"engine1": 4, "engine2": 4}
    t = np.arange(10) / 299
    np.testing.assert_allclose(train["engine1"].X, polynomial_design(t[:6], 2))
    np.testing.assert_allclose(test["engine1"].X[:, 1], t[6:])
    y = df.loc[df.unit == 1, "sensor3"].to_numpy()
    lo, hi = y[:6].min(), y[:6].max()
    np.testing.assert_allclose(train["engine1"].y, (y[:6] - lo) / (hi - lo))
    np.testing.assert_allclose(test["engine1"].y, (y[6:] - lo) / (hi - lo))  # training statistics
    _, own = load_cmapss(path, sensor=3, order=2, scaling="own")
    np.testing.assert_allclose(own["engine1"].y.min(), 0) and np.testing.assert_allclose(own["engine1"].y.max(), 1)


def test_bad_arguments(tmp_path):
    path = _write(tmp_path)
    with pytest.raises(ValueError, match="sensor"):
        load_cmapss(path, sensor=22)
    with pytest.raises(ValueError, match="scaling"):
        load_cmapss(path, scaling="test")
    with pytest.raises(ValueError, match="unknown engine"):
        load_cmapss(path, engines=[7])
    with pytest.raises(FileNotFoundError, match="train_FD002"):
        load_cmapss(path, subset="FD002")
    (tmp_path / "train_FD001.txt").write_text("1 1 0 0 100 5\n")
    with pytest.raises(ValueError, match="26 columns"):
        read_cmapss(tmp_path)


@needs_data
def test_fd001():
    train, test = load_cmapss(DATA, sensor=2)
    assert train.n_clients == 100 and train.n_features == 7
    n = {c: train.n_obs[c] + test.n_obs[c] for c in train.clients}
    assert sum(n.values()) == 20631 and min(n.values()) == 128 and max(n.values()) == 362
    assert all(train.n_obs[c] == int(0.6 * n[c]) for c in train.clients)
    for c in train.clients:
        assert train[c].y.min() == 0 and train[c].y.max() == 1
    with pytest.raises(ValueError, match="constant"):
        load_cmapss(DATA, sensor=1)
