"""The step-memory estimate: over, never under, what every rung measured on an H200, and close to it
for the rungs that set the batch; and the terms derived rather than fitted, counted as derived."""

import dataclasses
import json
from pathlib import Path

import pytest

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import preset
from gpt2ladder.runtime.memory import GRAPH_BYTES, GiB, eval_bytes_per_sequence, parameters, step_memory
from gpt2ladder.runtime.setup import Setup

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-12-01-h200-layout"


def _measured(name: str) -> list[tuple[str, list[str], int, int]]:
    record = json.loads((RECORDS / name / "ladder.json").read_text())
    names = [r["name"] for r in record["rungs"]]
    return [(r["name"], names[:i + 1], record["config"]["batch_size"], r["peak_mem_bytes"])
            for i, r in enumerate(record["rungs"]) if r["status"] == "ok"]


@pytest.mark.parametrize("rung, applied, batch, peak", _measured("bench-auto") + _measured("bench-b4"),
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
