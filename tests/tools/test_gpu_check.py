"""`python -m tools.gpu_check`, the GPU readiness check, run here in its CPU form, from the repository
root and without PYTHONPATH (as `make gpu-check` runs it).

The env, transport and ipc stages run for real on this machine (the transport in its gloo form, with
torch, rollout/engine/weight_group.py and trainer/weight_transport.py only; tools/gpu_check/ipc.py's
cases over POSIX shared memory, its GPU-only cases skipped). The stage runner's own machinery — a stage that fails, one
that overruns its deadline (and a process of it that left its process group), one skipped for
lack of budget, an unknown stage name — is driven through PYTHON= pointing at a small shell
script standing in for the interpreter, so those cases are exact and cost seconds.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# tests/conftest.py puts the root on PYTHONPATH for Ray's workers; the check must not need it
NO_PYTHONPATH = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def gpu_check(out: Path, timeout_s: float = 600, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.gpu_check"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env={**NO_PYTHONPATH, "OUT": str(out), "DEVICE": "cpu", **env},
    )


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def stand_in_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for the interpreter the stages run."""
    path = tmp_path / "python"
    path.write_text("#!/usr/bin/env bash\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


CPU_CASES = ("env", "hop", "retain", "members2", "reopen", "death", "vllm-like", "big")


@pytest.mark.e2e
def test_env_transport_and_ipc_stages_on_cpu(tmp_path):
    """The ipc stage is tools/gpu_check/ipc.py (GPU review §6.2): every case that applies on CPU
    holds over shared memory (the plan relayed through a process that never starts CUDA, members
    that keep every tensor, two members, three group generations leaving no shared memory behind,
    a member killed mid-push failing the sender's push at its timeout and the next generation
    exact, vLLM-like neighbours, small and large buckets); the GPU-only ones say why they skipped."""
    out = tmp_path / "out"
    run = gpu_check(out, STAGES="env,transport,ipc", PYTHON=sys.executable)
    s = summary(out)
    stages = s["stages"]
    assert stages["env"]["status"] == "ok", stages["env"]
    env = stages["env"]["details"]
    assert env["torch"]["version"] == torch.__version__ and env["torch"]["available"] is False
    assert env["python"].startswith("Python 3.") and env["registry"]
    assert stages["transport"]["status"] == "ok", (stages["transport"], run.stdout[-2000:], run.stderr[-2000:])
    transport = stages["transport"]["details"]  # $OUT/transport.json, written by the transport stage
    assert transport == json.loads((out / "transport.json").read_text())
    assert "gloo" in json.dumps(transport), "on CPU the transport checks run in their gloo form"
    assert stages["ipc"]["status"] == "ok", (stages["ipc"], (out / "ipc.log").read_text()[-3000:])
    ipc = stages["ipc"]["details"]  # $OUT/ipc.json
    assert ipc["summary"]["cases"] == {c: "ok" if c in CPU_CASES else "skipped" for c in ipc["summary"]["cases"]}
    assert set(CPU_CASES) <= set(ipc["cases"]) and s["verdict"]["ipc_cases"] == ipc["summary"]["cases"]
    cases = ipc["cases"]
    assert cases["hop"]["relay"] == {"plans": 1, "cuda_initialized": False}
    assert [p["version"] for p in cases["retain"]["m1"]["pushes"]] == [1, 2, 3]
    assert "did not take bucket" in cases["death"]["sender_error"] and cases["death"]["m2"]["exact"]
    assert cases["reopen"]["blocks_left"] == []
    assert cases["fit"] == {
        "case": "fit",
        "status": "skipped",
        "reason": "needs a GPU (CUDA memory, NCCL or its allocator)",
    }
    for name in ("stack", "smoke"):
        assert stages[name] == {
            "status": "skipped",
            "seconds": 0,
            "reason": "not in STAGES=env,transport,ipc",
            "details": {},
        }
    assert s["verdict"]["ok"] and s["verdict"]["device"] == "cpu" and s["verdict"]["not_ok"] == []
    assert run.returncode == 0


@pytest.mark.unit
def test_an_ipc_case_past_its_deadline_is_ended_and_recorded_and_the_others_still_run():
    """A member killed mid-push leaves the sender waiting for its timeout (5 s on CPU): with a 3 s
    deadline the death case is ended there (its processes killed), recorded as a timeout naming
    what did not report, and the next case still runs; one JSON line per case, then the verdict."""
    run = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check.ipc", "--device", "cpu"]
        + ["--cases", "death,fit", "--deadline-s", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=NO_PYTHONPATH,
    )
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert [line.get("case") for line in lines] == ["death", "fit", None], run.stderr[-2000:]
    death, fit, verdict = lines
    assert death["status"] == "timeout" and death["error"] == "no result within 3 s from ['m2', 'sender']"
    assert fit["status"] == "skipped"
    assert verdict["cases"] == {"death": "timeout", "fit": "skipped"} and verdict["ok"] is False
    assert run.returncode == 1


@pytest.mark.unit
def test_an_unknown_ipc_case_is_refused_naming_the_cases():
    run = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check.ipc", "--device", "cpu", "--cases", "hop,bogus"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=NO_PYTHONPATH,
    )
    assert run.returncode == 2 and "unknown case(s) ['bogus']" in run.stderr and "expandable" in run.stderr


