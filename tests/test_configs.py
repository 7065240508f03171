"""Every shipped config composes through Hydra onto the schema that uses it, and validates;
bad keys, types, enum values and combinations fail naming the key."""

import inspect
import os
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from harnesses.base import load_harness, normalize_question
from rollout.checks import validate as validate_generate
from rollout.config import GenerateJobConfig, make_task_source
from trainer.checks import validate as validate_train
from trainer.config import TrainJobConfig, compose, experiment_task

pytestmark = pytest.mark.unit

CONF = Path(__file__).resolve().parents[1] / "conf"
# Which config groups each entry point's defaults list has (conf/train.yaml, conf/generate.yaml).
GROUPS = {
    "train": ["model", "harness", "task", "algorithm", "logger", "cluster", "experiment"],
    "generate": ["model", "harness", "task", "cluster"],
}
SCHEMAS = {"train": (TrainJobConfig, validate_train), "generate": (GenerateJobConfig, validate_generate)}


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_is_composed_by_a_test():
    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir())
    assert groups == sorted(GROUPS["train"]), "a new config group needs a line in GROUPS"


@pytest.mark.parametrize(
    "entry, group, option",
    [(entry, group, option) for entry, groups in GROUPS.items() for group in groups for option in options(group)],
)
def test_every_option_composes_and_validates(entry, group, option):
    schema, validate = SCHEMAS[entry]
    cfg = compose(entry, [f"{group}={option}"])
    assert isinstance(cfg, schema)
    if cfg.model.path and not Path(cfg.model.path, "config.json").exists():  # a GPU preset: no such folder here
        with pytest.raises(ValueError, match=f"model: path='{cfg.model.path}' is not an HF model folder"):
            validate(cfg)
        return
    openai_agent = cfg.harness._target_ == "harnesses.programs.openai_agent.openai_agent"  # its presets too
    options = cfg.harness.options
    if openai_agent and not options.get("command") and not options.get("agent"):  # the user's to name
        with pytest.raises(ValueError, match="harness.options: set exactly one of agent"):
            validate(cfg)
        return
    if group == "cluster" and option in ("gpu", "gpu_node"):  # in-process Ray on the machine's GPUs
        cfg.ray.num_gpus = 0  # a CPU machine's
        with pytest.raises(ValueError, match=r"has 0: use cluster=local \(CPU\)"):
            validate(cfg)
        cfg.ray.num_gpus = 4  # a GPU machine's
    validate(cfg)
    assert set(cfg.harness.roles) <= set(cfg.agents)
    if group == "cluster" and option not in ("local", "gpu", "gpu_node"):
        assert cfg.ray.address == "auto", "the other cluster presets join a running cluster"


@pytest.mark.parametrize("harness", options("harness"))
def test_harness_options_equal_the_function_defaults(harness):
    """conf/harness/*.yaml lists options so that `harness.options.<key>=` overrides work; the
    values must be the function's own defaults (the one source of truth)."""
    cfg = compose("generate", [f"harness={harness}"])
    params = inspect.signature(load_harness(cfg.harness._target_)).parameters
    for key, value in cfg.harness.options.items():
        assert params[key].default == value, (harness, key)


def test_loss_temperature_follows_sampling():
    cfg = compose("train", ["sampling.temperature=0.7"])
    assert cfg.algorithm.loss.temperature == 0.7
    with pytest.raises(ValueError, match="algorithm.loss.temperature must equal sampling.temperature"):
        validate_train(compose("train", ["sampling.temperature=0.7", "algorithm.loss.temperature=1.0"]))
    with pytest.raises(ValueError, match="sampling.temperature must be > 0 for training"):
        validate_train(compose("train", ["sampling.temperature=0"]))


def test_solver_verifier_defaults_and_frozen_override():
    cfg = compose("generate", ["harness=solver_verifier", "agents.verifier=frozen", "num_traces=8"])
    assert cfg.agents == {"solver": "main", "verifier": "frozen"}
    assert cfg.num_traces == 8 and cfg.harness._target_.endswith("solver_verifier")


