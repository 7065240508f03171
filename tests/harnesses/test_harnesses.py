"""Each shipped harness against the real engine (tiny model): the trace shape its docstring claims."""

import pytest

from harnesses.base import HarnessResult, as_result, load_harness
from rollout.trace import Trace
from trainer.packing import build_rows, token_weights


def text(tok, ids):
    return tok.decode(ids, skip_special_tokens=True)


def extends(seq, earlier):
    """Whether `seq`'s prompt continues `earlier` exactly (prompt + completion)."""
    head = earlier.prompt_ids + earlier.completion_ids
    return seq.prompt_ids[: len(head)] == head


def merged_rows(seqs, reward=1.0):
    """Training rows of these sequences as one trace (exact-prefix merging), as lists of indices."""
    trace = Trace("t", "g", seqs, reward=reward)
    weights = token_weights([trace], "token")
    return [r.sequences for r in build_rows([trace], [[1.0] * len(seqs)], weights)]


@pytest.mark.integration
def test_single_turn_shape(run_harness, tiny_tokenizer):
    task, seqs, result = run_harness("harnesses.programs.single_turn.single_turn", ["solver"])
    assert len(seqs) == 1 and seqs[0].agent == "solver"
    assert task.question in tiny_tokenizer.decode(seqs[0].prompt_ids)
    assert result.reward == task.score(tiny_tokenizer.decode(seqs[0].completion_ids, skip_special_tokens=True))


@pytest.mark.integration
def test_solver_verifier_shape(run_harness, tiny_tokenizer):
    task, seqs, result = run_harness("harnesses.programs.solver_verifier.solver_verifier", ["solver", "verifier"])
    assert [s.agent for s in seqs] == ["solver", "verifier", "solver"]
    assert [s.parent for s in seqs] == [None, None, 0]
    draft, critique, final = seqs
    head = draft.prompt_ids + draft.completion_ids
    assert final.prompt_ids[: len(head)] == head, "the revision continues the solver's conversation"
    assert critique.prompt_ids[: len(head)] != head, "the verifier starts from a fresh context"
    draft_text = tiny_tokenizer.decode(draft.completion_ids, skip_special_tokens=True)
    assert draft_text.strip() in tiny_tokenizer.decode(critique.prompt_ids), "the verifier sees the draft"
    assert isinstance(result, HarnessResult)
    final_text = tiny_tokenizer.decode(final.completion_ids, skip_special_tokens=True)
    assert result.reward == task.score(final_text)


@pytest.mark.integration
def test_solver_verifier_with_verdicts_rewards_each_role_for_its_own_job(run_harness, tiny_tokenizer):
    from harnesses.programs.solver_verifier import verdict

    task, seqs, result = run_harness(
        "harnesses.programs.solver_verifier.solver_verifier", ["solver", "verifier"], verdicts=True
    )
    draft, critique, final = (text(tiny_tokenizer, s.completion_ids) for s in seqs)
    assert "VERDICT: CORRECT or VERDICT: WRONG" in tiny_tokenizer.decode(seqs[1].prompt_ids)
    said = verdict(critique)
    right = said is not None and said == (task.score(draft) >= 1.0)
    assert result.reward == task.score(final)
    assert result.agent_rewards == {"solver": task.score(final), "verifier": float(right)}
    assert result.info["verdict"] == said and result.info["draft_score"] == task.score(draft)


@pytest.mark.integration
def test_majority_vote_samples_k_fresh_answers_and_scores_the_most_common(run_harness, tiny_tokenizer):
    from harnesses.programs.majority_vote import majority

    task, seqs, result = run_harness("harnesses.programs.majority_vote.majority_vote", ["solver"], k=4, temperature=1.0)
    assert len(seqs) == 4 and all(s.agent == "solver" and s.parent is None for s in seqs)
    assert all(s.prompt_ids == seqs[0].prompt_ids and s.temperature == 1.0 for s in seqs)
    assert len({tuple(s.completion_ids) for s in seqs}) > 1, "each call has its own seed"
    texts = [text(tiny_tokenizer, s.completion_ids) for s in seqs]
    answers = [task.extract_answer(t) for t in texts]  # the trace holds them in the order they finished
    voted = result.info["answers"]  # in the order they were asked for: the tie rule's order
    assert sorted(map(str, voted)) == sorted(map(str, answers))
    winner = voted[majority(voted)]
    assert result.info["votes"] == (voted.count(winner) if winner is not None else 0)
    assert result.reward == task.score(texts[answers.index(winner)])


@pytest.mark.unit
def test_the_majority_is_the_first_sample_of_the_most_common_answer():
    from harnesses.programs.majority_vote import majority

    assert majority(["3", "4", "4", "3"]) == 0  # a tie goes to the answer seen first
    assert majority([None, "7", None, "8", "8"]) == 3
    assert majority([None, None, "5"]) == 2  # no answer never wins
    assert majority([None, None]) == 0


