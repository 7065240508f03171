"""The training job's cross-field checks: `validate()` runs them before Ray starts.

On top of rollout/checks.py's (the fleet's): the loop, the algorithm, the evaluation, each
trained policy's learner ranks and weight sync, then whether the learners fit the machine.
Each raises ValueError naming the key(s) and the fix.
"""

from __future__ import annotations

from rollout.checks import check_fields, check_placement
from rollout.config import MAIN_POLICY
from rollout.placement import check_learner_gpus
from trainer.config import SyncMethod, TrainJobConfig


def job_checks(cfg: TrainJobConfig) -> list[tuple[bool, str]]:
    """The loop's, the algorithm's and the evaluation's checks: (holds, the message if not)."""
    t, a = cfg.trainer, cfg.algorithm
    return [
        (t.steps >= 1, "trainer.steps must be >= 1"),
        (t.groups_per_step >= 1, "trainer.groups_per_step must be >= 1"),
        (t.max_staleness >= 0, "trainer.max_staleness must be >= 0 (0 = synchronous)"),
        (
            cfg.sampling.temperature > 0,
            "sampling.temperature must be > 0 for training: greedy samples "
            "carry no policy gradient (eval.temperature can be 0)",
        ),
        (
            a.loss.temperature == cfg.sampling.temperature,
            "algorithm.loss.temperature must equal sampling.temperature (conf/train.yaml ties them): the "
            "learner must score the distribution the engine sampled from",
        ),
        (
            cfg.sampling.top_p == 1.0,
            "sampling.top_p must be 1.0 for training: the learner cannot "
            "reproduce a top-p-truncated behaviour distribution",
        ),
        (a.advantage.eps >= 0, "algorithm.advantage.eps must be >= 0"),
        (t.save_every >= 0, "trainer.save_every must be >= 0 (0: only at the end)"),
        (t.rollouts_every >= 0, "trainer.rollouts_every must be >= 0 (0: never)"),
        (t.keep_last >= 1, "trainer.keep_last must be >= 1"),
        (t.max_skipped_steps >= 1, "trainer.max_skipped_steps must be >= 1"),
        (t.max_learner_restarts >= 0, "trainer.max_learner_restarts must be >= 0 (0: a dead learner stops the run)"),
        (0 <= t.max_failed_fraction <= 1, "trainer.max_failed_fraction must be in [0, 1] (1: never stop)"),
        (not (t.resume and t.overwrite), "trainer.resume and trainer.overwrite=true contradict each other: drop one"),
        (t.rollout_timeout_s > 0, "trainer.rollout_timeout_s must be > 0"),
        (cfg.eval.timeout_s > 0, "eval.timeout_s must be > 0"),
        (
            cfg.eval.max_tokens is None or 0 < cfg.eval.max_tokens < cfg.model.max_model_len,
            f"eval.max_tokens={cfg.eval.max_tokens} must be in [1, model.max_model_len={cfg.model.max_model_len})",
        ),
        (cfg.eval.size >= 0, "eval.size must be >= 0"),
        (
            cfg.eval.size <= cfg.task.eval_size,
            f"eval.size={cfg.eval.size} is more than the task's held-out set (task.eval_size={cfg.task.eval_size})",
        ),
        (
            bool(cfg.trainable_policies()),
            f"agents: no role is mapped to a trainable policy (all map to "
            f"{cfg.used_policies()}); map one to {MAIN_POLICY!r}",
        ),
    ]


