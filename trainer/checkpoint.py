"""Checkpoints: an HF-format policy folder (loadable by vLLM and transformers) + DeepSpeed state.

    run_dir/checkpoints/step_000100/
        hf/                  config.json, tokenizer files, model.safetensors  (the policy)
        deepspeed/           DeepSpeed's own model / optimizer / scheduler state (resume)
        trainer_state.json   the loop's step and the policy's weight version

No RNG state is kept: tasks come from the step number, and every model call
samples with a seed derived from (seed, trace id, role, call number).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ray
from safetensors.torch import load, save_file

from trainer.learner_group import LearnerGroup

_HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")


def step_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def save_hf(learners: LearnerGroup, base_model: str | Path, out: str | Path) -> Path:
    """Write the learners' current weights as an HF model folder (config/tokenizer from `base_model`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for bucket in ray.get(learners.export_weights()):
        state.update(load(bucket))
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    for name in _HF_FILES:
        src = Path(base_model) / name
        if src.exists():
            shutil.copy(src, out / name)
    return out


def save(learners: LearnerGroup, base_model: str | Path, run_dir: str | Path, step: int, version: int) -> Path:
    """Save both views of the policy and the loop's position at `step`; returns the checkpoint folder."""
    d = step_dir(run_dir, step)
    save_hf(learners, base_model, d / "hf")
    learners.save(str(d / "deepspeed"))
    (d / "trainer_state.json").write_text(json.dumps({"step": step, "version": version}))
    return d


def restore(learners: LearnerGroup, run_dir: str | Path) -> dict[str, int]:
    """Load the newest checkpoint of `run_dir` into the learners; returns its {step, version}."""
    d = latest(run_dir)
    if d is None:
        raise FileNotFoundError(f"trainer.resume={str(run_dir)!r}: no checkpoint under {run_dir}/checkpoints")
    learners.load(str(d / "deepspeed"))
    return json.loads((d / "trainer_state.json").read_text())


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / "deepspeed").exists())
    return done[-1] if done else None
