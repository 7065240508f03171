"""Every scripts/bench/*.py runs once with `--quick` (the tiny model, the fewest iterations that
still go through its whole code path) and keeps its promise: the last output line is one JSON
object with the keys it documents and sane values. Benches are never run in tests for their
numbers; this only stops them breaking unseen (one once called a config method that was gone).

They run in a lane of their own, one after another from the start of the session
(tests/conftest.py::pytest_collection_finish calls `launch`), at a lower CPU priority: the suite
leaves a third of this 2-core box idle (waits on process starts, deadlines and restarts), and
the benches fill it instead of adding minutes of their own. Each test here waits for its own.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(p.stem for p in (ROOT / "scripts" / "bench").glob("*.py"))
# generous: a bench runs at nice 10 beside the rest of the suite (alone: 5-80 s each)
DEADLINE_S = {"faults": 900, "e2e": 900, "learner": 900, "rollout_path": 600}  # others: 450


def run_quick(name: str) -> dict:
    """The bench's last output line, parsed; the output's tail in the failure message."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        ["nice", "-n", "10", sys.executable, f"scripts/bench/{name}.py", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S.get(name, 450),
    )
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    lines = proc.stdout.strip().splitlines()
    assert lines, tail
    result = json.loads(lines[-1])
    assert result["bench"] == name and result["quick"] is True, result
    return result


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and v > 0 for v in values)


def check_tool_parser(r):
    assert set(r["new_ms"]) >= {"spaces_100k", "newlines_100k", "unclosed_10k", "normal"}
    assert isinstance(r["goal_met"], bool) and r["old_regex_ms"]


def check_hostile(r):
    assert r["file_created"] is False  # no payload escaped the sandbox
    assert r["hostile_ms"] and all("gold" in row for row in r["hostile_ms"].values())


def check_trace_io(r):
    assert r["traces"] > 0 and positive(r["mb"], r["load_s"], r["json_parse_s"])


def check_bf16(r):
    for side in ("engine", "learner"):
        assert positive(r[side]["float32_tok_s"], r[side]["bfloat16_tok_s"], r[side]["ratio"]), r[side]


def check_lora_ops(r):
    for ops in ("vllm", "grouped"):
        assert positive(*(r[ops][f"{b}_tokens_per_s"] for b in ("base", "a", "a+b", "base+a")))
    # tracerl's ops leak no adapter into base requests (vLLM's CPU ops do: docs/policies.md)
    assert r["grouped"]["base_requests_changed_by_batching_with_a"] == 0, r["grouped"]
    assert positive(r["a_speedup"])


def check_rollout_path(r):
    assert positive(r["vllm_tok_s"], r["path_tok_s"], r["gateway_tok_s"], r["gateway_over_path_paired"])
    # ignore_eos: every side generated every token it was asked for
    for rounds in ("vllm_rounds", "path_rounds", "gateway_rounds"):
        assert all(x["tokens"] == r["prompts"] * r["max_tokens"] for x in r[rounds]), (rounds, r[rounds])


def check_learner(r):
    t = r["tiny"]
    for key in ("a_throughput", "a_throughput_ws1"):
        assert positive(t[key]["plain_tok_s"], t[key]["learner_tok_s"], t[key]["trained_tokens"])
    for turns in ("turns_2", "turns_4", "turns_8"):  # merging never processes more tokens than unmerged
        assert t["b_merging"][turns]["merged_tokens"] <= t["b_merging"][turns]["unmerged_tokens"]
    for method in ("object_store", "collective"):
        assert positive(t["c_weight_sync"][method]["sync_s"])
    assert t["d_lora"]["sync_bytes_full_over_lora"] > 1  # an adapter is smaller than the weights
    assert positive(t["e_loss_positions"]["trained_only_s"], t["e_loss_positions"]["every_position_s"])


def check_e2e(r):
    for variant in ("sync", "async"):
        assert r[variant]["steps"] == 2 and positive(r[variant]["s_per_step"], r[variant]["trained_tokens"])
    light = r["speed_of_light"]
    assert positive(light["step_s"], light["speed_of_light_s"], light["parts"]["rollout"]["engine_alone_s"])


def check_faults(r):
    runs = {x["fault"]: x for x in r["runs"]}
    assert set(runs) == {"none", "engine_killed"}
    assert runs["none"]["survived"] and runs["none"]["traces_lost"] == 0, runs["none"]
    killed = runs["engine_killed"]
    assert killed["injected"] and killed["survived"], killed  # the run survives a killed engine
    assert killed["engine_restarts"] >= 1, killed
    assert "engine_killed" in next(iter(r["extra_wall_s"].values()))


def check_engine_start(r):
    [core] = r["cores"]
    s = r["tiny"][core]
    assert positive(s["up_s"], s["spawn_s"], s["start_s"])
    assert s["start_s"] < s["spawn_s"] <= s["up_s"]  # the engine's own start is inside the actor's


CHECKS = {name[len("check_") :]: fn for name, fn in globals().items() if name.startswith("check_")}


def test_every_bench_has_a_check():
    assert sorted(CHECKS) == BENCHES


LONGEST_FIRST = ["learner", "faults", "e2e", "lora_ops", "rollout_path", "bf16", "engine_start"]
_lane: dict[str, concurrent.futures.Future] = {}
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def launch(names: set[str]) -> None:
    """Start the selected benches' quick runs, longest first, one at a time in a background thread."""
    global _pool
    _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench")
    for name in sorted(names, key=lambda n: LONGEST_FIRST.index(n) if n in LONGEST_FIRST else len(LONGEST_FIRST)):
        _lane[name] = _pool.submit(run_quick, name)


def stop() -> None:
    """At the session's end: the benches not started yet are dropped, a running one is waited for."""
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def launched() -> dict[str, concurrent.futures.Future]:
    return _lane


@pytest.mark.parametrize("name", BENCHES)
def test_quick(name, launched):
    CHECKS[name](launched[name].result())
