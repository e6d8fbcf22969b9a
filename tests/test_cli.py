"""The fedstats command: fit, JSON shape, predictions, one-line errors."""

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from fedstats.cli import main


@pytest.fixture()
def csv(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for site, shift in [("A", 0.0), ("B", 0.5), ("C", -0.5)]:
        for _ in range(30):
            x1, x2 = rng.normal(size=2)
            grp = rng.choice(["u", "v"])
            rows.append(
                {
                    "site": site,
                    "x1": x1,
                    "x2": x2,
                    "grp": grp,
                    "y": 1 + shift + 2 * x1 - x2 + 0.3 * (grp == "v") + 0.2 * rng.normal(),
                }
            )
    df = pd.DataFrame(rows)
    p = tmp_path / "d.csv"
    df.to_csv(p, index=False)
    t = tmp_path / "t.csv"
    df.drop(columns="y").iloc[[0, 40, 80, 1]].to_csv(t, index=False)
    return p, t, df


def test_fit_writes_json_with_documented_shape(csv, tmp_path, capsys):
    p, t, df = csv
    out = tmp_path / "o.json"
    rc = main(
        [
            "fit",
            str(p),
            "--by",
            "site",
            "--target",
            "y",
            "--model",
            "hm2",
            "--level",
            "0.9",
            "--rounds",
            "4",
            "--seed",
            "1",
            "--output",
            str(out),
            "--predict",
            str(t),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Global posterior" in printed and "Client B" in printed
    j = json.loads(out.read_text())
    assert set(j) == {
        "model",
        "level",
        "clients",
        "n_obs",
        "global",
        "client",
        "rounds",
        "converged",
        "communication",
        "runtime_s",
        "predictions",
    }
    assert j["n_obs"] == {"A": 30, "B": 30, "C": 30}
    assert j["converged"] is False and "4 EP rounds (NOT converged" in printed  # 4 rounds are too few
    assert j["model"] == "hm2" and j["level"] == 0.9 and j["clients"] == ["A", "B", "C"]
    assert {"name", "mean", "sd", "lower", "upper"} <= set(j["global"][0])
    names = [r["name"] for r in j["client"]["A"]]
    assert names == ["intercept", "x1", "x2", "grp[v]"]  # default features: all but --by/--target
    x1 = j["client"]["A"][1]
    assert x1["lower"] < 2 < x1["upper"] and x1["p_value"] < 0.01
    assert j["communication"]["bytes_up"] > 0 and j["rounds"] >= 2
    preds = j["predictions"]
    assert [r["client"] for r in preds] == ["A", "B", "C", "A"]  # the rows' order
    for r, truth in zip(preds, df["y"].iloc[[0, 40, 80, 1]]):
        # the predictive band of a new observation holds the credible band of the mean
        assert r["pred_lower"] < r["lower"] < r["mean"] < r["upper"] < r["pred_upper"] and not r["new_client"]
        assert r["pred_lower"] - 0.5 < truth < r["pred_upper"] + 0.5


@pytest.mark.parametrize("model", ["lasso", "ridge"])
def test_shrinkage_models_report_selection(csv, tmp_path, capsys, model):
    p, t, df = csv
    out = tmp_path / "o.json"
    rc = main(
        [
            "fit",
            str(p),
            "--by",
            "site",
            "--target",
            "y",
            "--model",
            model,
            "--level",
            "0.9",
            "--rounds",
            "3",
            "--output",
            str(out),
            "--predict",
            str(t),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "selected" in printed and "interval excludes 0" in printed
    j = json.loads(out.read_text())
    assert j["model"] == model
    assert [r["name"] for r in j["global"]] == ["log_lambda", "log_sigma2", "lambda", "sigma2"]
    for c in ["A", "B", "C"]:
        recs = {r["name"]: r for r in j["client"][c]}
        assert recs["intercept"]["selected"] is None
        assert recs["x1"]["selected"] is True and recs["x2"]["selected"] is True  # effects 2 and -1, n = 30
        for r in j["client"][c][1:]:  # the field is exactly "interval excludes 0"
            assert r["selected"] == (r["lower"] > 0 or r["upper"] < 0)
    assert len(j["predictions"]) == 4


@pytest.mark.parametrize(
    "args, msg",
    [
        (["fit", "missing.csv", "--by", "site", "--target", "y"], "file not found"),
        (["fit", "{p}", "--by", "nope", "--target", "y"], "column(s) not found: nope"),
        (["fit", "{p}", "--by", "site", "--target", "y", "--model", "gp"], "unknown model"),
        (["fit", "{nan}", "--by", "site", "--target", "y"], "NaN"),
        (["fit", "{few}", "--by", "site", "--target", "y"], "'C'"),
        (["fit", "{p}", "--by", "site", "--target", "y", "--level", "2"], "--level"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(csv, tmp_path, capsys, args, msg):
    p, _, df = csv
    bad = df.copy()
    bad.loc[5, "x1"] = np.nan
    bad.to_csv(tmp_path / "nan.csv", index=False)
    df[(df.site != "C") | (df.index < 62)].to_csv(tmp_path / "few.csv", index=False)
    args = [a.format(p=p, nan=tmp_path / "nan.csv", few=tmp_path / "few.csv") for a in args]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc != 0
    assert err.count("\n") == 1 and err.startswith("fedstats: error:") and "Traceback" not in err
    assert msg in err


def test_predict_matches_numeric_ids_as_text_and_rejects_missing_ids(csv, tmp_path, capsys):
    p, _, df = csv
    df = df.assign(site=df.site.map({"A": 1, "B": 2, "C": 3}))
    df.to_csv(p, index=False)
    test = df.drop(columns="y").iloc[[0, 40, 80]].assign(site=[1.0, 2.0, 9.0])  # 9: a new client
    t = tmp_path / "t.csv"
    test.to_csv(t, index=False)
    out = tmp_path / "o.json"
    base = ["fit", str(p), "--by", "site", "--target", "y", "--rounds", "3", "--level", "0.9"]
    assert main([*base, "--output", str(out), "--predict", str(t)]) == 0
    j = json.loads(out.read_text())
    assert j["clients"] == ["1", "2", "3"]
    preds = j["predictions"]
    assert [r["client"] for r in preds] == ["1", "2", "9"]
    width = [r["pred_upper"] - r["pred_lower"] for r in preds]
    assert width[2] > 1.5 * max(width[:2])  # known clients use their own posterior, 9 the population
    test.iloc[[0, 2]].assign(site=[1.0, np.nan]).to_csv(t, index=False)
    capsys.readouterr()
    assert main([*base, "--predict", str(t)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing client ids (line(s) 3)" in err


def test_hm1_writes_client_estimates_and_omega(csv, tmp_path, capsys):
    p, t, df = csv
    out = tmp_path / "o.json"
    rc = main(
        [
            "fit",
            str(p),
            "--by",
            "site",
            "--target",
            "y",
            "--model",
            "hm1",
            "--level",
            "0.9",
            "--output",
            str(out),
            "--predict",
            str(t),
        ]
    )
    assert rc == 0
    printed, err = capsys.readouterr()
    # the model's default rounds: until converged (at most 1000), not a fixed 30
    assert "HM1 (Algorithm 1): 13 rounds (converged)" in printed and "omega[A, B]" in printed
    j = json.loads(out.read_text())
    assert j["model"] == "hm1" and j["rounds"] == 13 and j["converged"] is True
    # the global parameters are Omega's distinct entries (estimates, no distribution)
    assert [g["name"] for g in j["global"]] == [
        "omega[A, A]",
        "omega[A, B]",
        "omega[A, C]",
        "omega[B, B]",
        "omega[B, C]",
        "omega[C, C]",
    ]
    assert all(g["sd"] is None and g["mean"] is not None for g in j["global"])
    recs = {r["name"]: r for r in j["client"]["B"]}
    assert list(recs) == ["intercept", "x1", "x2", "grp[v]"]
    om = pd.read_csv(tmp_path / j["omega_file"], index_col=0)
    assert om.shape == (3, 3) and list(om.columns) == ["A", "B", "C"]
    np.testing.assert_allclose(om.to_numpy(), om.to_numpy().T)
    # by default every client can share its information (30 rows for 4 coefficients): the
    # estimate is the posterior mean, the centre of its interval; Algorithm 1's is beside it
    x1 = {r["name"]: r for r in j["client"]["A"]}["x1"]
    assert x1["lower"] < x1["mean"] < x1["upper"] and x1["lower"] < 2 < x1["upper"]
    assert abs(x1["mean"] - (x1["lower"] + x1["upper"]) / 2) < 1e-9  # the point is its interval's centre
    assert abs(x1["estimate"] - 2) < 0.2
    for r, truth in zip(j["predictions"], df["y"].iloc[[0, 40, 80, 1]]):
        assert r["pred_lower"] < r["mean"] < r["pred_upper"] and r["pred_lower"] - 0.5 < truth < r["pred_upper"] + 0.5
        assert r["pred_lower"] < r["lower"] < r["upper"] < r["pred_upper"]
    # convergence is reported in the JSON, the header line, and (if not) a warning on stderr
    assert ("NOT converged" in printed) == (not j["converged"]) == ("did not converge" in err)
    # a client with 4 rows for 4 coefficients cannot estimate its noise variance: by default
    # Algorithm 1's point only, with a warning; --uncertainty makes that an error
    small = pd.concat([df, df[df.site == "A"].iloc[:4].assign(site="D")])
    small.to_csv(tmp_path / "small.csv", index=False)
    rc = main(
        [
            "fit",
            str(tmp_path / "small.csv"),
            "--by",
            "site",
            "--target",
            "y",
            "--model",
            "hm1",
            "--min-rows",
            "1",  # the disclosure rules would refuse the 4-row client (and its small cells) first
            "--min-cell-count",
            "1",
            "--output",
            str(out),
            "--predict",
            str(t),
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "Algorithm 1's point estimates only" in err and "client 'D' has 4 rows" in err
    j = json.loads(out.read_text())
    assert all(r["sd"] is None and r["mean"] == r["estimate"] for r in j["client"]["A"])
    assert all(r["pred_lower"] is None for r in j["predictions"])
    assert (
        main(
            ["fit", str(tmp_path / "small.csv"), "--by", "site", "--target", "y", "--model", "hm1", "--uncertainty"]
            + ["--min-rows", "1", "--min-cell-count", "1"]
        )
        == 1
    )
    assert "client 'D' has 4 rows for 4 independent coefficients" in capsys.readouterr().err
    # a client not in the fit, --uncertainty with another model: one-line errors
    other = df.drop(columns="y").iloc[[0]].assign(site="Z")
    other.to_csv(tmp_path / "z.csv", index=False)
    capsys.readouterr()
    assert (
        main(["fit", str(p), "--by", "site", "--target", "y", "--model", "hm1", "--predict", str(tmp_path / "z.csv")])
        == 2
    )
    assert "not in the fit: Z" in capsys.readouterr().err
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--uncertainty"]) == 2
    assert "--uncertainty: for --model hm1 and gmm only" in capsys.readouterr().err


def test_fgpr_writes_hyperparameters_and_personal_predictions(tmp_path, capsys):
    rng = np.random.default_rng(2)
    rows = []
    for site, sign in (("A", 1.0), ("B", -1.0)):
        for x in rng.uniform(0, 6, 40):
            rows.append({"site": site, "x": x, "y": 3 + sign * np.sin(x) + 0.05 * rng.normal()})
    df = pd.DataFrame(rows)
    p, t, out = tmp_path / "gp.csv", tmp_path / "gpt.csv", tmp_path / "gp.json"
    df.to_csv(p, index=False)
    test = pd.DataFrame({"site": ["A", "B", "A"], "x": [1.0, 1.0, 4.0]})
    test.to_csv(t, index=False)
    rc = main(
        [
            "fit",
            str(p),
            "--by",
            "site",
            "--target",
            "y",
            "--model",
            "fgpr",
            "--rounds",
            "40",
            "--level",
            "0.9",
            "--output",
            str(out),
            "--predict",
            str(t),
        ]
    )
    assert rc == 0
    assert "FGPR (rbf): 40 rounds, 2 clients" in capsys.readouterr().out
    j = json.loads(out.read_text())
    assert j["model"] == "fgpr" and [g["name"] for g in j["global"]] == ["lengthscale", "outputscale", "noise"]
    # the estimate with its Laplace sd and interval (the CLI takes Newton steps to the maximum)
    assert all(g["sd"] > 0 and g["lower"] < g["estimate"] < g["upper"] for g in j["global"])
    assert j["client"] == {"A": [], "B": []} and j["n_obs"] == {"A": 40, "B": 40} and j["rounds"] == 40
    curvature = j["communication"]["by_kind"]["hyperparameter curvature"]
    assert curvature["bytes_up"] == curvature["rounds"] * 2 * (1 + 3 + 9) * 8  # value, gradient, Hessian
    assert j["communication"]["bytes_up"] == 40 * 2 * 3 * 8 + 2 * 8 + curvature["bytes_up"]
    truth = 3 + np.array([1, -1, 1]) * np.sin(test["x"].to_numpy())
    for r, y in zip(j["predictions"], truth):
        assert r["pred_lower"] < y < r["pred_upper"] and abs(r["mean"] - y) < 0.1
        assert r["pred_lower"] <= r["lower"] < r["upper"] <= r["pred_upper"]
    # no rows to condition on for a new client; options that belong to fgpr only
    pd.DataFrame({"site": ["Z"], "x": [1.0]}).to_csv(tmp_path / "z.csv", index=False)
    capsys.readouterr()
    assert (
        main(["fit", str(p), "--by", "site", "--target", "y", "--model", "fgpr", "--predict", str(tmp_path / "z.csv")])
        == 2
    )
    err = capsys.readouterr().err
    assert "from its own training rows; client(s) not in the fit: Z" in err
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--ard"]) == 2
    assert "--ard: for --model fgpr only" in capsys.readouterr().err


def test_gmm_writes_components_client_weights_and_predictions(tmp_path, capsys):
    from fedstats.datasets.synthetic import gmm_federation

    data, truth = gmm_federation(n_clients=4, n_components=2, d=2, n_obs=60, min_separation=6.0, alpha=1.0, seed=3)
    df = data.to_dataframe(client_col="site")
    p, t, out = tmp_path / "g.csv", tmp_path / "gt.csv", tmp_path / "g.json"
    df.to_csv(p, index=False)
    new = pd.DataFrame({"site": "new", "x1": truth["means"][0, 0] + np.zeros(3), "x2": truth["means"][0, 1]})
    pd.concat([df.iloc[[0, 70]], new]).to_csv(t, index=False)
    rc = main(
        [
            "fit",
            str(p),
            "--by",
            "site",
            "--model",
            "gmm",
            "--components",
            "2",
            "--bayesian",
            "--level",
            "0.9",
            "--output",
            str(out),
            "--predict",
            str(t),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "variational FedEM" in printed and "credible intervals" in printed and "Client 3" in printed
    j = json.loads(out.read_text())
    assert j["model"] == "gmm" and j["bayesian"] and j["intervals"] == "credible" and j["components"] == 2
    names = [g["name"] for g in j["global"]]
    assert names[:4] == ["mean[0][x1]", "mean[0][x2]", "mean[1][x1]", "mean[1][x2]"] and names[4] == "var[0][x1]"
    assert set(j["client"]) == {"0", "1", "2", "3"}
    for recs in j["client"].values():
        assert [r["name"] for r in recs] == ["weight[0]", "weight[1]"]
        assert sum(r["mean"] for r in recs) == pytest.approx(1.0)
        assert all(0 <= r["lower"] < r["mean"] < r["upper"] <= 1 for r in recs)
    means = np.array([[g["mean"] for g in j["global"][2 * k : 2 * k + 2]] for k in range(2)])
    D = ((means[:, None] - truth["means"][None]) ** 2).sum(-1)
    assert np.sqrt(D.min(1)).max() < 0.5  # both centres recovered
    pred = j["predictions"]
    assert len(pred) == 5 and pred[0]["new_client"] is False and pred[-1]["new_client"] is True
    # the new client's rows all sit on the first true centre: one component, confidently
    comp = {r["component"] for r in pred[2:]}
    assert len(comp) == 1 and all(max(r["proba"]) > 0.99 for r in pred[2:])
    # point estimates without --bayesian: intervals are null
    assert (
        main(
            [
                "fit",
                str(p),
                "--by",
                "site",
                "--model",
                "gmm",
                "--components",
                "2",
                "--covariance-type",
                "diag",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    j = json.loads(out.read_text())
    assert j["intervals"] is None and j["global"][0]["lower"] is None and j["covariance_type"] == "diag"
    # Wald intervals with --uncertainty
    assert (
        main(
            [
                "fit",
                str(p),
                "--by",
                "site",
                "--model",
                "gmm",
                "--components",
                "2",
                "--uncertainty",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    j = json.loads(out.read_text())
    assert j["intervals"] == "wald" and j["global"][0]["lower"] < j["global"][0]["mean"] < j["global"][0]["upper"]
    capsys.readouterr()
    for args, msg in [
        (["--components", "2", "--target", "x1"], "takes no --target"),
        ([], "needs --components"),
        (["--components", "2", "--bayesian", "--uncertainty"], "exclude each other"),
    ]:
        assert main(["fit", str(p), "--by", "site", "--model", "gmm", *args]) == 2
        assert msg in capsys.readouterr().err
    assert main(["fit", str(p), "--by", "site", "--target", "x1", "--components", "2"]) == 2
    assert "--components: for --model gmm only" in capsys.readouterr().err
    assert main(["fit", str(p), "--by", "site"]) == 2
    assert "needs --target" in capsys.readouterr().err


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as strict parsers (and other languages) do."""

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_strict_json_refuses_non_finite_numbers():
    with pytest.raises(ValueError, match="Infinity"):
        strict_json('{"sd": Infinity}')
    assert strict_json('{"sd": null}') == {"sd": None}


@pytest.mark.parametrize(
    "model, extra",
    [
        ("hm2", ["--target", "y", "--rounds", "3"]),
        ("lasso", ["--target", "y", "--rounds", "2"]),
        ("ridge", ["--target", "y", "--rounds", "2"]),
        ("hm1", ["--target", "y", "--uncertainty"]),
        ("fgpr", ["--target", "y", "--rounds", "5"]),
        ("gmm", ["--components", "2", "--bayesian"]),
        ("gmm", ["--components", "2", "--uncertainty"]),
    ],
)
def test_every_models_json_is_strict(csv, tmp_path, capsys, model, extra):
    p, t, df = csv
    if model == "gmm":  # numeric columns only
        df[["site", "x1", "x2"]].to_csv(p, index=False)
    out = tmp_path / "o.json"
    assert main(["fit", str(p), "--by", "site", "--model", model, "--output", str(out), *extra]) == 0
    strict_json(out.read_text())


def test_empty_mixture_components_are_null_with_a_warning_naming_them(tmp_path, capsys):
    # two well-separated clusters, five components: variational FedEM leaves three empty,
    # whose posterior sds are infinite
    rng = np.random.default_rng(0)
    rows = []
    for k in range(4):
        z = rng.random(150) < 0.5
        X = np.where(z[:, None], rng.normal(size=(150, 2)) + 4, rng.normal(size=(150, 2)) - 4)
        rows.append(pd.DataFrame(X, columns=["x1", "x2"]).assign(site=f"s{k}"))
    p, out = tmp_path / "mix.csv", tmp_path / "o.json"
    pd.concat(rows).to_csv(p, index=False)
    assert (
        main(["fit", str(p), "--by", "site", "--model", "gmm", "--components", "5", "--bayesian", "--output", str(out)])
        == 0
    )
    err = capsys.readouterr().err
    j = strict_json(out.read_text())
    empty = sorted({int(r["name"][5]) for r in j["global"] if r["name"].startswith("mean[") and r["sd"] is None})
    assert len(empty) >= 2
    assert f"component(s) {', '.join(map(str, empty))} are (almost) empty" in err and "written as null" in err


def test_p_values_only_for_coefficients_and_never_printed_as_zero(csv, capsys):
    p, t, df = csv
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--model", "hm2", "--rounds", "3", "--quiet"]) == 0
    printed = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in printed.splitlines() if ln.startswith(("mu[", "log_tau[", "tau["))}
    x1 = [ln for ln in printed.splitlines() if ln.startswith("x1 ")]  # each client's slope: 2, sd ~0.05
    assert len(x1) == 3 and all(ln.rstrip().endswith("< 1e-4") for ln in x1)  # not "0.0000"
    assert rows["mu[x1]"].split()[-1].startswith("0.")  # a population mean: tested against 0
    for name in ("log_tau[x1]", "tau[x1]"):  # scale parameters: no null hypothesis, no p-value
        assert len(rows[name].split()) == 5, rows[name]
    assert "0.0000" not in "".join(ln[-8:] for ln in printed.splitlines())


def test_version_and_progress_lines(csv, capsys):
    from fedstats import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"fedstats {__version__}"
    p, t, df = csv
    # not a terminal (pytest captures stderr): quiet unless --progress
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--rounds", "3"]) == 0
    err = capsys.readouterr().err
    assert "round 1/3" not in err and "EP did not converge in 3 rounds" in err  # the warning, no round lines
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--rounds", "3", "--progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("fedstats hm2: reading")
    rounds = [ln.split(",")[0] for ln in err if ": round " in ln]
    assert rounds[0] == "fedstats hm2: round 1/3" and rounds[-1] == "fedstats hm2: round 3/3"
    assert "answered" in err[1] and "max_mean_change_sd" in err[1]
    assert [ln for ln in err if ln.startswith("fedstats hm2: stopped after 3 round(s)")]
    assert err[-1].startswith("warning: EP did not converge in 3 rounds")  # the warnings after the lines
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--quiet", "--progress"]) == 2


def test_terminal_gets_round_lines_and_quiet_silences_them(csv, monkeypatch, capsys):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    p, t, df = csv
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--rounds", "3"]) == 0
    assert "fedstats hm2: round 1/3" in term.getvalue()
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    # --quiet on a terminal: no lines and no tqdm bar (the runner shows one on a terminal by default)
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--rounds", "3", "--quiet"]) == 0
    assert "round 1/3" not in term.getvalue() and "\r" not in term.getvalue()  # warnings only
    capsys.readouterr()


def test_natural_units_standardise_by_default_and_the_options_opt_out(tmp_path, capsys):
    """Data in the units of an investment panel: the default fit reports intercepts near each
    client's own least squares; --no-standardize fits the data as given (the N(0, 1) prior then
    pins the intercepts near 0); --no-intercept drops the intercept."""
    rng = np.random.default_rng(2)
    rows = []
    for firm in range(6):
        b = -150 + 30 * rng.standard_normal()
        for _ in range(20):
            value = rng.uniform(500, 3000)
            rows.append({"firm": f"f{firm}", "value": value, "inv": b + 0.1 * value + 20 * rng.standard_normal()})
    p = tmp_path / "panel.csv"
    df = pd.DataFrame(rows)
    df.to_csv(p, index=False)
    intercepts = {}
    for extra in ([], ["--no-standardize"]):
        out = tmp_path / "o.json"
        assert main(["fit", str(p), "--by", "firm", "--target", "inv", "--quiet", "--output", str(out), *extra]) == 0
        j = json.loads(out.read_text())
        intercepts[bool(extra)] = [j["client"][f"f{k}"][0]["mean"] for k in range(6)]
    assert "standardised with federated moments" in capsys.readouterr().out
    for k in range(6):
        g = df[df.firm == f"f{k}"]
        own = np.polyfit(g.value, g.inv, 1)[1]
        assert abs(intercepts[False][k] - own) < 40, (k, intercepts[False][k], own)
    assert max(abs(v) for v in intercepts[True]) < 10
    out = tmp_path / "n.json"
    assert (
        main(["fit", str(p), "--by", "firm", "--target", "inv", "--quiet", "--no-intercept", "--output", str(out)]) == 0
    )
    assert [r["name"] for r in json.loads(out.read_text())["client"]["f0"]] == ["value"]
    capsys.readouterr()
    assert (
        main(
            [
                "fit",
                str(p),
                "--by",
                "firm",
                "--features",
                "value",
                "--model",
                "gmm",
                "--components",
                "2",
                "--no-standardize",
            ]
        )
        == 2
    )
    assert "--no-standardize: for --model hm2, lasso, ridge, hm1 and hcox only" in capsys.readouterr().err


def test_csv_defects_are_refused_or_read_correctly(tmp_path, capsys):
    """Semicolons with decimal commas, duplicated columns, many-level text and overflowing
    values: refused with a message naming the column, read correctly, or warned about;
    never one-hot encoded or fitted silently."""
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"site": np.repeat(["A", "B", "C"], 15), "x": rng.normal(size=45).round(3)})
    df["y"] = (1 + 2 * df["x"] + 0.1 * rng.normal(size=45)).round(3)
    p = tmp_path / "comma.csv"
    df.to_csv(p, sep=";", decimal=",", index=False)
    base = ["fit", str(p), "--by", "site", "--target", "y", "--quiet", "--rounds", "3"]
    assert main(base) == 2
    assert "column 'x' holds numbers written with a decimal comma (e.g. " in capsys.readouterr().err
    out = tmp_path / "o.json"
    assert main([*base, "--decimal", ",", "--output", str(out)]) == 0
    j = json.loads(out.read_text())
    assert [r["name"] for r in j["client"]["A"]] == ["intercept", "x"]  # numeric, not x[2,5] categories
    assert abs(j["client"]["A"][1]["mean"] - 2) < 0.3

    # a duplicated column is refused by name (the model's design check), never fitted
    dup = df.assign(x2=df["x"])
    dup.to_csv(p, index=False)
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--quiet", "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert "predictor 'x2' duplicates 'x' (up to a constant)" in err and "drop it" in err

    ids = df.assign(code=[f"id{i}" for i in range(45)])
    ids.to_csv(p, index=False)
    assert main(["fit", str(p), "--by", "site", "--target", "y", "--quiet"]) == 2
    assert "column 'code' is text with 45 distinct values in 45 rows" in capsys.readouterr().err

    big = df.copy()
    big.loc[7, "x"] = 1e308
    big.to_csv(p, index=False)
    for model in ("hm2", "hm1", "fgpr"):
        assert main(["fit", str(p), "--by", "site", "--target", "y", "--quiet", "--model", model]) == 2
        assert "column 'x' has a value (1e+308) too large" in capsys.readouterr().err


@pytest.fixture()
def counts(tmp_path):
    """Event counts over years of follow-up at three sites, and a 0/1 outcome."""
    rng = np.random.default_rng(5)
    rows = []
    for site in ("A", "B", "C"):
        for _ in range(80):
            age, years, smoker = rng.normal(50, 10), rng.uniform(0.5, 4), rng.choice(["no", "yes"])
            rows.append(
                {
                    "site": site,
                    "age": age,
                    "smoker": smoker,
                    "years": years,
                    "visits": rng.poisson(years * np.exp(-2 + 0.02 * age + 0.5 * (smoker == "yes"))),
                    "sick": int(rng.uniform() < 1 / (1 + np.exp(-(-5 + 0.1 * age)))),
                }
            )
    df = pd.DataFrame(rows)
    p = tmp_path / "c.csv"
    df.to_csv(p, index=False)
    return p, df


def test_glm_poisson_with_exposure_equals_statsmodels(counts, tmp_path, capsys):
    import statsmodels.api as sm

    p, df = counts
    out, t = tmp_path / "g.json", tmp_path / "t.csv"
    df.drop(columns=["visits", "sick"]).iloc[[0, 100]].to_csv(t, index=False)
    rc = main(
        [
            "fit",
            str(p),
            "--by",
            "site",
            "--target",
            "visits",
            "--features",
            "age",
            "smoker",
            "--model",
            "glm",
            "--family",
            "poisson",
            "--exposure",
            "years",
            "--robust",
            "--output",
            str(out),
            "--predict",
            str(t),
            "-q",
        ]
    )
    assert rc == 0
    assert "poisson family, log link" in capsys.readouterr().out
    j = json.loads(out.read_text())
    X = sm.add_constant(np.column_stack([df["age"], (df["smoker"] == "yes").astype(float)]))
    ref = sm.GLM(df["visits"], X, family=sm.families.Poisson(), exposure=df["years"]).fit(cov_type="HC0")
    assert [r["name"] for r in j["global"]] == ["intercept", "age", "smoker[yes]"]  # years is the exposure
    np.testing.assert_allclose([r["mean"] for r in j["global"]], ref.params, rtol=1e-8)
    np.testing.assert_allclose([r["se"] for r in j["global"]], ref.bse, rtol=1e-8)
    np.testing.assert_allclose([r["p_value"] for r in j["global"]], ref.pvalues, rtol=1e-6)
    assert j["deviance"] == pytest.approx(ref.deviance, rel=1e-8) and j["aic"] == pytest.approx(ref.aic, rel=1e-8)
    assert j["cov_type"] == "HC0" and j["roles"] == {"exposure": "years"} and j["client"]["A"] == []
    pred = j["predictions"][0]
    row = df.iloc[0]
    want = row["years"] * np.exp(ref.params @ [1, row["age"], float(row["smoker"] == "yes")])
    assert pred["mean"] == pytest.approx(want, rel=1e-8) and pred["lower"] < pred["mean"] < pred["upper"]


def test_glm_exp_reports_odds_ratios_equal_to_exp_of_the_coefficients(counts, tmp_path, capsys):
    """``--exp``: the ratio table (text and JSON) is exp of the coefficients and of their
    interval, named by the link; links without a ratio scale and other models are refused."""
    p, df = counts
    out = tmp_path / "g.json"
    base = ["fit", str(p), "--by", "site", "--target", "sick", "--features", "age", "smoker", "--model", "glm"]
    assert main([*base, "--family", "binomial", "--exp", "--level", "0.9", "--output", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "Odds ratios: exp of the coefficients, Wald 90% intervals; p_value tests a ratio of 1" in printed
    j = json.loads(out.read_text())
    assert [r["name"] for r in j["ratios"]] == [r["name"] for r in j["global"]]
    assert {r["kind"] for r in j["ratios"]} == {"odds ratio"}
    for key, scale in (("ratio", "mean"), ("lower", "lower"), ("upper", "upper")):
        np.testing.assert_allclose([r[key] for r in j["ratios"]], np.exp([r[scale] for r in j["global"]]), rtol=1e-12)
    assert main([*base, "--family", "binomial", "--link", "probit", "--exp"]) == 2
    assert "--exp needs the log or logit link" in capsys.readouterr().err
    base[-1] = "hm2"
    assert main([*base[:-2], "--target", "visits", "--exp"]) == 2
    assert "--exp: for --model glm, bglm and hglm only" in capsys.readouterr().err


def test_bayesian_glm_exp_exponentiates_the_posterior_table(counts, tmp_path, capsys):
    """``--exp`` with a Bayesian GLM: exp of the posterior means and of the credible interval's
    ends (the hierarchical model: of the population means ``mu``), the tail probabilities kept."""
    p, df = counts
    out = tmp_path / "b.json"
    base = ["fit", str(p), "--by", "site", "--target", "sick", "--features", "age", "smoker", "--family", "binomial"]
    assert main([*base, "--model", "bglm", "--exp", "--level", "0.9", "--output", str(out), "-q"]) == 0
    assert "p_value: tail probability of a ratio of 1" in capsys.readouterr().out
    j = json.loads(out.read_text())
    coef = {r["name"]: r for r in j["global"]}
    for r in j["ratios"]:
        g = coef[r["name"]]
        assert r["kind"] == "odds ratio" and r["p_value"] == pytest.approx(g["p_value"])
        np.testing.assert_allclose([r["ratio"], r["lower"], r["upper"]], np.exp([g["mean"], g["lower"], g["upper"]]))
    assert (
        main([*base[:-2], "--family", "gaussian", "--target", "age", "--features", "years", "--model", "bglm", "--exp"])
        == 2
    )
    assert "--exp needs the log or logit link" in capsys.readouterr().err


def test_glm_wald_and_lr_tests_equal_statsmodels(counts, tmp_path, capsys):
    """``--wald`` and ``--lr-test`` on the command line: the Wald statistic of the named
    coefficients (a categorical predictor's name: all its levels) and the likelihood-ratio
    test against a fit without the named predictors, equal to statsmodels on the pooled rows."""
    import statsmodels.api as sm

    p, df = counts
    out = tmp_path / "t.json"
    base = ["fit", str(p), "--by", "site", "--target", "visits", "--features", "age", "smoker", "--model", "glm"]
    base += ["--family", "poisson", "--exposure", "years"]
    assert main([*base, "--wald", "smoker", "age", "--lr-test", "smoker", "--output", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "Wald test that smoker[yes], age are 0: chi-square" in printed
    assert "Likelihood ratio test that smoker[yes] is 0" in printed
    wald, lr = json.loads(out.read_text())["tests"]
    X = sm.add_constant(np.column_stack([df["age"], (df["smoker"] == "yes").astype(float)]))
    full = sm.GLM(df["visits"], X, family=sm.families.Poisson(), exposure=df["years"]).fit()
    small = sm.GLM(df["visits"], X[:, :2], family=sm.families.Poisson(), exposure=df["years"]).fit()
    ref = full.wald_test(np.eye(3)[[2, 1]], scalar=True)
    assert wald["coefficients"] == ["smoker[yes]", "age"] and wald["df"] == 2
    assert wald["statistic"] == pytest.approx(float(ref.statistic), rel=1e-8)
    assert wald["p_value"] == pytest.approx(float(ref.pvalue), rel=1e-6)
    assert lr["dropped"] == ["smoker[yes]"] and lr["df"] == 1
    assert lr["statistic"] == pytest.approx(2 * (full.llf - small.llf), rel=1e-8)
    assert main([*base, "--wald", "height", "-q"]) == 2
    assert "--wald: no coefficient 'height'" in capsys.readouterr().err


def test_glm_bad_input_is_one_line(counts, tmp_path, capsys):
    p, df = counts
    base = ["fit", str(p), "--by", "site", "--model", "glm", "-q"]
    assert main([*base, "--target", "sick"]) == 2
    assert "needs --family" in capsys.readouterr().err
    assert main([*base, "--target", "visits", "--family", "binomial", "--features", "age"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "client 'A': outcome 'visits' is not 0/1" in err
    assert main([*base, "--target", "sick", "--family", "poisson", "--link", "logit"]) == 2
    assert "takes --link log, identity with --model glm" in capsys.readouterr().err
    assert main(["fit", str(p), "--by", "site", "--target", "sick", "--exposure", "years", "-q"]) == 2
    assert "--exposure: for --model glm, bglm and hglm only" in capsys.readouterr().err
    sep = df.assign(sick=(df["age"] > 50).astype(int))
    sep.to_csv(tmp_path / "sep.csv", index=False)
    assert (
        main(
            [
                "fit",
                str(tmp_path / "sep.csv"),
                "--by",
                "site",
                "--target",
                "sick",
                "--features",
                "age",
                "smoker",
                "--model",
                "glm",
                "--family",
                "binomial",
                "-q",
            ]
        )
        == 2
    )
    assert "separation" in capsys.readouterr().err


def test_bayesian_and_hierarchical_glms_from_the_command_line(counts, tmp_path, capsys):
    p, df = counts
    out = tmp_path / "h.json"
    rc = main(
        [
            "fit",
            str(p),
            "--by",
            "site",
            "--target",
            "sick",
            "--features",
            "age",
            "--model",
            "hglm",
            "--family",
            "binomial",
            "--output",
            str(out),
            "--predict",
            str(p),
            "-q",
            "--rounds",
            "6",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "each client's coefficients around the population" in printed and "Client B" in printed
    j = json.loads(out.read_text())
    names = [r["name"] for r in j["global"]]
    assert names[:2] == ["mu[intercept]", "mu[age]"] and "tau[age]" in names
    assert [r["name"] for r in j["client"]["A"]] == ["intercept", "age"]
    assert all(0 <= r["mean"] <= 1 and r["pred_lower"] in (0, 1) for r in j["predictions"])  # probabilities, 0/1 bands
    assert (
        main(
            [
                "fit",
                str(p),
                "--by",
                "site",
                "--target",
                "visits",
                "--features",
                "age",
                "--model",
                "hglm",
                "--family",
                "gamma",
                "-q",
            ]
        )
        == 2
    )
    assert "--model hglm needs --family, one of: binomial, poisson, negative_binomial" in capsys.readouterr().err
    assert (
        main(
            [
                "fit",
                str(p),
                "--by",
                "site",
                "--target",
                "visits",
                "--features",
                "age",
                "--model",
                "bglm",
                "--family",
                "poisson",
                "--robust",
                "-q",
            ]
        )
        == 2
    )
    assert "--robust: for --model glm and cox only" in capsys.readouterr().err


# --------------------------------------------------------------------------- issue 40, item 6
def test_predictions_are_printed_without_output_and_named_as_in_python(csv, capsys):
    """--predict without --output prints the predictions (they were discarded); the columns
    carry the Python names: lower/upper the mean's band, pred_lower/pred_upper a new one's."""
    p, t, df = csv
    assert (
        main(
            [
                "fit",
                str(p),
                "--by",
                "site",
                "--target",
                "y",
                "--model",
                "glm",
                "--family",
                "gaussian",
                "--quiet",
                "--predict",
                str(t),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    head = "client    mean   lower   upper  pred_lower  pred_upper  new_client"
    assert "Predictions for" in out and head in out
    lines = out.split(head)[1].strip().splitlines()
    assert len(lines) == 4 and [ln.split()[0] for ln in lines] == ["A", "B", "C", "A"]
    for ln in lines:
        mean, lo, hi, plo, phi = map(float, ln.split()[1:6])
        assert plo < lo < mean < hi < phi


def test_min_rows_is_an_option(csv, tmp_path, capsys):
    p, _, df = csv
    small = tmp_path / "small.csv"
    pd.concat([df, df.iloc[:2].assign(site="D")]).to_csv(small, index=False)
    base = ["fit", str(small), "--by", "site", "--target", "y", "--model", "glm", "--family", "gaussian", "--quiet"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "client 'D' (rule min_rows): it has 2 rows, fewer than 10" in err and "--min-rows 2" in err
    assert main([*base, "--min-rows", "2"]) == 2  # 2 rows pass; a regression on 3 columns needs 9
    assert "(rule min_rows_per_parameter)" in capsys.readouterr().err
    assert main([*base, "--min-rows", "1"]) == 0
    assert "Client D" not in capsys.readouterr().err
    assert main([*base, "--min-rows", "0"]) == 2
    assert "--min-rows must be at least 1" in capsys.readouterr().err


def test_a_client_not_in_the_fit_gets_no_numbers_from_the_command_line(csv, tmp_path, capsys, monkeypatch):
    """A client whose node fails drops out of the fit: the command warns, its table says why,
    and its prediction records carry no numbers, only the reason."""
    from fedstats.glm import _irls

    real = _irls.DesignCheck.client_step

    def failing(self, message, state, data, rng):
        if data.client == "B":
            raise OSError("the disk holding its rows failed")
        return real(self, message, state, data, rng)

    monkeypatch.setattr(_irls.DesignCheck, "client_step", failing)
    p, t, _ = csv
    out = tmp_path / "o.json"
    args = ["fit", str(p), "--by", "site", "--target", "y", "--model", "glm", "--family", "gaussian", "--quiet"]
    assert main([*args, "--predict", str(t), "--output", str(out)]) == 0
    cap = capsys.readouterr()
    assert "not in the fit" in cap.err and "'B'" in cap.err and "disk holding its rows failed" in cap.err
    j = json.loads(out.read_text())
    b = [r for r in j["predictions"] if r["client"] == "B"]
    assert len(b) == 1 and "disk holding its rows failed" in b[0]["excluded"] and "mean" not in b[0]
    assert all(r["mean"] is not None for r in j["predictions"] if r["client"] != "B")


def _registered_commands():
    from fedstats.registry import commands

    return [(name, extra) for name in commands() for extra in ([], ["--bayesian"]) if extra == [] or name == "gmm"]


@pytest.mark.parametrize("model, given", _registered_commands())
def test_the_commands_defaults_are_the_librarys(model, given):
    """Every option the command leaves at its default gives the estimator's own default, for
    every model of the registry (the CLI's round budgets disagreed with Python's: lasso and
    ridge 15 against 25, gmm 200 against 100). Required options get the first value the
    model's check accepts."""
    from fedstats.cli import CLIError, build_parser
    from fedstats.cli.models import command
    from fedstats.registry import commands

    cmd = commands()[model]
    target = ["--target", "y"] if cmd.target else []
    required = [o for o in cmd.options if "required" in o.help]
    for values in itertools.product(*(o.kwargs.get("choices", ("2",)) for o in required)):
        argv = [a for o, v in zip(required, values) for a in (o.flag, v)]
        args = build_parser().parse_args(["fit", "data.csv", "--by", "site", *target, "--model", model, *argv, *given])
        try:
            command(args)
        except CLIError:
            continue
        break
    else:
        raise AssertionError(f"no value of the required options of {model} passes its check")
    est, _ = cmd.build(args)
    required_params = {o.param: getattr(args, o.dest) for o in required}
    assert est.get_params() == type(est)(**required_params).get_params()


def test_the_command_names_no_model():
    """The command's per-model knowledge is in the registry: no module of fedstats/cli/ compares
    or names a model of the registry in its code (the --model default is the registry's first)."""
    import ast
    from pathlib import Path

    from fedstats.registry import commands

    names = set(commands())
    found = []
    for path in (Path(__file__).resolve().parents[1] / "fedstats" / "cli").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        found += [
            f"{path.name}:{n.lineno} {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in names and id(n) not in docstrings
        ]
    assert not found, f"model names in the command's code: {found}"
