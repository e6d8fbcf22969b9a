"""Every code block of README.md runs as written.

* ``python`` blocks run, each on its own, in a fresh interpreter whose working directory holds
  the repository's ``examples/`` (as the repository root does);
* ``bash`` blocks: every command runs (``.venv/bin/fedstats`` and ``.venv/bin/python`` as this
  interpreter), except ``make`` targets, which are checked with ``make -n`` (``make test``
  cannot run inside the test suite), and the Flower deployment's long-running servers
  (``flower-superlink``, ``flower-supernode``, ``flwr run``), whose executables and options are
  checked here and which ``make test-deployment`` runs for real
  (``tests/federation/test_flower_deployment.py``);
* ``toml`` blocks parse.

A command this file does not know fails the test, so a new kind of command needs a rule here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent


def blocks() -> list[tuple[str, int, str]]:
    """(language, line number, code) of every fenced block."""
    out, lang, start, body = [], None, 0, []
    for i, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, body = line[3:].strip() or "text", i, []
            else:
                out.append((lang, start, "\n".join(body)))
                lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"README.md: block opened at line {start} is never closed"
    return out


BLOCKS = blocks()
KNOWN = {"python", "bash", "toml", "text"}


def by_lang(lang):
    sel = [b for b in BLOCKS if b[0] == lang]
    return pytest.mark.parametrize("block", sel, ids=[f"line{b[1]}" for b in sel])


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def env() -> dict:
    e = dict(os.environ, MPLBACKEND="Agg", PYTHONWARNINGS="ignore")
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    return e


def test_blocks_have_known_languages():
    assert BLOCKS, "README.md has no code blocks"
    assert {b[0] for b in BLOCKS} <= KNOWN, {b[0] for b in BLOCKS} - KNOWN


def test_no_references_to_files_outside_the_repository():
    assert "spec §" not in README.read_text()


@by_lang("python")
def test_python_block_runs(block, tmp_path):
    _, line, code = block
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=workdir(tmp_path), env=env(), capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, f"README.md line {line}:\n{out.stderr[-4000:]}"


@by_lang("toml")
def test_toml_block_parses_and_is_the_shipped_config(block):
    doc = tomllib.loads(block[2])
    if "superlink" in doc:  # the Flower configuration the walk-through copies
        assert doc == tomllib.loads((ROOT / "examples/flower_app/config.toml").read_text())
    else:  # a node's release policy: a valid one
        from fedstats.federation import NodePolicy

        assert NodePolicy.from_toml(block[2]).min_rows >= 1


def commands(code: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped."""
    code = re.sub(r"\\\n\s*", " ", code)
    return [shlex.split(line, comments=True) for line in code.splitlines() if shlex.split(line, comments=True)]


FLOWER = {"flower-superlink", "flower-supernode", "flwr"}


def check_flower(argv: list[str]) -> None:
    exe = BIN / argv[0]
    assert exe.is_file(), f"{argv[0]} is not installed in the environment"
    sub = argv[:2] if argv[0] == "flwr" else argv[:1]
    helptext = subprocess.run(
        [str(BIN / sub[0]), *sub[1:], "--help"], capture_output=True, text=True, env=env(), timeout=120
    ).stdout
    for opt in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert opt in helptext, f"{' '.join(sub)} has no option {opt}"


@by_lang("bash")
def test_bash_block_runs(block, tmp_path):
    _, line, code = block
    cwd = workdir(tmp_path)
    for argv in commands(code):
        where = f"README.md line {line}: {' '.join(argv)}"
        if argv[0] == "make":
            targets = argv[1:] or ["demo"]
            assert subprocess.run(["make", "-n", "-C", str(ROOT), *targets], capture_output=True).returncode == 0, where
        elif argv[0] in (".", "source") and argv[1:] == [".venv/bin/activate"]:
            assert (BIN / "activate").is_file(), where
        elif argv[0] in ("export", "mkdir"):
            continue
        elif argv[0] in FLOWER:
            check_flower(argv)
        elif argv[0] == "fedstats-certificates":  # runs: the keys and configuration the walk-through uses
            out = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=cwd, env=env(), capture_output=True, text=True)
            assert out.returncode == 0, f"{where}\n{out.stderr[-3000:]}"
        elif argv[0] == "fedstats-supernode":  # its own part runs (the list of approved apps), Flower's is checked
            cut = argv.index("--")
            out = subprocess.run(
                [str(BIN / argv[0]), *argv[1:cut], "--print-only"], cwd=cwd, env=env(), capture_output=True, text=True
            )
            assert out.returncode == 0 and "approved" in out.stdout, f"{where}\n{out.stderr[-3000:]}"
            check_flower(["flower-supernode", *argv[cut + 1 :]])
        elif argv[0] == "cp":
            assert (ROOT / argv[1]).is_file(), where
        elif argv[0] in (".venv/bin/fedstats", ".venv/bin/python", "python", "fedstats"):
            run = [sys.executable, "-m", "fedstats.cli"] if argv[0].endswith("fedstats") else [sys.executable]
            out = subprocess.run(run + argv[1:], cwd=cwd, env=env(), capture_output=True, text=True, timeout=900)
            assert out.returncode == 0, f"{where}\n{out.stderr[-3000:]}"
        else:
            pytest.fail(f"{where}: no rule in tests/test_readme.py for this command")


def test_walkthrough_data_converges_well_inside_the_budget(tmp_path):
    # The README's walk-through (default make_data.py, gmm with 3 components, tol 1e-6, at most
    # 100 rounds) computed in process: the deployment runs the same rounds (test above). The old
    # data (one blob) ran all 100 rounds; the separated clusters converge in 7.
    app = ROOT / "examples" / "flower_app"
    sys.path.insert(0, str(app))
    try:
        import make_data
    finally:
        sys.path.remove(str(app))
    make_data.write(tmp_path, seed=0)
    import numpy as np
    import pandas as pd

    from fedstats import FederatedData
    from fedstats.mixture import FederatedGaussianMixture

    df = pd.read_csv(tmp_path / "all_sites.csv")
    data = FederatedData.from_dataframe(df, by="site")
    res = FederatedGaussianMixture(3, tol=1e-6, rounds=100).fit(data, seed=0)
    assert res.converged and res.rounds <= 20, res
    w = np.stack([res.weights[c] for c in data.clients])
    assert np.all(w.max(axis=0) > 0.2)  # three real clusters, none empty
