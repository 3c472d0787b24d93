"""One batch for every rung: chosen from the estimate on simulated cards, confirmed (or shrunk) by a probe."""

import pytest
import torch

from gpt2ladder.errors import LadderError
from gpt2ladder.ladder import resolve_rungs, setup_for, why_unavailable
from gpt2ladder.measure import batch as batch_mod
from gpt2ladder.measure.batch import plan_batch
from gpt2ladder.measure.harness import climb
from gpt2ladder.model.config import preset
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.runtime.memory import GiB

CUDA = torch.device("cuda")
AMPERE_8GB = Capabilities("cuda", "NVIDIA GeForce RTX 3070", (8, 6), total_memory=8 * GiB, triton_version="3.6.0")
T4_16GB = Capabilities("cuda", "Tesla T4", (7, 5), total_memory=16 * GiB, triton_version="3.6.0")
RTX_24GB = Capabilities("cuda", "NVIDIA GeForce RTX 4090", (8, 9), total_memory=24 * GiB, triton_version="3.6.0")
A100_80GB = Capabilities("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), total_memory=80 * GiB, triton_version="3.6.0")


def _rows(spec: str, caps: Capabilities):
    return [(r.name, setup_for(list(r.applied))) for r in climb(resolve_rungs(spec, caps),
                                                                 lambda n: why_unavailable(n, caps)) if r.reason is None]


@pytest.mark.parametrize("caps, heaviest, batch", [
    (AMPERE_8GB, "bf16", 3),   # bf16's eager autocast keeps an fp32 and a bf16 copy of the scores
    (T4_16GB, "baseline", 7),  # no TF32 or bf16 before Ampere: the fp32 baseline is the heaviest there
    (RTX_24GB, "bf16", 11),
    (A100_80GB, "bf16", 16),   # 16 fits: the write-up's batch is kept
])
def test_the_default_ladder_gets_one_batch_that_fits_its_heaviest_rung(caps, heaviest, batch):
    plan = plan_batch(preset("gpt2"), _rows("seed", caps), 1024, caps, CUDA, want=16, probe=False)
    assert (plan.heaviest, plan.batch) == (heaviest, batch)
    assert plan.batch == 16 or f"on this {caps.total_memory // GiB} GiB GPU" in plan.reason()
    assert f"batch {batch}:" in plan.reason()


def test_a_t4_trains_with_fp16_and_a_grad_scaler():
    rows = _rows("auto", T4_16GB)
    assert "fp16" in [n for n, _ in rows] and rows[-1][1].autocast == "float16"
    plan = plan_batch(preset("gpt2"), rows[:4], 1024, T4_16GB, CUDA, want=16, divides=16, probe=False)
    assert plan.heaviest == "fp16" and plan.batch == 4  # its eager fp16 step keeps scores in both dtypes
    graphed = plan_batch(preset("gpt2"), rows, 1024, T4_16GB, CUDA, want=16, divides=16, probe=False)
    assert dict(rows)[graphed.heaviest].cuda_graph and graphed.batch == 4  # a graph of accumulated steps


def test_auto_asks_for_the_largest_size_at_which_every_rung_fits():
    plan = plan_batch(preset("gpt2"), _rows("seed", A100_80GB), 1024, A100_80GB, CUDA, probe=False)
    assert plan.batch == plan.largest > 16


def test_training_keeps_its_tokens_per_step_by_accumulation():
    """The micro-batch divides the step's 16 sequences; accumulation makes up the rest."""
    # The T4 trains with fp16 + GradScaler and without the fused loss (it needs bf16): a heavier step.
    # A CUDA graph that captures accumulated micro-batches counts each twice (measured at 8 GiB: 8 x 2
    # ran out of memory capturing, 4 x 4 fit), so the 8 GiB card trains at 4 x 4.
    for caps, micro in [(AMPERE_8GB, 4), (T4_16GB, 4), (RTX_24GB, 16)]:
        top = _rows("auto", caps)[-1:]
        plan = plan_batch(preset("gpt2"), top, 1024, caps, CUDA, want=16, divides=16, probe=False)
        assert plan.batch == micro and 16 % plan.batch == 0
    no_graph = [(n, s) for n, s in _rows("auto", AMPERE_8GB) if not s.cuda_graph][-1:]
    tight = Capabilities("cuda", "small", (8, 6), total_memory=int(5.5 * GiB))
    plan = plan_batch(preset("gpt2"), no_graph, 1024, tight, CUDA, want=16, divides=16, probe=False)
    assert plan.largest == 6 and plan.batch == 4  # 6 fit, 4 divides 16
    assert "6 fit on this 5.5 GiB GPU, 4 divides the step" in plan.reason()


def test_a_cap_is_what_every_decision_plans_for():
    capped = Capabilities("cuda", "NVIDIA H200", (9, 0), total_memory=140 * GiB, memory_cap=8 * GiB)
    plan = plan_batch(preset("gpt2"), _rows("seed", capped), 1024, capped, CUDA, want=16, probe=False)
    assert plan.batch == 3 and plan.capped and "8 GiB (--gpu-memory)" in plan.reason()


def test_nothing_fits_is_one_line():
    tiny_card = Capabilities("cuda", "small", (8, 6), total_memory=2 * GiB)
    with pytest.raises(LadderError, match="not even one sequence"):
        plan_batch(preset("gpt2"), _rows("seed", tiny_card), 1024, tiny_card, CUDA, want=16, probe=False)


def test_the_probe_confirms_or_shrinks_by_what_it_measured(monkeypatch):
    """The probe runs the heaviest rung only; a size that does not fit shrinks by the measured peak."""
    calls = []

    def fake_probe(cfg, setup, seq_len, batch, device, seed=0):
        calls.append((setup.compile, setup.cuda_graph, batch))
        return None if batch > 2 else int(batch * 1.9 * GiB + 1.9 * GiB)  # 3 runs out of memory

    monkeypatch.setattr(batch_mod, "probe_peak", fake_probe)
    plan = plan_batch(preset("gpt2"), _rows("seed", AMPERE_8GB), 1024, AMPERE_8GB, CUDA, want=16)
    assert plan.batch == 2 and plan.probed_peak is not None
    assert [c[2] for c in calls] == [3, 2] and all(c[:2] == (False, False) for c in calls)  # eager steps
