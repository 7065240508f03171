"""Checkpoint files read on a learner rank: torch.load with the weights-only unpickler, and a
DeepSpeed checkpoint engine that loads through it (trainer/checkpoint.py is the driver's side).

Trust: DeepSpeed's state files are pickles. Every one a resume reads goes through `load_torch`
(torch's weights-only unpickler, which allows tensors, builtins and the few plain data classes
DeepSpeed's files hold), so a file that holds anything else is refused rather than run."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any


def deepspeed_data_classes() -> list[type]:
    """The classes besides tensors and builtins in DeepSpeed's checkpoint files (the ZeRO-2/3
    optimizer state, as found in real ones): plain data, whose unpickling runs none of
    their code (a dataclass, an enum, a loss scaler's attributes)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def load_torch(path: str | Path, map_location: Any = "cpu") -> Any:
    """torch.load of a checkpoint file with the weights-only unpickler (and
    `deepspeed_data_classes`): a file holding any other object is refused with a ValueError
    naming it, instead of unpickled (which could run any code)."""
    import torch

    try:
        with torch.serialization.safe_globals(deepspeed_data_classes()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        what = re.search(r"GLOBAL ([\w.]+)", str(e))
        reason = f"it refers to {what.group(1)}" if what else str(e).strip().splitlines()[0][:300]
        raise ValueError(
            f"{path} holds a pickled object that is not tensors or DeepSpeed's checkpoint data: "
            f"refused, since unpickling it could run code ({reason}); resume only from "
            f"checkpoints this trainer wrote"
        ) from None


class WeightsOnlyLoads:
    """A DeepSpeed engine's checkpoint engine, loading through `load_torch` (DeepSpeed's own
    TorchCheckpointEngine unpickles with weights_only=False); everything else is the wrapped one's."""

    def __init__(self, engine: Any):
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def load(self, path: str, map_location: Any = None) -> Any:
        return load_torch(path, map_location)
