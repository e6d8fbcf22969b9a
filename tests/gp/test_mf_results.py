"""The multi-fidelity models keep the result contract and report on the data's scale (issue 40,
item 3): AR1CoKriging, FederatedAR1, NARGP and FederatedNARGP on the Forrester pair predict on
the data's scale by default, report ``rho`` there (checked against changes of units), have
``summary``/``client_summary`` tables of the contract, count the federated fit's exchanges, and
round-trip through ``save``/``load`` bit for bit (a federated result's file holds no client's
rows; it predicts again once the federation is attached)."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile

import numpy as np
import pandas as pd
import pytest

from fedstats.data import DataError, FederatedData, UnknownClientError
from fedstats.data.disclosure import NO_RULES
from fedstats.federation import Communication, counting
from fedstats.gp import testfunctions as tf
from fedstats.gp.ar1_result import AR1Result, FederatedAR1Result
from fedstats.gp.multifidelity import AR1CoKriging, FederatedAR1
from fedstats.gp.nargp import NARGP, FederatedNARGP
from fedstats.gp.nargp_result import FederatedNARGPResult, NARGPResult
from fedstats.results import CLIENT_SUMMARY_COLUMNS, SUMMARY_COLUMNS, NoPosteriorError, load_result

GRID = np.linspace(0.0, 1.0, 1001)
TRUTH = tf.forrester_hf(GRID)

# the designs: Forrester, Sobester and Keane's (11 LF points, 4 nested HF points) for AR1; NARGP's
# GP on (x, LF's prediction) needs more HF points than 4 (2 inputs, 4 hyperparameters): 6 nested
DESIGNS = {"AR1": tf.FORRESTER_DESIGN, "NARGP": {"LF": tf.FORRESTER_DESIGN["LF"], "HF": np.linspace(0, 1, 6)}}


def forrester(design: dict) -> FederatedData:
    xs = [design["LF"], design["HF"]]
    ys = [tf.forrester_lf(xs[0]), tf.forrester_hf(xs[1])]
    return FederatedData.from_arrays([x[:, None] for x in xs], ys, clients=["LF", "HF"], **NO_RULES)


def fidelities(data: FederatedData) -> dict:
    return {c: (np.asarray(data[c].X), np.asarray(data[c].y)) for c in ("LF", "HF")}


@pytest.fixture(scope="module")
def fits() -> dict:
    out = {}
    for family, (central, federated) in {"AR1": (AR1CoKriging, FederatedAR1), "NARGP": (NARGP, FederatedNARGP)}.items():
        data = forrester(DESIGNS[family])
        opts = {"restarts": 2} if family == "AR1" else {"restarts": 2, "samples": 100}
        out[central.__name__] = (central(**opts).fit(fidelities(data), seed=1), data)
        out[federated.__name__] = (federated(**opts).fit(data, ["LF", "HF"], seed=1), data)
    return out


MODELS = ["AR1CoKriging", "FederatedAR1", "NARGP", "FederatedNARGP"]


def rmse(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


# --------------------------------------------------------------------------- the data's scale


@pytest.mark.parametrize("name", MODELS)
def test_default_predictions_are_on_the_datas_scale(fits, name):
    res, _ = fits[name]
    default, original = res.predict(GRID), res.predict(GRID, scale="original")
    # the acceptance figure: the default's RMSE within 10% of the scale="original" one (it is that one)
    assert abs(rmse(default["mean"], TRUTH) - rmse(original["mean"], TRUTH)) <= 0.1 * rmse(original["mean"], TRUTH)
    pd.testing.assert_frame_equal(default, original)
    assert default.attrs["scale"] == "original"
    # and it is a good prediction in the data's units, with a band that covers the truth
    assert rmse(default["mean"], TRUTH) < 0.03 * np.std(TRUTH), rmse(default["mean"], TRUTH)
    inside = (default["lower"] <= TRUTH) & (TRUTH <= default["upper"])
    assert inside.mean() >= 0.9, inside.mean()
    assert list(default.columns[:5]) == ["mean", "lower", "upper", "pred_lower", "pred_upper"]
    assert (default["pred_lower"] < default["lower"]).all() and (default["pred_upper"] > default["upper"]).all()
    # the standardised scale stays available: the same prediction in the highest fidelity's training units
    hf = np.asarray(forrester(DESIGNS["AR1" if "AR1" in name else "NARGP"])["HF"].y)
    std = res.predict(GRID, scale="standardized")
    np.testing.assert_allclose(std["mean"], (default["mean"] - hf.mean()) / hf.std(), rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="scale must be"):
        res.predict(GRID, scale="natural")
    with pytest.raises(DataError, match="1 column"):
        res.predict(np.zeros((3, 2)))


def test_rho_and_the_offset_move_with_each_fidelities_units_as_the_formulas_say():
    # y_LF -> a y_LF + b and y_HF -> c y_HF + d leave the standardised fit unchanged, so on the data's
    # scale rho -> rho c / a, offset -> c offset + d - rho' b and the predictions -> c f + d
    a, b, c, d = 1000.0, -3.0, 0.01, 7.0
    xl, xh = tf.FORRESTER_DESIGN["LF"], tf.FORRESTER_DESIGN["HF"]
    yl, yh = tf.forrester_lf(xl), tf.forrester_hf(xh)
    one = AR1CoKriging(restarts=2).fit({"LF": (xl, yl), "HF": (xh, yh)})
    two = AR1CoKriging(restarts=2).fit({"LF": (xl, a * yl + b), "HF": (xh, c * yh + d)})
    assert two.rho[0] == pytest.approx(one.rho[0] * c / a, rel=1e-6)
    assert two.offset[0] == pytest.approx(c * one.offset[0] + d - two.rho[0] * b, rel=1e-6)
    s1, s2 = one.summary(), two.summary()
    # the two standardised data sets agree to rounding, and L-BFGS stops within its tolerance of
    # the optimum from each: the HF lengthscale and outputscale were seen 1.7e-6 apart
    np.testing.assert_allclose(s2["standardized"], s1["standardized"], rtol=1e-5, atol=1e-9)
    assert s2.loc["outputscale[HF]", "mean"] == pytest.approx(c**2 * s1.loc["outputscale[HF]", "mean"], rel=1e-5)
    assert s2.loc["outputscale[LF]", "mean"] == pytest.approx(a**2 * s1.loc["outputscale[LF]", "mean"], rel=1e-5)
    assert s2.loc["mean[LF]", "mean"] == pytest.approx(a * yl.mean() + b, rel=1e-12)
    p1, p2 = one.predict(GRID[::10]), two.predict(GRID[::10])
    np.testing.assert_allclose(p2["mean"], c * p1["mean"] + d, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(p2["sd"], c * p1["sd"], rtol=1e-5)
    # by the formula from the standardised fit: rho = r s_HF / s_LF with the fidelities' own sds
    assert one.rho[0] == pytest.approx(s1.loc["rho[HF]", "standardized"] * yh.std() / yl.std(), rel=1e-12)
    assert one.offset[0] == pytest.approx(yh.mean() - one.rho[0] * yl.mean(), rel=1e-12)


# --------------------------------------------------------------------------- tables


def expected_labels(name: str) -> list[str]:
    if "AR1" in name:
        return [
            "mean[LF]",
            "lengthscale[LF]",
            "outputscale[LF]",
            "noise[LF]",
            "rho[HF]",
            "offset[HF]",
            "lengthscale[HF]",
            "outputscale[HF]",
            "noise[HF]",
        ]
    return [
        "mean[LF]",
        "lengthscale[LF, x0]",
        "outputscale[LF]",
        "noise[LF]",
        "mean[HF]",
        "lengthscale[HF, x0]",
        "lengthscale[HF, f(LF)]",
        "outputscale[HF]",
        "noise[HF]",
    ]


@pytest.mark.parametrize("name", MODELS)
def test_summary_and_client_summary_keep_the_contract(fits, name):
    res, data = fits[name]
    s = res.summary()
    assert tuple(s.columns[:5]) == SUMMARY_COLUMNS and s.index.name == "parameter"
    assert list(s.index) == expected_labels(name)
    assert s[["sd", "lower", "upper", "p_value"]].isna().all().all()  # maximum likelihood: no distribution
    np.testing.assert_array_equal(s["mean"], s["estimate"])
    yl, yh = np.asarray(data["LF"].y), np.asarray(data["HF"].y)
    assert s.loc["mean[LF]", "mean"] == pytest.approx(yl.mean(), rel=1e-12)
    assert s.loc["noise[HF]", "mean"] == pytest.approx(yh.var() * s.loc["noise[HF]", "standardized"], rel=1e-12)
    if "AR1" in name:
        assert s.loc["rho[HF]", "mean"] == res.rho[0] and s.loc["offset[HF]", "mean"] == res.offset[0]
    else:  # the lengthscale of LF's value, in LF's units
        fitted = s.loc["lengthscale[HF, f(LF)]", "standardized"]
        assert s.loc["lengthscale[HF, f(LF)]", "mean"] == pytest.approx(fitted * yl.std(), rel=1e-12)
    assert s.equals(res.summary(level=0.9))  # no intervals, so the level changes nothing
    cs = res.client_summary()
    assert tuple(cs.columns) == CLIENT_SUMMARY_COLUMNS and len(cs) == 0
    with pytest.raises(NoPosteriorError, match="summary"):
        res.global_posterior()
    # a federated fit is a run (its rounds in history); a centralised one has no rounds
    assert res.converged and res.seconds > 0
    assert len(res.history) == res.rounds if name.startswith("Federated") else res.history is None
    assert res.clients == (["LF", "HF"] if name.startswith("Federated") else [])


@pytest.mark.parametrize("family", ["AR1", "NARGP"])
def test_federated_tables_and_predictions_equal_the_centralised_ones(fits, family):
    central, federated = fits["AR1CoKriging" if family == "AR1" else "NARGP"][0], fits[f"Federated{family}"][0]
    pd.testing.assert_frame_equal(federated.summary(), central.summary(), rtol=1e-8)
    p, q = central.predict(GRID), federated.predict(GRID)
    np.testing.assert_allclose(q.to_numpy(), p.to_numpy(), rtol=1e-8, atol=1e-8)
    # a lower fidelity's client: that fidelity's prediction on its data's scale, the centralised fidelity_moments
    low = federated.predict(GRID, client="LF")
    mean, var = central.fidelity_moments(GRID, 0)
    np.testing.assert_allclose(low["mean"], mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(low["sd"] ** 2, var, rtol=1e-8, atol=1e-12)
    assert rmse(low["mean"], tf.forrester_lf(GRID)) < 0.03 * np.std(tf.forrester_lf(GRID))
    with pytest.raises(UnknownClientError, match="MF"):
        federated.predict(GRID, client="MF")
    with pytest.raises(UnknownClientError, match="centralised"):
        central.predict(GRID, client="LF")


# --------------------------------------------------------------------------- communication


def test_the_federated_fit_and_its_queries_are_counted_apart():
    data = forrester(tf.FORRESTER_DESIGN)
    with counting() as ledger:
        res = FederatedAR1(restarts=1).fit(data, ["LF", "HF"])
    comm = res.communication
    assert isinstance(comm, Communication) and set(comm.by_kind) == {"chain"}
    # one run of the runtime, 5 rounds: LF fits; HF sends its 4 inputs up, they go down to LF,
    # LF's mean and variance there come up, LF's mean goes down to HF, which fits; both release
    # their lengthscale, outputscale, noise, row count, mean, sd and rho (7 numbers). Every
    # broadcast carries its task code (4 one-client rounds, 2 clients in the release)
    assert comm.bytes_down == 6 * 8 + 4 * 8 + 4 * 8 and comm.bytes_up == 4 * 8 + 2 * 4 * 8 + 2 * 7 * 8
    assert comm.per_client["HF"] == {"bytes_up": (4 + 7) * 8, "bytes_down": (3 + 4) * 8}
    assert res.rounds == 5 and ledger.communication().bytes_total == comm.bytes_total
    # a query after the fit: counted apart (and by any counting block around it), the fit's figure
    # unchanged; the first query also rebuilds each fidelity's GP from its rows and its release (HF's
    # 4 inputs to LF, its mean and variance back)
    before = comm.bytes_total
    with counting() as ledger:
        res.predict(GRID[:50])
    assert res.communication.bytes_total == before
    assert res.query_communication.by_kind["predict"] == {"bytes_up": 800, "bytes_down": 400, "rounds": 1, "runs": 1}
    assert res.query_communication.by_kind["rebuild"] == {"bytes_up": 64, "bytes_down": 32, "rounds": 1, "runs": 1}
    assert ledger.communication().bytes_total == 1200 + 96


# --------------------------------------------------------------------------- save / load


def equal_frames(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    return list(a.columns) == list(b.columns) and all(np.array_equal(a[c], b[c]) for c in a.columns)


@pytest.mark.parametrize("name, cls", [("AR1CoKriging", AR1Result), ("NARGP", NARGPResult)])
def test_a_centralised_result_round_trips_bit_for_bit(fits, name, cls, tmp_path):
    res, _ = fits[name]
    path = res.save(tmp_path / "fit.fedstats")
    for back in (cls.load(path), load_result(path)):
        assert type(back) is cls
        assert equal_frames(back.predict(GRID), res.predict(GRID))
        assert equal_frames(back.predict(GRID, scale="standardized"), res.predict(GRID, scale="standardized"))
        assert back.summary().equals(res.summary())
        for x, y in zip(back.fidelity_moments(GRID, 0), res.fidelity_moments(GRID, 0)):
            assert np.array_equal(x, y)
        assert back.options == res.options and back.names == res.names and back.n_obs == res.n_obs


def file_arrays(path) -> list[np.ndarray]:
    with zipfile.ZipFile(path) as z, np.load(io.BytesIO(z.read("arrays.npz"))) as npz:
        return [npz[k] for k in npz.files]


@pytest.mark.parametrize("name, cls", [("FederatedAR1", FederatedAR1Result), ("FederatedNARGP", FederatedNARGPResult)])
def test_a_federated_result_file_holds_no_rows_and_predicts_again_once_attached(fits, name, cls, tmp_path):
    res, data = fits[name]
    path = res.save(tmp_path / "fit.fedstats")
    # nothing in the file is a fidelity's inputs or outputs (raw or standardised)
    rows = []
    for c in ("LF", "HF"):
        y = np.asarray(data[c].y)
        rows += [np.asarray(data[c].X).ravel(), y, (y - y.mean()) / y.std()]
    assert not any(
        a.size > 1 and any(a.size == r.size and np.allclose(a.ravel(), r) for r in rows) for a in file_arrays(path)
    )
    back = cls.load(path)
    assert back.summary().equals(res.summary())
    assert back.communication == res.communication
    with pytest.raises(ValueError, match="attach"):
        back.predict(GRID)
    # other rows are refused, naming the client
    other = FederatedData.from_arrays(
        [np.asarray(data["LF"].X), np.asarray(data["HF"].X)],
        [np.asarray(data["LF"].y), np.asarray(data["HF"].y) + 1.0],
        clients=["LF", "HF"],
        **NO_RULES,
    )
    with pytest.raises(DataError, match="'HF' holds other rows"):
        back.attach(other)
    assert back.attach(data) is back
    assert equal_frames(back.predict(GRID), res.predict(GRID))
    assert equal_frames(back.predict(GRID, client="LF"), res.predict(GRID, client="LF"))
    # HF's inputs went to LF once more (the original rebuilt once, on its first query)
    assert (
        back.query_communication.by_kind["rebuild"]["rounds"]
        == res.query_communication.by_kind["rebuild"]["rounds"] + 1
    )


def test_each_result_class_loads_its_files_in_a_fresh_interpreter(fits, tmp_path):
    # the fidelity classes a file names are registered by importing the result's module alone
    central, federated = fits["AR1CoKriging"][0], fits["FederatedNARGP"][0]
    central.save(tmp_path / "ar1.fedstats")
    federated.save(tmp_path / "nargp.fedstats")
    np.save(tmp_path / "grid.npy", GRID[::50])
    code = f"""
