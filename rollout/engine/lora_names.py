"""LoRA adapters as both sides see them: PEFT on the learner, vLLM multi-LoRA on the engine.

One adapter policy's weights travel as a safetensors blob of its `lora_A` / `lora_B`
tensors under PEFT's saved names (`base_model.model.<module>.lora_A.weight`), which
is what `peft` saves and vLLM's LoRA loader reads. An engine writes each pushed
version into a PEFT folder (`adapter_config.json` + `adapter_model.safetensors`)
and loads it from there; a checkpoint's adapter is the same folder.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rollout.config import VLLM_LORA_RANKS, LoraConfig


def peft_config(lora: LoraConfig, base_model: str):
    """The peft.LoraConfig of `lora` on `base_model` (a causal LM). PEFT's default init leaves
    lora_B zero, so an untrained adapter is exactly its base model."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(base_model),
    )


def adapter_config(lora: LoraConfig, base_model: str) -> dict:
    """adapter_config.json's content, as `peft` writes it."""
    d = peft_config(lora, base_model).to_dict()
    return {k: sorted(v) if isinstance(v, set) else v for k, v in d.items()}


def peft_name(policy: str) -> str:
    """The PEFT adapter name a learner gives policy `policy`'s adapter (prefixed: PEFT warns about
    names that are part of "lora_", such as "a")."""
    return f"policy_{policy}"


def own_params(policy: str) -> re.Pattern:
    """Matches the module names of policy `policy`'s adapter parameters (...lora_A.<its name>.weight)."""
    return re.compile(rf"\.(lora_[AB])\.{re.escape(peft_name(policy))}\.")


def saved_name(param_name: str, policy: str) -> str:
    """PEFT's saved name of policy `policy`'s adapter parameter (the adapter's name dropped):
    ...q_proj.lora_A.policy_<policy>.weight -> ...q_proj.lora_A.weight."""
    return own_params(policy).sub(r".\1.", param_name)


def write_adapter(folder: str | Path, lora: LoraConfig, base_model: str, blobs: list[bytes]) -> int:
    """Write a PEFT adapter folder from safetensors blobs of adapter tensors (file by file,
    through a rename, so a reader never sees half of one); returns how many tensors it holds."""
    from safetensors.torch import load, save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for blob in blobs:
        tensors.update(load(blob))
    files = {
        "adapter_config.json": json.dumps(adapter_config(lora, base_model), indent=2).encode(),
        "adapter_model.safetensors": save(tensors, metadata={"format": "pt"}),
    }
    for name, data in files.items():
        tmp = folder / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, folder / name)
    return len(tensors)


def vllm_max_rank(ranks: list[int]) -> int:
    """The smallest max_lora_rank vLLM accepts that holds every rank."""
    return next(r for r in VLLM_LORA_RANKS if r >= max(ranks))