def test_a_task_picked_on_the_command_line_replaces_the_experiments():
    """`task=file` after an experiment is the task the run trains on: the experiment's own task
    choice (its defaults list) gives way, and none of its task keys stay behind."""
    file_task = compose("train", ["task=file", "task.params.path=my.csv"]).task
    for experiment in ("smoke", "smollm2_solver_verifier", "smollm2_debate_lora"):
        task = compose("train", [f"experiment={experiment}", "task=file", "task.params.path=my.csv"]).task
        assert task == file_task, experiment


def test_an_experiments_own_task_keys_with_another_task_fail_naming_the_preset():
    # relay_team_shared sets task.params.operations itself (for story_sum), relay_team_lora extends it;
    # study_selfplay holds out 24 of task=nim_short's positions
    for experiment, key, task in [
        ("relay_team_shared", "task.params.operations", "story_sum"),
        ("relay_team_lora", "task.params.operations", "story_sum"),
        ("study_selfplay", "task.eval_size", "nim_short"),
    ]:
        with pytest.raises(ValueError, match=f"experiment={experiment} sets {key} for its task \\({task}\\)"):
            compose("train", [f"experiment={experiment}", "task=file"])
        compose("train", [f"experiment={experiment}", f"task={task}"])  # its own task, named: as it is


@pytest.mark.parametrize("experiment", options("experiment"))
def test_an_experiment_that_sets_task_keys_picks_its_task_in_its_defaults(experiment):
    task, keys = experiment_task(experiment)
    assert task is not None or not keys, f"{experiment} sets {keys} without `override /task:` in its defaults"


def test_unknown_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException, match="rollout.num_workerz"):
        compose("generate", ["rollout.num_workerz=3"])
    with pytest.raises(ConfigCompositionException, match="samplng.temperature"):
        compose("generate", ["samplng.temperature=0.5"])


def test_bad_type_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException, match="sampling.temperature=hot") as e:
        compose("generate", ["sampling.temperature=hot"])
    assert "could not be converted to Float" in str(e.value.__cause__)


@pytest.mark.parametrize(
    "override, choices",
    [
        ("model.dtype=fp16", "float32, bfloat16"),
        ("engine.sync_pause_mode=abort", "wait, keep"),
        ("engine.core=fork", "auto, thread, process"),
        ("learner.optimizer=adam", "adamw, sgd"),
        ("algorithm.loss.normalization=tokens", "token, sequence, trace, constant"),
        ("algorithm.advantage.estimator=ppo", "grpo, rloo, batch_mean, uniform"),
        ("logger.mode=loud", "offline, online, disabled"),
    ],
)
def test_enum_choices_are_checked_at_compose_time(override, choices):
    key = override.split("=")[0]
    with pytest.raises(ConfigCompositionException, match=key) as e:
        compose("train", [override])
    assert f"expected one of [{choices}]" in str(e.value.__cause__)


@pytest.mark.parametrize(
    "override, msg",
    [
        ("sampling.top_p=0", "sampling.top_p"),
        ("sampling.max_tokens=4096", "model.max_model_len"),
        ("rollout.group_size=0", "rollout.group_size"),
        ("harness.options.rounds=2", "harness.options"),  # single_turn takes no `rounds`
        ("engine.vllm_log_level=LOUD", "engine.vllm_log_level=LOUD: DEBUG, INFO"),
    ],
)
def test_bad_values_fail_validation(override, msg):
    override = override if "options" not in override else "+" + override
    with pytest.raises(ValueError, match=msg):
        validate_generate(compose("generate", [override]))


def test_a_thread_core_with_tensor_parallel_ranks_is_refused_and_auto_picks_the_process_core():
    from rollout.engine.args import core_kind

    with pytest.raises(ValueError, match="engine.core=thread runs one worker.*needs engine.core=process"):
        validate_generate(compose("generate", ["engine.core=thread", "engine.tensor_parallel_size=2"]))
    cfg = compose("generate", ["engine.tensor_parallel_size=2"])
    assert core_kind(cfg.engine) == "process"
    assert core_kind(compose("generate", []).engine) == "thread"
    assert core_kind(compose("generate", ["engine.num_gpus=1"]).engine) == "process"


