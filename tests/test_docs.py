"""Every code block of README.md and of the documentation's pages runs as written.

* ``python`` blocks of one page run in order in one fresh interpreter (a tutorial's blocks
  build on each other), whose working directory holds the repository's ``examples/`` (as the
  repository root does); a failure names the page and the block's line;
* ``bash`` blocks: every command runs (``.venv/bin/fedstats`` and ``.venv/bin/python`` as this
  interpreter), except ``make`` targets, which are checked with ``make -n`` (``make test``
  cannot run inside the test suite), and the Flower deployment's long-running servers
  (``flower-superlink``, ``flower-supernode``, ``flwr run``), whose executables and options are
  checked here and which ``make test-deployment`` runs for real
  (``tests/federation/test_flower_deployment.py``);
* ``toml`` blocks parse; ``text`` blocks are output shown as it prints.

A command this file does not know fails the test, so a new kind of command needs a rule here.
The pages of usage text hold no measured timing and no reference to the project's own history
(those live on the validation and benchmark pages, with their date, machine and command).
"""

from __future__ import annotations

import json
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
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
# pages whose text is generated elsewhere (the API reference from docstrings, the benchmark
# tables from benchmarks/results) hold no code blocks of their own
PAGES = [README] + sorted(p for p in DOCS.rglob("*.md") if p.parent.name not in ("api", "_ext"))
# where measured numbers belong
MEASUREMENT_PAGES = {DOCS / "validation", DOCS / "benchmarks"}


def blocks(page: Path) -> list[tuple[str, int, str]]:
    """(language, line number, code) of every fenced block of a page."""
    out, lang, start, body = [], None, 0, []
    for i, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, body = line[3:].strip() or "text", i, []
            else:
                out.append((lang, start, "\n".join(body)))
                lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{page.name}: block opened at line {start} is never closed"
    return out


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


BLOCKS = [(page, *b) for page in PAGES for b in blocks(page)]
KNOWN = {"python", "bash", "toml", "text"}


def by_lang(lang):
    sel = [b for b in BLOCKS if b[1] == lang]
    return pytest.mark.parametrize("block", sel, ids=[f"{name(b[0])}:{b[2]}" for b in sel])


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def env() -> dict:
    e = dict(os.environ, MPLBACKEND="Agg", PYTHONWARNINGS="ignore")
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    return e


def test_blocks_have_known_languages():
    assert [b for b in BLOCKS if b[0] == README], "README.md has no code blocks"
    unknown = {(name(b[0]), b[1]) for b in BLOCKS if b[1] not in KNOWN}
    assert not unknown, unknown


def test_no_references_to_files_outside_the_repository():
    for page in PAGES:
        assert "spec §" not in page.read_text(), name(page)


# Runs a page's python blocks in order in one namespace; each compiled under the page's name
# and the block's line, so a traceback says where it failed.
RUNNER = """
import json, sys
ns = {"__name__": "__main__"}
for where, code in json.load(sys.stdin):
    exec(compile(code, where, "exec"), ns)
"""

PY_PAGES = [p for p in PAGES if any(b[0] == p and b[1] == "python" for b in BLOCKS)]


@pytest.mark.parametrize("page", PY_PAGES, ids=[name(p) for p in PY_PAGES])
def test_python_blocks_run(page, tmp_path):
    code = [(f"{name(page)} line {line}", body) for p, lang, line, body in BLOCKS if p == page and lang == "python"]
    out = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(code),
        cwd=workdir(tmp_path),
        env=env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, f"{name(page)}:\n{out.stderr[-4000:]}"


@by_lang("toml")
def test_toml_block_parses_and_is_the_shipped_config(block):
    doc = tomllib.loads(block[3])
    if "superlink" in doc:  # the Flower configuration the walk-through copies
        assert doc == tomllib.loads((ROOT / "examples/flower_app/config.toml").read_text())
    else:  # a node's release policy: a valid one
        from fedstats.federation import NodePolicy

        assert NodePolicy.from_toml(block[3]).min_rows >= 1


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
    page, _, line, code = block
    cwd = workdir(tmp_path)
    for argv in commands(code):
        where = f"{name(page)} line {line}: {' '.join(argv)}"
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


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 220


