"""The harness's rows for a rung that broke, and the line for a ladder of which nothing could be measured:
out of memory names what to change, and never a batch below 1."""

import pytest
import torch

from gpt2ladder.errors import LadderError
from gpt2ladder.measure.harness import guarded
from gpt2ladder.report.notices import nothing_measured

CPU = torch.device("cpu")


def _out_of_memory():
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 394.00 MiB")


def test_a_rung_that_runs_out_of_memory_at_batch_1_is_told_what_else_to_change():
    row = guarded(_out_of_memory, CPU, 1)
    assert row["status"] == "oom" and row["reason"].startswith("out of memory at batch size 1; not even one "
                                                               "sequence fits")
    assert all(way in row["reason"] for way in ("--seq-len", "fewer --rungs", "--preset tiny"))
    assert "--batch-size" not in row["reason"]


def test_a_rung_that_runs_out_of_memory_at_a_larger_batch_is_told_to_take_a_smaller_one():
    row = guarded(_out_of_memory, CPU, 4, auto_batch=True)  # bench, which takes --batch-size auto
    assert row["status"] == "oom" and row["reason"] == ("out of memory at batch size 4; use a smaller --batch-size "
                                                        "or --batch-size auto")
    row = guarded(_out_of_memory, CPU, 4)  # profile and parity take no --batch-size auto: it is not suggested
    assert row["status"] == "oom" and row["reason"] == "out of memory at batch size 4; use a smaller --batch-size"


def test_other_failures_are_rows_and_a_run_problem_still_ends_the_run():
    assert guarded(lambda: {"ms": 1.0}, CPU, 1) == {"status": "ok", "ms": 1.0}
    row = guarded(lambda: [][1], CPU, 1)
    assert row["status"] == "failed" and row["reason"].startswith("IndexError")
    with pytest.raises(LadderError, match="the whole run"):
        guarded(lambda: (_ for _ in ()).throw(LadderError("the whole run")), CPU, 1)


def _record(batch: int, statuses: list[str]) -> dict:
    rows = [{"name": f"r{i}", "status": s, "reason": f"{s} here"} for i, s in enumerate(statuses)]
    return {"config": {"batch_size": batch}, "rungs": rows}


@pytest.mark.parametrize("batch, auto_batch, has, lacks", [
    (1, True, ["at batch size 1; not even one sequence fits", "--seq-len", "fewer --rungs", "--preset tiny"],
     "--batch-size"),
    (8, True, ["at batch size 8; use a smaller --batch-size or --batch-size auto"], "--preset tiny"),
    (8, False, ["at batch size 8; use a smaller --batch-size ("], "auto"),
])
def test_a_ladder_that_ran_out_of_memory_everywhere_names_the_way_out(batch, auto_batch, has, lacks, tmp_path):
    line = nothing_measured(_record(batch, ["skipped", "oom", "oom"]), tmp_path / "ladder.json", auto_batch=auto_batch)
    assert line.startswith("every rung ran out of memory") and line.endswith(f"(rows in {tmp_path / 'ladder.json'})")
    assert all(words in line for words in has) and lacks not in line


def test_a_ladder_with_a_measured_row_or_another_failure_is_not_an_out_of_memory_line(tmp_path):
    assert nothing_measured(_record(1, ["oom", "ok"]), tmp_path) is None
    line = nothing_measured(_record(1, ["oom", "failed"]), tmp_path)
    assert line.startswith("no rung could be measured: r0 oom")