@pytest.mark.unit
def test_a_failing_stage_is_recorded_with_its_log_and_no_stack_skips_the_stack(tmp_path):
    """An interpreter that fails everything: the transport stage fails (its log's tail in the
    summary); the stack stage finds no vllm/ray/deepspeed to import and is skipped, saying why."""
    out = tmp_path / "out"
    python = stand_in_python(tmp_path, 'echo "no torch here" >&2; exit 3')
    run = gpu_check(out, STAGES="transport,stack", PYTHON=python)
    stages = summary(out)["stages"]
    assert stages["transport"]["status"] == "failed"
    assert stages["transport"]["reason"] == "exit status 3 (see transport.log)"
    assert "no torch here" in stages["transport"]["log_tail"]
    assert stages["stack"]["status"] == "skipped"
    assert stages["stack"]["reason"].startswith(f"{python} cannot import vllm, ray, deepspeed")
    assert {stages[n]["status"] for n in ("env", "ipc", "smoke")} == {"skipped"}
    assert summary(out)["verdict"]["not_ok"] == ["transport"] and run.returncode == 1


@pytest.mark.unit
def test_a_stage_past_its_deadline_is_ended_with_what_it_started(tmp_path):
    """The transport stage never finishes and starts a process in a session of its own (as Ray's
    daemons may): the stage is ended at its deadline, that process too; the stack stage after it
    has too little of the budget left and is skipped, saying so."""
    out, pidfile = tmp_path / "out", tmp_path / "escaped.pid"
    hang = stand_in_python(tmp_path, f"setsid sleep 600 & echo $! > {pidfile}; sleep 600")
    run = gpu_check(out, timeout_s=120, STAGES="transport,stack", BUDGET_S="16", PYTHON=hang)  # an 11 s deadline
    stages = summary(out)["stages"]
    assert stages["transport"]["status"] == "timeout"
    assert stages["transport"]["reason"].startswith("ended at its deadline of ")
    escaped = pidfile.read_text().strip()
    state = Path(f"/proc/{escaped}/status")
    assert not state.exists() or "\nState:\tZ" in state.read_text(), "the escaped process was ended"
    assert stages["stack"]["status"] == "skipped"
    assert stages["stack"]["reason"].startswith("out of time budget")
    assert run.returncode == 1


@pytest.mark.unit
def test_an_unknown_stage_fails_naming_it_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    run = gpu_check(out, STAGES="env,bogus", PYTHON=sys.executable)
    assert run.returncode == 2
    assert "unknown stage 'bogus'" in run.stderr and "env transport ipc stack smoke" in run.stderr
    assert not (out / "summary.json").exists()
