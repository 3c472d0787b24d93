"""The step-memory estimate: over, never under, what every rung measured on an H200, and close to it
for the rungs that set the batch; and the terms derived rather than fitted, counted as derived."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import preset
from gpt2ladder.model.setup import Setup
from gpt2ladder.runtime.memory import GRAPH_BYTES, GiB, eval_bytes_per_sequence, parameters, step_memory

RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "records" / "2026-12-01_ladder-layout"


def _measured(name: str) -> list[tuple[str, list[str], int, int]]:
    record = json.loads((RECORD / name).read_text())
    names = [r["name"] for r in record["rungs"]]
    return [(r["name"], names[:i + 1], record["config"]["batch_size"], r["peak_mem_bytes"])
            for i, r in enumerate(record["rungs"]) if r["status"] == "ok"]


@pytest.mark.parametrize("rung, applied, batch, peak", _measured("ladder.json") + _measured("ladder-b4.json"),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_the_estimate_covers_what_the_h200_measured(rung, applied, batch, peak):
    setup = setup_for(applied)
    if setup.cuda_graph:  # recorded when the capture kept a copy of the weights on the GPU (now in host memory)
        peak -= 4 * parameters(preset("gpt2"), setup)
    est = step_memory(preset("gpt2"), setup, 1024).at(batch)
    assert est >= peak, f"{rung} at batch {batch}: estimated {est / GiB:.2f} GiB, measured {peak / GiB:.2f}"
    slack = 0.35 * GiB if rung in ("baseline", "tf32", "bf16") else 1.7 * GiB  # the eager rungs set the batch
    assert est - peak < slack


def test_parameters_count_the_padded_vocabulary_once():
    cfg = preset("gpt2")
    assert parameters(cfg, Setup()) == 124_439_808  # GPT-2 124M, as Hugging Face counts it
    assert parameters(cfg, Setup(vocab_multiple=128)) - parameters(cfg, Setup()) == 47 * 768


@pytest.mark.parametrize("parts", [("untied_head", "bf16_tables"), ("untied_head", "value_embeds", "bf16_tables"),
                                   ("rope", "untied_head", "value_embeds", "bf16_tables")])
def test_bf16_tables_hold_8_bytes_a_parameter_the_rest_16(parts):
    """A bf16 table's weight, gradient and AdamW's two moments are 2 bytes each: the fixed part counts the tables the
    built model keeps in bf16 at 8 bytes, every other parameter at 16."""
    from gpt2ladder.model import family

    cfg = dataclasses.replace(preset("tiny"), parts=parts)
    setup = Setup(vocab_multiple=128)
    model = family.build(dataclasses.replace(cfg, vocab_multiple=128))
    weights = list(model.parameters())
    held = sum(p.numel() * p.element_size() * 4 for p in weights)  # weight, gradient, exp_avg, exp_avg_sq
    assert any(p.dtype == torch.bfloat16 for p in weights)
    assert step_memory(cfg, setup, 64).fixed == held
    without = dataclasses.replace(cfg, parts=tuple(p for p in parts if p != "bf16_tables"))
    assert step_memory(without, setup, 64).fixed == 16 * parameters(without, setup) > held


def test_the_attention_matrix_grows_with_the_square_of_the_sequence():
    cfg = preset("gpt2")
    manual = [step_memory(cfg, Setup(), t).per_sequence for t in (512, 1024)]
    flash = [step_memory(cfg, Setup(attention="sdpa"), t).per_sequence for t in (512, 1024)]
    assert flash[1] == 2 * flash[0] and manual[1] > 2.3 * manual[0]


def test_largest_batch_keeps_the_headroom():
    m = step_memory(preset("gpt2"), Setup(), 1024)
    b = m.largest_batch(8 * GiB)
    assert m.at(b) <= 0.92 * 8 * GiB < m.at(b + 1)
    assert m.largest_batch(1 * GiB) == 0


# --- will it fit: the check made before anything is allocated ---------------------------------------


def _cpu(memory: int):
    from gpt2ladder.runtime.hardware import Capabilities

    return Capabilities(device_type="cpu", name="cpu (x86_64)", host_memory=memory)


def _card(memory: int, host: int, cap: int = 0):
    from gpt2ladder.runtime.hardware import Capabilities

    return Capabilities(device_type="cuda", name="NVIDIA H200", total_memory=memory, host_memory=host,
                        memory_cap=cap)


def test_a_batch_too_large_for_the_host_names_the_largest_that_fits():
    """train --batch-size 100000 on CPU grew to 23.5 GB before the kernel killed it; now it is one line."""
    from gpt2ladder.runtime.memory import check_fits

    cfg, host = preset("tiny"), 16 * GiB
    est = step_memory(cfg, Setup(), 128)
    largest = est.largest_batch(host)
    assert 0 < largest < 100_000
    line = check_fits(cfg, Setup(), 100_000, 128, _cpu(host))
    assert f"the largest batch that fits is {largest:,} (--batch-size {largest})" in line and "\n" not in line
    assert "this host's memory (16.0 GiB)" in line
    assert check_fits(cfg, Setup(), largest, 128, _cpu(host)) is None  # the boundary: this one fits ...
    assert check_fits(cfg, Setup(), largest + 1, 128, _cpu(host)) is not None  # ... and one more does not
    assert est.at(largest) <= 0.92 * host < est.at(largest + 1)


def test_the_largest_integer_a_flag_takes_is_arithmetic_not_an_allocation():
    from gpt2ladder.runtime.memory import check_fits

    line = check_fits(preset("tiny"), Setup(), 2**63 - 1, 128, _cpu(16 * GiB))
    assert "9,223,372,036,854,775,807 sequences" in line and "the largest batch that fits is" in line


def test_the_vocabulary_and_the_sequence_set_what_a_sequence_costs():
    """At a memory where 64 sequences of 128 tokens just fit, the vocabulary padded to 50304 rows, or
    sequences of 256 tokens, do not."""
    from gpt2ladder.runtime.memory import check_fits

    cfg = preset("tiny")
    memory = -(-step_memory(cfg, Setup(), 128).at(64) * 100 // 92)  # HEADROOM of it holds exactly that step
    assert check_fits(cfg, Setup(), 64, 128, _cpu(memory)) is None
    for setup, seq_len, largest in ((Setup(vocab_multiple=128), 128, 63), (Setup(), 256, 31)):
        assert step_memory(cfg, setup, seq_len).largest_batch(memory) == largest
        assert f"fits is {largest} (--batch-size {largest})" in check_fits(cfg, setup, 64, seq_len, _cpu(memory))


def test_a_model_too_large_for_the_memory_says_so_whatever_the_batch():
    from gpt2ladder.runtime.memory import check_fits

    line = check_fits(preset("gpt2-xl"), Setup(), 1, 1024, _cpu(4 * GiB))
    assert line.startswith("the model alone") and "--preset" in line


def test_batches_made_up_front_from_tokens_per_step_are_bounded_too():
    """--tokens-per-step 2**60 with a small micro-batch: the step's batch and the validation batches are the
    problem, and the line says how many tokens fit."""
    from gpt2ladder.runtime.memory import BATCH_BYTES_PER_TOKEN, check_fits

    cfg, host = preset("tiny"), 16 * GiB
    line = check_fits(cfg, Setup(), 8, 128, _cpu(host), batch_tokens=2**60)
    assert "--tokens-per-step" in line and "--eval-batches" in line and "next to the step's" in line
    fit = (int(0.92 * host) - step_memory(cfg, Setup(), 128).at(8)) // BATCH_BYTES_PER_TOKEN
    assert f"at most {fit:,} tokens fit" in line
    assert check_fits(cfg, Setup(), 8, 128, _cpu(host), batch_tokens=fit) is None
    assert check_fits(cfg, Setup(), 8, 128, _cpu(host), batch_tokens=fit + 1) is not None


def test_on_a_gpu_the_step_is_checked_against_the_card_and_the_batches_against_the_host():
    from gpt2ladder.runtime.memory import BATCH_BYTES_PER_TOKEN, check_fits, planning_memory

    cfg, card = preset("gpt2"), _card(140 * GiB, host=2 * GiB, cap=8 * GiB)
    usable = int(7.5 * GiB)  # a --gpu-memory 8 card's allocator: the CUDA context keeps its 0.5 GiB
    assert planning_memory(card) == (usable, "NVIDIA H200's memory")
    largest = step_memory(cfg, Setup(), 1024).largest_batch(usable)
    line = check_fits(cfg, Setup(), 16, 1024, card)
    assert f"fits is {largest} " in line and "NVIDIA H200's memory (7.5 GiB)" in line
    fit = int(0.92 * 2 * GiB) // BATCH_BYTES_PER_TOKEN  # the host holds only the batches
    assert check_fits(cfg, Setup(), 1, 1024, card, batch_tokens=fit) is None
    line = check_fits(cfg, Setup(), 1, 1024, card, batch_tokens=fit + 1)
    assert "this host's memory (2.0 GiB)" in line and f"at most {fit:,} tokens fit" in line


def test_a_memory_of_unknown_size_checks_nothing():
    from gpt2ladder.runtime.memory import check_fits

    assert check_fits(preset("tiny"), Setup(), 10**9, 128, _cpu(0), batch_tokens=10**15) is None


def test_a_ladder_is_checked_at_its_heaviest_rung():
    """At gpt2 x 1024 the eager bf16 step holds more than the fp32 baseline (29.6 against 28.8 GiB measured):
    on a card where the baseline's 16 sequences just fit, the ladder up to bf16 does not."""
    from gpt2ladder.runtime.memory import check_all_fit, check_fits

    cfg, ladder = preset("gpt2"), [setup_for(["baseline"]), setup_for(["baseline", "tf32", "bf16"])]
    usable = -(-step_memory(cfg, ladder[0], 1024).at(16) * 100 // 92)
    card = _card(usable + GiB // 2, host=64 * GiB)  # a real card keeps 0.5 GiB for the CUDA context
    assert card.usable_memory == usable and check_fits(cfg, ladder[0], 16, 1024, card) is None
    largest = step_memory(cfg, ladder[1], 1024).largest_batch(usable)
    assert largest < 16 and f"fits is {largest} " in check_all_fit(cfg, ladder, 16, 1024, card)
    assert check_all_fit(cfg, ladder[:1], 16, 1024, card) is None


def test_accumulating_holds_a_second_set_of_gradients():
    """A compiled backward returns every weight gradient at once before they are added into the kept
    ones; an eager one returns them one at a time, the tied embedding's the largest."""
    cfg = preset("gpt2")
    for setup, held_twice in [(setup_for(["baseline", "tf32", "bf16", "compile"]), parameters(cfg, Setup())),
                              (setup_for(["baseline", "tf32", "bf16"]), 50257 * 768)]:
        one, accumulating = step_memory(cfg, setup, 1024), step_memory(cfg, setup, 1024, accumulates=True)
        assert accumulating.fixed - one.fixed == 4 * held_twice
        assert accumulating.per_sequence == one.per_sequence


def test_a_graph_beside_validation_leaves_room_for_one_sequence_of_it():
    cfg = preset("gpt2")
    plain = setup_for(["baseline", "tf32", "bf16", "compile", "flash", "vocab"])
    graphed = setup_for(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "cuda_graph"])
    base = step_memory(cfg, plain, 1024).fixed
    assert step_memory(cfg, plain, 1024, validates=True).fixed == base  # validation reuses the step's memory
    assert step_memory(cfg, graphed, 1024).fixed == base + GRAPH_BYTES
    padded = eval_bytes_per_sequence(dataclasses.replace(cfg, vocab_multiple=128), 1024)
    assert step_memory(cfg, graphed, 1024, validates=True).fixed == base + GRAPH_BYTES + padded
    assert padded == 1024 * 50304 * 10 + 4 * 1024 * 768 * 16


def test_value_embeds_and_unet_skips_add_their_tables_and_activations():
    gpt2 = preset("gpt2")
    for setup in (setup_for(["baseline"]), setup_for(["baseline", "tf32", "bf16", "compile", "flash", "vocab"])):
        plain = step_memory(gpt2, setup, 1024)
        for part in ("value_embeds", "unet_skips", "embed_skips"):
            modern = step_memory(dataclasses.replace(gpt2, parts=(part,)), setup, 1024)
            assert modern.per_sequence > plain.per_sequence
        tables = step_memory(dataclasses.replace(gpt2, parts=("value_embeds",)), setup, 1024)
        rows = 50304 if setup.vocab_multiple == 128 else 50257
        assert tables.fixed - plain.fixed == 16 * (3 * rows * 768 + 2 * 6)  # three tables, six Blocks' (a, b)


def test_doc_windows_keep_no_scores_under_flex_attention_and_a_mask_besides_them_eager():
    gpt2, windowed = preset("gpt2"), dataclasses.replace(preset("gpt2"), parts=("doc_windows",))
    compiled = setup_for(["baseline", "tf32", "bf16", "compile"])  # the four-line attention: flash declines
    scores = 12 * 12 * 1024 * 1024 * 4  # what the four-line attention keeps compiled
    assert step_memory(gpt2, compiled, 1024).per_sequence - step_memory(windowed, compiled, 1024).per_sequence == scores
    eager = setup_for(["baseline"])
    assert (step_memory(windowed, eager, 1024).per_sequence - step_memory(gpt2, eager, 1024).per_sequence
            == 1024 * 1024)  # the boolean mask, once a sequence


def test_the_modern_familys_parts_add_to_a_steps_estimate_never_take_from_it():
    import dataclasses

    from gpt2ladder.ladder import setup_for
    from gpt2ladder.model.config import PRESETS
    from gpt2ladder.runtime.memory import step_memory

    gpt2 = PRESETS["gpt2"]
    for names in (["baseline"], ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss"]):
        setup = setup_for(names)
        plain = step_memory(gpt2, setup, 1024)
        modern = step_memory(dataclasses.replace(gpt2, parts=("rope", "qk_norm", "relu2", "untied_head")), setup, 1024)
        assert modern.per_sequence > plain.per_sequence
        assert modern.fixed - plain.fixed >= 16 * 768 * (50257 - 1024)  # the head's own weight, less the position table
