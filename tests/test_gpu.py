"""CUDA-only checks of the rungs that exist only there; skipped without a GPU."""

import pytest
import torch

from gpt2ladder.config import PRESETS
from gpt2ladder.engine import Engine, build_model
from gpt2ladder.rungs import setup_for

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU = torch.device("cuda")
TINY = PRESETS["tiny"]


def _batches(n, b=8, t=256):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 50257, (b, t), generator=gen).to(GPU),
             torch.randint(0, 50257, (b, t), generator=gen).to(GPU)) for _ in range(n)]


def _losses(names, batches, **kw):
    engine = Engine(TINY, setup_for(names), GPU, seed=0, **kw)
    return [engine.step(x, y).item() for x, y in batches]


@needs_cuda
def test_cuda_graph_replays_the_same_steps():
    """Capture warms up and then undoes its warm-up updates: the losses equal plain eager steps."""
    batches = _batches(5)
    plain = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"], batches)
    graphed = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph"], batches)
    assert graphed == pytest.approx(plain, rel=2e-3)


@needs_cuda
def test_sdpa_equals_manual_attention_on_gpu_in_bf16():
    x = torch.randint(0, 50257, (4, 256), device=GPU)
    manual = build_model(TINY, setup_for(["baseline"]), GPU, seed=0)
    flash = build_model(TINY, setup_for(["baseline", "flash"]), GPU, seed=0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = manual(x)[0].float(), flash(x)[0].float()
    assert ((a - b).norm() / a.norm()).item() < 1e-2


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_fp8_head_trains_like_bf16():
    batches = _batches(8)
    bf16 = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss"], batches)
    fp8 = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss", "fp8_head"], batches)
    assert fp8[0] == pytest.approx(bf16[0], abs=2e-2)
    assert fp8[-1] == pytest.approx(bf16[-1], rel=2e-2)
    assert fp8[-1] < fp8[0]


@needs_cuda
def test_fused_loss_matches_on_gpu():
    batches = _batches(4)
    plain = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab"], batches)
    fused = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss"], batches)
    assert fused == pytest.approx(plain, rel=5e-3)


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_fp8_linears_train_like_bf16():
    """The Blocks' Linears in float8, compiled and graphed: the same losses as bf16 within float8's precision."""
    batches = _batches(8)
    upto = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"]
    bf16 = _losses(upto, batches)
    fp8 = _losses(upto + ["fp8_mlp", "fp8_attn", "cuda_graph"], batches)
    assert fp8[0] == pytest.approx(bf16[0], abs=2e-2)
    assert fp8[-1] == pytest.approx(bf16[-1], rel=2e-2)
    assert fp8[-1] < fp8[0]
