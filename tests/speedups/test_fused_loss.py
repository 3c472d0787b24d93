"""The fused classifier loss computes the ordinary loss and gradients; float8 stays within its precision."""

import torch

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import Classifier
from gpt2ladder.runtime.engine import build_model
from gpt2ladder.speedups.fused_loss import GRAD_SCALE, FusedLossHead

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
    """float8 (e4m3 forward, e5m2 gradient) costs a few percent of gradient precision, no more. On a CPU the float8
    products run in fp32 from the float8 operands (`speedups.common.scaled_mm`), so this is float8's rounding alone."""
    x, y = _batch(2, b=2, t=64)
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


def test_fused_head_keeps_the_weight_and_its_flags():
    head = Classifier(8, 16, bias=False)
    fused = FusedLossHead.from_head(head, fp8=True)
    assert fused.weight is head.weight and fused.fused and fused.fp8 and not fused.kernel
    assert not FusedLossHead.from_head(head).fp8 and not head.fused


def test_transposed_fp8_gradient_is_the_transpose():
    """The weight gradient's operand is the same e5m2 gradient, evaluated directly in (V, N) layout."""
    from gpt2ladder.speedups.fused_loss import E5M2, _logit_grad, _lse_and_loss

    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(32, 160, generator=gen) * 3).to(torch.bfloat16)
    targets = torch.randint(0, 150, (32,), generator=gen)
    lse, _ = _lse_and_loss(logits, targets, 150)
    g = _logit_grad(logits, lse, targets[:, None], 150, GRAD_SCALE, E5M2)
    g_t = _logit_grad(logits.t(), lse.t(), targets[None, :], 150, GRAD_SCALE, E5M2, vocab_dim=0)
    assert torch.equal(g_t.view(torch.uint8), g.t().contiguous().view(torch.uint8))
    gf = g.float() / GRAD_SCALE
    assert gf[:, 150:].abs().max() == 0  # padded columns: exactly zero
    assert (gf.gather(1, targets[:, None]) < 0).all()  # softmax - 1 at the target
    exact = torch.softmax(logits.float()[:, :150], 1) - torch.nn.functional.one_hot(targets, 150)
    # e5m2 keeps 2 mantissa bits: each element within 12.5% of softmax - onehot (plus the subnormal floor)
    assert ((gf[:, :150] - exact).abs() <= 0.125 * exact.abs() + 2**-16 / GRAD_SCALE * 4).all()


def test_fused_loss_under_inductor_matches_eager():
    """What the GPU runs: the loss and gradient expressions through inductor's code generator."""
    from gpt2ladder.speedups.fused_loss import LossAndGrad

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(64, 32, generator=gen, requires_grad=True)
    w = (torch.randn(192, 32, generator=gen) * 0.1).requires_grad_()
    y = torch.randint(0, 180, (64,), generator=gen)

    def f(x, w, y):
        return LossAndGrad.apply(x, w, y, 180, torch.float32, False, False)

    eager = f(x, w, y)
    gx, gw = torch.autograd.grad(eager, (x, w))
    compiled = torch.compile(f, backend="inductor")(x, w, y)
    cx, cw = torch.autograd.grad(compiled, (x, w))
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cx, gx, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(cw, gw, rtol=1e-4, atol=1e-6)
    assert cw[180:].abs().max() == 0


def test_eager_loss_pass_in_row_pieces_gives_the_same_numbers(monkeypatch):
    """Eagerly the loss pass goes through the rows in pieces (no fp32 (N, V) temporaries); same results."""
    from gpt2ladder.speedups import fused_loss as fused

    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(130, 200, generator=gen) * 3).to(torch.bfloat16)
    targets = torch.randint(0, 190, (130,), generator=gen)
    for dtype, scale, transposed in [(torch.bfloat16, 1 / 130, False), (fused.E5M2, GRAD_SCALE, True)]:
        whole = fused._loss_pass(logits, targets, 190, scale, dtype, transposed)
        monkeypatch.setattr(fused, "EAGER_CHUNK_ROWS", 48)  # 48 + 48 + 34 rows
        pieces = fused._loss_pass(logits, targets, 190, scale, dtype, transposed)
        monkeypatch.undo()
        torch.testing.assert_close(pieces[0], whole[0], rtol=1e-6, atol=1e-6)
        assert torch.equal(pieces[1].view(torch.uint8), whole[1].view(torch.uint8))
        if transposed:
            assert torch.equal(pieces[2].view(torch.uint8), whole[2].view(torch.uint8))
            assert torch.equal(pieces[2].view(torch.uint8), whole[1].t().contiguous().view(torch.uint8))
        else:
            assert pieces[2] is None and whole[2] is None


def _modern_loss_and_grads(names, x, y, parts=("softcap", "untied_head", "relu2")):
    import dataclasses

    model = build_model(dataclasses.replace(TINY, parts=parts), setup_for(names), CPU, seed=0)
    model.lm_head.weight.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))  # logits that reach the cap
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_fused_loss_with_a_soft_cap_is_the_capped_models_loss_and_gradients():
    """softcap * tanh(z / softcap) before the cross-entropy: the fused pass's gradient goes on through the cap's
    derivative, and padded columns still get none."""
    x, y = _batch(3)
    ref_loss, ref = _modern_loss_and_grads(["baseline", "vocab"], x, y)
    loss, grads = _modern_loss_and_grads(["baseline", "vocab", "fused_loss"], x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name in ref:
        assert _rel(grads[name], ref[name]) < 1e-5, name
    assert grads["lm_head.weight"][50257:].abs().max() == 0
    uncapped, _ = _modern_loss_and_grads(["baseline", "vocab"], x, y, parts=("untied_head", "relu2"))
    assert abs(uncapped.item() - ref_loss.item()) > 0.1  # the cap is in force at these logits


def test_the_float8_head_with_a_soft_cap_stays_within_float8s_precision():
    x, y = _batch(4)
    ref_loss, ref = _modern_loss_and_grads(["baseline", "vocab"], x, y)
    loss, grads = _modern_loss_and_grads(["baseline", "vocab", "fused_loss", "fp8_head"], x, y)
    assert abs(loss.item() - ref_loss.item()) < 2e-2
    assert _rel(grads["lm_head.weight"], ref["lm_head.weight"]) < 0.06