@pytest.mark.parametrize(
    "override, msg",
    [
        ("trainer.save_every=-1", "trainer.save_every must be >= 0"),
        ("trainer.keep_last=0", "trainer.keep_last must be >= 1"),
        ("trainer.max_skipped_steps=0", "trainer.max_skipped_steps must be >= 1"),
        ("trainer.max_failed_fraction=1.5", r"trainer.max_failed_fraction must be in \[0, 1\]"),
        ("rollout.worker_restart_timeout_s=0", "rollout.worker_restart_timeout_s must be > 0"),
        ("engine.request_timeout_s=0", r"engine.request_timeout_s=0.0 must be > 0"),
        ("engine.health_timeout_s=-1", r"engine.health_timeout_s=-1.0 must be > 0"),
        ("engine.max_restarts=-1", "engine.max_restarts must be >= 0"),
        ("engine.request_timeout_s=400", r"engine.request_timeout_s=400.0 must be < rollout.timeout_s=300.0"),
        ("engine.sync_timeout_s=100", r"engine.sync_timeout_s=100.0 must be > engine.request_timeout_s=240.0"),
        ("trainer.rollout_timeout_s=0", "trainer.rollout_timeout_s must be > 0"),
        ("eval.timeout_s=0", "eval.timeout_s must be > 0"),
        ("eval.max_tokens=100000", r"eval.max_tokens=100000 must be in \[1, model.max_model_len"),
        ("learner.call_timeout_s=0", "learner.call_timeout_s and learner.dist_timeout_s must be > 0"),
        ("trainer.max_learner_restarts=-1", "trainer.max_learner_restarts must be >= 0"),
        ("rollout.buffer_timeout_s=0", "rollout.buffer_timeout_s must be > 0"),
        ("rollout.health_check_s=-1", r"rollout.health_check_s must be >= 0 \(0: no worker watchdog\)"),
        ("rollout.health_timeout_s=0", "rollout.health_timeout_s must be > 0"),
    ],
)
def test_bad_fault_settings_fail_validation(override, msg):
    with pytest.raises(ValueError, match=msg):
        validate_train(compose("train", [override]))
    with pytest.raises(ValueError, match="trainer.resume and trainer.overwrite=true contradict"):
        validate_train(compose("train", ["trainer.resume=auto", "trainer.overwrite=true"]))


def test_deterministic_mode_names_every_setting_it_needs():
    """trainer.deterministic=true asks for what makes two runs do the same arithmetic, by key, on
    every policy's engine and learner; with them it validates; GPUs are refused."""
    needed = ["engine.max_num_seqs=1", "engine.prefix_caching=false", "learner.torch_threads=1"]
    fix = r"trainer.deterministic=true needs engine.max_num_seqs=1 engine.prefix_caching=false"
    with pytest.raises(ValueError, match=fix + r".*policy 'main' has engine.max_num_seqs=64"):
        validate_train(compose("train", ["trainer.deterministic=true"]))
    with pytest.raises(ValueError, match=r"policy 'main' has engine.prefix_caching=true"):
        validate_train(compose("train", ["trainer.deterministic=true", "engine.max_num_seqs=1"]))
    with pytest.raises(ValueError, match=r"policy 'main' has learner.torch_threads=0"):
        validate_train(compose("train", ["trainer.deterministic=true", *needed[:2]]))
    with pytest.raises(ValueError, match=r"trainer.max_staleness=1"):
        validate_train(compose("train", ["trainer.deterministic=true", *needed, "trainer.max_staleness=1"]))
    with pytest.raises(ValueError, match=r"policy 'frozen' has engine.max_num_seqs=4"):
        validate_train(
            compose(
                "train",
                [
                    "trainer.deterministic=true",
                    *needed,
                    "agents.verifier=frozen",
                    "harness=solver_verifier",
                    "+policies.frozen.engine.max_num_seqs=4",
                ],
            )
        )
    validate_train(compose("train", ["trainer.deterministic=true", *needed]))


