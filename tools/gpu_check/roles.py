"""The processes tools/gpu_check/ipc.py starts, one role each: learner rank 0 (`sender`), an engine
worker (`member`), a neighbour computing on the device (`load`), and the machine-level cases' own
(`fit`, `nccl_pair`, `environment`). Each is `child(role's name, spec, inbox, outbox)` in a process
of `child_context(device)`: it reports one result (or what it crashed with) on `outbox`; plans and
"done" come on `inbox`. The layouts, bucket bytes and `child_context` serve transport.py too.
Torch, the standard library and the weight push's two modules only (rollout/engine/weight_group.py,
trainer/weight_transport.py), like the stages that import it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

from rollout.engine.weight_group import GroupPlan, WeightGroup, device_identity
from trainer.weight_transport import staging_for

SHARES = {"sender": 0.4, "member": 0.25}  # cluster=gpu: learner.num_gpus, engine.gpu_memory_utilization
DTYPES = ("bfloat16", "float32")


# ------------------------------------------------------------------------------- data and layout
def layout_of(total_mb: int, bucket_mb: int) -> list:
    """Buckets of (name, shape, dtype) adding up to about `total_mb`: matrices and vectors, bf16 and fp32."""
    layout, bucket, size, total, i = [], [], 0, 0, 0
    while total < total_mb << 20:
        shape, dtype = ([512, 1024] if i % 3 else [1024]), DTYPES[i % 2]
        bucket.append((f"layer{i}.weight", shape, dtype))
        nbytes = torch.Size(shape).numel() * getattr(torch, dtype).itemsize
        size, total, i = size + nbytes, total + nbytes, i + 1
        if size >= bucket_mb << 20:
            layout.append(bucket)
            bucket, size = [], 0
    return layout + ([bucket] if bucket else [])


def nbytes_of(layout: list) -> int:
    return sum(torch.Size(s).numel() * getattr(torch, d).itemsize for b in layout for _, s, d in b)


def bucket_data(layout: list, k: int, version: int, device) -> list:
    """Bucket k's tensors in `version`: other bytes in every version, bucket and tensor (integer
    patterns seen as the tensor's dtype: cheap to make on both sides, compared bytewise)."""
    out = []
    for j, (_, shape, dtype) in enumerate(layout[k]):
        nbytes = torch.Size(shape).numel() * getattr(torch, dtype).itemsize
        words = torch.arange(-(-nbytes // 8), dtype=torch.int64, device=device) * 6364136223846793005
        words += 1442695040888963407 * (1 + version) + 7919 * k + 104729 * j
        out.append(words.view(torch.uint8)[:nbytes].view(getattr(torch, dtype)).view(shape))
    return out


def same_bytes(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# ---------------------------------------------------------------------------- the child processes
def start_child(device: str) -> torch.device:
    """A child's first step: on a GPU the process sees GPU 0 only (as Ray masks an actor's GPUs)."""
    if device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def copy_gb_per_s(dev: torch.device, nbytes: int) -> float:
    """A same-device copy of `nbytes`, best of 3: the bar a push on one device is measured against."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst, best = torch.empty_like(src), float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def hold_share(dev: torch.device, role: str, port: int) -> list:
    """vllm-like: a default process group of this process's own (NCCL world 1 on a GPU, its
    communicator made by one all-reduce, as vLLM's worker does) and its share of the GPU's memory."""
    import torch.distributed as dist

    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    dist.all_reduce(torch.ones(1, device=dev))
    total = torch.cuda.mem_get_info(dev)[1] if dev.type == "cuda" else 256 << 20
    return [torch.empty(int(SHARES[role] * total), dtype=torch.uint8, device=dev)]


def release_share(held: list) -> None:
    if held:
        import torch.distributed as dist

        held.clear()
        dist.destroy_process_group()


def memory(dev: torch.device, plan: GroupPlan | None = None) -> dict:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.ipc_collect()
        free, total = torch.cuda.mem_get_info(dev)
        return {
            "allocated": torch.cuda.memory_allocated(dev),
            "reserved": torch.cuda.memory_reserved(dev),
            "free": free,
        }
    names = [h[1] for h in plan.buffers] if plan else []
    return {"shm_blocks": names}


def sender(spec: dict, inbox, outbox) -> None:
    """Rank 0: for each generation close the last group, make staging buffers and a plan (sent to
    the members through the parent), open the group and push its versions."""
    dev = start_child(spec["device"])
    held = hold_share(dev, "sender", spec["pg_port"]) if spec.get("pg_port") else []
    layout, group, out = spec["layout"], None, {"generations": [], "identity": device_identity(dev)}
    out["memory_before"] = memory(dev)
    if spec.get("copy"):
        out["copy_gb_per_s"] = copy_gb_per_s(dev, nbytes_of(layout))
    for gen in spec["generations"]:
        if group is not None:
            group.close()  # Learner.prepare_weight_group: the old group goes before the new buffers
        plan = GroupPlan("127.0.0.1", gen["port"], gen.get("transports") or ["ipc"] * len(gen["to"]))
        plan, buffers = staging_for(plan, layout, dev)
        outbox.put({"role": "sender", "plan": pickle.dumps(plan), "to": gen["to"]})
        group = WeightGroup(plan, 0, dev, spec["timeout_s"], buffers)
        del buffers  # the group holds them, as Learner._pending_group does
        record = {"seconds": [], "error": None}
        for version in gen["versions"]:
            data = [bucket_data(layout, k, version, dev) for k in range(len(layout))]
            t0 = time.perf_counter()
            try:
                group.send(version, layout, iter(data))
            except TimeoutError as e:
                record["error"], record["failed_after_s"] = str(e)[:300], time.perf_counter() - t0
                break
            finally:
                data = None  # freed before memory is read
            record["seconds"].append(time.perf_counter() - t0)
        record["memory"] = memory(dev, plan)
        out["generations"].append(record)
    if spec.get("waits"):
        inbox.get(timeout=120)  # the members have closed their ends: what stays allocated now leaked
    group.close()
    out["memory_after_close"] = memory(dev)
    release_share(held)
    outbox.put({"role": "sender", "result": out})


def member(spec: dict, inbox, outbox) -> None:
    """An engine worker: for each generation take the plan, close its old group, join the new one
    and receive its versions, checking every byte (keeping every tensor until the push ends with
    `retain`; dying after bucket 0 of its first push with `die`)."""
    dev = start_child(spec["device"])
    held = hold_share(dev, "member", spec["pg_port"]) if spec.get("pg_port") else []
    layout, group, checks = spec["layout"], None, []
    for versions in spec["generations"]:
        plan = pickle.loads(inbox.get(timeout=120))
        if group is not None:
            group.close()  # worker_ext.tracerl_open_weight_group: the old group first
        group = WeightGroup(plan, spec["member"], dev, spec["timeout_s"])
        for version in versions:
            checks.append(receive_and_check(group, layout, version, dev, spec.get("retain", False), spec.get("die")))
    group.close()
    release_share(held)
    outbox.put({"role": spec["role"], "result": {"exact": all(c["exact"] for c in checks), "pushes": checks}})


def receive_and_check(group: WeightGroup, layout: list, version: int, dev, retain: bool, die: bool) -> dict:
    """Receive `version`, comparing every tensor with what the sender made (after the push ends,
    when `retain`: anything that reused a buffer under a kept tensor shows then)."""
    where = {name: (k, j) for k, bucket in enumerate(layout) for j, (name, _, _) in enumerate(bucket)}
    t0, kept, bad, n, cache = time.perf_counter(), [], [], 0, {}

    def check(name: str, t) -> None:
        k, j = where[name]
        if k not in cache:
            cache.clear()  # one bucket's expected tensors at a time
            cache[k] = bucket_data(layout, k, version, dev)
        if not same_bytes(t, cache[k][j]):
            bad.append(name)

    for name, t in group.receive(version, layout):
        if die:
            os.kill(os.getpid(), signal.SIGKILL)  # bucket 0 taken (acked); no later one ever will be
        n += 1
        if retain:
            kept.append((name, t))  # views of the bucket's clone, held while later buckets arrive
        else:
            check(name, t)
    for name, t in kept:
        check(name, t)
    return {
        "version": version,
        "exact": not bad and n == len(where),
        "tensors": n,
        "wrong": bad[:5],
        "seconds": time.perf_counter() - t0,
    }


def load(spec: dict, inbox, outbox) -> None:
    """vllm-like's third process: matmuls on the device until told to stop."""
    dev = start_child(spec["device"])
    if dev.type == "cpu":
        torch.set_num_threads(1)
    n, a = 0, torch.randn(2048 if dev.type == "cuda" else 256, 2048 if dev.type == "cuda" else 256, device=dev)
    while True:
        try:
            inbox.get_nowait()
            break
        except queue.Empty:
            a = torch.tanh(a @ a)
            n += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    outbox.put({"role": spec["role"], "result": {"matmuls": n}})


def fit(spec: dict, inbox, outbox) -> None:
    """fit: take `share` of the GPU once all three have a CUDA context; report what is free."""
    dev = start_child(spec["device"])
    free0, total = torch.cuda.mem_get_info(dev)
    spec["barrier"].wait(60)
    try:
        block = torch.empty(int(spec["share"] * total), dtype=torch.uint8, device=dev)
        error = None
    except torch.cuda.OutOfMemoryError as e:
        block, error = None, str(e)[:300]
    spec["barrier"].wait(60)
    free1, _ = torch.cuda.mem_get_info(dev)
    del block
    outbox.put(
        {"role": spec["role"], "result": {"free_at_start": free0, "free_after": free1, "total": total, "error": error}}
    )


def nccl_pair(spec: dict, inbox, outbox) -> None:
    """dupgpu: one rank of a two-rank ProcessGroupNCCL whose ranks share GPU 0, one broadcast."""
    import datetime

    import torch.distributed as dist

    dev = start_child(spec["device"])
    store = dist.TCPStore(
        "127.0.0.1", spec["port"], 2, is_master=spec["rank"] == 0, timeout=datetime.timedelta(seconds=30)
    )
    t0 = time.perf_counter()
    try:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = datetime.timedelta(seconds=15)
        group = dist.ProcessGroupNCCL(store, spec["rank"], 2, options)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        t = torch.full((1024,), float(spec["rank"] == 0), device=dev)
        group.broadcast([t], opts).wait()
        torch.cuda.synchronize(dev)
        result = {"outcome": "worked", "value": float(t[0])}
    except Exception as e:  # the outcome is what this case records
        result = {"outcome": "error", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    result["seconds"] = time.perf_counter() - t0
    outbox.put({"role": spec["role"], "result": result})


def environment(spec: dict, inbox, outbox) -> None:
    """env: what this machine runs the GPU path with."""
    dev = start_child(spec["device"])
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "identity": device_identity(dev),
        "gcc": _first_line(["gcc", "--version"]),
        "python_h": header.exists(),
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        out.update(
            gpu=props.name,
            uuid=str(props.uuid),
            memory_gib=round(props.total_memory / 2**30, 1),
            nccl=".".join(map(str, v)) if isinstance(v := torch.cuda.nccl.version(), tuple) else str(v),
            driver=_first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            triton=_triton_compiles(dev),
        )
    problems = [k for k in ("gcc", "python_h") if not out[k]] + (
        ["triton"] if dev.type == "cuda" and out["triton"] != "ok" else []
    )
    outbox.put({"role": spec["role"], "result": {**out, "problems": problems}})


def _first_line(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def _triton_compiles(dev) -> str:
    """A one-line Triton kernel built and run: vLLM's GPU model runner needs Triton's JIT, which
    builds a C launcher with the host compiler and Python.h (GPU review F5)."""
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

        x = torch.zeros(100, device=dev)
        add_one[(1,)](x, 100, BLOCK=128)
        torch.cuda.synchronize(dev)
        return "ok" if bool((x == 1).all()) else "wrong result"
    except Exception as e:  # recorded, not raised: this case reports the machine
        return f"{type(e).__name__}: {str(e)[:300]}"


def child_context(device: str):
    """How the check's child processes start. On a GPU, spawned: each a fresh interpreter that masks
    its GPU and reads PYTORCH_CUDA_ALLOC_CONF (set around its start) before CUDA starts, as Ray's
    workers do. On CPU, with no CUDA and no allocator settings to read, forked from a server that
    imported torch and these modules once: a spawned child's `import torch` (~2.3 CPU-s) was nearly
    all of what the CPU form cost (20 children in ipc.py); the protocol is the same."""
    if device == "cuda":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", __name__])  # __name__: the roles, the weight group, the transport
    return ctx


def child(target: str, spec: dict, inbox, outbox) -> None:
    """Every child process: run `target`; an exception is reported as this role's result (what
    the expandable case records), then the process fails."""
    try:
        globals()[target](spec, inbox, outbox)
    except Exception as e:
        outbox.put({"role": spec["role"], "result": {"crashed": f"{type(e).__name__}: {str(e)[:500]}"}})
        raise
