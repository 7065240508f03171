"""Benchmark vLLM's CPU LoRA path: vLLM's own ops vs tracerl's grouped ops (rollout/engine/lora_ops.py).

    python -m tools.bench.lora_ops [--model smollm2_135m] [--prompts 32] [--max-tokens 64] [--rank 16] [--quick]

One engine (this process's AsyncLLM, the engine args training uses) with two random rank-16
adapters on the attention and MLP projections, once per variant (TRACERL_LORA_CPU_OPS=vllm, then
grouped), same prompts. Per variant, greedy decoding of `--max-tokens` tokens (EOS ignored) for
four batches: every request on the base model, every one on adapter a, half a and half b, half
base and half a. Reported: generated tokens/s of each batch, and how many base requests of the
base+a batch decoded differently from the same requests in the all-base batch (an adapter's
weights leaking into base tokens shows here). `--quick`: the tiny model, 4 prompts of 8 tokens,
tracerl's grouped ops alone (vLLM's are the same run with the other setting; no ratios between
them): the test suite's run. The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import tempfile
import time
import uuid

import torch

from rollout.config import EngineConfig, LoraConfig
from rollout.engine.args import engine_args
from rollout.engine.lora_names import peft_config
from rollout.log import setup_logging
from rollout.models import resolve_model


def random_adapters(model_path: str, lora: LoraConfig, folder: str) -> dict[str, str]:
    """Two PEFT adapter folders on `model_path` with random A and B (PEFT leaves B at zero)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    out = {}
    for seed, name in enumerate(("a", "b"), 1):
        torch.manual_seed(seed)
        model = get_peft_model(copy.deepcopy(base), peft_config(lora, model_path))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
        out[name] = os.path.join(folder, name)
        model.save_pretrained(out[name])
    return out


async def batch(llm, prompts: list[list[int]], loras: list, params) -> tuple[float, list[list[int]]]:
    async def one(prompt, lora):
        final = None
        async for out in llm.generate({"prompt_token_ids": prompt}, params, str(uuid.uuid4()), lora_request=lora):
            final = out
        return list(final.outputs[0].token_ids)

    t0 = time.perf_counter()
    ids = await asyncio.gather(*(one(p, lo) for p, lo in zip(prompts, loras)))
    return time.perf_counter() - t0, ids


def run_variant(
    ops: str, model_path: str, adapters: dict[str, str], lora: LoraConfig, prompts: list[list[int]], max_tokens: int
) -> dict:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ["TRACERL_LORA_CPU_OPS"] = ops  # read in the engine's worker process at start
    llm = AsyncLLM.from_engine_args(
        engine_args(model_path, EngineConfig(kv_cache_gb=1.0), adapters={"a": lora, "b": lora})
    )
    reqs = {n: LoRARequest(n, i + 1, path) for i, (n, path) in enumerate(adapters.items())}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    n, half = len(prompts), len(prompts) // 2
    batches = {
        "base": [None] * n,
        "a": [reqs["a"]] * n,
        "a+b": [reqs["a"]] * half + [reqs["b"]] * (n - half),
        "base+a": [None] * half + [reqs["a"]] * (n - half),
    }

    async def main(llm) -> dict:  # (an argument: the name is deleted below)
        await batch(llm, prompts[:4], [None, reqs["a"], reqs["b"], None], params)  # warm up, adapters loaded
        out, ids = {}, {}
        for name, loras in batches.items():
            seconds, ids[name] = await batch(llm, prompts, loras, params)
            out[f"{name}_tokens_per_s"] = round(n * max_tokens / seconds, 1)
        out["base_requests_changed_by_batching_with_a"] = sum(
            x != y for x, y in zip(ids["base+a"][:half], ids["base"][:half])
        )
        return out

    try:
        return {"ops": ops, **asyncio.run(main(llm))}
    finally:
        llm.shutdown()
        del llm
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="tiny, 4 prompts x 8 tokens, the grouped ops only")
    args = ap.parse_args()
    if args.quick:
        args.model, args.prompts, args.max_tokens = "tiny", 4, 8
    from transformers import AutoTokenizer

    model_path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(model_path)
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": f"What is {i} + {2 * i + 3}? Explain."}],
                add_generation_prompt=True,
                tokenize=False,
            ),
            add_special_tokens=False,
        )
        for i in range(args.prompts)
    ]
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as folder:
        adapters = random_adapters(model_path, lora, folder)
        results = {
            ops: run_variant(ops, model_path, adapters, lora, prompts, args.max_tokens)
            for ops in (("grouped",) if args.quick else ("vllm", "grouped"))
        }
    for r in results.values():
        print(r, flush=True)
    g = results["grouped"]
    vs_vllm = {}
    if "vllm" in results:
        v = results["vllm"]
        vs_vllm = {
            "a_speedup": round(g["a_tokens_per_s"] / v["a_tokens_per_s"], 3),
            "a_vs_base_vllm": round(v["a_tokens_per_s"] / v["base_tokens_per_s"], 3),
        }
    print(
        json.dumps(
            {
                "bench": "lora_ops",
                "quick": args.quick,
                "model": args.model,
                "prompts": args.prompts,
                "max_tokens": args.max_tokens,
                "rank": args.rank,
                **results,
                "a_vs_base_grouped": round(g["a_tokens_per_s"] / g["base_tokens_per_s"], 3),
                **vs_vllm,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
