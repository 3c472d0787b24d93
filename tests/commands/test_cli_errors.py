"""Every user mistake ends in ONE line on stderr, a non-zero exit (2 for usage errors), no traceback,
and no lost data. `--debug` shows the traceback instead.

Most cases run `cli.main` in-process (fast); one runs the real `python -m gpt2ladder` to prove the
same holds in a fresh interpreter with its import-time warnings.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from gpt2ladder.cli import main
from gpt2ladder.errors import UsageError
from gpt2ladder.runtime.engine import Engine

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40


@pytest.fixture(autouse=True)
def token_cache(tmp_path, monkeypatch):
    """Tokens of test texts go to a private cache, never the user's."""
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text(TEXT)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, expected_code, *words):
    assert code == expected_code, err
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("gpt2ladder: error: ")
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"


def bench(tmp_path, *extra):
    """A bench command that would finish in a second on CPU if nothing were wrong with `extra`."""
    return ["bench", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2",
            "--seq-len", "16", "--steps", "1", "--warmup", "0", "--out", tmp_path / "out", "--no-progress", *extra]


# --- the data file ------------------------------------------------------------------------------


def test_data_path_that_does_not_exist(tmp_path, capsys):
    code, _, err = run(capsys, *bench(tmp_path, "--data", tmp_path / "nope.txt"))
    assert_one_line_error(code, err, 2, "nope.txt", "does not exist")
    assert not (tmp_path / "out").exists()  # failed before touching the output directory


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.parquet", "docs.csv", "docs.jsonl.gz"])
def test_records_are_refused_as_training_text(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_text('{"text": "' + TEXT.replace("\n", " ") + '"}\n')
    code, out, err = run(capsys, "train", "--data", path, "--device", "cpu", "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, "not plain text", "gpt2ladder prepare")
    assert out == ""


def test_shards_too_small_for_a_sequence_are_refused_before_anything_is_said(tmp_path, capsys):
    import numpy as np

    from gpt2ladder.data import shards as fmt

    (tmp_path / "shards").mkdir()
    for name in ("c_val_000000.bin", "c_train_000001.bin"):
        fmt.write_shard(tmp_path / "shards" / name, np.zeros(3, dtype=np.uint16))
    code, out, err = run(capsys, "train", "--data", tmp_path / "shards", "--device", "cpu", "--out", tmp_path / "run")
    assert_one_line_error(code, err, 2, "too few for one sequence")
    assert out == ""


def test_data_path_that_is_a_folder_without_shards(tmp_path, capsys):
    code, _, err = run(capsys, *bench(tmp_path, "--data", tmp_path))
    assert_one_line_error(code, err, 2, "holds no token shards", "gpt2ladder prepare")


def test_empty_data_file(tmp_path, capsys):
    (tmp_path / "empty.txt").write_bytes(b"")
    code, _, err = run(capsys, *bench(tmp_path, "--data", tmp_path / "empty.txt"))
    assert_one_line_error(code, err, 2, "empty.txt", "is empty")


@pytest.mark.parametrize("payload", [bytes(range(256)) * 8, b"\x00" * 4096, b"\x89PNG\r\n\x1a\n" + bytes(500)])
def test_binary_data_file(tmp_path, capsys, payload):
    (tmp_path / "blob.bin").write_bytes(payload)
    code, _, err = run(capsys, *bench(tmp_path, "--data", tmp_path / "blob.bin"))
    assert_one_line_error(code, err, 2, "blob.bin", "not a UTF-8 text file")


def test_text_too_short_for_one_batch(tmp_path, capsys):
    (tmp_path / "short.txt").write_text("To be, or not to be.")
    code, _, err = run(capsys, *bench(tmp_path, "--data", tmp_path / "short.txt"))
    assert_one_line_error(code, err, 2, "too few for one sequence", "--seq-len")
    assert not (tmp_path / "out").exists()


# --- sizes, counts and names --------------------------------------------------------------------


def test_seq_len_above_the_block_size(tmp_path, capsys, text_file):
    code, _, err = run(capsys, *bench(tmp_path, "--data", text_file, "--seq-len", "257"))
    assert_one_line_error(code, err, 2, "--seq-len 257", "block size of 256")


@pytest.mark.parametrize("flag,value,words", [
    ("--batch-size", "0", ["--batch-size", "positive integer", "got 0"]),
    ("--batch-size", "-4", ["--batch-size", "positive integer", "got -4"]),
    ("--batch-size", "many", ["--batch-size", "positive integer", "'many'", "'best'"]),
    ("--steps", "0", ["--steps", "positive integer", "got 0"]),
    ("--steps", "-1", ["--steps", "positive integer"]),
    ("--steps", "ten", ["--steps", "positive integer", "'ten'"]),
    ("--steps", "2.5", ["--steps", "positive integer", "'2.5'"]),
    ("--seq-len", "0", ["--seq-len", "positive integer"]),
    ("--warmup", "-1", ["--warmup", "zero or more"]),
    ("--seed", "x", ["--seed", "expected a seed", "'x'"]),
])
def test_bad_numbers(tmp_path, capsys, text_file, flag, value, words):
    code, _, err = run(capsys, *bench(tmp_path, "--data", text_file, flag, value))
    assert_one_line_error(code, err, 2, *words)


def test_unknown_preset(tmp_path, capsys, text_file):
    code, _, err = run(capsys, *bench(tmp_path, "--data", text_file, "--preset", "gpt5"))
    assert_one_line_error(code, err, 2, "unknown preset 'gpt5'", "gpt2-medium")


def test_unknown_rung(tmp_path, capsys, text_file):
    code, _, err = run(capsys, *bench(tmp_path, "--data", text_file, "--rungs", "baseline,warp"))
    assert_one_line_error(code, err, 2, "unknown rung warp", "fused_adamw")


@pytest.mark.parametrize("argv,words", [
    (["bench", "--fast"], ["unrecognized arguments: --fast (see gpt2ladder bench --help)"]),
    (["bench", "--rungs"], ["--rungs", "expected one argument"]),
    (["benchmark"], ["invalid choice: 'benchmark'", "bench"]),
    (["doctor", "--jsn"], ["unrecognized arguments: --jsn (see gpt2ladder doctor --help)"]),
    (["sample", "run", "--max-new-tokens", "9"], ["unrecognized arguments: --max-new-tokens 9 (see gpt2ladder sample "
                                                  "--help)"]),
    (["sample"], ["required", "checkpoint"]),
    (["--bogus", "doctor"], ["unrecognized arguments: --bogus (see gpt2ladder --help)"]),
    (["doctor", "doctor"], ["unrecognized arguments: doctor (see gpt2ladder doctor --help)"]),
])
def test_unknown_flags_and_commands(capsys, argv, words):
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, 2, *words, "--help")


# --- the device ---------------------------------------------------------------------------------


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("command", [["bench"], ["doctor"], ["train"], ["sample", "run"], ["parity"]])
def test_device_cuda_without_a_gpu(tmp_path, capsys, no_gpu, command):
    code, _, err = run(capsys, *command, "--device", "cuda", *([] if command[0] == "doctor" or command[0] == "sample"
                                                                 else ["--out", tmp_path / "out"]))
    assert_one_line_error(code, err, 2, "--device cuda", "no CUDA GPU")


def test_unknown_device(tmp_path, capsys):
    code, _, err = run(capsys, "doctor", "--device", "tpu")
    assert_one_line_error(code, err, 2, "unknown device 'tpu'")


# --- the output directory -----------------------------------------------------------------------


def test_output_directory_under_a_regular_file(tmp_path, capsys, text_file):
    """Root ignores chmod, so the unwritable place is a path whose parent is a file."""
    blocker = tmp_path / "results.txt"
    blocker.write_text("not a folder")
    argv = bench(tmp_path, "--data", text_file)
    argv[argv.index("--out") + 1] = blocker / "ladder"
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, 2, "cannot write to output directory", "results.txt is a file, not a folder")
    assert blocker.read_text() == "not a folder"
    argv[argv.index("--out") + 1] = blocker  # --out a file itself: said so, not "File exists"
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, 2, "results.txt is a file, not a folder")
    assert "File exists" not in err and blocker.read_text() == "not a folder"


