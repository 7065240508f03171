"""Multi-agent traces from real harness runs (tiny model, real engine) through the trainer's
credit assignment and loss: which tokens get gradient, and from which reward."""

import pytest
import torch

from rollout.trace import Trace
from trainer.advantages import compute_advantages
from trainer.config import AdvantageConfig, LossConfig
from trainer.losses import microbatch_loss
from trainer.packing import build_rows, pack, token_weights

pytestmark = pytest.mark.integration


def gradient(model, traces, advs):
    """The batch's policy-gradient (token-normalised loss), and its training rows."""
    rows = build_rows(traces, advs, token_weights(traces, "token"))
    model.zero_grad()
    for mb in pack(rows, 8192):
        microbatch_loss(model, mb, LossConfig(normalization="token"))[0].backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).clone(), rows


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_compaction_trace_trains_across_the_boundary(run_harness, hf_tiny):
    _, seqs, result = run_harness(
        "harnesses.programs.compaction.compaction", ["solver"], budget_tokens=400, max_steps=8, reply_tokens=16
    )
    assert result.info["compactions"] >= 1
    trace = Trace("c", "g", seqs, reward=1.0)
    [advs] = compute_advantages([trace], AdvantageConfig(estimator="uniform"))
    assert advs == [1.0] * len(seqs), "the trace reward reaches every sequence, before and after"
    full, rows = gradient(hf_tiny, [trace], [advs])
    starts = [i for i, s in enumerate(seqs) if s.parent is None]
    segments = [list(range(a, b)) for a, b in zip(starts, starts[1:] + [len(seqs)])]
    assert [r.sequences for r in rows] == segments, "the post-compaction sequence starts a new row"
    for row in rows:  # every generated token of the row is trained
        generated = sum(len(seqs[i].completion_ids) for i in row.sequences)
        assert sum(w > 0 for w in row.weights) == generated
    # Each side of every boundary gets its own nonzero gradient, and they add up to the whole.
    parts = []
    for segment in segments:
        only = [a if i in segment else 0.0 for i, a in enumerate(advs)]
        parts.append(gradient(hf_tiny, [trace], [only])[0])
        assert parts[-1].norm() > 1e-6 * full.norm()
    assert rel(sum(parts), full) < 1e-5


def test_debate_frozen_judge_gets_no_gradient_and_debaters_their_own_reward(run_harness, hf_tiny):
    runs = [
        run_harness(
            "harnesses.programs.debate.debate",
            ["debater_a", "debater_b", "judge"],
            task_index=k,
            frozen={"judge"},
            debaters=2,
            rounds=2,
        )[1]
        for k in range(2)
    ]
    judge = len(runs[0]) - 1
    assert all(s[judge].agent == "judge" and not s[judge].trainable for s in runs)
    # Two debates in one group: a wins the first, b the second (per-debater rewards).
    traces = [
        Trace("d0", "g", runs[0], reward=1.0, agent_rewards={"debater_a": 1.0, "debater_b": 0.0, "judge": 1.0}),
        Trace("d1", "g", runs[1], reward=0.0, agent_rewards={"debater_a": 0.0, "debater_b": 1.0, "judge": 0.0}),
    ]
    advs = compute_advantages(traces, AdvantageConfig(estimator="grpo", scale_by_std=False, per_agent_rewards=True))
    for k, sign in ((0, 1.0), (1, -1.0)):
        for j, s in enumerate(runs[k]):
            want = {"debater_a": 0.5 * sign, "debater_b": -0.5 * sign, "judge": 0.0}[s.agent]
            assert advs[k][j] == pytest.approx(want), (k, j, s.agent)
    full, rows = gradient(hf_tiny, traces, advs)
    assert all(judge not in r.sequences for r in rows), "the frozen judge makes no training row"
    # Judge tokens contribute nothing: the same batch without the judge's sequence, same gradient.
    no_judge = [
        Trace(
            t.id,
            t.group,
            t.sequences[:judge],
            reward=t.reward,
            agent_rewards={r: v for r, v in t.agent_rewards.items() if r != "judge"},
        )
        for t in traces
    ]
    without, _ = gradient(hf_tiny, no_judge, [a[:judge] for a in advs])
    assert rel(without, full) < 1e-6
    # Each debater's tokens follow its own reward: a's winning debate alone (b's tokens at 0)
    # is a's half of the gradient, and the two halves add up to the whole.
    halves = [
        gradient(
            hf_tiny,
            traces,
            [[a if s.agent == role else 0.0 for s, a in zip(t.sequences, row)] for t, row in zip(traces, advs)],
        )[0]
        for role in ("debater_a", "debater_b")
    ]
    assert all(h.norm() > 1e-3 * full.norm() for h in halves)
    assert rel(halves[0] + halves[1], full) < 1e-5
