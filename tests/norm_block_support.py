"""What the CPU tests of the norm Blocks' variants share (tests/kernels/test_norm_kernel.py,
tests/speedups/test_fp8_forward.py): tiny GPT-2s on a bf16 residual stream, rewired, with AddNorm's PyTorch
expressions standing in for the norm kernels, and one training step of each under CPU autocast."""

import dataclasses

import torch

from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, init_weights

CFG = dataclasses.replace(PRESETS["tiny"], attention="sdpa", low_precision_residual=True)


def rewired_models(monkeypatch, before, variants: dict) -> dict:
    """{key: a tiny GPT-2 with the rewrites in `before` ("gelu_kernel", "fp32_wgrad", "qkv_grad"),
    then use_norm_kernel(model,
    **variants[key])}, all from the same weights; kernels_run patched so that AddNorm runs on a CPU."""
    import gpt2ladder.speedups.norm_block as nb
    from gpt2ladder.speedups.fp32_wgrad import use_fp32_wgrad
    from gpt2ladder.speedups.gelu_mlp import use_gelu_kernel

    monkeypatch.setattr(nb, "kernels_run", lambda h: h.dtype == torch.bfloat16 and torch.is_grad_enabled())
    models = {}
    for key, kwargs in variants.items():
        model = init_weights(GPT(CFG), 0)
        if "gelu_kernel" in before:
            assert use_gelu_kernel(model)
        if "fp32_wgrad" in before:
            assert use_fp32_wgrad(model)
        if "qkv_grad" in before:
            from gpt2ladder.speedups.qkv_grad import use_qkv_kernel

            assert use_qkv_kernel(model)
        nb.use_norm_kernel(model, **kwargs)
        models[key] = model
    return models


def one_step_each(models: dict, calls: list) -> tuple[dict, dict]:
    """Forward and backward of one batch through each model under CPU autocast: ({key: loss}, {key: what was
    appended to `calls` meanwhile})."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(0, CFG.vocab_size, (2, 16), generator=gen)
    y = torch.randint(0, CFG.vocab_size, (2, 16), generator=gen)
    losses, seen = {}, {}
    for key, model in models.items():
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        losses[key], seen[key] = loss.item(), list(calls)
    return losses, seen
