"""`gpt2ladder prepare` from the command line: what it says, what it writes, that every command's --data
takes the result, and one line for each bad input. Ctrl-C and the offline hub run in a real process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt2ladder.cli import build_parser, main
from gpt2ladder.data import manifest
from gpt2ladder.data import shards as fmt

SRC = str(Path(__file__).resolve().parents[2] / "src")
DOC = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code, err, expected, *words):
    assert code == expected, err
    assert err.count("\n") == 1 and err.startswith("gpt2ladder: error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


def texts(folder: Path, n: int = 30) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"{i:03d}.txt").write_text(f"Scene {i}.\n" + DOC * (1 + i % 3))
    return folder


@pytest.mark.slow  # a real bench on the shards: the proof that a command's --data takes them
def test_prepare_then_bench_on_the_shards(tmp_path, capsys):
    out = tmp_path / "shards"
    code, stdout, err = run(capsys, "prepare", texts(tmp_path / "plays"), out, "--val-tokens", "200",
                            "--shard-tokens", "1K", "--workers", "1", "--no-progress")
    assert code == 0 and err == ""
    banner, summary = stdout.strip().splitlines()
    assert banner.startswith("prepare: ") and "(30 text files)" in banner and "plays_val_000000.bin" in banner
    m = json.loads((out / "manifest.json").read_text())
    assert summary.startswith(f"wrote {out}: 30 documents, {m['n_tokens']:,} tokens") and "--data" in summary
    code, _, err = run(capsys, "bench", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--steps", "1",
                       "--warmup", "0", "--batch-size", "2", "--seq-len", "16", "--data", out, "--out", tmp_path / "b",
                       "--no-progress")
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "ladder.json").read_text())["data"]["n_tokens"] == m["n_tokens"]


def test_a_hub_dataset_and_its_local_parquet_give_the_same_shards(tmp_path, capsys):
    pytest.importorskip("datasets")
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"text": [DOC * i for i in range(1, 40)]}), tmp_path / "ds" / "train-00000.parquet",
                   row_group_size=7)
    shas = []
    for how in ("hf", "parquet"):
        code, _, err = run(capsys, "prepare", tmp_path / "ds", tmp_path / how, "--format", how, "--name", "ds",
                           "--val-tokens", "300", "--shard-tokens", "2K", "--workers", "1", "--no-progress")
        assert code == 0, err
        shas.append([s["sha256"] for s in json.loads((tmp_path / how / "manifest.json").read_text())["shards"]])
    assert shas[0] == shas[1] and len(shas[0]) > 2


def test_a_progress_bar_counts_documents_and_tokens_on_a_terminal(tmp_path, capsys, monkeypatch):
    import functools

    from gpt2ladder.commands import prepare as command
    from gpt2ladder.data import prepare as pipeline
    from gpt2ladder.report import progress

    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    monkeypatch.setattr(command, "progress_bar", functools.partial(progress.progress_bar, mininterval=0))
    monkeypatch.setattr(pipeline, "BATCH_CHARS", 500)  # a few batches, so the bar moves
    code, _, err = run(capsys, "prepare", texts(tmp_path / "p"), tmp_path / "o", "--workers", "1")
    assert code == 0 and "30/30" in err and "doc/s" in err and "tokens/s" in err
    code, _, err = run(capsys, "prepare", texts(tmp_path / "p"), tmp_path / "o2", "--workers", "1", "--no-progress")
    assert code == 0 and err == ""


def _parquet(path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": ["a"]}), path)
    return path


CASES = [  # (id, make the source in tmp_path -> SOURCE, extra flags, exit code, fragments of the one line)
    ("empty jsonl", lambda d: _write(d / "x.jsonl", ""), [], 2, ["holds no documents"]),
    ("empty folder", lambda d: _mkdir(d / "empty"), [], 2, ["holds no files"]),
    ("missing field", lambda d: _write(d / "x.jsonl", '{"body": "a"}\n'), [], 2,
     ["has no field 'text'", "--text-field"]),
    ("parquet without the column", lambda d: _parquet(d / "x.parquet"), [], 2, ["has no column 'text'"]),
    ("unknown suffix", lambda d: _write(d / "x.tar", "x"), [], 2, ["of a format prepare does not read"]),
    ("unknown --format", lambda d: _write(d / "x.txt", "x"), ["--format", "xml"], 2, ["--format: invalid choice"]),
    ("not text", lambda d: _write(d / "x.txt", b"\xff\xfe\x00"), [], 2, ["is not UTF-8 text"]),
    ("a FIFO", lambda d: (os.mkfifo(d / "f"), d / "f")[1], [], 2, ["is not a regular file"]),
    ("no such path", lambda d: d / "nope.jsonl", [], 2, ["does not exist"]),
    ("val tokens 0", lambda d: _write(d / "x.txt", "x"), ["--val-tokens", "0"], 2, ["--val-tokens", "positive"]),
    ("val tokens words", lambda d: _write(d / "x.txt", "x"), ["--val-tokens", "lots"], 2, ["such as 100000, 10M"]),
    ("shard over int32", lambda d: _write(d / "x.txt", "x"), ["--shard-tokens", "3B"], 2, ["2,147,483,647"]),
    ("a name saying val", lambda d: _write(d / "x.txt", "x"), ["--name", "my_val_set"], 2, ["'val' or 'train'"]),
    ("empty text file", lambda d: _write(d / "x.txt", ""), [], 2, ["holds no documents, or empty ones only"]),
    ("empty documents only", lambda d: _write(d / "x.jsonl", '{"text": ""}\n' * 3), [], 2, ["holds no documents"]),
    ("a bad record on line 2", lambda d: _write(d / "x.jsonl", '{"text": "hello"}\n{"text": 5}\n'), [], 2,
     ["x.jsonl line 2: field 'text' is int, not text"]),  # found in the first lines: before the banner
    ("no JSON on line 2", lambda d: _write(d / "x.jsonl", '{"text": "hello"}\nnot json\n'), [], 2,
     ["x.jsonl line 2 is not valid JSON"]),
    ("a picture among texts", lambda d: (_write(_mkdir(d / "docs") / "a.txt", DOC),
                                         _write(d / "docs" / "b.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"))[0].parent,
     [], 2, ["b.png is not UTF-8 text", "move it out"]),
]


def test_records_read_in_the_wrong_format_give_a_short_line(tmp_path, capsys):
    """A JSON Lines file read as CSV has its whole first record as its one column name: the line quotes a little."""
    source = _write(tmp_path / "docs.jsonl", (json.dumps({"text": DOC * 100}) + "\n") * 2)
    got, stdout, err = run(capsys, "prepare", source, tmp_path / "out", "--format", "csv")
    one_line(got, err, 2, "has no column 'text'", "...")
    assert stdout == "" and len(err) < 200 + len(str(source))


def test_out_inside_the_source_folder_is_one_line(tmp_path, capsys):
    plays = texts(tmp_path / "plays")
    one_line(*[run(capsys, "prepare", plays, plays / "shards")[i] for i in (0, 2)], 2, "is inside the source folder")
    assert not (plays / "shards").exists()


def _write(path, content):
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _mkdir(path):
    path.mkdir()
    return path


@pytest.mark.parametrize("make, flags, code, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, make, flags, code, words):
    source = make(tmp_path)
    got, stdout, err = run(capsys, "prepare", source, tmp_path / "out", "--workers", "1", *flags)
    one_line(got, err, code, *words)
    assert stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_one_line(tmp_path, capsys):
    path = _write(tmp_path / "x.txt", "secret")
    path.chmod(0)
    one_line(*[run(capsys, "prepare", path, tmp_path / "out")[i] for i in (0, 2)], 2, "permission denied")


def test_every_option_states_its_default():
    parser = build_parser()._subparsers._group_actions[0].choices["prepare"]
    for action in parser._actions:
        if action.dest not in ("help", "debug"):
            assert "default" in (action.help or ""), action.dest


def _cli(*argv, **env):
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]), **env}
    return [sys.executable, "-m", "gpt2ladder", *map(str, argv)], full


def test_a_hub_name_offline_is_one_line_in_a_real_process(tmp_path):
    argv, env = _cli("prepare", "HuggingFaceFW/fineweb-edu", tmp_path / "out", "--subset", "sample-10BT",
                     HF_HUB_OFFLINE="1")
    env.pop("HF_DATASETS_OFFLINE", None)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "HF_HUB_OFFLINE is set" in proc.stderr and not (tmp_path / "out").exists()


def _as_from_a_terminal() -> None:
    """In the child before it starts: Ctrl-C handled and not blocked, as a shell starts a command, whatever the test
    process's own disposition (a test runner's worker may ignore or block SIGINT, and a child inherits that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_leaves_only_whole_shards_and_the_same_command_finishes(tmp_path, shakespeare_cache):
    text = (shakespeare_cache / "tinyshakespeare" / "input.txt").read_text()
    source = tmp_path / "plays.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in text.split("\n\n")) * 30)  # ~10M tokens: the
    # interrupt lands mid-way (about 3 s of tokenizing) even when a loaded machine wakes this test late
    out = tmp_path / "out"
    argv, env = _cli("prepare", source, out, "--val-tokens", "2K", "--shard-tokens", "50K", "--workers", "1")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_terminal)
    started = time.monotonic()
    while not (out / "manifest.partial.json").exists() and time.monotonic() < started + 60 and proc.poll() is None:
        time.sleep(0.01)
    seen = f"signalled {time.monotonic() - started:.2f} s after the start, the process then {proc.poll()}"
    proc.send_signal(signal.SIGINT)
    said, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.count("\n") == 1 and "run the same command to continue" in err, (
        seen, said, err)
    kept = manifest.read(out / "manifest.partial.json")["shards"]
    left = sorted(p.name for p in out.iterdir())
    assert not [n for n in left if n.startswith(".")]  # no temporary file, no spool
    assert {s["name"] for s in kept} <= set(left) and "manifest.json" not in left
    # every shard whole (one closed just before its record counts), the recorded ones verified
    for name in [n for n in left if n.endswith(".bin")]:
        assert fmt.open_shard(out / name, fmt.LLMC).n_tokens > 0
    assert all(fmt.file_sha256(out / s["name"]) == s["sha256"] for s in kept)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "continuing after" in done.stdout, done.stderr
    final = manifest.read(out / "manifest.json")
    assert final["shards"][:len(kept)] == [{k: s[k] for k in manifest.SHARD_KEYS} for s in kept]
    assert final["n_tokens"] == sum(s["n_tokens"] for s in final["shards"]) > 1_500_000


