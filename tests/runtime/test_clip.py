"""Gradient clipping: with fused AdamW the factor goes to the optimizer (its `grad_scale`) instead of a pass over
every gradient, and the training is clip_grad_norm_'s up to the rounding of one division."""

import pytest
import torch

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine, OptimConfig

CPU = torch.device("cpu")


def train(rungs: list[str], clip: float, in_optimizer: bool | None = None, steps: int = 3, accum: int = 1):
    engine = Engine(PRESETS["tiny"], setup_for(rungs), CPU, optim=OptimConfig(lr=3e-3, grad_clip=clip),
                    compile_backend="eager")
    if in_optimizer is False:
        engine._clips_in_optimizer = lambda params: False
    real_clip = engine._clip
    engine.scales = []  # the factors the optimizer was given
    engine._clip = lambda: engine.scales.append(real_clip()) or engine.scales[-1]
    passes = []
    real = torch.nn.utils.clip_grad_norm_
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50257, (steps, accum, 2, 32), generator=gen)
    y = torch.randint(0, 50257, (steps, accum, 2, 32), generator=gen)
    norms = []
    try:
        torch.nn.utils.clip_grad_norm_ = lambda *a, **k: passes.append(1) or real(*a, **k)
        for i in range(steps):
            engine.step(x[i], y[i])
            norms.append(torch.nn.utils.get_total_norm([p.grad for p in engine.raw_model.parameters()]).item())
    finally:
        torch.nn.utils.clip_grad_norm_ = real
    return engine, len(passes), norms


@pytest.mark.parametrize("clip,accum", [(0.05, 1), (100.0, 1), (0.05, 2)])  # every step clipped; none; accumulated
def test_fused_adamw_clips_through_its_grad_scale_as_clip_grad_norm_does(clip, accum):
    rungs = ["baseline", "fused_adamw"]
    fused, passes, norms = train(rungs, clip, accum=accum)
    plain, plain_passes, plain_norms = train(rungs, clip, in_optimizer=False, accum=accum)
    assert not hasattr(fused.optimizer, "grad_scale")  # given for each step only, as a GradScaler does
    assert all(s is None for s in plain.scales) and len(fused.scales) == 3
    assert passes == 0 and plain_passes == 3  # the optimizer's factor, not clip_grad_norm_'s pass
    # both leave the gradients clipped: the fused kernel writes back what it read, divided by grad_scale
    assert norms == pytest.approx(plain_norms, rel=1e-4)
    if clip < 1:
        assert all(s.item() > 10 for s in fused.scales)  # clipped hard: the factor matters
        assert norms == pytest.approx([clip] * 3, rel=1e-4)
    else:
        assert all(s.item() == 1.0 for s in fused.scales)
    plain_params = dict(plain.raw_model.named_parameters())
    for name, p in fused.raw_model.named_parameters():
        # one division instead of a multiplication; Adam magnifies that rounding where a gradient is near zero
        torch.testing.assert_close(p, plain_params[name], rtol=1e-5, atol=1e-5, msg=name)
    if clip < 1:  # and clipping changed the training
        unclipped, _, _ = train(rungs, 1e9)
        assert max((a - b).abs().max().item() for a, b in zip(fused.raw_model.parameters(),
                                                               unclipped.raw_model.parameters())) > 1e-4


def test_the_unfused_optimizer_keeps_clip_grad_norm():
    engine, passes, _ = train(["baseline"], 0.05, steps=2)
    assert passes == 2 and engine.scales == [None, None]
