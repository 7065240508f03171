"""Checkpoints: per trained policy an HF-format folder (loadable by vLLM and transformers) and
its DeepSpeed state, and the loop's position.

    run_dir/checkpoints/step_000100/
        <policy>/hf/         config.json, tokenizer files, model.safetensors (or shards
                             and their index: trainer/hf_folder.py), written by learner rank 0
        <policy>/adapter/    instead of hf/ for a LoRA policy: adapter_config.json and
                             adapter_model.safetensors (loads with peft and vLLM's LoRA loader)
        <policy>/deepspeed/  DeepSpeed's own model / optimizer / scheduler state (resume)
        rollouts.jsonl       an async run's rollouts of the steps after this one, generated
                             before the save (one group per line); a resumed run trains them
        trainer_state.json   the step, each policy's weight version, the run's ledger
                             (trainer/ledger.py)

A checkpoint is written into `step_000100.partial/` and renamed to `step_000100/`
once every policy and trainer_state.json are in it, each file and folder fsynced
before the rename and the parent after it (a node that goes down right after a
save keeps it whole): a run killed mid-write leaves only a `.partial` folder,
which is never resumed from (and removed by the next save, whatever its step).
`load_newest` falls back to the previous complete checkpoint when the newest
cannot be loaded (a damaged trainer_state.json included); `prune` keeps the
newest `keep_last` by step number, never the step just written.

Trust: DeepSpeed's state files are pickles. Every one a resume reads goes through
`load_torch` (trainer/torch_load.py: torch's weights-only unpickler, which allows tensors, builtins and
the few plain data classes DeepSpeed's files hold), so a file that holds anything
else is refused rather than run. The HF and adapter weights are safetensors.
Still, resume only from checkpoints you wrote: a forged one can hold any weights.

No RNG state is kept: tasks come from the step number, and every model call
samples with a seed derived from (seed, trace id, role, call number). What an
asynchronous run had in flight at the save cannot be generated again (it ran on
older weights than the checkpoint's), so the loop lets it finish and keeps it in
rollouts.jsonl: the resumed run trains exactly what the uninterrupted one did.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from rollout.trace import Trace, TraceError
from trainer import hf_folder
from trainer.learner_group import LearnerGroup

log = logging.getLogger(__name__)


def step_dir(run_dir: str | Path, step: int) -> Path:
    """The complete checkpoint folder of `step`."""
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def partial_dir(run_dir: str | Path, step: int) -> Path:
    """Where step `step`'s checkpoint is written until `finish` renames it to `step_dir`."""
    return step_dir(run_dir, step).with_suffix(".partial")


def start(run_dir: str | Path, step: int) -> None:
    """Begin step `step`'s checkpoint: an empty `.partial` folder (the leftovers of killed saves,
    of any step, are removed)."""
    for stale in (Path(run_dir) / "checkpoints").glob("step_*.partial"):
        shutil.rmtree(stale, ignore_errors=True)
    d = partial_dir(run_dir, step)
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


def save_hf(
    learners: LearnerGroup, base_model: str | Path, out: str | Path, shard_bytes: int = hf_folder.SHARD_BYTES
) -> Path:
    """Write the learners' current weights, in the model's dtype, as an HF model folder (config and
    tokenizer from `base_model`). Learner rank 0 writes it, shard by shard (trainer/hf_folder.py):
    neither the driver nor rank 0 ever holds the whole model. So `out` must be on storage that rank
    0 can write and the driver can see, as DeepSpeed's own save already assumes of every rank (and
    `finish` of the driver, which renames the checkpoint folder)."""
    learners.write_hf(str(out), str(base_model), shard_bytes)
    return Path(out)


def save_adapter(learners: LearnerGroup, base_model: str | Path, out: str | Path) -> Path:
    """Write a LoRA policy's adapter as a PEFT folder (its base: `base_model`)."""
    from rollout.engine.lora_names import write_adapter

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


