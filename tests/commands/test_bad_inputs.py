"""The bad-input list as a table: each row is a command line, its exit code and a fragment of the one line
it must print on stderr, with no traceback. A new case is one line in CASES.

A flag given twice takes its last value, so a row overrides a default by appending. Placeholders in a
row's arguments name things the `places` fixture makes once for the module: {run} a
trained run directory, {text} a small text, {out} a fresh output directory, and damaged files.
Everything runs through `cli.main` in-process (fast); tests that need a real process (signals, kill)
live next to the code they test.
"""

import os

import pytest

from gpt2ladder.cli import main

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40
TINY = ["--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2", "--seq-len", "16",
        "--no-progress"]
TRAIN = ["train", *TINY, "--steps", "2", "--eval-every", "0", "--data", "{text}", "--out", "{out}"]
SAMPLE = ["sample", "{run}", "--device", "cpu", "--num-tokens", "2"]
PARITY = ["parity", *TINY, "--steps", "1", "--eval-batches", "1", "--data", "{text}", "--out", "{out}"]

CASES = [  # (id, argv, exit code, a fragment of the one line)
    # numbers no flag can take
    ("train seed 2**70", [*TRAIN, "--seed", str(2**70)], 2, "--seed: expected a seed from 0 to 2**63 - 1"),
    ("sample seed 2**70", [*SAMPLE, "--seed", str(2**70)], 2, "--seed: expected a seed from 0 to 2**63 - 1"),
    ("parity seed -1", [*PARITY, "--seed", "-1"], 2, "--seed: expected a seed from 0"),
    ("train batch 2**64", [*TRAIN, "--batch-size", str(2**64)], 2, "up to 2**63 - 1"),
    ("train lr inf", [*TRAIN, "--lr", "inf"], 2, "--lr must be a finite number"),
    ("train lr nan", [*TRAIN, "--lr", "nan"], 2, "--lr must be a finite number"),
    ("train weight decay nan", [*TRAIN, "--weight-decay", "nan"], 2, "--weight-decay must be a finite number"),
    ("parity lr inf", [*PARITY, "--lr", "inf"], 2, "--lr must be a finite positive number"),
    ("parity tolerance nan", [*PARITY, "--tolerance", "nan"], 2, "--tolerance"),
    ("sample temperature nan", [*SAMPLE, "--temperature", "nan"], 2, "--temperature must be zero"),
    ("sample temperature inf", [*SAMPLE, "--temperature", "inf"], 2, "--temperature must be zero"),
    # data that is not a text file
    ("train data FIFO", [*TRAIN, "--data", "{fifo}"], 2, "is not a regular file"),
    ("parity data device", [*PARITY, "--data", "/dev/zero"], 2, "is not a regular file"),
    # numbers that fit a flag but not the memory: numpy's _ArrayMemoryError (2**61 bytes, beyond any
    # address space, so it fails at once on every machine)
    ("train tokens per step 2**60", [*TRAIN, "--tokens-per-step", str(2**60)], 1, "out of host memory"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The paths the placeholders stand for; the run is a two-step tiny training run, made once."""
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "small.txt").write_text(TEXT)
    paths = {"text": root / "small.txt", "run": root / "run", "root": root, "fifo": root / "fifo"}
    os.mkfifo(paths["fifo"])  # nothing ever writes to it: reading it would hang
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2LADDER_CACHE", str(root / "cache"))
        assert main(_fill(TRAIN, {**paths, "out": paths["run"]})) == 0
    return paths


def _fill(argv: list[str], paths: dict) -> list[str]:
    return [a.format(**{k: str(v) for k, v in paths.items()}) for a in argv]


@pytest.mark.parametrize("argv, code, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_an_exit_code(places, argv, code, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(places["root"] / "cache"))
    got = main(_fill(argv, {**places, "out": tmp_path / "out"}))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert got == code, err
    assert err.startswith("gpt2ladder: error: ") and err.count("\n") == 1, f"not one line: {err!r}"
    assert fragment in err, err