# A measured duration ("5 s", "0.4 seconds", "3.2 minutes", "12x faster") or the project's own
# history ("issue 40", "the gate", "before this release", "the previous default").
TIMING = re.compile(
    r"\b\d+(?:\.\d+)?\s(?:ms|s|sec|seconds?|min|minutes?|hours?)\b(?![-\w])|\b\d+(?:\.\d+)?x (?:faster|slower)\b"
)
HISTORY = re.compile(
    r"\bissues?\b|\bgate\b|\bthis release\b|\bearlier release|\bprevious (?:record|default|version|run)"
    r"|\bfirst version\b|\bwas wrong\b|\bbefore this\b",
    re.IGNORECASE,
)


def usage_pages() -> list[Path]:
    return [p for p in PAGES if not any(d in p.parents for d in MEASUREMENT_PAGES)]


@pytest.mark.parametrize("page", usage_pages(), ids=[name(p) for p in usage_pages()])
def test_usage_text_has_no_timings_and_no_history(page):
    found = []
    for i, line in enumerate(page.read_text().splitlines(), 1):
        line = re.sub(r"`[^`]*`", "``", line)  # code spans: names and formulas (`sd^2 s`)
        for pattern in (TIMING, HISTORY):
            found += [f"line {i}: {m.group(0)!r} in {line.strip()[:100]!r}" for m in pattern.finditer(line)]
    assert not found, "\n".join(found)


def test_measured_pages_say_when_where_and_how():
    # every validation page names its dates, its machine and the command that made its numbers
    for page in sorted((DOCS / "validation").glob("*.md")):
        text = page.read_text()
        if page.name == "index.md":
            continue
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page.name}: no date"
        assert "cores" in text, f"{page.name}: no machine"
        assert re.search(r"`(?:\.venv/bin/)?(?:python|pytest|make|fedstats)\b[^`]*`", text), f"{page.name}: no command"


CHOOSER = DOCS / "chooser.md"


@pytest.mark.parametrize(
    "question, page",
    [
        ("logistic regression across hospitals", "tutorials/glm.md"),
        ("hierarchical regression with client posteriors", "tutorials/regression.md"),
        ("is the effect different from zero", "tutorials/hypothesis-tests.md"),
        ("multi-fidelity surrogate", "tutorials/multifidelity.md"),
    ],
)
def test_the_chooser_answers_in_one_click(question, page):
    # the question's row in the chooser links straight to its page, which exists
    rows = [line for line in CHOOSER.read_text().splitlines() if line.startswith("|") and question in line.lower()]
    assert rows, f"no row of the chooser asks {question!r}"
    assert f"]({page})" in rows[0], rows[0]
    assert (DOCS / page).is_file()


def test_every_image_a_page_shows_is_there_and_the_plots_page_makes_its_own():
    for page in PAGES:
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{name(page)} shows {target}, which is missing"
    # the figures of the plots page are what its code writes (regenerate them by running its
    # blocks in docs/img/plots when the plots change)
    plots_page = (DOCS / "how-to" / "plots.md").read_text()
    written = set(re.findall(r'savefig\("([^"]+)"', plots_page))
    shown = {Path(t).name for t in re.findall(r"\]\(\.\./img/plots/([^)]+)\)", plots_page)}
    assert written == shown and written <= {p.name for p in (DOCS / "img" / "plots").iterdir()}


def test_the_api_reference_cites_no_issue_of_the_project():
    # the API pages are the docstrings: they cite the papers, never the project's tracker
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted((ROOT / "fedstats").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bissue (?:\d+|'s)", line, re.IGNORECASE)
    ]
    assert not hits, hits
