"""``fedstats fit --model cox`` and ``fedstats test --test logrank`` print and write what the Python functions return."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedstats.cli import main
from fedstats.data import FederatedData
from fedstats.survival import CoxPH, logrank_test

lifelines = pytest.importorskip("lifelines")


@pytest.fixture(scope="module")
def rossi_csv(tmp_path_factory):
    from lifelines.datasets import load_rossi

    r = load_rossi()
    r["site"] = np.where(np.arange(len(r)) % 3 == 0, "a", "b")
    path = tmp_path_factory.mktemp("cox") / "rossi.csv"
    r.to_csv(path, index=False)
    return r, path


def test_fit_cox_writes_the_python_fit(rossi_csv, tmp_path, capsys):
    r, path = rossi_csv
    out = tmp_path / "cox.json"
    argv = ["fit", str(path), "--by", "site", "--target", "week", "--model", "cox", "--event", "arrest"]
    assert main([*argv, "--stratify", "--robust", "--output", str(out)]) == 0
    assert "Cox proportional hazards, efron ties, stratified by client" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    fd = FederatedData.from_dataframe(r, by="site", target="week")
    res = CoxPH(event="arrest", stratify=True, robust=True).fit(fd)
    got = {row["name"]: row for row in doc["hazard_ratios"]}
    for name, ratio in res.hazard_ratios()["ratio"].items():
        assert got[name]["ratio"] == pytest.approx(ratio, rel=1e-12)
    assert doc["cov_type"] == "robust" and doc["stratified"] is True
    assert doc["lr_test"]["statistic"] == pytest.approx(res.lr_test()["statistic"])


def test_fit_cox_refusal_names_the_command_line_remedies(rossi_csv, capsys):
    _, path = rossi_csv
    argv = ["fit", str(path), "--by", "site", "--target", "week", "--model", "cox", "--event", "arrest"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--bins" in err and "--stratify" in err and "--min-cell-count 1" in err
    assert main([*argv, "--bins", "13", "26", "39", "52"]) == 0
    assert main(["fit", str(path), "--by", "site", "--target", "week", "--model", "cox"]) == 2
    assert "needs --event" in capsys.readouterr().err


def test_logrank_from_the_command_line(rossi_csv, tmp_path, capsys):
    r, path = rossi_csv
    out = tmp_path / "lr.json"
    argv = ["test", str(path), "--by", "site", "--test", "logrank", "--column", "week", "--event", "arrest"]
    assert main([*argv, "--group", "fin", "--stratify", "--output", str(out)]) == 0
    assert "log-rank test, stratified by client" in capsys.readouterr().out
    fd = FederatedData.from_dataframe(r[["site", "week", "arrest", "fin"]], by="site", target="week")
    res = logrank_test(fd, "arrest", "fin", stratify=True)
    doc = json.loads(out.read_text())[0]
    assert doc["statistic"] == pytest.approx(res.statistic, rel=1e-12) and doc["n"] == len(r)
    # exact times: the default rules refuse, naming the command line's remedy
    assert main([*argv, "--group", "fin"]) == 2
    assert "--bins" in capsys.readouterr().err
    assert main([*argv, "--group", "fin", "--bins", "13", "26", "39", "52"]) == 0
    assert main([*argv]) == 2
    assert "needs one --column (the time), --event and --group" in capsys.readouterr().err


def test_fit_hcox_writes_the_python_fit(rossi_csv, tmp_path, capsys):
    """The hierarchical Cox model from the command line (public cuts, three predictors): the JSON's
    hazard ratios are the Python fit's."""
    from fedstats.survival import HierarchicalCox

    r, path = rossi_csv
    out = tmp_path / "hcox.json"
    argv = ["fit", str(path), "--by", "site", "--target", "week", "--model", "hcox", "--event", "arrest"]
    argv += ["--features", "fin", "age", "prio", "--cuts", "13", "26", "39", "--rounds", "6"]
    assert main([*argv, "--output", str(out)]) == 0
    assert "hierarchical Cox model, 4 intervals" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    fd = FederatedData.from_dataframe(r[["site", "week", "fin", "age", "prio", "arrest"]], by="site", target="week")
    res = HierarchicalCox(event="arrest", cuts=[13, 26, 39], rounds=6).fit(fd, seed=0, progress=False)
    got = {row["name"]: row["ratio"] for row in doc["hazard_ratios"]}
    for name, ratio in res.hazard_ratios()["ratio"].items():
        assert got[name] == pytest.approx(ratio, rel=1e-9)
    assert doc["edges"] == [0.0, 13.0, 26.0, 39.0] and doc["events"] == int(r["arrest"].sum())
    assert main(["fit", str(path), "--by", "site", "--target", "week", "--model", "hcox"]) == 2
    assert "needs --event" in capsys.readouterr().err


def test_kaplan_meier_from_describe(rossi_csv, tmp_path, capsys):
    """``describe --survival TIME --event E --group G --bins ...``: each group's curve and median
    as KaplanMeier gives them, lifelines' on the coarsened times; refusals name the options."""
    r, path = rossi_csv
    out = tmp_path / "km.json"
    bins = ["13", "26", "39", "52"]
    argv = ["describe", str(path), "--by", "site", "--survival", "week", "--event", "arrest"]
    assert main([*argv, "--group", "fin", "--bins", *bins, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fin = 0: median week not reached" in printed and "at_risk" in printed
    doc = json.loads(out.read_text())
    coarse = np.asarray(bins, dtype=float)[np.searchsorted(np.asarray(bins, dtype=float), r.week)]
    for curve in doc["curves"]:
        m = r.fin == float(curve["group"])
        ref = lifelines.KaplanMeierFitter().fit(coarse[m], r.arrest[m])
        got = {row["week"]: row["survival"] for row in curve["table"]}
        for t, s in ref.survival_function_.iloc[:, 0].items():
            assert got[t] == pytest.approx(s, abs=1e-12)
        assert curve["median"] is None  # the curve stays above 0.5
    assert main(argv) == 2
    assert "--bins" in capsys.readouterr().err
    assert main([*argv[:-2]]) == 2
    assert "--survival needs --event" in capsys.readouterr().err
    assert main(["describe", str(path), "--by", "site", "--event", "arrest"]) == 2
    assert "go with --survival" in capsys.readouterr().err
