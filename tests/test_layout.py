"""The codebase's layout rules (issue 20): a module of fedstats/ stays within 600 lines (a module
listed in TO_SPLIT may exceed it up to its entry until it is split, and never grow), and
docstrings state what they mean or cite the papers instead of pointing at the specs, which are
not part of the repository ("spec §4.2", "spec ``fgpr.md`` §5", "fedem.md")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "fedstats"
LIMIT = 600
#: modules still over the limit, with the most lines they may have until they are split
TO_SPLIT: dict[str, int] = {}
#: a citation of the specs: "spec §4.2", "spec ``fgpr.md`` §5", "(fedem.md §1.8)"
SPEC = re.compile(r"\bspec\b[^\n]{0,20}§|\b(?:linear|fgpr|fedem)\.md\b")
#: modules that may still cite the specs, with how many times
SPEC_CITATIONS: dict[str, int] = {}


def modules():
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in ROOT.rglob("*.py")}


def test_modules_stay_within_their_line_limits():
    sizes = {name: text.count("\n") + (not text.endswith("\n")) for name, text in modules().items()}
    over = {name: n for name, n in sizes.items() if n > TO_SPLIT.get(name, LIMIT)}
    assert not over, f"modules over their limit ({LIMIT} lines, or their entry in TO_SPLIT): {over}"
    done = [name for name, cap in TO_SPLIT.items() if sizes.get(name, 0) <= LIMIT]
    assert not done, f"within {LIMIT} lines now: remove them from TO_SPLIT: {done}"


def test_docstrings_do_not_cite_the_specs():
    counts = {name: len(SPEC.findall(text)) for name, text in modules().items()}
    extra = {name: n for name, n in counts.items() if n > SPEC_CITATIONS.get(name, 0)}
    assert not extra, f"'spec §' references (state the point or cite the paper instead): {extra}"


def test_docstring_examples_run_in_the_default_suite():
    """pytest collects every docstring example of fedstats/ (--doctest-modules over the package)."""
    import tomllib

    cfg = tomllib.loads((ROOT.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert "fedstats" in cfg["testpaths"] and "--doctest-modules" in cfg["addopts"]
    examples = sum(text.count(">>> ") for text in modules().values())
    assert examples > 150, examples


def test_no_test_imports_another_test_module():
    """Tests share fixtures through conftest.py; none imports a test module (test_*.py)."""
    import ast

    tests = ROOT.parent / "tests"
    names = {p.stem for p in tests.rglob("test_*.py")}
    found = []
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            found += [f"{path.relative_to(tests)}: {m}" for m in mods if m.split(".")[-1] in names]
    assert not found, f"tests importing test modules: {found}"
