"""The trace data model: the contract between rollout and trainer.

A `Sequence` is one model-generated token stream (`completion_ids`) produced
under a context (`prompt_ids`). A `Trace` is everything one harness run
produced: every sequence of every agent, plus the reward(s) of the run.

Both are msgspec Structs over plain Python lists: they travel cheaply through
Ray's object store, and a JSONL file decodes straight into them with every
field type-checked by msgspec (booleans are booleans, ids are ints, ...; an
unknown field is an error). Construction in Python runs the same checks in
`__post_init__`, plus what a type cannot say (lengths agree, log-probs are
finite and <= 0, a parent is an earlier sequence, a per-agent reward names a
role that spoke). Every rejection is a `TraceError` naming the field (and,
from a file, the line).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

TRACE_STATUSES = ("ok", "failed", "truncated")
FINISH_REASONS = ("stop", "length", "abort")


class TraceError(ValueError):
    """A malformed sequence or trace; the message says which field and why."""


def _fail(field: str, value: Any, want: str) -> None:
    raise TraceError(f"{field} = {value!r:.80} must be {want}")


def _number(field: str, value: Any, finite: bool = True) -> float:
    if type(value) not in (int, float):
        _fail(field, value, "a number (int or float)")
    if finite and not math.isfinite(value):
        raise TraceError(f"{field} = {value} is not finite")
    return float(value)


def _name(field: str, value: Any) -> None:
    if type(value) is not str or not value:
        _fail(field, value, "a non-empty string")


def _check_ids(field: str, ids: Any) -> None:
    # set(map(type, ...)) and min() run in C: cheap next to decoding the ids.
    if type(ids) is not list:
        _fail(field, ids, "a list of int token ids")
    if set(map(type, ids)) - {int}:
        i, t = next((i, t) for i, t in enumerate(ids) if type(t) is not int)
        raise TraceError(f"{field}[{i}] = {t!r} is not an int token id")
    if ids and min(ids) < 0:
        i = ids.index(min(ids))
        raise TraceError(f"{field}[{i}] = {ids[i]} is a negative token id")


class Sequence(msgspec.Struct, forbid_unknown_fields=True):
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
    # The temperature it was sampled at; the learner scores it at that temperature (the log-probs
    # above are of that distribution). None (older traces) or 0 (greedy): the run's loss temperature.
    temperature: float | None = None

    def __post_init__(self) -> None:
        _check_ids("prompt_ids", self.prompt_ids)
        _check_ids("completion_ids", self.completion_ids)
        if not self.prompt_ids:
            raise TraceError("prompt_ids is empty: every sequence is generated under some context")
        if type(self.logprobs) is not list or set(map(type, self.logprobs)) - {float, int}:
            _fail("logprobs", self.logprobs, "a list of float log-probabilities")
        if len(self.logprobs) != len(self.completion_ids):
            raise TraceError(
                f"logprobs has {len(self.logprobs)} entries but completion_ids has "
                f"{len(self.completion_ids)}: need one behaviour log-prob per generated token"
            )
        if self.logprobs and not (all(map(math.isfinite, self.logprobs)) and max(self.logprobs) <= 1e-4):
            i, lp = next((i, lp) for i, lp in enumerate(self.logprobs) if not (math.isfinite(lp) and lp <= 1e-4))
            raise TraceError(f"logprobs[{i}] = {lp} is not a finite log-probability (<= 0)")
        _name("agent", self.agent)
        _name("policy", self.policy)
        if type(self.version) is not int or self.version < 0:
            _fail("version", self.version, "a non-negative int")
        if type(self.trainable) is not bool:
            _fail("trainable", self.trainable, "a bool")
        if self.finish_reason not in FINISH_REASONS:
            _fail("finish_reason", self.finish_reason, f"one of {FINISH_REASONS}")
        if self.reward is not None:
            self.reward = _number("reward", self.reward)
        if self.parent is not None and type(self.parent) is not int:
            _fail("parent", self.parent, "an int (an earlier sequence's index) or None")
        if self.temperature is not None:
            self.temperature = _number("temperature", self.temperature)
            if self.temperature < 0:
                _fail("temperature", self.temperature, "a sampling temperature >= 0, or None")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def check_vocab(self, vocab_size: int) -> None:
        """Raise TraceError if any token id is outside `[0, vocab_size)`."""
        for name in ("prompt_ids", "completion_ids"):
            ids = getattr(self, name)
            if ids and max(ids) >= vocab_size:
                i = max(range(len(ids)), key=ids.__getitem__)
                raise TraceError(f"{name}[{i}] = {ids[i]} is out of vocabulary (vocab_size {vocab_size})")


class Trace(msgspec.Struct, forbid_unknown_fields=True):
    """One harness run: every sequence it generated and the reward of the whole run."""

    id: str
    group: str  # task-instance id: traces of one task form a group (group baselines)
    sequences: list[Sequence]
    reward: float = 0.0
    agent_rewards: dict[str, float] | None = None  # role -> reward (competitive / role-specific)
    status: str = "ok"  # ok | failed | truncated
    error: str | None = None  # why a failed trace failed
    info: dict[str, Any] = msgspec.field(default_factory=dict)  # task id, question, harness extras
    timings: dict[str, float] = msgspec.field(default_factory=dict)  # seconds: start, end, duration_s

    def __post_init__(self) -> None:
        _name("id", self.id)
        _name("group", self.group)
        if type(self.sequences) is not list:
            _fail("sequences", self.sequences, "a list of Sequence")
        self.sequences = [
            s if isinstance(s, Sequence) else _convert(s, Sequence, f"sequences[{i}]")
            for i, s in enumerate(self.sequences)
        ]
        if self.status not in TRACE_STATUSES:
            _fail("status", self.status, f"one of {TRACE_STATUSES}")
        if self.error is not None and type(self.error) is not str:
            _fail("error", self.error, "a string or None")
        if self.status == "failed" and not self.error:
            raise TraceError("a failed trace must say why (error is empty)")
        self.reward = _number("reward", self.reward)
        if type(self.info) is not dict or any(type(k) is not str for k in self.info):
            _fail("info", self.info, "a dict with string keys")
        if type(self.timings) is not dict:
            _fail("timings", self.timings, "a dict of seconds")
        self.timings = {k: _number(f"timings[{k!r}]", v, finite=False) for k, v in self.timings.items()}
        if self.agent_rewards is not None:
            if type(self.agent_rewards) is not dict:
                _fail("agent_rewards", self.agent_rewards, "a dict role -> reward, or None")
            roles = {s.agent for s in self.sequences}
            for role, r in self.agent_rewards.items():
                _name("agent_rewards key", role)
                self.agent_rewards[role] = _number(f"agent_rewards[{role!r}]", r)
                if self.sequences and role not in roles:
                    raise TraceError(
                        f"agent_rewards names role {role!r}, but no sequence has it (roles: {sorted(roles)})"
                    )
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
        return [s.trainable and self.status != "failed" and len(s.completion_ids) > 0 for s in self.sequences]

    def only_policy(self, policy: str) -> Trace:
        """This trace as `policy`'s learners see it: every other policy's sequences untrainable
        (kept: they are context, and a role's presence counts for its baselines)."""
        if all(s.policy == policy or not s.trainable for s in self.sequences):
            return self
        return msgspec.structs.replace(
            self,
            sequences=[
                s if s.policy == policy else msgspec.structs.replace(s, trainable=False) for s in self.sequences
            ],
        )

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
        return msgspec.to_builtins(self)

    @classmethod
    def from_dict(cls, d: Any) -> Trace:
        """A Trace from plain data (e.g. decoded JSON), every field type-checked."""
        return _convert(d, cls, "trace")


def _convert(data: Any, cls: type, what: str) -> Any:
    """msgspec's strict conversion, its errors (which name the field's path) as TraceError."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as e:
        raise TraceError(f"{what}: {e}") from None


def _extends(prompt_ids: list[int], s: Sequence) -> bool:
    """Whether `prompt_ids` starts with `s`'s prompt + completion, token for token."""
    n = len(s.prompt_ids)
    return prompt_ids[:n] == s.prompt_ids and prompt_ids[n : n + len(s.completion_ids)] == s.completion_ids


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


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Trace)


def write_jsonl(traces: Iterable[Trace], path: str | Path) -> int:
    """Write traces one JSON object per line; returns how many were written. Atomic: written beside
    `path`, fsynced and renamed over it, so a process killed mid-write leaves the old file (or
    none), never a torn one that a reader (a resume, the chaos soak's checkers) must tolerate."""
    n = 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for t in traces:
                f.write(_ENCODER.encode(t) + b"\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def read_jsonl(path: str | Path) -> Iterator[Trace]:
    """Read traces written by `write_jsonl`, every field type-checked; a bad line raises
    TraceError naming its line number and the field."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield _DECODER.decode(line)
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                raise TraceError(f"{path}:{lineno}: {e}") from None
