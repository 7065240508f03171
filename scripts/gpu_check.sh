#!/usr/bin/env bash
# GPU readiness check (issue 27): one prepared script for a GPU machine, in stages. Each stage runs
# in a process group of its own with a deadline inside the total budget, and leaves a record in
# $OUT/summary.json (status ok|failed|timeout|skipped, seconds, reason, details) even when it is
# skipped or fails; the summary is rewritten after every stage and ends with a verdict block.
#
#   bash scripts/gpu_check.sh                                      # every stage
#   STAGES=env,transport,ipc DEVICE=cpu bash scripts/gpu_check.sh  # the CPU form, as CI runs it
#   STAGES=smoke bash scripts/gpu_check.sh                         # a second run on a kept machine
#
# Stages, always in this order (STAGES picks some, comma- or space-separated; default all):
#   env        nvidia-smi, driver, python, torch (CUDA, devices), gcc, package registry reachable?
#   transport  scripts/gpu_check_transport.py: torch, rollout/engine/weight_group.py and
#              trainer/weight_transport.py only, so it runs on a box that has nothing but torch;
#              writes $OUT/transport.json
#   ipc        scripts/gpu_check_ipc.py: the same-GPU (CUDA IPC) path as production uses it (the plan
#              relayed, members that keep tensors, two members, reopen, a member's death, vLLM-like
#              neighbours, memory fit, allocator settings, big layouts, two NCCL ranks on one GPU),
#              torch only; writes $OUT/ipc.json
#   stack      scripts/gpu_check_stack.py (needs vllm, ray, deepspeed: make setup): one engine, one
#              learner rank, a push through the policy's weight sync, engine/learner log-prob parity
#   smoke      scripts/train.py experiment=smoke, 3 steps (cluster=gpu on a GPU: one GPU shared)
# Environment: OUT (./gpu_check_out), BUDGET_S (480), DEVICE (cuda when torch sees a GPU, else cpu),
# PYTHON (.venv/bin/python if there, else python3), SMOKE_ARGS (more hydra overrides for smoke).
# Exit status: 0 unless a stage failed or ran out of time; 2 for an unknown stage.
set -uo pipefail

ALL_STAGES=(env transport ipc stack smoke)
declare -A MAX_S=([env]=90 [transport]=150 [ipc]=300 [stack]=300 [smoke]=360)  # a stage's own deadline
declare -A MIN_S=([env]=10 [transport]=10 [ipc]=30 [stack]=60 [smoke]=60)  # less budget left than this: skipped
LOG_CAP=200000  # bytes of a stage's log kept (its head and its tail)

# ---------------------------------------------------------------- the stages (each in its own group)
stage_env() {
    local registry=reachable pip_out
    pip_out=$(timeout 30 "$PY" -m pip index versions pip --retries 0 --timeout 5 2>&1) || registry=unreachable
    [[ $pip_out == *"No module named pip"* ]] && registry="unknown (no pip)"
    REGISTRY=$registry GPUS=$(timeout 20 nvidia-smi -L 2>&1) \
    DRIVER=$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1) \
    GCC=$(gcc --version 2>&1 | head -n1) PYV=$("$PY" -V 2>&1) \
    TORCH=$(timeout 60 "$PY" -c 'import json, torch
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available(),
                  "count": torch.cuda.device_count(),
                  "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))' 2>&1 | tail -n1) \
    python3 - "$OUT/env.json" <<'PY'
import json, os, sys
def jsonish(text):
    try:
        return json.loads(text)
    except ValueError:
        return {"error": text[-500:]}
smi = os.environ["GPUS"].splitlines()
gpus = [line for line in smi if line.startswith("GPU ")]
env = {"gpus": gpus, "driver": os.environ["DRIVER"].splitlines()[0] if gpus else None,
       "nvidia_smi_error": None if gpus else "\n".join(smi)[-300:], "python": os.environ["PYV"],
       "torch": jsonish(os.environ["TORCH"]), "gcc": os.environ["GCC"], "registry": os.environ["REGISTRY"]}
with open(sys.argv[1], "w") as f:
    json.dump(env, f, indent=1)
print(json.dumps(env))
PY
}

