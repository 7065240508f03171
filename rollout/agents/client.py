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
import json
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

from rollout.agents.gateway import Gateway
from rollout.config import SamplingConfig
from rollout.engine.engine import Completion
from rollout.trace import Sequence

Message = dict[str, str]  # {"role": ..., "content": ...}
_MARK = "TRACERL_TURN_MARK"  # placeholder assistant text used to cut template tails
_TAILS_MAX = 4096  # continuations cached per ChatFormat (keyed on the new turns' text: tool results vary)


class Backend(Protocol):
    """Where an agent's requests go (the router over a policy's engines)."""

    async def generate(
        self, key: str, prompt_ids: list[int], sampling: SamplingConfig, seed: int | None = None
    ) -> list[Completion]: ...


class ChatFormat:
    """A tokenizer's chat template, rendered to token ids the way conversations need."""

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template; "
                "use a chat/instruct model or set one on the tokenizer"
            )
        self.tok = tokenizer
        self.vocab_size = len(tokenizer)
        self._special = set(tokenizer.all_special_ids)
        self._tails: OrderedDict[tuple, list[int]] = OrderedDict()  # least recently used first

    @classmethod
    def from_pretrained(cls, path: str) -> ChatFormat:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    @property
    def pad_id(self) -> int:
        """The id that pads training rows (the tokenizer's pad token, else its EOS)."""
        return self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders tool definitions and tool calls itself."""
        return "tools" in self.tok.chat_template and "tool_calls" in self.tok.chat_template

    def _text(self, messages: list[Message], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tok.apply_chat_template(
            messages, tokenize=False, tools=tools, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def render(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a fresh prompt: the messages (and `tools`, for a template that renders
        them) plus the assistant generation header."""
        return self.encode(self._text(messages, add_generation_prompt=True, tools=tools))

    def continuation(self, last_ids: list[int], messages: list[Message]) -> list[int]:
        """Ids that follow a generated assistant turn ending in `last_ids[-1]`:
        the template's close of that turn, then `messages`, then a new assistant header.

        Found by rendering a conversation whose assistant turn is a marker and
        cutting after the marker, so it works for any template that renders the
        assistant content verbatim. If the model already emitted the turn's end
        (a special token such as its EOS), that token's text is not repeated.
        """
        ended = bool(last_ids) and last_ids[-1] in self._special
        end = self.tok.decode(last_ids[-1:]) if ended else ""
        key = (end, json.dumps(messages, sort_keys=True))
        if key in self._tails:
            self._tails.move_to_end(key)
            return list(self._tails[key])
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
        text = self._text(base + list(messages), add_generation_prompt=True)
        tail = text[text.index(_MARK) + len(_MARK) :]
        if end and tail.startswith(end):
            tail = tail[len(end) :]
        self._tails[key] = self.encode(tail)
        if len(self._tails) > _TAILS_MAX:  # bounded: every gateway tool result is a new key
            self._tails.popitem(last=False)
        return list(self._tails[key])


class TraceRecorder:
    """Collects the sequences of one harness run, in call order."""

    def __init__(self, trace_id: str):
        self.trace_id = trace_id
        self.sequences: list[Sequence] = []

    def record(self, seq: Sequence) -> int:
        self.sequences.append(seq)
        return len(self.sequences) - 1


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
        gateway: Callable[[], Awaitable[Gateway]] = Gateway.shared,
    ):
        """`seed`: if set, every call samples with a seed derived from it, the trace id,
        the role and the call's number, so a rollout can be replayed exactly. `trainable`:
        whether `policy` is trained (recorded on every sequence). `max_model_len`: the policy's
        context (model.max_model_len), which the gateway clamps an agent's max_tokens to (None:
        no clamp). `gateway`: the factory of the process's OpenAI-compatible endpoint, for
        harnesses that run agents written against other APIs (harnesses/openai_agent.py); the
        rollout worker hands it in, so that harnesses never import rollout/."""
        self.role = role
        self.policy = policy
        self.trainable = trainable
        self.max_model_len = max_model_len
        self.gateway = gateway
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
        [c] = await self._backend.generate(self._recorder.trace_id, prompt_ids, params, self._call_seed())
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
            )
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
