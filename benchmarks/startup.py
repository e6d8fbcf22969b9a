"""What a user waits for around the arithmetic: import times per entry point, and the command line's
wall time per model on the examples (a first and a second run).

Imports: each entry point in a fresh interpreter, the best of ``--repeats`` (default 5) wall
times of the whole process (interpreter start included), beside ``import pandas`` measured the
same way in the same run; the ratio is the entry point's time over pandas'. Each also lists the
heavy packages it loaded (scipy.stats, jax, torch, numpyro, gpytorch, flwr, fedstats.inference).

Command line: ``fedstats fit`` of every model on ``examples/`` (the commands of the docs'
command-line page), twice in a row, each a fresh process: ``first`` and ``second`` wall seconds.
Writes ``benchmarks/results/startup.json`` and ``.md`` (``startup_quick.*`` with ``--quick``: the
imports and two models).

    python benchmarks/startup.py [--quick] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _measure import record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
HEAVY = ("scipy.stats", "jax", "torch", "numpyro", "gpytorch", "flwr", "fedstats.inference")

ENTRY_POINTS = {
    "import pandas (reference)": "import pandas",
    "import fedstats": "import fedstats",
    "import fedstats; from fedstats.glm import FederatedGLM": "import fedstats; from fedstats.glm import FederatedGLM",
    "import fedstats.stats": "import fedstats.stats",
    "import fedstats.survival": "import fedstats.survival",
    "from fedstats import HierarchicalLinearModel": "from fedstats import HierarchicalLinearModel",
    "from fedstats.glm import HierarchicalGLM": "from fedstats.glm import HierarchicalGLM",
    "from fedstats.mixture import FederatedGaussianMixture": "from fedstats.mixture import FederatedGaussianMixture",
    "from fedstats.gp import FGPR": "from fedstats.gp import FGPR",
    "import fedstats.cli": "import fedstats.cli",
}

_SITES = ["examples/sites.csv", "--by", "site", "--target", "y"]
_EVENTS = ["examples/events.csv", "--by", "clinic", "--target", "sick", "--features", "age", "smoker"]
COMMANDS = {
    "hm2": [*_SITES, "--model", "hm2"],
    "lasso": [*_SITES, "--model", "lasso"],
    "ridge": [*_SITES, "--model", "ridge"],
    "hm1": [*_SITES, "--model", "hm1"],
    "glm": [*_EVENTS, "--model", "glm", "--family", "binomial"],
    "bglm": [*_EVENTS, "--model", "bglm", "--family", "binomial"],
    "hglm": [*_EVENTS, "--model", "hglm", "--family", "binomial"],
    "fgpr": [*_SITES, "--model", "fgpr"],
    "gmm": ["examples/sites.csv", "--by", "site", "--features", "x1", "x2", "--model", "gmm", "--components", "3"],
}


def import_time(code: str, repeats: int) -> tuple[float, list[str]]:
    """The best wall time of ``python -c code`` and the heavy packages it loaded."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    best, heavy = float("inf"), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
        best = min(best, time.perf_counter() - t0)
        heavy = json.loads(out.stdout.strip().splitlines()[-1])
    return best, heavy


def cli_time(args: list[str], out: Path) -> float:
    cmd = [sys.executable, "-m", "fedstats.cli", "fit", *args, "--quiet", "--output", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the imports and two models")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    imports = []
    for name, code in ENTRY_POINTS.items():
        seconds, heavy = import_time(code, a.repeats)
        imports.append({"entry": name, "seconds": round(seconds, 3), "heavy": heavy})
        print(imports[-1], flush=True)
    ref = imports[0]["seconds"]
    for r in imports:
        r["ratio"] = round(r["seconds"] / ref, 2)
    cli = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, args in list(COMMANDS.items())[: 2 if a.quick else None]:
            first = cli_time(args, Path(tmp) / f"{model}.json")
            second = cli_time(args, Path(tmp) / f"{model}.json")
            cli.append({"model": model, "first_s": round(first, 2), "second_s": round(second, 2)})
            print(cli[-1], flush=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "quick": a.quick,
        "repeats": a.repeats,
        **record(),
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "startup_quick" if a.quick else "startup"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "imports": imports, "cli": cli}, indent=2))
    lines = [
        f"# Start-up: imports and the command line ({meta['machine']})",
        "",
        f"Imports: each entry point in a fresh interpreter, best of {a.repeats} wall times of the whole process; "
        "ratio: over `import pandas` in the same run; heavy: the heavy packages it loaded.",
        "",
        "| entry point | seconds | ratio to pandas | heavy packages loaded |",
        "|---|---|---|---|",
        *(
            f"| `{r['entry']}` | {r['seconds']:.3f} | {r['ratio']:.2f} | {', '.join(r['heavy']) or 'none'} |"
            for r in imports
        ),
        "",
        "Command line: `fedstats fit` on the examples, each run a fresh process, twice in a row.",
        "",
        "| model | first run s | second run s |",
        "|---|---|---|",
        *(f"| {r['model']} | {r['first_s']:.2f} | {r['second_s']:.2f} |" for r in cli),
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
