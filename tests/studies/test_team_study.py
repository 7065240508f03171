"""The team study's presets (conf/experiment/study_*.yaml) and the team study's own logic (studies/team/).

Each preset composes and validates, changes from its reference exactly what its arm is about, and
holds out questions no training draw repeats; the study's seeds train on disjoint item streams.
The script's own logic on items made up here or written with the tiny model's real tokenizer: a
team item's record (draft, verdict, cut calls), a team evaluation's revision and verdict confusion
matrix, and the analysis from per-item files (contrasts over seeds, run-vs-run sign tests, Holm,
the token-matched vote) and its markdown. The arms themselves run on the tiny model in
tests/studies/test_team_study_quick.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from harnesses.base import normalize_question
from harnesses.programs.solver_verifier import SOLVER_SYSTEM
from rollout.config import make_task_source
from rollout.models import resolve_model
from rollout.trace import Sequence, Trace
from studies.items import decoder, write_condition
from studies.team.__main__ import parse
from studies.team.analysis import analyze
from studies.team.arms import ARMS, QUICK, Job, pick_arms, run_seed
from studies.team.records import study_records, team_stats
from studies.team.report import game_stats, grad_spikes, report
from trainer.checks import validate
from trainer.config import compose

pytestmark = [pytest.mark.unit, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test


def flat(cfg, prefix: str = "") -> dict:
    """A config as {dotted key: value}."""
    out = {}
    for k, v in (dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg).items():
        if isinstance(v, dict):  # an empty one adds no key
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed(arm: str, reference: str = "team_shared") -> set[str]:
    a, b = (
        flat(compose("train", [f"experiment=study_{arm}"])),
        flat(compose("train", [f"experiment=study_{reference}"])),
    )
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_each_arm_composes_validates_and_holds_out_unseen_questions(arm):
    for extra in ([], QUICK):
        cfg = compose("train", [f"experiment={ARMS[arm].preset}", f"seed={run_seed(2, ARMS[arm].preset)}", *extra])
        validate(cfg)
        assert cfg.run_dir == f"runs/team_study/{arm}"
    source = make_task_source(cfg.task, cfg.seed)
    held_out = {normalize_question(t.question) for t in source.eval_tasks()}
    assert len(held_out) == cfg.eval.size == cfg.task.eval_size
    trained = {normalize_question(source.train_task(i).question) for i in range(3000)}
    assert not held_out & trained


def test_each_arm_changes_only_what_it_is_about():
    run_dir = {"run_dir"}
    assert changed("team_full") == run_dir | {
        "agents.verifier",
        "policies.critic.trainable",
        "policies.critic.engine.cpu_cores",
        "engine.cpu_cores",
        "learner.micro_batch_tokens",
    }
    lora = changed("team_lora")
    assert {"agents.solver", "agents.verifier", "learner.lr"} <= lora
    assert all(
        k in run_dir | {"agents.solver", "agents.verifier", "learner.lr"} or k.startswith("policies.") for k in lora
    )
    assert changed("credit_global") == run_dir | {
        "algorithm.advantage.per_agent_rewards",
        "algorithm.advantage.role_baseline",
    }
    assert changed("credit_per_agent", "credit_global") == run_dir | {
        "algorithm.advantage.role_baseline",
        "algorithm.advantage.normalize_per_agent",
    }
    assert changed("selfplay_no_role_baseline", "selfplay") == run_dir | {"algorithm.advantage.role_baseline"}
    single = changed("single_agent")
    assert single == run_dir | {
        "harness._target_",
        "harness.name",
        "harness.roles",
        "harness.options.verdicts",
        "harness.options.system",
        "agents.verifier",
        "trainer.groups_per_step",
    }


def test_the_single_agent_answers_as_the_teams_solver_with_six_times_the_traces():
    single, team = (
        compose("train", ["experiment=study_single_agent"]),
        compose("train", ["experiment=study_team_shared"]),
    )
    assert single.harness.options["system"] == SOLVER_SYSTEM
    assert single.trainer.groups_per_step == 6 * team.trainer.groups_per_step  # ~ the team's generated tokens
    assert (single.task, single.sampling, single.eval, single.trainer.steps) == (
        team.task,
        team.sampling,
        team.eval,
        team.trainer.steps,
    )


def test_arms_are_picked_by_question_or_name():
    assert [a.name for a in pick_arms("credit")] == ["credit_global", "credit_per_agent"]
    assert [a.name for a in pick_arms("team_lora,team")] == ["team_lora", "team_shared", "team_full", "single_agent"]
    assert len(pick_arms("all")) == len(ARMS)
    with pytest.raises(ValueError, match="'teams' is not all, a question"):
        pick_arms("teams")


def test_gradient_spikes_are_counted_against_the_median():
    assert grad_spikes([1.0, 1.2, 0.9, 5.0, 1.1]) == {"max": 5.0, "median": 1.1, "spikes": 1}
    assert grad_spikes([]) == {"max": None, "median": None, "spikes": 0}


def game(winner, forfeit: bool, moves: int, first_player_wins: bool, stones: int = 24) -> Trace:
    """A Nim trace's info as harnesses/programs/selfplay.py writes it (its sequences do not matter here)."""
    info = {
        "moves": moves,
        "winner": winner,
        "forfeit": forfeit,
        "first_player_wins": first_player_wins,
        "stones": stones,
    }
    return Trace(id=f"g{moves}", group="g", sequences=[], info=info)