@pytest.mark.parametrize(
    "overrides, msg",
    [
        (
            ["harness.options.command=python a.py", "harness.options.agent=examples.calculator_agent.agent"],
            "set exactly one of agent",
        ),
        (["harness.options.agent=examples.calculator_agent.nope"], "harness.options.agent=.* cannot be imported"),
        (["harness.options.agent=examples.calculator_agent.calculator"], "must be an async function"),
        (["harness.options.command=python a.py", "harness.options.timeout_s=0"], "timeout_s must be > 0"),
    ],
)
def test_openai_agent_options_are_checked_at_start(overrides, msg):
    with pytest.raises(ValueError, match=msg):
        validate_generate(compose("generate", ["harness=openai_agent", *overrides]))
    validate_generate(
        compose("generate", ["harness=openai_agent", "harness.options.agent=examples.calculator_agent.agent"])
    )


def test_unmapped_role_fails():
    with pytest.raises(ValueError, match=r"agents: harness 'solver_verifier' uses roles \['verifier'\]"):
        validate_generate(compose("generate", ["harness=solver_verifier", "~agents.verifier"]))


def test_unknown_task_name_fails_at_config_time():
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'chain_summ'; e.g. chain_sum"):
        validate_train(compose("train", ["task.name=chain_summ"]))


def test_unknown_harness_or_task_class_fails_naming_the_key():
    with pytest.raises(ValueError, match="harness._target_='harnesses.nope.run' cannot be imported"):
        validate_generate(compose("generate", ["harness._target_=harnesses.nope.run"]))
    with pytest.raises(ValueError, match="task._target_='harnesses.nope.Tasks' cannot be imported"):
        validate_generate(compose("generate", ["task._target_=harnesses.nope.Tasks"]))


@pytest.mark.parametrize(
    "overrides", [[f"task={t}"] for t in options("task")] + [[f"experiment={e}"] for e in options("experiment")]
)
def test_shipped_tasks_hold_out_by_content(overrides):
    """No question of a shipped task's held-out set is ever a training question, for every
    training index the config uses (and more); the held-out questions are all different."""
    cfg = compose("train", overrides)
    source = make_task_source(cfg.task, cfg.seed)
    held_out = {normalize_question(t.question) for t in source.eval_tasks()}
    assert len(held_out) == cfg.task.eval_size >= cfg.eval.size
    used = cfg.trainer.steps * cfg.trainer.groups_per_step
    for i in range(max(used, 200)):
        assert normalize_question(source.train_task(i).question) not in held_out, (overrides, i)


def test_an_impossible_eval_size_fails_the_config_check():
    tiny_space = ["task.params.min_terms=2", "task.params.max_terms=2", "task.eval_size=250", "eval.size=250"]
    with pytest.raises(ValueError, match="only 200 distinct questions .* fewer than task.eval_size=250"):
        validate_train(compose("train", tiny_space))


# ---- policies: several sets of weights in one run ----------------------------------------------


def test_without_a_policies_section_main_is_trained_and_frozen_is_the_same_model_untrained():
    cfg = compose("train", ["harness=solver_verifier", "agents.verifier=frozen"])
    validate_train(cfg)
    assert cfg.used_policies() == ["frozen", "main"] and cfg.trainable_policies() == ["main"]
    assert cfg.policy_model("frozen") == cfg.policy_model("main") == cfg.model
    assert cfg.policy_learner("main") == cfg.learner and cfg.policy_engine("frozen") == cfg.engine


def test_each_policy_overrides_the_top_level_sections_key_by_key():
    cfg = compose(
        "train",
        [
            "harness=solver_verifier",
            "agents.verifier=critic",
            "+policies.critic.learner.lr=3e-4",
            "+policies.critic.engine.num_engines=2",
            "+policies.critic.model.name=tiny_tied",
        ],
    )
    validate_train(cfg)
    assert cfg.trainable_policies() == ["critic", "main"]
    assert cfg.policy_learner("critic").lr == 3e-4 and cfg.policy_learner("main").lr == cfg.learner.lr
    assert cfg.policy_learner("critic").world_size == cfg.learner.world_size  # the rest as the top level
    assert cfg.policy_engine("critic").num_engines == 2 and cfg.policy_engine("main").num_engines == 1
    # another model: its name, the top level's dtype and length
    assert cfg.policy_model("critic").name == "tiny_tied" and cfg.policy_model("critic").path is None
    assert cfg.policy_model("critic").max_model_len == cfg.model.max_model_len


