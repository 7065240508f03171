"""LoRA adapters served side by side by one real vLLM engine, checked against HF + PEFT, and
trained by real DeepSpeed learners (gradient isolation: an adapter's update comes from its own
rows only; the base never changes)."""

import copy

import pytest
import ray
import torch

from rollout.config import LoraConfig, ModelConfig, SamplingConfig
from tests.conftest import chat_prompt, hf_logprobs
from trainer.config import LearnerConfig, LossConfig
from trainer.learner_group import LearnerGroup
from trainer.weight_sync import ObjectStoreSync

LORA = LoraConfig(rank=8, alpha=16.0)


@pytest.fixture(scope="module")
def lora_engine(ray_cluster, tiny_path, engine_cfg):
    """One engine serving the tiny base model and adapters `a` and `b` (pool "a+b+frozen")."""
    from rollout.orchestration.cluster import spawn_engines

    [e] = spawn_engines(
        {"a+b+frozen": (tiny_path, ModelConfig(name="tiny"), engine_cfg)},
        adapters={"a+b+frozen": {"a": LORA, "b": LORA}},
    )["a+b+frozen"]
    yield e
    ray.get(e.shutdown.remote())
    ray.kill(e)


def random_adapter(hf_tiny, tiny_path, seed: int):
    """An HF + PEFT model (base + a LoRA adapter with random A and B) and the adapter's tensors
    as one safetensors blob under PEFT's saved names."""
    from peft import get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save

    from rollout.engine.lora_names import peft_config

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


@pytest.mark.e2e
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

    # one batch of base, a and b requests: each gets its own weights, the base none of an adapter's
    # (vLLM's CPU ops gave a base token the last adapter slot's LoRA: rollout/engine/lora_ops.py)
    together = [lora_engine.score.remote(prompt, c.completion_ids, p) for p in ("frozen", "a", "b", "frozen")]
    got = [torch.tensor(x) for x in ray.get(together, timeout=120)]
    for p, g in zip(("frozen", "a", "b", "frozen"), got):
        assert (g - {"frozen": base, "a": want_a, "b": want_b}[p]).abs().max() < 1e-3, p

    [ca] = ray.get(lora_engine.generate.remote(prompt, SamplingConfig(max_tokens=4), 0, "a"), timeout=120)
    [cf] = ray.get(lora_engine.generate.remote(prompt, SamplingConfig(max_tokens=4), 0, "frozen"), timeout=120)
    assert ca.version == 1 and cf.version == 0
    info = ray.get(lora_engine.info.remote(), timeout=60)
    assert info["adapter_versions"] == {"a": 1, "b": 1} and info["version"] == 0


@pytest.mark.e2e
def test_learner_adapter_trains_alone_and_syncs_exactly(
    lora_engine, tiny_path, hf_tiny, tiny_tokenizer, fixed_batch, tmp_path
):
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
    with LearnerGroup(
        tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=2, lr=3e-2), LossConfig(), name="a", lora=LORA
    ) as learners:
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
    with LearnerGroup(
        tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=2, lr=3e-2), LossConfig(), name="a", lora=LORA
    ) as resumed:
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


@pytest.mark.unit
def test_cpu_lora_ops_group_by_adapter_and_leave_tokens_without_one_alone():
    """rollout/engine/lora_ops.py against vLLM's own CPU ops where they agree (every token has an adapter)
    and against the definition where vLLM's do not (-1: no adapter, a zero LoRA term)."""
    from vllm.lora.ops import torch_ops as vllm_ops

    from rollout.engine import lora_ops as lora_cpu

    torch.manual_seed(0)
    slots, rank, width, out_width, n = 3, 8, 24, 40, 11
    a = torch.randn(slots, 1, rank, width)
    b = torch.randn(slots, 1, out_width, rank)
    x = torch.randn(n, width)
    mixed = torch.tensor([0, 2, 2, -1, 0, 1, -1, 2, 0, 0, 1])

    def reference(idx, scale=0.5):
        w = torch.stack([a[i, 0] if i >= 0 else torch.zeros(rank, width) for i in idx.tolist()])
        return scale * torch.einsum("ti,tri->tr", x, w)

    for idx in (torch.tensor([1] * n), torch.tensor([2, 0, 1, 0, 2, 1, 1, 0, 2, 2, 0]), mixed):
        ours, theirs = torch.full((n, rank), 7.0), torch.full((n, rank), 7.0)
        lora_cpu.bgmv_shrink(x, a, ours, idx, 0.5)
        assert torch.allclose(ours, reference(idx), atol=1e-5)
        if (idx >= 0).all():
            vllm_ops.bgmv_shrink(x, a, theirs, idx, 0.5)
            assert torch.allclose(ours, theirs, atol=1e-5)
        shrunk = reference(idx)
        for add in (False, True):
            y0 = torch.randn(n, out_width + 6)
            ours, theirs = y0.clone(), y0.clone()
            lora_cpu.bgmv_expand_slice(shrunk, b, ours, idx, 3, out_width, add)
            want = y0.clone()
            want[:, 3 : 3 + out_width] = (y0[:, 3 : 3 + out_width] if add else 0) + torch.stack(
                [b[i, 0] @ s if i >= 0 else torch.zeros(out_width) for i, s in zip(idx.tolist(), shrunk)]
            )
            assert torch.allclose(ours, want, atol=1e-4), add
            if (idx >= 0).all():
                vllm_ops.bgmv_expand_slice(shrunk, b, theirs, idx, 3, out_width, add)
                assert torch.allclose(ours, theirs, atol=1e-4)
    # prefill: per-sequence indices and lengths, expanded to tokens
    seq_idx, seq_len = torch.tensor([2, -1, 0]), torch.tensor([4, 3, 4])
    ours = torch.zeros(n, rank)
    lora_cpu.sgmv_shrink(x, a, ours, None, seq_len, seq_idx, 3, 4, n, 0.5)
    assert torch.allclose(ours, reference(torch.repeat_interleave(seq_idx, seq_len)), atol=1e-5)


