"""GPU readiness check (issue 27): one prepared command for a GPU machine, in stages. Each stage runs
in a process group of its own with a deadline inside the total budget, and leaves a record in
$OUT/summary.json (status ok|failed|timeout|skipped, seconds, reason, details) even when it is
skipped or fails; the summary is rewritten after every stage and ends with a verdict block.
From the repository root (the runner is standard library only: any python3 starts it):

    python -m tools.gpu_check                                      # every stage
    STAGES=env,transport,ipc DEVICE=cpu python -m tools.gpu_check  # the CPU form, as CI runs it
    STAGES=smoke python -m tools.gpu_check                         # a second run on a kept machine

Stages, always in this order (STAGES picks some, comma- or space-separated; default all):
  env        nvidia-smi, driver, python, torch (CUDA, devices), gcc, package registry reachable?
  transport  tools/gpu_check/transport.py: torch, rollout/engine/weight_group.py and
             trainer/weight_transport.py only, so it runs on a box that has nothing but torch;
             writes $OUT/transport.json
  ipc        tools/gpu_check/ipc.py: the same-GPU (CUDA IPC) path as production uses it (the plan
             relayed, members that keep tensors, two members, reopen, a member's death, vLLM-like
             neighbours, memory fit, allocator settings, big layouts, two NCCL ranks on one GPU),
             torch only; writes $OUT/ipc.json
  stack      tools/gpu_check/stack.py (needs vllm, ray, deepspeed: make setup): one engine, one
             learner rank, a push through the policy's weight sync, engine/learner log-prob parity
  smoke      scripts/train.py experiment=smoke, 3 steps (cluster=gpu on a GPU: one GPU shared)
Environment: OUT (./gpu_check_out), BUDGET_S (480), DEVICE (cuda when torch sees a GPU, else cpu),
PYTHON (.venv/bin/python if there, else this interpreter), SMOKE_ARGS (more hydra overrides for smoke).
Each stage is this module again (`__stage NAME`) in a new session, whose programs run in PYTHON as
`PYTHON -m tools.gpu_check.<stage>` from the repository root.
Exit status: 0 unless a stage failed or ran out of time; 2 for an unknown stage.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALL_STAGES = ("env", "transport", "ipc", "stack", "smoke")
MAX_S = {"env": 90, "transport": 150, "ipc": 300, "stack": 300, "smoke": 360}  # a stage's own deadline
MIN_S = {"env": 10, "transport": 10, "ipc": 30, "stack": 60, "smoke": 60}  # less budget left than this: skipped
LOG_CAP = 200000  # bytes of a stage's log kept (its head and its tail)
NO_STACK = 99  # a stage's exit status when the interpreter lacks vllm, ray or deepspeed: skipped
KILL_AFTER_S = 10  # after the deadline's SIGTERM to the group, SIGKILL this much later
PENDING = "not reached"  # a stage's reason before it has run or been skipped
MARKER = "TRACERL_GPU_CHECK"  # NAME=<run id>-<stage> in every process of a stage (what `reap` looks for)


# ---------------------------------------------------------------- the stages (each in its own group)
def output(cmd: list[str], timeout_s: float | None = None) -> tuple[int, str]:
    """(exit status, stdout and stderr together without trailing newlines), as `$(cmd 2>&1)`: 124
    past `timeout_s`, 127 for a program that is not there."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s, text=True)
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        return 124, text.rstrip("\n")
    except OSError as e:
        return 127, f"failed to run command '{cmd[0]}': {e.strerror}"
    return proc.returncode, proc.stdout.rstrip("\n")


TORCH_PROBE = """import json, torch
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available(),
                  "count": torch.cuda.device_count(),
                  "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))"""


