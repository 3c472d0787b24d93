"""Behaviour pinned by golden files: what the CLI writes for a tiny bench, parity and train run on a CPU.

The files in tests/golden/ were written by `python tests/test_golden.py` (the same three commands).
A refactor must leave them unchanged: the bench record's keys and rows, every eager parity loss and the
train log.

Bit for bit, or to a tolerance: another CPU (or the same model with other vector units, or another
thread count) rounds float32 sums differently, so losses may differ in their last bits. Each file
records the numerics fingerprint of the machine that made it (`numerics_fingerprint`: the sha256 of
the exact bytes of a small fixed computation through the same kernels, with the torch version, ATen's
CPU capability and the thread count). The losses are compared bit for bit only where this machine
reproduces that fingerprint; a file without one (made before fingerprints were recorded) is never
compared bit for bit. Otherwise every loss (and the loss differences parity derives from them: its
spread, allowed gap and baseline) is compared to within LOSS_ATOL nats, every other float to REL_TOL
relative, and everything else exactly.

LOSS_ATOL is measured, not guessed: the three snapshots computed on an Intel Xeon with AVX-512 (1 and 2
threads, and with ATEN_CPU_CAPABILITY=avx2) against the files made on an AMD EPYC moved by at most
1.9e-6 nats (two float32 steps at a loss of 10; 30 of the 85 floats differed at all), and parity's
spread by 9.5e-7 nats (2.7e-5 of its own size: a tolerance of 1e-5 relative fails there).
1e-4 nats leaves a margin of 50 and still sees a change of the computation: the two baseline seeds of
the parity file (other initial weights and batch order) end 0.035 nats apart.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "golden"
FLAGS = ["--device", "cpu", "--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--no-progress"]
EAGER_RUNGS = "baseline,flash,vocab,fused_adamw,fused_loss"
LOSS_ATOL = 1e-4  # nats; see the module docstring for the measurement behind it
REL_TOL = 1e-9  # floats computed in Python (learning rates, the rule's constants): only libm may differ
# The floats that come out of the model's kernels: losses, and what parity derives from them.
LOSS_KEYS = {"loss", "val_loss", "train", "val", "spread", "allowed_abs", "baseline_val"}


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numerics_fingerprint() -> str:
    """sha256 of the exact bytes of two training steps of the tiny model, through the kernels the golden
    runs use (manual and SDPA attention, the 50257 and 50304 vocabularies, foreach and fused AdamW, the
    plain and the fused loss), at their batch of 2 x 32: losses, gradients and updated weights, with the
    torch version, ATen's CPU capability and the thread count. A machine that reproduces it rounds as
    the machine that made the files did."""
    from gpt2ladder.ladder import setup_for
    from gpt2ladder.model.config import preset
    from gpt2ladder.runtime.engine import Engine

    digest = hashlib.sha256(f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()} "
                            f"{torch.get_num_threads()}".encode())
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 50257, (2, 2, 32), generator=gen) for _ in range(2))
    for rungs in (["baseline"], EAGER_RUNGS.split(",")):
        engine = Engine(preset("tiny"), setup_for(rungs), torch.device("cpu"), seed=0)
        losses = [engine.step(x[i], y[i]) for i in range(2)]
        grads = [p.grad for p in engine.raw_model.parameters()]
        for t in (*losses, *grads, *engine.raw_model.state_dict().values()):
            digest.update(t.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def environment(fingerprint: str | None) -> dict:
    """What made a golden file: `numerics` decides the comparison, the rest is there for people."""
    return {"torch": torch.__version__, "cpu": _cpu(), "threads": torch.get_num_threads(), "numerics": fingerprint}


def comparison(recorded: dict, fingerprint: str) -> tuple[bool, str]:
    """(bit for bit?, why): bit for bit only where this machine reproduces the file's fingerprint."""
    theirs = recorded.get("numerics")
    if theirs is None:
        return False, "the golden file records no numerics fingerprint"
    if theirs != fingerprint:
        return False, f"this machine's numerics fingerprint {fingerprint[:12]} is not the file's {theirs[:12]}"
    return True, f"this machine reproduces the numerics fingerprint {theirs[:12]} the file was made with"



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


