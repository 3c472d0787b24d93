"""Which folders a run may write into and which an export may replace: a user's own files are never
replaced, and a run's folder never by an export of the Python API (nor, while it trains, by any).

`train --out` writes config.json, log.jsonl, loss.png and checkpoints: names a user's folder may hold too,
so a folder that is not empty must be a gpt2ladder run (its checkpoint, or the config.json a run writes
first). `save_hf(..., overwrite=True)` replaces only a folder of the files an export writes. bench, profile,
parity and race write into a folder that is new, empty, or holds only what they write themselves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpt2ladder.errors import UsageError
from gpt2ladder.training import lock
from gpt2ladder.training.checkpoint import BEST, FILENAME, PREVIOUS

# What `export` and `save_hf` write: the weights, their config, the tokenizer files and the model card.
EXPORT_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
                          "tokenizer.json", "tokenizer_config.json", "README.md",
                          "gpt2ladder.json"})  # what the card was made from (commands/export.py)


def _visible(folder: Path) -> list[str]:
    """The names in a folder but hidden ones (a lock, a writer's temporary, macOS's .DS_Store)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def is_train_run(folder: Path) -> bool:
    """Whether the folder holds a gpt2ladder training run: a checkpoint, or the config.json `train` writes."""
    if any((folder / name).is_file() for name in (FILENAME, PREVIOUS, BEST)):
        return True
    try:
        record = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("command") == "train" and "train_config" in record


def check_run_out(out: Path) -> None:
    """A UsageError, before anything is written, when --out is a folder of files that are not a run's. A
    link there is not counted: the run replaces a link by its own file and never writes through it."""
    if not out.is_dir() or is_train_run(out):
        return
    names = [n for n in _visible(out) if not (out / n).is_symlink()]
    if names:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise UsageError(f"--out {out} holds files that are not a gpt2ladder run ({shown}); a run would replace "
                         "some of them: give an empty or new folder")


def check_own_out(out: Path, command: str, own: str) -> None:
    """A UsageError, before anything is written, when --out is a folder holding files `command` does not
    write: `own` is a regular expression its file (or folder) names match in full. A folder of its own
    earlier output is written again; hidden names (a lock, a writer's temporary) are not counted."""
    if not out.is_dir():
        return
    foreign = [n for n in _visible(out) if not re.fullmatch(own, n)]
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise UsageError(f"--out {out} holds files gpt2ladder {command} did not write ({shown}); give an empty or "
                         f"new folder, or one of {command}'s own output")


def check_export_replaceable(out: Path) -> None:
    """A UsageError unless `out` (absent, empty, or to be replaced) holds only what an export writes: never a
    run directory, never a folder of other files."""
    if not out.is_dir():
        return
    names = _visible(out)
    if not names:
        return
    if is_train_run(out) or "log.jsonl" in names:
        raise UsageError(f"{out} is a gpt2ladder run directory; an export never replaces one: give another folder")
    foreign = [n for n in names if n not in EXPORT_FILES]
    if foreign or "model.safetensors" not in names:
        shown = ", ".join((foreign or names)[:4])
        raise UsageError(f"{out} holds files an export did not write ({shown}); it is replaced only when it holds "
                         "an earlier export: give another folder")


def hold_unless_training(out: Path) -> lock.RunLock | None:
    """The run lock of a folder about to be replaced (None when it is empty: no run is in it); a UsageError
    while a run trains there."""
    if not (out.is_dir() and any(out.iterdir())):
        return None
    held, holder = lock.try_lock(out)
    if holder:
        raise UsageError(f"{out} is the run directory of a gpt2ladder run still going on ({holder}); "
                         "it cannot be replaced while the run goes on: wait for it, or give another folder")
    return held