def test_a_games_summary_counts_illegal_moves_perfect_play_winners_and_one_stone_games():
    games = [
        game("player_b", True, 1, True),  # a forfeits a won position: an illegal move, not as theory
        game("player_a", False, 5, True),  # a wins its won position
        game("player_b", False, 6, False, stones=6),  # b wins a lost-for-a position, one stone a move
        game(None, False, 24, False, stones=40),  # cut at max_moves: no winner, not as theory
    ]
    assert game_stats(games) == {"games": 4, "forfeits": 0.25, "moves": 9.0, "as_theory": 0.5, "one_a_move": 0.25}
    assert game_stats([Trace(id="q", group="q", sequences=[], info={"draft_score": 1.0})]) is None


# ---- the study's seeds ------------------------------------------------------------------------


def trained_items(preset: str, seed: int) -> list[int]:
    """The reasoning-gym item seeds (task seed + raw index: Random(seed + j)) a run of `preset` at run seed
    `seed` draws for its training steps (trainer/loop.py's step_tasks: indices 0 .. steps x groups - 1),
    re-draws past held-out questions included: the task source's own draws, recorded."""
    cfg = compose("train", [f"experiment={preset}", f"seed={seed}"])
    source = make_task_source(cfg.task, cfg.seed)
    source.eval_tasks()
    drawn, draw = [], source.draw

    def recording(split, index, task_id):
        drawn.append(source.seed + index)
        return draw(split, index, task_id)

    source.draw = recording
    for i in range(cfg.trainer.steps * cfg.trainer.groups_per_step):
        source.train_task(i)
    return drawn


def test_the_studys_seeds_train_on_disjoint_item_streams():
    preset = ARMS["single_agent"].preset  # 192 training questions a run (the team arms' 32 are its first)
    streams = {s: set(trained_items(preset, run_seed(s, preset))) for s in (1, 2, 3, 8)}
    assert all(len(v) >= 192 for v in streams.values())
    assert all(not streams[a] & streams[b] for a in streams for b in streams if a < b), "seeds share items"
    # the run seed = the study seed, as before: seed 2's items are seed 1's shifted by one (the review's 191 of 192)
    assert len(set(trained_items(preset, 1)) & set(trained_items(preset, 2))) >= 191
    assert run_seed(2, preset) == 20000 and run_seed(0, preset) == 0
    for arm in ARMS.values():  # chain_sum's presets leave room for 99 seeds below the held-out stream, Nim's 9
        task = compose("train", [f"experiment={arm.preset}"]).task
        last = 9 if arm.question == "selfplay" else 99
        assert run_seed(last, arm.preset) + task.size <= task.eval_seed
        with pytest.raises(ValueError, match=rf"--seeds {last + 1}: .* give seeds 0 to {last}"):
            run_seed(last + 1, arm.preset)
    with pytest.raises(SystemExit):
        parse(["--seeds", "1", "-1"])


