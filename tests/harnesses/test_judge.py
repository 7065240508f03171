"""The LLM-judge verifier (harnesses/judge.py): its verdicts are read under the hostile-input
rules (unit), and in a real rollout worker on the shared tiny engine the judge is an agent of
the episode: its sequence is in the trace, frozen, untrained, and the reward is its verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesses.base import collect_scoring_notes
from harnesses.verifiers import make_verifier

ROOT = Path(__file__).resolve().parents[2]


def verdict(reply: str, **options) -> tuple[float, list[str]]:
    judge = make_verifier("judge", options)
    with collect_scoring_notes() as notes:
        return judge.read_verdict(reply), notes


@pytest.mark.unit
@pytest.mark.parametrize(
    "reply, reward",
    [
        ("It matches. <answer>yes</answer>", 1.0),
        ("<answer> YES. </answer>", 1.0),
        ("<answer>no</answer>", 0.0),
        ("<answer>no</answer> wait <answer>yes</answer>", 1.0),  # the last tag rules
        ("Yes, it does.", 1.0),
        ("  no", 0.0),
        ("No. <answer>yes</answer>", 1.0),  # untagged: the first word
    ],
)
def test_yes_no_verdicts(reply, reward):
    assert verdict(reply) == (reward, [])


@pytest.mark.unit
@pytest.mark.parametrize(
    "reply, options, why",
    [
        ("yes", {"first_word": False}, "no <answer> tag"),
        ("Yesterday it was 3", {}, "no <answer> tag"),
        ("The answer is yes", {}, "no <answer> tag"),
        ("<answer>maybe</answer>", {}, "neither yes nor no"),
        ("<answer>" + "yes " * 50 + "</answer>", {}, "the limit is 20"),
        ("<answer>9**9**9</answer>", {"verdict": "score"}, "not a number"),
        ("<answer>11</answer>", {"verdict": "score"}, "not a number in [0, 10.0]"),
        ("<answer>-1</answer>", {"verdict": "score"}, "not a number in [0, 10.0]"),
        ("<answer>1e3</answer>", {"verdict": "score"}, "not a number"),
        ("<answer>" * 50_000, {}, "no <answer> tag"),
    ],
)
def test_refused_verdicts_score_zero_and_say_why(reply, options, why):
    reward, notes = verdict(reply, **options)
    assert reward == 0.0 and len(notes) == 1 and why in notes[0] and "judge verdict refused" in notes[0], notes


@pytest.mark.unit
def test_score_verdicts_scale_to_one():
    assert verdict("<answer>7</answer>", verdict="score") == (0.7, [])
    assert verdict("<answer>3.5</answer>", verdict="score", max_score=5) == (0.7, [])


@pytest.mark.unit
@pytest.mark.parametrize(
    "options, message",
    [
        ({"verdict": "maybe"}, "verdict='maybe'"),
        ({"template": "Judge {question}"}, "no {answer} placeholder"),
        ({"agent": ""}, "agent is empty"),
        ({"max_tokens": 0}, "max_tokens=0"),
        ({"judge_model": "x"}, "judge_model"),
    ],
)
def test_bad_judge_options_are_named(options, message):
    with pytest.raises(ValueError, match="task.params.verifier") as e:
        make_verifier("judge", options)
    assert message in str(e.value)


@pytest.mark.unit
def test_scoring_outside_an_episode_says_where_it_runs():
    with pytest.raises(ValueError, match="only inside a rollout episode"):
        make_verifier("judge", {}).score("<answer>3</answer>", "3", {}, question="1 + 2?")


@pytest.mark.unit
def test_a_judge_on_a_trained_policy_or_unmapped_is_refused_at_start():
    from trainer.config import compose, validate

    base = ["experiment=smollm2_single_turn", "task=file", "task.params.verifier=judge"]
    with pytest.raises(ValueError, match=r"add \+agents.judge=frozen"):
        validate(compose("train", base))
    with pytest.raises(ValueError, match="agents.judge=main is a trained policy"):
        validate(compose("train", base + ["+agents.judge=main"]))
    validate(compose("train", base + ["+agents.judge=frozen"]))


def run_worker_eval(engine, tiny_path, options: dict, items: int = 4):
    """A RolloutWorker on the shared engine runs single_turn on `items` held-out items of
    examples/arith.jsonl scored by the judge (the judge role on the frozen policy)."""
    import ray

    from rollout.config import GenerateJobConfig, HarnessConfig, RolloutConfig, SamplingConfig, TaskConfig
    from rollout.orchestration.cluster import spawn_buffer, spawn_workers

    params = {"path": str(ROOT / "examples" / "arith.jsonl"), "verifier": "judge", "verifier_options": options}
    cfg = GenerateJobConfig(
        harness=HarnessConfig(_target_="harnesses.single_turn.single_turn", name="single_turn", roles=["solver"]),
        agents={"solver": "main", "judge": "frozen"},
        rollout=RolloutConfig(concurrency=8, timeout_s=60),
        task=TaskConfig(_target_="harnesses.file_tasks.FileTasks", name="arith", params=params, eval_size=items),
        sampling=SamplingConfig(max_tokens=12),
    )
    policies = {"main": [engine], "frozen": [engine]}
    buffer = spawn_buffer(1, {p: 512 for p in policies})
    [worker] = spawn_workers(cfg, policies, {p: tiny_path for p in policies}, buffer)
    try:
        return ray.get(
            worker.evaluate.remote(list(range(items)), SamplingConfig(temperature=0.0, max_tokens=12)), timeout=120
        )
    finally:
        ray.kill(worker)
        ray.kill(buffer)


@pytest.mark.integration
def test_the_judge_is_a_frozen_agent_of_the_episode_and_its_tokens_are_not_trained(engine, tiny_path):
    from transformers import AutoTokenizer

    from harnesses.judge import Judge
    from trainer.packing import build_rows, token_weights

    tok = AutoTokenizer.from_pretrained(tiny_path)
    traces = run_worker_eval(engine, tiny_path, {"max_tokens": 8})
    judge = Judge(max_tokens=8)
    for t in traces:
        assert t.status != "failed", t.error
        solver, jury = t.sequences  # the solver's answer, then the judge's verdict on it
        assert (solver.agent, solver.policy, solver.trainable) == ("solver", "main", True)
        assert (jury.agent, jury.policy, jury.trainable, jury.version) == ("judge", "frozen", False, 0)
        assert jury.temperature == 0.0 and 0 < len(jury.completion_ids) <= 8
        prompt = tok.decode(jury.prompt_ids)
        answer = tok.decode(solver.completion_ids, skip_special_tokens=True)
        assert f"Question: {t.info['question']}" in prompt and f"Proposed answer: {answer}" in prompt
        # the reward is the verdict read from the judge's own recorded reply (the tiny model
        # writes no <answer>yes</answer>: refused, 0, and the trace says why)
        with collect_scoring_notes() as notes:
            assert t.reward == judge.read_verdict(tok.decode(jury.completion_ids, skip_special_tokens=True))
        assert t.info.get("scoring", []) == notes
    # the learner's rows: the solver's tokens carry weight, none of the judge's
    weights = token_weights(traces, "token")
    assert all(w[0] > 0 and w[1] == 0 for w in weights)
    rows = build_rows(traces, [[1.0, 1.0]] * len(traces), weights)
    trained = sum(len(s.completion_ids) for t in traces for s in t.sequences if s.agent == "solver")
    assert sum(sum(w > 0 for w in r.weights) for r in rows) == trained


@pytest.mark.integration
def test_an_answer_over_max_chars_is_not_sent_to_the_judge(engine, tiny_path):
    traces = run_worker_eval(engine, tiny_path, {"max_chars": 1}, items=2)
    for t in traces:
        assert [s.agent for s in t.sequences] == ["solver"] and t.reward == 0.0
        assert "answer not judged" in t.info["scoring"][0]
