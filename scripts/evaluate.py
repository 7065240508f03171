"""Evaluate a model on a run's held-out items, outside training, paired against a reference model.

    python scripts/evaluate.py experiment=smollm2_solver_verifier \
        --model runs/smollm2_solver_verifier --reference smollm2_135m --out runs/eval/solver.json
    python scripts/evaluate.py task=file task.params.path=my.jsonl --model my/hf_folder --k 4

Hydra overrides (the words with `=`) compose conf/train.yaml exactly as scripts/train.py does,
so the same overrides give the same held-out items (task, eval.size), harness, agents,
sampling and engines as that run. `--model` (and `--reference`) replace the weights of the
run's trained policies: a built-in model (tiny, tiny_tied, smollm2_135m), an HF folder, a LoRA
adapter folder (on the base its adapter_config.json names, or --adapter-base), a checkpoint
folder (runs/X/checkpoints/step_000014: each policy's own weights) or a run dir (its newest
checkpoint). Frozen policies (a frozen verifier, an LLM judge) keep their config model, as in
training. Without `--model` the config's model is evaluated.

Greedy (eval.temperature) with `--k 1`; `--k K` runs `--samples` (default K) samples per item
at the run's sampling.temperature and reports unbiased pass@K (a run passes with reward >= 1).
Reports mean reward, pass@k, per-agent rewards, failed runs and their errors; with `--reference`
(the untrained model, say), the paired comparison by question (better / worse / sign-test p)
that training writes to summary.json as eval_paired, reference as "before" and model as "after".
Writes `--out` (JSON), the traces beside it (<out>.model.jsonl, <out>.reference.jsonl) and the
trace viewer's pages (<out>.model.html, ...). The last output line is a JSON summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from rollout.config import RolloutJobConfig, SamplingConfig
from rollout.log import setup_logging
from rollout.models import resolve_model
from rollout.orchestration.cluster import start_ray
from rollout.placement import pick_cluster, visible_gpus
from rollout.trace import Trace, write_jsonl
from rollout.viewer import build_view, load_decode, render_page
from trainer.checks import validate
from trainer.config import TrainJobConfig, compose
from trainer.evaluation import Weights, eval_sampling, evaluate_weights, report, weights_for, with_weights
from trainer.metrics import paired_comparison, write_atomic


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="hydra overrides of conf/train.yaml, e.g. experiment=smoke")
    parser.add_argument("--model", help="the weights to evaluate (default: the config's model)")
    parser.add_argument("--reference", help="weights to evaluate on the same items and compare with")
    parser.add_argument("--adapter-base", help="the base model of a LoRA adapter whose own config names none here")
    parser.add_argument("--k", type=int, default=1, help="pass@k; k > 1 samples at sampling.temperature")
    parser.add_argument("--samples", type=int, help="samples per item (default: k)")
    parser.add_argument("--out", type=Path, default=Path("eval.json"), help="the JSON report (default eval.json)")
    parser.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines")
    args = parser.parse_intermixed_args(argv)
    args.samples = args.samples or args.k
    if args.k < 1 or args.samples < args.k:
        parser.error(f"--k {args.k} --samples {args.samples}: need 1 <= k <= samples")
    if args.out.suffix != ".json":
        parser.error(f"--out {args.out}: a .json file (the traces and pages are written beside it)")
    bad = [o for o in args.overrides if "=" not in o and not o.startswith("~")]  # ~key: hydra's deletion
    if bad:
        parser.error(f"{bad[0]!r} is neither a flag nor a hydra override (key=value, ~key)")
    return args


def plan(args: argparse.Namespace) -> tuple[TrainJobConfig, dict[str, tuple[TrainJobConfig, dict[str, Weights]]]]:
    """The composed config, and per label (model, reference) its config with those weights, all
    validated: every error here comes before Ray starts."""
    extra, line = pick_cluster(args.overrides, visible_gpus(None), lambda overrides: compose("train", overrides))
    if line:
        print(line, flush=True)
    cfg = compose("train", extra + args.overrides)
    if cfg.eval.size < 1:
        raise ValueError("eval.size=0: nothing to evaluate; set eval.size (at most task.eval_size)")
    trained = cfg.trainable_policies()
    runs = {}
    for label, spec in (("model", args.model), ("reference", args.reference)):
        if label == "model" or spec is not None:
            weights = (
                weights_for(spec, trained, args.adapter_base, f"--{label}")
                if spec
                else {
                    p: Weights({}, source=f"config: {cfg.policy_model(p).path or cfg.policy_model(p).name}")
                    for p in trained
                }
            )
            runs[label] = (with_weights(cfg, weights), weights)
            validate(runs[label][0])
    return cfg, runs


def progress_line(label: str, total: int, t0: float):
    def show(done: int) -> None:
        print(f"[evaluate] {label}: {done}/{total} runs, {time.perf_counter() - t0:.0f} s", flush=True)

    return show


def write_traces(out: Path, label: str, traces: list[Trace], cfg: TrainJobConfig, subtitle: str) -> dict[str, str]:
    """<out>.<label>.jsonl and the trace viewer's page of them, <out>.<label>.html."""
    jsonl, page = out.with_suffix(f".{label}.jsonl"), out.with_suffix(f".{label}.html")
    write_jsonl(traces, jsonl)
    first = cfg.trainable_policies()[0]
    model = cfg.policy_model(first)
    decode = load_decode(resolve_model(model.name, model.path))
    page.write_text(
        render_page([build_view(t, decode) for t in traces], title=f"Evaluation: {label}", subtitle=subtitle),
        encoding="utf-8",
    )
    return {"traces": str(jsonl), "page": str(page)}