# ---- a team's items ---------------------------------------------------------------------------


def team_trace(i: int, draft: str, critique: str, final: str, draft_score: float, verdict, tok) -> Trace:
    """A solver_verifier trace as the harness and the worker write it: draft, critique, final; the
    critique cut at max_tokens when it has no verdict."""
    calls = [("solver", draft, "stop"), ("verifier", critique, "length" if verdict is None else "stop")]
    seqs = [
        Sequence(
            prompt_ids=[1],
            completion_ids=tok.encode(text, add_special_tokens=False).ids,
            logprobs=[-0.1] * len(tok.encode(text, add_special_tokens=False).ids),
            agent=agent,
            policy="main",
            version=0,
            finish_reason=reason,
        )
        for agent, text, reason in [*calls, ("solver", final, "stop")]
    ]
    reward = float(final.endswith("<answer>7</answer>"))
    return Trace(
        id=f"t{i}",
        group=f"g{i}",
        sequences=seqs,
        reward=reward,
        status="truncated" if verdict is None else "ok",
        agent_rewards={"solver": reward, "verifier": float(verdict is not None and verdict == (draft_score >= 1))},
        info={"task": f"chain_sum/eval/{i}", "draft_score": draft_score, "verdict": verdict, "answer": "7"},
    )


def test_a_team_items_record_and_the_revision_and_verdicts_of_an_evaluation():
    overrides = ["experiment=study_team_shared", "model=tiny"]
    cfg = compose("train", overrides)
    tok = Tokenizer.from_file(str(Path(resolve_model(cfg.model.name, cfg.model.path)) / "tokenizer.json"))
    right, wrong = "<answer>7</answer>", "<answer>8</answer>"
    traces = [
        team_trace(0, right, "Fine. VERDICT: CORRECT", right, 1.0, True, tok),  # kept right, judged right
        team_trace(1, wrong, "VERDICT: WRONG", right, 0.0, False, tok),  # a fix, judged right
        team_trace(2, right, "VERDICT: WRONG", wrong, 1.0, False, tok),  # a break, judged wrong
        team_trace(3, wrong, "Let me check the sum", wrong, 0.0, None, tok),  # no verdict: the critique cut
        team_trace(4, wrong, "VERDICT: CORRECT", wrong, 0.0, True, tok),  # kept wrong, judged wrong
    ]
    recs = study_records(list(reversed(traces)), decoder(overrides))
    assert [r["id"] for r in recs] == [f"chain_sum/eval/{i}" for i in range(5)]  # in task order
    assert [(r["draft_answer"], r["answer"]) for r in recs] == [("7", "7"), ("8", "7"), ("7", "8"), ("8", "8")] + [
        ("8", "8")
    ]
    assert [r["verdict"] for r in recs] == [True, False, False, None, True]
    assert recs[3]["cut_by_role"] == {"solver": 0, "verifier": 1} and recs[3]["truncated"]
    stats = team_stats(recs)
    c = stats["confusion"]
    assert c == {"right": {"correct": 1, "wrong": 1, "none": 0}, "wrong": {"correct": 1, "wrong": 1, "none": 1}}
    assert sum(n for d in c.values() for n in d.values()) == stats["items"] == 5
    assert (stats["changed"], stats["fixes"], stats["breaks"]) == (2, 1, 1)
    assert (stats["draft"], stats["final"]) == (0.4, 0.4)
    assert (stats["tpr"], stats["tnr"], stats["youden_j"]) == (0.5, 0.3333, -0.1667)
    # the verifier's own reward (its verdict right about the draft) against saying WRONG always (3 of 5)
    assert stats["verdict_right"] == 0.4 == sum(r["roles"]["verifier"] for r in recs) / 5
    assert stats["best_constant"] == 0.6
    assert (stats["missing_verdict"], stats["truncated"], stats["cut_calls"]) == (
        0.2,
        0.2,
        {"solver": 0, "verifier": 1},
    )
    assert team_stats([{"id": "q/eval/0", "reward": 1.0, "failed": False}]) is None  # a single agent's


# ---- the analysis from per-item files ---------------------------------------------------------


