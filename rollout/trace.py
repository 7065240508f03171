"""The trace data model: the contract between rollout and trainer.

A `Sequence` is one model-generated token stream (`completion_ids`) produced
under a context (`prompt_ids`). A `Trace` is everything one harness run
produced: every sequence of every agent, plus the reward(s) of the run.
Both are plain dataclasses over Python lists, validated on construction, so
they travel cheaply through Ray's object store and round-trip through JSONL.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

TRACE_STATUSES = ("ok", "failed", "truncated")
FINISH_REASONS = ("stop", "length", "abort")


class TraceError(ValueError):
    """A malformed sequence or trace; the message says which field and why."""


def _check_ids(name: str, ids: list[int]) -> None:
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise TraceError(f"{name}[{i}] = {t!r} is not an int token id")
        if t < 0:
            raise TraceError(f"{name}[{i}] = {t} is a negative token id")


@dataclass
class Sequence:
    """One model call: prompt tokens in, generated tokens (and their behaviour log-probs) out."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each completion token, from the engine
    agent: str  # role name in the harness ("solver", "judge", ...)
    policy: str  # which model produced it ("main", "frozen", ...)
    version: int  # weight version of `policy` when the request was submitted
    trainable: bool = True  # False for frozen judges, opponents, tool simulators
    finish_reason: str = "stop"  # stop | length | abort
    reward: float | None = None  # optional per-turn reward
    parent: int | None = None  # index (in the trace) of the sequence this one continues

    def __post_init__(self) -> None:
        self.prompt_ids = list(self.prompt_ids)
        self.completion_ids = list(self.completion_ids)
        self.logprobs = [float(x) for x in self.logprobs]
        _check_ids("prompt_ids", self.prompt_ids)
        _check_ids("completion_ids", self.completion_ids)
        if not self.prompt_ids:
            raise TraceError("prompt_ids is empty: every sequence is generated under some context")
        if len(self.logprobs) != len(self.completion_ids):
            raise TraceError(
                f"logprobs has {len(self.logprobs)} entries but completion_ids has "
                f"{len(self.completion_ids)}: need one behaviour log-prob per generated token")
        for i, lp in enumerate(self.logprobs):
            if not math.isfinite(lp) or lp > 1e-4:
                raise TraceError(f"logprobs[{i}] = {lp} is not a finite log-probability (<= 0)")
        if not self.agent or not self.policy:
            raise TraceError("agent and policy must be non-empty role / policy names")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise TraceError(f"version = {self.version!r} must be a non-negative int")
        if self.finish_reason not in FINISH_REASONS:
            raise TraceError(f"finish_reason = {self.finish_reason!r}, expected one of {FINISH_REASONS}")
        if self.reward is not None and not math.isfinite(self.reward):
            raise TraceError(f"reward = {self.reward} is not finite")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def check_vocab(self, vocab_size: int) -> None:
        """Raise TraceError if any token id is outside `[0, vocab_size)`."""
        for name in ("prompt_ids", "completion_ids"):
            ids = getattr(self, name)
            if ids and max(ids) >= vocab_size:
                i = max(range(len(ids)), key=ids.__getitem__)
                raise TraceError(
                    f"{name}[{i}] = {ids[i]} is out of vocabulary (vocab_size {vocab_size})")


