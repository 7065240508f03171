"""The agent API harness code calls: `await agent.chat(...)` and token-exact `Conversation`s.

Every model call goes through an `Agent`, which records it as a `Sequence` of
the current trace (role, policy, weight version, behaviour log-probs), so a
harness author never builds sequences by hand:

    solver = agents["solver"].conversation(system="Solve it.")
    draft = await solver.reply(task.prompt)            # user turn + model turn
    critique = await agents["verifier"].chat(f"Check this: {draft}")
    final = await solver.reply(f"A reviewer wrote: {critique}")

A `Conversation` keeps token ids across turns: the next prompt is the previous
prompt + the generated ids + the new turns' ids. Generated text is never
re-tokenized, so each later prompt extends the earlier sequence exactly and
the trainer can merge them into one training row.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from harnesses.base import Gateway
from rollout.agents.chat_format import ChatFormat, Message
from rollout.config import SamplingConfig
from rollout.engine.engine import Completion
from rollout.trace import Sequence

log = logging.getLogger(__name__)


class Backend(Protocol):
    """Where an agent's requests go (the router over a policy's engines)."""

    async def generate(
        self, key: str, prompt_ids: list[int], sampling: SamplingConfig, seed: int | None = None
    ) -> list[Completion]: ...


class TraceRecorder:
    """Collects the sequences of one harness run, in call order: a call takes its place when it
    starts (`reserve`) and its sequence fills it when the engine answers, so concurrent calls
    (parallel sub-agents, a gateway's agents) are recorded in the order the harness made them, not
    in the order they finished (which follows timing: a replay would build other rows)."""

    def __init__(self, trace_id: str):
        self.trace_id = trace_id
        self._slots: list[Sequence | None] = []  # None: a call in flight, or one that never answered

    def reserve(self) -> int:
        """A place for a call that starts now; its index is what `record` returns for it."""
        self._slots.append(None)
        return len(self._slots) - 1

    def record(self, seq: Sequence, slot: int | None = None) -> int:
        """Put `seq` in its call's place (`slot` from `reserve`; None: a new place at the end)."""
        slot = self.reserve() if slot is None else slot
        self._slots[slot] = seq
        return slot

    @property
    def sequences(self) -> list[Sequence]:
        """The recorded sequences in call order; the places of calls that never answered are left
        out, and each `parent` renumbered to match."""
        if all(s is not None for s in self._slots):
            return list(self._slots)
        index = {old: new for new, old in enumerate(i for i, s in enumerate(self._slots) if s is not None)}
        return [
            s if s.parent is None else msgspec.structs.replace(s, parent=index.get(s.parent))
            for s in self._slots
            if s is not None
        ]


async def _no_gateway() -> Gateway:
    raise RuntimeError(
        "this Agent was made without a gateway: the rollout worker hands its agents one "
        "(Agent(..., gateway=Gateway.shared), rollout/gateway/server.py)"
    )


class Agent:
    """One harness role bound to one policy. Every call is recorded in the trace."""

    def __init__(
        self,
        role: str,
        policy: str,
        backend: Backend,
        chat_format: ChatFormat,
        recorder: TraceRecorder,
        sampling: SamplingConfig,
        seed: int | None = None,
        trainable: bool = True,
        max_model_len: int | None = None,
        gateway: Callable[[], Awaitable[Gateway]] | None = None,
    ):
        """`seed`: if set, every call samples with a seed derived from it, the trace id,
        the role and the call's number, so a rollout can be replayed exactly. `trainable`:
        whether `policy` is trained (recorded on every sequence). `max_model_len`: the policy's
        context (model.max_model_len), which the gateway clamps an agent's max_tokens to (None:
        no clamp). `gateway`: the factory of the process's OpenAI-compatible endpoint, for
        harnesses that run agents written against other APIs (harnesses/programs/openai_agent.py); the
        rollout worker hands it in (rollout/gateway/server.py's `Gateway.shared`), so that harnesses
        never import rollout/ and this module never imports the gateway. None: calling it says so."""
        self.role = role
        self.policy = policy
        self.trainable = trainable
        self.max_model_len = max_model_len
        self.gateway = gateway or _no_gateway
        self.format = chat_format
        self._backend = backend
        self._recorder = recorder
        self._sampling = sampling
        self._seed = seed
        self._calls = 0

    @property
    def sampling(self) -> SamplingConfig:
        """The run's sampling settings this agent's calls start from."""
        return self._sampling

    def _call_seed(self) -> int | None:
        self._calls += 1
        if self._seed is None:
            return None
        return zlib.crc32(f"{self._seed}:{self._recorder.trace_id}:{self.role}:{self._calls}".encode())

    async def generate(self, prompt_ids: list[int], parent: int | None = None, **sampling) -> tuple[Completion, int]:
        """Low level: one completion of raw prompt ids; returns it and its sequence index."""
        params = dataclasses.replace(self._sampling, n=1, **sampling)
        seed, slot = self._call_seed(), self._recorder.reserve()  # both in call order
        [c] = await self._backend.generate(self._recorder.trace_id, prompt_ids, params, seed)
        index = self._recorder.record(
            Sequence(
                prompt_ids=prompt_ids,
                completion_ids=c.completion_ids,
                logprobs=c.logprobs,
                agent=self.role,
                policy=self.policy,
                version=c.version,
                trainable=self.trainable,
                finish_reason=c.finish_reason,
                parent=parent,
                temperature=params.temperature,
            ),
            slot,
        )
        return c, index

    async def chat(self, messages: str | list[Message], system: str | None = None, **sampling) -> str:
        """One stateless model call on a fresh context; returns the generated text."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        c, _ = await self.generate(self.format.render(messages), **sampling)
        return self.format.decode(c.completion_ids)

    def conversation(self, system: str | None = None) -> Conversation:
        return Conversation(self, system)


class Conversation:
    """A multi-turn context kept as token ids; each reply extends the previous sequence exactly."""

    def __init__(self, agent: Agent, system: str | None = None):
        self.agent = agent
        self.messages: list[Message] = []  # text view of the whole conversation
        self._ids: list[int] | None = None  # prompt + completion of the last model turn
        self._pending: list[Message] = []  # turns added since the last model turn
        self._last: int | None = None  # sequence index of the last model turn
        if system is not None:
            self.add("system", system)

    def add(self, role: str, content: str) -> None:
        """Append a user / tool / system turn without calling the model."""
        msg = {"role": role, "content": content}
        self.messages.append(msg)
        self._pending.append(msg)

    @property
    def num_tokens(self) -> int:
        """Context length so far: the prompt and completion of the last model turn."""
        return len(self._ids or [])

    def prompt_ids(self, content: str | None = None, role: str = "user") -> list[int]:
        """The ids the next model turn will be generated under (with one more turn, if given)."""
        pending = self._pending + ([{"role": role, "content": content}] if content is not None else [])
        if self._ids is None:
            return self.agent.format.render(pending)
        return self._ids + self.agent.format.continuation(self._ids, pending)

    async def reply(self, content: str | None = None, role: str = "user", **sampling) -> str:
        """Optionally add a turn, then generate the model's next turn; returns its text."""
        if content is not None:
            self.add(role, content)
        prompt = self.prompt_ids()
        c, self._last = await self.agent.generate(prompt, parent=self._last, **sampling)
        self._ids = prompt + c.completion_ids
        self._pending = []
        text = self.agent.format.decode(c.completion_ids)
        self.messages.append({"role": "assistant", "content": text})
        return text
