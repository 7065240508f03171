"""Metrics under their final names: the paired sign test, advantages, the learner's sums; and
the wandb trace table (the trace viewer's card for every sequence), which RunLogger logs."""

import json

import pytest

from rollout.trace import Sequence, Trace
from trainer.metrics import (
    RunLogger,
    advantage_metrics,
    paired_comparison,
    rollout_split,
    step_totals,
    trace_table,
    train_metrics,
)

pytestmark = pytest.mark.unit


def decode(ids):
    return " ".join(f"<{i}>" for i in ids)


TRACE = Trace(
    "t<0>",
    "g",
    [
        Sequence([1, 2], [3, 4], [-0.1, -0.2], "solver", "main", 5),
        Sequence([1, 2, 3, 4, 7], [8], [-0.3], "solver", "main", 6, parent=0),
        Sequence([9], [10], [-0.4], "judge", "frozen", 0, trainable=False),
    ],
    reward=1.0,
)


def test_trace_table_has_a_rendered_card_per_sequence():
    table = trace_table([TRACE], decode)
    assert table.columns[-1] == "view" and len(table.data) == 3
    assert [row[:5] for row in table.data] == [
        ["t<0>", 0, "solver", "main", 5],
        ["t<0>", 1, "solver", "main", 6],
        ["t<0>", 2, "judge", "frozen", 0],
    ]
    cards = [row[-1].html for row in table.data]
    assert 'class="tok generated"' in cards[0] and "row 1 (#0 → #1)" in cards[0]
    # the continuation shows only its new prompt token (<7>), not its parent's
    assert "⋯ 4 tokens: #0" in cards[1] and "&lt;7&gt;" in cards[1]
    assert "&lt;1&gt;" not in cards[1].split('class="seq')[1]
    assert "frozen: not trained" in cards[2] and 'class="tok masked"' in cards[2]


def test_run_logger_logs_the_table_offline(tmp_path):
    logger = RunLogger(tmp_path, "offline", "tracerl-test", "metrics", {})
    logger.traces(3, [TRACE], decode)
    logger.close()
    [table] = tmp_path.glob("wandb/offline-run-*/files/media/table/rollout/traces_*.table.json")
    assert json.loads(table.read_text())["columns"][-1] == "view"


def reward_trace(reward, question="q"):
    return Trace(
        "t", "g", [Sequence([1], [2], [-0.1], "solver", "main", 0)], reward=reward, info={"question": question}
    )


def evals(rewards, questions=None):
    return [reward_trace(r, q) for r, q in zip(rewards, questions or [f"q{i}" for i in range(len(rewards))])]


def test_paired_comparison_counts_and_sign_test():
    before = evals([0, 0, 0, 0, 0, 0, 1, 1])
    after = evals([1, 1, 1, 1, 1, 0, 1, 0])
    got = paired_comparison(before, after)
    assert got["questions"] == 8 and got["better"] == 5 and got["worse"] == 1
    # two-sided sign test, 6 untied pairs, 1 the minority: 2 * (C(6,0) + C(6,1)) / 2^6
    assert got["sign_test_p"] == pytest.approx(2 * 7 / 64)
    assert paired_comparison(before, before) == {
        "questions": 8,
        "left_out_failed": 0,
        "better": 0,
        "worse": 0,
        "sign_test_p": 1.0,
    }
    even = paired_comparison(evals([0, 1]), evals([1, 0]))
    assert even["sign_test_p"] == 1.0


def test_paired_comparison_counts_a_repeated_question_once():
    questions = ["a", "a", "a", "a", "b"]
    got = paired_comparison(evals([0, 0, 0, 0, 0], questions), evals([1, 1, 1, 1, 1], questions))
    assert got == {"questions": 2, "left_out_failed": 0, "better": 2, "worse": 0, "sign_test_p": 0.5}


