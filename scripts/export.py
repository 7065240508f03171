"""Merge a LoRA policy's checkpointed adapter into its base model: an HF folder that vLLM and
transformers load like any model.

    python scripts/export.py runs/x/checkpoints/step_000100/solver/adapter out/solver_merged
    python scripts/export.py ADAPTER OUT --base /models/base    # the base moved since training

The base is read from the adapter's adapter_config.json (`base_model_name_or_path`, the
folder the run trained on) unless --base is given. The tokenizer files are copied from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def export(adapter: Path, out: Path, base: str | None = None) -> Path:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.hf_folder import HF_FILES

    config = adapter / "adapter_config.json"
    if not config.exists():
        raise FileNotFoundError(f"{adapter} is not a PEFT adapter folder (no adapter_config.json)")
    base = base or json.loads(config.read_text())["base_model_name_or_path"]
    if not (Path(base) / "config.json").exists():
        raise FileNotFoundError(f"base model {base!r} is not an HF model folder; pass --base")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    for name in HF_FILES:
        if (Path(base) / name).exists() and not (out / name).exists():
            shutil.copy(Path(base) / name, out / name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapter", type=Path, help="a checkpoint's <policy>/adapter folder")
    ap.add_argument("out", type=Path, help="where to write the merged HF model folder")
    ap.add_argument("--base", help="the base model folder (default: the one the adapter was trained on)")
    args = ap.parse_args()
    try:
        print(export(args.adapter, args.out, args.base))
    except FileNotFoundError as e:
        print(f"export: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
