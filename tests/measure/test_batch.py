"""One batch for every rung: chosen from the estimate on simulated cards, confirmed (or shrunk) by a probe;
train's micro-batch and CUDA graph, and bench's shorter sequences where a full one does not fit."""

import dataclasses

import pytest
import torch

from gpt2ladder.errors import LadderError
from gpt2ladder.ladder import resolve_rungs, setup_for, why_unavailable
from gpt2ladder.measure import batch as batch_mod
from gpt2ladder.measure.batch import longest_fitting_seq_len, plan_batch, plan_bench_batch, plan_training
from gpt2ladder.measure.harness import climb
from gpt2ladder.model.config import preset
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.runtime.memory import GiB

CUDA = torch.device("cuda")
AMPERE_8GB = Capabilities("cuda", "NVIDIA GeForce RTX 3070", (8, 6), total_memory=8 * GiB, triton_version="3.6.0")
T4_16GB = Capabilities("cuda", "Tesla T4", (7, 5), total_memory=16 * GiB, triton_version="3.6.0")
RTX_24GB = Capabilities("cuda", "NVIDIA GeForce RTX 4090", (8, 9), total_memory=24 * GiB, triton_version="3.6.0")
A100_80GB = Capabilities("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), total_memory=80 * GiB, triton_version="3.6.0")


def hopper(gib: float, capped: bool = False) -> Capabilities:
    """A Hopper card of `gib` GiB (every rung of the ladder runs there), or an H200 capped to stand in for it."""
    if capped:
        return Capabilities("cuda", "NVIDIA H200", (9, 0), total_memory=int(139.8 * GiB), triton_version="3.6.0",
                            free_memory=139 * GiB, memory_cap=int(gib * GiB))
    return Capabilities("cuda", "NVIDIA H100 PCIe", (9, 0), total_memory=int(gib * GiB), triton_version="3.6.0")


def _rows(spec: str, caps: Capabilities):
    return [(r.name, setup_for(list(r.applied))) for r in climb(resolve_rungs(spec, caps),
                                                                 lambda n: why_unavailable(n, caps))
            if r.reason is None]


@pytest.mark.parametrize("caps, heaviest, batch", [
    (AMPERE_8GB, "bf16", 2),   # bf16's eager autocast keeps an fp32 and a bf16 copy of the scores
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
    fp16 = plan_batch(preset("gpt2"), rows[:2], 1024, T4_16GB, CUDA, want=16, divides=16, probe=False)
    assert fp16.heaviest == "fp16" and plan.per_sequence == fp16.per_sequence  # its eager step, scores in both dtypes
    assert plan.batch == 4
    rungs, graphed, notice = plan_training(preset("gpt2"), tuple(n for n, _ in rows), 1024, T4_16GB, CUDA, 16,
                                           validates=True, probe=False)
    assert "cuda_graph" in rungs and notice is None and graphed.batch == 8  # a graph of accumulated steps


def test_auto_asks_for_the_largest_size_at_which_every_rung_fits():
    plan = plan_batch(preset("gpt2"), _rows("seed", A100_80GB), 1024, A100_80GB, CUDA, probe=False)
    assert plan.batch == plan.largest > 16


def test_training_keeps_its_tokens_per_step_by_accumulation():
    """The micro-batch divides the step's 16 sequences; accumulation makes up the rest."""
    # The T4 trains with fp16 + GradScaler and without the fused loss (it needs bf16): a heavier step.
    for caps, micro in [(AMPERE_8GB, 4), (T4_16GB, 8), (RTX_24GB, 16)]:
        rungs = tuple(n for n, _ in _rows("auto", caps))
        kept, plan, _ = plan_training(preset("gpt2"), rungs, 1024, caps, CUDA, 16, validates=True, probe=False)
        assert plan.batch == micro and 16 % plan.batch == 0 and kept == rungs
    no_graph = [(n, s) for n, s in _rows("auto", AMPERE_8GB) if not s.cuda_graph][-1:]
    tight = Capabilities("cuda", "small", (8, 6), total_memory=int(6.5 * GiB))
    plan = plan_batch(preset("gpt2"), no_graph, 1024, tight, CUDA, want=16, divides=16, probe=False)
    assert plan.largest == 6 and plan.batch == 4  # 6 fit, 4 divides 16
    assert "6 fit on this 6.5 GiB GPU, 6 GiB of it for PyTorch; 4 divides the step" in plan.reason()


@pytest.mark.parametrize("capped", [False, True], ids=["card", "stand-in"])
@pytest.mark.parametrize("gib, micro, graph", [(4, 1, False), (6, 4, True), (8, 4, True)])
def test_train_on_small_cards_at_gpt2_1024(gib, micro, graph, capped):
    """train's default step (16 x 1024 tokens) of GPT-2 124M with every rung of auto. At 4 GiB the graphed
    step does not fit one sequence beside validation (the graph's pool keeps the step's activations):
    trained without it, and without the rungs that pay only inside one, said in a notice."""
    caps = hopper(gib, capped)
    rungs = tuple(n for n, _ in _rows("auto", caps))
    assert rungs[-5:] == ("adamw_kernel", "memset_fill", "cublaslt", "bias_in_wgrad", "tied_grad")
    assert "cuda_graph" in rungs
    kept, plan, notice = plan_training(preset("gpt2"), rungs, 1024, caps, CUDA, 16, validates=True,
                                       graph_only_too=True, probe=False)
    assert (plan.batch, 16 // plan.batch, "cuda_graph" in kept) == (micro, 16 // micro, graph)
    if graph:
        assert kept == rungs and notice is None
    else:
        assert kept == tuple(n for n in rungs if n not in ("cuda_graph", "bf16_residual", "gelu_kernel",
                                                           "fp32_wgrad", "weight_cast", "norm_kernel",
                                                           "proj_bias", "fp8_fc", "fp8_dgrad", "adamw_kernel",
                                                           "memset_fill", "bias_in_wgrad"))
        assert notice.startswith("notice: training without a CUDA graph (nor bf16_residual, gelu_kernel, "
                                 "fp32_wgrad, weight_cast, norm_kernel, proj_bias, fp8_fc, fp8_dgrad, adamw_kernel, "
                                 "memset_fill, bias_in_wgrad, which pay "
                                 "only inside one)")
        assert "3.53 GiB with it and needs 2.83 GiB without, of 3.22 GiB planned for on this 4 GiB" in notice
        named = plan_training(preset("gpt2"), rungs, 1024, caps, CUDA, 16, validates=True, probe=False)[0]
        assert named == tuple(n for n in rungs if n != "cuda_graph")  # rungs named by hand: only the graph goes


@pytest.mark.parametrize("capped", [False, True], ids=["card", "stand-in"])
@pytest.mark.parametrize("gib, batch, seq_len", [(4, 1, 512), (6, 1, 1024), (8, 2, 1024)])
def test_bench_seed_rungs_on_small_cards_at_gpt2_1024(gib, batch, seq_len, capped):
    """bench's default: the write-up's rungs at up to 16 x 1024. At 4 GiB not even one sequence of 1024
    fits the bf16 rung, so every rung runs at 512 tokens, and the first line says so."""
    caps = hopper(gib, capped)
    plan = plan_bench_batch(preset("gpt2"), _rows("seed", caps), 1024, caps, CUDA, want=16, probe=False)
    assert (plan.batch, plan.seq_len) == (batch, seq_len)
    if seq_len < 1024:
        assert plan.shortened_from == 1024 and plan.full_length_heaviest == "bf16"
        assert plan.reason().startswith("sequences of 512 tokens: not even one of 1024 fits every rung (the bf16 "
                                        "rung needs 3.59 GiB for one, of 3.22 GiB planned for), so every rung runs "
                                        "at 512, the longest power of two that fits; batch 1: ")
    else:
        assert plan.shortened_from is None and plan.reason().startswith(f"batch {batch}: the bf16 rung")


def test_a_length_asked_for_is_not_shortened():
    caps = hopper(4)
    with pytest.raises(LadderError, match="not even one sequence of 1024 tokens fits: the bf16 rung needs 3.59 GiB "
                                          "for one, more than the 3.22 GiB planned for on this 4 GiB GPU, 3.5 GiB of "
                                          "it for PyTorch; use a smaller --seq-len, fewer --rungs or --preset tiny"):
        plan_bench_batch(preset("gpt2"), _rows("seed", caps), 1024, caps, CUDA, want=16, probe=False, shorten=False)


def test_the_longest_length_that_fits_is_a_power_of_two():
    rows, cfg = _rows("seed", hopper(4)), preset("gpt2")
    assert longest_fitting_seq_len(cfg, rows, 1024, hopper(4).usable_memory) == 512
    assert longest_fitting_seq_len(cfg, rows, 1000, hopper(4).usable_memory) == 512
    assert longest_fitting_seq_len(cfg, rows, 1024, hopper(3).usable_memory) == 256
    assert longest_fitting_seq_len(cfg, rows, 1024, 2 * GiB) is None  # the weights and AdamW alone need 1.9 GiB
    plan = plan_bench_batch(cfg, rows, 1024, hopper(3), CUDA, want=16, probe=False)
    assert (plan.seq_len, plan.shortened_from) == (256, 1024)


def test_a_cap_is_what_every_decision_plans_for():
    capped = Capabilities("cuda", "NVIDIA H200", (9, 0), total_memory=140 * GiB, memory_cap=8 * GiB)
    plan = plan_batch(preset("gpt2"), _rows("seed", capped), 1024, capped, CUDA, want=16, probe=False)
    card = plan_batch(preset("gpt2"), _rows("seed", AMPERE_8GB), 1024, AMPERE_8GB, CUDA, want=16, probe=False)
    assert plan.batch == card.batch == 2 and plan.capped and "8 GiB (--gpu-memory) GPU" in plan.reason()


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
    card = Capabilities("cuda", "NVIDIA RTX A2000 12GB", (8, 6), total_memory=12 * GiB, triton_version="3.6.0")
    plan = plan_batch(preset("gpt2"), _rows("seed", card), 1024, card, CUDA, want=3)
    assert plan.batch == 2 and plan.probed_peak is not None
    assert [c[2] for c in calls] == [3, 2] and all(c[:2] == (False, False) for c in calls)  # eager steps


@pytest.mark.parametrize("peak, measured", [(None, "ran out of memory"), (int(3.4 * GiB), "peaked at 3.40 GiB")])
def test_a_probe_that_never_fits_says_what_it_measured_not_the_estimate(monkeypatch, peak, measured):
    """The estimate fits one sequence (2.56 GiB of the 3.22 GiB planned for), the probes do not: the line
    names the probe's last size and what it found, never '2.56 GiB for one, more than 3.22 GiB'."""
    sizes = []

    def fake_probe(cfg, setup, seq_len, batch, device, seed=0):
        sizes.append(batch)
        return peak

    monkeypatch.setattr(batch_mod, "probe_peak", fake_probe)
    card = hopper(4, capped=True)
    with pytest.raises(LadderError) as err:
        plan_batch(preset("gpt2"), _rows("seed", card)[:1], 512, card, CUDA, want=16)
    text = str(err.value)
    assert sizes and sizes[-1] == 1 and "\n" not in text
    assert f"at batch 1 {measured}" in text and "3.22 GiB planned for" in text, text
    assert "more than the" not in text  # the estimate (2.56 GiB) is less than what was planned for


def test_probes_that_run_out_before_batch_1_do_not_claim_that_one_cannot_fit(monkeypatch):
    monkeypatch.setattr(batch_mod, "probe_peak", lambda *a, **k: None)  # every probe runs out of memory
    with pytest.raises(LadderError) as err:
        plan_batch(preset("gpt2"), _rows("seed", A100_80GB), 1024, A100_80GB, CUDA, want=16)
    text = str(err.value)
    assert "not even one" not in text and "passed its probe" in text and "ran out of memory" in text, text
    assert f"the last of {batch_mod.PROBES} tries" in text and "--batch-size" in text


def test_under_torchrun_every_rank_plans_against_the_tightest_ranks_memory(monkeypatch):
    """Two 80 GiB ranks, one with another process's 76 GiB on its GPU: planned apart, the busy rank would
    leave the CUDA graph out and the other keep it, and the two would run different steps. Both plan
    against the tightest rank's free memory, so both leave it out."""
    from gpt2ladder.commands.train import tightest_rank
    from gpt2ladder.runtime import distributed
    from gpt2ladder.runtime.distributed import Dist

    free = {0: 79 * GiB, 1: 3 * GiB + GiB // 2}  # what each rank's GPU has free
    monkeypatch.setattr(distributed, "reduce_floats",
                        lambda values, dist, op: [min(free.values())] if op == "min" else values)
    card = Capabilities("cuda", "NVIDIA H100 80GB HBM3", (9, 0), total_memory=80 * GiB, triton_version="3.6.0")
    rungs = tuple(n for n, _ in _rows("auto", card))
    kept = {}
    for rank, own in free.items():
        apart = dataclasses.replace(card, free_memory=own)
        alone = plan_training(preset("gpt2"), rungs, 1024, apart, CUDA, 16, validates=True, probe=False)[0]
        shared = tightest_rank(apart, Dist(rank=rank, world_size=2, backend="nccl"))
        assert shared.usable_memory == 3 * GiB + GiB // 2
        kept[rank] = ("cuda_graph" in alone,
                      plan_training(preset("gpt2"), rungs, 1024, shared, CUDA, 16, validates=True, probe=False)[0])
    assert kept[0][0] and not kept[1][0]  # planned apart, the ranks would disagree
    assert kept[0][1] == kept[1][1] and "cuda_graph" not in kept[0][1]
    assert tightest_rank(card) is card  # a single process plans against its own GPU
