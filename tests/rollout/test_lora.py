"""LoRA adapters served side by side by one real vLLM engine, checked against HF + PEFT, and
trained by real DeepSpeed learners (gradient isolation: an adapter's update comes from its own
rows only; the base never changes)."""

import copy

import pytest
import ray
import torch

from rollout.config import LoraConfig, ModelConfig, SamplingConfig
from tests.conftest import chat_prompt, hf_logprobs
from trainer.learner import LearnerConfig
from trainer.learner_group import LearnerGroup
from trainer.losses import LossConfig
from trainer.weight_sync import ObjectStoreSync

LORA = LoraConfig(rank=8, alpha=16.0)


@pytest.fixture(scope="module")
def lora_engine(ray_cluster, tiny_path, engine_cfg):
    """One engine serving the tiny base model and adapters `a` and `b` (pool "a+b+frozen")."""
    from rollout.cluster import spawn_engines

    [e] = spawn_engines({"a+b+frozen": (tiny_path, ModelConfig(name="tiny"), engine_cfg)},
                        adapters={"a+b+frozen": {"a": LORA, "b": LORA}})["a+b+frozen"]
    yield e
    ray.get(e.shutdown.remote())
    ray.kill(e)


def random_adapter(hf_tiny, tiny_path, seed: int):
    """An HF + PEFT model (base + a LoRA adapter with random A and B) and the adapter's tensors
    as one safetensors blob under PEFT's saved names."""
    from peft import get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save

    from rollout.lora import peft_config

    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(hf_tiny), peft_config(LORA, tiny_path)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    state = {k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()}
    return model, save(state)


def scores(engine, prompt, completion, policy):
    return torch.tensor(ray.get(engine.score.remote(prompt, completion, policy), timeout=120))


def test_adapters_match_hf_peft_and_stay_apart(lora_engine, hf_tiny, tiny_path, tiny_tokenizer):
    prompt = chat_prompt(tiny_tokenizer)
    [c] = ray.get(lora_engine.generate.remote(prompt, SamplingConfig(max_tokens=16), 0, "a"), timeout=120)
    assert c.version == 0 and len(c.completion_ids) > 0
    base = hf_logprobs(hf_tiny, prompt, c.completion_ids)
    # Before any push an adapter is its base (PEFT starts lora_B at zero).
    assert (scores(lora_engine, prompt, c.completion_ids, "a") - base).abs().max() < 1e-3

    model_a, blob_a = random_adapter(hf_tiny, tiny_path, seed=1)
    model_b, blob_b = random_adapter(hf_tiny, tiny_path, seed=2)
    stats = ray.get(lora_engine.update_weights.remote(1, [blob_a], "a"), timeout=120)
    assert stats["tensors"] == 2 * 7 * 2  # A and B of 7 projections in each of the tiny model's 2 layers
    want_a = hf_logprobs(model_a, prompt, c.completion_ids)
    assert (want_a - base).abs().max() > 0.05, "the random adapter must change the log-probs"
    assert (scores(lora_engine, prompt, c.completion_ids, "a") - want_a).abs().max() < 1e-3
    # b (never pushed) and the frozen base are untouched by a's load
    assert (scores(lora_engine, prompt, c.completion_ids, "b") - base).abs().max() < 1e-3
    assert (scores(lora_engine, prompt, c.completion_ids, "frozen") - base).abs().max() < 1e-3

    ray.get(lora_engine.update_weights.remote(1, [blob_b], "b"), timeout=120)
    want_b = hf_logprobs(model_b, prompt, c.completion_ids)
    got_b = scores(lora_engine, prompt, c.completion_ids, "b")
    assert (got_b - want_b).abs().max() < 1e-3
    assert (got_b - want_a).abs().max() > 0.05, "two adapters on one engine must give different log-probs"
    # a request for a after b's sync still gets a's weights
    assert (scores(lora_engine, prompt, c.completion_ids, "a") - want_a).abs().max() < 1e-3

    [ca] = ray.get(lora_engine.generate.remote(prompt, SamplingConfig(max_tokens=4), 0, "a"), timeout=120)
    [cf] = ray.get(lora_engine.generate.remote(prompt, SamplingConfig(max_tokens=4), 0, "frozen"), timeout=120)
    assert ca.version == 1 and cf.version == 0
    info = ray.get(lora_engine.info.remote(), timeout=60)
    assert info["adapter_versions"] == {"a": 1, "b": 1} and info["version"] == 0