def test_a_policy_gets_its_own_nodes_by_replacing_the_resources_it_asks_for():
    cfg = compose(
        "train",
        [
            "cluster=two_node_cpu",
            "harness=solver_verifier",
            "agents.verifier=critic",
            "+policies.critic.engine.resources={critic_node: 0.5}",
        ],
    )
    validate_train(cfg)
    assert cfg.policy_engine("critic").resources == {"critic_node": 0.5}, "replaced, not merged"
    assert cfg.policy_engine("main").resources == {"rollout_node": 0.5}


@pytest.mark.parametrize(
    "overrides, msg",
    [
        (
            ["agents.verifier=critic"],
            r"agents.verifier='critic' is not a policy; define it, e.g. \+policies.critic.trainable=true",
        ),
        (["+policies.critic.trainable=true"], r"policies.critic is used by no role; map one to it"),
        (
            ["agents.verifier=critic", "+policies.critic.model.path=/nowhere/x"],
            r"policies.critic.model: path='/nowhere/x' is not an HF model folder",
        ),
        (
            ["agents.verifier=critic", "+policies.critic.model.name=gpt5"],
            r"policies.critic.model: name='gpt5' is not built in",
        ),
        (
            ["agents.verifier=critic", "+policies.critic.learner.lrr=1"],
            r"policies.critic.learner.lrr: Key 'lrr' not in",
        ),
        (["agents.verifier=critic", "+policies.critic.learner.lr=0"], r"policies.critic.learner.lr must be > 0"),
        (
            ["agents.verifier=critic", "+policies.critic.engine.num_gpus=lots"],
            r"policies.critic.engine.num_gpus: Value 'lots' .* could not be converted to Float",
        ),
        (["agents.verifier=critic", "+policies.critic.trainabel=true"], r"policies.critic.trainabel: Key 'trainabel'"),
        (
            ["agents.verifier=judge", "+policies.judge.trainable=false", "+policies.judge.learner.lr=1e-4"],
            r"policies.judge.learner is set but policy 'judge' is not trainable",
        ),
        (["agents.verifier=frozen", "agents.solver=frozen"], r"agents: no role is mapped to a trainable policy"),
        (
            ["sync.method=collective", "+policies.main.lora.rank=8"],
            r"sync.method=collective carries full weights, and policies.main.lora makes 'main' an adapter; "
            r"use sync.method=auto",
        ),
        (
            ["engine.num_gpus=1"],
            r"sync.method=auto: learner.num_gpus and the engines' num_gpus of policy 'main' must both",
        ),
        (["sync.method=rdma"], r"sync.method"),
        (["sync.transport=nccl"], r"sync.transport=nccl needs GPUs on both sides: learner.num_gpus and the engines'"),
        (["sync.transport=rdma"], r"sync.transport"),
        (["engine.block_size=16"], r"engine.block_size=16 must be a multiple of 32 \(vLLM's CPU attention\)"),
        (
            ["agents.verifier=critic", "+policies.critic.engine.cpu_cores=half"],
            r"policies.critic.engine.cpu_cores='half': auto, all, i/n \(the i-th of n shares",
        ),
    ],
)
def test_policy_config_errors_name_the_key_and_the_fix(overrides, msg):
    with pytest.raises((ValueError, ConfigCompositionException), match=msg):
        validate_train(compose("train", ["harness=solver_verifier", *overrides]))


def test_a_local_cluster_holds_every_actor_of_any_agents_mapping():
    """The defaults with a frozen verifier ask for 2 engines and 2 learner ranks of 1 CPU each: a
    2-core machine's local cluster gets 4 logical CPUs, not 2 (which left the learners unplaced)."""
    from rollout.config import RayConfig
    from rollout.orchestration.cluster import local_cpus

    cfg = compose("train", ["harness=solver_verifier", "agents.verifier=frozen"])
    assert cfg.cpus_asked() == 4.0
    assert local_cpus(RayConfig(), cfg.cpus_asked()) == max(os.cpu_count(), 4)
    assert local_cpus(RayConfig(num_cpus=3), cfg.cpus_asked()) == 3  # set: as set
    assert compose("generate", ["harness=solver_verifier", "agents.verifier=frozen"]).cpus_asked() == 2.0