def learner_adapter(hf_tiny, tiny_path):
    """HF + PEFT: adapter "a" on the tiny base, initialised as a learner does (seed 0)."""
    from peft import get_peft_model

    from rollout.engine.lora_names import peft_config, peft_name

    torch.manual_seed(0)
    return get_peft_model(copy.deepcopy(hf_tiny), peft_config(LORA, tiny_path), adapter_name=peft_name("a"))


def adapter_state(model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    from rollout.engine.lora_names import peft_name

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=peft_name("a")).items()}


def sgd_reference(hf_tiny, tiny_path, batches, lr: float) -> dict[str, torch.Tensor]:
    """One process: adapter "a", one SGD step of `lr` on the sum of every micro-batch's loss;
    the adapter's tensors under PEFT's saved names."""
    from trainer.losses import microbatch_loss

    model = learner_adapter(hf_tiny, tiny_path)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    for mb in batches:
        microbatch_loss(model, mb, LossConfig())[0].backward()
    opt.step()
    return adapter_state(model)


def exported(learners) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    [buckets] = learners.collect("export_weights", [learners.export_weights()])
    return {k: v for b in buckets for k, v in load(b).items()}


@pytest.mark.e2e
@pytest.mark.needs_memory_gb(3)  # learner groups of 2 ranks each (ZeRO-2, then ZeRO-3)
def test_adapters_sharing_a_base_train_as_if_alone_under_zero_2_and_3(
    ray_cluster, tiny_path, hf_tiny, fixed_batch, tmp_path
):
    """Two adapter policies on one learner group (2 ranks, ZeRO-2: the base held once), each with
    its own optimizer: a's SGD step, taken between two of b's with another lr, is exactly one
    process's step of a alone on the same batch (no averaging over ranks or micro-batches, no
    leak from b); the base never changes. A single adapter under ZeRO-3 (ranks holding shards of
    the base) takes the same step. An adapter's saved state loads back into it, not into the other."""
    sgd = dict(world_size=2, num_cpus=0.5, optimizer="sgd", grad_clip=0.0)
    want = sgd_reference(hf_tiny, tiny_path, fixed_batch, lr=0.5)
    with LearnerGroup(
        tiny_path,
        LearnerConfig(zero_stage=2, **sgd),
        LossConfig(),
        name="a+b",
        adapters={"a": (LORA, LearnerConfig(lr=0.5, **sgd)), "b": (LORA, LearnerConfig(lr=0.1, **sgd))},
    ) as shared:
        a, b = shared.view("a"), shared.view("b")
        assert a.param_digests() == b.param_digests(), "both adapters start as the base"
        b.train_step(fixed_batch)
        a.train_step(fixed_batch)
        b.train_step(fixed_batch)
        got = exported(a)
        assert len(set(a.param_digests())) == 1, "the ranks agree"
        assert a.param_digests() != b.param_digests()
        assert shared.base_digests() == [base_digest(hf_tiny)] * 2, "the base never changes"
        saved, b_digests = a.param_digests(), b.param_digests()
        a.save(str(tmp_path / "a"))
        a.train_step(fixed_batch)
        assert a.load(str(tmp_path / "a")) == 1 and a.param_digests() == saved, "a's state is back"
        assert b.param_digests() == b_digests, "b untouched"
        with pytest.raises(
            ValueError,
            match=r"does not hold this adapter's tensors .* e\.g\. "
            r".*lora_A\.policy_b\.weight",
        ):
            b.load(str(tmp_path / "a"))
    with LearnerGroup(
        tiny_path, LearnerConfig(zero_stage=3, lr=0.5, **sgd), LossConfig(), name="a", lora=LORA
    ) as zero3:
        zero3.train_step(fixed_batch)
        got3 = exported(zero3)
        assert zero3.base_digests() == [base_digest(hf_tiny)] * 2
    assert sorted(got) == sorted(want) == sorted(got3)
    moved = max((want[k] - v).abs().max().item() for k, v in adapter_state(learner_adapter(hf_tiny, tiny_path)).items())
    assert moved > 1e-3, "the step must move the adapter"
    for name, ref in want.items():
        assert (got[name] - ref).abs().max() < 1e-6 * max(1.0, moved) * 100, name
        assert (got3[name] - ref).abs().max() < 1e-6 * max(1.0, moved) * 100, name
