"""What a run's summary.json reports besides its config: the held-out reward before and after with
the paired comparison by question, and what each trained policy got and where its actors ran."""

from __future__ import annotations

from rollout.orchestration.fleet import RolloutFleet
from rollout.stats import trace_metrics
from rollout.trace import Trace
from trainer.config import LoopConfig
from trainer.metrics import paired_comparison
from trainer.policy import TrainedPolicy


def mean_reward(traces: list[Trace]) -> float | None:
    return sum(t.reward for t in traces) / len(traces) if traces else None


def eval_summary(initial: list[Trace], final: list[Trace]) -> dict:
    """Held-out reward before and after (None without an eval), how many eval runs failed (an
    infrastructure problem, not a weak model), and the paired comparison by question."""
    return {
        "initial_eval_reward": mean_reward(initial),
        "final_eval_reward": mean_reward(final),
        "eval_size": len(final),
        "eval_paired": paired_comparison(initial, final),
        "eval_failed": {
            "initial": sum(t.status == "failed" for t in initial),
            "final": sum(t.status == "failed" for t in final),
        },
        "initial_eval": trace_metrics(initial, "eval") if initial else {},
        "final_eval": trace_metrics(final, "eval") if final else {},
    }


def policy_summary(fleet: RolloutFleet, policies: dict[str, TrainedPolicy]) -> dict:
    """What each trained policy got (tokens, versions, stale traces left out), and where the actors ran."""
    infos = fleet.engine_infos()
    serving = {p: [i for i in infos if p in fleet.pool_members[i["pool"]]] for p in policies}  # a pool serves several
    per_policy = {
        p: {
            **policy.summary(),
            "engine_nodes": [i["node_id"] for i in serving[p]],
            "engine_busy_s": sum(i["busy_s"] for i in serving[p]),
        }
        for p, policy in policies.items()
    }
    return {
        "trainable_policies": list(policies),
        "policies": per_policy,
        "engine_restarts": fleet.engine_restarts(),
        "engines_hung": fleet.hung_restarts,
        "worker_restarts": fleet.worker_restarts,
        "trained_tokens": sum(v["trained_tokens"] for v in per_policy.values()),
        "dropped_stale": sum(v["dropped_stale"] for v in per_policy.values()),
        "engine_busy_s": sum(i["busy_s"] for i in infos),
        "nodes": {
            "engines": [i["node_id"] for i in infos],
            "learners": [n for v in per_policy.values() for n in v["learner_nodes"]],
        },
    }


def run_summary(
    initial: list[Trace],
    final: list[Trace],
    first: int,
    wall_s: float,
    fleet: RolloutFleet,
    policies: dict[str, TrainedPolicy],
    loop: LoopConfig,
) -> dict:
    """summary.json: the held-out eval before and after (paired), the steps this call ran from
    `first`, its wall time, and each trained policy's totals."""
    return {
        **eval_summary(initial, final),
        "steps": loop.steps,
        "start_step": first,
        "wall_s": round(wall_s, 1),
        **policy_summary(fleet, policies),
    }
