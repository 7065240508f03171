"""Invariants 1 and 2 of docs/design.md on the tiny model (real tokenizer and chat template, fp32).

1. Merged and unmerged training of the same trace give the same gradient.
2. The gradient equals sum over trainable generated tokens of w * A * grad log pi;
   prompt, observation and frozen tokens contribute nothing.
"""

import pytest
import torch

from rollout.agents.chat_format import ChatFormat
from rollout.trace import Sequence, Trace
from tests.conftest import hf_logprobs
from trainer.config import LossConfig, Normalization
from trainer.losses import microbatch_loss
from trainer.packing import build_rows, pack, packing_stats, share_prefixes, token_weights

pytestmark = pytest.mark.unit


def seq(model, prompt, completion, agent="solver", policy="main", trainable=True, parent=None):
    return Sequence(
        prompt,
        completion,
        hf_logprobs(model, prompt, completion).tolist(),
        agent,
        policy,
        0,
        trainable=trainable,
        parent=parent,
    )


@pytest.fixture(scope="module")
def traces(hf_tiny, tiny_tokenizer):
    """A 3-turn solver conversation + a verifier (fresh context) + a frozen judge; and a
    compaction trace whose second sequence starts from a summary (no shared prefix)."""
    fmt = ChatFormat(tiny_tokenizer)
    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    m = hf_tiny
    p0 = fmt.render([{"role": "system", "content": "Solve."}, {"role": "user", "content": "What is 3 + 4?"}])
    c0 = fmt.encode("It is 7.") + [eos]
    p1 = p0 + c0 + fmt.continuation(p0 + c0, [{"role": "user", "content": "Check the sum."}])
    c1 = fmt.encode("3 + 4 = 7, yes.") + [eos]
    p2 = p1 + c1 + fmt.continuation(p1 + c1, [{"role": "tool", "content": "ok"}])
    c2 = fmt.encode("<answer>7</answer>")  # cut by max_tokens: no end token
    pv = fmt.render([{"role": "user", "content": "Is 7 right for 3 + 4?"}])
    cv = fmt.encode("Yes it is.") + [eos]
    pj = fmt.render([{"role": "user", "content": "Judge: 7"}])
    cj = fmt.encode("Good.") + [eos]
    chat = Trace(
        "chat",
        "g1",
        [
            seq(m, p0, c0),
            seq(m, pv, cv, agent="verifier"),
            seq(m, p1, c1, parent=0),
            seq(m, pj, cj, agent="judge", policy="frozen", trainable=False),
            seq(m, p2, c2, parent=2),
        ],
        reward=1.0,
    )
    q0 = fmt.render([{"role": "user", "content": "Add 1 2 3 4 5 6 step by step."}])
    d0 = fmt.encode("1 + 2 = 3, 3 + 3 = 6, 6 + 4 = 10") + [eos]
    q1 = fmt.render([{"role": "user", "content": "Summary: partial sum 10. Continue with 5 and 6."}])
    d1 = fmt.encode("10 + 5 = 15, 15 + 6 = 21.") + [eos]
    compact = Trace("compact", "g2", [seq(m, q0, d0), seq(m, q1, d1)], reward=0.0)
    return [chat, compact]


ADVANTAGES = [[0.7, -0.4, 0.7, 0.0, 0.7], [-1.3, -1.3]]  # per sequence; the frozen judge's is ignored


def grad_of(model, traces, normalization, merge, budget=256):
    weights = token_weights(traces, normalization, constant=64.0)
    rows = build_rows(traces, ADVANTAGES, weights, merge=merge)
    model.zero_grad()
    for mb in pack(rows, budget):
        loss, _ = microbatch_loss(model, mb, LossConfig(normalization=normalization))
        loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).clone(), rows


def test_rows_merge_exact_prefix_chains_only(traces):
    weights = token_weights(traces, "token")
    rows = build_rows(traces, ADVANTAGES, weights)
    # chat: turns 0 -> 2 -> 4 merge into one row; the verifier is its own; the frozen judge makes none.
    # compact: the post-compaction sequence does not extend the pre-compaction one.
    assert sorted((r.trace, tuple(r.sequences)) for r in rows) == [
        ("chat", (0, 2, 4)),
        ("chat", (1,)),
        ("compact", (0,)),
        ("compact", (1,)),
    ]
    chain = next(r for r in rows if r.sequences == [0, 2, 4])
    s4 = traces[0].sequences[4]
    assert chain.input_ids == s4.prompt_ids + s4.completion_ids
    trained = sum(w != 0 for w in chain.weights)
    assert trained == sum(len(traces[0].sequences[i].completion_ids) for i in (0, 2, 4))
    stats = packing_stats(rows, pack(rows, 4096))
    assert stats["tokens_merged"] < stats["tokens_unmerged"]
    unmerged = build_rows(traces, ADVANTAGES, weights, merge=False)
    assert len(unmerged) == 6 and packing_stats(unmerged, pack(unmerged, 4096))["merge_saving"] == 0.0


