"""The Engine actor against an HF fp32 forward of the same weights (real vLLM CPU build)."""

import os

import pytest
import ray
import torch
from safetensors.torch import save

from rollout.config import ModelConfig, SamplingConfig
from rollout.orchestration.cluster import spawn_engines, spawn_stores
from tests import lane
from tests.conftest import chat_prompt, hf_logprobs


def perturbed(model, scale=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: (v + scale * torch.randn(v.shape, generator=g)).detach() for k, v in model.named_parameters()}


@pytest.mark.integration
def test_sampled_logprobs_match_hf(engine, tiny_tokenizer, hf_tiny):
    prompt = chat_prompt(tiny_tokenizer)
    comps = ray.get(engine.generate.remote(prompt, SamplingConfig(n=4, max_tokens=24, temperature=1.0)))
    assert len(comps) == 4
    for c in comps:
        assert len(c.completion_ids) == len(c.logprobs) > 0
        ref = hf_logprobs(hf_tiny, prompt, c.completion_ids)
        diff = (ref - torch.tensor(c.logprobs)).abs().max().item()
        assert diff < 1e-3, diff
    # sampling, not argmax: four samples of 24 tokens from a random model differ
    assert len({tuple(c.completion_ids) for c in comps}) > 1


@pytest.mark.integration
def test_temperature_logprobs_are_of_the_sampled_distribution(engine, tiny_tokenizer, hf_tiny):
    prompt = chat_prompt(tiny_tokenizer)
    [c] = ray.get(engine.generate.remote(prompt, SamplingConfig(max_tokens=16, temperature=0.5)))
    logp = hf_logprobs(hf_tiny, prompt, c.completion_ids, temperature=0.5)
    assert (logp - torch.tensor(c.logprobs)).abs().max().item() < 1e-3


def check_update_weights(engine, model, tok):
    prompt = chat_prompt(tok)
    [c] = ray.get(engine.generate.remote(prompt, SamplingConfig(max_tokens=20)))
    before = torch.tensor(ray.get(engine.score.remote(prompt, c.completion_ids)))
    assert (before - hf_logprobs(model, prompt, c.completion_ids)).abs().max() < 1e-3
    v0 = ray.get(engine.info.remote())["version"]

    original = {k: v.detach().clone() for k, v in model.named_parameters()}
    new = perturbed(model)
    stats = ray.get(engine.update_weights.remote(v0 + 1, [save(new)]))
    assert stats["tensors"] == len(new)
    model.load_state_dict(new, strict=False)
    expected = hf_logprobs(model, prompt, c.completion_ids)
    after = torch.tensor(ray.get(engine.score.remote(prompt, c.completion_ids)))
    assert (after - before).abs().max() > 0.05, "the perturbation must visibly change log-probs"
    assert (after - expected).abs().max() < 1e-3
    assert ray.get(engine.info.remote())["version"] == v0 + 1
    [c2] = ray.get(engine.generate.remote(prompt, SamplingConfig(max_tokens=4)))
    assert c2.version == v0 + 1
    assert (torch.tensor(c2.logprobs) - hf_logprobs(model, prompt, c2.completion_ids)).abs().max() < 1e-3

    # restore: in two buckets, to exercise bucketed loads
    names = sorted(original)
    half = len(names) // 2
    ray.get(
        engine.update_weights.remote(
            v0 + 2, [save({k: original[k] for k in names[:half]}), save({k: original[k] for k in names[half:]})]
        )
    )
    model.load_state_dict(original, strict=False)
    restored = torch.tensor(ray.get(engine.score.remote(prompt, c.completion_ids)))
    assert (restored - before).abs().max() < 1e-4


@pytest.mark.integration
def test_update_weights_in_place(engine, hf_tiny, tiny_tokenizer):
    check_update_weights(engine, hf_tiny, tiny_tokenizer)


@pytest.mark.integration
def test_update_weights_tied_embeddings(tied_engine, tiny_tied_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_tied_path, dtype=torch.float32).eval()
    assert model.config.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(tiny_tied_path)
    check_update_weights(tied_engine, model, tok)  # puts the original weights back