def test_a_second_prepare_into_the_same_out_is_refused_while_the_first_writes(tmp_path, capsys):
    """Run together, each would remove the other's temporaries as a killed run's: the second is one line and
    touches nothing; the lock, OUT/.lock, goes with the first."""
    from gpt2ladder.training import lock

    out = tmp_path / "shards"
    out.mkdir()
    first, holder = lock.try_lock(out)  # what a prepare running now holds
    assert holder is None
    code, stdout, err = run(capsys, "prepare", texts(tmp_path / "plays"), out, "--workers", "1", "--no-progress")
    one_line(code, err, 2, f"{out} is being written by another gpt2ladder prepare (pid {os.getpid()} ")
    assert stdout == "" and [p.name for p in out.iterdir()] == [".lock"]
    first.release()
    code, _, err = run(capsys, "prepare", texts(tmp_path / "plays"), out, "--val-tokens", "200", "--workers", "1",
                       "--no-progress")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plays", "shards"]
    assert not any(p.name.startswith(".") for p in out.iterdir())  # the lock went with it


def test_a_finished_corpus_in_a_read_only_folder_still_answers(tmp_path, capsys, monkeypatch):
    """Nothing is written to a finished corpus, so a folder where no lock can be made (read-only storage:
    here the lock's open fails as it would there) still answers that there is nothing to do; and a refused
    plan leaves no new folder behind."""
    from gpt2ladder.training import lock

    out = tmp_path / "shards"
    assert run(capsys, "prepare", texts(tmp_path / "plays"), out, "--val-tokens", "200", "--workers", "1",
               "--no-progress")[0] == 0

    def read_only(folder):
        raise PermissionError(13, "Permission denied", str(folder / ".lock"))

    monkeypatch.setattr(lock, "try_lock", read_only)
    code, stdout, err = run(capsys, "prepare", tmp_path / "plays", out, "--val-tokens", "200", "--workers", "1",
                            "--no-progress")
    assert code == 0 and err == "" and "already holds this corpus" in stdout
    monkeypatch.undo()
    inside = tmp_path / "plays" / "shards"
    code, _, err = run(capsys, "prepare", tmp_path / "plays", inside, "--workers", "1", "--no-progress")
    one_line(code, err, 2, "inside the source folder")
    assert not inside.exists()