@pytest.mark.parametrize("normalization", list(Normalization))
def test_invariant1_merged_equals_unmerged_gradient(hf_tiny, traces, normalization):
    merged, rows_m = grad_of(hf_tiny, traces, normalization, merge=True)
    unmerged, rows_u = grad_of(hf_tiny, traces, normalization, merge=False, budget=64)
    assert len(rows_m) < len(rows_u)
    assert merged.norm() > 0
    rel = ((merged - unmerged).norm() / merged.norm()).item()
    assert rel < 1e-5, rel


@pytest.mark.parametrize("normalization", list(Normalization))
def test_invariant2_gradient_is_sum_over_trainable_generated_tokens(hf_tiny, traces, normalization):
    got, _ = grad_of(hf_tiny, traces, normalization, merge=True)
    # independent: sum_t w A grad log pi(y_t) over exactly the trainable completion tokens
    weights = token_weights(traces, normalization, constant=64.0)
    hf_tiny.zero_grad()
    for trace, advs, ws in zip(traces, ADVANTAGES, weights):
        for s, a, w in zip(trace.sequences, advs, ws):
            if not s.trainable:
                continue
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logp = torch.log_softmax(hf_tiny(ids).logits[0], -1)
            pos = torch.arange(len(s.prompt_ids) - 1, ids.shape[1] - 1)
            (-(w * a) * logp[pos, torch.tensor(s.completion_ids)].sum()).backward()
    expected = torch.cat([p.grad.flatten() for p in hf_tiny.parameters()])
    rel = ((got - expected).norm() / expected.norm()).item()
    assert rel < 1e-5, rel


def test_frozen_and_observation_tokens_contribute_nothing(hf_tiny, traces):
    base, _ = grad_of(hf_tiny, traces, "token", merge=True)
    # the frozen judge's advantage is irrelevant ...
    saved = ADVANTAGES[0][3]
    ADVANTAGES[0][3] = 5.0
    try:
        other, _ = grad_of(hf_tiny, traces, "token", merge=True)
    finally:
        ADVANTAGES[0][3] = saved
    assert torch.equal(base, other)
    # ... and so is removing it from the trace altogether
    chat = traces[0]
    no_judge = Trace(chat.id, chat.group, [s for s in chat.sequences if s.trainable], reward=chat.reward)
    advs = [[0.7, -0.4, 0.7, 0.7], ADVANTAGES[1]]
    weights = token_weights([no_judge, traces[1]], "token")
    hf_tiny.zero_grad()
    for mb in pack(build_rows([no_judge, traces[1]], advs, weights), 256):
        microbatch_loss(hf_tiny, mb, LossConfig())[0].backward()
    again = torch.cat([p.grad.flatten() for p in hf_tiny.parameters()])
    assert ((again - base).norm() / base.norm()).item() < 1e-6


def test_skipping_zero_advantage_rows_keeps_the_gradient(hf_tiny, traces):
    advs = [[0.0, -0.4, 0.0, 0.0, 0.0], [-1.3, 0.0]]  # the chat's solver chain and one compaction half at 0
    weights = token_weights(traces, "sequence")
    grads = []
    for skip in (False, True):
        rows = build_rows(traces, advs, weights, skip_zero_advantage=skip)
        hf_tiny.zero_grad()
        for mb in pack(rows, 256):
            microbatch_loss(hf_tiny, mb, LossConfig(normalization="sequence"))[0].backward()
        grads.append((len(rows), torch.cat([p.grad.flatten() for p in hf_tiny.parameters()]).clone()))
    (n_all, g_all), (n_skip, g_skip) = grads
    assert n_skip == 2 < n_all == 4
    assert ((g_all - g_skip).norm() / g_all.norm()).item() < 1e-5


def test_each_sequence_is_scored_at_the_temperature_it_was_sampled_at(hf_tiny, traces):
    """Sequences sampled at 1.0, 0.5 and 1.3 next to ones with no recorded temperature, in a run
    whose loss temperature is 0.7: with behaviour log-probs of each one's own distribution the
    loss is exactly on-policy (every ratio 1); scored at the run's temperature instead, it is not.
    Scoring the trained positions only gives the loss and gradient of scoring every position."""
    import msgspec

    cfg = LossConfig(temperature=0.7)
    chat = traces[0]
    temps = [1.0, 0.5, None, None, 1.3]  # per sequence; #3 is the frozen judge
    seqs = [
        msgspec.structs.replace(
            s,
            temperature=t,
            logprobs=hf_logprobs(hf_tiny, s.prompt_ids, s.completion_ids, temperature=t or cfg.temperature).tolist(),
        )
        for s, t in zip(chat.sequences, temps)
    ]
    sampled = Trace(chat.id, chat.group, seqs, reward=1.0)
    blind = Trace(chat.id, chat.group, [msgspec.structs.replace(s, temperature=None) for s in seqs], reward=1.0)

    def step(trace, only_trained=True):
        [mb] = pack(build_rows([trace], [ADVANTAGES[0]], token_weights([trace], "token")), 4096)
        hf_tiny.zero_grad()
        loss, m = microbatch_loss(hf_tiny, mb, cfg, only_trained=only_trained)
        loss.backward()
        return loss.item(), m, torch.cat([p.grad.flatten() for p in hf_tiny.parameters()]).clone()

    loss, m, grad = step(sampled)
    n = sum(len(s.completion_ids) for s in seqs if s.trainable)
    assert m["tokens"].item() == n
    assert abs(m["ratio"].item() - n) < 1e-3 and m["ratio_max"].item() < 1 + 1e-4
    assert abs(m["logp"].item() - sum(sum(s.logprobs) for s in seqs if s.trainable)) < 1e-3
    assert m["mismatch_kl"].item() < 1e-8
    _, m_blind, _ = step(blind)
    assert m_blind["ratio_max"].item() > 1.05, "scored at 0.7, the 1.0 / 0.5 / 1.3 samples are off-policy"

    loss_all, m_all, grad_all = step(sampled, only_trained=False)
    assert abs(loss_all - loss) < 1e-6 and abs(m_all["entropy"].item() - m["entropy"].item()) < 1e-3
    assert ((grad_all - grad).norm() / grad.norm()).item() < 1e-5


