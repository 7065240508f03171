"""Held-out evaluation of any weights on a run's config: what scripts/evaluate.py drives.

A training config says which held-out items (`task`, `eval.size`), harness, agents, sampling
and engines a run evaluates; `weights_for(spec, ...)` says what its trained policies are
evaluated with instead of their config model: a built-in model name, an HF folder, a LoRA
adapter folder on its base, a checkpoint folder (each policy's own weights from it) or a run
dir (its newest complete checkpoint). Frozen policies (a frozen verifier, an LLM judge) keep
their config model, as in training. `evaluate_weights` starts a fleet with those weights and
runs the held-out items as trainer/loop.py's `evaluate` does (the same tasks, trace ids and
sampling), `samples` times each.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollout.config import SamplingConfig
from rollout.models import BUILTIN_MODELS
from rollout.stats import agent_means, trace_metrics
from rollout.trace import Trace
from trainer import checkpoint
from trainer.config import TrainJobConfig


@dataclass
class Weights:
    """What one trained policy is evaluated with."""

    model: dict  # policies.<policy>.model: {"name": built-in} or {"path": HF folder}; {}: the config's
    lora: dict | None = None  # policies.<policy>.lora: an adapter's rank, alpha and target modules
    adapter: Path | None = None  # the adapter folder pushed into the engines once they are up
    source: str = ""  # where the weights come from, for the report


def eval_sampling(cfg: TrainJobConfig, temperature: float | None = None) -> SamplingConfig:
    """The sampling of the held-out eval: eval.temperature (greedy by default), or `temperature`,
    and eval.max_tokens (else sampling.max_tokens)."""
    e = cfg.eval
    return SamplingConfig(
        temperature=e.temperature if temperature is None else temperature,
        max_tokens=e.max_tokens or cfg.sampling.max_tokens,
    )


# ---- which weights ----------------------------------------------------------------------------


def weights_for(
    spec: str, policies: list[str], adapter_base: str | None = None, flag: str = "--model"
) -> dict[str, Weights]:
    """The weights each trained policy in `policies` is evaluated with, from `spec` (see the module
    docstring); ValueError naming `flag` and the fix for anything missing."""
    if spec in BUILTIN_MODELS:
        return {p: Weights({"name": spec}, source=spec) for p in policies}
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{flag} {spec}: no such folder, and not a built-in model ({', '.join(BUILTIN_MODELS)})")
    if (folder / "checkpoints").is_dir() and not (folder / "config.json").exists():
        newest = checkpoint.latest(folder)
        if newest is None:
            raise ValueError(
                f"{flag} {spec}: a run dir without a complete checkpoint (checkpoints/step_*/ with a "
                f"trainer_state.json); give a checkpoint folder or an HF folder"
            )
        folder = newest
    if (folder / "trainer_state.json").exists():
        held = sorted(p.name for p in folder.iterdir() if p.is_dir())
        weights = {}
        for p in policies:
            own = next((folder / p / kind for kind in ("hf", "adapter") if (folder / p / kind).is_dir()), None)
            if own is None:
                raise ValueError(
                    f"{flag} {spec}: checkpoint {folder.name} has no weights of trained policy {p!r} "
                    f"({p}/hf or {p}/adapter; it holds {held})"
                )
            [weights[p]] = weights_for(str(own), [p], adapter_base, flag).values()
        return weights
    if (folder / "adapter_config.json").exists():
        return {p: adapter_weights(folder, adapter_base, flag) for p in policies}
    if (folder / "config.json").exists():
        return {p: Weights({"path": str(folder)}, source=str(folder)) for p in policies}
    raise ValueError(
        f"{flag} {spec}: the folder holds no config.json (an HF model), adapter_config.json (a LoRA "
        f"adapter), trainer_state.json (a checkpoint) or checkpoints/ (a run dir)"
    )


def adapter_weights(folder: Path, base: str | None, flag: str) -> Weights:
    """A PEFT adapter folder on its base model: `base` if given, else the base its
    adapter_config.json names, which must be here."""
    conf = json.loads((folder / "adapter_config.json").read_text())
    if not (folder / "adapter_model.safetensors").exists():
        raise ValueError(f"{flag} {folder}: a LoRA adapter folder without adapter_model.safetensors")
    base = base or conf.get("base_model_name_or_path")
    if base is None or not (base in BUILTIN_MODELS or (Path(base).expanduser() / "config.json").exists()):
        raise ValueError(
            f"{flag} {folder} is a LoRA adapter on base model {base!r}, which is not here: give its "
            f"base with --adapter-base (a built-in model, {', '.join(BUILTIN_MODELS)}, or an HF folder)"
        )
    lora = {
        "rank": int(conf["r"]),
        "alpha": float(conf["lora_alpha"]),
        "target_modules": sorted(conf["target_modules"]),
    }
    model = {"name": base} if base in BUILTIN_MODELS else {"path": str(Path(base).expanduser())}
    return Weights(model, lora, folder, source=f"{folder} on {base}")


def with_weights(cfg: TrainJobConfig, weights: dict[str, Weights]) -> TrainJobConfig:
    """A copy of `cfg` whose trained policies serve `weights` (frozen ones keep their model)."""
    cfg = copy.deepcopy(cfg)
    for p, w in weights.items():
        own = dict(cfg.policies.get(p) or {})
        if w.model and not (w.adapter is not None and _same_folder(w.model, cfg.policy_model(p))):
            # (an adapter on the config's own model keeps it: its engines stay shared as in training)
            own["model"] = {**dict(own.get("model") or {}), **w.model}
            own["model"].pop("path" if "name" in w.model else "name", None)
        if w.lora is not None:
            own["lora"] = w.lora
        cfg.policies[p] = own
    return cfg


def _same_folder(model: dict, configured) -> bool:
    """Whether `model` (policies.<p>.model overrides) is the model folder `configured` resolves to."""
    from rollout.models import resolve_model

    if "path" not in model:
        return model.get("name") == configured.name and configured.path is None
    return Path(model["path"]).resolve() == Path(resolve_model(configured.name, configured.path)).resolve()


# ---- running it ---------------------------------------------------------------------------------


def evaluate_weights(
    cfg: TrainJobConfig,
    weights: dict[str, Weights],
    sampling: SamplingConfig,
    samples: int,
    progress: Callable[[int], None] | None = None,
    progress_s: float = 10.0,
) -> list[Trace]:
    """Start a rollout fleet for `cfg` (already with_weights), push any adapters, and run the
    first eval.size held-out tasks `samples` times each. Ray must be up."""
    import ray

    from rollout.orchestration.fleet import RolloutFleet

    with RolloutFleet(cfg) as fleet:
        for p, w in weights.items():
            if w.adapter is not None:  # an adapter is its base until its weights are pushed
                ref = ray.put([(w.adapter / "adapter_model.safetensors").read_bytes()])
                ray.get(fleet.stores[p].publish.remote(1, [ref]), timeout=60)  # a restarted engine loads it too
                ray.get(
                    [e.update_weights.remote(1, ref, p) for e in fleet.engines[p]],
                    timeout=cfg.policy_engine(p).sync_timeout_s,
                )
        return fleet.evaluate(cfg.eval.size, sampling, cfg.eval.timeout_s, samples, progress, progress_s)


# ---- what it says ------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c passed (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code"): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class Report:
    """One model's held-out results."""

    source: dict[str, str]  # trained policy -> where its weights came from
    reward: float  # mean over every run
    pass_at_k: float  # mean over items of pass@k (a run passes with reward >= 1)
    k: int
    samples: int  # runs per item
    items: int
    agent_rewards: dict[str, float]  # mean per-agent reward, for harnesses that give them
    failed: int  # runs that failed (an error, not a wrong answer)
    failures: dict[str, int]  # their commonest errors (first line) -> count
    scoring_notes: int  # runs whose info["scoring"] says an answer or verdict was refused
    metrics: dict[str, float] = field(default_factory=dict)  # rollout/stats.py trace_metrics, eval/*


def report(traces: list[Trace], weights: dict[str, Weights], k: int, samples: int) -> Report:
    by_item: dict[str, list[Trace]] = defaultdict(list)
    for t in traces:
        by_item[t.group].append(t)
    passes = [
        pass_at_k(len(ts), sum(t.status != "failed" and t.reward >= 1.0 for t in ts), k) for ts in by_item.values()
    ]
    errors = Counter(
        (t.error or "no error recorded").strip().splitlines()[0][:300] for t in traces if t.status == "failed"
    )
    return Report(
        source={p: w.source for p, w in weights.items()},
        reward=sum(t.reward for t in traces) / len(traces),
        pass_at_k=sum(passes) / len(passes),
        k=k,
        samples=samples,
        items=len(by_item),
        agent_rewards=agent_means(traces),
        failed=sum(errors.values()),
        failures=dict(errors.most_common(5)),
        scoring_notes=sum("scoring" in t.info for t in traces),
        metrics=trace_metrics(traces, "eval"),
    )
