"""Checkpoints: per trained policy an HF-format folder (loadable by vLLM and transformers) and
its DeepSpeed state, and the loop's position.

    run_dir/checkpoints/step_000100/
        <policy>/hf/         config.json, tokenizer files, model.safetensors  (the policy)
        <policy>/deepspeed/  DeepSpeed's own model / optimizer / scheduler state (resume)
        trainer_state.json   the step and each policy's weight version; written last, so a
                             checkpoint without it is incomplete and never resumed from

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


def save_policy(learners: LearnerGroup, base_model: str | Path, run_dir: str | Path, step: int, policy: str) -> Path:
    """Save both views of one policy's weights into step `step`'s checkpoint; returns its folder."""
    d = step_dir(run_dir, step) / policy
    save_hf(learners, base_model, d / "hf")
    learners.save(str(d / "deepspeed"))
    return d


def finish(run_dir: str | Path, step: int, versions: dict[str, int]) -> Path:
    """Mark step `step`'s checkpoint complete, with each policy's weight version (after save_policy of each)."""
    d = step_dir(run_dir, step)
    (d / "trainer_state.json").write_text(json.dumps({"step": step, "versions": versions}))
    return d


def newest_state(run_dir: str | Path) -> tuple[Path, dict]:
    """The newest complete checkpoint of `run_dir`: its folder and {step, versions}."""
    d = latest(run_dir)
    if d is None:
        raise FileNotFoundError(f"trainer.resume={str(run_dir)!r}: no checkpoint under {run_dir}/checkpoints")
    return d, json.loads((d / "trainer_state.json").read_text())


def restore_policy(learners: LearnerGroup, checkpoint: Path, policy: str) -> None:
    """Load `policy`'s DeepSpeed state from a checkpoint folder into its learners."""
    if not (checkpoint / policy / "deepspeed").exists():
        saved = sorted(p.name for p in checkpoint.iterdir() if p.is_dir())
        raise FileNotFoundError(f"trainer.resume: {checkpoint} holds policies {saved}, not {policy!r}")
    learners.load(str(checkpoint / policy / "deepspeed"))


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / "trainer_state.json").exists())
    return done[-1] if done else None
