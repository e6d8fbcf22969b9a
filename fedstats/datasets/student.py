"""UCI Student Performance data (Cortez & Silva 2008) as a two-school federation (Section 6.1 of
the linear-models paper).

The files are not shipped with fedstats: pass the folder (or file) that holds
``student-por.csv`` / ``student-mat.csv``, or set ``FEDSTATS_DATA`` to a folder holding a
``student/`` sub-folder (or the files themselves). The UCI format is ``;``-separated with
a header; copies without the header, or re-exported as one quoted comma-separated field
per line, are read too.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Hashable
from pathlib import Path

import numpy as np
import pandas as pd

from ..data import FederatedData, FederatedScaler
from ._files import DataPath, find_data_file

COLUMNS = [
    "school",
    "sex",
    "age",
    "address",
    "famsize",
    "Pstatus",
    "Medu",
    "Fedu",
    "Mjob",
    "Fjob",
    "reason",
    "guardian",
    "traveltime",
    "studytime",
    "failures",
    "schoolsup",
    "famsup",
    "paid",
    "activities",
    "nursery",
    "higher",
    "internet",
    "romantic",
    "famrel",
    "freetime",
    "goout",
    "Dalc",
    "Walc",
    "health",
    "absences",
    "G1",
    "G2",
    "G3",
]
NUMERIC = [
    "age",
    "Medu",
    "Fedu",
    "traveltime",
    "studytime",
    "failures",
    "famrel",
    "freetime",
    "goout",
    "Dalc",
    "Walc",
    "health",
    "absences",
]
# Binary attributes and the level coded 1.
BINARY = {
    "sex": "M",
    "address": "U",
    "famsize": "GT3",
    "Pstatus": "T",
    "schoolsup": "yes",
    "famsup": "yes",
    "paid": "yes",
    "activities": "yes",
    "nursery": "yes",
    "higher": "yes",
    "internet": "yes",
    "romantic": "yes",
}
# Nominal attributes: k - 1 dummies, the first level listed is the reference.
NOMINAL = {
    "Mjob": ["other", "at_home", "health", "services", "teacher"],
    "Fjob": ["other", "at_home", "health", "services", "teacher"],
    "reason": ["other", "course", "home", "reputation"],
    "guardian": ["other", "father", "mother"],
}
SUBJECTS = {"por": "student-por.csv", "mat": "student-mat.csv"}


def _find(path: DataPath, filename: str) -> Path:
    return find_data_file(path, filename, "student")


def read_student(path: DataPath = None, subject: str = "por") -> pd.DataFrame:
    """The raw table of one course (``"por"``: Portuguese, 649 students; ``"mat"``:
    mathematics, 395), with the 33 original attributes as columns."""
    if subject not in SUBJECTS:
        raise ValueError(f"subject must be one of {sorted(SUBJECTS)}, not {subject!r}")
    lines = [ln.strip() for ln in _find(path, SUBJECTS[subject]).read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln]
    if lines and ";" not in lines[0] and lines[0].startswith('"') and lines[0].endswith('"'):
        # One quoted field per line (a re-export): unwrap it, then it is comma-separated.
        lines = [ln[1:-1].replace('""', '"') if ln.startswith('"') else ln for ln in lines]
    delimiter = ";" if ";" in lines[0] else ","
    rows = list(csv.reader(io.StringIO("\n".join(lines)), delimiter=delimiter))
    if rows and rows[0][:2] == ["school", "sex"]:
        header, rows = rows[0], rows[1:]
        if header != COLUMNS:
            raise ValueError(f"unexpected columns in {SUBJECTS[subject]}: {header}")
    bad = [i for i, r in enumerate(rows) if len(r) != len(COLUMNS)]
    if bad:
        raise ValueError(
            f"{SUBJECTS[subject]}: row {bad[0] + 1} has {len(rows[bad[0]])} fields, expected {len(COLUMNS)}"
        )
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col in NUMERIC + ["G1", "G2", "G3"]:
        df[col] = pd.to_numeric(df[col], errors="raise").astype(float)
    unknown = sorted(set(df["school"]) - {"GP", "MS"})
    if unknown:
        raise ValueError(f"unknown school codes {unknown}")
    return df


def student_design(df: pd.DataFrame) -> pd.DataFrame:
    """The 38 predictors of the linear-models paper's Section 6.1 (13 numeric, 12 binary coded
    0/1, 13 dummies of Mjob, Fjob, reason and guardian; G1 and G2 left out), unscaled, with
    ``school`` and ``G3`` kept as columns."""
    out = {"school": df["school"].to_numpy()}
    for col in NUMERIC:
        out[col] = df[col].to_numpy(float)
    for col, one in BINARY.items():
        found = set(df[col])
        if not found <= {one, _other_level(col)}:
            raise ValueError(f"column {col!r} has unexpected levels {sorted(found)}")
        out[f"{col}_{one}"] = (df[col] == one).to_numpy(float)
    for col, levels in NOMINAL.items():
        unknown = sorted(set(df[col]) - set(levels))
        if unknown:
            raise ValueError(f"column {col!r} has unexpected levels {unknown}")
        for lev in levels[1:]:
            out[f"{col}_{lev}"] = (df[col] == lev).to_numpy(float)
    out["G3"] = df["G3"].to_numpy(float)
    return pd.DataFrame(out)


def _other_level(col: str) -> str:
    return {"sex": "F", "address": "R", "famsize": "LE3", "Pstatus": "A"}.get(col, "no")


def load_student(
    path: DataPath = None, subject: str = "por", *, test_size: float = 0.4, seed: int = 0, scaling: str = "school"
) -> tuple[FederatedData, FederatedData, dict[Hashable, FederatedScaler]]:
    """The student-performance federation (public data: the cell rule is off, ``min_cell_count=1``,
    since rare categories are small cells): one client per school (``GP``, ``MS``), the 38
    predictors of :func:`student_design`, target G3.

    Each school's students are split at random into train and test (``test_size`` to the
    test part). The 13 numeric predictors and G3 are standardised with training means and
    sds; binary and dummy predictors stay 0/1.

    scaling : {"school", "pooled"}
        ``"school"`` (default): each school standardises with its own training statistics
        (local preprocessing, nothing shared), so each school's RMSE is in units of its own
        G3 sd (G3 sd: GP 2.6, MS 3.8 grade points). ``"pooled"``: statistics of both
        schools' training rows together, computed federatedly from per-school sums
        (:meth:`FederatedData.fit_scaler`).

    Returns ``(train, test, scalers)``: two :class:`FederatedData` and a dict school ->
    :class:`FederatedScaler` that maps back to grade points
    (``scalers["GP"].inverse_transform_y``).

    >>> train, test, scalers = load_student(subject="por")  # doctest: +SKIP
    >>> train.n_obs, train.n_features  # doctest: +SKIP
    ({'GP': 254, 'MS': 136}, 38)
    """
    if scaling not in ("school", "pooled"):
        raise ValueError(f"scaling must be 'school' or 'pooled', not {scaling!r}")
    design = student_design(read_student(path, subject))
    # public data (UCI): a rare category is a small cell under the default rule (e.g. 4 of MS's
    # students have a father in health care), so the loader turns the cell rule off
    data = FederatedData.from_dataframe(design, by="school", target="G3", min_cell_count=1)
    train, test = data.train_test_split(test_size, seed=seed)

    def numeric_only(sc: FederatedScaler) -> FederatedScaler:
        numeric = np.isin(np.asarray(sc.feature_names), NUMERIC)
        return FederatedScaler(
            mean=np.where(numeric, sc.mean, 0.0),
            sd=np.where(numeric, sc.sd, 1.0),
            feature_names=sc.feature_names,
            y_mean=sc.y_mean,
            y_sd=sc.y_sd,
            n=sc.n,
        )

    if scaling == "pooled":
        sc = numeric_only(train.fit_scaler(target=True))
        scalers = {c: sc for c in train.clients}
    else:
        scalers = {c: numeric_only(train.subset([c]).fit_scaler(target=True)) for c in train.clients}
    parts = []
    target = data.target_name
    assert target is not None  # from_dataframe(target="G3") above
    for fd in (train, test):
        scaled = [scalers[c].transform(fd.subset([c])) for c in fd.clients]
        parts.append(
            FederatedData.from_arrays(
                [s[c].X for s, c in zip(scaled, fd.clients)],
                [s[c].y for s, c in zip(scaled, fd.clients)],
                clients=fd.clients,
                feature_names=fd.feature_names,
                target_name=target,
                min_cell_count=1,
            )
        )
    return parts[0], parts[1], scalers


__all__ = ["load_student", "read_student", "student_design", "COLUMNS", "NUMERIC", "BINARY", "NOMINAL"]