@pytest.mark.unit
def test_a_critiques_verdict_is_its_last_verdict_word():
    from harnesses.programs.solver_verifier import verdict

    assert verdict("3 + 4 = 7. VERDICT: CORRECT") is True
    assert verdict("It says 8 but 3 + 4 = 7. VERDICT: WRONG") is False
    assert verdict("That is not correct: 3 + 4 = 7.") is False
    assert verdict("Incorrect at first glance, but on checking it is correct.") is True
    assert verdict("I cannot tell.") is None and verdict("") is None
    assert verdict("correctly " * 10_000) is None  # words, not prefixes; linear in the text


@pytest.mark.unit
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


@pytest.mark.integration
def test_solver_verifier_corrector_shape(run_harness, tiny_tokenizer):
    task, seqs, result = run_harness(
        "harnesses.programs.solver_verifier_corrector.solver_verifier_corrector",
        ["solver", "verifier", "corrector"],
        rounds=3,
    )
    verdicts = result.info["accepted"]
    assert 1 <= result.info["rounds"] == len(verdicts) <= 3
    expected = ["solver"]
    for ok in verdicts:
        expected += ["verifier"] + ([] if ok else ["corrector"])
    assert [s.agent for s in seqs] == expected
    corrector = [i for i, s in enumerate(seqs) if s.agent == "corrector"]
    assert [seqs[i].parent for i in corrector] == [None] + corrector[:-1], "corrector turns chain"
    for i in corrector[1:]:
        assert extends(seqs[i], seqs[seqs[i].parent])
    assert all(s.parent is None for s in seqs if s.agent == "verifier")
    final = seqs[corrector[-1]] if corrector else seqs[0]  # the last answer anyone wrote
    assert result.reward == task.score(text(tiny_tokenizer, final.completion_ids))
    verifier = [[i] for i, s in enumerate(seqs) if s.agent == "verifier"]
    assert sorted(merged_rows(seqs)) == sorted([[0]] + verifier + ([corrector] if corrector else []))


@pytest.mark.unit
def test_verdict_parsing():
    from harnesses.programs.solver_verifier_corrector import accepted

    assert accepted("ACCEPT. The sum is right.")
    assert not accepted("REJECT: 3 + 4 is 7, not 8.")
    assert not accepted("I accept nothing") and not accepted("ACCEPT or REJECT?")


@pytest.mark.integration
def test_debate_shape_with_frozen_judge(run_harness, tiny_tokenizer):
    task, seqs, result = run_harness(
        "harnesses.programs.debate.debate",
        ["debater_a", "debater_b", "judge"],
        frozen={"judge"},
        debaters=2,
        rounds=2,
        per_debater_rewards=True,
    )
    assert [s.agent for s in seqs][-1] == "judge" and len(seqs) == 2 * 2 + 1
    by_role = {r: [i for i, s in enumerate(seqs) if s.agent == r] for r in ("debater_a", "debater_b")}
    for role, (first, second) in by_role.items():
        assert seqs[first].parent is None and seqs[second].parent == first
        assert extends(seqs[second], seqs[first]), f"{role}'s second round continues its conversation"
    a_round1 = text(tiny_tokenizer, seqs[by_role["debater_a"][0]].completion_ids).strip()
    b_round2_prompt = text(tiny_tokenizer, seqs[by_role["debater_b"][1]].prompt_ids)
    if a_round1:
        assert a_round1 in b_round2_prompt, "debater b sees a's argument"
    judge = seqs[-1]
    assert not judge.trainable and judge.policy == "frozen" and judge.parent is None
    assert all(s.trainable for s in seqs[:-1])
    assert result.reward == task.score(text(tiny_tokenizer, judge.completion_ids))
    assert set(result.agent_rewards) == {"debater_a", "debater_b", "judge"}
    for role, (_, last) in by_role.items():
        assert result.agent_rewards[role] == task.score(text(tiny_tokenizer, seqs[last].completion_ids))
    assert sorted(map(sorted, merged_rows(seqs))) == sorted(map(sorted, by_role.values())), (
        "one row per debater; the frozen judge makes none"
    )


@pytest.mark.integration
def test_orchestrator_shape(run_harness, tiny_tokenizer):
    task, seqs, result = run_harness(
        "harnesses.programs.orchestrator.orchestrator", ["orchestrator", "subagent"], max_subagents=3
    )
    k = result.info["subagents"]
    assert 1 <= k <= 3
    assert [s.agent for s in seqs] == ["orchestrator"] + ["subagent"] * k + ["orchestrator"]
    plan, subs, final = seqs[0], seqs[1:-1], seqs[-1]
    assert final.parent == 0 and extends(final, plan)
    for s in subs:
        assert s.parent is None and not extends(s, plan)
    assert result.reward == task.score(text(tiny_tokenizer, final.completion_ids))
    assert sorted(map(sorted, merged_rows(seqs))) == sorted([[0, k + 1]] + [[i] for i in range(1, k + 1)])


