"""Benchmark the learner side, each comparison measured side by side in one run.

    python -m tools.bench.learner [--models tiny,smollm2_135m] [--sections a,b,c] [--quick]

(a) trained tokens/s: LearnerGroup (2 DeepSpeed ranks on Ray, ZeRO-2; and 1 rank with
    both cores, ZeRO-0, as `make train` runs it: a_throughput_ws1) vs a plain
    single-process torch forward + backward + AdamW loop on the same micro-batches, in a Ray
    actor with the ws1 rank's CPUs and threads; they take turns step by step (min of the rounds).
(b) multi-turn traces with 2, 4, 8 turns: tokens processed and fwd+bwd time with
    prefix merging vs without, against the unique-token count (the floor).
(c) weight sync: seconds of CollectiveSync (a gloo group, learner rank 0 broadcasting
    into the engine) and of ObjectStoreSync (learners -> object store -> engine) vs a
    plain in-memory copy of the same bytes.
(d) LoRA (rank 16 on the attention and MLP projections) vs full weights: bytes and
    seconds per weight sync of one trained policy, and the learner RSS of two adapter
    policies (one learner group holding the base once) vs two full policies after one
    optimizer step each.
(e) the loss over the trained tokens only (the output head and its softmax at those
    positions) vs over every position, the plain loop, rows shaped like the single_turn
    run's (a chat prompt of ~64 tokens, 24 generated); the two take turns step by step.
`--quick`: the tiny model, every section, 2 rows, one step or sync or pass each (the test suite's run),
and (a)'s two learner groups kept for (c) and (d): (c) syncs from the one-rank group with either
method into (d)'s two-policy fleet, (d)'s two full policies train on the two groups in that fleet
(its LoRA fleet and group start their own): six ranks and a fleet fewer started for the same code.
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from contextlib import ExitStack

import ray
import torch

from rollout.agents.chat_format import ChatFormat
from rollout.config import RayConfig
from rollout.log import setup_logging
from rollout.models import resolve_model
from rollout.orchestration.cluster import start_ray
from rollout.orchestration.fleet import RolloutFleet
from tools.bench.reference import PlainLoop, batches_for, conversation_trace, memcpy_s
from trainer.config import LearnerConfig, LossConfig, compose
from trainer.learner_group import LearnerGroup
from trainer.losses import microbatch_loss
from trainer.packing import packing_stats
from trainer.policy import TrainedPolicy, trained_policies


def fwd_bwd_seconds(model, mbs) -> float:
    t0 = time.perf_counter()
    for mb in mbs:
        microbatch_loss(model, mb, LossConfig())[0].backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def section_a(
    path: str, fmt, vocab: int, n_rows: int, steps: int, budget: int, keep: ExitStack | None = None
) -> tuple[dict, dict[str, LearnerGroup]]:
    """(the section's figures, its learner groups by key if kept). `keep`: the groups stay up in it
    (--quick: sections c and d use them), else they shut down here (none returned)."""
    rng = random.Random(0)
    traces = [conversation_trace(fmt, vocab, 1, 96, 0, rng, f"t{i}") for i in range(n_rows)]
    _, mbs = batches_for(traces, True, budget)
    trained = sum(mb.num_trained for mb in mbs)

    # The plain loop runs in a Ray actor with the ws1 rank's resources and threads, so the two
    # differ only in what LearnerGroup and DeepSpeed add.
    plain_loop = ray.remote(num_cpus=1)(PlainLoop).remote(path, 2)

    def plain_step() -> float:
        return ray.get(plain_loop.step.remote(mbs), timeout=600)

    configs = {
        "a_throughput": LearnerConfig(world_size=2, num_cpus=1, zero_stage=2, lr=1e-6),
        # what `make train` runs: one rank with both cores
        "a_throughput_ws1": LearnerConfig(world_size=1, num_cpus=1, torch_threads=2, zero_stage=0, lr=1e-6),
    }
    # Every group is up before the clock starts, and the plain loop and each learner take turns
    # step by step, so a slow minute on this shared box hits all of them alike.
    plain, times, inside = [], {k: [] for k in configs}, {k: [] for k in configs}
    with ExitStack() as stack:
        groups = {k: stack.enter_context(LearnerGroup(path, cfg, LossConfig())) for k, cfg in configs.items()}
        for _ in range(steps + 1):  # the first round is warm-up
            plain.append(plain_step())
            for key, group in groups.items():
                t0 = time.perf_counter()
                res = group.train_step(mbs)
                times[key].append(time.perf_counter() - t0)
                inside[key].append(res["seconds"])
        if keep is not None:
            keep.enter_context(stack.pop_all())
    ray.kill(plain_loop)

    p = min(plain[1:])
    out = {}
    for key, cfg in configs.items():
        d = min(times[key][1:])
        out[key] = {
            "world_size": cfg.world_size,
            "zero_stage": cfg.zero_stage,
            "trained_tokens": trained,
            "plain_tok_s": round(trained / p, 1),
            "learner_tok_s": round(trained / d, 1),
            "ratio": round(p / d, 3),
            # the step inside the rank; the rest of `d` is the Ray call and the driver's
            "in_rank_s": round(min(inside[key][1:]), 3),
            "call_s": round(d, 3),
        }
    return out, groups if keep is not None else {}


def section_b(path: str, fmt, vocab: int, budget: int, quick: bool = False) -> dict:
    """`quick`: 2 traces per turn count, one timed pass each and no warm-up (4, the best of 2)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = {}
    for turns in (2, 4, 8):
        rng = random.Random(turns)
        traces = [conversation_trace(fmt, vocab, turns, 24, 12, rng, f"t{i}") for i in range(2 if quick else 4)]
        unique = sum(len(t.sequences[-1].prompt_ids) + len(t.sequences[-1].completion_ids) for t in traces)
        res = {"unique_tokens": unique}
        for merge in (True, False):
            rows, mbs = batches_for(traces, merge, budget)
            if not quick:
                fwd_bwd_seconds(model, mbs[:1])  # warm-up
            secs = min(fwd_bwd_seconds(model, mbs) for _ in range(1 if quick else 2))
            stats = packing_stats(rows, mbs)
            key = "merged" if merge else "unmerged"
            res[f"{key}_tokens"] = int(stats["tokens_merged"])
            res[f"{key}_padded_tokens"] = int(sum(mb.input_ids.size for mb in mbs))
            res[f"{key}_s"] = round(secs, 3)
        res["speedup"] = round(res["unmerged_s"] / res["merged_s"], 2)
        out[f"turns_{turns}"] = res
    return out


def section_c(
    model_name: str, rounds: int, learners: LearnerGroup | None = None, keep: ExitStack | None = None
) -> tuple[dict, RolloutFleet | None]:
    """The training loop's own pieces: a RolloutFleet's engine, a TrainedPolicy's learners, and each
    sync method side by side into the same engine (the collective one after its previous snapshot
    export finished, as in the loop, where the export overlaps the next rollout). `learners`, `keep`
    (--quick): both methods sync from this group into policy a's engine of section d's two-policy
    fleet, which stays up in `keep` and is returned, for d; else each policy starts its own, into a
    one-policy fleet shut down here."""
    out = {}
    fleet_overrides = d_overrides(model_name) if learners is not None else [f"model={model_name}", *SMALL]
    configs = {
        method: compose("train", [*fleet_overrides, f"sync.method={method}"])
        for method in ("object_store", "collective")
    }
    with ExitStack() as stack:
        # the fleet does not depend on the sync method
        fleet = (keep if keep is not None else stack).enter_context(RolloutFleet(configs["object_store"]))
        for method, cfg in configs.items():
            with TrainedPolicy(cfg, cfg.trainable_policies()[0], fleet, learners) as policy:
                results, snapshot_s = [], 0.0
                for v in range(1, rounds + 1):
                    if getattr(policy.sync, "snapshot", None) is not None:
                        t0 = time.perf_counter()
                        ray.wait([policy.sync.snapshot], timeout=600)
                        snapshot_s = time.perf_counter() - t0
                    results.append(policy.sync.push(v))
            best = min(results, key=lambda r: r["seconds"])
            out[method] = {
                "sync_s": round(best["seconds"], 3),
                "engine_load_s": round(best["load_seconds"], 3),
                **(
                    {"export_s": round(best["export_seconds"], 3)}
                    if "export_seconds" in best
                    else {
                        "send_s": round(best["send_seconds"], 3),
                        "engine_receive_s": round(best["receive_seconds"], 3),
                        "snapshot_wait_s": round(snapshot_s, 3),
                    }
                ),
            }
            print(model_name, "c", method, out[method], flush=True)
    nbytes = int(results[0]["bytes"])
    copy_s = memcpy_s(nbytes, rounds)
    out.update(bytes=nbytes, memcpy_s=round(copy_s, 4), memcpy_bytes_per_s=round(nbytes / copy_s))
    for method in ("object_store", "collective"):
        out[method]["over_memcpy"] = round(out[method]["sync_s"] / copy_s, 1)
    out["object_store_over_collective"] = round(out["object_store"]["sync_s"] / out["collective"]["sync_s"], 1)
    return out, fleet if keep is not None else None


def section_e(path: str, fmt, vocab: int, n_rows: int, steps: int, budget: int) -> dict:
    rng = random.Random(0)
    question = (
        "Add these numbers and give the final answer in <answer></answer> tags: "
        + " + ".join(str(rng.randrange(100)) for _ in range(12))
        + ". Show your work briefly."
    )
    traces = [conversation_trace(fmt, vocab, 1, 24, 0, rng, f"t{i}", question) for i in range(n_rows)]
    _, mbs = batches_for(traces, True, budget)
    loop = PlainLoop(path, 2)
    times = {True: [], False: []}
    for _ in range(steps + 1):  # the first round is warm-up
        for only_trained in times:
            times[only_trained].append(loop.step(mbs, only_trained))
    trained = sum(mb.num_trained for mb in mbs)
    tokens = sum(mb.num_tokens for mb in mbs)
    best = {k: min(v[1:]) for k, v in times.items()}
    return {
        "trained_tokens": trained,
        "tokens": tokens,
        "trained_only_s": round(best[True], 3),
        "every_position_s": round(best[False], 3),
        "speedup": round(best[False] / best[True], 3),
    }


LORA = ["+policies.a.lora.rank=16", "+policies.b.lora.rank=16"]
SMALL = ["engine.kv_cache_gb=0.5", "learner.num_cpus=0.5"]


def d_overrides(model_name: str) -> list[str]:
    """Section d's two trained policies, a and b (full weights; LoRA adds LORA)."""
    return [
        f"model={model_name}",
        "harness=solver_verifier",
        "agents.solver=a",
        "agents.verifier=b",
        "+policies.a.trainable=true",
        "+policies.b.trainable=true",
        *SMALL,
        "learner.world_size=1",
        "learner.zero_stage=0",
    ]


def section_d(
    model_name: str,
    fmt,
    vocab: int,
    budget: int,
    rounds: int,
    full_learners: dict[str, LearnerGroup] | None = None,
    full_fleet: RolloutFleet | None = None,
) -> dict:
    """The loop's own pieces, LoRA against full weights, the same model and settings.
    `full_learners`, `full_fleet` (--quick): the full policies' learner groups by policy and their
    fleet (section c's), else they start their own."""
    base = d_overrides(model_name)
    rng = random.Random(0)
    _, mbs = batches_for([conversation_trace(fmt, vocab, 1, 96, 0, rng, f"t{i}") for i in range(4)], True, budget)
    out = {}
    for kind, extra in (("full", []), ("lora", LORA)):
        cfg = compose("train", base + extra)
        with full_fleet if kind == "full" and full_fleet else RolloutFleet(cfg) as fleet, ExitStack() as stack:
            started = full_learners if kind == "full" else None
            policies = trained_policies(cfg, fleet, stack, started)  # two LoRA policies share one base
            a = policies["a"]
            for policy in policies.values():
                policy.learners.train_step(mbs)  # optimizer state exists from here on
            ranks = {r._actor_id: r for p in policies.values() for r in p.learners.ranks}
            rss = sum(ray.get([r.rss.remote() for r in ranks.values()], timeout=60))
            syncs = [a.sync.push(v) for v in range(1, rounds + 1)]
            best = min(syncs, key=lambda r: r["seconds"])
            out[kind] = {
                "engines": len(fleet.pools),
                "learner_ranks": len(ranks),
                "sync_bytes": int(best["bytes"]),
                "sync_s": round(best["seconds"], 3),
                "engine_load_s": round(best["load_seconds"], 3),
                "learners_rss_gb": round(rss / 2**30, 2),
            }
        print(model_name, "d", kind, out[kind], flush=True)
    f, lo = out["full"], out["lora"]
    out["sync_bytes_full_over_lora"] = round(f["sync_bytes"] / lo["sync_bytes"], 1)
    out["sync_s_full_over_lora"] = round(f["sync_s"] / lo["sync_s"], 2)
    out["learners_rss_full_over_lora"] = round(f["learners_rss_gb"] / lo["learners_rss_gb"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2_135m")
    ap.add_argument("--sections", default="a,b,c,d")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--budget", type=int, default=1024, help="padded tokens per micro-batch")
    ap.add_argument("--rounds", type=int, default=3, help="weight syncs per method (c, d)")
    ap.add_argument("--quick", action="store_true", help="tiny, sections a-e, 2 rows, one step and sync each")
    args = ap.parse_args()
    if args.quick:
        args.models, args.sections, args.rows, args.steps, args.rounds = "tiny", "a,b,c,d,e", 2, 1, 1
    torch.manual_seed(0)
    start_ray(RayConfig(num_cpus=8 if args.quick else 4))  # --quick: a's kept groups hold 3 CPUs through d
    result = {"bench": "learner", "quick": args.quick}
    kept = ExitStack()  # --quick: section a's learner groups, for c and d
    groups: dict[str, LearnerGroup] = {}
    fleet = None  # --quick: section c's fleet, for d
    for name in args.models.split(","):
        path = resolve_model(name)
        fmt = ChatFormat.from_pretrained(path)
        vocab = fmt.vocab_size
        res = {}
        if "a" in args.sections:
            a, groups = section_a(path, fmt, vocab, args.rows, args.steps, args.budget, kept if args.quick else None)
            res.update(a)
            print(name, "a", res["a_throughput"], res["a_throughput_ws1"], flush=True)
        if "b" in args.sections:
            res["b_merging"] = section_b(path, fmt, vocab, args.budget, args.quick)
            print(name, "b", res["b_merging"], flush=True)
        if "c" in args.sections:
            ws1 = groups.get("a_throughput_ws1")
            res["c_weight_sync"], fleet = section_c(name, args.rounds, ws1, kept if ws1 else None)
            print(name, "c", res["c_weight_sync"], flush=True)
        if "d" in args.sections:
            # two groups for two policies: a rank hosts one weight group to the engines at a time
            full = {"a": groups["a_throughput_ws1"], "b": groups["a_throughput"]} if len(groups) == 2 else None
            res["d_lora"] = section_d(name, fmt, vocab, args.budget, args.rounds, full, fleet)
        if "e" in args.sections:
            res["e_loss_positions"] = section_e(path, fmt, vocab, 4 if args.quick else 32, args.steps, 2048)
            print(name, "e", res["e_loss_positions"], flush=True)
        result[name] = res
        kept.close()
        groups, fleet = {}, None
    ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
