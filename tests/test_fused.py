"""The fused classifier loss computes the ordinary loss and gradients; float8 stays within its precision."""

import torch

from gpt2ladder.config import PRESETS
from gpt2ladder.engine import build_model
from gpt2ladder.fused import GRAD_SCALE, make_loss_fn
from gpt2ladder.rungs import setup_for

CPU = torch.device("cpu")
TINY = PRESETS["tiny"]


def _loss_and_grads(names, x, y):
    model = build_model(TINY, setup_for(names), CPU, seed=0)
    _, loss = model(x, y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads


def _batch(seed=0, b=2, t=64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50257, (b, t), generator=gen), torch.randint(0, 50257, (b, t), generator=gen)


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_fused_loss_equals_ordinary_loss_and_gradients():
    x, y = _batch()
    ref_loss, ref = _loss_and_grads(["baseline", "vocab"], x, y)
    loss, grads = _loss_and_grads(["baseline", "vocab", "fused_loss"], x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name in ref:
        assert _rel(grads[name], ref[name]) < 1e-5, name
    assert grads["transformer.wte.weight"][50257:].abs().max() == 0  # padded rows get no gradient


def test_fused_loss_without_padding():
    x, y = _batch(1)
    ref_loss, ref = _loss_and_grads(["baseline"], x, y)
    loss, grads = _loss_and_grads(["baseline", "fused_loss"], x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert _rel(grads["transformer.wte.weight"], ref["transformer.wte.weight"]) < 1e-5


def test_fp8_head_is_close_to_fp32():
    """float8 (e4m3 forward, e5m2 gradient) costs a few percent of gradient precision, no more."""
    x, y = _batch(2)
    ref_loss, ref = _loss_and_grads(["baseline", "vocab"], x, y)
    loss, grads = _loss_and_grads(["baseline", "vocab", "fused_loss", "fp8_head"], x, y)
    assert abs(loss.item() - ref_loss.item()) < 1e-3
    for name in ("transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight", "transformer.wpe.weight"):
        assert _rel(grads[name], ref[name]) < 0.06, name
    assert grads["transformer.wte.weight"][50257:].abs().max() == 0


def test_fp8_gradient_scale_cannot_overflow():
    # softmax - onehot lies in [-1, 1]; scaled by GRAD_SCALE it must fit e5m2 without saturating.
    assert GRAD_SCALE <= torch.finfo(torch.float8_e5m2).max
    g = torch.tensor([-1.0, 1.0, 1e-6, -3e-7]) * GRAD_SCALE
    back = g.to(torch.float8_e5m2).float() / GRAD_SCALE
    assert torch.isfinite(back).all() and back[0] == -1 and back[1] == 1


def test_eval_without_grad_uses_the_plain_classifier():
    """Under no_grad the fused path would waste work on gradients; the model falls back to logits + loss."""
    model = build_model(TINY, setup_for(["baseline", "vocab", "fused_loss"]), CPU, seed=0)
    x, y = _batch(3)
    with torch.no_grad():
        logits, loss = model(x, y)
    assert logits is not None and logits.shape[-1] == 50304
    _, train_loss = model(x, y)
    torch.testing.assert_close(loss, train_loss.detach(), rtol=1e-6, atol=1e-6)


def test_fused_loss_under_compile():
    x, y = _batch(4)
    model = build_model(TINY, setup_for(["baseline", "vocab", "fused_loss"]), CPU, seed=0)
    compiled = torch.compile(model, backend="eager")
    _, loss = compiled(x, y)
    loss.backward()
    ref_loss, ref = _loss_and_grads(["baseline", "vocab"], x, y)
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-6, atol=1e-6)
    assert _rel(model.lm_head.weight.grad, ref["transformer.wte.weight"]) < 1e-5


def test_loss_fn_flags():
    assert make_loss_fn(50257, fp8=True).fp8 and not make_loss_fn(50257).fp8