stage_transport() {
    "$PY" scripts/gpu_check_transport.py --device "$DEVICE" --out "$OUT"
}

stage_ipc() {
    "$PY" scripts/gpu_check_ipc.py --device "$DEVICE" --out "$OUT"
}

NO_STACK=99  # a stage's exit status when the interpreter lacks vllm, ray or deepspeed: skipped
needs_stack() {
    timeout 120 "$PY" -c 'import vllm, ray, deepspeed' || exit $NO_STACK
}

stage_stack() {
    needs_stack
    "$PY" scripts/gpu_check_stack.py --device "$DEVICE" --out "$OUT/stack.json"
}

stage_smoke() {
    local run rc
    needs_stack
    run=$(mktemp -d)
    local args=(experiment=smoke trainer.steps=3 eval.size=8 "run_dir=$run/run")
    [[ $DEVICE == cuda ]] && args+=(cluster=gpu)
    # shellcheck disable=SC2206  # SMOKE_ARGS: hydra overrides, one word each
    args+=(${SMOKE_ARGS:-})
    echo "[gpu-check] scripts/train.py ${args[*]}"
    "$PY" scripts/train.py "${args[@]}"
    rc=$?
    python3 - "$run/run" "$OUT/smoke.json" "${args[*]}" <<'PY'
import json, pathlib, sys
run, out, args = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else None
json.dump({"args": args, "metrics_rows": len(rows), "last_metrics": json.loads(rows[-1]) if rows else None,
           "summary": summary}, open(out, "w"), indent=1)
PY
    rm -rf "$run"
    return $rc
}

if [[ ${1:-} == __stage ]]; then  # `run_stage` re-enters here: one stage in its own process group
    cd "$ROOT" && "stage_$2"
    exit $?
fi

# ---------------------------------------------------------------- the driver
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF=$ROOT/scripts/gpu_check.sh
mkdir -p "${OUT:=gpu_check_out}" && OUT=$(cd "$OUT" && pwd)
BUDGET_S=${BUDGET_S:-480}
STAGES=${STAGES:-all}
read -ra WANTED <<< "${STAGES//,/ }"
for s in "${WANTED[@]}"; do
    if [[ $s != all && " ${ALL_STAGES[*]} " != *" $s "* ]]; then
        echo "gpu_check.sh: unknown stage '$s' in STAGES=$STAGES; the stages are: ${ALL_STAGES[*]} (or all)" >&2
        exit 2
    fi
done
cd "$ROOT" || exit 2
PY=${PYTHON:-}
[[ -z $PY && -x .venv/bin/python ]] && PY=$ROOT/.venv/bin/python
PY=${PY:-python3}
RUN_ID="$$-$(date +%s%N)"
export ROOT OUT PY PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline \
    TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=1
rm -rf "$OUT/stages" "$OUT/summary.json" "$OUT"/{env,transport,ipc,stack,smoke}.{json,log}
mkdir -p "$OUT/stages"

wanted() { [[ " ${WANTED[*]} " == *" all "* || " ${WANTED[*]} " == *" $1 "* ]]; }
left() { echo $(( BUDGET_S - SECONDS )); }

record() {  # NAME STATUS SECONDS REASON
    python3 -c 'import json, sys; json.dump({"status": sys.argv[2], "seconds": int(sys.argv[3]), "reason": sys.argv[4]},
                open(sys.argv[1], "w"))' "$OUT/stages/$1.json" "$2" "$3" "$4"
}

cap_log() {  # keep the head and the tail of a long log
    local f=$1
    (( $(stat -c %s "$f") > LOG_CAP )) || return 0
    { head -c $(( LOG_CAP / 10 )) "$f"; printf '\n[gpu-check] ... log cut to its head and tail ...\n'
      tail -c $(( LOG_CAP * 9 / 10 )) "$f"; } > "$f.cut" && mv "$f.cut" "$f"
}

reap() {  # end what a stage left behind (Ray and vLLM daemons may leave its group): its marker
    local p
    for p in /proc/[0-9]*; do
        grep -qsaF "TRACERL_GPU_CHECK=$1" "$p/environ" && kill -KILL "${p#/proc/}" 2>/dev/null
    done
}

