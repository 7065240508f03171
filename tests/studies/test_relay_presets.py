"""The relay experiment's presets (conf/experiment/relay_*.yaml) and the pilot gate's logic
(studies/relay/pilot.py).

Each preset composes and validates, holds out stories no training draw repeats, and changes from
arm B (relay_team_shared) exactly what its arm is about; the single agent gets the team's whole
token budget. The gate's criteria, the seed count and the token counts are checked on numbers made
up here (the items' records and the pre-registered statistics: tests/studies/test_items.py); the
published pilots (docs/results/relay_pilot/) are recomputed from their items, and one condition is
evaluated on the tiny model, in tests/studies/test_relay_quick.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from harnesses.base import normalize_question
from harnesses.programs.solver_verifier import SOLVER_SYSTEM
from rollout.config import make_task_source
from studies.items import read_items
from studies.relay.pilot import CONDITIONS, ROOT, gate, seeds_needed, tokens
from trainer.checks import validate
from trainer.config import compose

pytestmark = pytest.mark.studies  # make test-studies, not make test (each test has its tier below)

ARMS = ("single_agent", "team_shared", "team_lora")


def flat(cfg, prefix: str = "") -> dict:
    """A config as {dotted key: value}."""
    out = {}
    for k, v in (dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg).items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed(arm: str, reference: str = "team_shared") -> set[str]:
    a, b = (flat(compose("train", [f"experiment=relay_{x}"])) for x in (arm, reference))
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


@pytest.mark.unit
@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_composes_validates_and_holds_out_unseen_stories(arm):
    cfg = compose("train", [f"experiment=relay_{arm}", "seed=3"])
    validate(cfg)
    assert cfg.run_dir == f"runs/relay/{arm}"
    assert (cfg.model.name, cfg.task.name, cfg.sampling.temperature) == ("smollm2_135m", "story_sum", 0.7)
    assert cfg.trainer.resume == "auto", "a stopped run goes on from its newest checkpoint"
    assert cfg.eval.size == cfg.task.eval_size == 512
    source = make_task_source(cfg.task, cfg.seed)
    held_out = {normalize_question(t.question) for t in source.eval_tasks()}
    steps = cfg.trainer.steps * cfg.trainer.groups_per_step
    trained = {normalize_question(source.train_task(i).question) for i in range(max(steps, 3000))}
    assert len(held_out) == 512 and not held_out & trained


@pytest.mark.unit
@pytest.mark.parametrize("arm", ["team_shared", "team_lora"])
def test_the_team_arms_train_each_role_on_its_own_reward_with_its_own_baseline(arm):
    cfg = compose("train", [f"experiment=relay_{arm}"])
    adv = cfg.algorithm.advantage
    assert (adv.per_agent_rewards, adv.role_baseline, adv.normalize_per_agent) == (True, True, True)
    assert cfg.harness.name == "relay" and cfg.harness.options == {"oracle_calculator": False}


@pytest.mark.unit
def test_arm_c_changes_only_the_policies_and_their_lr():
    lora = changed("team_lora")
    assert {"agents.reader", "agents.calculator", "learner.lr"} <= lora
    assert all(
        k in {"run_dir", "agents.reader", "agents.calculator", "learner.lr"} or k.startswith("policies.") for k in lora
    )
    cfg = compose("train", ["experiment=relay_team_lora"])
    assert cfg.agents == {"reader": "reader", "calculator": "calculator"}
    assert all(cfg.policy_table()[p].lora.rank == 16 for p in ("reader", "calculator"))


@pytest.mark.unit
def test_the_single_agent_answers_alone_with_the_teams_whole_token_budget():
    single, team = (compose("train", [f"experiment=relay_{a}"]) for a in ("single_agent", "team_shared"))
    calls = 1 + team.task.params["operations"]  # the reader, then a calculator call per operation
    assert single.sampling.max_tokens == calls * team.sampling.max_tokens
    assert single.harness.name == "single_turn" and single.harness.options["system"] == SOLVER_SYSTEM
    assert (single.task, single.eval, single.trainer.steps, single.sampling.temperature) == (
        team.task,
        team.eval,
        team.trainer.steps,
        team.sampling.temperature,
    )
    assert not single.algorithm.advantage.per_agent_rewards  # one role: the trace reward


@pytest.mark.unit
def test_the_pilots_conditions_are_the_presets():
    for overrides in CONDITIONS.values():
        validate(compose("train", overrides))
    assert compose("train", CONDITIONS["oracle"]).harness.options == {"oracle_calculator": True}


# ---- the pilot gate (studies/relay/pilot.py) --------------------------------------------------------


def rec(i: int, reward: float, reader: float | None = None, calls: tuple[bool, ...] = ()) -> dict:
    out = {"id": f"story_sum/eval/{i}", "reward": reward, "tokens": 10, "tokens_by_role": {}, "truncated": False}
    if reader is not None:
        out |= {"roles": {"reader": reader}, "calculator_right": list(calls)}
    return out


def team_of(rewards: list[float], reader: list[float], calls: list[tuple[bool, ...]]) -> list[dict]:
    return [rec(i, r, rd, c) for i, (r, rd, c) in enumerate(zip(rewards, reader, calls))]


@pytest.mark.unit
def test_the_gate_passes_a_team_within_five_points_with_learnable_roles():
    single = [rec(i, float(i < 25)) for i in range(100)]  # 0.25
    team = team_of(
        [float(i < 20) for i in range(100)],
        [float(i < 40) for i in range(100)],
        [(True, i % 2 == 0) for i in range(100)],
    )
    g = gate(single, team)
    assert g["team_not_below_single"] == {"team": 0.2, "single": 0.25, "pass": True}  # exactly 5 points below
    assert g["roles_in_range"] == {"reader": 0.4, "calculator": 0.75, "calculator_calls": 200, "pass": True}
    assert g["single_at_most_half"] == {"single": 0.25, "pass": True}


@pytest.mark.unit
def test_the_gate_fails_each_criterion_on_its_own():
    base = team_of([float(i < 20) for i in range(100)], [float(i < 40) for i in range(100)], [(True, False)] * 100)
    assert not gate([rec(i, float(i < 26)) for i in range(100)], base)["team_not_below_single"]["pass"]  # 6 below
    hard_reader = team_of([0.0] * 100, [float(i < 14) for i in range(100)], [(True, False)] * 100)
    assert not gate([rec(i, 0.0) for i in range(100)], hard_reader)["roles_in_range"]["pass"]  # 0.14
    easy_calc = team_of([0.0] * 100, [0.5] * 100, [(True,) * 5 + (False,)] * 100)
    assert gate([rec(i, 0.0) for i in range(100)], easy_calc)["roles_in_range"]["calculator"] > 0.8
    assert not gate([rec(i, 0.0) for i in range(100)], easy_calc)["roles_in_range"]["pass"]
    no_calls = team_of([0.0] * 100, [0.5] * 100, [()] * 100)
    assert gate([rec(i, 0.0) for i in range(100)], no_calls)["roles_in_range"]["calculator"] is None
    assert not gate([rec(i, 0.0) for i in range(100)], no_calls)["roles_in_range"]["pass"]
    assert not gate([rec(i, float(i < 51)) for i in range(100)], base)["single_at_most_half"]["pass"]
    with pytest.raises(AssertionError, match="the same items"):
        gate([rec(i + 1, 0.0) for i in range(100)], base)


@pytest.mark.unit
def test_more_seeds_when_five_cannot_detect_eight_points():
    same = [rec(i, float(i % 2)) for i in range(512)]
    agree = seeds_needed(same, same)  # no item noise: the seed noise alone
    assert agree["discordant"] == 0 and agree["item_sd"] == 0.0 and agree["per_seed_sd"] == 0.043
    assert agree["mde"][5] == pytest.approx(3.717 * 0.043 / 5**0.5, abs=1e-4) and agree["seeds"] == 5
    flipped = [rec(i, float(i % 2 == 0)) for i in range(64)]  # every item discordant, 64 items
    noisy = seeds_needed(same[:64], flipped)
    assert noisy["discordant"] == 64 and noisy["mde"][5] > 0.08 and noisy["seeds"] == 8
    assert noisy["mde"][8] < noisy["mde"][5]


@pytest.mark.unit
def test_the_tokens_per_trace_by_role_and_the_truncations():
    team = [
        rec(0, 1.0) | {"tokens": 10, "tokens_by_role": {"reader": 4, "calculator": 6}, "failed": False},
        rec(1, 0.0) | {"tokens": 5, "tokens_by_role": {"reader": 5}, "truncated": True, "failed": True},
    ]
    t = tokens(team)
    assert t == {"per_trace": 7.5, "by_role": {"calculator": 3.0, "reader": 4.5}, "truncated": 1, "failed": 1}


@pytest.mark.unit
def test_the_presets_run_what_the_pilot_gate_passed_and_match_its_tokens():
    """docs/results/relay_pilot/ops1: the gate passed with one operation; arm A's groups a step are
    the team's 4 scaled by the untrained team's and single agent's generated tokens per story."""
    import json

    pilot = json.loads((ROOT / "docs/results/relay_pilot/ops1/pilot.json").read_text())
    assert pilot["passed"] and pilot["items"] == 512
    single, team = (compose("train", [f"experiment=relay_{a}"]) for a in ("single_agent", "team_shared"))
    assert team.task.params["operations"] == pilot["operations"] == 1
    assert f"sampling.max_tokens={single.sampling.max_tokens}" in pilot["evaluations"]["single"]["overrides"]
    # the pilot's calls were cut at the presets' max_tokens: the reader's longest reply, the single agent's
    items = {name: read_items(ROOT / f"docs/results/relay_pilot/ops1/{name}.items.jsonl.gz") for name in CONDITIONS}
    assert max(r["tokens_by_role"]["reader"] for r in items["team"]) == team.sampling.max_tokens
    assert max(r["tokens"] for r in items["single"]) == single.sampling.max_tokens
    tokens = pilot["tokens"]
    matched = team.trainer.groups_per_step * tokens["team"]["per_trace"] / tokens["single"]["per_trace"]
    assert single.trainer.groups_per_step == round(matched) == 3
