"""The step-memory estimate: over, never under, what every rung measured on an H200, and close to it
for the rungs that set the batch."""

import json
from pathlib import Path

import pytest

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import preset
from gpt2ladder.runtime.memory import GiB, parameters, step_memory
from gpt2ladder.model.setup import Setup

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-12-01-h200-layout"


def _measured(name: str) -> list[tuple[str, list[str], int, int]]:
    record = json.loads((RECORDS / name / "ladder.json").read_text())
    names = [r["name"] for r in record["rungs"]]
    return [(r["name"], names[:i + 1], record["config"]["batch_size"], r["peak_mem_bytes"])
            for i, r in enumerate(record["rungs"]) if r["status"] == "ok"]


@pytest.mark.parametrize("rung, applied, batch, peak", _measured("bench-auto") + _measured("bench-b4"),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_the_estimate_covers_what_the_h200_measured(rung, applied, batch, peak):
    est = step_memory(preset("gpt2"), setup_for(applied), 1024).at(batch)
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