import numpy as np
from fedstats.gp.ar1_result import AR1Result
from fedstats.gp.nargp_result import FederatedNARGPResult
grid = np.load({str(tmp_path / "grid.npy")!r})
np.save({str(tmp_path / "mean.npy")!r}, AR1Result.load({str(tmp_path / "ar1.fedstats")!r}).predict(grid)["mean"].to_numpy())
FederatedNARGPResult.load({str(tmp_path / "nargp.fedstats")!r}).summary().to_pickle({str(tmp_path / "s.pkl")!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    assert np.array_equal(np.load(tmp_path / "mean.npy"), central.predict(GRID[::50])["mean"].to_numpy())
    pd.testing.assert_frame_equal(pd.read_pickle(tmp_path / "s.pkl"), federated.summary())


def test_every_fidelity_is_needed_and_bad_fidelities_are_refused_naming_them():
    data = forrester(tf.FORRESTER_DESIGN)
    one_row = FederatedData.from_arrays(
        [np.asarray(data["LF"].X), np.asarray(data["HF"].X)[:1]],
        [np.asarray(data["LF"].y), np.asarray(data["HF"].y)[:1]],
        clients=["LF", "HF"],
        **NO_RULES,
    )
    for model in (FederatedAR1(restarts=1), FederatedNARGP(restarts=1)):
        with pytest.raises(DataError, match=r"too few at \{'HF': 1\}"):
            model.fit(one_row, ["LF", "HF"])
        with pytest.raises(ValueError, match="twice"):
            model.fit(data, ["LF", "LF"])
    for model in (AR1CoKriging(restarts=1), NARGP(restarts=1)):
        with pytest.raises(DataError, match="fidelity 'HF'.*n >= 2"):
            model.fit({"LF": fidelities(data)["LF"], "HF": (np.zeros((1, 1)), np.zeros(1))})
        with pytest.raises(DataError, match="fidelity 'HF' has 2 input column"):
            model.fit({"LF": fidelities(data)["LF"], "HF": (np.zeros((3, 2)), np.zeros(3))})
        with pytest.raises(DataError, match="fidelity 'LF'.*NaN"):
            model.fit({"LF": (np.array([0.0, 1.0]), np.array([0.0, np.nan])), "HF": fidelities(data)["HF"]})


@pytest.mark.parametrize("family", ["AR1", "NARGP"])
def test_predict_reads_a_data_frame_by_column_name(family):
    # issue 40, item 2, for the chains: Currin's two-input pair, the columns of the query frame
    # reversed, give the predictions of the array in the fit's order; an unknown or a missing
    # column is refused by name
    rng = np.random.default_rng(3)
    X_lf, X_hf = rng.uniform(size=(20, 2)), rng.uniform(size=(10, 2))
    data = FederatedData.from_dataframe(
        pd.concat(
            [
                pd.DataFrame({"u": X[:, 0], "v": X[:, 1], "y": f(X), "fidelity": lv})
                for X, f, lv in ((X_lf, tf.currin_lf, "LF"), (X_hf, tf.currin_hf, "HF"))
            ]
        ),
        by="fidelity",
        target="y",
        **NO_RULES,
    )
    central, federated = (AR1CoKriging, FederatedAR1) if family == "AR1" else (NARGP, FederatedNARGP)
    opts = {"restarts": 1} if family == "AR1" else {"restarts": 1, "samples": 50}
    queries = rng.uniform(size=(7, 2))
    results = {
        "federated": (federated(**opts).fit(data, ["LF", "HF"], seed=0), ["u", "v"]),
        "central": (central(**opts).fit(fidelities(data), seed=0), ["x0", "x1"]),
    }
    for kind, (res, names) in results.items():
        by_position = res.predict(queries)
        frame = pd.DataFrame(queries, columns=names)[names[::-1]]
        pd.testing.assert_frame_equal(res.predict(frame), by_position, obj=kind)
        with pytest.raises(ValueError, match="'w'"):
            res.predict(frame.rename(columns={names[0]: "w"}))
        with pytest.raises(ValueError, match=repr(names[1])):
            res.predict(frame[[names[0]]])
