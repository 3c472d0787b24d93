"""Behaviour pinned by golden files: what the CLI writes for a tiny bench, parity and train run on a CPU.

The files in tests/golden/ were written by `python tests/test_golden.py` (the same three commands).
A refactor must leave them unchanged: the bench record's keys and rows, every eager parity loss and the
train log. Losses are compared bit for bit where the files were made (same torch, same CPU); elsewhere,
where other CPU kernels may round differently, to 1e-5 relative, and the test says which it did.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "golden"
FLAGS = ["--device", "cpu", "--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--no-progress"]
EAGER_RUNGS = "baseline,flash,vocab,fused_adamw,fused_loss"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    return {"torch": torch.__version__, "cpu": _cpu(), "threads": torch.get_num_threads()}


def _shape(value):
    """Keys and types, not values: what a record's consumers rely on."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def bench_snapshot(out: Path) -> dict:
    from gpt2ladder.cli import main

    assert main(["bench", *FLAGS, "--rungs", EAGER_RUNGS + ",cuda_graph", "--steps", "2", "--warmup", "1",
                 "--out", str(out)]) == 0
    record = json.loads((out / "ladder.json").read_text())
    rows = [{"name": r["name"], "status": r["status"], "keys": sorted(r),
             "setup": r.get("setup"), "loss": r.get("loss")} for r in record["rungs"]]
    return {"keys": sorted(record), "config": record["config"], "model": record["model"], "rows": rows}


def parity_snapshot(out: Path) -> dict:
    from gpt2ladder.cli import main

    main(["parity", *FLAGS, "--rungs", EAGER_RUNGS, "--steps", "4", "--eval-batches", "2", "--out", str(out)])
    record = json.loads((out / "parity.json").read_text())
    runs = {f"baseline-seed{r['seed']}": r for r in record["baseline_runs"]}
    runs.update({r["name"]: r for r in record["rungs"] if r["status"] == "ok"})
    return {"keys": sorted(record), "rule": {k: v for k, v in record["rule"].items() if k != "text"},
            "losses": {k: {"train": r["train_loss"], "val": r["val"]} for k, r in runs.items()},
            "verdicts": {r["name"]: r.get("verdict") for r in record["rungs"]}}


def train_snapshot(out: Path) -> dict:
    from gpt2ladder.cli import main

    assert main(["train", *FLAGS, "--rungs", "baseline", "--steps", "5", "--tokens-per-step", "64",
                 "--eval-every", "5", "--eval-batches", "2", "--out", str(out)]) == 0
    entries = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    keep = ("step", "loss", "lr", "val_loss")
    return {"keys": sorted({k for e in entries for k in e}),
            "log": [{k: e[k] for k in keep if k in e} for e in entries],
            "files": sorted(p.name for p in out.iterdir() if not p.name.startswith("."))}


SNAPSHOTS = {"bench": bench_snapshot, "parity": parity_snapshot, "train": train_snapshot}


def _numbers_close(actual, expected, exact: bool, where: str = "") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and sorted(actual) == sorted(expected), where
        for k in expected:
            _numbers_close(actual[k], expected[k], exact, f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _numbers_close(a, e, exact, f"{where}[{i}]")
    elif isinstance(expected, float) and not exact:
        assert actual == pytest.approx(expected, rel=1e-5), where
    else:
        assert actual == expected, where


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_output_matches_the_golden_file(name, shakespeare_cache, tmp_path):
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    actual = SNAPSHOTS[name](tmp_path / name)
    exact = golden["environment"] == environment()
    _numbers_close(actual, golden["snapshot"], exact, name)
    if not exact:
        print(f"{name}: compared to 1e-5 relative ({environment()} vs {golden['environment']})")


if __name__ == "__main__":  # regenerate: python tests/test_golden.py (with GPT2LADDER_CACHE set)
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    for name, snapshot in SNAPSHOTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            data = {"environment": environment(), "snapshot": snapshot(Path(tmp) / name)}
        (GOLDEN / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {GOLDEN / name}.json", file=sys.stderr)
