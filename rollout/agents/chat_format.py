"""How a policy's chat template becomes token ids: `ChatFormat` renders messages with the model's
template, continues a conversation's ids with only the new turns' tokens (never re-tokenizing
generated text), and keeps text that spells a special token as text (`_TextOnly`). Used by
`Conversation` (rollout/agents/client.py), the gateway's prompts (rollout/gateway/prompts.py) and the
trainer's eval and bench code."""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable

import tokenizers

Message = dict[str, str]  # {"role": ..., "content": ...}
log = logging.getLogger(__name__)
_MARK = "TRACERL_TURN_MARK"  # placeholder assistant text used to cut template tails
_HIDE = "\ue000"  # brackets the markers that stand in for text spelling a special token while a template renders
# The continuation cache (keyed on the new turns' text: tool results vary): tails of new turns longer
# than this are not cached (a 1 MiB tool result would cost ~30 MiB of key and ids), and it holds at most
# this many bytes of keys and ids, shared by every conversation and gateway session of the process.
_TAIL_CACHE_MAX_CHARS = 4096
_TAILS_MAX_BYTES = 16 * 2**20
_SLOW_TOKENIZER_LOCK = threading.Lock()


class ChatFormat:
    """A tokenizer's chat template, rendered to token ids the way conversations need.

    Message text is text (DESIGN invariant 8): a message (or tool definition) that spells a special
    token, such as `<|im_end|>`, is encoded as the ordinary tokens that spell it, so one agent's
    output cannot forge turns in another's prompt; only the template's own frame yields control
    ids. Such text is hidden behind markers while the template renders, and the frame's special
    tokens are the ones left in the rendered text (`_encode_framed`). Thread-safe: the gateway
    renders off its event loop.
    """

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template; "
                "use a chat/instruct model or set one on the tokenizer"
            )
        self.tok = tokenizer
        self.vocab_size = len(tokenizer)
        self._special = set(tokenizer.all_special_ids)
        self._text_only = _TextOnly(tokenizer)
        self._nonce = secrets.token_hex(6)  # markers no model text can guess
        self._tails: OrderedDict[tuple[str, str], array] = OrderedDict()  # least recently used first
        self._tails_bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, path: str, tokenizer_class: str | None = None) -> ChatFormat:
        """`tokenizer_class`: the class AutoTokenizer picks for `path` (rollout/models.py's
        `tokenizer_class`; an engine's info gives it). Loaded by name, the tokenizer skips AutoTokenizer's config
        machinery, which imports torch: ~4 CPU-s in a process that needs neither (a rollout worker)."""
        import transformers

        return cls(getattr(transformers, tokenizer_class or "AutoTokenizer").from_pretrained(path))

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
        """Ids of trusted text (a template's frame, a harness's constant): special-token strings in
        it become control ids. Model, tool and file text goes through `render`/`continuation`."""
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def render(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a fresh prompt: the messages (and `tools`, for a template that renders
        them) plus the assistant generation header."""
        return self._encode_framed(messages, tools)

    def continuation(self, last_ids: list[int], messages: list[Message]) -> list[int]:
        """Ids that follow a generated assistant turn ending in `last_ids[-1]`:
        the template's close of that turn, then `messages`, then a new assistant header.

        Found by rendering a conversation whose assistant turn is a marker and
        cutting after the marker, so it works for any template that renders the
        assistant content verbatim. If the model already emitted the turn's end
        (a special token such as its EOS), that token's text is not repeated.
        Short tails are cached (bounded in bytes: every gateway tool result is a new key).
        """
        ended = bool(last_ids) and last_ids[-1] in self._special
        end = self.tok.decode(last_ids[-1:]) if ended else ""
        key = (end, json.dumps(messages, sort_keys=True))
        with self._lock:
            if key in self._tails:
                self._tails.move_to_end(key)
                return self._tails[key].tolist()
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
        ids = self._encode_framed(base + list(messages), None, cut_after=_MARK, drop_prefix=end)
        if len(key[1]) <= _TAIL_CACHE_MAX_CHARS:
            self._remember(key, array("i", ids))
        return ids

    def _remember(self, key: tuple[str, str], ids: array) -> None:
        size = len(key[0]) + len(key[1]) + ids.itemsize * len(ids)
        with self._lock:
            if key in self._tails:
                return
            self._tails[key] = ids
            self._tails_bytes += size
            while self._tails_bytes > _TAILS_MAX_BYTES:
                (end, text), old = self._tails.popitem(last=False)
                self._tails_bytes -= len(end) + len(text) + old.itemsize * len(old)

    def _encode_framed(
        self, messages: list[Message], tools: list[dict] | None, cut_after: str | None = None, drop_prefix: str = ""
    ) -> list[int]:
        """Render `messages` (+ `tools`) with a generation header and encode it; with `cut_after`,
        only the text after that marker, less `drop_prefix` where it starts with it.

        Strings that spell a special token are swapped for markers while the template renders;
        the special tokens left in the rendering are the frame's (control ids), and the pieces
        between them are encoded with the markers' text put back, special-token strings as text.
        Between two frame tokens this is the tokenizer's own split, so a prompt whose text spells
        no special token gets exactly the ids it always got."""
        hidden: dict[str, str] = {}
        framed_messages, framed_tools = self._hide(messages, hidden), self._hide(tools, hidden)
        text = self._text(framed_messages, add_generation_prompt=True, tools=framed_tools)
        if hidden and (
            not self._text_only.exact
            or _unhide(text, hidden) != self._text(messages, add_generation_prompt=True, tools=tools)
        ):
            # The template transforms such text (trims it, escapes it as JSON, branches on it): it
            # cannot be put back verbatim, so its special-token strings are broken instead.
            _warn_once(self.tok.name_or_path)
            text = self._text(self._hide(messages, None), add_generation_prompt=True, tools=self._hide(tools, None))
            hidden = {}
        if cut_after is not None:
            text = text[text.index(cut_after) + len(cut_after) :]
            if drop_prefix and text.startswith(drop_prefix):
                text = text[len(drop_prefix) :]
        if not hidden:
            return self.encode(text)  # the only special-token strings are the frame's
        return self._text_only.encode_frame(text, lambda piece: _unhide(piece, hidden))

    def _hide(self, value, hidden: dict[str, str] | None):
        """`value` (messages, tools: nested lists and dicts) with each string that spells a special
        token replaced by a fresh marker, remembered in `hidden`; `hidden` None: the strings'
        special-token spellings broken with a word joiner instead (the fallback)."""
        if isinstance(value, str):
            if not self._text_only.spells_special(value):
                return value
            if hidden is None:
                return self._text_only.break_specials(value)
            marker = f"{_HIDE}{self._nonce}:{len(hidden)}{_HIDE}"
            hidden[marker] = value
            return marker
        if isinstance(value, dict):
            return {k: self._hide(v, hidden) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._hide(v, hidden) for v in value]
        return value


class _TextOnly:
    """A tokenizer's special tokens, and an encoder for which their strings are ordinary text."""

    def __init__(self, tokenizer):
        special = {t.content: (i, t) for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self.ids = {content: i for content, (i, _) in special.items()}
        # what text must never encode to (the unknown token is what a text-only encoding may give)
        self.special_ids = frozenset(self.ids.values()) - {tokenizer.unk_token_id}
        self.lstrip = {content for content, (_, t) in special.items() if t.lstrip}
        self.rstrip = {content for content, (_, t) in special.items() if t.rstrip}
        # longest first: a special token that is a prefix of another never cuts it
        self.pattern = re.compile("|".join(re.escape(s) for s in sorted(special, key=len, reverse=True)) or "(?!)")
        self.tok = tokenizer
        backend = getattr(tokenizer, "_tokenizer", None)
        self.backend = None
        self.normalizer = None
        if backend is not None:
            # A copy of the Rust tokenizer that never matches special tokens. Not the tokenizer's own
            # `split_special_tokens=True`: that flips a flag on the shared backend per call, a race
            # between threads.
            self.backend = tokenizers.Tokenizer.from_str(backend.to_str())
            self.backend.no_padding()
            self.backend.no_truncation()
            self.backend.encode_special_tokens = True
            if any(t.normalized for _, t in special.values()):
                self.normalizer = backend.normalizer  # such a token matches the normalized text
        self.exact = self._splits_like_the_tokenizer()

    def spells_special(self, text: str) -> bool:
        if self.pattern.search(text):
            return True
        return self.normalizer is not None and self.pattern.search(self.normalizer.normalize_str(text)) is not None

    def break_specials(self, text: str) -> str:
        """`text` with a word joiner (U+2060) after the first character of each special-token string."""
        if self.normalizer is not None:
            text = self.normalizer.normalize_str(text)
        return self.pattern.sub(lambda m: m[0][0] + "\u2060" + m[0][1:], text)

    def encode(self, text: str) -> list[int]:
        """Ids of `text` with every special-token string in it encoded as text."""
        ids = self._encode(text)
        if not self.special_ids.isdisjoint(ids):
            # The model's own vocabulary spells the string as its special piece (a Unigram model can):
            # then the string is broken first.
            ids = self._encode(self.break_specials(text))
        assert self.special_ids.isdisjoint(ids), f"text encodes to a special token of {self.tok.name_or_path}"
        return ids

    def _encode(self, text: str) -> list[int]:
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        with _SLOW_TOKENIZER_LOCK:  # a slow tokenizer's flag is per call too
            return self.tok.encode(text, add_special_tokens=False, split_special_tokens=True)

    def encode_frame(self, text: str, put_back: Callable[[str], str]) -> list[int]:
        """Ids of `text`, whose special-token strings are all frame (control ids); the pieces between
        them go through `put_back` and are encoded as text, as the tokenizer splits them."""
        ids: list[int] = []
        pos, before = 0, None
        for match in [*self.pattern.finditer(text), None]:
            piece = text[pos : match.start() if match else len(text)]
            if before in self.rstrip:
                piece = piece.lstrip()
            if match is not None and match[0] in self.lstrip:
                piece = piece.rstrip()
            if piece:
                ids += self.encode(put_back(piece))
            if match is not None:
                ids.append(self.ids[match[0]])
                pos, before = match.end(), match[0]
        return ids

    def _splits_like_the_tokenizer(self) -> bool:
        """Whether encoding the pieces between special tokens one by one gives the tokenizer's own
        ids (true of byte-level BPE: Qwen, Llama 3, SmolLM; not of a tokenizer that prefixes a space
        to its first piece only, as SentencePiece's Metaspace does)."""
        probe = "".join(f"{s} Hello, x = 3 .\n\n" for s in list(self.ids)[:4]) + " 12 ab"
        return self.encode_frame(probe, lambda piece: piece) == self.tok.encode(probe, add_special_tokens=False)


def _unhide(text: str, hidden: dict[str, str]) -> str:
    """`text` with each marker of `hidden` replaced by the string it stands for (one pass)."""
    if not hidden:
        return text
    return re.sub("|".join(map(re.escape, hidden)), lambda m: hidden[m[0]], text)


_warned: set[str] = set()


def _warn_once(name: str) -> None:
    if name not in _warned:
        _warned.add(name)
        log.warning(
            "the chat template of %s does not render message text verbatim (or its tokenizer does not split "
            "at special tokens like byte-level BPE): text that spells a special token is encoded with a word "
            "joiner (U+2060) after its first character, so it stays text but is not the exact text sent",
            name,
        )
