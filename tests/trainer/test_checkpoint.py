"""Checkpoint folders meeting damage and crashes: a damaged trainer_state.json, a resume that fell
back past a damaged checkpoint, stale `.partial` folders, steps past 999999, and a pickle in a
torch file that would run code (real files, no learners; tests/trainer/test_faults.py loads real
DeepSpeed checkpoints). Then the HF folder: sharded, written by learner rank 0 in the model's dtype,
loaded by transformers and vLLM (real learners and a real engine)."""

import pytest
import ray
import torch

from tests.conftest import fake_checkpoint
from trainer import checkpoint
from trainer.config import compose
from trainer.run_dir import check_run_dir
from trainer.torch_load import load_torch


def names(paths):
    return [p.name for p in paths]


@pytest.mark.unit
@pytest.mark.parametrize("damage", ['{"step": 4, "vers', '{"versions": {"main": 4}}', "\x00\x00"])
def test_a_damaged_trainer_state_falls_back_to_the_checkpoint_before(tmp_path, damage, caplog):
    for step in (2, 4):
        fake_checkpoint(tmp_path, step)
    (checkpoint.step_dir(tmp_path, 4) / "trainer_state.json").write_text(damage)  # torn by a crash
    loaded = []
    ckpt, state = checkpoint.load_newest(tmp_path, lambda d, s: loaded.append((d.name, s)))
    assert (ckpt.name, state["step"]) == ("step_000002", 2)
    assert loaded == [("step_000002", {"step": 2, "versions": {"main": 2}})]
    assert "step_000004/trainer_state.json is damaged" in caplog.text

    def cfg(steps):
        return compose(
            "train", ["experiment=smoke", f"run_dir={tmp_path}", f"trainer.steps={steps}", "trainer.resume=auto"]
        )

    check_run_dir(cfg(4))  # resumes from step 2: steps 3 and 4 left
    check_run_dir(cfg(2))  # killed after its last checkpoint, before its summary: the resume finishes it
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="step_000002 is at step 2 of trainer.steps=2: nothing left to train"):
        check_run_dir(cfg(2))
    with pytest.raises(ValueError, match="step_000002 is at step 2 of trainer.steps=1: nothing left to train"):
        check_run_dir(cfg(1))


@pytest.mark.unit
def test_after_a_fallback_resume_the_checkpoint_just_written_is_kept(tmp_path):
    """Step 4 did not load, the run resumed from step 2 and saved step 3: with keep_last=1 the
    save of step 3 is the one kept (ranked by name it was below step 4 and deleted)."""
    for step in (2, 4):
        fake_checkpoint(tmp_path, step)

    def load(d, state):
        if state["step"] == 4:
            raise RuntimeError("PytorchStreamReader failed reading zip archive")  # the disk filled up

    ckpt, _ = checkpoint.load_newest(tmp_path, load)
    assert ckpt.name == "step_000002"
    fake_checkpoint(tmp_path, 3)
    assert names(checkpoint.prune(tmp_path, keep_last=1, step=3)) == ["step_000002", "step_000004"]
    assert names(checkpoint.complete(tmp_path)) == ["step_000003"]
    assert checkpoint.latest(tmp_path).name == "step_000003"
    fake_checkpoint(tmp_path, 4)
    assert names(checkpoint.prune(tmp_path, keep_last=2, step=4)) == []


@pytest.mark.unit
def test_checkpoints_rank_by_step_past_999999_and_stale_partials_go_at_the_next_save(tmp_path):
    for step in (999_998, 999_999):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 999_000, complete=False)  # a save of a run before, killed mid-write
    fake_checkpoint(tmp_path, 1_000_000)
    assert not checkpoint.partial_dir(tmp_path, 999_000).exists(), "the stale .partial of another step is removed"
    assert checkpoint.latest(tmp_path).name == "step_1000000"
    assert names(checkpoint.complete(tmp_path)) == ["step_999998", "step_999999", "step_1000000"]
    assert names(checkpoint.prune(tmp_path, keep_last=2, step=1_000_000)) == ["step_999998"]