def evaluate_runs(
    args: argparse.Namespace,
    cfg: TrainJobConfig,
    runs: dict[str, tuple[TrainJobConfig, dict[str, Weights]]],
    sampling: SamplingConfig,
    result: dict,
) -> dict[str, list[Trace]]:
    """Each label's weights on the held-out items, its report into `result[label]` and its traces
    and pages beside `--out`; the traces by label. Ray is started for this and shut down after; a
    cluster this process already has (a caller's, a test session's) is used and stays up."""
    import ray

    traces: dict[str, list[Trace]] = {}
    model_cfg = runs["model"][0]  # engines only: no learners
    ours = not ray.is_initialized()
    start_ray(cfg.ray, RolloutJobConfig.cpus_asked(model_cfg), RolloutJobConfig.asks(model_cfg))
    try:
        for label, (run_cfg, weights) in runs.items():
            t0 = time.perf_counter()
            print(f"[evaluate] {label}: " + ", ".join(f"{p} <- {w.source}" for p, w in weights.items()), flush=True)
            traces[label] = evaluate_weights(
                run_cfg,
                weights,
                sampling,
                args.samples,
                progress_line(label, cfg.eval.size * args.samples, t0),
                args.progress_s,
            )
            rep = report(traces[label], weights, args.k, args.samples)
            result[label] = {
                **dataclasses.asdict(rep),
                "wall_s": round(time.perf_counter() - t0, 1),
                **write_traces(args.out, label, traces[label], run_cfg, f"{label}: {rep.source}"),
            }
            print(
                f"[evaluate] {label}: reward {rep.reward:.3f}, pass@{args.k} {rep.pass_at_k:.3f} on {rep.items} "
                f"items, {rep.failed} failed",
                flush=True,
            )
    finally:
        if ours:
            ray.shutdown()
    return traces


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        cfg, runs = plan(args)
    except (ValueError, FileNotFoundError, HydraException, OmegaConfBaseException) as e:  # a bad override or value
        print(f"evaluate: error: {e}", file=sys.stderr)
        sys.exit(2)
    sampling = eval_sampling(cfg, cfg.sampling.temperature if args.samples > 1 else None)
    result = {
        "items": cfg.eval.size,
        "task": cfg.task.name,
        "harness": cfg.harness.name,
        "k": args.k,
        "samples": args.samples,
        "temperature": sampling.temperature,
        "max_tokens": sampling.max_tokens,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    traces = evaluate_runs(args, cfg, runs, sampling, result)
    if "reference" in traces:  # as training's summary.json: the reference before, the model after
        result["eval_paired"] = paired_comparison(traces["reference"], traces["model"])
    write_atomic(args.out, json.dumps(result, indent=2, allow_nan=False))
    print(f"[evaluate] wrote {args.out}", flush=True)
    summary = {
        label: {
            "reward": result[label]["reward"],
            f"pass@{args.k}": result[label]["pass_at_k"],
            "failed": result[label]["failed"],
        }
        for label in traces
    }
    paired = {"eval_paired": result["eval_paired"]} if "eval_paired" in result else {}
    print(json.dumps({**summary, **paired, "out": str(args.out)}))


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
