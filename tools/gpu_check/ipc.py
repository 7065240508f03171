"""The weight group's same-device path (ipc) as production uses it, torch only (GPU review §6.2).

Learner rank 0 and the engine workers are stood in for by processes (tools/gpu_check/roles.py;
on a GPU spawned, each masked to GPU 0 before CUDA starts, as Ray masks them; on CPU forked from a
server that imported torch once, see `child_context`) that open
real WeightGroups (rollout/engine/weight_group.py). Every push carries new bytes (seeded by version, bucket and
tensor), and the plan goes sender -> this process (unpickled and pickled again, never starting CUDA here, as
Ray's driver relays it) -> bytes -> each member. One JSON line per case as it ends, each case under
its own deadline, then a last line with every case's status:

  env         torch, CUDA, NCCL, driver, the GPU's UUID form, gcc, Python.h, a Triton kernel (record)
  hop         the plan through this CUDA-free process; one member attaches and takes a push
  retain      the member keeps every tensor it was given (no clone) until the push ends; 3 versions
  members2    two members (two engines on one GPU); both exact, the sender waits for both
  reopen      3 group generations in production order (the sender closes and prepares first, the
              member closes the old group when it joins the new); memory stays bounded
  death       a member SIGKILLed after taking bucket 0: the sender's push fails at its timeout, and
              the next generation, with a new member, is exact; memory left behind (F14)
  vllm-like   the sender and the member first join a default process group of their own and hold
              their memory share (0.4 / 0.25 on a GPU) while a third process computes throughout
  fit         (GPU) three processes take 0.25, 0.25 and 0.4 of the GPU at once; CUDA context cost
  expandable  (GPU) the sender under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (record, F15)
  big         a large layout pushed with small and large buckets: exact, GB/s of each
  dupgpu      (GPU) a NCCL group with two ranks on one GPU (record: error or hang, F9), then the
              gloo group choose_transports gives such members instead: exact

On CPU the ipc path is the same protocol over POSIX shared memory, and the GPU-only cases are
skipped, saying so. Exits 0 iff every case that ran held. From the repository root, needing torch
(the `ipc` stage of `python -m tools.gpu_check` runs it so):

    python -m tools.gpu_check.ipc --device cuda --out gpu_check_out
    python -m tools.gpu_check.ipc --device cpu --cases hop,retain
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import queue
import sys
import time
from pathlib import Path

import torch

from rollout.engine.weight_group import offsets
from tools.gpu_check.roles import child, child_context, layout_of, nbytes_of
from trainer.rank_env import free_port
from trainer.weight_transport import choose_transports

CASES = ("env", "hop", "retain", "members2", "reopen", "death", "vllm-like", "fit", "expandable", "big", "dupgpu")
GPU_ONLY = {"fit", "expandable", "dupgpu"}
DEADLINE_S = {"reopen": 120, "death": 90, "vllm-like": 120, "big": 180}  # the others: 60
SIZES = {  # MiB pushed and MiB a bucket: a SmolLM2-sized model on a GPU, a small one on CPU
    "cuda": {"mb": 1024, "bucket_mb": 64, "big_mb": 8192, "big_buckets": (64, 512), "timeout_s": 10},
    "cpu": {"mb": 8, "bucket_mb": 1, "big_mb": 16, "big_buckets": (1, 8), "timeout_s": 5},
}


# ------------------------------------------------------------------------------------- the runner
class environ:
    """Variables set in this process around a child's start (a spawned child inherits them before
    torch loads in it: the allocator reads PYTORCH_CUDA_ALLOC_CONF then). GPU cases only: a child
    forked from the CPU form's server has the server's environment."""

    def __init__(self, **values: str):
        self.values, self.saved = values, {}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def proc(role: str, target: str, **spec) -> dict:
    """A child of a case: `dies` (killed on purpose: no result wanted), `background` (stopped once
    the others have reported), `waits` (told "done" once the others have reported), `env`."""
    flags = {k: spec.get(k, False) for k in ("dies", "background", "waits")}
    return {"role": role, "target": target, "env": spec.pop("env", {}), "spec": {**spec, "role": role}, **flags}


def run(procs: list[dict], deadline_s: float) -> tuple[dict, str | None]:
    """Start `procs` (`child_context` of their device), relay plans between them through this process, and collect each
    one's result until all are in, one dies unexpectedly, or `deadline_s` passes (then all are
    killed). Returns (results by role, what went wrong or None)."""
    device = procs[0]["spec"]["device"]
    if device != "cuda" and any(p["env"] for p in procs):
        raise ValueError(f"a child's own environment needs a spawned child (device cuda), not {device}")
    ctx = child_context(device)
    outbox, inboxes, handles = ctx.Queue(), {p["role"]: ctx.Queue() for p in procs}, {}
    for p in procs:
        h = ctx.Process(target=child, args=(p["target"], p["spec"], inboxes[p["role"]], outbox), daemon=True)
        with environ(**p["env"]):
            h.start()
        handles[p["role"]] = h
    first = {p["role"] for p in procs if not (p["dies"] or p["background"] or p["waits"])}
    wanted = first | {p["role"] for p in procs if p["background"] or p["waits"]}
    results, error, deadline = {"_relay": {"plans": 0}}, None, time.monotonic() + deadline_s
    try:
        while not wanted <= results.keys():
            if first <= results.keys():  # the rest are told to finish (once: they read it once)
                for role in wanted - first - results.keys():
                    inboxes[role].put("done")
                first = wanted
            try:
                msg = outbox.get(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                lost = [r for r in wanted - results.keys() if handles[r].exitcode not in (None, 0)]
                if lost or time.monotonic() > deadline:
                    error = ", ".join(f"{r} exited with {handles[r].exitcode}" for r in lost) or (
                        f"no result within {deadline_s:.0f} s from {sorted(wanted - results.keys())}"
                    )
                    break
                continue
            if "plan" in msg:  # as Ray's driver relays it: unpickled and pickled again, CUDA never started here
                data = pickle.dumps(pickle.loads(msg["plan"]))
                for role in msg["to"]:
                    inboxes[role].put(data)
                results["_relay"]["plans"] += 1
            else:
                results[msg["role"]] = msg["result"]
    finally:
        results["_relay"]["cuda_initialized"] = torch.cuda.is_initialized()
        for h in handles.values():
            h.join(timeout=10 if error is None else 0.1)
            if h.is_alive():
                h.kill()
                h.join(timeout=10)
    crashed = [f"{r}: {v['crashed']}" for r, v in results.items() if "crashed" in v]
    return results, error or ("; ".join(crashed) if crashed else None)


# --------------------------------------------------------------------------------------- the cases
def pushes(layout: list, device: str, timeout_s: float, generations: list[dict], members: list[dict], **sender) -> list:
    """The processes of a push case: the sender with `generations` ({"to": member roles, "versions":
    [...]}: each gets a port), and `members` ({"role", "member", "generations": [[versions]], ...})."""
    gens = [{**g, "port": free_port()} for g in generations]
    common = {"layout": layout, "device": device, "timeout_s": timeout_s}
    return [proc("sender", "sender", generations=gens, **common, **sender)] + [
        proc(m.pop("role"), "member", **common, **m) for m in map(dict, members)
    ]


def exact(results: dict, roles: list[str]) -> bool:
    return all(results.get(r, {}).get("exact") for r in roles)


def sent_ok(results: dict) -> bool:
    return all(g["error"] is None for g in results.get("sender", {}).get("generations", [{"error": "none"}]))


def case_env(device: str, sizes: dict, deadline_s: float) -> dict:
    results, error = run([proc("env", "environment", device=device)], deadline_s)
    return {"ok": error is None, "error": error, **results.get("env", {})}


def case_hop(device: str, sizes: dict, deadline_s: float) -> dict:
    layout = layout_of(sizes["mb"], sizes["bucket_mb"])
    ps = pushes(
        layout, device, 60, [{"to": ["m1"], "versions": [1]}], [{"role": "m1", "member": 1, "generations": [[1]]}]
    )
    results, error = run(ps, deadline_s)
    relay = results["_relay"]
    ok = error is None and exact(results, ["m1"]) and relay["plans"] == 1 and not relay["cuda_initialized"]
    return {
        "ok": ok,
        "error": error,
        "relay": relay,
        "m1": results.get("m1"),
        "identity": results.get("sender", {}).get("identity"),
    }


def case_retain(device: str, sizes: dict, deadline_s: float) -> dict:
    layout, versions = layout_of(sizes["mb"], sizes["bucket_mb"]), [1, 2, 3]
    ps = pushes(
        layout,
        device,
        60,
        [{"to": ["m1"], "versions": versions}],
        [{"role": "m1", "member": 1, "generations": [versions], "retain": True}],
    )
    results, error = run(ps, deadline_s)
    return {
        "ok": error is None and exact(results, ["m1"]) and sent_ok(results),
        "error": error,
        "buckets": len(layout),
        "m1": results.get("m1"),
    }


def case_members2(device: str, sizes: dict, deadline_s: float) -> dict:
    layout, versions = layout_of(sizes["mb"], sizes["bucket_mb"]), [1, 2]
    members = [{"role": f"m{i}", "member": i, "generations": [versions]} for i in (1, 2)]
    results, error = run(pushes(layout, device, 60, [{"to": ["m1", "m2"], "versions": versions}], members), deadline_s)
    seconds = results.get("sender", {}).get("generations", [{}])[0].get("seconds", [])
    return {
        "ok": error is None and exact(results, ["m1", "m2"]) and sent_ok(results),
        "error": error,
        "send_s": seconds,
        "members": {r: results.get(r) for r in ("m1", "m2")},
    }


def case_reopen(device: str, sizes: dict, deadline_s: float) -> dict:
    layout = layout_of(sizes["mb"], sizes["bucket_mb"])
    gens = [{"to": ["m1"], "versions": [g + 1]} for g in range(3)]
    ps = pushes(layout, device, 60, gens, [{"role": "m1", "member": 1, "generations": [[1], [2], [3]]}], waits=True)
    results, error = run(ps, deadline_s)
    sent = results.get("sender", {})
    out = {
        "ok": error is None and exact(results, ["m1"]) and sent_ok(results),
        "error": error,
        "staging_bytes": 2 * staging(layout),
    }
    memories = [g["memory"] for g in sent.get("generations", [])]
    if device == "cuda" and memories:  # reserved grows by one pair of buffers at most (the old pair in limbo)
        out["reserved"] = [m["reserved"] for m in memories]
        out["reserved_growth"] = max(out["reserved"]) - out["reserved"][0]
        out["ok"] = out["ok"] and out["reserved_growth"] <= 2 * staging(layout) + (8 << 20)
    else:  # every generation's shared memory blocks are gone once the groups are closed
        out["blocks_left"] = [n for m in memories for n in m["shm_blocks"] if Path("/dev/shm", n.lstrip("/")).exists()]
        out["ok"] = out["ok"] and not out["blocks_left"]
    return out


def case_death(device: str, sizes: dict, deadline_s: float) -> dict:
    layout = layout_of(sizes["mb"], sizes["bucket_mb"])
    gens = [{"to": ["m1"], "versions": [1]}, {"to": ["m2"], "versions": [2]}]
    members = [
        {"role": "m1", "member": 1, "generations": [[1]], "die": True, "dies": True},
        {"role": "m2", "member": 1, "generations": [[2]]},
    ]
    results, error = run(pushes(layout, device, sizes["timeout_s"], gens, members, waits=True), deadline_s)
    sent = results.get("sender", {})
    first, second = (sent.get("generations", []) + [{}, {}])[:2]
    out = {
        "ok": error is None and "did not take bucket" in str(first.get("error")) and second.get("error") is None,
        "error": error,
        "timeout_s": sizes["timeout_s"],
        "failed_after_s": first.get("failed_after_s"),
        "sender_error": first.get("error"),
        "m2": results.get("m2"),
    }
    out["ok"] = out["ok"] and exact(results, ["m2"])
    if device == "cuda" and sent:  # F14: what the dead member's mappings keep allocated in the sender
        out["left_allocated_bytes"] = sent["memory_after_close"]["allocated"] - sent["memory_before"]["allocated"]
        out["staging_bytes"] = 2 * staging(layout)
    return out


def case_vllm_like(device: str, sizes: dict, deadline_s: float) -> dict:
    layout, versions = layout_of(sizes["mb"], sizes["bucket_mb"]), [1, 2, 3]
    ps = pushes(
        layout,
        device,
        60,
        [{"to": ["m1"], "versions": versions}],
        [{"role": "m1", "member": 1, "generations": [versions], "pg_port": free_port()}],
        pg_port=free_port(),
        copy=True,
    )
    results, error = run(ps + [proc("load", "load", device=device, background=True)], deadline_s)
    sent = results.get("sender", {})
    seconds = (sent.get("generations") or [{}])[0].get("seconds") or [float("inf")]
    return {
        "ok": error is None and exact(results, ["m1"]) and sent_ok(results),
        "error": error,
        "gb_per_s": nbytes_of(layout) / min(seconds) / 1e9,
        "copy_gb_per_s": sent.get("copy_gb_per_s"),
        "load_matmuls": results.get("load", {}).get("matmuls"),
    }


def case_fit(device: str, sizes: dict, deadline_s: float) -> dict:
    barrier = mp.get_context("spawn").Barrier(3)
    shares = {"learner": 0.4, "engine0": 0.25, "engine1": 0.25}
    results, error = run(
        [proc(r, "fit", device=device, share=f, barrier=barrier) for r, f in shares.items()], deadline_s
    )
    got = [results.get(r, {}) for r in shares]
    out = {
        "ok": error is None and all(g.get("error") is None for g in got),
        "error": error,
        "ranks": dict(zip(shares, got)),
    }
    if out["ok"]:
        total = got[0]["total"]
        used = total - min(g["free_after"] for g in got)
        out["context_overhead_gib"] = round((used - sum(f * total for f in shares.values())) / 3 / 2**30, 3)
    return out


def case_expandable(device: str, sizes: dict, deadline_s: float) -> dict:
    layout = layout_of(sizes["mb"], sizes["bucket_mb"])
    ps = pushes(
        layout,
        device,
        sizes["timeout_s"],
        [{"to": ["m1"], "versions": [1]}],
        [{"role": "m1", "member": 1, "generations": [[1]]}],
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    results, error = run(ps, deadline_s)
    works = error is None and exact(results, ["m1"]) and sent_ok(results)
    return {"ok": "no result within" not in str(error), "record": True, "ipc_works": works, "error": error}


def case_big(device: str, sizes: dict, deadline_s: float) -> dict:
    out = {"ok": True, "mb": sizes["big_mb"]}
    for bucket_mb in sizes["big_buckets"]:
        layout = layout_of(sizes["big_mb"], bucket_mb)
        ps = pushes(
            layout,
            device,
            120,
            [{"to": ["m1"], "versions": [1, 2]}],
            [{"role": "m1", "member": 1, "generations": [[1, 2]]}],
        )
        results, error = run(ps, deadline_s / len(sizes["big_buckets"]))
        seconds = (results.get("sender", {}).get("generations") or [{}])[0].get("seconds") or [float("inf")]
        held = error is None and exact(results, ["m1"]) and sent_ok(results)
        out[f"bucket_{bucket_mb}mb"] = {
            "exact": held,
            "error": error,
            "gb_per_s": nbytes_of(layout) / min(seconds) / 1e9,
        }
        out["ok"] = out["ok"] and held
    return out


def case_dupgpu(device: str, sizes: dict, deadline_s: float) -> dict:
    """F9 on one GPU: what NCCL does with two ranks on it (a record), then the gloo group that
    choose_transports gives two engine workers sharing a GPU, run on this one: exact."""
    port = free_port()
    pair, error = run([proc(f"rank{r}", "nccl_pair", device=device, rank=r, port=port) for r in (0, 1)], 25)
    if error and "no result within" in error:
        nccl = {"outcome": "hang (killed at 25 s)"}
    else:
        nccl = pair.get("rank1") or pair.get("rank0") or {"outcome": "a rank died", "error": error}
    shared = "cuda:GPU-shared-by-two-engines"
    transports = choose_transports("cuda:GPU-of-the-learner", [[shared], [shared]])
    layout, members = layout_of(sizes["mb"] // 4, sizes["bucket_mb"]), []
    for i in (1, 2):
        members.append({"role": f"m{i}", "member": i, "generations": [[1]]})
    ps = pushes(layout, device, 60, [{"to": ["m1", "m2"], "versions": [1], "transports": transports}], members)
    results, error = run(ps, deadline_s - 25)
    held = error is None and exact(results, ["m1", "m2"]) and sent_ok(results)
    return {"ok": held, "error": error, "nccl_two_ranks_one_gpu": nccl, "fallback": transports}


def staging(layout: list) -> int:
    return max(offsets(b)[1] for b in layout)


CASE_FUNCS = {
    "env": case_env,
    "hop": case_hop,
    "retain": case_retain,
    "members2": case_members2,
    "reopen": case_reopen,
    "death": case_death,
    "vllm-like": case_vllm_like,
    "fit": case_fit,
    "expandable": case_expandable,
    "big": case_big,
    "dupgpu": case_dupgpu,
}


def one_case(name: str, device: str, deadline_s: float | None) -> dict:
    """One case's record: status (ok, failed, timeout, skipped), seconds, its details."""
    if device == "cpu" and name in GPU_ONLY:
        return {"case": name, "status": "skipped", "reason": "needs a GPU (CUDA memory, NCCL or its allocator)"}
    t0 = time.perf_counter()
    try:
        out = CASE_FUNCS[name](device, SIZES[device], deadline_s or DEADLINE_S.get(name, 60))
    except Exception as e:  # the check goes on with the next case
        out = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}"}
    ok = out.pop("ok")
    status = "ok" if ok else "timeout" if "no result within" in str(out.get("error")) else "failed"
    return {"case": name, "status": status, "seconds": round(time.perf_counter() - t0, 1), **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.device_count() else "cpu")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--out", default=None, help="a folder to write ipc.json into (every case's record)")
    p.add_argument("--deadline-s", type=float, default=None, help="each case's deadline (default: its own)")
    a = p.parse_args()
    cases = [c for c in a.cases.replace(" ", ",").split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"unknown case(s) {unknown}; the cases are: {', '.join(CASES)}")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    t0, records = time.perf_counter(), {}
    for name in cases:
        records[name] = one_case(name, a.device, a.deadline_s)
        print(json.dumps(records[name], default=str), flush=True)
    summary = {
        "check": "ipc",
        "device": a.device,
        "torch": torch.__version__,
        "cases": {n: r["status"] for n, r in records.items()},
        "ok": all(r["status"] in ("ok", "skipped") for r in records.values()),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "ipc.json").write_text(json.dumps({"summary": summary, "cases": records}, indent=1, default=str))
    print(json.dumps(summary), flush=True)
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
