"""A run's folder: what a previous run left in it, whether this run may start there (resume,
overwrite), setting it up, and its checkpoints of every trained policy with the rollouts in
flight (`save`, `restore`). trainer/loop.py calls `check_run_dir` before Ray starts,
`start_run_dir` as the run begins, `restore` to resume and `save` every trainer.save_every steps."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from rollout.faultpoints import FaultPointFired, fires
from trainer import checkpoint
from trainer.config import LoopConfig, TrainJobConfig
from trainer.ledger import Ledger

if TYPE_CHECKING:  # annotations only: checking a run_dir needs neither Ray nor torch
    from rollout.orchestration.fleet import RolloutFleet
    from rollout.trace import Trace
    from trainer.policy import TrainedPolicy

log = logging.getLogger(__name__)


def check_run_dir(cfg: TrainJobConfig) -> None:
    """Refuse, before anything starts, a run_dir that holds a previous run unless the config says
    what to do with it (trainer.resume or trainer.overwrite), a resume without a checkpoint, and a
    resume with nothing left to train (but one that only lacks its summary: a run killed after its
    last checkpoint). Raises ValueError naming the keys."""
    t, run_dir, source = cfg.trainer, Path(cfg.run_dir), resume_source(cfg)
    newest = checkpoint.latest(source) if source else None
    if t.resume and t.resume != "auto" and newest is None:
        raise ValueError(
            f"trainer.resume={t.resume!r}: no complete checkpoint under {source}/checkpoints "
            f"(trainer.resume=auto starts afresh when there is none)"
        )
    continues_here = newest is not None and source.resolve() == run_dir.resolve()
    if previous_run(run_dir) and not (continues_here or t.overwrite or t.resume == "auto"):
        raise ValueError(
            f"run_dir={str(run_dir)!r} holds a previous run ({', '.join(previous_run(run_dir))}): "
            f"continue it with trainer.resume=auto, start afresh with trainer.overwrite=true "
            f"(deletes its outputs), or choose another run_dir"
        )
    # past a damaged trainer_state.json, as the resume itself falls back
    newest, state = (checkpoint.newest_state(source) if newest else None) or (None, {"step": -1})
    # a run killed after its last checkpoint, before its summary, is finished by its resume (a job's
    # retry must not fail for it); one that has its summary, or a checkpoint past trainer.steps, is not
    unfinished = continues_here and state["step"] == t.steps and not (run_dir / "summary.json").exists()
    if state["step"] >= t.steps and not unfinished:
        raise ValueError(
            f"trainer.resume={t.resume!r}: {newest} is at step {state['step']} of "
            f"trainer.steps={t.steps}: nothing left to train; raise trainer.steps, or start afresh "
            f"with trainer.overwrite=true and without trainer.resume"
        )


def resume_source(cfg: TrainJobConfig) -> Path | None:
    """The run dir trainer.resume names (run_dir itself for `auto`), or None."""
    t = cfg.trainer
    return Path(cfg.run_dir) if t.resume == "auto" else Path(t.resume) if t.resume else None


RUN_OUTPUTS = ("checkpoints", "eval", "rollouts", "metrics.jsonl", "summary.json")


def previous_run(run_dir: Path) -> list[str]:
    """The outputs of a previous run in `run_dir` (empty for a fresh or never-started one)."""
    return [name for name in RUN_OUTPUTS if (run_dir / name).exists()]


def start_run_dir(cfg: TrainJobConfig) -> tuple[Path, Path | None]:
    """Create run_dir (deleting a previous run's outputs unless resuming from it) and record the
    resolved config in it (config.yaml). Returns run_dir and the run dir to resume from (or None)."""
    run_dir, source = Path(cfg.run_dir), resume_source(cfg)
    resume_from = source if source and checkpoint.latest(source) else None
    if resume_from is None or resume_from.resolve() != run_dir.resolve():
        for name in previous_run(run_dir):
            log.warning(
                f"[train] deleting {run_dir / name} of the previous run (trainer.overwrite / resume=auto "
                f"without a checkpoint)"
            )
            if (run_dir / name).is_dir():
                shutil.rmtree(run_dir / name)
            else:
                (run_dir / name).unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return run_dir, resume_from


def save(
    policies: dict[str, TrainedPolicy],
    fleet: RolloutFleet,
    run_dir: Path,
    step: int,
    ahead: int,
    held: list[list[Trace]],
    loop: LoopConfig,
    ledger: Ledger,
) -> list[list[Trace]]:
    """One checkpoint of every trained policy at `step`, with the rollout groups of the steps
    after it and the ledger, visible only once all are written; then only the newest `keep_last`
    are kept. Returns those groups: the ones `held`, and the steps in flight (up to `ahead`), let finish."""
    # the steps in flight ran (partly) on weights older than the checkpoint's: they finish and
    # are kept with it, since a resumed run could not generate them again
    in_flight = (ahead - step) * loop.groups_per_step - len(held)
    held = held + (fleet.take(in_flight, loop.rollout_timeout_s) if in_flight else [])
    checkpoint.start(run_dir, step)
    for policy in policies.values():
        policy.save(run_dir, step)
    checkpoint.save_rollouts(run_dir, step, held)
    versions = {p: policy.version for p, policy in policies.items()}
    checkpoint.finish(run_dir, step, versions, {"ledger": ledger.state()})
    checkpoint.prune(run_dir, loop.keep_last, step)
    if fires("driver_dies_after_save"):  # rollout/faultpoints.py
        raise FaultPointFired(f"driver_dies_after_save: after the checkpoint of step {step}")
    return held


def restore(
    policies: dict[str, TrainedPolicy], run_dir: Path, loop: LoopConfig
) -> tuple[int, list[list[Trace]], Ledger]:
    """Every trained policy from the newest checkpoint of `run_dir` that loads (the one before
    if the newest is damaged); returns its step, the rollout groups kept with it (whole steps
    of `loop.groups_per_step`, else ValueError) and the run's ledger as it was then (a checkpoint
    of an older tracerl has none: the groups kept are its open slots)."""
    held = []

    def load(ckpt: Path, state: dict) -> None:
        if "versions" not in state:
            raise ValueError(
                f"{ckpt} is in the one-policy layout of older tracerl versions (hf/ and deepspeed/ "
                f"at its top); move them into {ckpt}/main/ and write "
                f'"versions": {{"main": {state.get("version")}}} into its trainer_state.json'
            )
        missing = sorted(set(policies) - set(state["versions"]))
        if missing:
            raise ValueError(f"{ckpt.name} has no policies {missing} (it holds {sorted(state['versions'])})")
        held[:] = checkpoint.load_rollouts(ckpt)
        for p, policy in policies.items():
            policy.restore(ckpt, state["versions"][p])

    ckpt, state = checkpoint.load_newest(run_dir, load)
    if len(held) % loop.groups_per_step:
        raise ValueError(
            f"the checkpoint keeps {len(held)} rollout groups, not whole steps of "
            f"trainer.groups_per_step={loop.groups_per_step}: resume with the run's own value"
        )
    log.info(
        f"[train] resumed from {ckpt} at step {state['step']}"
        + (f" with {len(held)} rollout groups of the steps after it" if held else "")
    )
    if "ledger" in state:
        ledger = Ledger(state["ledger"])
    else:
        ledger = Ledger({"open": [g[0].info["slot"] for g in held if g and "slot" in g[0].info]})
    return state["step"], held, ledger
