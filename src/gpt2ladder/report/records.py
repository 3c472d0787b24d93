"""Results that describe themselves: the header every record carries (versions, device, git SHA, date), the
name a run or record gives its recipe, and writing records safely (an output folder checked before any work,
files written through `data/files.py`, never through a link already there, and a folder that appears whole or
not at all)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import torch

from gpt2ladder.data.files import atomic_path, beside, write_atomic
from gpt2ladder.errors import UsageError
from gpt2ladder.version import __version__


def record_header(caps, device: torch.device) -> dict:
    return {
        "gpt2ladder": __version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "device": {"type": device.type, "name": caps.name, "capability": list(caps.capability),
                   "memory_bytes": caps.total_memory,
                   "memory_cap_bytes": caps.memory_cap or None,
                   "count": torch.cuda.device_count() if device.type == "cuda" else 0},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "triton": caps.triton_version,
                     "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None},
        "host": {"os": platform.system(), "machine": platform.machine(), "cpus": os.cpu_count()},
    }


def git_sha() -> str | None:
    """The commit of the source tree this package was run from, when it is a git checkout."""
    if os.environ.get("GPT2LADDER_GIT_SHA"):  # a copy of the tree without .git (e.g. shipped to a GPU host)
        return os.environ["GPT2LADDER_GIT_SHA"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def _no_file_on_path(out: Path) -> None:
    file = next((p for p in [out, *out.parents] if p.exists() and not p.is_dir()), None)
    if file is not None:  # mkdir would only say "File exists" (or "Not a directory" under a file)
        raise UsageError(f"cannot write to output directory {out}: {file} is a file, not a folder")


def check_out_dir(path: str | Path) -> Path:
    """What `prepare_out_dir` checks, creating nothing (a dry run): no file on the way, and the nearest folder that
    exists writable."""
    out = Path(path)
    _no_file_on_path(out)
    there = next(p for p in [out, *out.parents] if p.exists())
    if not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to output directory {out}: {there} is not writable")
    return out


def prepare_out_dir(path: str | Path) -> Path:
    """Create the output directory, or fail in one line before any work is done."""
    out = Path(path)
    _no_file_on_path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as err:
        raise UsageError(f"cannot write to output directory {out}: {err.strerror or err}") from None
    return out


@contextlib.contextmanager
def output_dir(path: str | Path) -> Iterator[Path]:
    """`prepare_out_dir`, and if the block fails, remove again the folders this call created that are
    still empty: a failed run leaves no empty --out behind, and never touches one that was there."""
    out = Path(path)
    created = [p for p in [out, *out.parents] if not p.exists()]  # deepest first
    prepared = prepare_out_dir(out)
    try:
        yield prepared
    except BaseException:
        for folder in created:
            try:
                folder.rmdir()  # only ever succeeds on an empty folder
            except OSError:
                break
        raise


def write_json(path: Path, record: dict) -> None:
    """Atomic: a reader never sees half a file."""
    write_atomic(path, json.dumps(record, indent=2, default=str) + "\n")


def write_record(out: Path, stem: str, record: dict, markdown, plot) -> list[Path]:
    """STEM.json, STEM.md and STEM.png in `out`, from a record and its Markdown and plot functions.

    The plot function is handed a new temp file's name ending in .png, which replaces STEM.png when done.
    """
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    write_json(paths[0], record)
    write_atomic(paths[1], markdown(record))
    with atomic_path(paths[2]) as tmp:
        plot(record, tmp)
    return paths


def check_new_folder(out: Path, force: bool = False, force_flag: str = "--force") -> None:
    """UsageError unless `out` is absent, an empty folder, or a folder that `force` allows to replace
    (`force_flag`: how the caller spells it, the CLI's flag or the API's parameter)."""
    if out.is_symlink():  # replacing it would move the link, and writing into it would write elsewhere
        raise UsageError(f"{out} is a symbolic link; give the folder it points to, or another folder")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} already exists and is not empty; give another folder, or {force_flag} to replace it")


def _stale_pattern(out: Path) -> re.Pattern:
    """The temp and set-aside folders `folder_written_whole` makes beside `out` (and mkdtemp's names of
    older versions): `.NAME.<random>.tmp` and `.NAME.<random>.old`, the random part free of dots, so
    another folder's (`NAME.x`) never match."""
    return re.compile(rf"\.{re.escape(out.name)}\.[a-z0-9_]{{8,12}}\.(tmp|old)")


def remove_stale_folders(out: Path) -> list[Path]:
    """Remove what a killed `folder_written_whole` left beside `out`; a link among them is removed, never
    followed. Only for a caller that holds the place's lock: another writer's live temp folder matches too."""
    pattern, removed = _stale_pattern(out), []
    if not out.parent.is_dir():
        return removed
    for path in out.parent.iterdir():
        if pattern.fullmatch(path.name):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
            removed.append(path)
    return removed


@contextlib.contextmanager
def folder_written_whole(out: str | Path, force: bool = False, force_flag: str = "--force"):
    """Yield a new hidden temp folder beside `out` to write into. When the block succeeds the temp folder
    is renamed to `out` (an old `out` moved aside first, and removed after); when it fails, it is
    deleted. So `out` is never a half-written folder, whatever stops the block. (No fsync: a power cut
    may leave files cut short, and the command is simply run again.)"""
    out = Path(out)
    check_new_folder(out, force, force_flag)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _, tmp = beside(out, lambda name: os.mkdir(name, 0o700), suffix="")
    except OSError as err:
        raise UsageError(f"cannot write to {out.parent}: {err.strerror or err}") from None
    try:
        yield tmp
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # 0700 while written: nothing can be put in it meanwhile
        _replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_folder(new: Path, out: Path) -> None:
    if not out.exists():
        os.rename(new, out)
        return
    old = new.with_suffix(".old")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(old, out)  # put the previous folder back: nothing is lost
        raise
    shutil.rmtree(old, ignore_errors=True)
