"""scripts/generate.py end to end: a real engine and the solver_verifier harness, the script
joining a running Ray cluster (`ray.address=`, the test session's) as it would a cluster's; a Ray
start of its own (~9 CPU-s here, measured) is spared."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.trace import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_generate_script_writes_multi_agent_traces(ray_cluster, tmp_path):
    import ray

    out = tmp_path / "traces.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/generate.py",
            "model=tiny",
            "harness=solver_verifier",
            "task=chain_sum",
            "num_traces=8",
            "rollout.group_size=4",
            "sampling.max_tokens=24",
            "engine.kv_cache_gb=0.25",
            f"ray.address={ray.get_runtime_context().gcs_address}",
            f"out={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["traces"] == 8 and summary["rollout/failed"] == 0
    assert "[generate] 4/8 traces" in proc.stdout and "[generate] 8/8 traces" in proc.stdout
    traces = list(read_jsonl(out))
    assert len(traces) == 8 and len({t.group for t in traces}) == 2
    for t in traces:
        assert t.agents == ["solver", "verifier"] and len(t.sequences) == 3
    assert summary["rollout/generated_tokens"] == sum(t.num_generated_tokens for t in traces)
    assert summary["rollout/reward"] == pytest.approx(sum(t.reward for t in traces) / 8)
    assert summary["rollout/agents_per_trace"] == 2.0 and summary["rollout/sequences_per_trace"] == 3.0


@pytest.mark.unit
def test_generate_bad_config_fails_before_ray_starts():
    proc = subprocess.run(
        [sys.executable, "scripts/generate.py", "harness=solver_verifier", "~agents.verifier"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "config error: agents: harness 'solver_verifier' uses roles ['verifier']" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
