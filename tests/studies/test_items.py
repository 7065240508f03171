"""Per-item evaluation results (studies/items.py, studies/stats.py): an item's record of a relay team's and a single
agent's trace and of a majority vote, the items files (the same bytes each time) and a condition's
items with its meta file, and the pre-registered statistics of
docs/preregistration/relay.md (the t distribution's p against the tables, the paired t-test over
seeds, Holm, the two-level bootstrap, the exact sign test) on numbers made up here.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from rollout.trace import Sequence, Trace
from studies.items import (
    head_commit,
    item,
    item_number,
    read_condition,
    read_items,
    records,
    write_condition,
    write_items,
)
from studies.stats import bootstrap_ci, holm, mean, paired_t, sign_test, t_two_sided_p

pytestmark = [pytest.mark.unit, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test

ROOT = Path(__file__).resolve().parents[2]


def rec(i: int, reward: float) -> dict:
    return {"id": f"story_sum/eval/{i}", "reward": reward, "tokens": 10, "tokens_by_role": {}, "truncated": False}


def seq(role: str, n: int) -> Sequence:
    return Sequence([1, 2], list(range(n)), [0.0] * n, role, "main", 0)


# ---- items and their files ------------------------------------------------------------------


def test_an_items_record_reads_the_relays_info_and_counts_tokens_by_role():
    info = {
        "task": "story_sum/eval/3",
        "expression": "3+5",
        "steps": ["3 + 5"],
        "calculator_right": [True],
        "final": "8",
    }
    trace = Trace(
        "t", "g", [seq("reader", 4), seq("calculator", 6)], 1.0, {"reader": 1.0, "calculator": 1.0}, info=info
    )
    r = item(trace, decode=None)
    assert r["id"] == "story_sum/eval/3" and r["answer"] == "8" and r["tokens"] == 10
    assert r["tokens_by_role"] == {"calculator": 6, "reader": 4} and r["calculator_right"] == [True]
    assert r["roles"] == {"reader": 1.0, "calculator": 1.0} and (r["truncated"], r["failed"]) == (False, False)
    single = Trace("s", "g", [seq("solver", 5)], 0.0, status="truncated", info={"task": "story_sum/eval/3"})
    r = item(single, decode=lambda ids: "so <answer>7</answer>")
    assert (r["answer"], r["truncated"], r["failed"], r["tokens_by_role"]) == ("7", True, False, {"solver": 5})
    assert "roles" not in r and "expression" not in r


def test_items_files_round_trip_in_the_same_bytes_and_sort_by_task_number(tmp_path):
    recs = sorted([rec(i, float(i % 3 == 0)) for i in (10, 2, 33, 1)], key=item_number)
    assert [item_number(r) for r in recs] == [1, 2, 10, 33]  # by number, not as text
    write_items(tmp_path / "a.items.jsonl.gz", recs)
    assert read_items(tmp_path / "a.items.jsonl.gz") == recs
    first = (tmp_path / "a.items.jsonl.gz").read_bytes()
    write_items(tmp_path / "a.items.jsonl.gz", recs)
    assert (tmp_path / "a.items.jsonl.gz").read_bytes() == first, "no timestamp in the gzip header"


def test_a_votes_record_holds_the_voted_answer_not_the_last_samples_and_records_sort_by_task():
    info = {"task": "story_sum/eval/4", "answers": ["7", "8", "8"], "votes": 2, "answer": "8"}
    vote = Trace("t", "g", [seq("solver", 3)] * 3, 1.0, info=info)
    other = Trace("u", "g", [seq("solver", 2)], 0.0, info={"task": "story_sum/eval/1"})
    first, r = records([vote, other], decode=lambda ids: "<answer>7</answer>")
    assert (r["answer"], r["votes"], r["answers"], r["tokens"]) == ("8", 2, ["7", "8", "8"], 9)
    assert (first["id"], first["answer"], "votes" in first) == ("story_sum/eval/1", "7", False)


def test_a_condition_is_its_items_and_its_meta_and_is_none_before_the_meta_is_written(tmp_path):
    recs = [rec(i, 1.0) for i in range(3)]
    write_condition(tmp_path / "seed1", "vote", recs, {"k": 3, "wall_s": 1.5})
    assert read_condition(tmp_path / "seed1", "vote") == (recs, {"k": 3, "wall_s": 1.5})
    assert sorted(p.name for p in (tmp_path / "seed1").iterdir()) == ["vote.items.jsonl.gz", "vote.meta.json"]
    write_items(tmp_path / "seed1" / "swap.items.jsonl.gz", recs)  # items without their meta: not whole yet
    assert read_condition(tmp_path / "seed1", "swap") is None
    with pytest.raises(ValueError):
        write_condition(tmp_path / "seed1", "bad", recs, {"wall_s": float("nan")})


def test_head_commit_is_the_repositorys_checked_out_commit():
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert head_commit(ROOT) == git.stdout.strip() and len(head_commit(ROOT)) == 40


def test_the_mean_rounds_to_four_digits_and_is_none_for_nothing():
    assert mean([1.0, 0.0, 0.0]) == 0.3333 and mean(x for x in [0.5]) == 0.5 and mean([]) is None


# ---- the pre-registered statistics ------------------------------------------------------------


@pytest.mark.parametrize(
    "t, df, p",
    [(2.776, 4, 0.05), (2.365, 7, 0.05), (0.941, 4, 0.40), (12.706, 1, 0.05), (1.96, 10**5, 0.05), (0.0, 5, 1.0)],
)
def test_the_t_distributions_two_sided_p_matches_the_tables(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=2e-4)
    assert t_two_sided_p(-t, df) == t_two_sided_p(t, df)


def test_the_paired_t_test_over_seeds():
    # d = 0.1, 0.05, 0.08, 0.02, 0.07: mean 0.064, sd 0.03050, t = 4.6927 (4 df), p = 0.00936
    r = paired_t([0.1, 0.05, 0.08, 0.02, 0.07])
    assert (r["seeds"], round(r["mean"], 4), round(r["t"], 3), round(r["p"], 4)) == (5, 0.064, 4.693, 0.0094)
    assert paired_t([0.02, 0.02, 0.02])["p"] == 0.0 and paired_t([0.0, 0.0])["p"] == 1.0
    assert paired_t([0.1, -0.1, 0.05, -0.05, 0.0])["p"] == 1.0
    with pytest.raises(AssertionError, match="at least 2 seeds"):
        paired_t([0.1])


def test_holm_adjusts_step_down_and_stays_monotone():
    assert holm({"vote": 0.04, "A": 0.01, "transplant": 0.03}) == {"A": 0.03, "transplant": 0.06, "vote": 0.06}
    assert holm({"A": 0.5, "B": 0.6}) == {"A": 1.0, "B": 1.0}


def test_the_two_level_bootstrap_resamples_seeds_and_items_paired():
    r = random.Random(0)
    a = [[float(r.random() < 0.3) for _ in range(512)] for _ in range(5)]
    c = [[x if r.random() < 0.8 else 1.0 for x in row] for row in a]  # c >= a everywhere, ~14 points better
    lo, hi = bootstrap_ci(a, c, resamples=2000)
    true = sum(sum(y) - sum(x) for x, y in zip(a, c)) / (5 * 512)
    assert 0 < lo < true < hi < 0.25
    same = bootstrap_ci(a, a, resamples=500)
    assert same == (0.0, 0.0), "paired: one item draw for both arms"
    assert bootstrap_ci(a, c, resamples=500, seed=1) == bootstrap_ci(a, c, resamples=500, seed=1)


def test_the_sign_test_counts_items_that_moved():
    before = [rec(i, float(i < 10)) for i in range(40)]
    after = [rec(i, float(i < 30) if i >= 5 else 0.0) for i in range(40)]  # 5 worse, 20 better
    assert sign_test(before, after) == {"better": 20, "worse": 5, "p": pytest.approx(0.00408, abs=1e-5)}
    assert sign_test(before, before) == {"better": 0, "worse": 0, "p": 1.0}  # ties only
    with pytest.raises(AssertionError, match="the same items"):
        sign_test(before, after[1:])
