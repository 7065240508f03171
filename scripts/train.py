"""Train: the main job. Hydra composes conf/train.yaml; every key is typed and validated at start.

    python scripts/train.py                                   # tiny model, single_turn, chain_sum
    python scripts/train.py experiment=smoke run_dir=/tmp/smoke
    python scripts/train.py model=smollm2_135m harness=solver_verifier trainer.steps=30 \
        trainer.max_staleness=1 agents.verifier=frozen

Without `cluster=` (and `ray.address`) on the command line it runs on the preset for the GPUs torch
sees (conf/cluster/: local, gpu, or gpu_node when the job fits them) and prints which and why; GPUs
that nvidia-smi lists and torch cannot use stop it, saying why. Writes run_dir/{config.yaml,
metrics.jsonl, checkpoints/, eval/, summary.json}; wandb offline by default. The last output line
is the summary as JSON.
"""

from __future__ import annotations

import json
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rollout.log import setup_logging
from rollout.orchestration.cluster import run_job
from rollout.placement import with_cluster_for_this_machine
from trainer.config import TrainJobConfig, check_experiment_task, compose, register_configs
from trainer.loop import check, train

register_configs()


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(dcfg: DictConfig) -> None:
    choices = dict(HydraConfig.get().runtime.choices)

    def check_all(cfg: TrainJobConfig) -> None:
        check_experiment_task(choices)  # the experiment's task keys meet the task the user picked
        check(cfg)

    print(json.dumps(run_job(dcfg, check_all, train)))  # the summary: the last line of output


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    # no cluster= given: the preset for this machine's GPUs, gpu_node only if the job fits them
    sys.argv = with_cluster_for_this_machine(sys.argv, lambda overrides: compose("train", overrides))
    main()
