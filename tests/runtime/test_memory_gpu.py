"""--gpu-memory on a real GPU: the allocator refuses past what a card of that size leaves it, and the planned
batch runs under it."""

import pytest
import torch
from gpu_support import GPU, in_fresh_process, needs_cuda

from gpt2ladder.ladder import resolve_rungs, setup_for, why_unavailable
from gpt2ladder.measure.batch import plan_bench_batch
from gpt2ladder.measure.harness import climb
from gpt2ladder.model.config import preset
from gpt2ladder.runtime.hardware import cap_memory, detect
from gpt2ladder.runtime.memory import GiB

pytestmark = pytest.mark.gpu


@needs_cuda
def test_a_cap_holds_and_the_plan_fits_under_it():
    """A 4 GiB card leaves its allocator 3.5 GiB: not one sequence of 1024 fits the seed rungs, 512 does.
    In a process of its own, as on a real card: the cap counts what earlier tests left cached."""
    in_fresh_process(__file__, "cap_holds_and_the_plan_fits")


def cap_holds_and_the_plan_fits():
    caps = cap_memory(GPU, detect(GPU), 4.0)
    try:
        assert caps.usable_memory == int(3.5 * GiB)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(3.6 * GiB), dtype=torch.uint8, device=GPU)
        rows = [(r.name, setup_for(list(r.applied)))
                for r in climb(resolve_rungs("seed", caps), lambda n: why_unavailable(n, caps)) if r.reason is None]
        plan = plan_bench_batch(preset("gpt2"), rows, 1024, caps, GPU, want=16)
        assert (plan.seq_len, plan.shortened_from) == (512, 1024)
        assert plan.batch >= 1 and plan.probed_peak is not None and plan.probed_peak <= 0.92 * caps.usable_memory
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, GPU.index or 0)
        torch.cuda.empty_cache()
