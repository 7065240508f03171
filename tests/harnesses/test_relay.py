"""harness=relay (harnesses/programs/relay.py): the reader's chain, each role's reward for its own job, the
oracle calculator; the trace it leaves on the real engine (tiny model); and a real training run of it
(scripts/train.py, each role its own LoRA adapter of one base, in the background lane)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import pytest

from harnesses.programs.relay import CALCULATOR_PROMPT, chain, relay, show
from harnesses.tasks.story_sum import StorySum, StorySums
from rollout.trace import read_jsonl
from tests import lane

ROOT = Path(__file__).resolve().parents[2]


def story(operands=(3, 5, 2), operators=("+", "-"), answer="6") -> StorySum:
    question = (
        "Ann has 3 apples. Ann finds 5 more apples. Then Ann gives away 2 apples. How many apples does Ann have now?"
    )
    return StorySum("s/train/0", question, question, answer, "Ann", "apples", list(operands), list(operators))


class Scripted:
    """A role whose replies are scripted; with `agent`, the real agent still generates each call (so
    the trace records it) and the script's text is what the harness reads. Calls past the script
    return the agent's own text."""

    def __init__(self, replies: list[str], agent=None):
        self.replies, self.agent, self.calls = list(replies), agent, []

    async def chat(self, prompt, system=None, **sampling):
        self.calls.append((system, prompt))
        text = await self.agent.chat(prompt, system=system, **sampling) if self.agent else None
        return self.replies.pop(0) if self.replies else text


def play(reader: list[str], calculator: list[str], task=None, **options):
    agents = {"reader": Scripted(reader), "calculator": Scripted(calculator)}
    return asyncio.run(relay(task or story(), agents, **options)), agents


# ---- the reader's chain ----------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "reply, operations, found",
    [
        ("3+5-2", 2, "3+5-2"),
        ("3 + 5 - 2 = 6", 2, "3+5-2"),  # a reader that also computes: the chain is what counts
        ("Ann has 3 + 5 = 8 apples, then 8 - 2", 2, None),  # two one-step chains are not one of two
        ("1. 9 + 2 = 11", 1, "9+2"),  # a list number is not an operand
        ("7 - 2 + 4", 1, None),  # a piece of a longer chain is not a chain
        ("<answer>4+4</answer> 3+5", 1, "4+4"),  # the tag, when there is one
        ("2.5 + 3", 1, None),  # decimals are not operands
        ("6", 2, None),  # a bare number would skip the calculator
        ("3 * 5 - 2", 2, None),
        ("", 1, None),
    ],
)
def test_the_reader_chain_is_the_first_whole_chain_of_the_storys_length(reply, operations, found):
    parsed = chain(reply, operations)
    assert (parsed and parsed[0]) == found


@pytest.mark.unit
def test_a_chain_gives_its_value_first_operand_and_steps():
    assert chain("12 - 3 + 4", 2) == ("12-3+4", Fraction(13), 12, [("-", 3), ("+", 4)])
    assert chain("1" * 40 + "+1", 1) is None, "over the whitelist parser's digit limit"
    assert chain("1+" * 5000 + "1", 2) is None, "a long chain is not one of two steps (and only its head is read)"
    assert show(Fraction(15, 2)) == "7.5" and show(Fraction(-3)) == "-3"


# ---- rewards --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_right_relay_pays_every_role_and_the_calculator_sees_only_its_step():
    result, agents = play(["3 + 5 - 2"], ["<answer>8</answer>", "8 - 2 = <answer>6</answer>"])
    assert (result.reward, result.agent_rewards) == (1.0, {"reader": 1.0, "calculator": 1.0})
    assert [p for _, p in agents["calculator"].calls] == [
        CALCULATOR_PROMPT.format(expression="3 + 5"),
        CALCULATOR_PROMPT.format(expression="8 - 2"),
    ]
    system, prompt = agents["reader"].calls[0]
    assert prompt == story().question and "4+3-2" in system  # an example of the story's length
    assert result.info | {"oracle_calculator": False} == result.info
    assert (result.info["expression"], result.info["steps"], result.info["final"]) == ("3+5-2", ["3 + 5", "8 - 2"], "6")


@pytest.mark.unit
def test_the_calculator_is_paid_for_its_own_job_when_the_reader_erred():
    result, agents = play(["3 + 5 + 2"], ["<answer>8</answer>", "<answer>10</answer>"])
    assert (result.reward, result.agent_rewards) == (0.0, {"reader": 0.0, "calculator": 1.0})
    assert agents["calculator"].calls[1][1] == CALCULATOR_PROMPT.format(expression="8 + 2")