class RunsCode:
    """Unpickling it calls `open(marker, "w")`: any code could run instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.unit
def test_a_torch_file_holding_an_object_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"module": {"w": torch.ones(2)}, "step": 3, "name": "x"}, good)
    torch.save({"module": {"w": torch.ones(2)}, "evil": RunsCode(marker)}, bad)
    assert load_torch(good)["step"] == 3
    with pytest.raises(ValueError, match=r"bad\.pt holds a pickled object .* refused.*it refers to io\.open"):
        load_torch(bad)
    assert not marker.exists(), "nothing in the file ran"


# ---- the HF folder of a checkpoint: shards, written by learner rank 0 --------------------------


@pytest.mark.unit
def test_shards_are_planned_as_transformers_does():
    from trainer.hf_folder import plan_shards, shard_files

    sizes = [("a", 40), ("b", 50), ("c", 20), ("d", 200), ("e", 10)]
    assert plan_shards(sizes, 100) == [["a", "b"], ["c"], ["d"], ["e"]]  # "d" is bigger than a shard: alone
    assert plan_shards(sizes, 10**9) == [["a", "b", "c", "d", "e"]]
    assert shard_files(1) == ["model.safetensors"]
    assert shard_files(3) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


@pytest.mark.unit
def test_the_writer_holds_one_shard_at_a_time_and_names_the_weights_dtype(tmp_path, tiny_path):
    """Each shard is built only once the one before is written and dropped (rank 0 never holds two);
    the index maps every tensor to its file; config.json says the weights' dtype (bf16 here, the base
    says float32); the report holds names and sizes only."""
    import gc
    import json
    import weakref

    from safetensors import safe_open

    from trainer.hf_folder import INDEX, write

    alive = []

    def shards():
        for i in range(3):
            gc.collect()
            assert not any(ref() is not None for ref in alive), f"shard {i - 1} is still held while {i} is built"
            shard = {
                f"layer{i}.w": torch.full((4, 4), float(i), dtype=torch.bfloat16),
                f"layer{i}.b": torch.zeros(4, dtype=torch.bfloat16),
            }
            alive[:] = [weakref.ref(t) for t in shard.values()]
            yield shard
            del shard

    report = write(tmp_path / "hf", tiny_path, shards(), 3)
    folder = tmp_path / "hf"
    index = json.loads((folder / INDEX).read_text())
    assert index["weight_map"]["layer1.w"] == "model-00002-of-00003.safetensors"
    assert index["metadata"]["total_size"] == 3 * (16 + 4) * 2
    with safe_open(folder / "model-00003-of-00003.safetensors", "pt") as f:
        assert f.get_tensor("layer2.w").dtype == torch.bfloat16 and f.metadata() == {"format": "pt"}
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert report["dtype"] == "bfloat16"
    assert report["files"] == {p.name: p.stat().st_size for p in folder.iterdir()}


def driver_peak(call) -> int:
    """The peak of the driver's Python heap (where ray.get puts the bytes it fetches) during `call()`."""
    import tracemalloc

    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.e2e
