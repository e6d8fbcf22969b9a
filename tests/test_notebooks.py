"""The tutorials execute end to end (small configurations via FEDSTATS_QUICK=1)."""

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
# What each tutorial must print when it runs (its own check of the result it shows).
EXPECT = {
    "01_hierarchical_ep.ipynb": "EP covers the truth wherever pooled NUTS does: True",
    "02_variable_selection.ipynb": "Inclusion rates within spec A9 up to two binomial standard errors: True",
    "03_structural_covariance.ipynb": "HM1 gates pass: True",
    "04_fgpr_multifidelity.ipynb": "FGPR notebook checks pass: True",
    "05_fedem.ipynb": "FedEM notebook checks pass: True",
    "06_fem_omd.ipynb": "FEM-OMD notebook checks pass: True",
    "07_glm.ipynb": "GLM notebook checks pass: True",
    "08_multifidelity_bo.ipynb": "MF-BO notebook checks pass: True",
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("FEDSTATS_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert EXPECT[path.name] in "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )


def test_there_is_a_notebook():
    assert NOTEBOOKS, "notebooks/ holds no tutorial"