def _workers_of(pid: int) -> set[int]:
    """The spawned worker processes whose parent is pid (Linux's /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                found.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _started_with_workers(tmp_path, shakespeare_cache):
    text = (shakespeare_cache / "tinyshakespeare" / "input.txt").read_text()
    source = tmp_path / "plays.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in text.split("\n\n")) * 6)  # ~2M tokens
    argv, env = _cli("prepare", source, tmp_path / "out", "--val-tokens", "2K", "--shard-tokens", "50K",
                     "--workers", "2", "--no-progress")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(workers := _workers_of(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert len(workers) == 2 and proc.poll() is None
    return proc, workers


def _gone(workers: set[int], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(_alive, workers))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers in Linux's /proc")
def test_the_workers_end_when_prepare_is_killed(tmp_path, shakespeare_cache):
    proc, workers = _started_with_workers(tmp_path, shakespeare_cache)
    try:
        proc.kill()  # SIGKILL: the parent runs no cleanup at all
        assert _gone(workers), [w for w in workers if _alive(w)]
    finally:
        _end(proc, workers)


def _end(proc, workers: set[int]) -> str:
    """Whatever is left of the workers killed; the parent's stderr."""
    for w in workers:
        if _alive(w):
            os.kill(w, signal.SIGKILL)
    return proc.communicate(timeout=30)[1]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers in Linux's /proc")
