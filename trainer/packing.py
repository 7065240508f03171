"""From traces to training rows to padded micro-batches.

1. `token_weights`: every trainable generated token gets its loss weight,
   fixed by the loss-normalisation choice over the WHOLE batch, before any
   merging — so merging can change the compute but never the gradient.
2. `build_rows`: within one trace and one policy, a sequence whose prompt
   starts with an earlier row's tokens (prompt + completion, exactly) extends
   that row: one training row, loss on every generated span, weight 0 on the
   prompt / observation tokens in between. Chains of turns collapse to one
   row; compaction, sub-agents and templates that rewrite history (no exact
   prefix) stay separate rows. Frozen sequences make no rows.
3. `share_prefixes`: rows of one policy whose untrained heads are the same
   tokens (a group's samples of one prompt) become one tree row: the head
   once, then each row's rest as a branch that attends to the head and to
   itself only, with the positions it had alone. The same numbers, the head
   computed once instead of once per sample.
4. `pack`: rows into micro-batches under a token budget (rows x padded
   length), longest first, so padding stays small.

Alignment: in a row, position t holds token `input_ids[t]`; its weight,
advantage, behaviour log-prob and sampling temperature describe predicting
that token from the token before it: t - 1, or, for the first token of a
tree row's branch, the head's last token. Position 0 is never trained.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rollout.trace import Trace, prefix_chains
from trainer.config import Normalization


@dataclass
class Row:
    """One training row: one sequence, or a chain of exact-prefix sequences of one trace."""

    input_ids: list[int]  # (T,)
    weights: list[float]  # (T,) loss weight of each target token; 0 = not trained
    advantages: list[float]  # (T,)
    old_logprobs: list[float]  # (T,) behaviour log-probs from the engine (0 where untrained)
    temperatures: list[float]  # (T,) the temperature each token was sampled at (0: the loss's own)
    trace: str  # trace id
    policy: str
    sequences: list[int] = field(default_factory=list)  # indices in the trace, in order
    unmerged_tokens: int = 0  # prompt + completion tokens of its sequences, counted separately
    # A tree row (share_prefixes): input_ids[:head] is shared; branch[t] >= 1 names the branch of
    # token t (0: the head), positions[t] its position in its own sequence. None: a plain row.
    head: int | None = None
    branch: list[int] | None = None
    positions: list[int] | None = None
    members: list[Row] = field(default_factory=list)  # a tree row's rows

    def trained_from(self) -> int:
        """Index of the first trained token (len(input_ids) if none)."""
        return next((t for t, w in enumerate(self.weights) if w != 0.0), len(self.weights))


@dataclass
class MicroBatch:
    """Padded arrays for one forward/backward pass (numpy: cheap through Ray's object store)."""

    input_ids: np.ndarray  # (rows, T) int64, padded with pad_id
    attention_mask: np.ndarray  # (rows, T) int64, 1 on real tokens
    weights: np.ndarray  # (rows, T) float32
    advantages: np.ndarray  # (rows, T) float32
    old_logprobs: np.ndarray  # (rows, T) float32
    temperatures: np.ndarray  # (rows, T) float32; 0: the loss's temperature
    # With tree rows (share_prefixes), else None: each token's position in its own sequence and
    # its branch (0: a shared head or a plain row; -1: padding): see `attention`.
    positions: np.ndarray | None = None  # (rows, T) int64
    branch: np.ndarray | None = None  # (rows, T) int64

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def num_trained(self) -> int:
        return int((self.weights != 0).sum())


def token_weights(
    traces: list[Trace], normalization: Normalization | str, constant: float = 1024.0
) -> list[list[float]]:
    """Per-sequence loss weight of each generated token (same for every token of a sequence).

    token:    1 / (trainable tokens in the batch)            -- every token counts equally
    sequence: 1 / (trainable sequences * tokens in this one)  -- every sequence counts equally
    trace:    1 / (traces * trainable tokens in this trace)   -- every trace counts equally
    constant: 1 / (traces * constant)                         -- length-unbiased (Dr. GRPO)
    Untrainable sequences (frozen, or in failed traces) and empty completions get 0.
    """
    if normalization not in Normalization.__members__:
        raise ValueError(f"algorithm.loss.normalization={normalization!r}; expected one of {list(Normalization)}")
    live = [t.trained_mask() for t in traces]
    n_tokens = sum(len(s.completion_ids) for t, m in zip(traces, live) for s, ok in zip(t.sequences, m) if ok)
    n_seqs = sum(sum(m) for m in live)
    n_traces = sum(any(m) for m in live)
    out = []
    for t, m in zip(traces, live):
        trace_tokens = sum(len(s.completion_ids) for s, ok in zip(t.sequences, m) if ok)
        row = []
        for s, ok in zip(t.sequences, m):
            if not ok:
                row.append(0.0)
            elif normalization == "token":
                row.append(1.0 / n_tokens)
            elif normalization == "sequence":
                row.append(1.0 / (n_seqs * len(s.completion_ids)))
            elif normalization == "trace":
                row.append(1.0 / (n_traces * trace_tokens))
            else:
                row.append(1.0 / (n_traces * constant))
        out.append(row)
    return out


def build_rows(
    traces: list[Trace],
    advantages: list[list[float]],
    weights: list[list[float]],
    merge: bool = True,
    skip_zero_advantage: bool = False,
) -> list[Row]:
    """Training rows for every sequence with a nonzero weight, merged by exact prefix if `merge`.

    `skip_zero_advantage`: leave out sequences whose advantage is 0 (e.g. every trace of a group
    with equal rewards). Their policy-gradient term is exactly 0 and the weights of the others
    are already fixed, so the gradient is unchanged — only valid without a KL term.
    """
    rows: list[Row] = []
    for trace, advs, ws in zip(traces, advantages, weights):
        live = [
            i
            for i, (_, a, w) in enumerate(zip(trace.sequences, advs, ws))
            if w != 0.0 and not (skip_zero_advantage and a == 0.0)
        ]
        chains = prefix_chains(trace.sequences, live) if merge else [[i] for i in live]
        for chain in chains:
            row = Row([], [], [], [], [], trace.id, trace.sequences[chain[0]].policy)
            for i in chain:  # each prompt starts with the row so far: append only what is new
                s, a, w = trace.sequences[i], advs[i], ws[i]
                gap = len(s.prompt_ids) - len(row.input_ids)  # new prompt / observation tokens
                row.input_ids += s.prompt_ids[len(row.input_ids) :] + s.completion_ids
                row.weights += [0.0] * gap + [w] * len(s.completion_ids)
                row.advantages += [0.0] * gap + [a] * len(s.completion_ids)
                row.old_logprobs += [0.0] * gap + list(s.logprobs)
                row.temperatures += [0.0] * gap + [s.temperature or 0.0] * len(s.completion_ids)
                row.sequences.append(i)
                row.unmerged_tokens += s.num_tokens
            rows.append(row)
    return rows


def share_prefixes(rows: list[Row], token_budget: int) -> list[Row]:
    """Rows of one policy whose untrained heads (the tokens before the first trained one) are
    equal become tree rows of at most `token_budget` tokens: the head once, then each row's
    rest. A row alone, or one longer than the budget with its head, stays as it was."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.policy, tuple(r.input_ids[: r.trained_from()])), []).append(r)
    out: list[Row] = []
    for (_, head), members in groups.items():
        trees: list[list[Row]] = []
        size = 0  # tokens of the open tree, trees[-1]
        for r in members:
            rest = len(r.input_ids) - len(head)
            if trees and size + rest <= token_budget:
                trees[-1].append(r)
                size += rest
            else:
                trees.append([r])
                size = len(head) + rest
        for tree in trees:
            out.append(tree[0] if len(tree) == 1 or len(head) < 2 else _tree(tree, len(head)))
    return out


def _tree(rows: list[Row], head: int) -> Row:
    first = rows[0]
    tree = Row(
        first.input_ids[:head],
        first.weights[:head],
        first.advantages[:head],
        first.old_logprobs[:head],
        first.temperatures[:head],
        first.trace,
        first.policy,
        head=head,
        branch=[0] * head,
        positions=list(range(head)),
        members=rows,
    )
    for k, r in enumerate(rows, start=1):
        n = len(r.input_ids)
        tree.input_ids += r.input_ids[head:]
        tree.weights += r.weights[head:]
        tree.advantages += r.advantages[head:]
        tree.old_logprobs += r.old_logprobs[head:]
        tree.temperatures += r.temperatures[head:]
        tree.branch += [k] * (n - head)
        tree.positions += range(head, n)
        tree.unmerged_tokens += r.unmerged_tokens
    return tree


def attention(mb: MicroBatch) -> np.ndarray:
    """(rows, T, T) bool: may query token q attend to key k? Causal, within the row's real
    tokens; in a tree row a branch sees the head and itself. Padding attends to itself only
    (its outputs are never used, and no query is left without a key)."""
    rows, T = mb.input_ids.shape
    branch = mb.branch if mb.branch is not None else np.where(mb.attention_mask == 1, 0, -1)
    q, k = branch[:, :, None], branch[:, None, :]
    causal = np.tril(np.ones((T, T), dtype=bool))[None]
    seen = causal & (k >= 0) & ((k == 0) | (k == q)) & (q >= 0)
    return seen | np.eye(T, dtype=bool)[None]


def predecessors(mb: MicroBatch) -> np.ndarray:
    """(rows, T) int64: the index whose output predicts token t: t - 1, but a tree branch's first
    token is predicted from the head's last (in a tree row the head's indices are its positions)."""
    rows, T = mb.input_ids.shape
    index = np.broadcast_to(np.arange(T) - 1, (rows, T))
    if mb.positions is None:
        return index.copy()
    head = (mb.branch == 0).sum(axis=1, keepdims=True)
    return np.where(mb.positions - 1 < head, mb.positions - 1, index)


def pack(rows: list[Row], token_budget: int, pad_id: int = 0) -> list[MicroBatch]:
    """Group rows (longest first) into micro-batches of at most `token_budget` padded tokens.

    A row longer than the budget gets a micro-batch of its own.
    """
    order = sorted(rows, key=lambda r: len(r.input_ids), reverse=True)
    groups: list[list[Row]] = []
    for r in order:
        # rows arrive longest first, so the group's padded length is its first row's
        if groups and (len(groups[-1]) + 1) * len(groups[-1][0].input_ids) <= token_budget:
            groups[-1].append(r)
        else:
            groups.append([r])
    return [_pad(g, pad_id) for g in groups]


def _pad(rows: list[Row], pad_id: int) -> MicroBatch:
    shape = (len(rows), max(len(r.input_ids) for r in rows))
    ids = np.full(shape, pad_id, dtype=np.int64)
    mask = np.zeros(shape, dtype=np.int64)
    w, adv, old, temp = (np.zeros(shape, dtype=np.float32) for _ in range(4))
    trees = any(r.branch is not None for r in rows)
    positions = np.zeros(shape, dtype=np.int64) if trees else None
    branch = np.full(shape, -1, dtype=np.int64) if trees else None
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n], mask[i, :n] = r.input_ids, 1
        w[i, :n], adv[i, :n], old[i, :n], temp[i, :n] = r.weights, r.advantages, r.old_logprobs, r.temperatures
        if trees:
            positions[i, :n] = r.positions if r.positions is not None else range(n)
            branch[i, :n] = r.branch if r.branch is not None else 0
    return MicroBatch(ids, mask, w, adv, old, temp, positions, branch)


def empty_microbatch(pad_id: int = 0) -> MicroBatch:
    """A micro-batch that trains nothing: pads a rank's share so all ranks step together."""
    row = Row([pad_id, pad_id], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], "", "")
    return _pad([row], pad_id)