def items(rights: list[int], n: int = 20, team: bool = False) -> list[dict]:
    """n items, those in `rights` right; a team's with its draft (right where the final is) and verdict."""
    out = []
    for i in range(n):
        r = {"id": f"chain_sum/eval/{i}", "reward": float(i in rights), "tokens": 40 if team else 10}
        r |= {"truncated": False, "failed": False, "answer": str(i)}
        if team:
            r |= {"draft_score": r["reward"], "draft_answer": str(i), "verdict": True, "cut_by_role": {}}
        out.append(r)
    return out


def write_run(results, arm, seed, before, after, team):
    for step, rights in ((0, before), (8, after)):
        write_condition(
            results / arm / f"seed{seed}", f"step_{step}", items(rights, team=team), {"step": step, "steps": 8}
        )


def test_the_analysis_contrasts_each_team_arm_with_the_controls_over_seeds_and_run_vs_run(tmp_path):
    for s, shift in ((1, 0), (2, 2), (3, 1)):
        write_run(tmp_path, "team_shared", s, range(5), range(10 + shift), team=True)
        write_run(tmp_path, "single_agent", s, range(6), range(8), team=False)
        controls = tmp_path / "controls" / f"seed{s}"
        write_condition(controls, "transplant", items(range(7), team=True), {})
        write_condition(controls, "vote_k4", items(range(9 + shift)), {"k": 4})
        matched = {"team_shared": {"k": 4, "k_rule": 4, "tokens_team": 40.0, "tokens_single": 10.0}}
        matched["team_shared"]["condition"] = "controls/vote_k4"
        (controls / "matched_votes.json").write_text(json.dumps(matched))
    a = analyze(tmp_path, ["team_shared", "single_agent"], [1, 2, 3])
    fam = a["team_vs_controls"]
    assert list(fam) == ["team_shared_vs_single_agent", "team_shared_vs_vote", "team_shared_vs_transplant"]
    single = fam["team_shared_vs_single_agent"]
    assert single["per_seed_points"] == {"1": 10.0, "2": 20.0, "3": 15.0} and single["mean_points"] == 15.0
    assert single["p"] is not None and single["p_holm"] >= single["p"] and single["ci_points"][0] > 0
    assert fam["team_shared_vs_vote"]["per_seed_points"] == {"1": 5.0, "2": 5.0, "3": 5.0}  # the matched vote
    run_vs_run = single["run_vs_run"]["2"]
    assert (run_vs_run["better"], run_vs_run["worse"]) == (4, 0) and run_vs_run["p_holm"] >= run_vs_run["p"]
    assert a["secondary"]["transplant_vs_single_agent"]["per_seed_points"] == {"1": -5.0, "2": -5.0, "3": -5.0}
    assert a["training"]["team_shared_after_vs_before"]["mean_points"] == 30.0
    assert a["harness_untrained"]["untrained_team_vs_untrained_single_agent"]["seeds"] == [
        1
    ]  # the same untrained models
    team = [e for e in a["team_evals"] if e["condition"] == "team_shared" and e["step"] == 8]
    assert len(team) == 3 and all(sum(sum(d.values()) for d in e["confusion"].values()) == 20 for e in team)
    assert [e["condition"] for e in a["team_evals"] if e["step"] is None] == ["transplant"] * 3  # not the vote
    text = report([], a)
    assert "run vs run" in text and "Holm over the 3 contrast(s):" in text and "Holm over the 9 test(s):" in text
    assert "| team_shared - vote | 3 | 5.0 |" in text and "| 2 | team_shared | 40.0 / 10.0 | 4 | 4 |" in text


def test_a_run_dir_of_another_run_seed_is_refused(tmp_path):
    job = Job(ARMS["team_shared"], 2, tmp_path / "runs", tmp_path / "results", quick=False, timeout_s=1)
    job.dir.mkdir(parents=True)
    (job.dir / "config.yaml").write_text("seed: 2\n")  # the study seed as the run seed: the old, shifted streams
    for step in (job.train, job.export):
        with pytest.raises(RuntimeError, match=r"trained with seed=2, and study seed 2 is run seed 20000"):
            step()
