"""Checkpoints that survive crashes: atomic writes, a checksum, one-line errors, and the RNG states.

A checkpoint is one `torch.save` file holding plain dicts and tensors only, so it loads with
`torch.load(weights_only=True)`. It is written to a temp file beside the target, flushed and fsynced;
then the old checkpoint is renamed to ckpt.prev.pt and the temp file to ckpt.pt. A kill -9, a full
disk or a power cut at any moment leaves a whole checkpoint: ckpt.pt, or between the two renames
ckpt.prev.pt, which `last_good` then picks. A sha256 over every value catches bit rot that torch.load
misses (it reads a flipped byte inside a tensor without complaint); a damaged ckpt.pt also falls back
to ckpt.prev.pt. best.pt, the weights with the lowest validation loss, holds no optimizer, data or RNG
state (a third of a full checkpoint's size): it samples and exports, and `last_good` never picks it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import random
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

from gpt2ladder.data.files import new_temp
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model import family
from gpt2ladder.model.gpt import GPT
from gpt2ladder.model.hf import first_non_finite
from gpt2ladder.training.config import settings_problem

FORMAT = "gpt2ladder-checkpoint"
VERSION = 1
FILENAME = "ckpt.pt"  # the newest good checkpoint: what --resume and sample use
PREVIOUS = "ckpt.prev.pt"  # the one before it, kept until ckpt.pt is replaced by a newer good one
BEST = "best.pt"  # the weights with the lowest validation loss so far (no optimizer state: never resumed)
# What each use of a checkpoint reads; a file with a valid sha256 may still lack them (another tool wrote it).
RESUME_KEYS = ("model", "optimizer", "step", "train_config", "model_config", "rng", "data")
SAMPLE_KEYS = ("model", "model_config")
NONE = type(None)
# The type of each field a checkpoint holds when present: any other means another tool wrote the file,
# refused in one line by `load_checkpoint` rather than failing deep inside whatever reads the field.
FIELDS = {"model": dict, "optimizer": dict, "step": int, "train_config": dict, "model_config": dict, "rng": dict,
          "data": dict, "setup": dict, "data_source": dict, "best": (dict, NONE), "val_loss": (int, float, NONE),
          "scaler": (dict, NONE), "reached": (dict, NONE), "pending": (dict, NONE)}


class NoCheckpoint(UsageError):
    """There is no checkpoint file where one was named."""


class CheckpointDamaged(LadderError):
    """The file is truncated, unreadable or fails its sha256: an older copy may stand in for it."""


class NotACheckpoint(UsageError):
    """A file named as a checkpoint that holds something else (another program's file, another format)."""


def checkpoint_path(path: str | Path) -> Path:
    """A checkpoint file, or the ckpt.pt inside a run directory."""
    path = Path(path).expanduser()
    return path / FILENAME if path.is_dir() else path


# --- integrity ----------------------------------------------------------------------------------


def state_digest(state) -> str:
    """sha256 over every key, value, dtype, shape and tensor byte, in a fixed order."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def _feed(h, value) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(value.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        h.update(b"D%d" % len(value))
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(b"L%d" % len(value))
        for v in value:
            _feed(h, v)
    else:  # int, float, str, bool, None: repr is exact for each
        h.update(repr(value).encode())


# --- save ---------------------------------------------------------------------------------------


def save_checkpoint(path: str | Path, state: dict, previous: Path | None = None) -> Path:
    """Write state atomically; on failure the previous file is untouched and the temp file removed.

    With `previous`, the file at `path` is renamed there first, once the new one is safely on disk. The
    temp file is new under a random name (`data/files.py`), so no link planted in the run is written through.
    """
    path = Path(path)
    payload = {**state, "format": FORMAT, "version": VERSION}
    payload.pop("sha256", None)
    payload["sha256"] = state_digest(payload)
    writer, tmp = None, None
    try:
        fd, tmp = new_temp(path)
        with os.fdopen(fd, "wb") as f:
            writer = _RecordingWriter(f)
            torch.save(payload, writer)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them the checkpoint
        if previous is not None and path.exists():
            os.replace(path, previous)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        _raise_save_failure(err, writer, path)
    return path


class _RecordingWriter:
    """The file torch.save writes into, remembering what a write raised: torch's zip writer reports any
    failed write as "unexpected pos N vs M", which hides a full disk (ENOSPC) or a second Ctrl-C."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except BaseException as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.f.flush()


def _raise_save_failure(err: BaseException, writer: _RecordingWriter | None, path: Path):
    """The failure's real cause: the OSError or KeyboardInterrupt behind torch's RuntimeError, re-raised as
    itself (Ctrl-C stays Ctrl-C) or as one line naming the reason."""
    cause = writer.error if isinstance(err, RuntimeError) and writer and writer.error else err
    if not isinstance(cause, (OSError, RuntimeError)):
        raise cause
    reason = getattr(cause, "strerror", None) or _first_line(cause)
    if "unexpected pos" in reason and _disk_full(path.parent):  # a write failure torch alone saw
        reason = os.strerror(errno.ENOSPC)
    raise LadderError(f"could not write checkpoint {path}: {reason}; "
                      "the previous checkpoint (if any) is kept") from err


def _disk_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free == 0
    except OSError:
        return False




def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); not possible, nor needed, on Windows."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale_temps(path: str | Path) -> None:
    """Temp files of saves that a kill -9 interrupted (a link among them is removed, not followed); the
    checkpoint itself is never among them."""
    path = Path(path)
    for tmp in path.parent.glob(f".{path.name}.*.tmp*"):
        with contextlib.suppress(OSError):
            tmp.unlink()


