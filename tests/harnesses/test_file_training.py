"""Training on a file the user brings, end to end on the tiny model (real Ray, vLLM engine,
DeepSpeed learner): from Parquet with a user-function verifier, in one run. Held-out questions
are never drawn for training, asserted on the traces' questions.

One run, not one per format and verifier: a run's cost is its start (an engine, learner ranks,
rollout workers), and what differs between formats and verifiers is checked without one. Every
format reads the same items as JSONL (tests/harnesses/test_file_tasks.py,
test_every_format_reads_the_same_items), and a built-in verifier such as `numeric` is a plain
call in the harness, scored in tests/harnesses/test_verifiers.py and, on a file task,
test_file_tasks.py (test_a_saved_hf_dataset_folder_reads_with_its_field_names). The user's
function is the path only a run shows: it is imported and called in the rollout workers'
sandboxes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harnesses.base import normalize_question
from rollout.config import make_task_source
from rollout.trace import read_jsonl
from trainer.config import compose
from trainer.loop import train

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEPS, GROUPS = 2, 8


def arith_rows() -> list[dict]:
    """The first 24 items of examples/arith.jsonl, and each again in capitals (duplicates)."""
    lines = (ROOT / "examples" / "arith.jsonl").read_text().splitlines()[:24]
    rows = [json.loads(line) for line in lines]
    return rows + [{**r, "question": r["question"].upper()} for r in rows]


def run(tmp_path: Path, data: Path, verifier: str) -> tuple[dict, object]:
    """8 held out of 24 distinct questions; 2 steps of 8 groups draw all 16 others."""
    cfg = compose(
        "train",
        [
            "experiment=smoke",
            "task=file",
            "task._target_=harnesses.tasks.files.FileTasks",
            "task.name=arith",
            f"task.params.path={data}",
            f"task.params.verifier={verifier}",
            "+task.params.metadata_fields=[terms]",
            "task.eval_size=8",
            "eval.size=8",
            f"trainer.steps={STEPS}",
            f"trainer.groups_per_step={GROUPS}",
            "trainer.eval_every=0",
            "trainer.rollouts_every=1",
            "rollout.group_size=4",
            "learner.world_size=1",
            "sampling.max_tokens=8",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    return train(cfg), cfg


def check_held_out(run_dir: Path, cfg) -> list:
    """The held-out questions were evaluated and never trained on; every other one was trained on."""
    held = {normalize_question(t.question) for t in make_task_source(cfg.task, cfg.seed).eval_tasks()}
    evaluated = {normalize_question(t.info["question"]) for t in read_jsonl(run_dir / "eval" / f"step_{STEPS}.jsonl")}
    assert evaluated == held and len(held) == 8
    traces = [t for step in range(1, STEPS + 1) for t in read_jsonl(run_dir / "rollouts" / f"step_{step}.jsonl")]
    assert len(traces) == STEPS * GROUPS * 4
    trained = {normalize_question(t.info["question"]) for t in traces}
    assert not trained & held, "a held-out question was drawn for training"
    assert trained == {normalize_question(r["question"]) for r in arith_rows()} - held
    assert all(t.status != "failed" for t in traces), [t.error for t in traces if t.status == "failed"][:3]
    return traces


def test_training_from_parquet_with_a_user_function_verifier(ray_cluster, tmp_path):
    data = tmp_path / "arith.parquet"
    pq.write_table(pa.Table.from_pylist(arith_rows()), data)
    summary, cfg = run(tmp_path, data, "tests.harnesses.user_verifiers:digit_fraction")
    traces = check_held_out(tmp_path / "run", cfg)
    # the user's function scored every trace (in the rollout workers' sandboxes): a dense reward
    # in [0, 1] that varies within groups, so the learner had advantages to train on
    assert all(0.0 <= t.reward <= 1.0 for t in traces)
    assert len({t.reward for t in traces}) > 1 and summary["trained_tokens"] > 0
    assert summary["steps"] == STEPS and summary["eval_size"] == 8