@dataclass
class Trace:
    """One harness run: every sequence it generated and the reward of the whole run."""

    id: str
    group: str  # task-instance id: traces of one task form a group (group baselines)
    sequences: list[Sequence]
    reward: float = 0.0
    agent_rewards: dict[str, float] | None = None  # role -> reward (competitive / role-specific)
    status: str = "ok"  # ok | failed | truncated
    error: str | None = None  # why a failed trace failed
    info: dict[str, Any] = field(default_factory=dict)  # task id, answer, harness extras
    timings: dict[str, float] = field(default_factory=dict)  # seconds: start, end, duration_s

    def __post_init__(self) -> None:
        self.sequences = [s if isinstance(s, Sequence) else Sequence(**s) for s in self.sequences]
        if self.status not in TRACE_STATUSES:
            raise TraceError(f"status = {self.status!r}, expected one of {TRACE_STATUSES}")
        if self.status == "failed" and not self.error:
            raise TraceError("a failed trace must say why (error is empty)")
        if not math.isfinite(self.reward):
            raise TraceError(f"reward = {self.reward} is not finite")
        if self.agent_rewards is not None:
            roles = {s.agent for s in self.sequences}
            for role, r in self.agent_rewards.items():
                if not math.isfinite(r):
                    raise TraceError(f"agent_rewards[{role!r}] = {r} is not finite")
                if self.sequences and role not in roles:
                    raise TraceError(f"agent_rewards names role {role!r}, but no sequence has it "
                                     f"(roles: {sorted(roles)})")
        for i, s in enumerate(self.sequences):
            if s.parent is not None and not 0 <= s.parent < i:
                raise TraceError(f"sequences[{i}].parent = {s.parent} must index an earlier sequence")

    # -- counts --------------------------------------------------------------
    @property
    def agents(self) -> list[str]:
        return sorted({s.agent for s in self.sequences})

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(s.completion_ids) for s in self.sequences)

    @property
    def num_trainable_tokens(self) -> int:
        return sum(len(s.completion_ids) for s in self.sequences if s.trainable)

    def trained_mask(self) -> list[bool]:
        """Which sequences the learner trains on: trainable ones with generated tokens, in a
        trace that did not fail. The rest (frozen roles, failed traces) carry no loss."""
        return [s.trainable and self.status != "failed" and len(s.completion_ids) > 0
                for s in self.sequences]

    def check_vocab(self, vocab_sizes: dict[str, int]) -> None:
        """Raise TraceError naming the sequence whose ids fall outside its policy's vocabulary."""
        for i, s in enumerate(self.sequences):
            if s.policy in vocab_sizes:
                try:
                    s.check_vocab(vocab_sizes[s.policy])
                except TraceError as e:
                    raise TraceError(f"sequences[{i}] ({s.agent}/{s.policy}): {e}") from None

    # -- serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trace:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TraceError(f"unknown trace fields {sorted(unknown)}")
        return cls(**d)


def _extends(prompt_ids: list[int], s: Sequence) -> bool:
    """Whether `prompt_ids` starts with `s`'s prompt + completion, token for token."""
    n = len(s.prompt_ids)
    return prompt_ids[:n] == s.prompt_ids and prompt_ids[n:n + len(s.completion_ids)] == s.completion_ids


def prefix_chains(sequences: list[Sequence], include: Iterable[int] | None = None) -> list[list[int]]:
    """Exact-prefix chains of one trace's sequences: the training rows of trainer/packing.py.

    In order, a sequence whose prompt starts exactly with a chain's tokens (its last
    sequence's prompt + completion) under the same policy extends the longest such chain;
    otherwise it starts a new one. So turns of one conversation chain up, while fresh
    contexts, sub-agents and rewritten histories (compaction) stand alone. `include`: the
    sequence indices to consider, in order (default: all). Returns lists of indices,
    ordered by their first sequence.
    """
    chains: list[list[int]] = []
    for i in range(len(sequences)) if include is None else include:
        s = sequences[i]
        best, best_len = None, 0
        for chain in chains:
            last = sequences[chain[-1]]
            n = last.num_tokens
            if last.policy == s.policy and best_len < n <= len(s.prompt_ids) and _extends(s.prompt_ids, last):
                best, best_len = chain, n
        if best is None:
            chains.append([i])
        else:
            best.append(i)
    return chains


def write_jsonl(traces: Iterable[Trace], path: str | Path) -> int:
    """Write traces one JSON object per line; returns how many were written."""
    n = 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for t in traces:
            f.write(json.dumps(t.to_dict(), separators=(",", ":")) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[Trace]:
    """Read traces written by `write_jsonl`; a bad line raises TraceError naming its line number."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trace.from_dict(json.loads(line))
            except (TraceError, TypeError, json.JSONDecodeError) as e:
                raise TraceError(f"{path}:{lineno}: {e}") from None
