"""The agent API: token-exact conversations, automatic recording of every call."""

import asyncio

import pytest
import ray
from transformers import AutoTokenizer

from rollout.agents.chat_format import ChatFormat
from rollout.agents.client import Agent, TraceRecorder
from rollout.config import SamplingConfig
from rollout.orchestration.router import Router


def make_agent(engine, tok, role="solver", policy="main", recorder=None, max_tokens=12, trainable=True):
    recorder = recorder or TraceRecorder("trace-0")
    return Agent(
        role,
        policy,
        Router([engine]),
        ChatFormat(tok),
        recorder,
        SamplingConfig(max_tokens=max_tokens),
        trainable=trainable,
    ), recorder


@pytest.mark.integration
def test_conversation_prompts_extend_previous_turns_exactly(engine, tiny_tokenizer):
    agent, rec = make_agent(engine, tiny_tokenizer)

    async def talk():
        conv = agent.conversation(system="Be brief.")
        await conv.reply("What is 2 + 2?")
        conv.add("tool", "calculator: 4")
        await conv.reply("Are you sure?")
        await conv.reply("Final answer?", max_tokens=4)
        return conv

    conv = asyncio.run(talk())
    seqs = rec.sequences
    assert len(seqs) == 3
    for earlier, later in zip(seqs, seqs[1:]):
        head = earlier.prompt_ids + earlier.completion_ids
        assert later.prompt_ids[: len(head)] == head
        assert len(later.prompt_ids) > len(head)  # the new turns were appended as tokens
    assert [s.parent for s in seqs] == [None, 0, 1]
    assert len(seqs[2].completion_ids) <= 4
    # the appended turns are exactly what the chat template renders for them
    tail = seqs[1].prompt_ids[len(seqs[0].prompt_ids) + len(seqs[0].completion_ids) :]
    text = tiny_tokenizer.decode(tail)
    assert "<|im_start|>tool\ncalculator: 4<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert [m["role"] for m in conv.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


@pytest.mark.integration
def test_every_call_is_recorded_with_role_policy_version(engine, tiny_tokenizer):
    rec = TraceRecorder("trace-1")
    solver, _ = make_agent(engine, tiny_tokenizer, "solver", "main", rec)
    judge, _ = make_agent(engine, tiny_tokenizer, "judge", "frozen", rec, trainable=False)

    async def run():
        a = await solver.chat("hello")
        b = await judge.chat([{"role": "user", "content": "judge this"}], system="You judge.")
        return a, b

    a, b = asyncio.run(run())
    assert isinstance(a, str) and isinstance(b, str)
    assert [(s.agent, s.policy, s.trainable) for s in rec.sequences] == [
        ("solver", "main", True),
        ("judge", "frozen", False),
    ]
    version = ray.get(engine.info.remote())["version"]  # the shared engine's weights: no sync meanwhile
    assert all(s.version == version and len(s.logprobs) == len(s.completion_ids) for s in rec.sequences)
    assert tiny_tokenizer.decode(rec.sequences[1].prompt_ids).startswith("<|im_start|>system\nYou judge.")


@pytest.mark.integration
def test_concurrent_calls_are_recorded_in_the_order_they_were_made(engine, tiny_tokenizer):
    """Two calls of one trace at once, the first long and the second short (it finishes first): the
    trace holds them in call order, so a replay builds the same rows whatever the timing (before,
    completion order). A conversation's turn started after them keeps its parent; a call that fails
    leaves no gap, and the parents after it are renumbered."""
    rec = TraceRecorder("order")
    agent, _ = make_agent(engine, tiny_tokenizer, recorder=rec)

    class Failing:
        async def generate(self, *args):
            await asyncio.sleep(0.05)
            raise RuntimeError("this call never answers")

    broken = Agent("solver", "main", Failing(), ChatFormat(tiny_tokenizer), rec, SamplingConfig(max_tokens=4))

    async def run():
        conv = agent.conversation()
        await conv.reply("Count to ten.", max_tokens=3)
        long = agent.chat("Write a long story.", max_tokens=48, ignore_eos=True)
        short = agent.chat("Say hi.", max_tokens=2, ignore_eos=True)
        failed = broken.chat("Lost.")
        done = await asyncio.gather(long, short, failed, return_exceptions=True)
        await conv.reply("Go on.", max_tokens=3)
        return done

    done = asyncio.run(run())
    assert isinstance(done[2], RuntimeError)
    seqs = rec.sequences
    assert [len(s.completion_ids) for s in seqs[1:3]] == [48, 2], "call order, not finishing order"
    assert len(seqs) == 4 and [s.parent for s in seqs] == [None, None, None, 0]


@pytest.mark.unit
@pytest.mark.parametrize("model", ["tiny", "smollm2_135m"])
def test_token_conversation_equals_template_rendering(model):
    """If each completion is the tokenized assistant text + end token, the token-built
    prompts equal the chat template's rendering of the whole conversation."""
    from rollout.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(model))
    fmt = ChatFormat(tok)
    msgs = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "2+2?"}]
    ids = fmt.render(msgs)
    for reply, nxt in [
        ("It is 4.", {"role": "user", "content": "Sure?"}),
        ("Yes, 4.", {"role": "tool", "content": "ok"}),
    ]:
        completion = fmt.encode(reply) + [tok.convert_tokens_to_ids("<|im_end|>")]
        msgs += [{"role": "assistant", "content": reply}, nxt]
        ids = ids + completion + fmt.continuation(ids + completion, [nxt])
        assert ids == fmt.render(msgs)
    # a turn cut by max_tokens (no end token) gets the template's close appended
    cut = fmt.encode("It is")
    closed = fmt.continuation(cut, [{"role": "user", "content": "go on"}])
    assert tok.decode(closed).startswith("<|im_end|>")


@pytest.mark.unit
@pytest.mark.parametrize("model", ["tiny", "smollm2_135m"])
def test_a_tokenizer_loaded_by_its_class_name_is_autotokenizers_and_imports_no_torch(model):
    """A rollout worker loads its model's tokenizer by the class name the engine reports
    (rollout/models.py tokenizer_class): the same tokens as AutoTokenizer's, with special-token
    text, unicode and a tool turn, and in a process of its own without importing torch (what the
    name saves: AutoTokenizer's config machinery imports it)."""
    import subprocess
    import sys

    from rollout.models import resolve_model, tokenizer_class

    path = resolve_model(model)
    name = tokenizer_class(path)
    auto, named = ChatFormat.from_pretrained(path), ChatFormat.from_pretrained(path, name)
    assert type(named.tok) is type(auto.tok) and named.tok.all_special_ids == auto.tok.all_special_ids
    text = "Ünïcode  spaces\t\nand <|im_end|> 12345 + 0.5 = ?\r\n\u00a0über 🙂 'll 've"
    msgs = [
        {"role": "system", "content": "Solve it. <|im_start|>user"},
        {"role": "user", "content": text},
        {"role": "assistant", "content": "It is 4.<|endoftext|>"},
        {"role": "tool", "content": "ok"},
    ]
    assert named.encode(text) == auto.encode(text) and named.render(msgs) == auto.render(msgs)
    assert named.continuation(auto.encode("It is"), msgs[3:]) == auto.continuation(auto.encode("It is"), msgs[3:])
    assert named.decode(auto.render(msgs)) == auto.decode(auto.render(msgs)) and named.pad_id == auto.pad_id
    probe = (
        "import sys; from rollout.agents.client import ChatFormat; "
        f"f = ChatFormat.from_pretrained({path!r}, {name!r}); "
        "print(type(f.tok).__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [name, "False"], out.stdout + out.stderr