@pytest.mark.integration
def test_the_step_clock_accounts_for_every_token_and_fits_in_the_busy_time(engine, tiny_tokenizer):
    """rollout/engine/clock.py: over 8 concurrent requests the engine's step totals count exactly
    the tokens generated and the prompt tokens prefilled, the decode steps ran batched, and the
    steps' time fits inside the time some request was in flight."""
    import time

    prompts = [chat_prompt(tiny_tokenizer, f"Count to {k}.") for k in range(8)]
    before = ray.get(engine.info.remote())
    comps = ray.get([engine.generate.remote(p, SamplingConfig(max_tokens=12, ignore_eos=True)) for p in prompts])
    generated = sum(len(c.completion_ids) for [c] in comps)
    assert generated == 96
    deadline = time.monotonic() + 10  # the last step's output is recorded just after it is delivered
    while True:
        after = ray.get(engine.info.remote())
        d = {k: after["steps"][k] - before["steps"][k] for k in after["steps"]}
        if d["generated_tokens"] >= generated or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert d["generated_tokens"] == generated
    assert d["prefill_tokens"] + d["cached_prompt_tokens"] == sum(map(len, prompts))
    assert d["decode_steps"] >= 11  # 12 tokens each: one from the prefill, 11 decoded
    assert 1 < d["decode_batch_sum"] / d["decode_steps"] <= 8, "the requests decoded together"
    busy = after["busy_s"] - before["busy_s"]
    assert 0 < d["prefill_s"] and 0 < d["decode_s"] and d["prefill_s"] + d["decode_s"] <= busy + 1e-3, (d, busy)


@pytest.mark.unit
def test_cpu_cores_give_each_engine_its_share_of_the_cores(monkeypatch):
    """engine.cpu_cores -> VLLM_CPU_OMP_THREADS_BIND, read by vLLM's CPU worker when it starts."""
    import os

    from rollout.config import EngineConfig
    from rollout.engine.args import bind_cpu_cores

    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2

    def bound(**kw):
        monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
        bind_cpu_cores(EngineConfig(**kw))
        return os.environ.get("VLLM_CPU_OMP_THREADS_BIND")

    assert bound(cpu_cores="auto") is None  # vLLM's own binding
    assert bound(cpu_cores="all") == ",".join(map(str, cores))
    assert bound(cpu_cores="0/2") == ",".join(map(str, cores[:half]))
    assert bound(cpu_cores="1/2") == ",".join(map(str, cores[half:]))
    assert bound(cpu_cores="all", tensor_parallel_size=2) == "|".join(
        ",".join(map(str, part)) for part in (cores[:half], cores[half : 2 * half])
    )
    assert bound(cpu_cores="0-1") == "0-1"
    assert bound(cpu_cores="all", num_gpus=1) is None  # the CUDA build binds nothing
    with pytest.raises(ValueError, match="cores for tensor_parallel_size=4"):
        bound(cpu_cores=f"0/{len(cores)}", tensor_parallel_size=4)


@pytest.mark.integration
def test_prompt_too_long_is_a_clear_error(engine):
    with pytest.raises(ValueError, match="exceeds model.max_model_len"):
        ray.get(engine.generate.remote([5] * 2040, SamplingConfig(max_tokens=64)))