@pytest.fixture(scope="module")
def group(hf_tiny, tiny_tokenizer):
    """Four samples of one prompt (one of them a two-turn chain, one cut by max_tokens) and a
    trace of another prompt: what a GRPO group looks like to the packer."""
    fmt = ChatFormat(tiny_tokenizer)
    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    p = fmt.render([{"role": "system", "content": "Solve."}, {"role": "user", "content": "What is 3 + 4?"}])
    answers = ["7.", "It is 7, since 3 + 4 = 7.", "8", "<answer>7"]
    traces = []
    for k, text in enumerate(answers):
        c = fmt.encode(text) + ([eos] if k < 3 else [])
        seqs = [seq(hf_tiny, p, c)]
        if k == 1:  # a second turn that extends the first exactly
            p1 = p + c + fmt.continuation(p + c, [{"role": "user", "content": "Sure?"}])
            seqs.append(seq(hf_tiny, p1, fmt.encode("Yes.") + [eos], parent=0))
        traces.append(Trace(f"t{k}", "g", seqs, reward=float(k % 2)))
    q = fmt.render([{"role": "user", "content": "What is 2 + 2?"}])
    traces.append(Trace("other", "h", [seq(hf_tiny, q, fmt.encode("4") + [eos])], reward=1.0))
    advantages = [[0.5], [-0.5, -0.5], [0.5], [-0.5], [1.0]]
    return traces, advantages


@pytest.mark.parametrize("split", [False, True])
def test_samples_of_one_prompt_share_it_and_give_the_same_gradient_and_metrics(hf_tiny, group, split):
    """share_prefixes: a group's rows become tree rows (the prompt once, each sample's rest after
    it, seeing only the prompt and itself); gradient, importance ratios and log-probs equal
    those of the plain rows. `split`: a budget that fits the prompt and two samples, so the
    group makes two trees, packed with plain rows in the same micro-batches. With a KL term
    to a reference model (the tree's inputs go through it too)."""
    import copy

    traces, advantages = group
    ref = copy.deepcopy(hf_tiny).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)
    weights = token_weights(traces, "token")
    rows = build_rows(traces, advantages, weights)
    prompt = len(traces[0].sequences[0].prompt_ids)
    budget = prompt + len(rows[0].input_ids) + len(rows[1].input_ids) - 2 * prompt if split else 4096

    def run(rs):
        hf_tiny.zero_grad()
        metrics = []
        for mb in pack(rs, 4 * budget):
            loss, m = microbatch_loss(hf_tiny, mb, LossConfig(kl_coef=0.1), ref_model=ref)
            loss.backward()
            metrics.append(m)
        grad = torch.cat([p.grad.flatten() for p in hf_tiny.parameters()]).clone()
        return grad, {k: sum(m[k].item() for m in metrics) for k in ("logp", "mismatch_kl", "kl_ref", "tokens")}

    shared = share_prefixes(rows, budget)
    trees = [r for r in shared if r.members]
    assert sum(len(r.members) for r in trees) == 4 and len(trees) == (2 if split else 1)
    assert all(r.trace != "other" or not r.members for r in shared)
    assert all(r.head == prompt and r.input_ids[:prompt] == traces[0].sequences[0].prompt_ids for r in trees)
    assert sum(len(r.input_ids) for r in shared) == sum(len(r.input_ids) for r in rows) - (4 - len(trees)) * prompt
    plain_grad, plain = run(rows)
    tree_grad, tree = run(shared)
    assert plain_grad.norm() > 0
    assert ((tree_grad - plain_grad).norm() / plain_grad.norm()).item() < 1e-5
    assert tree["tokens"] == plain["tokens"]
    assert tree["logp"] == pytest.approx(plain["logp"], rel=1e-5)
    assert tree["mismatch_kl"] == pytest.approx(plain["mismatch_kl"], abs=1e-6)
    assert plain["kl_ref"] > 1e-3 and tree["kl_ref"] == pytest.approx(plain["kl_ref"], rel=1e-4)
