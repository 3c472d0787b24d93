"""Tokens per second of `gpt2ladder prepare` with 1 and 2 workers against tiktoken's own
`encode_ordinary_batch` with as many threads, on the same documents: Tiny Shakespeare repeated to about
35 MB and cut at blank lines into documents of about 4 KB (FineWeb-Edu's are 4.7 KB on average; tiktoken's
batch call pays a thread-pool hand-off per document, so tiny documents would flatter prepare), written
as JSON Lines.

Four timings, each the median of --repeats runs:
  tiktoken  encode_ordinary_batch(docs, num_threads=W): the BPE alone, documents already in memory
  tokenize  prepare's tokenizing stage: the JSONL read and cut into batches, W worker processes started
            and fed, the ids gathered back in order (no shards written)
  prepare   the whole command's work: the above, plus the shards and the manifest written and hashed
  start-up  W worker processes started until the first answers (a fresh interpreter each, which imports
            numpy and tiktoken and builds the BPE): a fixed cost in `tokenize` and `prepare`, shown apart
            so their rates can be read both with it and without it (`steady`)
The machine's load is recorded beside the figures (`uptime` before and after): on a shared machine they
are a floor. Run: PYTHONPATH=src python benchmarks/micro/tokenize_rate.py --out benchmarks/results/DATE-cpu-tokenize
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tiktoken

from gpt2ladder.data import prepare as P
from gpt2ladder.data.sources import SourceSpec, open_source
from gpt2ladder.data.text import fetch_tinyshakespeare
from gpt2ladder.data.tokenizer import get_tokenizer


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime unavailable"


def documents(text: str, size: int) -> list[str]:
    """The text's speeches (blank-line separated) joined into documents of at least `size` characters."""
    docs, current = [], []
    for speech in text.split("\n\n"):
        current.append(speech)
        if sum(map(len, current)) >= size:
            docs.append("\n\n".join(current))
            current = []
    return docs + (["\n\n".join(current)] if current else [])


def timed(fn, repeats: int) -> tuple[float, int]:
    """(median seconds, tokens) over repeats runs of fn(), which returns its token count."""
    times, n = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


def stage(source, workers: int) -> int:
    return sum(len(t) for _, t in P.tokenized(P._batches(source.pieces(), 0), workers))


def startup(workers: int) -> int:
    return sum(len(t) for _, t in P.tokenized(iter([(None, [("x", True)])]), workers))


def whole(source_path: Path, folder: Path, workers: int) -> int:
    out = Path(tempfile.mkdtemp(dir=folder))
    cfg = P.PrepareConfig(SourceSpec(str(source_path)), out, "bench", val_tokens=10**6, shard_tokens=10**7,
                          workers=workers)
    source = open_source(cfg.spec)
    return P.run(cfg, source, P.plan(cfg, source))["n_tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=32, help="Tiny Shakespeares to repeat (default: 32, ~35 MB)")
    ap.add_argument("--doc-bytes", type=int, default=4000, help="about this much text a document (default: 4000)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per timing; the median is kept (default: 3)")
    ap.add_argument("--out", type=Path, help="write result.json and result.md here (default: print only)")
    args = ap.parse_args()
    before = uptime()
    docs = documents(fetch_tinyshakespeare().read_text(), args.doc_bytes) * args.copies
    enc = get_tokenizer()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source_path = Path(tmp) / "plays.jsonl"
        source_path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        source = open_source(SourceSpec(str(source_path)))
        for workers in (1, 2):
            base, n_base = timed(lambda: sum(map(len, enc.encode_ordinary_batch(docs, num_threads=workers))),
                                 args.repeats)
            tok, n_tok = timed(lambda: stage(source, workers), args.repeats)
            run, n_run = timed(lambda: whole(source_path, Path(tmp), workers), args.repeats)
            start = timed(lambda: startup(workers), args.repeats)[0] if workers > 1 else 0.0
            assert n_tok == n_run == n_base + len(docs)  # the same ids, plus one <|endoftext|> a document
            rate = n_base / base
            rows.append({"workers": workers, "tokens": n_run, "startup_s": start, "tiktoken_tokens_per_s": rate,
                         "tokenize_tokens_per_s": n_tok / tok, "tokenize_steady_tokens_per_s": n_tok / (tok - start),
                         "prepare_tokens_per_s": n_run / run, "prepare_steady_tokens_per_s": n_run / (run - start),
                         "ratio_tokenize": n_tok / tok / rate, "ratio_tokenize_steady": n_tok / (tok - start) / rate,
                         "ratio_prepare": n_run / run / rate, "ratio_prepare_steady": n_run / (run - start) / rate})
            print(json.dumps(rows[-1]), flush=True)
    result = {"benchmark": "tokenize", "text_bytes": sum(len(d.encode()) + 1 for d in docs), "documents": len(docs),
              "repeats": args.repeats, "rows": rows, "uptime_before": before, "uptime_after": uptime(),
              "machine": {"cpus": os.cpu_count(), "cores_usable": P.available_cores(), "cpu": _cpu_name(),
                          "python": platform.python_version(), "tiktoken": tiktoken.__version__,
                          "numpy": np.__version__, "os": platform.platform()}}
    table = _table(result)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "result.md").write_text(table + "\n")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def _table(result: dict) -> str:
    lines = ["| workers | tiktoken encode_ordinary_batch | prepare's tokenizing (steady) | ratio (steady) | "
             "prepare, shards written (steady) | ratio (steady) | worker start-up |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['workers']} | {r['tiktoken_tokens_per_s']:,.0f} | {r['tokenize_tokens_per_s']:,.0f} "
                     f"({r['tokenize_steady_tokens_per_s']:,.0f}) | {r['ratio_tokenize']:.2f} "
                     f"({r['ratio_tokenize_steady']:.2f}) "
                     f"| {r['prepare_tokens_per_s']:,.0f} ({r['prepare_steady_tokens_per_s']:,.0f}) "
                     f"| {r['ratio_prepare']:.2f} "
                     f"({r['ratio_prepare_steady']:.2f}) | {r['startup_s']:.2f} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
