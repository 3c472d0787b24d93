"""A model from wherever a command is given one: a run directory or checkpoint file (the newest good
checkpoint), a Hugging Face folder or weights file, or a hub name. `sample`, `eval`, `export` and the
Python API all load through `load_model`, so each accepts the same things and says the same things
when it cannot.

Which is which, in order: a run directory (one holding ckpt.pt or ckpt.prev.pt) or a file that is not
Hugging Face weights is a run's checkpoint; a folder or file of Hugging Face weights comes next; a
name that is no path here is a hub name (`model/hub.py`), found in the Hugging Face cache or downloaded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder.model.gpt import GPT
from gpt2ladder.model.hf import WHAT_LOADS, is_hf_weights, load_hf_model, local_path, weights_file
from gpt2ladder.model.hub import is_hub_name, repo_id
from gpt2ladder.training.checkpoint import (
    FILENAME,
    PREVIOUS,
    SAMPLE_KEYS,
    NoCheckpoint,
    kept_none,
    last_good,
    model_from_checkpoint,
)

KEPT_KEYS = ("model", "step", "train_config", "model_config", "setup", "data_source", "val_loss", "best")


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model in eval mode and what it came from."""

    model: GPT
    kind: str  # "run", "hf" (a local Hugging Face folder or file) or "hub"
    source: str  # what was asked for, as given
    path: Path  # the checkpoint file, or the file naming the Hugging Face weights
    setup: dict  # how the run trained (its precision); {} for Hugging Face weights, which are fp32
    state: dict | None = None  # the run's checkpoint without its optimizer state; None for Hugging Face weights

    @property
    def description(self) -> str:
        """Where the weights came from, for a banner: the checkpoint and its step, or the weights file."""
        if self.kind == "run":
            return f"{self.path} (step {self.state.get('step')})"
        if self.kind == "hub":
            return f"{repo_id(self.source)} ({self.path})"
        return str(self.path)

    @property
    def step(self) -> int | None:
        return int(self.state["step"]) if self.state and isinstance(self.state.get("step"), int) else None


def load_model(source: str | Path, device: torch.device, notify=None) -> LoadedModel:
    """The model `source` names, on `device`, in eval mode; one line (UsageError or LadderError) when it
    names nothing loadable. `notify` (default: stderr) hears notices, such as a fallback to ckpt.prev.pt."""
    notify = notify or _stderr
    text = str(source)
    path = Path(text).expanduser()
    if _is_run(path) or (path.is_file() and not is_hf_weights(path)):
        return _from_run(path, text, device, notify)
    if is_hf_weights(path):
        return _from_hf(path, "hf", text, device)
    if path.is_dir():
        if why := kept_none(path):
            raise NoCheckpoint(f"no checkpoint at {path / FILENAME}{why}")
        raise NoCheckpoint(f"no checkpoint at {path / FILENAME}, nor Hugging Face weights in {path}; give a run "
                           f"directory, its ckpt.pt, or {WHAT_LOADS}")
    check_source(text)
    return _from_hf(local_path(text), "hub", text, device)


def check_source(source: str | Path) -> None:
    """One line (NoCheckpoint) when `source` is a local path that does not exist: what a command checks
    before it reads anything else. A hub name passes (`model/hub.py` says what counts as one)."""
    text = str(source)
    path = Path(text).expanduser()
    if not path.exists() and not is_hub_name(text):
        raise NoCheckpoint(f"no checkpoint at {text}: no such file or folder (a model is a run directory, a "
                           "checkpoint, Hugging Face weights or a hub name)")


def is_run(source: str | Path) -> bool:
    """Whether `source` is a run directory or a checkpoint file (not Hugging Face weights)."""
    path = Path(source).expanduser()
    return _is_run(path) or (path.is_file() and not is_hf_weights(path))


def _is_run(path: Path) -> bool:
    return path.is_dir() and ((path / FILENAME).is_file() or (path / PREVIOUS).is_file())


def _from_run(path: Path, source: str, device: torch.device, notify) -> LoadedModel:
    state, ckpt = last_good(path, notify=notify, needs=SAMPLE_KEYS)
    model = model_from_checkpoint(state, device, ckpt)
    kept = {k: state[k] for k in KEPT_KEYS if k in state}  # the optimizer state is twice the model's size
    return LoadedModel(model, "run", source, ckpt, state.get("setup") or {}, kept)


def _from_hf(path: Path, kind: str, source: str, device: torch.device) -> LoadedModel:
    entry = weights_file(path)
    return LoadedModel(load_hf_model(entry).to(device), kind, source, entry, {})


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
