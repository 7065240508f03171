"""What a vLLM engine is built with: its engine arguments, sampling parameters, process settings
(log level, CPU core binding) and where its engine core runs (`engine.core`). Nothing here starts
an engine; rollout/engine/engine.py does.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

from rollout.config import EngineConfig, LoraConfig, SamplingConfig


def core_kind(cfg: EngineConfig) -> str:
    """Where this engine's vLLM engine core runs (`engine.core`): "thread" or "process"."""
    if cfg.core != "auto":
        return str(cfg.core)
    return "process" if cfg.num_gpus > 0 or cfg.tensor_parallel_size > 1 else "thread"


def _vllm_env(log_level: str = "ERROR") -> None:
    """vLLM's settings for this process, before vLLM is imported in it (a spawned engine core
    inherits them). (Not VLLM_CPU_KVCACHE_SPACE: it overrides kv_cache_memory_bytes with whole GiB.)"""
    level = log_level.upper()
    os.environ["VLLM_LOGGING_LEVEL"] = level
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if logging.getLevelName(level) <= logging.WARNING:
        return
    # Quiet start, as vLLM's level asks: what torch and vLLM warn about on every CPU start (no
    # Triton, NUMA memory binding, deprecated torch names vLLM uses) is not the user's to act on.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # read when torch's C++ library loads
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # engine-core processes (engine.core=process)
    import torch  # noqa: F401 - its logging set-up first, then its level

    logging.getLogger("torch").setLevel(logging.ERROR)


def eager_sampler_on_cpu(cfg: EngineConfig) -> None:
    """On CPU with `engine.enforce_eager` (the default) the one torch.compile left on vLLM's path is
    its sampler's log-prob rank count (vllm/v1/sample/ops/logprobs.py), which Inductor builds on the
    engine's first request: ~1.8 s of every engine start, for a kernel that spares one boolean copy
    of the logits. Dynamo off in this process (and a spawned engine core): the count runs eagerly,
    the same tokens and log-probs (tests/rollout/engine/test_engine.py). GPU engines, and
    `enforce_eager=false` (vLLM compiles the model then), keep torch.compile."""
    if cfg.num_gpus > 0 or not cfg.enforce_eager:
        return
    os.environ["TORCH_COMPILE_DISABLE"] = "1"  # a spawned engine core reads it when torch._dynamo loads
    import torch._dynamo

    torch._dynamo.config.disable = True


def bind_cpu_cores(cfg: EngineConfig) -> None:
    """Tell vLLM's CPU worker(s), before they start, which cores their OpenMP threads take
    (`engine.cpu_cores`); the CUDA build ignores it."""
    if cfg.num_gpus > 0 or cfg.cpu_cores == "auto":
        return
    share = re.fullmatch(r"(\d+)/(\d+)", "0/1" if cfg.cpu_cores == "all" else cfg.cpu_cores)
    if share is None:  # vLLM's own list
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_cores
        return
    i, n = map(int, share.groups())
    cores = sorted(os.sched_getaffinity(0))
    mine = cores[i * len(cores) // n : (i + 1) * len(cores) // n]
    k = cfg.tensor_parallel_size
    if len(mine) < k:
        raise ValueError(
            f"engine.cpu_cores={cfg.cpu_cores}: {len(mine)} of this node's {len(cores)} cores for "
            f"tensor_parallel_size={k}"
        )
    per = len(mine) // k
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
        ",".join(map(str, mine[r * per : (r + 1) * per])) for r in range(k)
    )


def engine_args(
    model_path: str,
    cfg: EngineConfig,
    dtype: str = "float32",
    max_model_len: int = 2048,
    seed: int = 0,
    adapters: dict[str, LoraConfig] | None = None,
):
    """vLLM engine arguments for one engine (built, not started: nothing probes the device); CPU and
    GPU differ only in KV-cache sizing and prefill chunking (`_memory_args`). With `adapters`, LoRA
    slots for all of them at once (none is ever evicted)."""
    _vllm_env(cfg.vllm_log_level)
    from vllm import AsyncEngineArgs

    from rollout.engine.lora_names import vllm_max_rank

    lora = (
        {
            "enable_lora": True,
            "max_loras": len(adapters),
            "max_cpu_loras": len(adapters),
            "max_lora_rank": vllm_max_rank([a.rank for a in adapters.values()]),
        }
        if adapters
        else {}
    )
    return AsyncEngineArgs(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        enforce_eager=cfg.enforce_eager,
        max_num_seqs=cfg.max_num_seqs,
        **({"block_size": cfg.block_size} if cfg.block_size else {}),
        tensor_parallel_size=cfg.tensor_parallel_size,
        # Log-probs of the distribution actually sampled from (after temperature),
        # which is the behaviour policy the learner's importance ratio needs.
        logprobs_mode="processed_logprobs",
        worker_extension_cls="rollout.engine.worker_ext.WeightSyncExtension",
        enable_prefix_caching=cfg.prefix_caching,
        # TP 1: one engine-core process with the worker inside it. TP > 1: one worker process per
        # rank on this actor's own devices; left to itself (None), vLLM 0.32 picks its Ray executor
        # inside a placement group and asks Ray for more GPUs (config/parallel.py, __post_init__).
        distributed_executor_backend="uni" if cfg.tensor_parallel_size == 1 else "mp",
        disable_log_stats=True,
        use_tqdm_on_load=False,  # no progress bar per engine start: the Engine prints one line when ready
        **lora,
        **_memory_args(cfg, max_model_len),
    )


def _memory_args(cfg: EngineConfig, max_model_len: int) -> dict:
    """The KV-cache sizing: on GPU vLLM checks at start that gpu_memory_utilization of the device is
    free, then profiles what is left for the KV cache, unless `kv_cache_gb` sets it (vLLM 0.32
    v1/worker/gpu_worker.py, determine_available_memory; null: profiled). On CPU `kv_cache_gb` sets it."""
    if cfg.num_gpus > 0:
        explicit = {} if cfg.kv_cache_gb is None else {"kv_cache_memory_bytes": int(cfg.kv_cache_gb * 2**30)}
        return {"gpu_memory_utilization": cfg.gpu_memory_utilization, **explicit}
    assert cfg.kv_cache_gb is not None, "engine.kv_cache_gb: a size is needed on CPU (the config check says so)"
    return {
        "kv_cache_memory_bytes": int(cfg.kv_cache_gb * 2**30),
        # A chunked prefill discards its sampled token and rewinds the request's
        # seeded generator, which CPU generators cannot do ("CPU Generator does not
        # use offset"): seeded sampling on CPU needs whole prefills.
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(max_model_len, 8192),
    }


def sampling_params(s: SamplingConfig, seed: int | None = None):
    """vLLM SamplingParams for a SamplingConfig, with per-token behaviour log-probs."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=s.n,
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=s.max_tokens,
        stop=list(s.stop) or None,
        ignore_eos=s.ignore_eos,
        seed=seed,
        logprobs=0,
        detokenize=bool(s.stop),
        # With n > 1 the last streamed output can miss completions (docs/cpu_notes.md).
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
