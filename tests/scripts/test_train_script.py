"""scripts/train.py from the command line: the smoke run, and clear errors for bad config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "scripts/train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.e2e
def test_smoke_experiment_learns_in_sync_mode(smoke_run):
    tmp_path, proc = smoke_run  # scripts/train.py experiment=smoke trainer.rollouts_every=10
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["eval_size"] == 32
    assert summary["initial_eval_reward"] < 0.3
    assert summary["final_eval_reward"] > 0.8, summary
    paired = summary["eval_paired"]  # the same 32 held-out tasks before and after
    assert paired["better"] > paired["worse"] and paired["sign_test_p"] < 0.01, paired
    from rollout.trace import read_jsonl

    before, after = (list(read_jsonl(tmp_path / f"eval/step_{n}.jsonl")) for n in (0, 20))
    assert [t.info["task"] for t in before] == [t.info["task"] for t in after] and len(after) == 32
    assert sum(t.reward for t in after) / 32 == pytest.approx(summary["final_eval_reward"])
    assert "[train] step   20/20" in proc.stderr  # a log line (rollout/log.py)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rows = list(map(json.loads, lines))
    last = [r for r in rows if "rollout/traces" in r][-1]  # step 20's training row; its evaluation has its own
    assert last["step"] == 20 and rows[-1]["step"] == 20 and rows[-1]["eval/reward"] == summary["final_eval_reward"]
    for key in (
        "rollout/reward",
        "train/main/loss",
        "train/main/clip_frac",
        "train/main/mismatch_kl",
        "train/main/entropy",
        "train/main/grad_norm",
        "train/trained_tokens",
        "perf/train_tokens_per_s",
        "sync/main/seconds",
        "async/main/staleness_max",
    ):
        assert key in last, key
    assert last["async/main/staleness_max"] == 0  # synchronous: every trained token from current weights
    # the rollout split: the engine's steps fit in its busy time, which fits in the window
    for m in map(json.loads, lines):
        if "rollout/reward" in m:
            assert 0 < m["perf/engine_prefill_s"] + m["perf/engine_decode_s"] <= m["perf/engine_busy_s"] + 1e-3, m
            assert m["perf/engine_busy_s"] <= m["perf/rollout_window_s"] and m["rollout/decode_steps"] > 0, m
            # the learners' own step seconds are part of the loop's train time (0: nothing to train)
            assert 0 <= m["perf/main/learner_s"] <= m["perf/main/train_s"], m
            assert (m["perf/main/learner_s"] > 0) == ("train/main/loss" in m), m
    assert "engines busy" in proc.stderr
    # trainer.rollouts_every=10: steps 10 and 20 wrote the traces they trained on, no other step
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_10.jsonl", "step_20.jsonl"]
    written = list(read_jsonl(tmp_path / "rollouts/step_20.jsonl"))
    assert len(written) == last["rollout/traces"] and written[0].sequences[0].completion_ids
    assert (tmp_path / "config.yaml").exists()
    assert (tmp_path / "checkpoints/step_000020/main/hf/model.safetensors").exists()


@pytest.mark.unit
@pytest.mark.parametrize(
    "override, message",
    [
        ("learner.lr=oops", "learner.lr"),
        ("trainer.lr=oops", "Could not override 'trainer.lr'"),  # a key not in its group: as a misspelt one
    ],
)
def test_bad_config_fails_at_start_naming_the_key(override, message):
    proc = train(override, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.unit
def test_bad_combination_fails_before_ray_starts():
    proc = train("sampling.top_p=0.9", timeout=120)
    assert proc.returncode == 2
    assert "config error: sampling.top_p must be 1.0 for training" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