def jsonish(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return {"error": text[-500:]}


def stage_env(py: str, out: Path, device: str) -> int:
    rc, pip_out = output([py, "-m", "pip", "index", "versions", "pip", "--retries", "0", "--timeout", "5"], 30)
    registry = "reachable" if rc == 0 else "unreachable"
    if "No module named pip" in pip_out:
        registry = "unknown (no pip)"
    smi = output(["nvidia-smi", "-L"], 20)[1].splitlines()
    driver = output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], 20)[1]
    gcc = output(["gcc", "--version"])[1].split("\n", 1)[0]
    torch_lines = output([py, "-c", TORCH_PROBE], 60)[1].splitlines()
    gpus = [line for line in smi if line.startswith("GPU ")]
    env = {
        "gpus": gpus,
        "driver": driver.splitlines()[0] if gpus else None,
        "nvidia_smi_error": None if gpus else "\n".join(smi)[-300:],
        "python": output([py, "-V"])[1],
        "torch": jsonish(torch_lines[-1] if torch_lines else ""),
        "gcc": gcc,
        "registry": registry,
    }
    with open(out / "env.json", "w") as f:
        json.dump(env, f, indent=1)
    print(json.dumps(env))
    return 0


def stage_transport(py: str, out: Path, device: str) -> int:
    return subprocess.call([py, "-m", "tools.gpu_check.transport", "--device", device, "--out", str(out)])


def stage_ipc(py: str, out: Path, device: str) -> int:
    return subprocess.call([py, "-m", "tools.gpu_check.ipc", "--device", device, "--out", str(out)])


def has_stack(py: str) -> bool:
    """Whether `py` imports vllm, ray and deepspeed (what it says when not goes to the stage's log)."""
    try:
        return subprocess.call([py, "-c", "import vllm, ray, deepspeed"], timeout=120) == 0
    except (subprocess.TimeoutExpired, OSError) as e:
        print(f"[gpu-check] {py} -c 'import vllm, ray, deepspeed': {e}", file=sys.stderr)
        return False


def stage_stack(py: str, out: Path, device: str) -> int:
    if not has_stack(py):
        return NO_STACK
    return subprocess.call([py, "-m", "tools.gpu_check.stack", "--device", device, "--out", str(out / "stack.json")])


def stage_smoke(py: str, out: Path, device: str) -> int:
    if not has_stack(py):
        return NO_STACK
    run = Path(tempfile.mkdtemp()) / "run"
    args = ["experiment=smoke", "trainer.steps=3", "eval.size=8", f"run_dir={run}"]
    if device == "cuda":
        args.append("cluster=gpu")
    args += os.environ.get("SMOKE_ARGS", "").split()  # hydra overrides, one word each
    print(f"[gpu-check] scripts/train.py {' '.join(args)}", flush=True)
    rc = subprocess.call([py, "scripts/train.py", *args])
    try:  # what the run left, even when it failed; the stage's status is the run's
        rows = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else None
        smoke = {
            "args": " ".join(args),
            "metrics_rows": len(rows),
            "last_metrics": json.loads(rows[-1]) if rows else None,
        }
        with open(out / "smoke.json", "w") as f:
            json.dump({**smoke, "summary": summary}, f, indent=1)
    except (OSError, ValueError) as e:
        print(f"[gpu-check] smoke.json not written: {type(e).__name__}: {e}", file=sys.stderr)
    shutil.rmtree(run.parent, ignore_errors=True)
    return rc


STAGE_FUNCS = {
    "env": stage_env,
    "transport": stage_transport,
    "ipc": stage_ipc,
    "stack": stage_stack,
    "smoke": stage_smoke,
}


def one_stage(name: str) -> int:
    """A stage, in the process `run_stage` started for it (its environment says PY, OUT, DEVICE)."""
    os.chdir(ROOT)
    rc = STAGE_FUNCS[name](os.environ["PY"], Path(os.environ["OUT"]), os.environ["DEVICE"])
    return 128 - rc if rc < 0 else rc  # a program killed by signal N: 128 + N, as a shell reports it