def shard(batches: list[MicroBatch], world_size: int, pad_id: int = 0) -> list[list[MicroBatch]]:
    """Split micro-batches over ranks, balancing tokens; every rank gets the same count."""
    shards: list[list[MicroBatch]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for mb in sorted(batches, key=lambda b: b.input_ids.size, reverse=True):
        k = min(range(world_size), key=lambda j: (load[j], len(shards[j])))
        shards[k].append(mb)
        load[k] += mb.input_ids.size
    most = max(len(s) for s in shards)
    for s in shards:
        s.extend(empty_microbatch(pad_id) for _ in range(most - len(s)))
    return shards


def packing_stats(rows: list[Row], batches: list[MicroBatch]) -> dict[str, float]:
    """Tokens before / after merging and the padding fraction of the micro-batches."""
    before = sum(r.unmerged_tokens for r in rows)
    after = sum(len(r.input_ids) for r in rows)
    padded = sum(mb.input_ids.size for mb in batches)
    return {
        "tokens_unmerged": float(before),
        "tokens_merged": float(after),
        "merge_saving": 1.0 - after / before if before else 0.0,
        "rows": float(len(rows)),
        "micro_batches": float(len(batches)),
        "padding_fraction": 1.0 - after / padded if padded else 0.0,
        "shared_prefix_rows": float(sum(len(r.members) for r in rows)),
    }
