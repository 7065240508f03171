# tracerl: every target installs into .venv first (scripts/setup.sh is a no-op when up to date).
#   make train   # the main training job on the embedded default (CPU, in-process Ray)
#   make test    # the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
export TRACERL_CACHE ?= $(HOME)/.cache/tracerl
export RAY_AUTH_MODE ?= disabled
export WANDB_MODE ?= offline

.PHONY: setup test test-fast train rollout bench clean

setup:
	@bash scripts/setup.sh

test: setup
	$(PY) -m pytest tests -q $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests -q -m "not slow" $(PYTEST_ARGS)

# Until the training loop lands, `make train` generates solver_verifier traces
# with SmolLM2-135M through the full rollout path.
train: setup
	$(PY) scripts/rollout.py model=smollm2_135m harness=solver_verifier task=chain_sum \
		rollout.num_traces=16 out=runs/traces.jsonl $(ARGS)

bench: setup
	$(PY) scripts/bench/rollout.py
	$(PY) scripts/bench/learner.py

clean:
	rm -rf $(VENV) .pytest_cache
