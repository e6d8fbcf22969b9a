"""``fedstats fit --model hm1`` on data in natural units (issue 40, item 4): the defaults
converge on Grunfeld's firms, ``--eig-floor`` and ``--learning-rate`` reach the model, bad
values give one-line errors, and ``--no-standardize`` gives the paper's algorithm in the
data's units."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedstats.cli import main
from fedstats.linear import StructuralCovarianceModel


@pytest.fixture()
def grunfeld(tmp_path):
    import statsmodels.api as sm
    from statsmodels.datasets import grunfeld

    df = grunfeld.load_pandas().data[["firm", "invest", "value", "capital"]]
    p = tmp_path / "grunfeld.csv"
    df.to_csv(p, index=False)
    ols = {}
    for firm, g in df.groupby("firm"):
        fit = sm.OLS(g["invest"], sm.add_constant(g[["value", "capital"]])).fit()
        ols[firm] = (fit.params.iloc[0], fit.bse.iloc[0])
    return p, df, ols


def fit(p, tmp_path, *extra):
    out = tmp_path / "o.json"
    rc = main(["fit", str(p), "--by", "firm", "--target", "invest", "--model", "hm1", "--output", str(out), *extra])
    return rc, (json.loads(out.read_text()) if rc == 0 else None)


def test_defaults_converge_on_grunfeld_and_keep_every_firms_intercept(grunfeld, tmp_path, capsys):
    # the issue: lr 1.25e-9, every intercept near 0 (interval +-0.35), "NOT converged"
    p, _, ols = grunfeld
    rc, j = fit(p, tmp_path)
    printed, err = capsys.readouterr()
    assert rc == 0 and j["converged"] and "did not converge" not in err and "NOT converged" not in printed
    assert "learning rate 0.00216 (standardised scale), eigenvalue floor 0.3" in printed
    assert j["learning_rate"] == pytest.approx(0.0021587, rel=1e-4)
    for firm, (b, se) in ols.items():
        rec = {r["name"]: r for r in j["client"][firm]}["intercept"]
        assert abs(rec["mean"] - b) <= 2 * se and rec["lower"] <= b <= rec["upper"], firm


def test_eig_floor_and_learning_rate_reach_the_model(grunfeld, tmp_path, capsys):
    p, df, _ = grunfeld
    rc, j = fit(p, tmp_path, "--eig-floor", "0.05", "--learning-rate", "0.001", "--rounds", "7")
    printed = capsys.readouterr().out
    assert rc == 0 and j["learning_rate"] == 0.001 and j["rounds"] == 7
    assert "learning rate 0.001 (standardised scale), eigenvalue floor 0.05" in printed
    # the same fit from Python
    from fedstats import FederatedData

    data = FederatedData.from_dataframe(df, by="firm", target="invest")
    with pytest.warns(RuntimeWarning, match="did not converge in 7 rounds"):
        res = StructuralCovarianceModel(eig_floor=0.05, lr=0.001, rounds=7).fit(data, seed=0)
    for firm in ("General Motors", "IBM"):
        got = [r["estimate"] for r in j["client"][firm]]
        np.testing.assert_allclose(got, res.coef(firm), rtol=1e-10)


def test_no_standardize_is_the_papers_algorithm_in_the_datas_units(grunfeld, tmp_path, capsys):
    p, _, ols = grunfeld
    rc, j = fit(p, tmp_path, "--no-standardize", "--eig-floor", "0", "--rounds", "30")
    printed, err = capsys.readouterr()
    assert rc == 0 and not j["converged"] and "did not converge in 30 rounds" in err
    assert j["learning_rate"] < 1e-8 and "(the data's units)" in printed
    atlantic = {r["name"]: r for r in j["client"]["Atlantic Refining"]}["intercept"]
    assert not atlantic["lower"] <= ols["Atlantic Refining"][0] <= atlantic["upper"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "hm1", "--eig-floor", "-0.1"], "--eig-floor must be a number >= 0, got -0.1"),
        (["--model", "hm1", "--learning-rate", "0"], "--learning-rate must be a positive number, got 0.0"),
        (["--model", "hm1", "--learning-rate", "inf"], "--learning-rate must be a positive number, got inf"),
        (["--model", "hm2", "--eig-floor", "0.1"], "--eig-floor: for --model hm1 only"),
        (["--model", "fgpr", "--learning-rate", "0.1"], "--learning-rate: for --model hm1 only"),
        (["--model", "fgpr", "--no-standardize"], "--no-standardize: for --model hm2, lasso, ridge, hm1 and hcox only"),
    ],
)
def test_bad_hm1_options_give_one_line_errors(grunfeld, capsys, extra, message):
    p, _, _ = grunfeld
    assert main(["fit", str(p), "--by", "firm", "--target", "invest", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
