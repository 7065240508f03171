"""Each shipped harness against the real engine (tiny model): the trace shape its docstring claims."""

import asyncio

from harnesses.base import HarnessResult, as_result, load_harness
from harnesses.tasks import ReasoningGymTasks
from rollout.client import Agent, ChatFormat, TraceRecorder
from rollout.config import SamplingConfig
from rollout.router import Router


def run(engine, tok, target, roles, task_index=0):
    task = ReasoningGymTasks("chain_sum", {"min_terms": 2, "max_terms": 3}).train_task(task_index)
    rec = TraceRecorder(f"t{task_index}")
    fmt = ChatFormat(tok)
    agents = {r: Agent(r, "main", Router([engine]), fmt, rec, SamplingConfig(max_tokens=16)) for r in roles}
    result = as_result(asyncio.run(load_harness(target)(task, agents)))
    return task, rec.sequences, result


def test_single_turn_shape(engine, tiny_tokenizer):
    task, seqs, result = run(engine, tiny_tokenizer, "harnesses.single_turn.single_turn", ["solver"])
    assert len(seqs) == 1 and seqs[0].agent == "solver"
    assert task.question in tiny_tokenizer.decode(seqs[0].prompt_ids)
    assert result.reward == task.score(tiny_tokenizer.decode(seqs[0].completion_ids, skip_special_tokens=True))


def test_solver_verifier_shape(engine, tiny_tokenizer):
    task, seqs, result = run(engine, tiny_tokenizer, "harnesses.solver_verifier.solver_verifier",
                             ["solver", "verifier"])
    assert [s.agent for s in seqs] == ["solver", "verifier", "solver"]
    assert [s.parent for s in seqs] == [None, None, 0]
    draft, critique, final = seqs
    head = draft.prompt_ids + draft.completion_ids
    assert final.prompt_ids[:len(head)] == head, "the revision continues the solver's conversation"
    assert critique.prompt_ids[:len(head)] != head, "the verifier starts from a fresh context"
    draft_text = tiny_tokenizer.decode(draft.completion_ids, skip_special_tokens=True)
    assert draft_text.strip() in tiny_tokenizer.decode(critique.prompt_ids), "the verifier sees the draft"
    assert isinstance(result, HarnessResult)
    final_text = tiny_tokenizer.decode(final.completion_ids, skip_special_tokens=True)
    assert result.reward == task.score(final_text)


def test_as_result_rejects_bad_values():
    import math

    import pytest

    assert as_result(True).reward == 1.0
    assert as_result({"a": 1.0, "b": 0.0}).agent_rewards == {"a": 1.0, "b": 0.0}
    with pytest.raises(ValueError, match="non-finite"):
        as_result(math.inf)
    with pytest.raises(ValueError, match="expected a float reward"):
        as_result("good")
    with pytest.raises(ValueError, match="cannot be imported"):
        load_harness("harnesses.nope.missing")
