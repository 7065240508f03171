"""The clipped policy-gradient loss on hand-made tensors: clipping, dual clip, KL, metrics."""

import math

import pytest
import torch

from trainer.config import LossConfig
from trainer.losses import policy_loss, token_logprobs

pytestmark = pytest.mark.unit


def one_token(logp, old, adv, ref=None, cfg=LossConfig(kl_coef=0.0)):  # noqa: B008 (never mutated)
    lp = torch.tensor([[0.0, logp]], requires_grad=True)  # column 0 is never trained
    w = torch.tensor([[0.0, 1.0]])
    loss, m = policy_loss(
        lp,
        torch.tensor([[0.0, old]]),
        torch.tensor([[0.0, adv]]),
        w,
        cfg,
        None if ref is None else torch.tensor([[0.0, ref]]),
    )
    loss.backward()
    return loss.item(), lp.grad[0, 1].item(), {k: v.item() for k, v in m.items()}


def test_on_policy_gradient_is_minus_advantage():
    loss, grad, m = one_token(-1.0, -1.0, 0.7)
    assert math.isclose(loss, -0.7, abs_tol=1e-7) and math.isclose(grad, -0.7, abs_tol=1e-7)
    assert m["clip_frac"] == 0 and math.isclose(m["ratio"], 1.0) and abs(m["mismatch_kl"]) < 1e-7


def test_ratio_above_clip_high_stops_the_gradient_for_positive_advantage():
    loss, grad, m = one_token(math.log(1.5), 0.0, 1.0)  # r = 1.5 > 1 + 0.28
    assert math.isclose(loss, -1.28, rel_tol=1e-6) and grad == 0.0 and m["clip_frac"] == 1
    assert math.isclose(m["ratio_max"], 1.5, rel_tol=1e-6)
    assert m["mismatch_kl"] > 0  # k3 of KL(mu || pi) = r - 1 - log r
    assert math.isclose(m["mismatch_kl"], 0.5 - math.log(1.5), rel_tol=1e-5)


def test_ratio_below_clip_low_stops_the_gradient_for_negative_advantage():
    loss, grad, _ = one_token(math.log(0.5), 0.0, -1.0)  # r = 0.5 < 0.8
    assert math.isclose(loss, 0.8, rel_tol=1e-6) and grad == 0.0


def test_dual_clip_bounds_huge_ratios_with_negative_advantage():
    loss, grad, _ = one_token(math.log(10.0), 0.0, -1.0)  # unclipped term would be 10
    assert math.isclose(loss, 3.0, rel_tol=1e-6) and grad == 0.0
    loss, grad, _ = one_token(math.log(10.0), 0.0, -1.0, cfg=LossConfig(dual_clip=0.0))
    assert math.isclose(loss, 10.0, rel_tol=1e-5) and grad > 0


def test_kl_to_reference_is_zero_at_reference_and_pulls_towards_it():
    cfg = LossConfig(kl_coef=0.5)
    _, grad_same, m = one_token(-1.0, -1.0, 0.0, ref=-1.0, cfg=cfg)
    assert m["kl_ref"] == 0.0 and grad_same == 0.0
    _, grad, m = one_token(-1.0, -1.0, 0.0, ref=-2.0, cfg=cfg)  # pi above the reference
    assert m["kl_ref"] > 0 and grad > 0  # descending the loss lowers log pi towards the reference


def test_untrained_positions_contribute_nothing():
    lp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    w = torch.tensor([[0.0, 1.0, 0.0]])
    loss, m = policy_loss(lp, torch.tensor([[0.0, -1.0, -9.0]]), torch.tensor([[0.0, 1.0, 5.0]]), w, LossConfig())
    loss.backward()
    assert lp.grad[0, 2] == 0.0 and m["tokens"] == 1 and math.isclose(m["ratio_max"], 1.0)


def test_token_logprobs_alignment_and_temperature():
    logits = torch.randn(1, 4, 7)
    ids = torch.tensor([[3, 1, 6, 2]])
    lp = token_logprobs(logits, ids, temperature=0.5)
    assert lp.shape == (1, 4) and lp[0, 0] == 0
    expected = torch.log_softmax(logits[0, 1] / 0.5, -1)[6]  # token at t=2 predicted from t=1
    assert torch.isclose(lp[0, 2], expected)
