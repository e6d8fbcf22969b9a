"""``import fedstats`` and the exact GLM stay light: they load neither scipy.stats (about a
second), nor jax, torch or the inference package (issue 46). Checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("scipy.stats", "jax", "torch", "numpyro", "gpytorch", "flwr", "fedstats.inference")


def loaded(code: str) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import fedstats",
        "import fedstats; from fedstats.glm import FederatedGLM",
        "from fedstats import FederatedData; from fedstats.glm import FederatedGLM, GLMResult",
        "import fedstats.stats, fedstats.survival",
        # the command line loads only the chosen model's packages
        "import contextlib, io\nfrom fedstats.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['fit', 'examples/sites.csv', '--by', 'site', '--target', 'y', '--model', 'glm', '--quiet'])",
    ],
)
def test_the_light_entry_points_load_no_heavy_package(code):
    assert loaded(code) == []


def test_the_lazy_names_still_resolve():
    code = (
        "import fedstats, fedstats.glm\n"
        "assert fedstats.HierarchicalLinearModel.__module__.startswith('fedstats.linear')\n"
        "assert fedstats.GaussianPosterior.__name__ == 'GaussianPosterior'\n"
        "from fedstats.glm import HierarchicalGLM, BayesianGLMResult\n"
        "assert HierarchicalGLM.__module__ == 'fedstats.glm.bayes'"
    )
    assert "fedstats.inference" in loaded(code)
    with pytest.raises(subprocess.CalledProcessError):
        loaded("import fedstats; fedstats.NoSuchThing")
