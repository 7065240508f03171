"""Every bench of tools/bench/ runs once with `--quick`, as `python -m tools.bench.<name> --quick`
from the repository root (the tiny model, the fewest iterations and process starts that still go
through its code: where a comparison's other side is the same code with another setting, or runs in
another bench's quick run, it is left out, and the check says so)
and keeps its promise: the last output line is one JSON object with the keys it documents and sane
values. Benches are never run in tests for their numbers; this only stops them breaking unseen (one
once called a config method that was gone).

They run in the background lane (tests/lane.py), one after another from the start of the
session, at a lower CPU priority: they fill the time the suite leaves the box idle instead of
adding minutes of their own. Each test here waits for its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import lane

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# tools/bench/reference.py (what the benches measure against) is a module, not a bench
BENCHES = sorted(p.stem for p in (ROOT / "tools" / "bench").glob("*.py") if p.stem not in ("__init__", "reference"))
# generous: a bench runs at nice 10 beside the rest of the suite (alone: 5-80 s each)
DEADLINE_S = {"faults": 900, "chaos": 1200, "e2e": 900, "learner": 900, "rollout_path": 600}  # others: 450
# a Ray of its own: they strike actors by name (tests/trainer/test_faults.py reads the faults run)
OWN_RAY = {"faults", "chaos"}


def run_quick(name: str) -> dict:
    """The bench's last output line, parsed (tests/lane.py runs it)."""
    result = lane.result(name)
    assert result["bench"] == name and result["quick"] is True, result
    return result


def lane_jobs() -> dict[str, lane.Job]:
    """Each bench's quick run (tests/conftest.py launches those of the selected tests)."""
    return {n: lane.Job(["-m", f"tools.bench.{n}", "--quick"], DEADLINE_S.get(n, 450), n in OWN_RAY) for n in BENCHES}


# each quick test reads its own bench's run
LANE_TESTS = {"test_quick": lambda item: item.callspec.params["name"]}


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and v > 0 for v in values)


def check_tool_parser(r):
    assert set(r["new_ms"]) >= {"spaces_100k", "newlines_100k", "unclosed_10k", "normal"}
    assert isinstance(r["goal_met"], bool) and r["old_regex_ms"]


def check_gateway_stall(r):
    # a 5 MiB message cannot fit the context: refused, and the loop's worst stall measured (not judged here)
    row = r["tiny"]["5MiB"]
    assert row["status"] == 400 and row["code"] == "context_length_exceeded", row
    assert row["worst_stall_ms"] >= 0 and isinstance(r["goal_met"], bool)


def check_hostile(r):
    assert r["file_created"] is False  # no payload escaped the sandbox
    assert r["hostile_ms"] and all("gold" in row for row in r["hostile_ms"].values())


def check_reward_hacks(r):
    # the bench exits 1 (a failed lane job) if any of these is not 0; the counts say the corpus ran
    assert r["paid"] == r["raised"] == r["gold_failed"] == r["unfit"] == 0, r
    assert r["hacks"] >= 40 and r["golds"] > 0 and set(r["targets"]) >= {"countdown", "puzzle24", "verifier=math"}


def check_trace_io(r):
    assert r["traces"] > 0 and positive(r["mb"], r["load_s"], r["json_parse_s"])


def check_bf16(r):
    # --quick runs bfloat16 alone: float32 is the same code with the dtype every other test runs
    for side in ("engine", "learner"):
        assert "float32_tok_s" not in r[side] and positive(r[side]["bfloat16_tok_s"]), r[side]


def check_lora_ops(r):
    # --quick runs tracerl's grouped ops alone: vLLM's are the same run_variant with the other
    # TRACERL_LORA_CPU_OPS (no a_speedup without them)
    assert "vllm" not in r and positive(*(r["grouped"][f"{b}_tokens_per_s"] for b in ("base", "a", "a+b", "base+a")))
    # tracerl's ops leak no adapter into base requests (vLLM's CPU ops do: docs/policies.md)
    assert r["grouped"]["base_requests_changed_by_batching_with_a"] == 0, r["grouped"]
    assert positive(r["a_vs_base_grouped"])


def check_rollout_path(r):
    # --quick runs the fleets alone: vLLM alone is reference.bench_vllm, which bf16's quick run runs
    assert "vllm_tok_s" not in r and positive(r["path_tok_s"], r["gateway_tok_s"], r["gateway_over_path_paired"])
    # ignore_eos: every side generated every token it was asked for
    for rounds in ("path_rounds", "gateway_rounds"):
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
    # --quick runs the comparison's second variant alone: the first ("sync") is the same run_variant
    # with other overrides, and max_staleness=0 is every other training test's setting
    assert "sync" not in r and r["async"]["steps"] == 2, r
    assert positive(r["async"]["s_per_step"], r["async"]["trained_tokens"])
    light = r["speed_of_light"]
    assert positive(light["step_s"], light["speed_of_light_s"], light["parts"]["rollout"]["engine_alone_s"])


def check_faults(r):
    # --quick runs every fault in turn and no fault-free baseline (the same code without a plan): no
    # extra wall to report. tests/trainer/test_faults.py reads its run dir step by step (and deletes it).
    [run] = r["runs"]
    assert run["fault"] == "in_turn" and r["extra_wall_s"] == {} and run["steps_done"] == run["steps"] == 6, r
    assert run["injected"] and run["survived"], run  # the run survives every fault
    assert run["engine_restarts"] == 4 and run["traces_lost"] == 0, run  # and trains every trace


def check_chaos(r):
    # --quick: the deterministic sync run alone (async has no oracle; its promises are the same
    # checkers'), five faults of five kinds struck while it ran, each healed within its bound: and
    # nothing lost, nothing trained twice, every submitted group ended, and the weights of the
    # fault-free reference run to the bit
    [sync] = r["modes"].values()
    assert sync["mode"] == "sync" and sum(r["faults"].values()) == 5 and len(r["faults"]) == 5, r["faults"]
    assert not sync["nemesis_errors"], sync["nemesis_errors"]
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["heal_over_bound"] == 0, sync["fault_log"]
    assert r["run_finished"] and sync["ledger_balanced"] and sync["failed_traces"] == 0, sync["ledger"]
    assert r["digest_equal"] and sync["first_divergent_step"] is None, sync
    assert sync["starts"] == 2 and r["unexpected_stops"] == 0, (
        f"the driver's kill, resumed once, no other: {sync['stops']}"
    )
    assert sync["learner_rebuild_s"], "the learner rank's death healed inside the run"


def check_engine_start(r):
    [core] = r["cores"]
    s = r["tiny"][core]
    assert positive(s["up_s"], s["spawn_s"], s["start_s"])
    assert s["start_s"] < s["spawn_s"] <= s["up_s"]  # the engine's own start is inside the actor's


CHECKS = {name[len("check_") :]: fn for name, fn in globals().items() if name.startswith("check_")}


def test_every_bench_has_a_check():
    assert sorted(CHECKS) == BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_quick(name):
    CHECKS[name](run_quick(name))