# ---- LoRA policies: adapters on one base share its engines ------------------------------------


def test_lora_policies_and_the_frozen_base_share_one_engine_pool_and_one_learner_group():
    cfg_args = [
        "harness=debate",
        "agents.debater_a=a",
        "agents.debater_b=b",
        "+policies.a.lora.rank=16",
        "+policies.b.lora.alpha=8",
        "+policies.b.lora.rank=4",
    ]
    cfg = compose("train", cfg_args)
    validate_train(cfg)
    assert cfg.policy_lora("a").rank == 16 and cfg.policy_lora("a").alpha == 32.0  # the schema's defaults
    assert cfg.policy_lora("b").rank == 4 and "down_proj" in cfg.policy_lora("b").target_modules
    assert cfg.engine_pools() == {"a+b+frozen": ["a", "b", "frozen"]}
    assert cfg.trainable_policies() == ["a", "b"]
    assert cfg.learner_groups() == {"a+b": ["a", "b"]}  # the adapters' learner ranks hold the base once
    assert cfg.cpus_asked() == 1.0 + 2.0  # one engine; one learner group of 2 ranks
    # apart when their ranks differ, under ZeRO-3 (the model itself is sharded), or when asked
    for apart in (["+policies.b.learner.world_size=1"], ["learner.zero_stage=3"], ["learner.share_lora_base=false"]):
        assert compose("train", [*cfg_args, *apart]).learner_groups() == {"a": ["a"], "b": ["b"]}, apart
    # each adapter's optimizer settings are its own
    assert compose("train", [*cfg_args, "+policies.b.learner.lr=1e-3"]).learner_groups() == {"a+b": ["a", "b"]}
    # a full trained policy of the same model keeps its own engines; a frozen judge of another model too
    cfg = compose(
        "train",
        [
            "harness=debate",
            "agents.debater_a=a",
            "+policies.a.lora.rank=8",
            "agents.judge=judge",
            "+policies.judge.trainable=false",
            "+policies.judge.model.name=tiny_tied",
        ],
    )
    validate_train(cfg)
    assert cfg.engine_pools() == {"main": ["main"], "judge": ["judge"], "a": ["a"]}


@pytest.mark.parametrize(
    "overrides, msg",
    [
        (["+policies.critic.lora.rank=0"], r"policies.critic.lora.rank=0 must be in \[1, 512\]"),
        (["+policies.critic.lora.rnak=8"], r"policies.critic.lora.rnak: Key 'rnak' not in"),
        (["+policies.critic.lora.target_modules=[]"], r"policies.critic.lora.target_modules is empty"),
        (["+policies.critic.lora.dropout=0.1"], r"policies.critic.lora.dropout=0.1: .* set it to 0"),
        (
            ["+policies.critic.lora.rank=8", "+policies.critic.trainable=false"],
            r"policies.critic.lora is set but policy 'critic' is not trainable",
        ),
        (
            ["+policies.critic.lora.rank=8", "agents.solver=frozen", "+policies.critic.engine.num_engines=2"],
            r"policies \['critic', 'frozen'\] share engines .* engine settings differ",
        ),
    ],
)
def test_lora_config_errors_name_the_key_and_the_fix(overrides, msg):
    with pytest.raises(ValueError, match=msg):
        validate_train(compose("train", ["harness=solver_verifier", "agents.verifier=critic", *overrides]))


def test_sync_method_auto_is_collective_for_full_weights_and_object_store_for_adapters():
    cfg = compose(
        "train",
        [
            "harness=solver_verifier",
            "agents.verifier=critic",
            "+policies.critic.trainable=true",
            "+policies.critic.lora.rank=8",
        ],
    )
    validate_train(cfg)
    assert (cfg.sync_method("main"), cfg.sync_method("critic")) == ("collective", "object_store")
    cfg = compose("train", ["sync.method=object_store", "engine.num_gpus=1", "ray.num_gpus=1"])
    validate_train(cfg)  # no group: GPU engines with CPU learners are fine through the object store
    assert cfg.sync_method("main") == "object_store"
