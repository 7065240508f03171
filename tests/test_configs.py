"""Every config group composes through Hydra onto the typed schema and validates."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from hydra.errors import ConfigCompositionException

from rollout.config import RolloutJobConfig, register_configs, validate

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()


def load(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = OmegaConf.to_object(compose("rollout", overrides=overrides))
    assert isinstance(cfg, RolloutJobConfig)
    validate(cfg)
    return cfg


@pytest.mark.parametrize("group", ["model", "harness", "task"])
def test_every_option_composes_and_validates(group):
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert options
    for name in options:
        cfg = load([f"{group}={name}"])
        if group == "harness":
            assert set(cfg.harness.roles) <= set(cfg.agents), name


def test_solver_verifier_defaults_and_frozen_override():
    cfg = load(["harness=solver_verifier", "agents.verifier=frozen", "rollout.num_traces=8"])
    assert cfg.agents == {"solver": "main", "verifier": "frozen"}
    assert cfg.rollout.num_traces == 8 and cfg.harness._target_.endswith("solver_verifier")


def test_unknown_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException, match="rollout.num_tracez"):
        load(["rollout.num_tracez=3"])
    with pytest.raises(ConfigCompositionException, match="samplng.temperature"):
        load(["samplng.temperature=0.5"])


def test_bad_type_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException, match="sampling.temperature=hot") as e:
        load(["sampling.temperature=hot"])
    assert "could not be converted to Float" in str(e.value.__cause__)


@pytest.mark.parametrize("override, msg", [
    ("sampling.top_p=0", "sampling.top_p"),
    ("sampling.max_tokens=4096", "model.max_model_len"),
    ("rollout.group_size=0", "rollout.group_size"),
    ("engine.sync_pause_mode=abort", "engine.sync_pause_mode"),
])
def test_bad_values_fail_validation(override, msg):
    with pytest.raises(ValueError, match=msg):
        load([override])


def test_unmapped_role_fails():
    with pytest.raises(ValueError, match=r"agents: harness 'solver_verifier' uses roles \['verifier'\]"):
        load(["harness=solver_verifier", "~agents.verifier"])


def test_every_train_experiment_composes_and_validates():
    from trainer.config import TrainJobConfig
    from trainer.config import register_configs as register_train
    from trainer.config import validate as validate_train

    register_train()
    experiments = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    assert "smoke" in experiments
    for name in experiments + [None]:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = OmegaConf.to_object(compose("train", overrides=[f"experiment={name}"] if name else []))
        assert isinstance(cfg, TrainJobConfig)
        validate_train(cfg)
    for algo in sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml")):
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            validate_train(OmegaConf.to_object(compose("train", overrides=[f"algorithm={algo}"])))
