"""Stage `transport` of `python -m tools.gpu_check`: the weight transport alone, torch,
rollout/engine/weight_group.py and trainer/weight_transport.py only.

Learner rank 0 and engine workers are stood in for by plain processes that open a real
`WeightGroup` and push a model-sized set of tensors (other bytes in every push, so each receiver
checks every byte of every version; tools/gpu_check/ipc.py drives the ipc path further):

- `ipc`: sender and receiver on one device (CUDA IPC on a GPU; POSIX shared memory on CPU);
- `nccl`: sender on GPU 0, receiver on GPU 1 (skipped, with the reason, on fewer than two GPUs);
- `gloo`: the process group on the same device (CPU, or CUDA tensors staged through the host);
- `choice`: the transport `choose_transport` picks for the devices the processes report.

Each case reports exactness and GB/s of the best of `--pushes` pushes, beside a device-to-device
copy of the same bytes. Writes OUT/transport.json; prints it as the last line; exits 0 iff every
case that ran held. Runs from the repository root on a box that has only torch:

    python -m tools.gpu_check.transport --device cuda --out gpu_check_out
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch

from rollout.engine.weight_group import GroupPlan, WeightGroup, device_identity
from rollout.log import setup_logging
from tools.gpu_check.roles import bucket_data, child_context, layout_of, same_bytes
from trainer.rank_env import free_port
from trainer.weight_transport import choose_transport, staging_for


def tensors_of(layout: list, device, version: int) -> list[list]:
    """Every bucket's tensors in `version`, made on the device (other bytes in every version)."""
    return [bucket_data(layout, k, version, device) for k in range(len(layout))]


def sender(plan: GroupPlan, device: str, layout: list, pushes: int, plans: mp.Queue, results: mp.Queue) -> None:
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    plan, buffers = staging_for(plan, layout, dev)
    for _ in plan.transports:
        plans.put(plan)
    group = WeightGroup(plan, 0, dev, timeout_s=120, buffers=buffers)
    seconds = []
    for version in range(1, pushes + 1):
        data = tensors_of(layout, dev, version)
        t0 = time.perf_counter()
        group.send(version, layout, iter(data))
        seconds.append(time.perf_counter() - t0)
    results.put({"role": "sender", "identity": device_identity(dev), "seconds": seconds})
    group.close()


def receiver(member: int, device: str, layout: list, pushes: int, plans: mp.Queue, results: mp.Queue) -> None:
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    plan = plans.get(timeout=120)
    group = WeightGroup(plan, member, dev, timeout_s=120)
    seconds, exact = [], True
    for version in range(1, pushes + 1):
        t0 = time.perf_counter()
        received = [t.clone() for _, t in group.receive(version, layout)]
        seconds.append(time.perf_counter() - t0)
        expected = [t for b in tensors_of(layout, dev, version) for t in b]
        exact = exact and len(received) == len(expected) and all(map(same_bytes, received, expected))
    results.put(
        {
            "role": f"receiver{member}",
            "identity": device_identity(dev),
            "transport": group.transport,
            "seconds": seconds,
            "exact": exact,
        }
    )
    group.close()


def push_case(transport: str, send_dev: str, recv_dev: str, layout: list, pushes: int, limit_s: float) -> dict:
    """One sender and one receiver process pushing `layout` over `transport`."""
    ctx = child_context("cuda" if "cuda" in (send_dev + recv_dev) else "cpu")
    plans, results = ctx.Queue(), ctx.Queue()
    plan = GroupPlan("127.0.0.1", free_port(), [transport])
    procs = [
        ctx.Process(target=sender, args=(plan, send_dev, layout, pushes, plans, results)),
        ctx.Process(target=receiver, args=(1, recv_dev, layout, pushes, plans, results)),
    ]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + limit_s
    try:
        while len(out) < 2 and time.monotonic() < deadline:
            try:
                r = results.get(timeout=1)
                out[r.pop("role")] = r
            except Exception:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if len(out) < 2:
        return {"ok": False, "error": f"no result within {limit_s:.0f} s (exit codes {[p.exitcode for p in procs]})"}
    nbytes = sum(torch.Size(s).numel() * getattr(torch, d).itemsize for b in layout for _, s, d in b)
    best = min(max(a, b) for a, b in zip(out["sender"]["seconds"], out["receiver1"]["seconds"]))
    return {
        "ok": out["receiver1"]["exact"],
        "exact": out["receiver1"]["exact"],
        "bytes": nbytes,
        "gb_per_s": nbytes / best / 1e9,
        "seconds": out["receiver1"]["seconds"],
        "identities": [out["sender"]["identity"], out["receiver1"]["identity"]],
    }


def copy_gb_per_s(device: str, nbytes: int) -> float:
    """A same-device copy of `nbytes`: the bar a transport on one device is measured against."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        if src.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def run(device: str, total_mb: int, bucket_mb: int, pushes: int, limit_s: float) -> dict:
    layout = layout_of(total_mb, bucket_mb)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    first = "cuda:0" if device == "cuda" else "cpu"
    cases = {
        "ipc": push_case("ipc", first, first, layout, pushes, limit_s),
        "gloo": push_case("gloo", first, first, layout, pushes, limit_s),
    }
    cases["nccl"] = (
        push_case("nccl", "cuda:0", "cuda:1", layout, pushes, limit_s)
        if gpus >= 2
        else {"skipped": f"needs two GPUs; this machine shows {gpus}"}
    )
    ids = cases["ipc"].get("identities")
    cases["choice"] = (
        {
            "ok": choose_transport(ids[0], ids[1]) == ("ipc" if device == "cuda" else "gloo"),
            "picked": choose_transport(ids[0], ids[1]),
            "identities": ids,
        }
        if ids
        else {"ok": False, "error": "the ipc case reported no device identities"}
    )
    nbytes = cases["ipc"].get("bytes", total_mb << 20)
    return {
        "device": device,
        "gpus": gpus,
        "torch": torch.__version__,
        "buckets": len(layout),
        "copy_gb_per_s": copy_gb_per_s(first, nbytes),
        "cases": cases,
        "ok": all(c.get("ok", True) for c in cases.values() if "skipped" not in c),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="gpu_check_out")
    p.add_argument("--mb", type=int, default=None, help="MiB pushed (default: 1024 on GPU, 64 on CPU)")
    p.add_argument("--bucket-mb", type=int, default=None, help="MiB a bucket (default: 64 on GPU, 8 on CPU)")
    p.add_argument("--pushes", type=int, default=3)
    p.add_argument("--case-timeout", type=float, default=120.0)
    a = p.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    gpu = a.device == "cuda"
    summary = run(a.device, a.mb or (1024 if gpu else 64), a.bucket_mb or (64 if gpu else 8), a.pushes, a.case_timeout)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "transport.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