def test_learner_adapter_trains_alone_and_syncs_exactly(lora_engine, tiny_path, hf_tiny, tiny_tokenizer,
                                                       fixed_batch, tmp_path):
    """A LoRA learner group (2 ranks, ZeRO-2) trains only its adapter — the base weights never
    change — and after a sync the engine's log-probs under that adapter equal the learner's; its
    checkpoint folder loads with peft and merges (scripts/export.py) into an equal HF model."""
    from peft import PeftModel
    from safetensors.torch import load
    from transformers import AutoModelForCausalLM

    from scripts.export import export
    from trainer import checkpoint

    prompt = chat_prompt(tiny_tokenizer)
    completion = tiny_tokenizer.encode("The answer is 7.", add_special_tokens=False)
    ids = prompt + completion
    with LearnerGroup(tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=2, lr=3e-2),
                      LossConfig(), name="a", lora=LORA) as learners:
        start = torch.tensor(learners.logprobs(ids, len(prompt)))
        assert (start - hf_logprobs(hf_tiny, prompt, completion)).abs().max() < 1e-4, "untrained adapter = base"
        for _ in range(3):
            learners.train_step(fixed_batch)
        trained = torch.tensor(learners.logprobs(ids, len(prompt)))
        assert (trained - start).abs().max() > 0.01, "training must change the log-probs"

        [buckets] = learners.collect("export_weights", [learners.export_weights()])
        sent = {k: v for b in buckets for k, v in load(b).items()}
        assert sent and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in sent), sorted(sent)[:4]
        # the base inside the learner is the model it started from
        digest = ray.get(learners.ranks[0].base_digest.remote(), timeout=120)
        assert digest == base_digest(hf_tiny)

        stats = ObjectStoreSync(learners, [lora_engine]).push(5)
        assert 0 < stats["bytes"] < 1e6  # the adapter only: the tiny model's full weights are ~3 MB
        assert (scores(lora_engine, prompt, completion, "a") - trained).abs().max() < 1e-3
        [c] = ray.get(lora_engine.generate.remote(prompt, SamplingConfig(max_tokens=4), 0, "a"), timeout=120)
        assert c.version == 5

        # the checkpoint's adapter folder loads with peft, and merges into an HF model folder
        folder = checkpoint.save_adapter(learners, tiny_path, tmp_path / "adapter")
        learners.save(str(tmp_path / "deepspeed"))  # the adapter and its optimizer state, no base
        digest = learners.param_digests()
    # resume: a fresh group loads the adapter (strictness is off for the left-out base: check it loaded)
    with LearnerGroup(tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=2, lr=3e-2),
                      LossConfig(), name="a", lora=LORA) as resumed:
        assert resumed.param_digests() != digest
        resumed.load(str(tmp_path / "deepspeed"))
        assert resumed.param_digests() == digest
    peft_model = PeftModel.from_pretrained(copy.deepcopy(hf_tiny), str(folder)).eval()
    assert (hf_logprobs(peft_model, prompt, completion) - trained).abs().max() < 1e-4
    merged = AutoModelForCausalLM.from_pretrained(export(folder, tmp_path / "merged"), dtype=torch.float32)
    assert (hf_logprobs(merged.eval(), prompt, completion) - trained).abs().max() < 1e-4


def base_digest(model) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()