def test_sigterm_stops_prepare_as_ctrl_c_does(tmp_path, shakespeare_cache):
    proc, workers = _started_with_workers(tmp_path, shakespeare_cache)
    try:
        proc.terminate()
        assert proc.wait(timeout=30) == 143 and _gone(workers)
    finally:
        err = _end(proc, workers)
    assert err.count("\n") == 1 and "terminated;" in err and "leaked" not in err, err
    out = tmp_path / "out"
    assert not out.exists() or not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_bad_record_past_the_first_lines_stops_the_run_with_nothing_claimed(tmp_path, capsys, monkeypatch):
    """Found only while tokenizing: the banner (a plan) is followed by the one line, no summary, and OUT is gone."""
    from gpt2ladder.data import sources

    monkeypatch.setattr(sources, "CHECK_DOCUMENTS", 2)
    source = _write(tmp_path / "x.jsonl", '{"text": "hello"}\n' * 3 + '{"text": 5}\n')
    code, stdout, err = run(capsys, "prepare", source, tmp_path / "out", "--workers", "1", "--no-progress")
    one_line(code, err, 2, "x.jsonl line 4: field 'text' is int, not text")
    assert stdout.count("\n") == 1 and stdout.startswith("prepare: ") and "wrote" not in stdout
    assert not (tmp_path / "out").exists()


def test_a_bad_record_after_finished_shards_says_they_are_kept_and_what_to_do(tmp_path, capsys, monkeypatch):
    """The shards finished before a bad record stay (with the partial manifest), and the one line says so: the source
    mended is another source, which they cannot continue, and a rerun into the same OUT is refused saying so."""
    from gpt2ladder.data import prepare, sources

    monkeypatch.setattr(sources, "CHECK_DOCUMENTS", 2)
    monkeypatch.setattr(prepare, "BATCH_CHARS", 64)  # a batch of a few records, so shards finish before line 61
    record = '{"text": "hello there, world of records"}\n'
    source = _write(tmp_path / "x.jsonl", record * 60 + '{"text": 5}\n')
    args = ("prepare", source, tmp_path / "out", "--workers", "1", "--no-progress", "--val-tokens", "8",
            "--shard-tokens", "40")
    code, stdout, err = run(capsys, *args)
    one_line(code, err, 2, "x.jsonl line 61: field 'text' is int, not text")
    kept = sorted(p.name for p in (tmp_path / "out").glob("*.bin"))
    assert len(kept) >= 2 and (tmp_path / "out" / "manifest.partial.json").is_file()
    assert f"; {tmp_path / 'out'} keeps the {len(kept)} shards finished before it, which the source mended" in err
    assert "another OUT, or empty this one first" in err and "wrote" not in stdout
    _write(source, record * 61)  # mended
    code, _, err = run(capsys, *args)
    one_line(code, err, 2, "holds an unfinished prepare of another source", "or empty this one")


def test_a_bad_document_of_a_hub_dataset_after_finished_shards_says_they_are_kept(tmp_path, capsys, monkeypatch):
    """A Hub dataset is known by its name, not by its files, so nothing is said of a mended one."""
    pytest.importorskip("datasets")
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    from gpt2ladder.data import prepare, sources

    monkeypatch.setattr(sources, "CHECK_DOCUMENTS", 2)
    monkeypatch.setattr(prepare, "BATCH_CHARS", 64)
    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"text": ["hello there, world of records"] * 60 + [None]}),
                   tmp_path / "ds" / "train-00000.parquet")
    code, _, err = run(capsys, "prepare", tmp_path / "ds", tmp_path / "out", "--format", "hf", "--workers", "1",
                       "--no-progress", "--val-tokens", "8", "--shard-tokens", "40")
    one_line(code, err, 2, "document 60 of", "field 'text' is NoneType, not text", "with manifest.partial.json")
    kept = len(list((tmp_path / "out").glob("*.bin")))
    assert kept >= 2 and f"keeps the {kept} shards finished before it" in err and "mended" not in err


