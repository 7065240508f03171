"""A verifiers environment, installed as a package (examples/verifiers_env: tracerl-vf-arith, verifiers
0.3.1's MultiTurnEnv with feedback), as tracerl's task=verifiers and harness=verifiers_env: its rows
as tasks held out by content, its own rollout through the gateway on the real shared engine (tiny
model, its tokenizer and chat template), its rubric's reward as the trace's."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from harnesses.base import normalize_question

ENV_ID = "tracerl-vf-arith"
# a small question space (2 operands in 1..4: 48 questions), so that the training rows repeat held-out ones
ENV_ARGS = {"num_train": 200, "num_eval": 40, "terms": 2, "max_operand": 4, "max_turns": 2}


def source(eval_size: int = 16, seed: int = 0, **env_args):
    from harnesses.tasks.verifiers_env import VerifiersTasks

    params = {"env_id": ENV_ID, "env_args": {**ENV_ARGS, **env_args}}
    return VerifiersTasks("verifiers", params, eval_size=eval_size, seed=seed)


@pytest.mark.unit
def test_the_rows_are_tasks_held_out_by_content():
    """Every row of the env's eval set (40 rows, 16 held out) and its training rows (200, drawn
    from a seed that also makes some of the eval questions): no training task is a held-out
    question; the tasks are the rows (the prompt is the user message, the answer the row's), the
    same on every build, and they pickle."""
    from tracerl_vf_arith import make_rows

    tasks = source()
    held = tasks.eval_tasks()
    assert len(held) == 16 and len({normalize_question(t.question) for t in held}) == 16
    held_questions = {normalize_question(t.question) for t in held}
    train = [tasks.train_task(i) for i in range(len(tasks))]
    assert len(tasks) == 200
    assert not held_questions & {normalize_question(t.question) for t in train}
    # the training rows overlap the held-out questions (the test would prove nothing otherwise)
    raw_train = {r["question"] for r in make_rows(200, 0, terms=2, max_operand=4)}
    assert len({t.prompt for t in held} & raw_train) >= 8, "the held-out questions are not among the raw rows"
    assert len(tasks) == 200 and len({t.question for t in train}) < len(raw_train)
    t = train[0]
    assert t.prompt.startswith("What is ") and t.row["prompt"][-1] == {"role": "user", "content": t.prompt}
    assert t.answer == t.row["answer"] and t.env_id == ENV_ID
    assert [x.id for x in source().eval_tasks()] == [x.id for x in held]
    assert source().train_task(5).question == tasks.train_task(5).question
    assert pickle.loads(pickle.dumps(tasks)).train_task(3).question == tasks.train_task(3).question


@pytest.mark.unit
def test_score_is_the_envs_rubric_on_one_assistant_turn():
    """task.score(text) runs the environment's rubric: the gold answer in tags or bare scores 1,
    a wrong one 0; outside an event loop and inside one (no episode: on a thread of its own)."""
    t = source().train_task(0)
    assert t.score(f"I think <answer>{t.answer}</answer>") == 1.0
    assert t.score(f"so it is {t.answer}") == 1.0
    assert t.score(f"<answer>{int(t.answer) + 1}</answer>") == 0.0

    async def inside_a_loop():
        return t.score(f"<answer>{t.answer}</answer>")

    assert asyncio.run(inside_a_loop()) == 1.0


@pytest.mark.unit
def test_a_bad_env_id_or_env_arg_is_a_clear_error():
    from harnesses.tasks.verifiers_env import VerifiersTasks

    with pytest.raises(ValueError, match=r"task.params.env_id='no-such-env'.*Could not import.*no_such_env"):
        VerifiersTasks("verifiers", {"env_id": "no-such-env"})
    with pytest.raises(ValueError, match=r"task.params.env_args=\{'bogus': 1\}.*failed to load.*bogus"):
        VerifiersTasks("verifiers", {"env_id": ENV_ID, "env_args": {"bogus": 1}})
    with pytest.raises(ValueError, match=r"task.params.env_id is required"):
        VerifiersTasks("verifiers", {})
    with pytest.raises(ValueError, match=r"task.params.path: task 'verifiers' takes env_id and env_args"):
        VerifiersTasks("verifiers", {"env_id": ENV_ID, "path": "x"})
    with pytest.raises(ValueError, match=r"only \d+ distinct questions in 40 held-out draws.*task.eval_size=64"):
        source(eval_size=64).eval_tasks()


@pytest.mark.integration
def test_the_envs_rollout_runs_through_the_gateway_and_its_rubric_is_the_reward(run_harness, tiny_tokenizer):
    """The env's own multi-turn rollout on a row, unmodified, through the gateway: each model turn a
    trainable sequence of the one role; a wrong first answer (the tiny model's) gets the env's
    feedback, and the second turn extends the first token-exact (its prompt holds the first
    turn's ids, then the feedback); the reward is the env's rubric, the same as the rubric rerun
    on the recorded last turn's text."""
    from tracerl_vf_arith import FEEDBACK

    from rollout.agents.chat_format import ChatFormat

    task = source().train_task(1)
    _, seqs, result = run_harness(
        "harnesses.programs.verifiers_env.verifiers_env", ["solver"], task=task, max_tokens=24
    )
    trace = [(s.agent, s.parent, len(s.prompt_ids), len(s.completion_ids)) for s in seqs]
    info, fmt = result.info, ChatFormat(tiny_tokenizer)
    assert all(s.agent == "solver" and s.policy == "main" and s.trainable for s in seqs), trace
    assert info["gateway_fresh"] == 1 and info["gateway_extended"] == len(seqs) - 1, (trace, info)
    assert info["metrics"]["num_turns"] == len(seqs) and info["env_error"] is None, info
    last_text = fmt.decode(seqs[-1].completion_ids)
    assert info["answer"] == last_text[-2000:]
    assert result.reward == task.score(last_text) == info["metrics"]["correct_answer"]
    if result.reward == 1.0 and len(seqs) == 1:
        assert info["stop_condition"] == "answered_correctly"
        return
    assert len(seqs) == ENV_ARGS["max_turns"] == 2 and info["stop_condition"] == "max_turns_reached", (trace, info)
    first, second = seqs
    assert second.parent == 0 and second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids, trace
    assert second.prompt_ids[len(first.prompt_ids) :][: len(first.completion_ids)] == first.completion_ids
    assert FEEDBACK in fmt.decode(second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :])


@pytest.mark.integration
def test_a_rollout_worker_runs_the_env_as_a_training_run_does(engine, tiny_path):
    """task=verifiers and harness=verifiers_env in a RolloutWorker actor (the env loaded there, off the
    main thread, keeping the actor's signal handlers), over the shared engine: no trace fails, its
    reward the rubric's, its sequences the model turns, its info the gateway's merge counts."""
    import ray

    from rollout.config import GenerateJobConfig, HarnessConfig, RolloutConfig, SamplingConfig, TaskConfig
    from rollout.orchestration.cluster import spawn_buffer, spawn_workers

    cfg = GenerateJobConfig(
        harness=HarnessConfig(
            _target_="harnesses.programs.verifiers_env.verifiers_env", name="verifiers_env", roles=["solver"]
        ),
        agents={"solver": "main"},
        task=TaskConfig(
            _target_="harnesses.tasks.verifiers_env.VerifiersTasks",
            name="verifiers",
            params={"env_id": ENV_ID, "env_args": ENV_ARGS},
            eval_size=8,
        ),
        rollout=RolloutConfig(concurrency=4, group_size=2, timeout_s=60.0),
        sampling=SamplingConfig(max_tokens=12),
    )
    buffer = spawn_buffer(2, {"main": 512})
    [worker] = spawn_workers(cfg, {"main": [engine]}, {"main": (tiny_path, None)}, buffer)
    try:
        stats = ray.get(worker.run.remote([0, 1]), timeout=300)
        groups = ray.get(buffer.get.remote(2, timeout_s=5), timeout=60)
    finally:
        ray.kill(worker)
        ray.kill(buffer)
    traces = [t for group in groups for t in group]
    assert len(traces) == 4, stats
    for t in traces:
        # truncated: a turn of the tiny model's hit max_tokens
        assert t.status in ("ok", "truncated") and t.error is None, t.error
        assert 1 <= len(t.sequences) <= 2 and all(s.agent == "solver" and s.trainable for s in t.sequences)
        assert t.info["gateway_fresh"] == 1 and t.info["gateway_extended"] == len(t.sequences) - 1, t.info
        assert t.reward == t.info["metrics"]["correct_answer"] and t.info["env_id"] == ENV_ID


@pytest.mark.integration
def test_a_model_call_the_gateway_refuses_fails_the_trace_naming_the_field(run_harness):
    """A sampling setting the learner cannot reproduce (top_p) is refused by the gateway; verifiers
    keeps the error in its state and ends the rollout, and the harness fails the trace with it rather
    than scoring a rollout whose call never ran."""
    with pytest.raises(RuntimeError, match=r"the environment's rollout failed: .*top_p=0.5 is not supported"):
        run_harness(
            "harnesses.programs.verifiers_env.verifiers_env",
            ["solver"],
            task=source().train_task(2),
            sampling={"top_p": 0.5},
        )


@pytest.mark.unit
def test_the_harness_needs_a_verifiers_task_and_checks_its_options():
    from harnesses.programs.verifiers_env import check_options, verifiers_env
    from harnesses.tasks.reasoning_gym import ReasoningGymTasks

    task = ReasoningGymTasks("chain_sum", {"min_terms": 2, "max_terms": 2}).train_task(0)
    with pytest.raises(ValueError, match="it needs task=verifiers"):
        asyncio.run(verifiers_env(task, {}))
    with pytest.raises(ValueError, match="harness.options.sampling=.* must be a mapping"):
        check_options({"sampling": ["top_p"]})
    with pytest.raises(ValueError, match="harness.options.timeout_s must be > 0"):
        check_options({"timeout_s": 0})
