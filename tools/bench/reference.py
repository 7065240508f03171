"""What the benches measure against, imported by them as `from tools.bench.reference import ...`:

- `bench_vllm`: vLLM alone (tools/bench/rollout_path.py, bf16.py). It generates in this process,
  every prompt submitted at once, with the engine args, sampling and engine core (`engine.core`:
  vLLM's AsyncLLM, or its LLMEngine on a thread) the Engine actor uses, so the difference to the
  rollout path is the path's own cost.
- `PlainLoop`, `memcpy_s`, `conversation_trace`, `batches_for` (tools/bench/learner.py, bf16.py,
  e2e.py): a plain single-process torch loop, a plain memory copy (a weight sync's floor), and
  synthetic multi-turn conversations packed the way the learner packs them."""

from __future__ import annotations

import asyncio
import gc
import random
import time
import uuid

import numpy as np
import torch

from rollout.agents.chat_format import ChatFormat
from rollout.config import EngineConfig, SamplingConfig
from rollout.engine.args import _vllm_env, bind_cpu_cores, core_kind, eager_sampler_on_cpu, engine_args, sampling_params
from rollout.trace import Sequence, Trace
from trainer.config import LossConfig
from trainer.losses import microbatch_loss
from trainer.packing import build_rows, pack, token_weights


def conversation_trace(
    fmt: ChatFormat,
    vocab: int,
    turns: int,
    gen: int,
    obs: int,
    rng: random.Random,
    tid: str,
    question: str = "Solve the task step by step.",
) -> Trace:
    """One agent's multi-turn conversation: `turns` sequences, each extending the last exactly
    (`gen` random generated tokens, then `obs` random observation tokens)."""
    prompt = fmt.render([{"role": "user", "content": question}])
    seqs = []
    for k in range(turns):
        completion = [rng.randrange(10, vocab) for _ in range(gen)]
        seqs.append(Sequence(prompt, completion, [-1.0] * gen, "solver", "main", 0, parent=k - 1 if k else None))
        prompt = prompt + completion + [rng.randrange(10, vocab) for _ in range(obs)]
    return Trace(tid, "g", seqs, reward=1.0)


def batches_for(traces: list[Trace], merge: bool, budget: int):
    """(rows, micro-batches of `budget` padded tokens) of `traces`, every sequence's advantage 0.5."""
    advs = [[0.5] * len(t.sequences) for t in traces]
    rows = build_rows(traces, advs, token_weights(traces, "token"), merge=merge)
    return rows, pack(rows, budget)


class PlainLoop:
    """A single-process torch forward + backward + AdamW loop: what the learner is measured against."""

    def __init__(self, path: str, threads: int):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-6)

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def step(self, mbs, only_trained: bool = True) -> float:
        """Seconds of one optimizer step over `mbs`, timed inside this process."""
        t0 = time.perf_counter()
        for mb in mbs:
            microbatch_loss(self.model, mb, LossConfig(), only_trained=only_trained)[0].backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def memcpy_s(nbytes: int, rounds: int = 3) -> float:
    """Seconds of a plain in-memory copy of `nbytes` (best of `rounds`): a weight sync's floor."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    copies = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        src.copy()
        copies.append(time.perf_counter() - t0)
    return min(copies)


def bench_vllm(
    model_path: str,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    engine: EngineConfig,
    rounds: int,
    dtype: str = "float32",
) -> list[dict]:
    """After a warm-up on 4 prompts, `rounds` times: {"tokens": generated, "seconds": wall} of
    every prompt at once."""
    _vllm_env(engine.vllm_log_level)  # the engines' quiet start
    eager_sampler_on_cpu(engine)  # as the engines run it
    bind_cpu_cores(engine)  # the cores the fleets' engines take (engine.cpu_cores)
    args = engine_args(model_path, engine, dtype)
    if core_kind(engine) == "thread":
        from rollout.engine.thread import ThreadedLLM

        llm = ThreadedLLM(args, start_timeout_s=engine.start_timeout_s)
    else:
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(args)
    params = sampling_params(sampling)

    async def one(ids: list[int]) -> int:
        final = None
        async for out in llm.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex):
            final = out
        return sum(len(o.token_ids) for o in final.outputs)

    async def timed(batch):
        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*map(one, batch)))
        return {"tokens": tokens, "seconds": time.perf_counter() - t0}

    async def rounds_of_all():
        await timed(prompts[:4])  # warm-up
        return [await timed(prompts) for _ in range(rounds)]

    try:
        return asyncio.run(rounds_of_all())
    finally:
        llm.shutdown()
        llm = None  # let __del__ run now, not at interpreter exit where it raises
        gc.collect()