@pytest.mark.parametrize("command", ["parity", "profile"])
def test_a_failed_run_leaves_no_empty_output_directory(tmp_path, capsys, command):
    """parity and profile make --out before their work; a run that fails removes it again if it is empty
    and was the run's own (train does the same: tests/training/test_run_safety.py)."""
    (tmp_path / "mine").mkdir()
    for out, kept in ((tmp_path / "new" / "out", False), (tmp_path / "mine", True)):
        code, _, err = run(capsys, command, "--device", "cpu", "--preset", "tiny", "--rungs", "baseline",
                           "--data", tmp_path / "missing.txt", "--out", out)
        assert_one_line_error(code, err, 2, "does not exist")
        assert out.is_dir() == kept
    assert not (tmp_path / "new").exists()


def test_failed_run_leaves_earlier_results_untouched(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ladder.json").write_bytes(b'{"earlier": "result"}\n')
    code, _, err = run(capsys, *bench(tmp_path, "--data", tmp_path / "missing.txt"))
    assert code == 2
    assert (out / "ladder.json").read_bytes() == b'{"earlier": "result"}\n'
    assert sorted(p.name for p in out.iterdir()) == ["ladder.json"]


# --- out of memory, and nothing measured --------------------------------------------------------


def test_batch_too_large_for_memory(tmp_path, capsys, text_file, monkeypatch):
    def out_of_memory(self, x, y):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 GiB")

    monkeypatch.setattr(Engine, "step", out_of_memory)
    argv = bench(tmp_path, "--data", text_file)
    argv[argv.index("--rungs") + 1] = "baseline,flash,vocab"
    code, out, err = run(capsys, *argv)
    assert_one_line_error(code, err, 1, "out of memory", "batch size 2", "--batch-size auto")
    record = json.loads((tmp_path / "out" / "ladder.json").read_text())  # the files are written anyway
    assert [r["status"] for r in record["rungs"]] == ["oom", "oom", "oom"]
    assert all("--batch-size auto" in r["reason"] for r in record["rungs"])
    assert (tmp_path / "out" / "ladder.md").exists() and (tmp_path / "out" / "ladder.png").exists()
    assert "oom: out of memory" in out  # the table still shows each rung's row


def test_one_rung_out_of_memory_is_a_row_not_a_failure(tmp_path, capsys, text_file, monkeypatch):
    step = Engine.step

    def oom_with_sdpa(self, x, y):
        if self.setup.attention == "sdpa":
            raise torch.OutOfMemoryError("out of memory")
        return step(self, x, y)

    monkeypatch.setattr(Engine, "step", oom_with_sdpa)
    argv = bench(tmp_path, "--data", text_file)
    argv[argv.index("--rungs") + 1] = "baseline,flash"
    code, _, err = run(capsys, *argv)
    assert code == 0 and "error" not in err
    record = json.loads((tmp_path / "out" / "ladder.json").read_text())
    assert [r["status"] for r in record["rungs"]] == ["ok", "oom"]


def test_no_rung_this_machine_can_run(tmp_path, capsys, text_file):
    argv = bench(tmp_path, "--data", text_file)
    argv[argv.index("--rungs") + 1] = "tf32,cuda_graph"
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, 1, "no rung could be measured", "tf32 skipped", "compute capability 8.0")
    assert json.loads((tmp_path / "out" / "ladder.json").read_text())["rungs"][0]["status"] == "skipped"