def finish(run_dir: str | Path, step: int, versions: dict[str, int], extra: dict[str, Any] | None = None) -> Path:
    """Complete step `step`'s checkpoint (after save_policy of each policy): trainer_state.json with
    each policy's weight version (and `extra`: the loop's ledger), every file on disk, then the
    rename that makes it visible to `complete`."""
    partial, done = partial_dir(run_dir, step), step_dir(run_dir, step)
    state = {"step": step, "versions": versions, **(extra or {})}
    (partial / "trainer_state.json").write_text(json.dumps(state))
    # the rename must not reach the disk before the files do: a crash would leave a "complete"
    # checkpoint of empty or torn files
    fsync_tree(partial)
    if done.exists():  # the same step saved again (a resumed run): the new one replaces it
        shutil.rmtree(done)
    partial.rename(done)
    fsync_path(done.parent)  # the rename itself
    return done


def fsync_path(path: Path) -> None:
    """Flush one file's or folder's (its entries') writes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under `root`, and `root` itself."""
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))


_COMPLETE = re.compile(r"step_(\d+)")


def step_of(checkpoint: Path) -> int:
    """The step in a checkpoint folder's name (step_000100 -> 100)."""
    return int(_COMPLETE.fullmatch(checkpoint.name).group(1))


def complete(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run, oldest first (by step: past step 999999 the names no
    longer sort)."""
    return sorted(
        (
            p
            for p in (Path(run_dir) / "checkpoints").glob("step_*")
            if _COMPLETE.fullmatch(p.name) and (p / "trainer_state.json").exists()
        ),
        key=step_of,
    )


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
        try:
            state = read_state(d)
            load(d, state)
            return d, state
        except Exception as e:
            first_error = first_error or e
            log.warning(f"[train] checkpoint {d} cannot be loaded ({type(e).__name__}: {e}); trying the one before")
    raise RuntimeError(
        f"trainer.resume: none of the {len(candidates)} complete checkpoints under "
        f"{run_dir}/checkpoints loads; the newest failed with: {first_error}"
    ) from first_error


def read_state(checkpoint: Path) -> dict:
    """A checkpoint's trainer_state.json; ValueError naming the file if it is damaged."""
    path = Path(checkpoint) / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
        if isinstance(state, dict) and isinstance(state.get("step"), int):
            return state
        problem = "no integer step"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problem = f"{type(e).__name__}: {e}"
    raise ValueError(f"{path} is damaged ({problem})")


def newest_state(run_dir: str | Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint whose trainer_state.json reads, and that state (older ones
    are tried when it is damaged, as `load_newest` does); None without any."""
    for d in complete(run_dir)[::-1]:
        try:
            return d, read_state(d)
        except ValueError as e:
            log.warning(f"[train] {e}; trying the checkpoint before")
    return None


def prune(run_dir: str | Path, keep_last: int, step: int) -> list[Path]:
    """After the save of `step`: keep it and the newest `keep_last - 1` complete checkpoints before
    it, delete the others; returns the deleted folders. Checkpoints after `step` are deleted too:
    they are the newer ones a resume fell back from (they did not load), and kept, they would rank
    above every new save and push it out."""
    done = complete(run_dir)
    assert step_dir(run_dir, step) in done, f"prune after the save of step {step}, not before"
    before = [d for d in done if step_of(d) < step]
    after = [d for d in done if step_of(d) > step]
    for d in after:
        log.warning(f"[train] deleting {d}: newer than step {step} just saved, it is one a resume fell back past")
    old = before[: max(len(before) - (keep_last - 1), 0)] + after
    for d in old:
        shutil.rmtree(d)
    return old


def restore_policy(learners: LearnerGroup, checkpoint: Path, policy: str) -> None:
    """Load `policy`'s DeepSpeed state from a checkpoint folder into its learners."""
    if not (checkpoint / policy / "deepspeed").exists():
        saved = sorted(p.name for p in checkpoint.iterdir() if p.is_dir())
        raise FileNotFoundError(f"trainer.resume: {checkpoint} holds policies {saved}, not {policy!r}")
    learners.load(str(checkpoint / policy / "deepspeed"))
