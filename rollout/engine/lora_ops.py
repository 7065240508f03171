"""LoRA matmuls for vLLM's CPU backend: one matmul per adapter, and no LoRA where none is asked.

vLLM's CPU punica ops (`vllm.lora.ops.torch_ops`) compute a batch's LoRA terms by gathering
each token's adapter matrices (`weights[indices]`, a tokens x rank x width copy per layer and
projection) and multiplying token by token. That is what makes a LoRA request generate ~2.4x
slower than a base request here. They also index with -1, which vLLM uses for "no adapter":
on the GPU the kernels skip those tokens, but `weights[-1]` is the last adapter slot, so in a
batch that mixes base-model and adapter requests the base tokens get the last slot's adapter.

These replacements keep the signatures and the semantics of the GPU kernels: tokens are grouped
by adapter (one `x[rows] @ W.T` per adapter in the batch, usually one or two), and tokens with
index -1 get no LoRA term. `install()` puts them into vLLM's CPU punica wrapper; it runs in the
engine's worker process (rollout/engine/worker_ext.py imports this module there). The GPU path does not
use these functions.
"""

from __future__ import annotations

import os

import torch


def _groups(indices: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """(adapter slot, rows) for every slot >= 0 in `indices`; rows None means every row."""
    slots = torch.unique(indices).tolist()
    if len(slots) == 1:
        return [] if slots[0] < 0 else [(slots[0], None)]
    return [(s, (indices == s).nonzero().squeeze(1)) for s in slots if s >= 0]


def _matrix(weights: torch.Tensor, slot: int, dtype: torch.dtype) -> torch.Tensor:
    w = weights[slot]
    return (w.squeeze(0) if w.dim() == 3 else w).to(dtype)


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    """output[t, :rank] = scaling * inputs[t] @ A[slot(t)].T; 0 for tokens without an adapter."""
    x = inputs.to(output_tensor.dtype)
    rank = lora_a_weights.shape[-2]
    out = output_tensor[:, :rank]
    out.zero_()
    for slot, rows in _groups(lora_indices_tensor):
        a = _matrix(lora_a_weights, slot, x.dtype)
        if rows is None:
            out.copy_(x @ a.T).mul_(scaling)
        else:
            out[rows] = scaling * (x[rows] @ a.T)


def _expand(
    inputs, lora_b_weights, output_tensor, lora_indices_tensor, offset: int, size: int, add_inputs: bool
) -> None:
    """output[t, offset:offset+size] (+)= inputs[t] @ B[slot(t)].T[:, :size]."""
    x = inputs.to(output_tensor.dtype)
    out = output_tensor[:, offset : offset + size]
    if not add_inputs:
        out.zero_()
    for slot, rows in _groups(lora_indices_tensor):
        b = _matrix(lora_b_weights, slot, x.dtype)[:size]
        if rows is None:
            out.add_(x @ b.T)
        else:
            out[rows] += x[rows] @ b.T


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    if inputs.shape[0] != output_tensor.shape[0]:  # vLLM's one-row broadcast case: keep its op
        return _ORIGINAL["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
    size = min(lora_b_weights.shape[-2], output_tensor.shape[1])
    _expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, 0, size, add_inputs)


def bgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    lora_indices_tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
):
    _expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs)


def _per_token(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(
    inputs,
    lora_a_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    scaling: float,
):
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    add_inputs: bool = False,
):
    bgmv_expand(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
):
    bgmv_expand_slice(
        inputs,
        lora_b_weights,
        output_tensor,
        _per_token(lora_indices_tensor, seq_len_tensor),
        slice_offset,
        slice_size,
        add_inputs,
    )


OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")
_ORIGINAL: dict = {}


def install() -> None:
    """Replace the ops vLLM's CPU punica wrapper calls (idempotent). TRACERL_LORA_CPU_OPS=vllm
    keeps vLLM's own (tools/bench/lora_ops.py compares the two)."""
    from vllm.lora.punica_wrapper import punica_cpu

    if os.environ.get("TRACERL_LORA_CPU_OPS", "grouped") == "vllm":
        return
    for name in OPS:
        _ORIGINAL.setdefault(name, getattr(punica_cpu, name))
        setattr(punica_cpu, name, globals()[name])