def assert_matches(actual, expected, exact: bool, where: str = "", key: str = "") -> None:
    """The same structure and values; floats bit for bit when `exact`, else a float under one of
    LOSS_KEYS (the innermost dict key above it) to LOSS_ATOL and any other to REL_TOL."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and sorted(actual) == sorted(expected), where
        for k in expected:
            assert_matches(actual[k], expected[k], exact, f"{where}.{k}", k)
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_matches(a, e, exact, f"{where}[{i}]", key)
    elif isinstance(expected, float) and not exact:
        tolerance = {"abs": LOSS_ATOL, "rel": 0} if key in LOSS_KEYS else {"rel": REL_TOL}
        assert actual == pytest.approx(expected, **tolerance), where
    else:
        assert type(actual) is type(expected) and actual == expected, where


@pytest.fixture(scope="module")
def fingerprint() -> str:
    return numerics_fingerprint()


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_output_matches_the_golden_file(name, fingerprint, shakespeare_cache, tmp_path):
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    exact, why = comparison(golden["environment"], fingerprint)
    print(f"{name}: compared {'bit for bit' if exact else f'to within {LOSS_ATOL:g} nats'}: {why}")
    assert_matches(SNAPSHOTS[name](tmp_path / name), golden["snapshot"], exact, name)


def test_the_fingerprint_is_the_same_when_computed_again(fingerprint):
    assert len(fingerprint) == 64 and numerics_fingerprint() == fingerprint


def test_bit_for_bit_only_where_the_fingerprint_is_reproduced():
    assert comparison({"numerics": "ab" * 32}, "ab" * 32)[0] is True
    exact, why = comparison({"numerics": "cd" * 32}, "ab" * 32)
    assert not exact and "cdcdcdcdcdcd" in why and "abababababab" in why
    # the files made before fingerprints were recorded: a CPU name, never a reason for bit for bit
    assert comparison({"torch": torch.__version__, "cpu": _cpu(), "threads": torch.get_num_threads(),
                       "numerics": None}, "ab" * 32) == (False, "the golden file records no numerics fingerprint")


def test_the_tolerances_pass_rounding_and_catch_changes():
    import math

    loss = {"log": [{"step": 1, "loss": 10.553069114685059, "lr": 6e-4}]}

    def changed(**values):
        return {"log": [{**loss["log"][0], **values}]}

    assert_matches(changed(loss=10.553071022033691), loss, exact=False)  # two float32 steps: rounding
    with pytest.raises(AssertionError):
        assert_matches(changed(loss=10.553071022033691), loss, exact=True)
    with pytest.raises(AssertionError):
        assert_matches(changed(loss=10.553069114685059 + 2 * LOSS_ATOL), loss, exact=False)
    with pytest.raises(AssertionError):  # a learning rate is Python arithmetic: no loss tolerance for it
        assert_matches(changed(lr=6e-4 * (1 + 1e-6)), loss, exact=False)
    assert_matches(changed(lr=math.nextafter(6e-4, 1.0)), loss, exact=False)
    with pytest.raises(AssertionError):
        assert_matches(changed(step=2), loss, exact=False)
    with pytest.raises(AssertionError):
        assert_matches({"log": [{"step": 1, "loss": 10.553069114685059}]}, loss, exact=False)


if __name__ == "__main__":  # regenerate: python tests/test_golden.py (with GPT2LADDER_CACHE set)
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    made_by = environment(numerics_fingerprint())
    for name, snapshot in SNAPSHOTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            data = {"environment": made_by, "snapshot": snapshot(Path(tmp) / name)}
        (GOLDEN / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {GOLDEN / name}.json", file=sys.stderr)