def learner_checks(cfg: TrainJobConfig) -> list[tuple[bool, str]]:
    """Each trained policy's learner and weight sync checks: (holds, the message if not); a
    learner section on an untrained policy is an error at once."""
    checks = []
    table = cfg.policy_table()
    for policy in cfg.used_policies():
        where = f"policies.{policy}.learner" if table[policy].learner else "learner"
        if not table[policy].trainable:
            if table[policy].learner:
                raise ValueError(
                    f"{where} is set but policy {policy!r} is not trainable; "
                    f"set policies.{policy}.trainable=true or drop {where}"
                )
            continue
        lr = cfg.policy_learner(policy)
        on_gpu = (lr.num_gpus > 0, cfg.policy_engine(policy).num_gpus > 0)
        checks += [
            (
                cfg.sync.method != SyncMethod.collective or table[policy].lora is None,
                f"sync.method=collective carries full weights, and policies.{policy}.lora makes {policy!r} an "
                f"adapter; use sync.method=auto (adapters go through the object store)",
            ),
            (
                cfg.sync_method(policy) != SyncMethod.collective or on_gpu[0] == on_gpu[1],
                f"sync.method={cfg.sync.method}: {where}.num_gpus and the engines' num_gpus of policy {policy!r} "
                f"must both be 0 (gloo) or both > 0 (IPC or NCCL); or set sync.method=object_store",
            ),
            (
                cfg.sync.transport != "nccl" or all(on_gpu),
                f"sync.transport=nccl needs GPUs on both sides: {where}.num_gpus and the engines' num_gpus of "
                f"policy {policy!r} > 0 (cluster=gpu_node); or sync.transport=auto",
            ),
            (cfg.sync.bucket_mb >= 1, "sync.bucket_mb must be >= 1"),
            (cfg.sync.snapshot_every >= 1, "sync.snapshot_every must be >= 1 (1: a snapshot every push)"),
            (lr.lr > 0, f"{where}.lr must be > 0"),
            (0 <= lr.zero_stage <= 3, f"{where}.zero_stage must be 0, 1, 2 or 3"),
            (lr.world_size >= 1, f"{where}.world_size must be >= 1"),
            (
                lr.call_timeout_s > 0 and lr.dist_timeout_s > 0,
                f"{where}.call_timeout_s and {where}.dist_timeout_s must be > 0",
            ),
        ]
    return checks


DETERMINISTIC = (
    "engine.max_num_seqs=1 engine.prefix_caching=false learner.torch_threads=1 "
    "trainer.max_staleness=0 sync.snapshot_every=1"
)


def deterministic_checks(cfg: TrainJobConfig) -> list[tuple[bool, str]]:
    """trainer.deterministic: what makes two synchronous runs do the same arithmetic (docs/faults.md):
    one sequence per engine step (vLLM's CPU kernels are not batch-invariant), no prefix cache, a
    fixed thread count in the learner, no rollout ahead of the weights, every push snapshotted."""
    if not cfg.trainer.deterministic:
        return []
    fix = f"trainer.deterministic=true needs {DETERMINISTIC} (set on every policy's engine and learner)"
    checks = [
        (cfg.trainer.max_staleness == 0, f"{fix}: trainer.max_staleness={cfg.trainer.max_staleness}"),
        (cfg.sync.snapshot_every == 1, f"{fix}: sync.snapshot_every={cfg.sync.snapshot_every}"),
    ]
    for policy in cfg.used_policies():
        e = cfg.policy_engine(policy)
        checks += [
            (e.num_gpus == 0, f"trainer.deterministic=true is for CPU engines (policy {policy!r} has num_gpus > 0)"),
            (e.max_num_seqs == 1, f"{fix}: policy {policy!r} has engine.max_num_seqs={e.max_num_seqs}"),
            (not e.prefix_caching, f"{fix}: policy {policy!r} has engine.prefix_caching=true"),
        ]
    for policy in cfg.trainable_policies():
        lr = cfg.policy_learner(policy)
        checks += [
            (lr.num_gpus == 0, f"trainer.deterministic=true is for CPU learners (policy {policy!r} has num_gpus > 0)"),
            (lr.torch_threads >= 1, f"{fix}: policy {policy!r} has learner.torch_threads={lr.torch_threads}"),
        ]
    return checks


def validate(cfg: TrainJobConfig) -> None:
    """Every cross-field check of the training job, then whether it fits the machine; raises
    ValueError naming the key(s)."""
    check_fields(cfg)
    checks = job_checks(cfg) + learner_checks(cfg) + deterministic_checks(cfg)
    for ok, msg in checks:
        if not ok:
            raise ValueError(msg)
    table = cfg.policy_table()
    for policy in cfg.trainable_policies():
        check_learner_gpus(
            cfg.policy_learner(policy), f"policies.{policy}.learner" if table[policy].learner else "learner"
        )
    check_placement(cfg)