def test_a_sharded_checkpoint_is_written_by_rank_0_and_loads_with_the_learners_weights(
    ray_cluster, tiny_path, tiny_tokenizer, fixed_batch, engine_cfg, tmp_path
):
    """ZeRO-3 over 2 ranks, the HF folder in 300 kB shards (an index and several files): the driver
    receives file names and sizes, never the weights (its Python heap, where ray.get puts the bytes
    it fetches, stays far below the model's size); transformers loads exactly the learner's weights,
    and a vLLM engine started on the folder scores as the learner."""
    import json

    from safetensors.torch import load
    from transformers import AutoModelForCausalLM

    from rollout.config import ModelConfig
    from rollout.orchestration.cluster import spawn_engines
    from tests.conftest import chat_prompt
    from trainer.config import LearnerConfig, LossConfig
    from trainer.learner_group import LearnerGroup

    prompt = chat_prompt(tiny_tokenizer)
    completion = tiny_tokenizer.encode("The answer is 7.", add_special_tokens=False)
    with LearnerGroup(
        tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=3, lr=3e-3), LossConfig()
    ) as learners:
        learners.train_step(fixed_batch)  # weights of its own, not the base's
        want = {k: v for b in ray.get(learners.export_weights()) for k, v in load(b).items()}
        model_bytes = sum(t.numel() * t.element_size() for t in want.values())
        # Ray's own ray.get peaks at ~1 MB of the driver's heap for any answer: that is the floor
        floor = driver_peak(learners.param_digests)
        saved = driver_peak(lambda: checkpoint.save_hf(learners, tiny_path, tmp_path / "hf", shard_bytes=300_000))
        folder = tmp_path / "hf"
        report = learners.write_hf(str(tmp_path / "again"), tiny_path, 300_000)
        learner_lp = torch.tensor(learners.logprobs(prompt + completion, len(prompt)))
    assert saved - floor < model_bytes / 10, (saved, floor, model_bytes)
    assert set(report) == {"files", "dtype"} and report["dtype"] == "float32"
    assert report["files"] == {p.name: p.stat().st_size for p in (tmp_path / "again").iterdir()}
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(want)
    got = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    for name, t in want.items():
        assert torch.equal(got[name], t), name

    [eng] = spawn_engines({"main": (str(folder), ModelConfig(name="tiny"), engine_cfg)})["main"]
    try:
        served = torch.tensor(ray.get(eng.score.remote(prompt, completion), timeout=120))
    finally:
        ray.kill(eng)
    assert (served - learner_lp).abs().max() < 1e-3


@pytest.mark.e2e
def test_a_bf16_model_is_exported_and_saved_in_bf16(
    ray_cluster, tiny_path, tiny_tokenizer, fixed_batch, engine_cfg, tmp_path
):
    """bf16 stays bf16: the weight snapshot (export_weights: what the object store carries and a
    restarted engine loads) is half the fp32 bytes, the HF folder's tensors are bf16 and its config
    says so; transformers loads the folder as bf16 with the exported values, and a bf16 vLLM engine
    that takes the push scores as the learner."""
    import json

    from safetensors.torch import load
    from transformers import AutoModelForCausalLM

    from rollout.config import ModelConfig
    from rollout.orchestration.cluster import spawn_engines
    from tests.conftest import chat_prompt
    from trainer.config import LearnerConfig, LossConfig
    from trainer.learner_group import LearnerGroup
    from trainer.weight_sync import ObjectStoreSync

    prompt = chat_prompt(tiny_tokenizer)
    completion = tiny_tokenizer.encode("The answer is 7.", add_special_tokens=False)
    [eng] = spawn_engines({"main": (tiny_path, ModelConfig(name="tiny", dtype="bfloat16"), engine_cfg)})["main"]
    try:
        with LearnerGroup(
            tiny_path, LearnerConfig(world_size=1, num_cpus=0.5, zero_stage=2, lr=3e-3), LossConfig(), dtype="bfloat16"
        ) as learners:
            before = torch.tensor(ray.get(eng.score.remote(prompt, completion), timeout=120))
            for _ in range(3):
                learners.train_step(fixed_batch)
            sent = {k: v for b in ray.get(learners.export_weights()) for k, v in load(b).items()}
            folder = checkpoint.save_hf(learners, tiny_path, tmp_path / "hf")
            stats = ObjectStoreSync(learners, [eng]).push(1)
            learner_lp = torch.tensor(learners.logprobs(prompt + completion, len(prompt)))
        served = torch.tensor(ray.get(eng.score.remote(prompt, completion), timeout=120))
    finally:
        ray.kill(eng)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    numel = sum(p.numel() for p in base.parameters())
    assert {t.dtype for t in sent.values()} == {torch.bfloat16}
    assert sum(t.numel() for t in sent.values()) == numel and stats["bytes"] < 2 * numel + 100_000
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    assert saved.dtype == torch.bfloat16
    for name, p in saved.named_parameters():
        assert torch.equal(p.detach(), sent[name]), name
    moved, off = (learner_lp - before).abs().max(), (served - learner_lp).abs().max()
    assert moved > 0.5 and off < 0.1, (moved, off)  # bf16 forwards: ~0.03 apart here
