"""The Engine actor against an HF fp32 forward of the same weights (real vLLM CPU build)."""

import asyncio
import contextlib
import os
import time

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


@pytest.mark.unit
def test_the_core_watch_ends_an_engine_whose_core_died_while_a_call_waits_forever():
    """rollout/engine/core_watch.py::watch_core, the fix of the dead-core hang: vLLM never answers a utility
    call (the first request's task query, a pause, a weight load) whose engine core died, so the engine
    cannot wait for a call to meet the death. Here a call waits on a future nobody completes (the lost
    utility future) and the core is marked dead after it started: the watch calls on_dead within two
    periods, and the call is still waiting (nothing else would have noticed). A stopped watch never fires."""
    from rollout.engine.core_watch import watch_core

    async def scenario() -> tuple[float, bool]:
        core = {"dead": False}
        fired = asyncio.Event()
        lost = asyncio.get_running_loop().create_future()  # the utility future vLLM never completes
        watch = asyncio.create_task(watch_core(lambda: core["dead"], fired.set, lambda: False, 0.05))
        call = asyncio.create_task(asyncio.wait_for(lost, 30))
        await asyncio.sleep(0.12)  # the call is waiting; the watch has looked a few times
        assert not fired.is_set()
        core["dead"] = True
        t0 = time.monotonic()
        await asyncio.wait_for(fired.wait(), 1.0)
        waited = time.monotonic() - t0
        assert watch.done() and not call.done(), "the call alone would have waited its 30 s"
        call.cancel()
        stopped = asyncio.Event()
        quiet = asyncio.create_task(watch_core(lambda: True, stopped.set, lambda: True, 0.05))
        await asyncio.sleep(0.12)
        return waited, quiet.done() and not stopped.is_set()

    waited, quiet = asyncio.run(scenario())
    assert waited < 0.1 + 0.05, waited  # two periods
    assert quiet, "a watch whose engine was shut down on purpose returns without calling on_dead"


@pytest.mark.e2e
def test_a_core_killed_under_a_waiting_call_ends_its_actor_within_seconds_and_the_engine_heals():
    """engine.core=process (vLLM's AsyncLLM, the GPU default), the dead-core race made deterministic
    (review reliability_faults.md §1.6): the core is SIGSTOPped, a call is sent that waits inside vLLM
    on a utility reply the stopped core cannot give, then the core is SIGKILLed and nothing else is
    called on the engine. Before the core watch, vLLM never failed that call: the first request
    waited for the router's deadline and the engine never exited. Now the actor ends within seconds
    of the kill, Ray restarts it, and:
    - the engine's first request (vLLM's task query in flight) is sent again and answered;
    - a base weight load (its pause in flight) fails as a dead actor, not a hang, and the restarted
      engine serves the version the store holds;
    - an adapter load (its pause in flight) likewise;
    - an idle engine whose core dies is restarted before anything calls it.
    A background lane job with a Ray of its own (killed_core_run)."""
    r = lane.result("killed_core")
    assert r["cores"] and r["cores_are_children"], "vLLM's engine core runs in a child process of the actor"
    first = r["first_request"]
    assert first["active_before_kill"] == 1, "the request was inside vLLM when the core died"
    assert first["answered"] and first["tokens"] > 0 and first["resent"] == 1, first
    assert first["actor_exit_s"] < 15, f"the actor ended {first['actor_exit_s']} s after the kill"
    assert first["pid_after"] != r["pid"], "a new engine process serves"
    for case in ("base_load", "adapter_load"):
        load = r[case]
        assert load["loading_before_kill"], (case, "the load was in progress when the core died")
        # the actor's death, as Ray reports it to a call in flight (died, or unavailable while it restarts)
        assert load["error"] in ("ActorDiedError", "ActorUnavailableError") and load["failed_s"] < 15, (case, load)
        assert load["pid_after"] not in (load["pid"], None), (case, load)
    assert r["base_load"]["version_after"] == r["base_load"]["store_version"], "caught up from the store"
    idle = r["idle"]
    assert idle["actor_exit_s"] < 15 and idle["pid_after"] != idle["pid"], idle


LANE_TESTS = {
    "test_a_core_killed_under_a_waiting_call_ends_its_actor_within_seconds_and_the_engine_heals": "killed_core"
}


def lane_jobs() -> dict[str, lane.Job]:
    code = "from tests.rollout.engine.test_engine import killed_core_run; killed_core_run()"
    return {"killed_core": lane.Job(["-c", code], 900, own_ray=True)}  # Ray restarts the engine in it


def _pid_gone(pid: int, timeout_s: float) -> float | None:
    """Seconds until process `pid` is gone (None: still there after `timeout_s`)."""
    import psutil

    t0 = time.monotonic()
    try:
        psutil.Process(pid).wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        return None
    except psutil.NoSuchProcess:
        pass
    return round(time.monotonic() - t0, 2)