run_stage() {  # NAME LIMIT_S: the stage under `timeout`, which gives it a process group and ends it
    local name=$1 limit=$2 t0=$SECONDS rc
    echo "[gpu-check] $name: up to ${limit}s (log: $OUT/$name.log)"
    TRACERL_GPU_CHECK="$RUN_ID-$name" timeout -k 10 "$limit" bash "$SELF" __stage "$name" > "$OUT/$name.log" 2>&1
    rc=$?
    reap "$RUN_ID-$name"
    cap_log "$OUT/$name.log"
    case $rc in
        0) record "$name" ok $(( SECONDS - t0 )) "" ;;
        "$NO_STACK") record "$name" skipped $(( SECONDS - t0 )) \
            "$PY cannot import vllm, ray, deepspeed (see $name.log): install the stack first (make setup)" ;;
        124|137) record "$name" timeout $(( SECONDS - t0 )) "ended at its deadline of ${limit}s" ;;
        *) record "$name" failed $(( SECONDS - t0 )) "exit status $rc (see $name.log)" ;;
    esac
}

skip_reason() {  # why a stage does not run ("" when it does)
    local name=$1
    if ! wanted "$name"; then
        echo "not in STAGES=$STAGES"
    elif (( $(left) - 5 < MIN_S[$name] )); then
        echo "out of time budget: $(left)s left of BUDGET_S=$BUDGET_S; rerun with STAGES=$name"
    fi
}

summarize() {  # $OUT/summary.json from the stage records so far, with the verdict
    python3 - "$OUT" "$DEVICE" "$BUDGET_S" "$SECONDS" <<'PY'
import json, sys
out, device, budget_s, wall_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

stages = {}
for name in ("env", "transport", "ipc", "stack", "smoke"):
    rec = load(f"{out}/stages/{name}.json") or {"status": "pending", "seconds": 0, "reason": "not reached"}
    rec["details"] = load(f"{out}/{name}.json") or {}
    if rec["status"] in ("failed", "timeout"):
        with open(f"{out}/{name}.log", errors="replace") as f:
            rec["log_tail"] = f.read()[-3000:]
    stages[name] = rec
status = {name: rec["status"] for name, rec in stages.items()}
bad = [name for name, s in status.items() if s in ("failed", "timeout", "pending")]
env, ipc, stack, smoke = (stages[n]["details"] for n in ("env", "ipc", "stack", "smoke"))
verdict = {"ok": not bad and "ok" in status.values(), "device": device, "stages": status, "not_ok": bad,
           "gpus": len(env.get("gpus", [])), "driver": env.get("driver"), "torch": env.get("torch", {}).get("version"),
           "ipc_cases": ipc.get("summary", {}).get("cases"),
           "stack_sync": stack.get("sync"), "stack_fallbacks": stack.get("fallbacks"),
           "stack_max_abs_dlogp": stack.get("parity_after_push_max_abs"),
           "smoke_metrics_rows": smoke.get("metrics_rows")}
with open(f"{out}/summary.json", "w") as f:
    json.dump({"budget_s": budget_s, "wall_s": wall_s, "stages": stages, "verdict": verdict}, f, indent=1)
PY
}

if [[ -z ${DEVICE:-} ]]; then
    DEVICE=$(timeout 60 "$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null)
    [[ $DEVICE == cuda ]] || DEVICE=cpu
fi
export DEVICE
echo "[gpu-check] stages: ${WANTED[*]}; DEVICE=$DEVICE BUDGET_S=$BUDGET_S PYTHON=$PY OUT=$OUT"

for name in "${ALL_STAGES[@]}"; do
    why=$(skip_reason "$name")
    if [[ -n $why ]]; then
        record "$name" skipped 0 "$why"
    else
        limit=$(( $(left) - 5 ))
        (( limit > MAX_S[$name] )) && limit=${MAX_S[$name]}
        run_stage "$name" "$limit"
    fi
    summarize
done
python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))["verdict"]; print(json.dumps(v)); sys.exit(not v["ok"])' \
    "$OUT/summary.json"
