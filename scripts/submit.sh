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
#
# It refuses a cluster without token authentication (start its head with scripts/ray_start.sh)
# unless RAY_AUTH_MODE=disabled says the open cluster is deliberate. The token comes from where
# the Ray CLI looks: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token.
set -euo pipefail
cd "$(dirname "$0")/.."
ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
[[ "$ADDRESS" == *://* ]] || ADDRESS="http://$ADDRESS"
PYTHON=${PYTHON:-$(pwd)/.venv/bin/python}
RAY="$(dirname "$PYTHON")/ray"

fail() { echo "submit.sh: $*" >&2; exit 1; }

# The head says whether it checks tokens (a public endpoint of Ray's dashboard).
mode=$("$PYTHON" - "$ADDRESS/api/authentication_mode" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=30) as reply:
        print(json.load(reply)["authentication_mode"])
except Exception as e:  # reported below, with the address
    print(f"unknown ({e})")
PY
)
case "$mode" in
token)
    # the CLI sends the token only when it is in token mode itself
    export RAY_AUTH_MODE=token
    "$RAY" get-auth-token >/dev/null 2>&1 || fail "the cluster at $ADDRESS requires a token and" \
        "this machine has none: copy the head's ~/.ray/auth_token to ~/.ray/auth_token here, or set" \
        "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)" ;;
disabled)
    [[ "${RAY_AUTH_MODE:-}" == disabled ]] || fail "the cluster at $ADDRESS runs WITHOUT token" \
        "authentication: its Jobs API runs anyone's code. Restart its head with" \
        "scripts/ray_start.sh --head (RAY_AUTH_MODE=token), or, on a network you trust, opt out" \
        "explicitly with RAY_AUTH_MODE=disabled"
    echo "submit.sh: WARNING: submitting to $ADDRESS without authentication (RAY_AUTH_MODE=disabled)" >&2 ;;
*)
    fail "cannot tell whether the cluster at $ADDRESS checks tokens: $ADDRESS/api/authentication_mode" \
        "answered $mode. Is RAY_ADDRESS the head's dashboard (port 8265)?" ;;
esac

RUNTIME_ENV=$(printf '{"working_dir": ".", "excludes": [".venv", "runs", "outputs", "wandb", ".git"], "env_vars": {"WANDB_MODE": "%s", "TRACERL_CACHE": "%s"}}' \
    "${WANDB_MODE:-offline}" "${TRACERL_CACHE:-$HOME/.cache/tracerl}")
# shellcheck disable=SC2086
exec "$RAY" job submit --address "$ADDRESS" --runtime-env-json "$RUNTIME_ENV" \
    ${SUBMIT_ARGS:-} -- "$PYTHON" scripts/train.py ray.address=auto "$@"
