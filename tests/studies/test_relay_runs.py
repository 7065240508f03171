"""The relay experiment's main-run driver and its pre-registered analysis (studies/relay/),
on per-item files made up here in the committed format: a known effect is found, the success
rule's edge, Holm over the three contrasts, the positive control, a dropped seed, a pending
verdict; the failure rule, the vote's k_s and the command line. The statistics themselves are
tested in tests/studies/test_items.py, the contrasts and tables in tests/studies/test_contrasts.py;
the whole pipeline runs on the tiny model in tests/studies/test_relay_runs_quick.py.
"""

from __future__ import annotations

import json

import pytest

from studies.items import write_condition
from studies.relay import analysis
from studies.relay.__main__ import main, parse
from studies.relay.analysis import analyze, roles
from studies.relay.controls import CONTROLS, Controls, vote_k
from studies.relay.report import markdown
from studies.relay.runs import ARMS, QUICK, Run, next_attempt
from studies.stats import holm, paired_t
from studies.study import eval_steps

pytestmark = [pytest.mark.unit, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test

N = 100  # stories per evaluation: a point is one story
A_RIGHT = [20, 24, 18, 22, 26, 21, 19, 23]  # arm A's right stories per seed (1-8)


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch):
    """2,000 bootstrap resamples instead of the pre-registered 10,000: these tests check what the
    intervals are of, not their third digit (and run in seconds on a loaded box)."""
    monkeypatch.setattr(analysis, "RESAMPLES", 2000)


def items(right: int, team: bool = False, calculator: float = 0.8, n: int = N) -> list[dict]:
    """n stories, the first `right` answered right; a team's reader right on those, its calculator
    right on a `calculator` share of its calls (one a story)."""
    out = []
    for i in range(n):
        rec = {"id": f"story_sum/eval/{i}", "reward": float(i < right), "tokens": 30, "truncated": False}
        rec |= {"failed": False, "answer": None, "tokens_by_role": {}}
        if team:
            good = i < max(right, round(calculator * n))  # the right answers went through a right call
            rec |= {"expression": "3+5", "steps": ["3 + 5"], "calculator_right": [good]}
            rec["roles"] = {"reader": float(i < right), "calculator": float(good)}
        out.append(rec)
    return out


def write_run(results, arm: str, seed: int, final: list[dict], state: str = "finished") -> None:
    """A run's evaluations at steps 0 (A's count right) and 30 (`final`), and its status."""
    folder = results / arm / f"seed{seed}"
    for step, recs in ((0, items(A_RIGHT[seed - 1], arm != "single_agent")), (30, final)):
        meta = {"commit": "c", "overrides": [f"experiment=relay_{arm}"], "step": step, "steps": 30}
        meta |= {"wall_s": 60.0 * step, "generated_tokens": 900 * step, "trained_tokens": 800 * step}
        write_condition(folder, f"step_{step}", recs, meta)
    (folder / "status.json").write_text(json.dumps({"state": state, "wall_s": 1800.0, "attempts": []}))


