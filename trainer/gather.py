"""A rank's parameters whole, one at a time: gathered under ZeRO-3 (a collective: every rank runs
through the same parameters), then copied to CPU or hashed. What rank 0 writes into an HF folder
(`Learner.write_hf`) and what the deterministic checks compare (`Learner.base_digest`, `param_digest`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any


def gathered(named: Iterable[tuple[str, Any]], zero3: bool, keep: bool) -> Iterator[tuple[str, Any]]:
    """(name, a CPU copy of the full parameter, in its dtype) where `keep` (rank 0), else (name,
    None), for each of `named`."""
    import deepspeed

    for name, p in named:
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None, enabled=zero3):
            t = p.detach().to("cpu", copy=True) if keep else None
        yield name, t


def digest(named: Iterable[tuple[str | None, Any]], zero3: bool) -> str:
    """sha256 over each parameter's full values as fp32 bytes, in the order given, its name first
    where it has one."""
    import deepspeed

    h = hashlib.sha256()
    for name, p in named:
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None, enabled=zero3):
            if name is not None:
                h.update(name.encode())
            h.update(p.detach().cpu().float().numpy().tobytes())
    return h.hexdigest()