@pytest.mark.unit
def test_orchestrator_plan_parsing():
    from harnesses.programs.orchestrator import subtasks

    plan = "Plan:\n- add 3 and 4\n* then add 5\n2. check it\nDone"
    assert subtasks(plan, 5) == ["add 3 and 4", "then add 5", "check it"]
    assert subtasks(plan, 2) == ["add 3 and 4", "then add 5"]
    assert subtasks("no list here", 3) == []
    assert subtasks("  -   padded item  \t\n-\n- \n1) last", 5) == ["padded item", "last"]


@pytest.mark.unit
@pytest.mark.timeout(30)
def test_orchestrator_plan_parsing_is_linear_in_the_plan():
    """Rewards review #13: the plan's item pattern was quadratic in blank lines (16k newlines: 7 s on
    the worker's event loop here; 64k: ~2 minutes). A deadline 1000x over the linear parse's time,
    as a hang guard: the quadratic one cannot meet it."""
    from harnesses.programs.orchestrator import subtasks

    assert subtasks("\n" * 64_000 + "no plan", 3) == []
    assert subtasks("\n" * 200_000 + "- a", 3) == ["a"]
    assert subtasks("- a" + " " * 200_000, 3) == ["a"]
    assert subtasks("x\n" * 100_000 + "- a\n- b", 3) == ["a", "b"]


@pytest.mark.integration
def test_compaction_shape(run_harness, tiny_tokenizer):
    task, seqs, result = run_harness(
        "harnesses.programs.compaction.compaction", ["solver"], budget_tokens=400, max_steps=8, reply_tokens=16
    )
    c = result.info["compactions"]
    assert c >= 1, "a 400-token budget with 8 steps of 16 tokens must compact"
    starts = [i for i, s in enumerate(seqs) if s.parent is None]
    assert len(starts) == c + 1 and starts[0] == 0
    assert len(seqs) == result.info["steps"] + c, "every step plus one summary turn per compaction"
    for i, s in enumerate(seqs):
        assert s.num_tokens <= 400, "no sequence outgrows the budget"
        if s.parent is not None:
            assert s.parent == i - 1 and extends(s, seqs[i - 1])
    for start in starts[1:]:
        summary = text(tiny_tokenizer, seqs[start - 1].completion_ids).strip()
        assert not extends(seqs[start], seqs[start - 1]), "a fresh context after each compaction"
        if summary:
            assert summary in text(tiny_tokenizer, seqs[start].prompt_ids), "it resumes from the summary"
    segments = [list(range(a, b)) for a, b in zip(starts, starts[1:] + [len(seqs)])]
    assert merged_rows(seqs) == segments, "one row per segment; never merged across a compaction"


@pytest.mark.integration
def test_selfplay_shape(run_harness, tiny_tokenizer):
    task, seqs, result = run_harness("harnesses.programs.selfplay.selfplay", ["player_a", "player_b"])
    m = result.info["moves"]
    assert [s.agent for s in seqs] == [("player_a", "player_b")[i % 2] for i in range(m)]
    for i, s in enumerate(seqs):
        assert s.parent == (i - 2 if i >= 2 else None)
        if s.parent is not None:
            assert extends(s, seqs[s.parent])
    winner = result.info["winner"]
    moved = ("player_a", "player_b")[: min(m, 2)]  # player_b never moves if player_a forfeits at once
    assert result.agent_rewards == {r: 1.0 if r == winner else -1.0 for r in moved}
    assert result.reward == 0.0
    assert sorted(map(sorted, merged_rows(seqs))) == sorted([list(range(0, m, 2)), list(range(1, m, 2))][: min(m, 2)])


@pytest.mark.unit
@pytest.mark.parametrize(
    "reply,stones,move",
    [("2", 5, 2), ("I take 3 stones", 5, 3), ("4", 9, None), ("3", 2, None), ("none", 5, None), ("0", 5, None)],
)
def test_selfplay_move_parsing(reply, stones, move):
    from harnesses.programs.selfplay import parse_move

    assert parse_move(reply, stones) == move


@pytest.mark.integration
def test_readme_harness_example_runs(run_harness, tiny_tokenizer, tmp_path, monkeypatch):
    """The second harness in docs/harnesses.md runs as written, per-agent rewards and all."""
    import re
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "harnesses.md").read_text()
    [code] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.DOTALL) if "def propose_and_critique" in b]
    (tmp_path / "readme_harness.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("readme_harness", None)
    task, seqs, result = run_harness(
        "readme_harness.propose_and_critique", ["proposer", "critic"], frozen={"critic"}, rounds=2
    )
    assert seqs[0].agent == "proposer" and seqs[1].agent == "critic" and not seqs[1].trainable
    assert set(result.agent_rewards) == {"proposer", "critic"}
    proposer = [s for s in seqs if s.agent == "proposer"]
    assert result.agent_rewards["proposer"] == task.score(text(tiny_tokenizer, proposer[-1].completion_ids))