def test_skipped_files_of_a_folder_are_counted_in_the_banner_and_manifest(tmp_path, capsys):
    folder = _mkdir(tmp_path / "f")
    _write(folder / "a.txt", "a text")
    _write(_mkdir(folder / "sub") / "b.md", "another text")
    _write(folder / "d.jsonl", '{"text": "a record"}\n')
    _write(folder / "c.bin", b"\x7fELF\0\0\0")
    code, stdout, err = run(capsys, "prepare", folder, tmp_path / "out", "--workers", "1", "--no-progress")
    assert code == 0, err
    assert f"prepare: {folder.resolve()} (1 jsonl file, skipping 1 file of a format prepare does not read (c.bin) " \
           "and 2 files of another format (a.txt, sub/b.md)) -> " in stdout
    skipped = json.loads((tmp_path / "out" / "manifest.json").read_text())["source"]["skipped"]
    assert skipped == {"files of a format prepare does not read": {"count": 1, "first": ["c.bin"]},
                       "files of another format": {"count": 2, "first": ["a.txt", "sub/b.md"]}}


def test_a_corpus_too_short_to_train_on_says_so_instead_of_suggesting_it(tmp_path, capsys):
    source = _write(tmp_path / "s.csv", 'id,text\n1,"hello world"\n2,"second doc, with comma"\n')
    code, stdout, err = run(capsys, "prepare", source, tmp_path / "out", "--workers", "1", "--no-progress")
    assert code == 0 and err == ""
    last = stdout.strip().splitlines()[-1]
    assert last.startswith(f"wrote {tmp_path / 'out'}: 2 documents, 9 tokens: validation 0, training 9 in 1 shard")
    assert last.endswith("; too small for train's shortest default sequence, 129 tokens (--seq-len 128 on a CPU, plus "
                         "the next token): validation holds 0 tokens and training holds 9; prepare again into "
                         "another OUT from a longer source, or train with --eval-every 0 and a --seq-len below 9")
    assert "--data" not in last


@pytest.mark.parametrize("val, train, val_tokens, says", [
    (200, [300], 1000, "train on it with --data OUT"),
    (50, [300], 1000, "validation holds 50 tokens; prepare again into another OUT from a longer source, or train "
                      "with --eval-every 0 or a --seq-len below 50"),
    (50, [300], 50, "validation holds 50 tokens; prepare again into another OUT with a larger --val-tokens, or "
                    "train with --eval-every 0 or a --seq-len below 50"),
    (0, [300], 1000, "validation holds 0 tokens; prepare again into another OUT from a longer source, or train with "
                     "--eval-every 0"),
    (200, [100, 100], 1000, "no training shard holds that many (the largest 100; a sequence never spans shards); "
                            "prepare again into another OUT with a larger --shard-tokens, or train with a --seq-len "
                            "below 100"),
    (45, [100, 100, 100], 45, "validation holds 45 tokens and no training shard holds that many (the largest 100; a "
                              "sequence never spans shards); prepare again into another OUT with a larger "
                              "--val-tokens and with a larger --shard-tokens, or train with a --seq-len below 45"),
    (40, [1], 1000, "validation holds 40 tokens and training holds 1; prepare again into another OUT from a longer "
                    "source"),
])
def test_the_last_line_says_when_train_would_refuse_the_corpus(val, train, val_tokens, says):
    from gpt2ladder.commands.prepare import _next_step

    shards = [{"split": "val", "n_tokens": val}] + [{"split": "train", "n_tokens": n} for n in train]
    got = _next_step(Path("OUT"), {"shards": shards}, val_tokens)
    assert got.endswith(says) and (got == says) is (says.startswith("train on it"))


def test_counts_of_one_are_singular():
    from gpt2ladder.commands.prepare import _counts

    shards = [{"split": "val", "n_tokens": 0}, {"split": "train", "n_tokens": 1}]
    assert _counts({"documents": 1, "n_tokens": 1, "shards": shards}).startswith("1 document, 1 token: ")
    assert _counts({"documents": 2, "n_tokens": 2, "shards": shards}).startswith("2 documents, 2 tokens: ")