@pytest.mark.integration
def test_a_request_past_its_deadline_is_aborted_and_named(engine, tiny_tokenizer):
    """engine.request_timeout_s: the router cancels a request that runs past it (vLLM aborts the
    sequence) and raises an error naming the engine; the engine goes on serving."""
    import asyncio
    import time

    from rollout.engine.engine import EngineError
    from rollout.orchestration.router import Router

    prompt = chat_prompt(tiny_tokenizer)
    long = SamplingConfig(max_tokens=1000, ignore_eos=True)
    with pytest.raises(
        EngineError,
        match=r"engine 0 of policy 'main' did not answer a request within "
        r"engine.request_timeout_s=0.2",
    ):
        asyncio.run(Router([engine], "main", timeout_s=0.2).generate("trace-1", prompt, long))
    deadline = time.monotonic() + 10
    while ray.get(engine.info.remote())["active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.get(engine.info.remote())["active"] == 0, "the request was aborted, not left running"
    [c] = asyncio.run(Router([engine], "main").generate("trace-1", prompt, SamplingConfig(max_tokens=4)))
    assert 0 < len(c.completion_ids) <= 4


@pytest.mark.e2e
def test_the_watchdog_tells_a_busy_engine_from_a_hung_one(ray_cluster, tiny_path):
    """The health probe queues behind an engine's requests: with one sequence slot and 40 long
    requests ahead of it, it is not answered within 3 s, but requests finish meanwhile: busy, not
    hung (a hung one, stopped by SIGSTOP, is tests/trainer/test_faults.py's). Idle again: ok."""
    from rollout.config import EngineConfig
    from rollout.orchestration.fleet import probe_engine

    cfg = EngineConfig(num_cpus=0.5, kv_cache_gb=0.25, max_num_seqs=1, max_restarts=0)
    [e] = spawn_engines({"main": (tiny_path, ModelConfig(name="tiny"), cfg)})["main"]
    try:
        flood = [e.generate.remote([5, 6, 7], SamplingConfig(max_tokens=100, ignore_eos=True)) for _ in range(40)]
        ray.wait(flood[:1], timeout=60)  # the first request is being served
        assert probe_engine(e, timeout_s=3.0) == "busy"
        ray.get(flood, timeout=300)
        assert probe_engine(e, timeout_s=60.0) == "ok"
    finally:
        ray.kill(e)


@pytest.mark.e2e
def test_a_killed_engine_core_process_ends_its_actor_and_the_engine_heals():
    """engine.core=process (vLLM's AsyncLLM, the GPU default): its engine-core child process dies
    (the OOM killer, a CUDA fault), not the actor: the next call that meets the dead core ends the
    actor, Ray restarts it, and the router sends the request again to a new process. Run as the
    background lane's job (killed_core_run, a Ray of its own beside the main tests)."""
    r = lane.result("killed_core")
    assert r["cores"] and r["cores_are_children"], "vLLM's engine core runs in a child process of the actor"
    assert r["completion_tokens"] > 0 and r["resent"] == 1, "sent again to the restarted engine"
    assert r["pid_after"] != r["pid"], "a new engine process serves"


LANE_TESTS = {"test_a_killed_engine_core_process_ends_its_actor_and_the_engine_heals": "killed_core"}


def lane_jobs() -> dict[str, lane.Job]:
    code = "from tests.rollout.engine.test_engine import killed_core_run; killed_core_run()"
    return {"killed_core": lane.Job(["-c", code], 600, own_ray=True)}  # Ray restarts the engine in it


def killed_core_run() -> None:
    """The lane's job for the test above: a process-core engine whose core processes are killed,
    then a request through the router; what happened as a JSON line."""
    import asyncio
    import json

    import psutil

    from rollout.config import EngineConfig, RayConfig
    from rollout.models import resolve_model
    from rollout.orchestration.cluster import start_ray
    from rollout.orchestration.router import Router

    start_ray(RayConfig(address="local", num_cpus=4))
    cfg = EngineConfig(num_cpus=0.5, kv_cache_gb=0.25, core="process", max_restarts=1)
    stores = {"main": spawn_stores(["main"])}  # with a store, Ray restarts a dead engine
    [e] = spawn_engines({"main": (resolve_model("tiny"), ModelConfig(name="tiny"), cfg)}, stores=stores)["main"]
    info = ray.get(e.info.remote(), timeout=60)
    cores = [psutil.Process(core) for core in info["core_pids"]]
    found = {"pid": info["pid"], "cores": len(cores), "cores_are_children": all(c.ppid() == info["pid"] for c in cores)}
    for core in cores:
        core.kill()
    psutil.wait_procs(cores, timeout=30)
    router = Router([e], "main", timeout_s=300, restart_timeout_s=300)
    [c] = asyncio.run(router.generate("trace-0", [5, 6, 7], SamplingConfig(max_tokens=4)))
    found |= {"completion_tokens": len(c.completion_ids), "resent": router.resent["trace-0"]}
    found["pid_after"] = ray.get(e.info.remote(), timeout=60)["pid"]
    ray.kill(e)
    ray.shutdown()
    print(json.dumps(found))


@pytest.mark.integration
def test_a_weight_load_in_progress_is_not_a_hang_and_loads_run_one_at_a_time(engine, hf_tiny):
    """A load (sync_pause_mode=wait) waits for the requests in flight, and generation stays paused
    meanwhile, so the health probe goes unanswered: the watchdog's verdict is "loading" (within
    engine.sync_timeout_s), not "hung" (before, it killed the engine mid-load). A second load queues
    behind the first instead of interleaving its pause, load and resume with it. (The requests in
    flight are 32 of 2040 tokens, so they outlast the probe however fast the box; then cancelled.)"""
    import time

    from rollout.orchestration.fleet import probe_engine

    same = save({k: v.detach().clone() for k, v in hf_tiny.named_parameters()})  # only the version changes
    v0 = ray.get(engine.info.remote())["version"]
    long = engine.generate.remote([5, 6, 7], SamplingConfig(n=32, max_tokens=2040, ignore_eos=True))
    deadline = time.monotonic() + 60
    while ray.get(engine.info.remote())["active"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    first = engine.update_weights.remote(v0 + 1, [same])
    # Ray starts an async actor's calls in no promised order: the second is sent once the first
    # holds the load slot (it waits there for the requests in flight)
    while ray.get(engine.info.remote())["loading_s"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = engine.update_weights.remote(v0 + 2, [same])
    while ray.get(engine.info.remote())["loads_waiting"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    info = ray.get(engine.info.remote())
    assert info["loading_s"] is not None and info["loads_waiting"] == 1 and info["active"] == 1, info
    assert probe_engine(engine, timeout_s=1.0, load_timeout_s=600.0) == "loading"
    ray.cancel(long)  # vLLM aborts it: the paused load goes on
    ray.get([first, second], timeout=300)
    info = ray.get(engine.info.remote())
    assert info["version"] == v0 + 2 and info["loading_s"] is None and info["loads_waiting"] == 0


@pytest.mark.unit
def test_engine_args_on_gpu_size_the_kv_cache_and_keep_tensor_parallel_workers_local():
    """engine_args only builds vLLM's AsyncEngineArgs (nothing probes a device), so the GPU settings
    are checked here: TP > 1 runs vLLM's own worker processes ("mp"; left to vLLM, a Ray actor in a
    placement group would get its Ray executor, which asks Ray for GPUs); an explicit kv_cache_gb
    sizes the KV cache on GPU too, null leaves it to gpu_memory_utilization; the CPU-only prefill
    settings stay on CPU."""
    from rollout.config import EngineConfig
    from rollout.engine.args import engine_args

    def args(**kw):
        return engine_args("/models/any", EngineConfig(**kw), dtype="bfloat16", max_model_len=4096)

    tp = args(num_gpus=2, tensor_parallel_size=2, kv_cache_gb=None, gpu_memory_utilization=0.4)
    assert (tp.distributed_executor_backend, tp.tensor_parallel_size) == ("mp", 2)
    assert (tp.gpu_memory_utilization, tp.kv_cache_memory_bytes) == (0.4, None)
    assert tp.enable_chunked_prefill is None and tp.max_num_batched_tokens is None  # vLLM's GPU defaults

    one = args(num_gpus=0.5, kv_cache_gb=3, gpu_memory_utilization=0.3)
    assert one.distributed_executor_backend == "uni"
    assert (one.gpu_memory_utilization, one.kv_cache_memory_bytes) == (0.3, 3 << 30)

    cpu = args(kv_cache_gb=0.5)
    assert (cpu.distributed_executor_backend, cpu.kv_cache_memory_bytes) == ("uni", 1 << 29)
    assert (cpu.enable_chunked_prefill, cpu.max_num_batched_tokens) == (False, 8192)
    assert args(kv_cache_gb=0.5, tensor_parallel_size=2).distributed_executor_backend == "mp"


@pytest.mark.unit
def test_a_kv_cache_left_to_vllm_is_refused_on_cpu_naming_the_key():
    from trainer.checks import validate
    from trainer.config import compose

    with pytest.raises(ValueError, match=r"engine.kv_cache_gb=null .* is for GPU engines: set engine.kv_cache_gb"):
        validate(compose("train", ["engine.kv_cache_gb=null"]))


@pytest.mark.unit
def test_cpu_engines_count_log_prob_ranks_eagerly_with_the_same_counts(monkeypatch):
    """eager_sampler_on_cpu turns Dynamo off in a CPU engine's process (enforce_eager, the default),
    so vLLM's sampler counts each sampled token's rank without building an Inductor kernel on the
    first request; the counts are the compiled kernel's. GPU engines and enforce_eager=false keep it."""
    import torch._dynamo
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    from rollout.config import EngineConfig
    from rollout.engine.args import eager_sampler_on_cpu

    monkeypatch.setattr(torch._dynamo.config, "disable", False)
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "0")
    logprobs = torch.randn(6, 4096).log_softmax(-1)
    sampled = logprobs[:, 11:12].clone()
    compiled = batched_count_greater_than(logprobs, sampled)
    for kept in (EngineConfig(num_gpus=1), EngineConfig(enforce_eager=False)):
        eager_sampler_on_cpu(kept)
        assert torch._dynamo.config.disable is False and os.environ["TORCH_COMPILE_DISABLE"] == "0", kept
    eager_sampler_on_cpu(EngineConfig())
    assert torch._dynamo.config.disable is True and os.environ["TORCH_COMPILE_DISABLE"] == "1"
    eager = batched_count_greater_than(logprobs, sampled)
    assert torch.equal(eager, compiled) and torch.equal(eager, (logprobs >= sampled).sum(-1))
