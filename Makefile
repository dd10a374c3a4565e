# Everything a fresh Debian machine needs is installed by these targets themselves.
VENV    ?= .venv
PY      := $(VENV)/bin/python
AIRLOCK := $(VENV)/bin/airlockd
STAMP   := $(VENV)/.installed

.PHONY: setup engine image demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v python3 >/dev/null || (apt-get update -qq && apt-get install -y -qq python3 python3-venv)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

engine:
	./scripts/ensure-docker.sh

# --with-codex: also the image with the Codex CLI (npm install @openai/codex into a cache dir;
# npm must be installed: apt-get install npm). tests/integration/test_codex.py builds it too.
image: setup engine
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq npm)
	$(AIRLOCK) runtime build --with-codex

demo: image
	$(AIRLOCK) demo

lint: setup
	$(VENV)/bin/ruff check airlockd tests
	$(VENV)/bin/ruff format --check airlockd tests
	$(VENV)/bin/mypy

test: image lint
	$(VENV)/bin/pytest tests --ignore=tests/bench -q

bench: image
	$(VENV)/bin/pytest tests/bench -s -q

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
