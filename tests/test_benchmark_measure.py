"""benchmarks/_measure.py: wall time and peak resident memory of a block, and the machine."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "_measure.py"


@pytest.fixture()
def measure_mod():
    """A fresh copy of the module (its state: the open blocks, the scope found)."""
    spec = importlib.util.spec_from_file_location("_measure_under_test", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def _allocate(mib: int) -> float:
    a = np.ones(mib * 2**20 // 8)  # written, so resident
    s = float(a.sum())
    del a
    return s


def test_peak_of_a_block_allocating_200_mib(measure_mod):
    with measure_mod.measure() as idle:
        pass
    with measure_mod.measure() as big:
        _allocate(200)
    with measure_mod.measure() as idle_after:  # the peak is reset: the freed array is not in it
        pass
    assert big.seconds > 0 and idle.seconds >= 0
    if big.scope != "block":
        pytest.skip("no per-block peak on this system (peak since the process started)")
    assert big.peak_rss_mib - idle.peak_rss_mib >= 150
    assert big.peak_rss_mib - idle_after.peak_rss_mib >= 150


def test_nested_blocks_keep_the_outer_peak(measure_mod):
    with measure_mod.measure() as outer:
        _allocate(200)
        with measure_mod.measure() as inner:  # resets the process's peak
            pass
    if outer.scope != "block":
        pytest.skip("no per-block peak on this system")
    assert outer.peak_rss_mib - inner.peak_rss_mib >= 150
    with measure_mod.measure() as outer:
        with measure_mod.measure() as inner:
            _allocate(200)
    assert outer.peak_rss_mib >= inner.peak_rss_mib


def test_measured_keeps_the_best_time_and_the_largest_peak(measure_mod):
    calls = iter([0, 200, 0])
    out, m = measure_mod.measured(lambda: _allocate(next(calls)), repeats=3)
    assert out == 0.0 and m.seconds > 0
    if m.scope == "block":
        with measure_mod.measure() as idle:
            pass
        assert m.peak_rss_mib - idle.peak_rss_mib >= 150
    assert measure_mod.mib(m) == round(m.peak_rss_mib, 1)
    assert measure_mod.mib(float("nan")) is None and measure_mod.fmt_mib(None) == "not recorded"


def test_falls_back_to_the_process_peak(measure_mod, monkeypatch):
    """Where the peak cannot be reset, the peak since the process started, and it says so."""

    def refuse(*args, **kwargs):
        raise PermissionError("clear_refs")

    monkeypatch.setattr(measure_mod, "open", refuse, raising=False)  # the module's own open()
    with measure_mod.measure() as m:
        pass
    assert m.scope == "process" and measure_mod.peak_scope() == "process"
    if sys.platform != "win32":
        assert m.peak_rss_mib > 0
    assert "since the process started" in measure_mod.rss_note()


def test_machine_names_no_path_or_host(measure_mod):
    text = measure_mod.machine()
    assert os.sep not in text and (os.altsep is None or os.altsep not in text)
    assert f"{os.cpu_count()} cores" in text and np.__version__ in text and platform.python_version() in text
    host = platform.node()
    if len(host) > 3 and host not in ("localhost", platform.machine()):
        assert host not in text
    rec = measure_mod.record()
    json.dumps(rec)
    assert set(rec) == {"written", "machine_details", "peak_rss_scope"}
    when = datetime.fromisoformat(rec["written"])
    assert when.utcoffset() == timezone.utc.utcoffset(None)
    assert abs((datetime.now(timezone.utc) - when).total_seconds()) < 60


def _load(name):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_{name}_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_never_makes_up_memory_or_dates(tmp_path):
    """benchmarks/summary.py: results from before memory was measured say "not recorded"."""
    summary = _load("summary")
    old = {"meta": {"machine": "x86_64, 2 cores"}, "rows": [_glm_row()]}
    new = {
        "meta": {"machine": "x86_64, 2 cores", "written": "2026-01-02T03:04:05+00:00", "peak_rss_scope": "block"},
        "rows": [dict(_glm_row(), peak_rss_mib_pooled=812.4, peak_rss_mib_federated=640.0)],
    }
    (tmp_path / "glm.json").write_text(json.dumps(old))
    (tmp_path / "glm_quick.json").write_text(json.dumps(new))
    hm1 = [{"K": 4, "rho": 0.0, "sigma": 0.5, "mean": 0.0, "default": 1.03, "algorithm1": 1.1, "oracle": 0.99}]
    (tmp_path / "hm1_defaults.json").write_text(json.dumps(hm1))  # the old format: a list of rows
    summary.main(["--results", str(tmp_path)])
    text = (tmp_path / "summary.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 and "glm_quick" not in text  # quick results only when asked
    glm, hm1_row = rows[1], rows[0]  # in the order of the documentation's pages
    assert "| 0.5 | not recorded | not recorded | x86_64, 2 cores | unknown |" in glm
    assert "not recorded | not recorded" in hm1_row and "1.03, 1.1, 0.99" in hm1_row
    summary.main(["--results", str(tmp_path), "--quick"])
    quick = [line for line in (tmp_path / "summary.md").read_text().splitlines() if "glm_quick" in line]
    assert quick == [
        "| `glm_quick` | binomial, 10 x 2000 x 20 | federated / pooled statsmodels time | 0.5 | 640 | 812 "
        "| x86_64, 2 cores | 2026-01-02 03:04 UTC |"
    ]


def _glm_row():
    return {"family": "binomial", "clients": 10, "rows_per_client": 2000, "predictors": 20, "ratio": 0.5}
