"""The trace-level policy-gradient loss.

For every trained token t (weight w_t from packing, advantage A_t from the
trace), with the engine's behaviour log-prob as the old policy:

    r_t   = exp(log pi(y_t) - log mu(y_t))                  importance ratio
    pg_t  = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)   PPO clip
    pg_t  = min(pg_t, -clip_c A_t)   for A_t < 0              dual clip (bounds stale / mismatched samples)
    loss  = sum_t w_t (pg_t + kl_coef * KL_t)

Using the engine's log-probs as the old policy corrects for both staleness
(async rollout) and engine/learner numerical mismatch. At r = 1 the gradient is
exactly sum_t w_t A_t grad log pi(y_t): the seed's estimator (invariant 2).
KL_t is the k3 estimator against a frozen reference (Schulman 2020).
"""

from __future__ import annotations

import torch

from trainer.config import LossConfig
from trainer.packing import attention, predecessors


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(input_ids[:, t] | < t) for t >= 1, as (rows, T); column 0 is 0.

    `logits` is (rows, T, vocab) from a causal LM over `input_ids` (rows, T).
    """
    logits = logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted clipped policy-gradient loss over same-shaped tensors (e.g. (rows, T), or the trained
    tokens only); returns (loss, sums for metrics).

    The loss is a plain weighted SUM: the normalisation lives in `weights`, so
    summing partial losses over micro-batches and ranks gives the batch loss.
    Metric values are sums over trained tokens (divide by `tokens` to average).
    """
    trained = weights != 0
    log_ratio = torch.where(trained, logp - old_logp, torch.zeros_like(logp))
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg = -torch.minimum(ratio * advantages, clipped * advantages)
    if cfg.dual_clip > 0:
        pg = torch.where(advantages < 0, torch.minimum(pg, -cfg.dual_clip * advantages), pg)
    per_token = pg
    kl = torch.zeros_like(logp)
    if ref_logp is not None and cfg.kl_coef > 0:
        d = torch.where(trained, ref_logp - logp, torch.zeros_like(logp))
        kl = d.exp() - d - 1.0  # k3: unbiased, always >= 0
        per_token = per_token + cfg.kl_coef * kl
    loss = (weights * per_token).sum()
    with torch.no_grad():
        t = trained.float()
        is_clipped = ((ratio - clipped).abs() > 1e-8) & trained
        metrics = {
            "tokens": t.sum(),
            "clip_frac": is_clipped.float().sum(),
            "ratio": (ratio * t).sum(),
            "ratio_max": (ratio * t).max() if trained.any() else torch.tensor(0.0),
            # k3 estimate of KL(mu || pi): how far the learner is from what the engine sampled
            "mismatch_kl": ((ratio - 1.0 - log_ratio) * t).sum(),
            "kl_ref": (kl * t).sum(),
            "logp": (logp.detach() * t).sum(),
        }
    return loss, metrics


def _next_token_logits(
    model, inputs: dict, at: tuple[torch.Tensor, torch.Tensor], only_there: bool = True
) -> torch.Tensor:
    """Next-token logits at the positions `at` ((row, index) pairs) only, as (N, vocab).

    With `only_there` the output head runs on those positions' hidden states alone (a pre-hook
    on it picks them): on a full-vocabulary head that skips most of the head's matmul and keeps
    the (rows, T, vocab) logits, and every softmax pass over them, out of memory. Otherwise (or
    for a model without an output-embedding module) the whole batch's logits are indexed.
    """
    inner = getattr(model, "module", model)  # a DeepSpeed engine wraps the model
    head = inner.get_output_embeddings() if only_there and hasattr(inner, "get_output_embeddings") else None
    if head is None:
        return model(**inputs).logits[at]
    handle = head.register_forward_pre_hook(lambda _module, args: (args[0][at], *args[1:]))
    try:
        return model(**inputs).logits
    finally:
        handle.remove()


def model_inputs(model, mb, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The forward's inputs for a micro-batch (`ids`: its input ids as a tensor): ids and the
    padding mask, or, with tree rows (trainer/packing.py::share_prefixes), each token's own
    position and a (rows, 1, T, T) mask in the model's dtype (0: attend, its min: not)."""
    if mb.positions is None:
        return {"input_ids": ids, "attention_mask": torch.tensor(mb.attention_mask, device=ids.device)}
    seen, dtype = torch.as_tensor(attention(mb), device=ids.device)[:, None], _dtype(model)
    mask = torch.zeros(seen.shape, dtype=dtype, device=ids.device).masked_fill_(~seen, torch.finfo(dtype).min)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": torch.tensor(mb.positions, device=ids.device)}


def _dtype(model) -> torch.dtype:
    return getattr(model, "module", model).get_input_embeddings().weight.dtype  # DeepSpeed wraps the model


def microbatch_loss(
    model, mb, cfg: LossConfig, ref_model=None, device: str | torch.device = "cpu", only_trained: bool = True
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward one packed MicroBatch through a causal LM and return `policy_loss` (+ entropy sum).

    Only the trained tokens are scored: each at the temperature it was sampled at (the
    micro-batch's `temperatures`; 0 there means `cfg.temperature`). `only_trained=False` computes
    the logits of every position first (the same numbers, slower: for benchmarks and tests).
    """
    ids = torch.tensor(mb.input_ids, device=device)
    weights = torch.tensor(mb.weights, device=device)
    target = weights != 0  # (rows, T): token t is trained
    rows, index = target.nonzero(as_tuple=True)
    source = (rows, torch.as_tensor(predecessors(mb), device=device)[rows, index])  # where each is predicted
    temp = torch.tensor(mb.temperatures, device=device)[target]
    temp = torch.where(temp > 0, temp, torch.full_like(temp, cfg.temperature))[:, None]
    labels = ids[target][:, None]

    inputs = model_inputs(model, mb, ids)

    def scored(m) -> torch.Tensor:  # (N, vocab) log-probs of the trained tokens' distributions
        x = inputs
        if x["attention_mask"].is_floating_point():  # a tree mask, in this model's dtype
            x = {**x, "attention_mask": x["attention_mask"].to(_dtype(m))}
        return torch.log_softmax(_next_token_logits(m, x, source, only_trained).float() / temp, dim=-1)

    logp_all = scored(model)
    logp = logp_all.gather(-1, labels).squeeze(-1)
    ref_logp = None
    if ref_model is not None and cfg.kl_coef > 0:
        with torch.no_grad():
            ref_logp = scored(ref_model).gather(-1, labels).squeeze(-1)
    loss, metrics = policy_loss(
        logp,
        torch.tensor(mb.old_logprobs, device=device)[target],
        torch.tensor(mb.advantages, device=device)[target],
        weights[target],
        cfg,
        ref_logp,
    )
    with torch.no_grad():
        metrics["entropy"] = -(logp_all.exp() * logp_all).sum()
    return loss, metrics
