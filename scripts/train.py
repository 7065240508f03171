"""Train: the main job. Hydra composes conf/train.yaml; every key is typed and validated at start.

    python scripts/train.py                                   # tiny model, single_turn, chain_sum
    python scripts/train.py experiment=smoke run_dir=/tmp/smoke
    python scripts/train.py model=smollm2_135m harness=solver_verifier trainer.steps=30 \
        trainer.max_staleness=1 agents.verifier=frozen

Writes run_dir/{config.yaml, metrics.jsonl, checkpoints/, summary.json}; wandb offline by default.
"""

from __future__ import annotations

import json
import os
import sys

# scripts/rollout.py would shadow the `rollout` package: keep this folder off sys.path.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import hydra  # noqa: E402
import ray  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from trainer.config import TrainJobConfig, register_configs, validate  # noqa: E402
from trainer.loop import train  # noqa: E402

register_configs()


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(dcfg: DictConfig) -> None:
    cfg: TrainJobConfig = OmegaConf.to_object(dcfg)
    try:
        validate(cfg)  # before Ray starts: a bad combination fails here, naming the key
    except ValueError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        summary = train(cfg)
    finally:
        ray.shutdown()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
