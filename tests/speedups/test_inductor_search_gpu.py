"""multi_kernel and triton_tuning on a GPU: with them Inductor's compiled step at the top of `auto` races a reduction's
two forms and tunes its Triton kernels (both seen happening, before the CUDA graph is captured), and computes the
gradients and losses it computes without them, to the rounding of sums taken in another order. Skipped without a
GPU."""

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from gpu_support import GPU, LOSS_ROUNDING, TINY, grad_gaps, needs_cuda, needs_triton, random_batches
from torch._inductor.codegen import multi_kernel
from torch._inductor.runtime import triton_heuristics

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect

pytestmark = pytest.mark.gpu


@needs_cuda
@needs_triton
def test_the_searches_run_before_the_capture_and_keep_the_steps_gradients_and_losses(monkeypatch):
    races, tunings = {}, []
    race, tune = multi_kernel.MultiKernelCall.run, triton_heuristics.CachingAutotuner.coordinate_descent_tuning

    def run(self, *args, **kwargs):
        if self.picked_kernel is None:  # the race, at the first call
            races[self.multi_kernel_name] = (len(self.kernels), torch.cuda.is_current_stream_capturing())
        return race(self, *args, **kwargs)

    def coordinate_descent_tuning(self, *args, **kwargs):
        tunings.append(torch.cuda.is_current_stream_capturing())
        return tune(self, *args, **kwargs)

    monkeypatch.setattr(multi_kernel.MultiKernelCall, "run", run)
    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "coordinate_descent_tuning", coordinate_descent_tuning)
    monkeypatch.setenv("TORCHINDUCTOR_DISABLE_MULTI_KERNEL_CACHE", "1")  # race here, whatever ran on this machine
    names = resolve_rungs("auto", detect(GPU))
    batches = random_batches(8)
    with inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        engines = [Engine(TINY, setup_for(rungs), GPU, seed=0) for rungs in (names, names + ["multi_kernel",
                                                                                             "triton_tuning"])]
        losses = [[e.step(*batches[0]).item()] for e in engines]
        gaps = grad_gaps(engines[1], engines[0])
        for engine, run_ in zip(engines, losses):
            run_ += [engine.step(x, y).item() for x, y in batches[1:]]
    print("races", races, "tunings", len(tunings))
    assert races and all(n == 2 and not capturing for n, capturing in races.values())
    assert tunings and not any(tunings)
    print(f"largest gradient gap {max(gaps.values()):.2e} ({max(gaps, key=gaps.get)})")
    assert max(gaps.values()) < 1e-3, gaps  # sums in another order; a wrong kernel is off by ~1
    print("losses", *zip(*losses))
    assert losses[1] == pytest.approx(losses[0], rel=0, abs=LOSS_ROUNDING)
    assert losses[1][-1] < losses[1][0]
