"""What the GPU tests share: the device, the tiny preset, the top of `auto` without one rung, random batches on
the GPU, and the losses of a few steps of one setup. Imported by the tests/*/*_gpu.py test files (tests/ is on
sys.path through its conftest)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
GPU = torch.device("cuda")
TINY = PRESETS["tiny"]
# How far apart two runs of the top of `auto` on the same batches may end eight steps of the tiny model: the step's
# atomic sums (the embedding's gradient) round in whatever order they land, and AdamW's first updates, each about
# the learning rate times the gradient's sign, carry a gradient near zero's rounding into the weights. Two runs
# that differ in nothing the update reads (the AdamW kernel leaving the gradients as given) ended up to 2.0e-4
# apart on an H200 (benchmarks/records/2026-12-03_tied-grad); this allows five times that.
LOSS_ROUNDING = 1e-3


def auto_without(rung: str) -> list[str]:
    """The rungs of `auto` on this GPU but `rung`, which must be one of them: the top of `auto` without it, to
    compare with the top as it is (these rungs and `rung`)."""
    auto = resolve_rungs("auto", detect(GPU))
    assert rung in auto, (rung, auto)
    return [n for n in auto if n != rung]


def random_batches(n, b=8, t=256):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 50257, (b, t), generator=gen).to(GPU),
             torch.randint(0, 50257, (b, t), generator=gen).to(GPU)) for _ in range(n)]


def step_losses(names, batches, **kw):
    engine = Engine(TINY, setup_for(names), GPU, seed=0, **kw)
    return [engine.step(x, y).item() for x, y in batches]


def losses_without_and_with(names, rung, steps: int = 8):
    """The losses of `steps` steps on the same random batches with the rungs `names`, then with `rung` added."""
    batches = random_batches(steps)
    return step_losses(names, batches), step_losses(names + [rung], batches)


def grad_gaps(a: Engine, b: Engine) -> dict[str, float]:
    """For each parameter with a gradient, |grad_a - grad_b| / |grad_b| (Frobenius norms): how far two engines'
    last steps' gradients are apart, relative to their size."""
    grads_b = {n: p.grad for n, p in b.raw_model.named_parameters() if p.grad is not None}
    gaps = {n: ((p.grad.float() - grads_b[n].float()).norm() / grads_b[n].float().norm()).item()
            for n, p in a.raw_model.named_parameters() if p.grad is not None}
    assert gaps and gaps.keys() == grads_b.keys()
    return gaps


def in_fresh_process(path: str, name: str) -> None:
    """Run the function `name` of the test file `path` in a new Python process and fail with its output if
    it fails: memory readings and --gpu-memory caps there see no other test's live or cached allocations
    (a cap counts everything the process holds, and the tests before this one leave some behind)."""
    where = Path(path).resolve()
    code = (f"import sys; sys.path[:0] = [{str(where.parent)!r}, {str(Path(__file__).parent)!r}]; "
            f"import {where.stem}; {where.stem}.{name}()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