@pytest.mark.unit
def test_the_relay_passes_the_calculators_own_answer_on():
    """A wrong first step: the second is judged against what the calculator was given."""
    result, agents = play(["3+5-2"], ["<answer>9</answer>", "<answer>7</answer>"])
    assert agents["calculator"].calls[1][1] == CALCULATOR_PROMPT.format(expression="9 - 2")
    assert (result.reward, result.agent_rewards) == (0.0, {"reader": 1.0, "calculator": 0.5})
    assert result.info["calculator_right"] == [False, True]


@pytest.mark.unit
def test_a_calculator_reply_with_no_number_ends_the_relay():
    result, agents = play(["3+5-2"], ["eight", "<answer>6</answer>"])
    assert len(agents["calculator"].calls) == 1
    assert (result.reward, result.agent_rewards) == (0.0, {"reader": 1.0, "calculator": 0.0})
    assert result.info["final"] is None


@pytest.mark.unit
@pytest.mark.parametrize("reply", ["6", "The answer is 6.", "3 + 5", "3 + 5 - 2 + 0", "<answer>3*2</answer>"])
def test_a_reply_that_is_no_chain_of_the_storys_length_ends_the_relay_unpaid(reply):
    result, agents = play([reply], ["<answer>6</answer>"])
    assert agents["calculator"].calls == []
    assert (result.reward, result.agent_rewards) == (0.0, {"reader": 0.0})


@pytest.mark.unit
def test_the_oracle_calculator_replaces_the_calculator_with_exact_arithmetic():
    right, agents = play(["3 + 5 - 2"], [], oracle_calculator=True)
    assert agents["calculator"].calls == []
    assert (right.reward, right.agent_rewards) == (1.0, {"reader": 1.0})
    assert right.info["steps"] == ["3 + 5", "8 - 2"] and right.info["oracle_calculator"] is True
    wrong, _ = play(["3 + 5 + 2"], [], oracle_calculator=True)
    assert (wrong.reward, wrong.agent_rewards) == (0.0, {"reader": 0.0})


@pytest.mark.unit
def test_one_operation_stories_take_one_calculator_call():
    task = story((7, 4), ("-",), "3")
    result, agents = play(["7 - 4"], ["<answer>3</answer>"], task=task)
    assert len(agents["calculator"].calls) == 1 and "4+3" in agents["reader"].calls[0][0]
    assert (result.reward, result.agent_rewards) == (1.0, {"reader": 1.0, "calculator": 1.0})


# ---- the trace on the real engine -------------------------------------------------------------


async def relay_scripted(task, agents, reader: list[str], calculator: list[str] = (), **options):
    """harness=relay with the replies the harness reads scripted (the tiny model writes no chains);
    the real agents still generate every call, so the trace is the engine's."""
    agents = {"reader": Scripted(reader, agents["reader"]), "calculator": Scripted(calculator, agents["calculator"])}
    return await relay(task, agents, **options)


def step(a: int, op: str, b: int) -> Fraction:
    return Fraction(a + b if op == "+" else a - b)


def decoded(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=True)


@pytest.mark.integration
def test_the_relays_trace_is_a_reader_then_one_fresh_calculator_context_a_step(run_harness, tiny_tokenizer):
    from harnesses.tasks.story_sum import read_number

    task = StorySums("story_sum", {"operations": 2}, eval_size=4).train_task(0)
    first, second = f"{task.operands[0]} {task.operators[0]} {task.operands[1]}", "7"
    gold_chain = f"{task.operands[0]}{task.operators[0]}{task.operands[1]}{task.operators[1]}{task.operands[2]}"
    _, seqs, result = run_harness(
        "tests.harnesses.test_relay.relay_scripted",
        ["reader", "calculator"],
        task=task,
        reader=[gold_chain],
        calculator=["<answer>7</answer>"],  # step 1 scripted; step 2 is the tiny model's own
    )
    assert [s.agent for s in seqs] == ["reader", "calculator", "calculator"]
    assert all(s.parent is None for s in seqs), "every call is a fresh context"
    reader_prompt = decoded(tiny_tokenizer, seqs[0].prompt_ids)
    assert task.question in reader_prompt and "Reply with only the expression" in reader_prompt
    for seq, expression in zip(seqs[1:], (first, f"{second} {task.operators[1]} {task.operands[2]}")):
        prompt = decoded(tiny_tokenizer, seq.prompt_ids)
        assert CALCULATOR_PROMPT.format(expression=expression) in prompt
        assert task.person not in prompt and task.objects not in prompt, "the calculator never sees the story"
    ops = task.operators
    want = [step(task.operands[0], ops[0], task.operands[1]), step(7, ops[1], task.operands[2])]
    said = [Fraction(7), read_number(decoded(tiny_tokenizer, seqs[2].completion_ids))]
    right = [s == w for s, w in zip(said, want)]
    assert result.agent_rewards == {"reader": 1.0, "calculator": sum(right) / 2}
    assert result.reward == float(said[1] == int(task.answer))
    assert result.info["calculator_right"] == right