def experiment(
    results,
    seeds=range(1, 9),
    c_minus_a=(10,) * 8,
    vote=(0,) * 8,
    transplant=(2,) * 8,
    oracle=(10,) * 8,
    calculator=0.8,
    leave_out=(),
):
    """Made-up per-item files: per seed s, C right on A's count + c_minus_a[s] stories, the vote,
    the transplant and oracle-C their offsets from A, C and C; B halfway, the swap as A."""
    for s in seeds:
        a = A_RIGHT[s - 1]
        c = a + c_minus_a[s - 1]
        write_run(results, "single_agent", s, items(a))
        write_run(results, "team_shared", s, items(a + c_minus_a[s - 1] // 2, True, calculator))
        write_run(results, "team_lora", s, items(c, True, calculator))
        controls = {
            "transplant": items(a + transplant[s - 1], True),
            "swap": items(a, True),
            "vote": items(a + vote[s - 1]),
            "oracle": items(c + oracle[s - 1], True),
        }
        for name, recs in controls.items():
            if (s, name) not in leave_out:
                write_condition(
                    results / "controls" / f"seed{s}",
                    name,
                    recs,
                    {
                        "wall_s": 1.0,
                        **(
                            {"k": 2, "k_rule": 2, "tokens_team_lora": 30.0, "tokens_single_agent": 30.0}
                            if name == "vote"
                            else {}
                        ),
                    },
                )


def test_a_known_effect_is_found_with_its_ci_and_the_success_rule_met(tmp_path):
    jitter = (8, 12, 9, 11, 10, 10, 7, 13)  # mean 10 points, the effect to find
    experiment(tmp_path, c_minus_a=jitter, vote=(1, -1, 2, 0, 1, 0, -2, 1), transplant=(1, 2, 0, 3, 1, 2, 1, 0))
    a = analyze(tmp_path)
    c_a = a["primary"]["C_vs_A"]
    assert a["seeds"] == {"planned": list(range(1, 9)), "in": list(range(1, 9)), "dropped": [], "incomplete": {}}
    assert c_a["mean_points"] == 10.0 and c_a["per_seed_points"]["2"] == 12.0 and c_a["mean_exact"] == "1/10"
    assert c_a["p"] == pytest.approx(paired_t([d / 100 for d in jitter])["p"]) and c_a["p"] < 1e-5
    lo, hi = c_a["ci_points"]
    assert 5 < lo < 10 < hi < 15
    assert a["verdict"]["success"] and a["verdict"]["final"] and a["verdict"]["text"].startswith("success")
    assert a["verdict"]["transplant"].startswith("training in the team adds")  # C - transplant ~ +8.6 points
    assert a["positive_control"]["detected"] and a["positive_control"]["pilot_oracle_vs_team"]["better"] == 51
    assert a["secondary"]["C_vs_B"]["mean_points"] == pytest.approx(10 - sum(j // 2 for j in jitter) / 8)
    assert a["secondary"]["run_vs_run_C_vs_A"]["1"] == {"better": 8, "worse": 0, "p": pytest.approx(2 / 2**8)}
    reader = a["secondary"]["roles"]["team_lora step 30"]["reader"]
    assert reader["mean"] == pytest.approx(sum(A_RIGHT[s] + jitter[s] for s in range(8)) / 800, abs=1e-4)
    assert a["arms"]["team_lora"]["30"]["generated_tokens"] == 27000 and a["arms"]["single_agent"]["0"]["seeds"] == 8
    assert "**Seeds in: 8 of 8**" in markdown(a) and "| C - A | 8 | 10.0 |" in markdown(a)


def test_holm_adjusts_the_three_contrasts_and_the_vote_copied_from_a_stays_a_member(tmp_path):
    experiment(tmp_path, c_minus_a=(6, 7, 5, 8, 6, 7, 9, 4), transplant=(5, -1, 6, 0, 4, 7, -2, 3))
    a = analyze(tmp_path)
    primary = a["primary"]
    raw = {name: c["p"] for name, c in primary.items()}
    assert set(raw) == {"C_vs_A", "C_vs_vote", "C_vs_transplant"}
    assert {name: c["p_holm"] for name, c in primary.items()} == holm(raw)
    # vote = A on every item (k_s = 1): the same p as C vs A, still its own member of the family
    assert raw["C_vs_vote"] == raw["C_vs_A"] and primary["C_vs_A"]["p_holm"] == pytest.approx(3 * raw["C_vs_A"])
    assert (
        primary["C_vs_transplant"]["p"] > raw["C_vs_A"]
        and primary["C_vs_transplant"]["p_holm"] >= primary["C_vs_A"]["p_holm"]
    )


@pytest.mark.parametrize("c_minus_a, success", [((4, 5, 6, 5, 4, 6, 5, 5), True), ((4, 5, 6, 5, 4, 6, 5, 4), False)])
def test_the_success_rule_needs_five_points_exactly(tmp_path, c_minus_a, success):
    experiment(tmp_path, c_minus_a=c_minus_a, vote=(-3,) * 8)
    v = analyze(tmp_path)["verdict"]
    assert v["success"] is success and v["final"]
    assert (
        v["text"].startswith("success") if success else v["text"] == "no detectable team advantage at this resolution"
    )


def test_c_must_beat_the_vote_too(tmp_path):
    experiment(tmp_path, c_minus_a=(10,) * 7 + (12,), vote=(10,) * 7 + (12,))  # the vote does as well as C
    a = analyze(tmp_path)
    assert a["primary"]["C_vs_vote"]["mean_points"] == 0.0 and not a["verdict"]["success"]


def test_an_insensitive_pipeline_is_not_interpreted_unless_the_calculator_is_at_its_ceiling(tmp_path):
    experiment(tmp_path / "blind", c_minus_a=(8, 12, 9, 11, 10, 10, 7, 13), oracle=(0,) * 8)
    a = analyze(tmp_path / "blind")
    assert not a["positive_control"]["detected"] and not a["positive_control"]["oracle_minus_c"]["pass"]
    assert a["verdict"]["text"].startswith("the pipeline is insensitive") and a["verdict"]["success"]
    experiment(tmp_path / "ceiling", c_minus_a=(8, 12, 9, 11, 10, 10, 7, 13), oracle=(0,) * 8, calculator=1.0)
    a = analyze(tmp_path / "ceiling")
    assert a["positive_control"]["calculator_at_ceiling"] and a["positive_control"]["detected"]
    assert a["verdict"]["text"].startswith("success")


def test_a_dropped_seed_leaves_every_contrast_and_the_verdict_is_final_without_it(tmp_path):
    experiment(tmp_path, seeds=range(1, 8), c_minus_a=(8, 12, 9, 11, 10, 10, 7, 13))
    write_run(tmp_path, "single_agent", 8, items(90))  # A of seed 8 finished, far off ...
    write_run(tmp_path, "team_lora", 8, items(0, True), state="dropped")  # ... C of seed 8 dropped
    a = analyze(tmp_path)
    assert a["seeds"]["in"] == list(range(1, 8)) and a["seeds"]["dropped"] == [8]
    assert all(c["seeds"] == list(range(1, 8)) for c in a["primary"].values())
    assert a["primary"]["C_vs_A"]["mean_points"] == pytest.approx(sum((8, 12, 9, 11, 10, 10, 7)) / 7, abs=1e-3)
    assert a["verdict"]["final"] and a["verdict"]["success"]
    assert {(r["arm"], r["seed"], r["state"]) for r in a["runs"]} >= {
        ("single_agent", 8, "finished"),
        ("team_lora", 8, "dropped"),
    }


def test_first_runs_whose_weights_were_lost_feed_only_the_sensitivity_check(tmp_path):
    experiment(tmp_path)  # C - A = 10 points on every seed
    assert analyze(tmp_path)["sensitivity"] is None
    a_right = A_RIGHT[6]
    write_run(tmp_path / "weights_lost", "single_agent", 7, items(a_right + 4))
    write_run(tmp_path / "weights_lost", "team_lora", 7, items(a_right - 6, True))  # C - A = -10 on seed 7
    a = analyze(tmp_path)
    sens = a["sensitivity"]
    assert sens["first_runs"] == {"single_agent": [7], "team_lora": [7]}
    assert sens["C_vs_A"]["per_seed_points"]["7"] == -10.0
    assert sens["C_vs_A"]["mean_points"] == 7.5  # (7 x 10 - 10) / 8
    assert a["primary"]["C_vs_A"]["mean_points"] == 10.0  # the reruns stay the analysis
    assert "C - A (first runs)" in markdown(a)
    experiment(tmp_path / "seven", seeds=range(1, 7))  # seed 7 not in: nothing to swap
    write_run(tmp_path / "seven" / "weights_lost", "team_lora", 7, items(a_right - 6, True))
    assert analyze(tmp_path / "seven")["sensitivity"] is None


def test_the_verdict_is_pending_until_every_seed_is_in(tmp_path):
    experiment(tmp_path, seeds=range(1, 7), leave_out={(6, "oracle")})
    a = analyze(tmp_path)
    assert a["seeds"]["in"] == [1, 2, 3, 4, 5] and a["seeds"]["incomplete"]["6"] == ["oracle"]
    assert a["seeds"]["incomplete"]["7"] == ["single_agent", "team_shared", "team_lora", *CONTROLS]
    assert not a["verdict"]["final"] and a["verdict"]["text"].startswith("pending: 5 of 8 seeds in")
    assert "Every number below is provisional" in markdown(a)
    empty = analyze(tmp_path / "none")
    assert (
        empty["seeds"]["in"] == [] and empty["primary"]["C_vs_A"]["p"] is None and "Seeds in: 0 of 8" in markdown(empty)
    )


def test_role_accuracies_per_seed_their_mean_and_ci():
    by_seed = {1: items(30, True, 0.5), 2: items(50, True, 0.5)}
    r = roles(by_seed)
    assert r["reader"]["per_seed"] == {"1": 0.3, "2": 0.5} and r["reader"]["mean"] == 0.4
    assert r["calculator"]["calls"] == 200 and 0.5 <= r["calculator"]["mean"] <= 0.8
    lo, hi = r["reader"]["ci"]
    assert 0.2 < lo < 0.4 < hi < 0.6
    assert roles({1: items(3)}) == {}  # a single agent has no roles


def test_the_failure_rule_resumes_three_times_then_reruns_once_from_scratch_then_drops():
    def attempts(*outcomes, scratch_from=99):
        return [{"phase": "scratch" if i >= scratch_from else "first", "outcome": o} for i, o in enumerate(outcomes)]

    assert next_attempt([]) == "go"
    assert next_attempt(attempts("failed", "timed out", "failed")) == "go"  # 2 resumes so far
    assert next_attempt(attempts("failed", "interrupted", "failed", "failed", "interrupted")) == "go"
    assert next_attempt(attempts("failed", "timed out", "failed", "failed")) == "scratch"
    assert next_attempt(attempts(*["failed"] * 4, "failed", "failed", scratch_from=4)) == "go"
    assert next_attempt(attempts(*["failed"] * 8, scratch_from=4)) == "drop"
    assert next_attempt(attempts("did not start", "did not start")) == "go"  # not the run's failure


def test_the_votes_k_is_the_token_ratio_rounded_half_up_and_at_least_one():
    tok = lambda t: [{"tokens": t}] * 4  # noqa: E731
    assert vote_k(tok(29.3), tok(35.7))[0] == 1  # the untrained pilot's tokens
    assert vote_k(tok(75), tok(30))[0] == 3 and vote_k(tok(74), tok(30))[0] == 2
    assert vote_k(tok(3), tok(30)) == (1, 3, 30)
    with pytest.raises(ValueError, match="no tokens"):
        vote_k(tok(3), tok(0))


def test_the_command_line_needs_each_arms_lr_and_keeps_quick_numbers_out_of_the_results(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse(["train", "--lr", "single_agent=2e-5,team_shared=2e-5"])
    assert "no learning rate for team_lora" in capsys.readouterr().err
    for bad, says in (("team_lora=x", "not a number"), ("solo=1e-5", "not an arm"), ("C=-1", "> 0")):
        with pytest.raises(SystemExit):
            parse(["train", "--arms", "C", "--lr", bad])
        assert says in capsys.readouterr().err
    args = parse(["train", "--arms", "A,C", "--lr", "A=2e-5,C=2e-4"])
    assert args.lrs == {"single_agent": 2e-5, "team_lora": 2e-4} and args.seeds == list(range(1, 9))
    with pytest.raises(SystemExit):
        parse(["all", "--quick"])
    assert "give --out and --results" in capsys.readouterr().err


def test_a_run_of_other_settings_is_refused_before_anything_runs(tmp_path):
    old = Run("team_lora", 3, tmp_path / "runs", tmp_path / "results", lr=1e-4)
    old.save(old.status() | {"state": "running"})
    new = Run("team_lora", 3, tmp_path / "runs", tmp_path / "results", lr=2e-4)
    with pytest.raises(ValueError, match=r"learner.lr=0.0001.*give the same --lr"):
        new.train()
    assert new.overrides()[:3] == ["experiment=relay_team_lora", "seed=3", "learner.lr=0.0002"]


def test_each_arm_evaluates_at_steps_0_10_20_30_and_quick_after_each_step():
    for arm in ARMS.values():
        assert eval_steps([f"experiment=relay_{arm}"]) == [0, 10, 20, 30]
    assert eval_steps(["experiment=relay_team_lora", *QUICK]) == [0, 1, 2]


def test_analyze_writes_the_json_and_the_table_and_ends_on_a_json_line(tmp_path, capsys):
    experiment(tmp_path, seeds=range(1, 4))
    main(["analyze", "--results", str(tmp_path)])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["seeds_in"] == 3 and last["planned"] == 8 and last["verdict"].startswith("pending: 3 of 8")
    assert json.loads((tmp_path / "analysis.json").read_text())["primary"]["C_vs_A"]["seeds"] == [1, 2, 3]
    assert (tmp_path / "analysis.md").read_text().startswith("# The relay experiment")


def test_a_dropped_run_is_not_trained_again_and_its_seed_gets_no_controls(tmp_path, capsys):
    run = Run("single_agent", 5, tmp_path / "runs", tmp_path / "results", lr=2e-5)
    run.save(run.status() | {"state": "dropped"})
    assert run.train() == "dropped" and not run.dir.exists()
    controls = Controls(5, tmp_path / "runs", tmp_path / "results").all()
    assert controls == dict.fromkeys(CONTROLS, "seed dropped")
    assert not (tmp_path / "runs" / "controls").exists()
