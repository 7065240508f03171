"""An HF model folder written shard by shard, laid out as transformers' `save_pretrained` does.

    model.safetensors                                    (the weights fit in one shard)
    model-00001-of-00003.safetensors ... + model.safetensors.index.json   (they do not)
    config.json (its dtype: the weights'), tokenizer files, generation_config.json

The writer takes the shards one at a time from an iterator, so whoever feeds it (learner rank 0,
gathering parameter by parameter under ZeRO-3) holds one shard at most, never the whole model.
transformers (`from_pretrained`) and vLLM load the folder either way.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

HF_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
SINGLE = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME
INDEX = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME
SHARD_BYTES = 2 << 30  # the default shard size: rank 0 holds one shard in host memory at a time


def plan_shards(sizes: list[tuple[str, int]], shard_bytes: int) -> list[list[str]]:
    """The tensor names of each shard, in order, from (name, bytes) pairs: a shard takes tensors
    while they fit in `shard_bytes`; a tensor larger than that is a shard alone (transformers' rule)."""
    assert sizes and shard_bytes > 0, "a model with tensors, shards of > 0 bytes"
    plan, size = [[]], 0
    for name, nbytes in sizes:
        if plan[-1] and size + nbytes > shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append(name)
        size += nbytes
    return plan


def shard_files(n: int) -> list[str]:
    """The file names of `n` shards (one: model.safetensors)."""
    return [SINGLE] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def write(folder: str | Path, base_model: str | Path, shards: Iterable[dict], n: int) -> dict:
    """Write `n` shards ({name: CPU tensor} each, taken one at a time), the index when n > 1, and
    the base model's config (its dtype set to the weights') and tokenizer files into `folder`.
    Returns {"files": {file: bytes on disk}, "dtype": the weights' dtype}: no tensor."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weight_map, dtypes, total = {}, set(), 0
    shards = iter(shards)
    for file in shard_files(n):  # (not zip: it would hold the shard before while the next is built)
        shard = next(shards)
        save_file(shard, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
        dtypes.update(str(t.dtype).removeprefix("torch.") for t in shard.values())
        total += sum(t.numel() * t.element_size() for t in shard.values())
        del shard  # before the next one is built: one shard in memory at a time
    assert next(shards, None) is None, f"more than the {n} shards planned"
    assert len(dtypes) == 1, f"one dtype for the whole model, not {sorted(dtypes)}"
    [dtype] = dtypes
    written = shard_files(n)
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(INDEX)
    for name in HF_FILES:
        if (Path(base_model) / name).exists():
            shutil.copy(Path(base_model) / name, folder / name)
            written.append(name)
    if (folder / "config.json").exists():
        set_config_dtype(folder / "config.json", dtype)
    return {"files": {name: (folder / name).stat().st_size for name in written}, "dtype": dtype}


def set_config_dtype(config: Path, dtype: str) -> None:
    """Make an HF config.json name `dtype` as its weights' (transformers 5 reads `dtype`, older
    ones `torch_dtype`: both are set where the base had the older key)."""
    d = json.loads(config.read_text())
    d["dtype"] = dtype
    if "torch_dtype" in d:
        d["torch_dtype"] = dtype
    config.write_text(json.dumps(d, indent=2) + "\n")
