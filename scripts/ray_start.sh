#!/usr/bin/env bash
# Start a Ray node with token authentication on: `ray start` with RAY_AUTH_MODE=token.
#
#   scripts/ray_start.sh --head                      # on the head: makes ~/.ray/auth_token if missing
#   scripts/ray_start.sh --address head:6379         # on every other node: needs the head's token
#
# Any other `ray start` flags pass through (--block, --dashboard-host, --resources, ...).
# Why not plain `ray start --head`: Ray 2.60 turns token auth on for `ray start` only where a
# token already exists; on a fresh machine it starts with an open Jobs API and GCS, and anyone
# who reaches them runs code on the cluster. With RAY_AUTH_MODE=token it refuses to start
# without a token instead, so the head makes one first.
#
# The token comes from where the Ray CLI looks: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH,
# else ~/.ray/auth_token. Opting out (a private network you trust) is explicit:
# RAY_AUTH_MODE=disabled in the environment, on every node and in the submitting shell.
#
# PYTHON  the interpreter whose `ray` runs (default: this checkout's .venv)
set -euo pipefail
PYTHON=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
RAY="$(dirname "$PYTHON")/ray"
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}

fail() { echo "ray_start.sh: $*" >&2; exit 1; }

if [[ "$RAY_AUTH_MODE" != token ]]; then
    echo "ray_start.sh: WARNING: RAY_AUTH_MODE=$RAY_AUTH_MODE: this node starts WITHOUT token" \
         "authentication; anyone who reaches its ports can run code on the cluster" >&2
elif [[ -z "${RAY_AUTH_TOKEN:-}" && -n "${RAY_AUTH_TOKEN_PATH:-}" && ! -s "$RAY_AUTH_TOKEN_PATH" ]]; then
    # (Ray would generate into ~/.ray/auth_token and still not find this one)
    fail "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH is missing or empty: put the cluster's token" \
         "there, or unset RAY_AUTH_TOKEN_PATH to use ~/.ray/auth_token"
elif [[ " $* " == *" --head "* ]]; then
    # a no-op where a token exists; a new one readable by this user only (Ray writes it 0644)
    (umask 077 && "$RAY" get-auth-token --generate >/dev/null)
elif ! "$RAY" get-auth-token >/dev/null 2>&1; then
    fail "this node has no Ray auth token: copy the head's ~/.ray/auth_token to ~/.ray/auth_token" \
         "here (mode 600), or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)"
fi
exec "$RAY" start "$@"
