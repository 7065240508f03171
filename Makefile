# tracerl: every target installs into .venv first (scripts/setup.sh is a no-op when up to date).
#   make train   # the main training job on the embedded default (CPU, in-process Ray)
#   make test       # the product's test suite: every tier (unit, integration, e2e; see pyproject.toml), on vLLM's CPU build
#   make test-fast  # unit + integration: only the session's shared engines, nothing started per test
#   make test-studies  # the research studies' tests (tests/studies/, mark `studies`), their quick runs included
#   make lint       # ruff (lint + format check), the import layers (import-linter) and the harness types (mypy); CI runs it after make test
VENV ?= .venv
PY := $(VENV)/bin/python
export TRACERL_CACHE ?= $(HOME)/.cache/tracerl
export WANDB_MODE ?= offline

.PHONY: setup test test-fast test-studies lint train smoke bench bench-quick gpu-check clean

setup:
	@bash scripts/setup.sh

# The suite runs on vLLM's CPU build on every machine (docs/clusters.md, "Tests on a GPU machine"): in
# $(VENV) on a CPU one; on a GPU one, whose $(VENV) holds the CUDA build, in a CPU install beside it,
# $(VENV)-cpu. `setup.sh --tests` installs the right one and prints its python.
TEST_PY = $$(VENV=$(VENV) bash scripts/setup.sh --tests)

# The studies' tests (mark `studies`: tests/studies/) are left to `make test-studies`. The session ends with
# its time in yardsticks (tests/yardstick.py: the budget, 600, is in a unit of the box) and its peak memory.
test:
	@py=$(TEST_PY) && set -x && TRACERL_YARDSTICK=1 $$py -m pytest tests -q --durations=40 -m "not studies" $(PYTEST_ARGS)

# Everything but the e2e tier (whole training / generation runs, job scripts, fault runs) and the studies.
test-fast:
	@py=$(TEST_PY) && set -x && $$py -m pytest tests -q -m "(unit or integration) and not studies" $(PYTEST_ARGS)

# The research studies (studies/): their statistics, drivers and results check, and their quick runs on the
# tiny model in the background lane (the team study's and the relay's main runs, a relay pilot condition).
test-studies:
	@py=$(TEST_PY) && set -x && TRACERL_YARDSTICK=1 $$py -m pytest tests/studies -q --durations=20 -m studies $(PYTEST_ARGS)

# ruff's rules and format, the import layers, and the harness API's types: harnesses/base.py and the programs
# (pyproject.toml: [tool.ruff], [tool.importlinter], [tool.mypy]).
lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports && $(VENV)/bin/mypy

# SmolLM2-135M-Instruct as solver and verifier on reasoning-gym chain_sum (conf/experiment/).
train: setup
	$(PY) scripts/train.py experiment=smollm2_solver_verifier $(ARGS)

# The tiny-model run the end-to-end test uses (a few minutes).
smoke: setup
	$(PY) scripts/train.py experiment=smoke run_dir=runs/smoke $(ARGS)

# The benches are modules of tools/bench/, run from the checkout (tools/ is not in the wheel).
bench: setup
	$(PY) -m tools.bench.rollout_path
	$(PY) -m tools.bench.learner
	$(PY) -m tools.bench.bf16
	$(PY) -m tools.bench.e2e

# Every bench once with --quick (tiny model, a few iterations; ~10 minutes on 2 cores): each one's JSON line.
# tools/bench/reference.py is what they measure against, not a bench.
bench-quick: setup
	@log=$$(mktemp); for f in tools/bench/*.py; do b=$$(basename $$f .py); \
	  case $$b in __init__|reference) continue;; esac; echo "== tools.bench.$$b --quick"; \
	  $(PY) -m tools.bench.$$b --quick > $$log 2>&1 || { tail -40 $$log; rm -f $$log; exit 1; }; tail -1 $$log; \
	done; rm -f $$log

# The GPU readiness check (tools/gpu_check/): no setup first, its transport stage needs only torch. Its stage
# runner is standard library only (any python3); the stages run in PYTHON (.venv/bin/python if there).
gpu-check:
	python3 -m tools.gpu_check

clean:
	rm -rf $(VENV) $(VENV)-cpu .pytest_cache
