"""What the GPU tests share: the device, the tiny preset, random batches on the GPU, and the losses of a
few steps of one setup. Imported by the tests/*/*_gpu.py test files (tests/ is on sys.path through its conftest)."""

import importlib.util

import pytest
import torch

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
GPU = torch.device("cuda")
TINY = PRESETS["tiny"]


def random_batches(n, b=8, t=256):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 50257, (b, t), generator=gen).to(GPU),
             torch.randint(0, 50257, (b, t), generator=gen).to(GPU)) for _ in range(n)]


def step_losses(names, batches, **kw):
    engine = Engine(TINY, setup_for(names), GPU, seed=0, **kw)
    return [engine.step(x, y).item() for x, y in batches]
