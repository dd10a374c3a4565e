# Everything a fresh Debian machine needs is installed by these targets themselves.
VENV    ?= .venv
PY      := $(VENV)/bin/python
AIRLOCK := $(VENV)/bin/airlockd
STAMP   := $(VENV)/.installed
# Where `make setup` puts the `airlockd` launcher (empty: /usr/local/bin as root, else ~/.local/bin).
BINDIR  ?=

.PHONY: setup unlink uninstall engine image demo test lint bench clean vscode code-server protocol

# The virtualenv, then a launcher for its airlockd on the user's PATH (scripts/install-launcher.sh).
setup: $(STAMP)
	@AIRLOCK_VENV='$(abspath $(VENV))' AIRLOCK_BIN_DIR='$(BINDIR)' ./scripts/install-launcher.sh install

# Removes that launcher (only ours; the clone and its virtualenv stay).
unlink uninstall:
	@AIRLOCK_BIN_DIR='$(BINDIR)' ./scripts/install-launcher.sh uninstall

$(STAMP): pyproject.toml
	@command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq python3 python3-venv)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

engine:
	./scripts/ensure-docker.sh

# cc: the image's gVisor compatibility library (runtime/compat/, airlockd/sandbox/compat.py).
# --with codex,claude,opencode,gemini,aider: also an image with each agent CLI (npm install of the
# pinned package into a cache dir, pip for Aider; npm must be installed: apt-get install npm).
# Their tests build them too.
image: setup engine
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq npm)
	@command -v cc >/dev/null && test -e /usr/include/fcntl.h || (apt-get update -qq && apt-get install -y -qq gcc libc6-dev)
	$(AIRLOCK) runtime build --with codex,claude,opencode,gemini,aider

demo: image
	$(AIRLOCK) demo

# The second mypy holds the unit tests' fake sandbox (and the contract suite run against it and
# the engine) to the Sandbox Protocol.
lint: setup
	$(VENV)/bin/ruff check airlockd tests
	$(VENV)/bin/ruff format --check airlockd tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m airlockd.schema --check $(SCHEMA)
	$(VENV)/bin/mypy tests/unit/fakesandbox.py tests/contract/test_sandbox_contract.py

# Then the integration suite once more as a user who is not root, in group docker, on the first
# engine (tests/as_user.py; as such a user `make test` runs everything once, as that user). Not
# there: building the runtime image (debootstrap: setup, root's), the engines only root starts, and
# test_daemon_nonroot.py and test_codex.py (the first pass runs both as that user already).
test: image lint vscode code-server
	$(VENV)/bin/pytest tests --ignore=tests/bench -q
	$(PY) tests/as_user.py tests/integration -q --ignore=tests/integration/test_image.py \
		--ignore=tests/integration/test_remote_engine.py --ignore=tests/integration/test_daemon_nonroot.py \
		--ignore=tests/integration/test_codex.py

# The VS Code extension (editors/vscode): npm ci from the committed lock file (which records no
# download address: editors/vscode/.npmrc sets omit-lockfile-registry-resolved), tsc --strict,
# node --test unit and glue tests, the esbuild bundle and `vsce package` -> out/airlockd.vsix.
VSCODE := editors/vscode

# The wire: airlockd/protocol.py -> JSON Schema -> the extension's TypeScript types, both committed
# and both checked (`lint` the schema, `vscode` the TypeScript); `make protocol` regenerates them.
SCHEMA := $(VSCODE)/schema/airlock.schema.json
PROTOCOL_TS := $(VSCODE)/src/logic/protocol.gen.ts

protocol: setup $(VSCODE)/node_modules/.ci-stamp
	$(PY) -m airlockd.schema --schema > $(SCHEMA)
	cd $(VSCODE) && npm run --silent protocol < schema/airlock.schema.json > src/logic/protocol.gen.ts

$(VSCODE)/node_modules/.ci-stamp: $(VSCODE)/package.json $(VSCODE)/package-lock.json
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq npm)
	@! grep -n '"resolved"' $(VSCODE)/package-lock.json || (echo "$(VSCODE)/package-lock.json records download addresses" >&2; false)
	cd $(VSCODE) && npm ci --no-fund --no-audit --loglevel=error
	@touch $@

vscode: $(VSCODE)/node_modules/.ci-stamp
	@cd $(VSCODE) && npm run --silent protocol < schema/airlock.schema.json | diff -u src/logic/protocol.gen.ts - \
		|| (echo "$(PROTOCOL_TS) is out of date with $(SCHEMA): run \`make protocol\` and commit both" >&2; false)
	cd $(VSCODE) && npx tsc -p .
	cd $(VSCODE) && npm run --silent test:unit
	cd $(VSCODE) && npm run --silent test:glue
	cd $(VSCODE) && npm run --silent package

# Node 24, code-server and Debian's chromium for tests/editors/test_vscode_e2e.py, cached outside
# the repository (a second run installs nothing).
code-server:
	./scripts/ensure-code-server.sh >/dev/null

bench: image
	$(VENV)/bin/pytest tests/bench -s -q

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
