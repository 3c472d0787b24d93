"""Results that describe themselves: the header every record carries (versions, device, git SHA, date),
and writing records safely (an output folder checked before any work, atomic JSON)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import torch

from gpt2ladder.errors import UsageError


def record_header(caps, device: torch.device) -> dict:
    from gpt2ladder import __version__

    return {
        "gpt2ladder": __version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "device": {"type": device.type, "name": caps.name, "capability": list(caps.capability),
                   "memory_bytes": caps.total_memory, "count": torch.cuda.device_count() if device.type == "cuda" else 0},
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


def prepare_out_dir(path: str | Path) -> Path:
    """Create the output directory, or fail in one line before any work is done."""
    out = Path(path)
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
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def write_record(out: Path, stem: str, record: dict, markdown, plot) -> list[Path]:
    """STEM.json, STEM.md and STEM.png in `out`, from a record and its Markdown and plot functions."""
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    write_json(paths[0], record)
    paths[1].write_text(markdown(record))
    plot(record, paths[2])
    return paths
