"""Statistics of a batch of traces, under their final metric names (`<prefix>/reward`, ...).

One function for every consumer: the training loop logs `rollout/*` for each
step's traces and `eval/*` for held-out runs; scripts/generate.py prints the
same numbers for the traces it wrote.
"""

from __future__ import annotations

from rollout.trace import Trace


def agent_means(traces: list[Trace]) -> dict[str, float]:
    """Mean per-agent reward of each role, over the traces that have per-agent rewards."""
    by_agent: dict[str, list[float]] = {}
    for t in traces:
        for role, r in (t.agent_rewards or {}).items():
            by_agent.setdefault(role, []).append(r)
    return {role: sum(v) / len(v) for role, v in sorted(by_agent.items())}


def info_metric_means(traces: list[Trace]) -> dict[str, float]:
    """The mean of each number a harness put in its traces' `info["metrics"]` (a dict of name ->
    number: a game's win against one opponent, a rate), over the traces that have it: a key a trace
    lacks does not apply to it (a game against another opponent). Booleans and non-numbers are
    skipped."""
    by_key: dict[str, list[float]] = {}
    for t in traces:
        metrics = t.info.get("metrics")
        if not isinstance(metrics, dict):
            continue
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                by_key.setdefault(str(k), []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(by_key.items())}


def trace_metrics(traces: list[Trace], prefix: str) -> dict[str, float]:
    """`<prefix>/traces` (count), `reward` (mean), `success` (share with reward >= 1), `failed`
    and `truncated` (counts), `sequences_per_trace`, `agents_per_trace`, `generated_tokens` (sum), and
    `<prefix>/reward/<role>` for harnesses with per-agent rewards, `<prefix>/gateway_extended` and
    `gateway_fresh` (calls that continued an earlier call's ids / were rendered fresh) for agents
    behind the OpenAI gateway, `<prefix>/info/<name>` for the numbers of a harness's
    `info["metrics"]` (info_metric_means). Means are 0.0 for no traces."""
    n = max(len(traces), 1)
    m = {
        f"{prefix}/traces": float(len(traces)),
        f"{prefix}/reward": sum(t.reward for t in traces) / n,
        f"{prefix}/success": sum(t.reward >= 1.0 for t in traces) / n,
        f"{prefix}/failed": float(sum(t.status == "failed" for t in traces)),
        f"{prefix}/truncated": float(sum(t.status == "truncated" for t in traces)),
        f"{prefix}/sequences_per_trace": sum(len(t.sequences) for t in traces) / n,
        f"{prefix}/agents_per_trace": sum(len(t.agents) for t in traces) / n,
        f"{prefix}/generated_tokens": float(sum(t.num_generated_tokens for t in traces)),
    }
    m.update({f"{prefix}/reward/{role}": r for role, r in agent_means(traces).items()})
    for key in ("gateway_extended", "gateway_fresh"):  # agents behind the OpenAI gateway (rollout/gateway/server.py)
        if any(key in t.info for t in traces):
            m[f"{prefix}/{key}"] = float(sum(t.info.get(key, 0) for t in traces))
    m.update({f"{prefix}/info/{k}": v for k, v in info_metric_means(traces).items()})
    return m