def _until(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the schedule's condition never came"
        time.sleep(0.05)


def killed_core_run() -> None:
    """The lane's job for the test above: one process-core engine serving the tiny model and a
    LoRA adapter, its core killed four times under the deterministic schedule; what happened as
    one JSON line."""
    import json
    import sys
    import threading

    import psutil
    from safetensors.torch import save as save_tensors
    from transformers import AutoModelForCausalLM

    from rollout.config import EngineConfig, LoraConfig, RayConfig
    from rollout.engine.engine import EngineError
    from rollout.models import resolve_model
    from rollout.orchestration.cluster import start_ray
    from rollout.orchestration.router import Router

    start_ray(RayConfig(address="local", num_cpus=4))
    path = resolve_model("tiny")
    cfg = EngineConfig(num_cpus=0.5, kv_cache_gb=0.25, core="process", max_restarts=4, start_timeout_s=300)
    stores = spawn_stores(["main", "a"])  # with stores, Ray restarts a dead engine
    pool = "main+a"
    [e] = spawn_engines(
        {pool: (path, ModelConfig(name="tiny"), cfg)},
        stores={pool: stores},
        adapters={pool: {"a": LoraConfig(rank=4, alpha=8.0)}},
    )[pool]
    info = lambda: ray.get(e.info.remote(), timeout=60)  # noqa: E731 - never called between a kill and the exit
    first = info()
    found = {"pid": first["pid"], "cores": len(first["core_pids"])}
    found["cores_are_children"] = all(psutil.Process(c).ppid() == first["pid"] for c in first["core_pids"])

    def stop_core() -> tuple[int, list]:
        now = info()
        cores = [psutil.Process(c) for c in now["core_pids"]]
        for core in cores:
            core.suspend()  # alive, answering nothing
        return now["pid"], cores

    def kill(cores) -> float:
        for core in cores:
            core.kill()
        return time.monotonic()

    # 1. the engine's first request: vLLM's get_supported_tasks utility call in flight
    pid, cores = stop_core()
    router, answer, answered_at = Router([e], pool, timeout_s=120, restart_timeout_s=300), {}, []

    def request() -> None:
        try:
            [c] = asyncio.run(router.generate("trace-0", [5, 6, 7], SamplingConfig(max_tokens=4)))
            answer.update(answered=True, tokens=len(c.completion_ids))
        except EngineError as err:
            answer.update(answered=False, error=str(err))
        answered_at.append(time.monotonic())

    thread = threading.Thread(target=request)
    thread.start()
    _until(lambda: info()["active"] == 1)
    case = {"active_before_kill": info()["active"]}
    killed = kill(cores)
    case["actor_exit_s"] = _pid_gone(pid, 60)
    thread.join(timeout=400)
    case |= {**answer, "request_s": round(answered_at[0] - killed, 1), "resent": router.resent["trace-0"]}
    print(json.dumps({"first_request": case}), file=sys.stderr, flush=True)  # progress
    case["pid_after"] = info()["pid"]
    found["first_request"] = case

    # 2. a base weight load (and 3. an adapter load): the load's pause_generation in flight
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    base = [save_tensors({k: v.detach().clone() for k, v in model.named_parameters()})]
    ray.get(stores["main"].publish.remote(7, [ray.put(base)]), timeout=60)  # what a restart loads
    for name, load in (
        ("base_load", lambda: e.update_weights.remote(7, base)),
        ("adapter_load", lambda: e.update_weights.remote(1, [adapter_buckets(path)], "a")),
    ):
        pid, cores = stop_core()
        ref = load()
        _until(lambda: info()["loading_s"] is not None)
        case = {"pid": pid, "loading_before_kill": True}
        killed = kill(cores)
        try:
            ray.get(ref, timeout=120)
            case["error"] = None
        except ray.exceptions.GetTimeoutError:
            case["error"] = "hung"
        except ray.exceptions.RayActorError as err:
            case["error"] = type(err).__name__
        case["failed_s"] = round(time.monotonic() - killed, 1)
        after = _wait_info(e)
        case |= {"pid_after": after["pid"] if after else None, "version_after": after and after["version"]}
        case["store_version"] = 7
        found[name] = case

    # 4. an idle engine: nothing in flight, nothing called after the kill
    now = info()
    killed = kill([psutil.Process(c) for c in now["core_pids"]])
    found["idle"] = {"pid": now["pid"], "actor_exit_s": _pid_gone(now["pid"], 60)}
    found["idle"]["pid_after"] = (_wait_info(e) or {}).get("pid")
    ray.kill(e)
    ray.shutdown()
    print(json.dumps(found))


def _wait_info(engine, timeout_s: float = 400.0) -> dict | None:
    """The restarted engine's info once it answers (and has caught up with its stores)."""
    from rollout.orchestration.router import wait_until_restarted

    if not wait_until_restarted(engine, "info", timeout_s):
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        info = ray.get(engine.info.remote(), timeout=60)
        if not info["catching_up"] or time.monotonic() > deadline:
            return info
        time.sleep(0.2)


def adapter_buckets(model_path: str) -> bytes:
    """A LoRA adapter of rank 4 for the tiny model, as PEFT names its tensors (lora_B zero: the base)."""
    import copy

    from peft import get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save as save_tensors
    from transformers import AutoModelForCausalLM

    from rollout.config import LoraConfig
    from rollout.engine.lora_names import peft_config

    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = get_peft_model(copy.deepcopy(hf), peft_config(LoraConfig(rank=4, alpha=8.0), model_path))
    return save_tensors({k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()})


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


@pytest.mark.integration
def test_a_failed_base_load_keeps_generation_paused_until_a_full_load(engine, hf_tiny):
    """vLLM reloads layer by layer in place, so a collective load that breaks off halfway (another
    engine died mid-push) leaves weights of neither version. The engine must not serve them: after a
    failed load (here a receive with no weight group: the engine cannot tell how far a load got)
    requests wait, the watchdog reads the engine as loading (not hung), and the next full load
    (the push's object-store fallback) resumes them, tagged with its version. (Before: generation
    resumed at once on the half-loaded model, tagged with the old version.)"""
    from rollout.orchestration.fleet import probe_engine

    same = save({k: v.detach().clone() for k, v in hf_tiny.named_parameters()})
    v0 = ray.get(engine.info.remote(), timeout=60)["version"]
    with pytest.raises(ray.exceptions.RayTaskError, match="_tracerl_group"):
        ray.get(engine.receive_weights.remote(v0 + 1, []), timeout=60)
    waiting = engine.generate.remote([5, 6, 7], SamplingConfig(max_tokens=4))
    assert not ray.wait([waiting], timeout=3.0)[0], "a request was served by a half-loaded model"
    info = ray.get(engine.info.remote(), timeout=60)
    assert info["loading_s"] is not None and info["version"] == v0
    assert probe_engine(engine, timeout_s=1.0, load_timeout_s=600.0) == "loading"
    ray.get(engine.update_weights.remote(v0 + 1, [same]), timeout=120)
    [c] = ray.get(waiting, timeout=60)
    assert c.version == v0 + 1 and len(c.completion_ids) > 0
    assert ray.get(engine.info.remote(), timeout=60)["loading_s"] is None


@pytest.mark.e2e
def test_a_restarted_engine_answers_info_while_it_catches_up(ray_cluster, tiny_path, hf_tiny):
    """A restarted engine first loads its store's newest weights (a big model: minutes). Its info()
    answers meanwhile, saying so (catching_up, loading_s), so the watchdog sees "loading", not
    "hung", and does not kill it in a loop. Here the WeightStore is SIGSTOPped before the engine is
    killed, so the restarted engine's catch-up waits on it: past engine.sync_timeout_s a request
    fails naming the store (before: no deadline), and once SIGCONT lets it answer, the next request
    catches up and is served. (Before: info() awaited the catch-up, so the restart never answered
    and the probe said hung.)"""
    import psutil

    from rollout.config import EngineConfig
    from rollout.orchestration.fleet import probe_engine
    from rollout.orchestration.router import wait_until_restarted

    cfg = EngineConfig(num_cpus=0.5, kv_cache_gb=0.25, max_restarts=1, sync_timeout_s=15)
    stores = spawn_stores(["main"])
    [e] = spawn_engines({"main": (tiny_path, ModelConfig(name="tiny"), cfg)}, stores={"main": stores})["main"]
    store = psutil.Process(ray.get(stores["main"].__ray_call__.remote(lambda self: os.getpid()), timeout=60))
    weights = [save({k: v.detach().clone() for k, v in hf_tiny.named_parameters()})]
    try:
        ray.get(stores["main"].publish.remote(3, [ray.put(weights)]), timeout=60)
        old = psutil.Process(ray.get(e.info.remote(), timeout=60)["pid"])
        store.suspend()
        old.kill()
        psutil.wait_procs([old], timeout=30)
        assert wait_until_restarted(e, "info", 300), "the restarted engine answers info while catching up"
        info = ray.get(e.info.remote(), timeout=10)
        assert info["pid"] != old.pid and info["catching_up"] and info["loading_s"] is not None, info
        assert probe_engine(e, timeout_s=2.0, load_timeout_s=600.0) == "loading"
        with pytest.raises(
            ray.exceptions.RayTaskError,
            match=r"the WeightStore of policy 'main' did not hand its weights over within engine.sync_timeout_s=15",
        ):
            ray.get(e.generate.remote([5, 6, 7], SamplingConfig(max_tokens=4)), timeout=60)
        store.resume()
        deadline = time.monotonic() + 120
        while ray.get(e.info.remote(), timeout=10)["catching_up"] and time.monotonic() < deadline:
            time.sleep(0.2)
        [c] = ray.get(e.generate.remote([5, 6, 7], SamplingConfig(max_tokens=4)), timeout=120)
        assert c.version == 3, "it serves the store's version"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            store.resume()
        ray.kill(e)
        ray.kill(stores["main"])