def test_advantage_and_train_metrics_are_named_by_policy_and_averaged():
    m = advantage_metrics([reward_trace(1.0), reward_trace(0.0)], [[0.5], [-0.5]], "solver")
    assert m == {
        "train/solver/adv_mean": 0.0,
        "train/solver/adv_std": 0.5,
        "train/solver/adv_min": -0.5,
        "train/solver/adv_max": 0.5,
        "train/solver/adv_count": 2.0,
        "train/solver/adv_frac_zero": 0.0,
        "train/solver/sequences/solver": 2.0,
        "train/solver/nonzero_adv/solver": 2.0,
    }
    stats = {
        "loss": 0.3,
        "grad_norm": 2.0,
        "lr": 1e-5,
        "tokens": 4.0,
        "clip_frac": 1.0,
        "ratio": 4.4,
        "ratio_max": 1.3,
        "mismatch_kl": 0.02,
        "kl_ref": 0.0,
        "entropy": 8.0,
        "skipped_steps": 1.0,
        "padded_tokens": 12.0,
    }
    t = train_metrics(
        stats, {"merge_saving": 0.25, "padding_fraction": 0.1, "rows": 3.0, "shared_prefix_rows": 2.0}, "solver"
    )
    # sums over trained tokens become per-token means; maxima and counts stay as they are
    assert t["train/solver/clip_frac"] == 0.25 and t["train/solver/ratio_mean"] == pytest.approx(1.1)
    assert t["train/solver/entropy"] == 2.0 and t["train/solver/ratio_max"] == 1.3
    assert t["train/solver/trained_tokens"] == 4.0 and t["train/solver/padded_tokens"] == 12.0
    assert t["train/solver/merge_saving"] == 0.25 and t["train/solver/rows"] == 3.0
    assert t["train/solver/shared_prefix_rows"] == 2.0
    assert t["train/solver/skipped_steps"] == 1.0  # the learners' count of skipped (non-finite) steps


def test_step_totals_sum_over_policies():
    m = {
        "perf/a/train_s": 2.0,
        "perf/b/train_s": 3.0,
        "perf/a/sync_s": 0.5,
        "perf/b/sync_s": 0.25,
        "train/a/trained_tokens": 40.0,
        "async/a/dropped_stale": 1.0,
        "async/b/dropped_stale": 2.0,
    }
    assert step_totals(m, ["a", "b"]) == {
        "perf/train_s": 5.0,
        "perf/sync_s": 0.75,
        "train/trained_tokens": 40.0,
        "perf/train_tokens_per_s": 8.0,
        "async/dropped_stale": 3.0,
    }


def engine_info(pid, busy, prefill, decode, decode_steps, batch_sum, generated):
    return {
        "node_id": "n",
        "pid": pid,
        "busy_s": busy,
        "steps": {
            "prefill_s": prefill,
            "decode_s": decode,
            "decode_steps": decode_steps,
            "decode_batch_sum": batch_sum,
            "prefill_tokens": 10.0,
            "cached_prompt_tokens": 0.0,
            "generated_tokens": generated,
        },
    }


def test_rollout_split_is_per_engine_and_counts_a_restarted_engine_from_zero():
    before = [engine_info(1, 10.0, 1.0, 5.0, 50, 200, 300), engine_info(2, 4.0, 0.5, 2.0, 20, 40, 80)]
    # engine 1 ran 6 s more; engine 2 restarted (a new pid) and ran 2 s since
    after = [engine_info(1, 16.0, 1.5, 10.0, 100, 600, 900), engine_info(3, 2.0, 0.2, 1.0, 10, 20, 40)]
    m = rollout_split(before, after, window_s=8.0)
    assert m["perf/engine_busy_s"] == pytest.approx((6.0 + 2.0) / 2)
    assert m["perf/engine_prefill_s"] == pytest.approx((0.5 + 0.2) / 2)
    assert m["perf/engine_decode_s"] == pytest.approx((5.0 + 1.0) / 2)
    assert m["perf/engine_other_s"] == pytest.approx(4.0 - 0.35 - 3.0)
    assert m["perf/engine_idle_s"] == pytest.approx(8.0 - 4.0)
    assert m["rollout/decode_steps"] == 60 and m["rollout/decode_batch"] == pytest.approx(420 / 60)
    assert m["perf/engine_generated_tokens_per_s"] == pytest.approx((600 + 40) / 8.0)
    assert m["rollout/prefill_tokens"] == 10.0  # engine 1's did not change; engine 3's 10 are new


def test_a_resumed_logger_survives_a_torn_last_line_and_keeps_the_rows_up_to_its_step(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "train/main/loss": 0.1 * s}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(rows) + '\n{"step": 5, "train/main/lo')  # killed mid-write of step 5
    with RunLogger(tmp_path, "disabled", "p", None, {}, resume_step=3) as logger:
        assert "left out 1 line(s)" in caplog.text
        # step 4 came after the checkpoint the run resumes from: made again
        assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
        logger.log(4, {"train/main/loss": 0.5})
    got = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in got] == [1, 2, 3, 4] and got[0]["train/main/loss"] == 0.1
    assert got[3]["train/main/loss"] == 0.5
    assert not (tmp_path / "metrics.jsonl.tmp").exists()