@pytest.mark.integration
def test_the_oracle_relays_trace_has_the_reader_alone(run_harness, tiny_tokenizer):
    task = StorySums("story_sum", {"operations": 1}, eval_size=4).train_task(1)
    _, seqs, result = run_harness(
        "tests.harnesses.test_relay.relay_scripted",
        ["reader", "calculator"],
        task=task,
        reader=[f"{task.operands[0]} {task.operators[0]} {task.operands[1]}"],
        oracle_calculator=True,
    )
    assert [s.agent for s in seqs] == ["reader"]
    assert (result.reward, result.agent_rewards) == (1.0, {"reader": 1.0})


@pytest.mark.integration
def test_the_tiny_readers_own_reply_is_read(run_harness, tiny_tokenizer):
    """No script: whatever the reader writes decides how many calculator calls follow."""
    task = StorySums("story_sum", {"operations": 1}, eval_size=4).train_task(2)
    _, seqs, result = run_harness("harnesses.programs.relay.relay", ["reader", "calculator"], task=task)
    parsed = chain(decoded(tiny_tokenizer, seqs[0].completion_ids), 1)
    assert [s.agent for s in seqs] == ["reader"] + ["calculator"] * (parsed is not None)
    assert result.agent_rewards["reader"] == float(parsed is not None and parsed[1] == int(task.answer))


# ---- the relay trained: scripts/train.py, two LoRA adapters of one base (background lane) ------

RUN = Path(tempfile.gettempdir()).resolve() / f"tracerl-relay-train-{os.getpid()}"
# experiment=relay_team_lora on the tiny model: reader and calculator each its own LoRA adapter of
# one base, trained on its own reward (algorithm=grpo_per_agent); 2 steps of 2 groups of 4
TRAIN = [
    "experiment=relay_team_lora",
    "model=tiny",
    "logger=disabled",
    "trainer.steps=2",
    "trainer.groups_per_step=2",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.rollouts_every=1",
    "rollout.group_size=4",
    "eval.size=4",
    "task.eval_size=4",
    "engine.kv_cache_gb=0.25",
]
LANE_TESTS = {"test_the_relay_trains_each_roles_lora_adapter_on_its_own_reward": "relay_training"}


def lane_jobs() -> dict[str, lane.Job]:
    code = f"from tests.harnesses.test_relay import train_relay; train_relay({str(RUN)!r})"
    return {"relay_training": lane.Job(["-c", code], 900)}


def train_relay(out: str) -> None:
    """The lane's job: scripts/train.py on TRAIN into `out`, as a user runs it; a JSON line of its exit."""
    args = ["scripts/train.py", *TRAIN, f"run_dir={out}"]
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout[-3000:], "stderr": proc.stderr[-3000:]}))


@pytest.mark.e2e
def test_the_relay_trains_each_roles_lora_adapter_on_its_own_reward():
    """A product run of the relay harness (the studies' relay runs cover it in make test-studies): two
    LoRA adapters of one base served by one engine, each policy's batch its own role's rows, the
    relay's trace."""
    try:
        r = lane.result("relay_training")
        assert r["returncode"] == 0, r["stdout"] + r["stderr"]
        summary = json.loads((RUN / "summary.json").read_text())
        # the tiny model's stories pay nothing yet (no whole chain): no gradient, but every step's batch
        # is split by policy, each adapter getting its own role's rows only
        assert sorted(summary["trainable_policies"]) == ["calculator", "reader"], summary
        steps = [
            m
            for m in map(json.loads, (RUN / "metrics.jsonl").read_text().splitlines())
            if "rollout/generated_tokens" in m
        ]
        assert len(steps) == 2
        for m in steps:
            assert m["train/reader/sequences/reader"] > 0 and "train/reader/adv_count" in m, m
            assert not [
                k for k in m if k.startswith(("train/reader/sequences/calculator", "train/calculator/sequences/reader"))
            ]
        assert summary["policies"]["reader"]["engine_nodes"] == summary["policies"]["calculator"]["engine_nodes"]
        traces = list(read_jsonl(RUN / "rollouts" / "step_2.jsonl"))
        assert traces and all(set(t.agents) <= {"reader", "calculator"} and "expression" in t.info for t in traces)
    finally:
        shutil.rmtree(RUN, ignore_errors=True)


def other(policy: str) -> str:
    return "calculator" if policy == "reader" else "reader"