def test_oom_outside_bench_is_one_line(capsys, monkeypatch):
    import gpt2ladder.commands.doctor

    def out_of_memory(args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(gpt2ladder.commands.doctor, "doctor_command", out_of_memory)
    code, _, err = run(capsys, "doctor")
    assert_one_line_error(code, err, 1, "out of memory", "a smaller --batch-size", "--seq-len", "--preset tiny")
    assert "auto" not in err  # only bench takes --batch-size auto


@pytest.mark.parametrize("batch, words", [
    (1, ["out of memory at micro-batch 1", "not even one sequence fits", "--seq-len", "fewer --rungs",
         "--preset tiny"]),
    (2, ["out of memory at micro-batch 2", "a smaller --batch-size"]),
])
def test_gpu_out_of_memory_in_train_names_what_to_change(tmp_path, capsys, text_file, monkeypatch, batch, words):
    """At micro-batch 1 there is no smaller batch to suggest: the sequence, the rungs or the model."""
    def out_of_memory(self, x, y):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 394.00 MiB")

    monkeypatch.setattr(Engine, "step", out_of_memory)
    code, _, err = run(capsys, "train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--steps", "1",
                       "--batch-size", batch, "--seq-len", "16", "--data", text_file, "--out", tmp_path / "run",
                       "--no-progress")
    assert_one_line_error(code, err, 1, *words)
    assert ("--batch-size" in err) == (batch > 1)
    assert "auto" not in err  # train takes no --batch-size auto


def test_out_of_memory_at_an_unknown_batch_names_both_ways_out():
    from gpt2ladder.cli import _out_of_memory_line

    line = _out_of_memory_line(torch.OutOfMemoryError("CUDA out of memory"))
    assert ("a smaller --batch-size" in line
            and "at batch size 1: a smaller --seq-len, fewer --rungs or --preset tiny" in line)


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 51463168000 bytes. Error code 12 (Cannot allocate memory)"),
    MemoryError("Unable to allocate 149. GiB for an array with shape (20000000000,) and data type int64"),
])
def test_host_out_of_memory_in_train_is_one_line_naming_the_allocation(tmp_path, capsys, text_file, monkeypatch,
                                                                       error):
    """`train --batch-size 1000 --seq-len 256` on CPU: the allocator's failure, not a traceback."""
    def out_of_memory(self, x, y):
        raise error

    monkeypatch.setattr(Engine, "step", out_of_memory)
    code, _, err = run(capsys, "train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--steps", "1",
                       "--batch-size", "2", "--seq-len", "16", "--data", text_file, "--out", tmp_path / "run",
                       "--no-progress")
    assert_one_line_error(code, err, 1, "out of host memory", str(error)[:40], "--batch-size")


