"""Checkpoints: per trained policy an HF-format folder (loadable by vLLM and transformers) and
its DeepSpeed state, and the loop's position.

    run_dir/checkpoints/step_000100/
        <policy>/hf/         config.json, tokenizer files, model.safetensors  (the policy)
        <policy>/adapter/    instead of hf/ for a LoRA policy: adapter_config.json and
                             adapter_model.safetensors (loads with peft and vLLM's LoRA loader)
        <policy>/deepspeed/  DeepSpeed's own model / optimizer / scheduler state (resume)
        rollouts.jsonl       an async run's rollouts of the steps after this one, generated
                             before the save (one group per line); a resumed run trains them
        trainer_state.json   the step and each policy's weight version

A checkpoint is written into `step_000100.partial/` and renamed to `step_000100/`
once every policy and trainer_state.json are in it: a run killed mid-write leaves
only a `.partial` folder, which is never resumed from (and removed by the next
save). `load_newest` falls back to the previous complete checkpoint when the
newest cannot be loaded; `prune` keeps the newest `keep_last`.

No RNG state is kept: tasks come from the step number, and every model call
samples with a seed derived from (seed, trace id, role, call number). What an
asynchronous run had in flight at the save cannot be generated again (it ran on
older weights than the checkpoint's), so the loop lets it finish and keeps it in
rollouts.jsonl: the resumed run trains exactly what the uninterrupted one did.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable

import msgspec
from safetensors.torch import load, save_file

from rollout.trace import Trace, TraceError
from trainer.learner_group import LearnerGroup

HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")


def step_dir(run_dir: str | Path, step: int) -> Path:
    """The complete checkpoint folder of `step`."""
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def partial_dir(run_dir: str | Path, step: int) -> Path:
    """Where step `step`'s checkpoint is written until `finish` renames it to `step_dir`."""
    return step_dir(run_dir, step).with_suffix(".partial")


def start(run_dir: str | Path, step: int) -> None:
    """Begin step `step`'s checkpoint: an empty `.partial` folder (a leftover of a killed save is removed)."""
    d = partial_dir(run_dir, step)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)


def save_rollouts(run_dir: str | Path, step: int, groups: list[list[Trace]]) -> None:
    """Keep complete rollout groups of the steps after `step` with its checkpoint (one group per line)."""
    with open(partial_dir(run_dir, step) / "rollouts.jsonl", "wb") as f:
        for group in groups:
            f.write(msgspec.json.encode(group) + b"\n")


def load_rollouts(checkpoint: Path) -> list[list[Trace]]:
    """The rollout groups `save_rollouts` kept with `checkpoint` ([] without any); a damaged line
    raises TraceError naming it."""
    path, decoder = Path(checkpoint) / "rollouts.jsonl", msgspec.json.Decoder(list[Trace])
    if not path.exists():
        return []
    groups = []
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            groups.append(decoder.decode(line))
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise TraceError(f"{path}:{lineno}: {e}") from None
    return groups


def save_hf(learners: LearnerGroup, base_model: str | Path, out: str | Path) -> Path:
    """Write the learners' current weights as an HF model folder (config/tokenizer from `base_model`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    [buckets] = learners.collect("export_weights", [learners.export_weights()])
    for bucket in buckets:
        state.update(load(bucket))
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    for name in HF_FILES:
        src = Path(base_model) / name
        if src.exists():
            shutil.copy(src, out / name)
    return out


def save_adapter(learners: LearnerGroup, base_model: str | Path, out: str | Path) -> Path:
    """Write a LoRA policy's adapter as a PEFT folder (its base: `base_model`)."""
    from rollout.lora import write_adapter

    [buckets] = learners.collect("export_weights", [learners.export_weights()])
    write_adapter(out, learners.lora, str(base_model), buckets)
    return Path(out)


def save_policy(learners: LearnerGroup, base_model: str | Path, run_dir: str | Path, step: int, policy: str) -> Path:
    """Save both views of one policy's weights into step `step`'s checkpoint (after `start`)."""
    d = partial_dir(run_dir, step) / policy
    if learners.lora is not None:
        save_adapter(learners, base_model, d / "adapter")
    else:
        save_hf(learners, base_model, d / "hf")
    learners.save(str(d / "deepspeed"))
    return d


def finish(run_dir: str | Path, step: int, versions: dict[str, int]) -> Path:
    """Complete step `step`'s checkpoint (after save_policy of each policy): trainer_state.json with
    each policy's weight version, then the rename that makes it visible to `complete`."""
    partial, done = partial_dir(run_dir, step), step_dir(run_dir, step)
    (partial / "trainer_state.json").write_text(json.dumps({"step": step, "versions": versions}))
    if done.exists():  # the same step saved again (a resumed run): the new one replaces it
        shutil.rmtree(done)
    partial.rename(done)
    return done


_COMPLETE = re.compile(r"step_\d+")


def complete(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run, oldest first."""
    return sorted(p for p in (Path(run_dir) / "checkpoints").glob("step_*")
                  if _COMPLETE.fullmatch(p.name) and (p / "trainer_state.json").exists())


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    done = complete(run_dir)
    return done[-1] if done else None


def load_newest(run_dir: str | Path, load: Callable[[Path, dict], None]) -> tuple[Path, dict]:
    """Call `load(folder, trainer_state)` on the newest complete checkpoint of `run_dir`; if it
    raises (a file truncated or corrupted after the save), on the one before, and so on. Returns
    the folder and state that loaded; raises FileNotFoundError without any, or the newest's error
    if none loads."""
    candidates = complete(run_dir)[::-1]
    if not candidates:
        raise FileNotFoundError(f"trainer.resume: no complete checkpoint under {run_dir}/checkpoints")
    first_error = None
    for d in candidates:
        state = json.loads((d / "trainer_state.json").read_text())
        try:
            load(d, state)
            return d, state
        except Exception as e:
            first_error = first_error or e
            print(f"[train] checkpoint {d} cannot be loaded ({type(e).__name__}: {e}); trying the one before",
                  flush=True)
    raise RuntimeError(f"trainer.resume: none of the {len(candidates)} complete checkpoints under "
                       f"{run_dir}/checkpoints loads; the newest failed with: {first_error}") from first_error


def prune(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints; returns the deleted folders."""
    old = complete(run_dir)[:-keep_last] if keep_last > 0 else []
    for d in old:
        shutil.rmtree(d)
    return old


def restore_policy(learners: LearnerGroup, checkpoint: Path, policy: str) -> None:
    """Load `policy`'s DeepSpeed state from a checkpoint folder into its learners."""
    if not (checkpoint / policy / "deepspeed").exists():
        saved = sorted(p.name for p in checkpoint.iterdir() if p.is_dir())
        raise FileNotFoundError(f"trainer.resume: {checkpoint} holds policies {saved}, not {policy!r}")
    learners.load(str(checkpoint / policy / "deepspeed"))
