#!/usr/bin/env bash
# Submit the training job to a running Ray cluster (Ray Jobs), with the same hydra overrides
# as a local run; the job's driver joins the cluster (ray.address=auto).
#
#   RAY_ADDRESS=http://head:8265 scripts/submit.sh cluster=multinode_gpu model=... trainer.steps=500
#
# RAY_ADDRESS  the head's job server (default http://127.0.0.1:8265)
# PYTHON       the interpreter the job runs on the cluster (default: this checkout's .venv;
#              every node needs tracerl installed at the same path, e.g. the docker images)
# SUBMIT_ARGS  extra `ray job submit` flags, e.g. --no-wait
set -euo pipefail
cd "$(dirname "$0")/.."
ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
PYTHON=${PYTHON:-$(pwd)/.venv/bin/python}
# Ray's token authentication stays on: the CLI reads the token from ~/.ray/auth_token (or
# RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH), the job's driver inherits the cluster's settings.
RUNTIME_ENV=$(printf '{"working_dir": ".", "excludes": [".venv", "runs", "outputs", "wandb", ".git"], "env_vars": {"WANDB_MODE": "%s", "TRACERL_CACHE": "%s"}}' \
    "${WANDB_MODE:-offline}" "${TRACERL_CACHE:-$HOME/.cache/tracerl}")
# shellcheck disable=SC2086
exec "$(dirname "$PYTHON")/ray" job submit --address "$ADDRESS" --runtime-env-json "$RUNTIME_ENV" \
    ${SUBMIT_ARGS:-} -- "$PYTHON" scripts/train.py ray.address=auto "$@"