# --- load ---------------------------------------------------------------------------------------


def kept_none(folder: Path) -> str:
    """Why a run's folder holds no checkpoint, where its config.json says it saved none at its end (a race's run,
    raced without --keep-weights); else nothing."""
    try:
        saves = json.loads((folder / "config.json").read_text())["train_config"].get("save_at_end", True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    return "" if saves is not False else ": this run kept no weights (a race's run; race --keep-weights keeps them)"


def _starts_as_torch(path: Path) -> bool:
    """Whether a file begins as torch.save writes one (a zip archive, PK; a pickle of the old format, 0x80), or is
    empty or zeroed as a crash leaves one: damage, not another kind of file."""
    with open(path, "rb") as f:
        head = f.read(4)
    return not head.strip(b"\0") or head.startswith((b"PK\x03\x04", b"\x80"))


def foreign_archive(path: Path) -> bool:
    """Whether `path` is a whole zip archive that torch.save did not write (no `data.pkl` member, which every
    torch.save archive holds): another kind of file named by mistake, not a damaged checkpoint."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False  # not a zip, or a cut one: damage where it begins as torch.save's
    return not any(name == "data.pkl" or name.endswith("/data.pkl") for name in names)


def _damage(path: Path) -> str:
    """Why a file that begins as torch.save's does not load, in a few words of ours: torch's own message for a
    cut archive is a paragraph of miniz's advice, and cut to a line it stops mid-sentence."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head.strip(b"\0"):
        return "empty or zeroed, as a crash can leave a file"
    try:
        with zipfile.ZipFile(path) as archive:
            whole = archive.testzip() is None  # every member's CRC: only on this path, where loading failed
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        whole = False
    if not whole:
        return "not a whole torch.save archive: truncated or corrupted"
    return "torch.load cannot read what the archive holds: corrupted, or not written by gpt2ladder"


def load_checkpoint(path: str | Path, map_location="cpu", needs: tuple[str, ...] = ()) -> dict:
    """A verified checkpoint dict holding the keys `needs`, or one line saying why the file cannot be one."""
    path = checkpoint_path(path)
    if not path.is_file():
        raise NoCheckpoint(f"no checkpoint at {path}{kept_none(path.parent)}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for truncated or foreign files
        if not _starts_as_torch(path):  # another kind of file named: a mistake, not damage
            raise NotACheckpoint(f"{path} is not a PyTorch file, so no gpt2ladder checkpoint; give a run "
                                 "directory or its ckpt.pt") from None
        if foreign_archive(path):
            raise NotACheckpoint(f"{path} is a zip archive that torch.save did not write, so no gpt2ladder "
                                 "checkpoint; give a run directory or its ckpt.pt") from None
        raise CheckpointDamaged(f"checkpoint {path} is unreadable ({_damage(path)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise NotACheckpoint(f"{path} is not a gpt2ladder checkpoint")
    if state.get("version") != VERSION:
        raise LadderError(f"checkpoint {path} has format version {state.get('version')}; "
                          f"this gpt2ladder reads version {VERSION}")
    expected = state.pop("sha256", None)
    if expected is not None and state_digest(state) != expected:
        raise CheckpointDamaged(f"checkpoint {path} is corrupt: its contents do not match their sha256")
    missing = [k for k in needs if not isinstance(state.get(k), int if k == "step" else dict)]
    if missing:
        raise LadderError(f"checkpoint {path} lacks {', '.join(missing)} (or holds them in another form); "
                          "it was not written by this gpt2ladder")
    odd = [k for k, kind in FIELDS.items() if k in state and not _is(state[k], kind)] + _odd_inside(state)
    if odd:
        raise LadderError(f"checkpoint {path} holds {', '.join(odd)} in another form than gpt2ladder writes; "
                          "it was not written by this gpt2ladder")
    problem = _settings_problem(state, check_settings="train_config" in needs)
    if problem:  # a valid hash over values no run writes: refused here, before a division or a loop uses them
        raise LadderError(f"checkpoint {path} holds {problem}: damaged or made by hand, not written by a "
                          "gpt2ladder run")
    return state


def _settings_problem(state: dict, check_settings: bool) -> str | None:
    """The first value a run could not have saved: a negative step, a best that is no loss and, with
    `check_settings` (a reader that trains on them: --resume), settings a flag would refuse (checked against
    the checkpoint's own shape, when it has one). Readers of the weights alone pass over odd settings."""
    step, best = state.get("step"), state.get("best")
    if isinstance(step, int) and step < 0:
        return f"step {step}"
    if isinstance(best, dict) and _is(best.get("step"), int) and _is(best.get("val_loss"), (int, float)) \
            and not (best["step"] >= 0 and math.isfinite(best["val_loss"])):
        return f"best {best}"
    settings = state.get("train_config")
    if not check_settings or not isinstance(settings, dict):
        return None
    try:
        shape = ModelConfig(**state["model_config"])
    except (KeyError, TypeError, ValueError, UsageError):  # reported where the model is built
        return None
    return settings_problem(settings, shape)


def _is(value, kind) -> bool:
    return isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)


def _odd_inside(state: dict) -> list[str]:
    """The fields inside `best` and `data_source` that a reader formats or compares, when of another type."""
    odd = []
    for field, inner in (("best", {"step": int, "val_loss": (int, float)}), ("data_source", {"sha256": (str, NONE)})):
        value = state.get(field)
        if isinstance(value, dict):
            odd += [f"{field}.{k}" for k, kind in inner.items() if not _is(value.get(k), kind)]
    return odd


def last_good(path: str | Path, notify=print, set_aside: bool = False,
              needs: tuple[str, ...] = ()) -> tuple[dict, Path]:
    """The checkpoint a file names, or a run directory's newest one that loads, and its path.

    In a directory that is ckpt.pt, else ckpt.prev.pt: when ckpt.pt is missing (a save stopped between
    its two renames) or damaged. `set_aside` renames a damaged ckpt.pt to ckpt.pt.damaged, so the next
    save does not rotate it over the good ckpt.prev.pt.
    """
    path = Path(path).expanduser()
    main, previous = checkpoint_path(path), path / PREVIOUS
    try:
        return load_checkpoint(main, needs=needs), main
    except (NoCheckpoint, CheckpointDamaged) as err:
        if not (path.is_dir() and previous.is_file()):
            raise
        state = load_checkpoint(previous, needs=needs)
        if set_aside and main.exists():
            os.replace(main, main.with_name(main.name + ".damaged"))
        notify(f"notice: {err}; using the checkpoint before it, {previous} (step {state.get('step')})"
               + (f"; the damaged file is now {main.name}.damaged" if set_aside and isinstance(err, CheckpointDamaged)
                  else ""))
        return state, previous


def model_from_checkpoint(state: dict, device: torch.device, source: str | Path = "the checkpoint") -> GPT:
    """A GPT of the checkpoint's own shape (padding and attention included), its weights loaded, in eval mode."""
    try:
        cfg = ModelConfig(**state["model_config"])
        _check_sizes(cfg, state["model"])  # before a GPT of that size is allocated
        model = family.build(cfg)
        model.load_state_dict(state["model"])
    except (TypeError, ValueError, KeyError, RuntimeError, UsageError) as err:  # a shape or field GPT lacks
        raise LadderError(f"{source} does not hold a GPT that gpt2ladder can build: {type(err).__name__}: "
                          f"{_first_line(err)}") from None
    bad = first_non_finite(model)
    if bad:  # training never saves such weights
        raise LadderError(f"{source} holds non-finite weights (NaN or inf, first in {bad}): it was not written "
                          "by a healthy run")
    return model.to(device).eval()


def _check_sizes(cfg: ModelConfig, tensors: dict) -> None:
    """ValueError unless the sizes that decide a GPT's memory (layers, width, vocabulary rows, positions)
    are those of the tensors: a model_config of 10,000 layers beside the tensors of 2 is never built."""
    wte, wpe = tensors.get("transformer.wte.weight"), tensors.get("transformer.wpe.weight")
    layers = {k.split(".")[2] for k in tensors if isinstance(k, str) and k.startswith("transformer.h.")}
    sizes = {"n_layer": (cfg.n_layer, len(layers)),
             "vocabulary rows x n_embd": ((cfg.padded_vocab_size, cfg.n_embd), _shape(wte)),
             "block_size x n_embd": (None if cfg.has("rope") else (cfg.block_size, cfg.n_embd), _shape(wpe))}
    wrong = [f"{name} {said} in model_config, {held} in the tensors" for name, (said, held) in sizes.items()
             if said != held]
    if wrong:
        raise ValueError("; ".join(wrong))


def _shape(tensor) -> tuple | None:
    return tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    first = text[0] if text else type(err).__name__
    if first.startswith("Weights only load failed"):  # torch's advice to unpickle arbitrary code: not ours
        return ""
    return first[:200]


def config_differences(saved: dict, requested: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """`name saved -> requested` for every field that differs, in the requested dict's order."""
    return [f"{k} {saved.get(k)!r} -> {v!r}" for k, v in requested.items()
            if k not in ignore and saved.get(k) != v]


# --- random number generators -------------------------------------------------------------------


def rng_state() -> dict:
    """torch (CPU and every CUDA device), numpy and Python RNG states, as weights_only-loadable values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    npy = state["numpy"]
    np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
