"""The student-performance loader: parsing of the UCI formats, the 38-predictor design of
spec §5.1, the per-school split and training-statistics scaling."""

import os
from pathlib import Path

import numpy as np
import pytest

from fedstats.datasets.student import COLUMNS, load_student, read_student, student_design

DATA = Path(os.environ.get("FEDSTATS_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
HAVE = (DATA / "student" / "student-por.csv").is_file()
needs_data = pytest.mark.skipif(not HAVE, reason="student data absent (set FEDSTATS_DATA)")

ROWS = [
    [
        "GP",
        "F",
        "18",
        "U",
        "GT3",
        "A",
        "4",
        "4",
        "at_home",
        "teacher",
        "course",
        "mother",
        "2",
        "2",
        "0",
        "yes",
        "no",
        "no",
        "no",
        "yes",
        "yes",
        "no",
        "no",
        "4",
        "3",
        "4",
        "1",
        "1",
        "3",
        "4",
        "0",
        "11",
        "11",
    ],
    [
        "MS",
        "M",
        "17",
        "R",
        "LE3",
        "T",
        "1",
        "1",
        "other",
        "other",
        "home",
        "father",
        "1",
        "2",
        "1",
        "no",
        "yes",
        "no",
        "no",
        "no",
        "yes",
        "yes",
        "no",
        "5",
        "3",
        "3",
        "1",
        "1",
        "3",
        "2",
        "9",
        "11",
        "12",
    ],
]


def _write(tmp_path, fmt):
    def q(v):
        return v if v.isdigit() else f'"{v}"'

    if fmt == "uci":  # ';' separated, quoted strings, header
        lines = [";".join(COLUMNS)] + [";".join(q(v) for v in r) for r in ROWS]
    elif fmt == "noheader":
        lines = [";".join(q(v) for v in r) for r in ROWS]
    else:  # each line one quoted comma-separated field, inner quotes doubled
        lines = ['"' + ",".join(COLUMNS) + '"'] + [
            '"' + ",".join(q(v) for v in r).replace('"', '""') + '"' for r in ROWS
        ]
    (tmp_path / "student-por.csv").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.parametrize("fmt", ["uci", "noheader", "requoted"])
def test_formats_parse_identically(tmp_path, fmt):
    df = read_student(_write(tmp_path, fmt))
    assert list(df.columns) == COLUMNS and len(df) == 2
    assert df["G3"].tolist() == [11.0, 12.0] and df["school"].tolist() == ["GP", "MS"]
    X = student_design(df)
    assert X.shape[1] == 38 + 2  # school and G3 kept
    assert X.loc[0, "sex_M"] == 0 and X.loc[1, "sex_M"] == 1
    assert (
        X.loc[0, "Mjob_at_home"] == 1 and X.loc[1, ["Mjob_at_home", "Mjob_health"]].sum() == 0
    )  # 'other' is reference
    assert X.loc[1, "guardian_father"] == 1 and X.loc[1, "guardian_mother"] == 0


def test_bad_files(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDSTATS_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="FEDSTATS_DATA"):
        read_student()
    with pytest.raises(FileNotFoundError):
        read_student(tmp_path)
    with pytest.raises(ValueError, match="subject"):
        read_student(tmp_path, subject="physics")
    (tmp_path / "student-por.csv").write_text('"GP";"F";18\n')
    with pytest.raises(ValueError, match="fields"):
        read_student(tmp_path)
    _write(tmp_path, "uci")
    monkeypatch.setenv("FEDSTATS_DATA", str(tmp_path))  # the files directly under FEDSTATS_DATA
    assert len(read_student()) == 2


@needs_data
def test_portuguese_course_counts_and_scaling():
    df = read_student(DATA, "por")
    assert df["school"].value_counts().to_dict() == {"GP": 423, "MS": 226}
    assert df.isna().sum().sum() == 0
    train, test, scalers = load_student(DATA, seed=0)
    assert train.feature_names == list(student_design(df).columns[1:-1]) and train.n_features == 38
    assert {c: train.n_obs[c] + test.n_obs[c] for c in train.clients} == {"GP": 423, "MS": 226}
    assert test.n_obs == {"GP": 169, "MS": 90}
    numeric = slice(0, 13)
    for c in train.clients:  # default: each school standardised on its own training rows
        X, y = train[c].X, train[c].y
        np.testing.assert_allclose(X[:, numeric].mean(axis=0), 0, atol=1e-12)
        np.testing.assert_allclose(X[:, numeric].std(axis=0, ddof=1), 1, atol=1e-12)
        assert set(np.unique(X[:, 13:])) == {0.0, 1.0}
        assert abs(y.mean()) < 1e-12 and abs(y.std(ddof=1) - 1) < 1e-12
        # Back to grade points exactly.
        raw = df.loc[df["school"] == c, "G3"].to_numpy()
        back = scalers[c].inverse_transform_y(np.concatenate([train[c].y, test[c].y]))
        np.testing.assert_allclose(np.sort(back), np.sort(raw), atol=1e-9)
    # Pooled scaling: one scaler for both schools, standardised over the pooled training rows.
    ptrain, _, pscalers = load_student(DATA, seed=0, scaling="pooled")
    assert pscalers["GP"] is pscalers["MS"]
    Xp = np.vstack([ptrain[c].X for c in ptrain.clients])
    yp = np.concatenate([ptrain[c].y for c in ptrain.clients])
    np.testing.assert_allclose(Xp[:, numeric].mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(Xp[:, numeric].std(axis=0, ddof=1), 1, atol=1e-12)
    assert abs(yp.mean()) < 1e-12 and abs(yp.std(ddof=1) - 1) < 1e-12
    assert abs(ptrain["GP"].y.mean()) > 1e-3  # the schools differ, so per-school means are not zero
    with pytest.raises(ValueError, match="scaling"):
        load_student(DATA, scaling="global")
    # Different seeds give different splits; the same seed the same.
    assert not np.array_equal(load_student(DATA, seed=1)[0]["GP"].y, train["GP"].y)
    np.testing.assert_array_equal(load_student(DATA, seed=0)[0]["GP"].y, train["GP"].y)


@needs_data
def test_mathematics_course_reads():
    assert read_student(DATA, "mat")["school"].value_counts().to_dict() == {"GP": 349, "MS": 46}