# ---------------------------------------------------------------- the driver
class Check:
    """One run of the check: where it writes, in which interpreter its stages run, and its clock."""

    def __init__(self, out: Path, py: str, budget_s: int, stages: str, wanted: list[str]):
        self.out, self.py, self.budget_s, self.stages, self.wanted = out, py, budget_s, stages, wanted
        self.t0 = time.monotonic()
        self.run_id = f"{os.getpid()}-{time.time_ns()}"
        self.device = ""

    def seconds(self) -> int:  # whole seconds since the start, as bash's SECONDS
        return int(time.monotonic() - self.t0)

    def left(self) -> int:
        return self.budget_s - self.seconds()

    def record(self, name: str, status: str, seconds: int, reason: str) -> None:
        with open(self.out / "stages" / f"{name}.json", "w") as f:
            json.dump({"status": status, "seconds": seconds, "reason": reason}, f)

    def skip_reason(self, name: str) -> str:
        """Why a stage does not run ("" when it does)."""
        if "all" not in self.wanted and name not in self.wanted:
            return f"not in STAGES={self.stages}"
        if self.left() - 5 < MIN_S[name]:
            return f"out of time budget: {self.left()}s left of BUDGET_S={self.budget_s}; rerun with STAGES={name}"
        return ""

    def environ(self, name: str) -> dict[str, str]:
        """A stage's environment: what it reads (OUT, PY, DEVICE), quiet libraries, and its marker."""
        return {
            **os.environ,
            "ROOT": str(ROOT),
            "OUT": str(self.out),
            "PY": self.py,
            "DEVICE": self.device,
            "PYTHONUNBUFFERED": "1",
            "WANDB_MODE": "offline",
            "TOKENIZERS_PARALLELISM": "false",
            "RAY_DEDUP_LOGS": "1",
            MARKER: f"{self.run_id}-{name}",
        }

    def run_stage(self, name: str, limit: int) -> None:
        """The stage in a session (and so a process group) of its own, ended at `limit` seconds:
        SIGTERM to its group, SIGKILL KILL_AFTER_S later; then whatever of it left the group."""
        t0 = self.seconds()
        log_path = self.out / f"{name}.log"
        print(f"[gpu-check] {name}: up to {limit}s (log: {log_path})", flush=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tools.gpu_check", "__stage", name],
                cwd=ROOT,
                env=self.environ(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            rc, ended = wait_or_end(proc, limit)
        rc = 128 - rc if rc < 0 else rc  # killed by signal N (not by us): 128 + N, as a shell reports it
        reap(f"{self.run_id}-{name}")
        cap_log(log_path)
        seconds = self.seconds() - t0
        if rc == 0:
            self.record(name, "ok", seconds, "")
        elif rc == NO_STACK:
            reason = f"{self.py} cannot import vllm, ray, deepspeed (see {name}.log)"
            self.record(name, "skipped", seconds, reason + ": install the stack first (make setup)")
        elif ended:
            self.record(name, "timeout", seconds, f"ended at its deadline of {limit}s")
        else:
            self.record(name, "failed", seconds, f"exit status {rc} (see {name}.log)")

    def summarize(self) -> dict:
        """$OUT/summary.json from the stage records so far, with the verdict (returned)."""
        stages = {}
        for name in ALL_STAGES:
            rec = load(self.out / "stages" / f"{name}.json") or {"status": "pending", "seconds": 0, "reason": PENDING}
            rec["details"] = load(self.out / f"{name}.json") or {}
            if rec["status"] in ("failed", "timeout"):
                with open(self.out / f"{name}.log", errors="replace") as f:
                    rec["log_tail"] = f.read()[-3000:]
            stages[name] = rec
        verdict = verdict_of(stages, self.device)
        summary = {"budget_s": self.budget_s, "wall_s": self.seconds(), "stages": stages, "verdict": verdict}
        with open(self.out / "summary.json", "w") as f:
            json.dump(summary, f, indent=1)
        return verdict


def wait_or_end(proc: subprocess.Popen, limit: int) -> tuple[int, bool]:
    """The stage's exit status, and whether it was ended at its deadline (then 124, or 137 when it
    needed SIGKILL, as GNU timeout -k reports them)."""
    try:
        return proc.wait(timeout=limit), False
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_AFTER_S)
        code = 124
    except subprocess.TimeoutExpired:
        code = 137
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    return code, True


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap(marker: str) -> None:
    """End what a stage left behind (Ray and vLLM daemons may leave its group): every process whose
    environment holds its marker."""
    entry = f"{MARKER}={marker}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if entry in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def cap_log(path: Path) -> None:
    """Keep the head and the tail of a long log."""
    if path.stat().st_size <= LOG_CAP:
        return
    data = path.read_bytes()
    cut = b"\n[gpu-check] ... log cut to its head and tail ...\n"
    path.write_bytes(data[: LOG_CAP // 10] + cut + data[-(LOG_CAP * 9 // 10) :])


def load(path: Path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def verdict_of(stages: dict, device: str) -> dict:
    status = {name: rec["status"] for name, rec in stages.items()}
    bad = [name for name, s in status.items() if s in ("failed", "timeout", "pending")]
    env, ipc, stack, smoke = (stages[n]["details"] for n in ("env", "ipc", "stack", "smoke"))
    return {
        "ok": not bad and "ok" in status.values(),
        "device": device,
        "stages": status,
        "not_ok": bad,
        "gpus": len(env.get("gpus", [])),
        "driver": env.get("driver"),
        "torch": env.get("torch", {}).get("version"),
        "ipc_cases": ipc.get("summary", {}).get("cases"),
        "stack_sync": stack.get("sync"),
        "stack_fallbacks": stack.get("fallbacks"),
        "stack_max_abs_dlogp": stack.get("parity_after_push_max_abs"),
        "smoke_metrics_rows": smoke.get("metrics_rows"),
    }


def interpreter() -> str:
    """PYTHON, else the checkout's .venv/bin/python if there, else this interpreter."""
    if os.environ.get("PYTHON"):
        return os.environ["PYTHON"]
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if os.access(venv, os.X_OK) else sys.executable


def probe_device(py: str) -> str:
    """cuda when torch sees a GPU in `py`, else cpu."""
    code = 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")'
    try:
        found = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (subprocess.TimeoutExpired, OSError):
        return "cpu"
    return "cuda" if found == "cuda" else "cpu"


def main() -> int:
    out = Path(os.environ.get("OUT") or "gpu_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    stages = os.environ.get("STAGES") or "all"
    wanted = stages.replace(",", " ").split()
    for s in wanted:
        if s != "all" and s not in ALL_STAGES:
            known = f"the stages are: {' '.join(ALL_STAGES)} (or all)"
            print(f"tools.gpu_check: unknown stage '{s}' in STAGES={stages}; {known}", file=sys.stderr)
            return 2
    os.chdir(ROOT)
    check = Check(out, interpreter(), int(os.environ.get("BUDGET_S") or 480), stages, wanted)
    shutil.rmtree(out / "stages", ignore_errors=True)
    for path in [out / "summary.json", *(out / f"{n}.{ext}" for n in ALL_STAGES for ext in ("json", "log"))]:
        path.unlink(missing_ok=True)
    (out / "stages").mkdir(parents=True)
    check.device = os.environ.get("DEVICE") or probe_device(check.py)
    print(
        f"[gpu-check] stages: {' '.join(wanted)}; DEVICE={check.device} BUDGET_S={check.budget_s} "
        f"PYTHON={check.py} OUT={out}",
        flush=True,
    )
    verdict: dict = {}
    for name in ALL_STAGES:
        why = check.skip_reason(name)
        if why:
            check.record(name, "skipped", 0, why)
        else:
            check.run_stage(name, min(check.left() - 5, MAX_S[name]))
        verdict = check.summarize()
    print(json.dumps(verdict), flush=True)
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["__stage"]:  # `Check.run_stage` re-enters here: one stage in its own process group
        sys.exit(one_stage(sys.argv[2]))
    sys.exit(main())
