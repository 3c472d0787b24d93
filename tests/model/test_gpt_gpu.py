"""The model's attention kernels agree on a GPU; skipped without one."""

import pytest
import torch
from gpu_support import GPU, TINY, needs_cuda

from gpt2ladder.ladder import setup_for
from gpt2ladder.runtime.engine import build_model

pytestmark = pytest.mark.gpu


@needs_cuda
def test_sdpa_equals_manual_attention_on_gpu_in_bf16():
    x = torch.randint(0, 50257, (4, 256), device=GPU)
    manual = build_model(TINY, setup_for(["baseline"]), GPU, seed=0)
    flash = build_model(TINY, setup_for(["baseline", "flash"]), GPU, seed=0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = manual(x)[0].float(), flash(x)[0].float()
    assert ((a - b).norm() / a.norm()).item() < 1e-2
