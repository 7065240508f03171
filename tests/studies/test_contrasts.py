"""Conditions compared over seeds (studies/contrasts.py), on per-item files and items made up here: the
paired contrast (per-seed points, the exact mean, the paired t, the CI), Holm over a family, per-seed
sign tests, the two-level CI of a mean, a study's files read back (which seeds are in, dropped or
incomplete), the rows reported regardless of outcome, and their markdown.
"""

from __future__ import annotations

import json
import math

import pytest

from studies.contrasts import (
    CONTRAST_HEAD,
    RUN_HEAD,
    STEP_HEAD,
    accuracy,
    contrast_family,
    contrast_rows,
    control_rows,
    final_items,
    holm_family,
    items_by_seed,
    items_summary,
    load_study,
    mean_ci,
    paired_contrast,
    run_rows,
    run_table_rows,
    seeds_state,
    sign_tests_by_seed,
    step_rows,
    step_table,
    table,
    token_matched_k,
)
from studies.items import write_condition
from studies.stats import holm, paired_t

pytestmark = [pytest.mark.unit, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test


def items(right: int, n: int = 20, tokens: int = 30) -> list[dict]:
    """n items, the first `right` right; the last one truncated."""
    return [
        {"id": f"t/eval/{i}", "reward": float(i < right), "tokens": tokens, "truncated": i == n - 1} for i in range(n)
    ]


def test_a_paired_contrast_gives_each_seeds_points_the_exact_mean_the_paired_t_and_a_ci():
    base = {1: items(4), 2: items(6), 3: items(5)}
    other = {1: items(6), 2: items(9), 3: items(6), 4: items(20)}  # +2, +3, +1 of 20 items; seed 4 has no base
    c = paired_contrast(base, other, [1, 2, 3, 4], resamples=2000)
    assert c["seeds"] == [1, 2, 3] and c["per_seed_points"] == {"1": 10.0, "2": 15.0, "3": 5.0}
    assert c["mean_points"] == 10.0 and c["mean_exact"] == "1/10"
    assert c["p"] == pytest.approx(paired_t([0.10, 0.15, 0.05])["p"]) and isinstance(c["t"], float)
    lo, hi = c["ci_points"]
    assert 0 < lo < 10 < hi < 25
    one = paired_contrast(base, other, [2], resamples=100)
    assert (one["t"], one["p"], one["mean_points"]) == (None, None, 15.0)  # one seed: no t-test
    same = paired_contrast(base, {s: items(r + 1) for s, r in ((1, 4), (2, 6))}, [1, 2], resamples=100)
    assert same["t"] == "inf" and same["p"] == 0.0  # no spread over seeds: JSON gets the infinity as text
    assert paired_contrast(base, other, [5], resamples=100) == {
        "seeds": [],
        "mean_points": None,
        "t": None,
        "p": None,
        "ci_points": None,
    }
    with pytest.raises(AssertionError, match="seed 1: not the same stories"):
        paired_contrast(base, {1: items(4, n=19)}, [1], resamples=100)


def test_holm_over_a_family_sets_each_members_adjusted_p_and_waits_for_every_p():
    family = {"A": {"p": 0.01}, "B": {"p": 0.04}, "C": {"p": 0.03}}
    adjusted = holm_family(family)
    assert adjusted == holm({"A": 0.01, "B": 0.04, "C": 0.03}) and family["A"]["p_holm"] == pytest.approx(0.03)
    pending = {"A": {"p": 0.01}, "B": {"p": None}}
    assert holm_family(pending) == {} and pending == {
        "A": {"p": 0.01, "p_holm": None},
        "B": {"p": None, "p_holm": None},
    }


def test_run_vs_run_sign_tests_per_seed_and_the_items_summary():
    tests = sign_tests_by_seed({1: items(2), 7: items(5)}, {1: items(10), 7: items(5)}, [1, 7])
    assert tests == {
        "1": {"better": 8, "worse": 0, "p": pytest.approx(2 / 2**8)},
        "7": {"better": 0, "worse": 0, "p": 1.0},
    }
    assert accuracy(items(5)) == 0.25
    assert items_summary(items(1, n=3, tokens=7)) == {"accuracy": 0.3333, "tokens_per_story": 7.0, "truncated": 1}


def test_a_family_of_contrasts_holm_over_it_and_over_its_run_vs_run_tests():
    base = {1: items(4), 2: items(6), 3: items(5)}
    pairs = {"B_vs_A": (base, {1: items(8), 2: items(9), 3: items(9)}), "C_vs_A": (base, {1: items(5), 3: items(5)})}
    pairs["D_vs_A"] = ({}, base)  # no seeds: left out
    fam = contrast_family(pairs, [1, 2, 3], resamples=500)
    assert list(fam) == ["B_vs_A", "C_vs_A"] and fam["C_vs_A"]["seeds"] == [1, 3]
    for name in fam:
        raw = {n: c["p"] for n, c in fam.items()}
        assert fam[name]["p_holm"] == pytest.approx(holm(raw)[name]) and fam[name]["p_holm"] >= fam[name]["p"]
    assert fam["B_vs_A"]["run_vs_run"]["1"] == {"better": 4, "worse": 0, "p": 0.125, "p_holm": pytest.approx(0.625)}
    assert set(fam["C_vs_A"]["run_vs_run"]) == {"1", "3"}  # Holm over the family's 5 per-seed tests
    assert fam["C_vs_A"]["run_vs_run"]["3"] == {"better": 0, "worse": 0, "p": 1.0, "p_holm": 1.0}


def test_the_vote_matched_in_generated_tokens():
    assert token_matched_k(items(1, tokens=75), items(1, tokens=30)) == (3, 75.0, 30.0)  # 2.5: a half rounds up
    assert token_matched_k(items(1, tokens=40), items(1, tokens=30))[0] == 1  # 1.33: the greedy answer itself
    assert token_matched_k(items(1, tokens=10), items(1, tokens=30))[0] == 1  # never below one sample
    with pytest.raises(ValueError, match="generated no tokens"):
        token_matched_k(items(1), items(1, tokens=0))


def test_the_two_level_ci_of_a_mean_over_seeds():
    assert mean_ci([[1.0] * 5, [1.0] * 9], resamples=500) == [1.0, 1.0] and mean_ci([[], []], resamples=500) is None
    lo, hi = mean_ci([[float(i < 30) for i in range(100)], [float(i < 50) for i in range(100)], []], resamples=2000)
    assert 0.2 < lo < 0.4 < hi < 0.6  # seeds at 0.3 and 0.5; the seed without values left out
    shares = [[0.2, 0.4, 0.9], [0.5, 0.7]]  # not right / wrong: the values themselves are resampled
    assert mean_ci(shares, resamples=500) == mean_ci(shares, resamples=500, seed=0) != mean_ci(shares, 500, seed=1)


def write_study(results) -> None:
    """Arms x and y over seeds 1-3: seed 1 whole, seed 2 without its control, y of seed 3 dropped."""
    for arm, right in (("x", 4), ("y", 8)):
        for s in (1, 2, 3):
            folder = results / arm / f"seed{s}"
            for step in (0, 2) if (arm, s) != ("y", 3) else (0,):
                meta = {"step": step, "steps": 2, "wall_s": 30.0 * step, "generated_tokens": 100 * step}
                meta |= {"trained_tokens": 90 * step, "rollout_truncated": step}
                write_condition(folder, f"step_{step}", items(right + s if step else 2), meta)
            status = {"state": "dropped" if (arm, s) == ("y", 3) else "finished", "wall_s": 120.0}
            status["attempts"] = [{"n": 1, "phase": "first", "kind": "fresh", "outcome": "finished", "wall_s": 120.0}]
            (folder / "status.json").write_text(json.dumps(status))
    write_condition(results / "controls" / "seed1", "probe", items(9), {"wall_s": 5.0, "k": 3, "other": "left out"})


def test_a_studys_files_read_back_and_which_seeds_are_in(tmp_path):
    write_study(tmp_path)
    data = load_study(tmp_path, ["x", "y"], ["probe"])
    assert sorted(data["runs"]["x"]) == [1, 2, 3] and list(data["runs"]["y"][1]["steps"]) == [0, 2]
    assert final_items(data["runs"]["x"][2]) == items(6) and final_items(data["runs"]["y"][3]) is None
    state = seeds_state(data, (1, 2, 3, 4), ["probe"])
    assert state == {
        "planned": [1, 2, 3, 4],
        "in": [1],
        "dropped": [3],
        "incomplete": {"2": ["probe"], "4": ["x", "y", "probe"]},
    }
    finals, ctl = items_by_seed(data, ["probe"])
    assert sorted(finals["y"]) == [1, 2] and ctl == {"probe": {1: items(9)}}
    assert load_study(tmp_path / "none", ["x"], ["probe"]) == {"runs": {"x": {}}, "controls": {}}


def test_the_rows_reported_regardless_and_their_markdown(tmp_path):
    write_study(tmp_path)
    data = load_study(tmp_path, ["x", "y"], ["probe"])
    rows = run_rows(data)
    y3 = next(r for r in rows if (r["arm"], r["seed"]) == ("y", 3))
    assert (y3["state"], y3["accuracy"], y3["eval_truncated"], y3["train_wall_s"]) == (
        "dropped",
        {"0": 0.1},
        {"0": 1},
        0.0,
    )
    x1 = rows[0]
    assert (x1["accuracy"], x1["eval_tokens_per_story"], x1["generated_tokens"]) == (
        {"0": 0.1, "2": 0.25},
        {"0": 30.0, "2": 30.0},
        200,
    )
    steps = step_table(data, [1, 2], resamples=500)
    assert steps["x"]["2"]["seeds"] == 2 and steps["x"]["2"]["accuracy"] == 0.275 and steps["x"]["2"]["wall_s"] == 60.0
    assert control_rows(data, ("wall_s", "k")) == {
        "1": {"probe": {"accuracy": 0.45, "tokens_per_story": 30.0, "truncated": 1, "wall_s": 5.0, "k": 3}}
    }
    assert table(["a", "b"], [["1", "2"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |", ""]
    assert len(step_rows(steps)[0]) == len(STEP_HEAD) and len(run_table_rows(rows)[0]) == len(RUN_HEAD)
    assert run_table_rows(rows)[0][3] == "0: 0.100, 2: 0.250" and step_rows(steps)[1][-1] == "1.0 min"
    c = paired_contrast({1: items(4), 2: items(6)}, {1: items(6), 2: items(9)}, [1, 2], resamples=200)
    holm_family({"x_vs_y": c})
    [row] = contrast_rows({"x_vs_y": c})
    assert len(row) == len(CONTRAST_HEAD) and row[:3] == ["x - y", "2", "12.5"] and row[-1] == row[-2]
    c["t"] = "inf"
    assert contrast_rows({"x_vs_y": c})[0][4] == "-" and not math.isnan(c["mean_points"])
