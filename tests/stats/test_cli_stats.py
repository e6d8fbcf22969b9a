"""``fedstats describe`` and ``fedstats test`` print and write what the Python functions return."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from fedstats.cli import main

from .test_tests import frame


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "sites.csv"
    frame(0, sizes=(40, 260, 700)).to_csv(path, index=False)
    return path


def test_describe_prints_a_table_1_and_writes_json_csv_and_html(csv, tmp_path, capsys):
    df = pd.read_csv(csv)
    assert main(["describe", str(csv), "--by", "site", "--group", "arm", "--columns", "y", "grp"]) == 0
    out = capsys.readouterr().out
    assert "y, mean (sd)" in out and "arm = t" in out and "grp, n (%)" in out
    for kind in ("json", "csv", "html"):
        target = tmp_path / f"t.{kind}"
        assert main(["describe", str(csv), "--by", "site", "--group", "arm", "--output", str(target)]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["variables"]["y"]["statistics"]["median"]["arm = t"] == np.quantile(df.y[df.arm == "t"].dropna(), 0.5)
    long = pd.read_csv(tmp_path / "t.csv", index_col=[0, 1])
    assert long.loc[("grp", "n: a"), "overall"] == (df.grp == "a").sum()
    assert "<table" in (tmp_path / "t.html").read_text()


def test_test_prints_each_columns_test_and_adjusts_the_family(csv, tmp_path, capsys):
    df = pd.read_csv(csv)
    out = tmp_path / "w.json"
    argv = ["test", str(csv), "--by", "site", "--test", "welch", "--column", "y", "y2", "--group", "arm"]
    assert main([*argv, "--adjust", "holm", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Welch's two-sample t-test" in printed and "p_adjusted" in printed
    recs = json.loads(out.read_text())
    for rec, column in zip(recs, ("y", "y2"), strict=True):
        ref = stats.ttest_ind(df[column][df.arm == "c"].dropna(), df[column][df.arm == "t"].dropna(), equal_var=False)
        np.testing.assert_allclose([rec["statistic"], rec["p_value"]], [ref.statistic, ref.pvalue], rtol=1e-10)
    holm = multipletests([r["p_value"] for r in recs], method="holm")[1]
    np.testing.assert_allclose([r["p_adjusted"] for r in recs], holm, rtol=1e-12)


def test_mantel_haenszel_and_the_glm_tests_from_the_command_line(csv, tmp_path, capsys):
    assert main(["test", str(csv), "--by", "site", "--test", "mh", "--columns", "arm", "event"]) == 0
    printed = capsys.readouterr().out
    assert "Mantel-Haenszel test" in printed and "Breslow-Day" in printed
    complete = tmp_path / "complete.csv"
    pd.read_csv(csv).dropna().to_csv(complete, index=False)
    out = tmp_path / "wald.json"
    argv = [
        "test",
        str(complete),
        "--by",
        "site",
        "--test",
        "wald",
        "--target",
        "y",
        "--columns",
        "grp",
        "--column",
        "y2",
    ]
    assert main([*argv, "--output", str(out)]) == 0
    rec = json.loads(out.read_text())[0]
    assert rec["test"] == "wald" and rec["coefficients"] == ["grp[b]", "grp[c]"] and rec["df"] == 2.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--test", "welch", "--column", "y"], "needs --group"),
        (["--test", "paired", "--columns", "y"], "two --columns"),
        (["--test", "mh"], "needs two --columns"),
        (["--test", "welch", "--column", "nope", "--group", "arm"], "column(s) not found: nope"),
        (["--test", "wald", "--columns", "y2"], "needs --target"),
    ],
)
def test_bad_usage_is_one_line_naming_the_problem(csv, capsys, argv, message):
    assert main(["test", str(csv), "--by", "site", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
