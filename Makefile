# The README's commands. Every target creates (or reuses) the virtual environment .venv
# and installs the project with the exact test versions of constraints.txt.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-deployment test-deployment-full bench install clean lint docs

$(STAMP): pyproject.toml constraints.txt oracles.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,flower,docs,privacy,bo,plots]"
	$(BIN)/python -m pip install --quiet --no-deps -r oracles.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedstats demo

lint: $(STAMP)
	$(BIN)/ruff check fedstats tests benchmarks examples docs
	$(BIN)/ruff format --check fedstats tests benchmarks examples docs
	$(BIN)/mypy

# the documentation site (mkdocs.yml, docs/) into site/; --strict: any warning (a docstring
# griffe cannot parse, a broken link or anchor) fails the build. NO_MKDOCS_2_WARNING silences
# mkdocs-material's notice that it reaches end of life on May 5, 2027 (successor: Zensical).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: $(STAMP)
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# a real Flower deployment on 127.0.0.1 (TLS, registered SuperNodes, approved apps, flwr run): about 30 minutes on 2 cores
test-deployment: $(STAMP)
	$(BIN)/python -m pytest -m "slow and not full_deployment" tests/federation/test_flower_deployment.py

# every deployment check, secure aggregation of each model included (about 30 minutes)
test-deployment-full: $(STAMP)
	$(BIN)/python -m pytest -m slow tests/federation/test_flower_deployment.py

# every benchmark but fem_omd_defaults.py (about 30 minutes on 2 cores: run it on its own),
# then one table of every ratio with its peak memory (benchmarks/results/summary.md)
bench: $(STAMP)
	$(BIN)/python benchmarks/ep_vs_pooled.py
	$(BIN)/python benchmarks/many_predictors.py
	$(BIN)/python benchmarks/shrinkage_vs_pooled.py
	$(BIN)/python benchmarks/hm1.py
	$(BIN)/python benchmarks/hm1_defaults.py
	$(BIN)/python benchmarks/fgpr.py
	$(BIN)/python benchmarks/fgpr_large.py
	$(BIN)/python benchmarks/fedem.py
	$(BIN)/python benchmarks/fem_omd.py
	$(BIN)/python benchmarks/glm.py
	$(BIN)/python benchmarks/dp_glm.py
	$(BIN)/python benchmarks/dp_fedem.py
	$(BIN)/python benchmarks/glm_hierarchical.py
	$(BIN)/python benchmarks/flower_overhead.py
	$(BIN)/python benchmarks/stats.py
	$(BIN)/python benchmarks/summary.py

clean:
	rm -rf $(VENV) .pytest_cache site