# --- one line, always; --debug shows the traceback -----------------------------------------------


def test_a_multi_line_message_is_printed_on_one_line(capsys, monkeypatch):
    import gpt2ladder.commands.doctor

    def fails(args):
        raise UsageError("first part\nsecond part")

    monkeypatch.setattr(gpt2ladder.commands.doctor, "doctor_command", fails)
    code, _, err = run(capsys, "doctor")
    assert_one_line_error(code, err, 2, "first part second part")


def test_disk_errors_are_one_line(capsys, monkeypatch):
    import gpt2ladder.commands.doctor

    def disk_full(args):
        raise OSError(28, "No space left on device", "/results/ladder.json")

    monkeypatch.setattr(gpt2ladder.commands.doctor, "doctor_command", disk_full)
    code, _, err = run(capsys, "doctor")
    assert_one_line_error(code, err, 1, "No space left on device", "/results/ladder.json")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path, capsys, where):
    argv = bench(tmp_path, "--data", tmp_path / "nope.txt")
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    assert main([str(a) for a in argv]) == 2  # a usage error, as without --debug
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "UsageError" in err and "does not exist" in err


def test_debug_keeps_the_exit_code_of_a_run_that_cannot_go_on(capsys, monkeypatch):
    import gpt2ladder.commands.doctor

    def disk_full(args):
        raise OSError(28, "No space left on device", "/results/ladder.json")

    monkeypatch.setattr(gpt2ladder.commands.doctor, "doctor_command", disk_full)
    assert main(["doctor", "--debug"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "No space left on device" in err


def test_help_is_not_an_error(capsys):
    for argv in (["--help"], ["bench", "--help"], ["doctor", "--help"], ["train", "--help"], ["sample", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        out, err = capsys.readouterr()
        assert out.startswith("usage: gpt2ladder") and err == ""
        assert "examples:" in out or "start here:" in out


def test_a_real_process_prints_one_line_and_no_traceback(tmp_path):
    env = {**os.environ, "GPT2LADDER_CACHE": str(tmp_path / "cache"), "PYTHONWARNINGS": "default"}
    proc = subprocess.run([sys.executable, "-m", "gpt2ladder", "bench", "--device", "cpu", "--data",
                           str(tmp_path / "nope.txt"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpt2ladder: error: data file")
    assert "Traceback" not in proc.stderr


# --- train and sample: checkpoints --------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(module_tmp):
    """A finished two-step tiny run (ckpt.pt, log.jsonl, config.json), made once for this module."""
    root = module_tmp("trained")
    (root / "small.txt").write_text(TEXT)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2LADDER_CACHE", str(root / "cache"))
        code = main(["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--steps", "2",
                     "--batch-size", "2", "--seq-len", "16", "--eval-every", "0", "--ckpt-every", "0",
                     "--data", str(root / "small.txt"), "--out", str(root / "run"), "--no-progress"])
    assert code == 0 and (root / "run" / "ckpt.pt").is_file()
    return root


@pytest.fixture
def run_dir(trained, tmp_path):
    """A private copy of the trained run, and the bytes of every file in it before the test."""
    import shutil

    run = shutil.copytree(trained / "run", tmp_path / "run")
    (tmp_path / "small.txt").write_text(TEXT)
    return run, {p.name: p.read_bytes() for p in run.iterdir()}


def train(run, *extra):
    return ["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--steps", "4",
            "--batch-size", "2", "--seq-len", "16", "--eval-every", "0", "--data", run.parent / "small.txt",
            "--out", run, "--no-progress", *extra]


def assert_untouched(run, before):
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_sample_missing_checkpoint(tmp_path, capsys):
    code, _, err = run(capsys, "sample", tmp_path / "nothing.pt", "--device", "cpu")
    assert_one_line_error(code, err, 2, "no checkpoint at", "nothing.pt")


def test_sample_directory_without_a_checkpoint(tmp_path, capsys):
    code, _, err = run(capsys, "sample", tmp_path, "--device", "cpu")
    assert_one_line_error(code, err, 2, "no checkpoint at", "ckpt.pt")


def test_sample_truncated_checkpoint(run_dir, capsys):
    run_path, before = run_dir
    (run_path / "half.pt").write_bytes(before["ckpt.pt"][: len(before["ckpt.pt"]) // 2])
    code, _, err = run(capsys, "sample", run_path / "half.pt", "--device", "cpu")
    assert_one_line_error(code, err, 1, "half.pt", "unreadable")


@pytest.mark.parametrize("content,words", [
    ("torch", ["foreign.pt", "not a gpt2ladder checkpoint"]),
    ("text", ["foreign.pt", "is not a PyTorch file"]),
])
def test_sample_foreign_file(tmp_path, capsys, content, words):
    """Another kind of file named as the model is a mistake (exit 2); a damaged checkpoint is not (exit 1)."""
    path = tmp_path / "foreign.pt"
    if content == "torch":
        torch.save({"model": {"weight": torch.zeros(2, 2)}}, path)
    else:
        path.write_text("this is not a checkpoint\n")
    code, _, err = run(capsys, "sample", path, "--device", "cpu")
    assert_one_line_error(code, err, 2, *words)


def test_train_into_a_run_that_has_a_checkpoint_needs_resume(run_dir, capsys):
    run_path, before = run_dir
    code, _, err = run(capsys, *train(run_path))
    assert_one_line_error(code, err, 2, "already holds a checkpoint", "--resume")
    assert_untouched(run_path, before)


def test_resume_from_a_truncated_checkpoint_keeps_its_bytes(run_dir, capsys):
    run_path, before = run_dir
    half = before["ckpt.pt"][: len(before["ckpt.pt"]) // 2]
    (run_path / "ckpt.pt").write_bytes(half)
    before["ckpt.pt"] = half
    code, _, err = run(capsys, *train(run_path, "--resume"))
    assert_one_line_error(code, err, 1, "ckpt.pt", "unreadable")
    assert_untouched(run_path, before)


def test_resume_from_a_foreign_file_keeps_its_bytes(run_dir, capsys):
    run_path, before = run_dir
    torch.save({"weights": torch.ones(3)}, run_path / "ckpt.pt")
    before["ckpt.pt"] = (run_path / "ckpt.pt").read_bytes()
    code, _, err = run(capsys, *train(run_path, "--resume"))
    assert_one_line_error(code, err, 2, "not a gpt2ladder checkpoint")  # someone's file: a mistake, kept
    assert_untouched(run_path, before)


def test_resume_with_another_model_config_keeps_the_checkpoint(run_dir, capsys):
    run_path, before = run_dir
    argv = train(run_path, "--resume")
    argv[argv.index("--rungs") + 1] = "baseline,vocab"  # 50304 classifier rows instead of 50257
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, 2, "--resume", "another model", "vocab_multiple")
    assert_untouched(run_path, before)


def test_resume_without_a_checkpoint(tmp_path, capsys):
    (tmp_path / "small.txt").write_text(TEXT)
    code, _, err = run(capsys, *train(tmp_path / "empty-run", "--resume"))
    assert_one_line_error(code, err, 2, "no checkpoint at")


@pytest.mark.parametrize("extra,words", [
    (["--seq-len", "257"], ["--seq-len 257", "block size of 256"]),
    (["--batch-size", "0"], ["--batch-size", "positive integer"]),
    (["--steps", "three"], ["--steps", "positive integer"]),
    (["--preset", "gpt5"], ["unknown preset 'gpt5'"]),
    (["--rungs", "warp"], ["unknown rung warp"]),
])
def test_train_bad_arguments_keep_the_run(run_dir, capsys, extra, words):
    run_path, before = run_dir
    code, _, err = run(capsys, *train(run_path, "--resume", *extra))
    assert_one_line_error(code, err, 2, *words)
    assert_untouched(run_path, before)


def test_train_with_a_missing_data_file_keeps_the_run(run_dir, capsys, tmp_path):
    run_path, before = run_dir
    argv = train(run_path, "--resume")
    argv[argv.index("--data") + 1] = tmp_path / "gone.txt"
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, 2, "gone.txt", "does not exist")
    assert_untouched(run_path, before)
