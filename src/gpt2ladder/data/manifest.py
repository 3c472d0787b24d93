"""A prepared corpus's manifest: what `prepare` read (source, tokenizer, settings) and what it wrote (each
shard's name, split, token count and sha256). `manifest.json` is written last and atomically, once every
shard is whole; `manifest.partial.json` records the finished shards of a run still going (or killed), with
where in the source each one ends, so the next run continues after them. The partial manifest is JSON Lines,
the settings first and then one line per finished shard, appended as each one finishes: writing it costs
the same for the thousandth shard as for the first (rewriting it whole would grow with every shard). A
line cut short by a kill is not a record, and its shard is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from gpt2ladder.data.files import atomic_file
from gpt2ladder.errors import UsageError

FORMAT = "gpt2ladder-corpus"
VERSION = 1
FINAL = "manifest.json"
PARTIAL = "manifest.partial.json"
SHARD_KEYS = ("name", "split", "n_tokens", "sha256")


def write(path: Path, manifest: dict) -> None:
    """Write a manifest whole or not at all; the same contents always give the same bytes."""
    with atomic_file(path) as f:
        f.write((json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def start_partial(path: Path, base: dict, shards: list[dict]) -> None:
    """A partial manifest of these finished shards, whole or not at all (a run's first record)."""
    with atomic_file(path) as f:
        f.write("".join(json.dumps(x, sort_keys=True) + "\n" for x in [base, *shards]).encode())


def append_partial(path: Path, shard: dict) -> None:
    """One more finished shard, on disk before the run goes on."""
    with open(path, "ab") as f:
        f.write((json.dumps(shard, sort_keys=True) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def _parse(text: str) -> dict:
    """A manifest's JSON: one object, or the partial manifest's lines (the settings, then a shard a line;
    a last line without its newline was cut short and does not count)."""
    try:
        return json.loads(text)
    except ValueError:
        lines = text.split("\n")
        if len(lines) < 2:
            raise
        base = json.loads(lines[0])
        if not isinstance(base, dict):
            raise ValueError("not a manifest") from None
        return {**base, "shards": [json.loads(line) for line in lines[1:-1]]}


def read(path: Path) -> dict:
    """A manifest, its shape checked; a one-line UsageError naming the file otherwise."""
    try:
        manifest = _parse(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError:
        raise UsageError(f"{path} is not valid JSON: damaged, or not written by gpt2ladder prepare") from None
    problem = _problem(manifest)
    if problem:
        raise UsageError(f"{path} is not a gpt2ladder corpus manifest this version reads: {problem}")
    return manifest


def _problem(m) -> str | None:
    if not isinstance(m, dict) or (m.get("format"), m.get("version")) != (FORMAT, VERSION):
        return f"format {m.get('format') if isinstance(m, dict) else None!r}, expected {FORMAT!r} version {VERSION}"
    shards = m.get("shards")
    if not isinstance(shards, list):
        return "it lists no shards"
    for s in shards:
        if not (isinstance(s, dict) and all(k in s for k in SHARD_KEYS) and isinstance(s["n_tokens"], int)
                and s["split"] in ("val", "train") and isinstance(s["name"], str) and "/" not in s["name"]):
            return f"a shard entry is damaged ({s!r:.80})"
    return None


def identity(manifest: dict) -> str:
    """What a resumed run compares to know it trains on the same corpus: the tokenizer and every shard's
    name, count and sha256 (not where the source was, so a copied corpus is the same corpus)."""
    content = {"tokenizer": manifest.get("tokenizer"),
               "shards": [[s["name"], s["n_tokens"], s["sha256"]] for s in manifest["shards"]]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
