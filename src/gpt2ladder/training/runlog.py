"""What a run shows and leaves: the progress bar and messages, log.jsonl (one line per step, flushed as
written), TensorBoard scalars when tensorboard is installed, and loss.png. Only the main process has
any of them."""

from __future__ import annotations

import json
from pathlib import Path

from gpt2ladder.data.files import open_append, write_atomic
from gpt2ladder.report.plots import loss_curves
from gpt2ladder.report.progress import on_terminal
from gpt2ladder.training.config import TrainConfig


def read_log(path: Path) -> list[dict]:
    """The entries of a log.jsonl; a line cut short by a kill, or damaged, is skipped. A step that measured (validation,
    HellaSwag) carries the run's clock as it stood then (`clock`, the figures of `RunClock.summary`), when a version
    that writes it wrote the line."""
    entries = []
    if not path.is_file():
        return entries
    for line in path.read_bytes().decode("utf-8", "replace").splitlines():  # stray bytes spoil one line, no more
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and _is_int(entry.get("step")) and _is_number(entry.get("loss")) and (
                "val_loss" not in entry or _is_number(entry["val_loss"])) and (
                "clock" not in entry or isinstance(entry["clock"], dict)):  # an older version's has none
            entries.append(entry)
    return entries


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rewrite_log(path: Path, keep_through: int | None) -> None:
    """Start a fresh log, or (resuming) keep the steps up to the checkpoint so none is logged twice."""
    kept = [e for e in read_log(path) if e["step"] <= keep_through] if keep_through is not None else []
    write_atomic(path, "".join(json.dumps(e) + "\n" for e in kept))


class Reporter:
    """What the user sees or reads later: progress bar, messages, log.jsonl, TensorBoard, loss.png.

    Silent in every process but the main one, so side effects sit behind one `is_main`.
    """

    def __init__(self, out: Path, cfg: TrainConfig, *, is_main: bool, progress: bool, start: int,
                 label: str = "train", leave: bool = True):
        self.out, self.cfg, self.enabled = out, cfg, is_main
        self.log = self.bar = self.tb = None
        if not is_main:
            return
        _rewrite_log(out / "log.jsonl", start if start else None)
        self.log = open_append(out / "log.jsonl")
        self.tb = _tensorboard(out / "tb")
        from tqdm.auto import tqdm

        self.bar = tqdm(total=cfg.steps, initial=start, unit="step", desc=label, leave=leave,
                        disable=not (progress and on_terminal()), dynamic_ncols=True)

    def message(self, text: str) -> None:
        if self.enabled:
            self.bar.write(text) if self.bar is not None and not self.bar.disable else print(text, flush=True)

    def step(self, entry: dict) -> None:
        if not self.enabled:
            return
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()  # a killed run keeps every step it logged
        self.bar.set_postfix_str(_postfix(entry), refresh=False)  # shown by the update: this step's, not the last's
        self.bar.update(1)
        if "val_loss" in entry or "hellaswag" in entry:
            self.message(f"step {entry['step']}/{self.cfg.steps}: {_postfix(entry)}{_measured(entry)}")
        if self.tb is not None:
            for key, value in scalars(entry).items():
                self.tb.add_scalar(key, value, entry["step"])

    def plot(self, title: str) -> Path | None:
        """loss.png from the whole log (the steps before a resume included)."""
        if not self.enabled:
            return None
        entries = read_log(self.out / "log.jsonl")
        curves = {"train": ([e["step"] for e in entries], [e["loss"] for e in entries])}
        val = [e for e in entries if "val_loss" in e]
        if val:
            curves["val"] = ([e["step"] for e in val], [e["val_loss"] for e in val])
        return loss_curves(curves, self.out / "loss.png", title)

    def close(self) -> None:
        for thing in (self.bar, self.log, self.tb):
            if thing is not None:
                thing.close()


def scalars(entry: dict) -> dict[str, float]:
    """A log entry's numbers as TensorBoard tags: a nested dict's as "hellaswag/acc" and the like."""
    out = {}
    for key, value in entry.items():
        if isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in scalars(value).items()})
        elif key != "step" and _is_number(value):
            out[key] = value
    return out


def _measured(entry: dict) -> str:
    """What the step measured besides its loss: validation, HellaSwag."""
    text = f", val loss {entry['val_loss']:.4f}" if "val_loss" in entry else ""
    hs = entry.get("hellaswag")
    if hs:
        text += f", HellaSwag acc_norm {hs['acc_norm']:.4f} (acc {hs['acc']:.4f}, {hs['n']:,} examples)"
    return text


def _postfix(entry: dict) -> str:
    mfu_text = "n/a" if entry.get("mfu") is None else f"{100 * entry['mfu']:.1f}%"
    return (f"loss {entry['loss']:.4f}, {entry['ms']:.0f} ms/step, {entry['tokens_per_s']:,.0f} tok/s, "
            f"MFU {mfu_text}")


def _tensorboard(path: Path):
    """A SummaryWriter when the optional tensorboard package is installed, else None."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(path))
    except Exception:  # a broken tensorboard install must not stop training
        return None
