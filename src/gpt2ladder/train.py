"""`gpt2ladder train`: train GPT-2 at the fastest setting this machine allows, and resume exactly.

A run directory holds config.json, log.jsonl (one line per step, flushed as written), ckpt.pt (one
checkpoint, replaced atomically), loss.png and, when tensorboard is installed, tb/. A run killed at
any moment (even kill -9) and resumed with --resume logs the same per-step losses as one never
interrupted: batch i is a function of (seed, i), the learning rate a function of the step, and the
checkpoint holds weights, optimizer, data position and RNG states.

Exit codes: 0 when done; 130 after Ctrl-C (SIGINT) and 143 after SIGTERM, both of which finish the
step in flight and save a checkpoint first; 1 or 2 with a one-line error otherwise.

Data parallel under torchrun (`torchrun --nproc_per_node=N -m gpt2ladder train ...`): the process's
place is a `distributed.Dist` (rank, world size, and a `mean` that all-reduces), the model is wrapped by DDP
or sharded by FSDP2 (`--strategy`), batches are split by rank, losses are averaged over ranks, and every
side effect a user sees (printing, log, plots, TensorBoard, checkpoint files) happens only where
`is_main`. --tokens-per-step is global; by default it is micro-batch x seq len x processes. The
checkpoint holds the full, unwrapped state (FSDP2 gathers it to rank 0), so a run resumes on any
number of processes (the same --tokens-per-step gives the same curve).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder import distributed
from gpt2ladder.checkpoint import (FILENAME, config_differences, load_checkpoint, remove_stale_temps,
                                   rng_state, save_checkpoint, set_rng_state)
from gpt2ladder.config import ModelConfig, preset
from gpt2ladder.engine import Engine, OptimConfig, build_model
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.metrics import flops_per_token, mfu, peak_flops
from gpt2ladder.rungs import Setup, setup_for, why_unavailable

# Read by `train_command` only: lets CPU tests run the compile rung with backend "eager" (seconds,
# not minutes). Not a user setting; the default is Inductor, the backend the rung is about.
COMPILE_BACKEND_ENV = "GPT2LADDER_COMPILE_BACKEND"


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "tiny"
    rungs: tuple[str, ...] = ("baseline",)
    batch_size: int = 8  # micro-batch, sequences per forward pass on one device
    seq_len: int = 128
    tokens_per_step: int = 1024  # all devices, all micro-batches: accumulation fills the gap
    steps: int = 200
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 = off
    eval_every: int = 20  # 0 = never (the last step is always validated when this is on)
    eval_batches: int = 20
    ckpt_every: int = 40  # 0 = only at the end and on a signal
    seed: int = 0
    data: str | None = None  # a text file; None = Tiny Shakespeare (never random tokens)
    init_from: str | None = None  # a local Hugging Face GPT-2 model.safetensors
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len", "tokens_per_step", "steps", "eval_batches"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{_flag(name)} must be a positive integer, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "seed"):
            if getattr(self, name) < 0:
                raise UsageError(f"{_flag(name)} must be zero or more, got {getattr(self, name)}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise UsageError(f"{_flag(name)} must be a finite number >= 0, got {getattr(self, name)}")
        if self.lr == 0 or self.min_lr > self.lr:
            raise UsageError(f"need 0 < --min-lr <= --lr, got --lr {self.lr} and --min-lr {self.min_lr}")
        block = self.model_config().block_size
        if self.seq_len > block:
            raise UsageError(f"--seq-len {self.seq_len} exceeds the model's block size of {block}")
        self.grad_accum(1)

    def model_config(self) -> ModelConfig:
        return model_config_for(self.preset, self.init_from)

    def grad_accum(self, world_size: int = 1) -> int:
        """Micro-batches per optimizer step on each device."""
        per_pass = self.batch_size * self.seq_len * world_size
        if self.tokens_per_step % per_pass:
            raise UsageError(f"--tokens-per-step {self.tokens_per_step} is not a multiple of batch size x "
                             f"seq len x processes = {self.batch_size} x {self.seq_len} x {world_size} = {per_pass}")
        return self.tokens_per_step // per_pass

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def model_config_for(preset_name: str, init_from: str | None) -> ModelConfig:
    """The shapes: from config.json beside --init-from weights when there is one, else the preset."""
    if init_from:
        from gpt2ladder.hf import hf_model_config

        cfg = hf_model_config(init_from)
        if cfg is not None:
            return cfg
    return preset(preset_name)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up to lr, then cosine to min_lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= cfg.steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


# --- the run directory: log, TensorBoard, progress (main process only) ---------------------------


def read_log(path: Path) -> list[dict]:
    """The entries of a log.jsonl; a line cut short by a kill is skipped."""
    entries = []
    if not path.is_file():
        return entries
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("step"), int):
            entries.append(entry)
    return entries


def _rewrite_log(path: Path, keep_through: int | None) -> None:
    """Start a fresh log, or (resuming) keep the steps up to the checkpoint so none is logged twice."""
    kept = [e for e in read_log(path) if e["step"] <= keep_through] if keep_through is not None else []
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(e) + "\n" for e in kept))
    os.replace(tmp, path)


class Reporter:
    """What the user sees or reads later: progress bar, messages, log.jsonl, TensorBoard, loss.png.

    Silent in every process but the main one, so side effects sit behind one `is_main`.
    """

    def __init__(self, out: Path, cfg: TrainConfig, *, is_main: bool, progress: bool, start: int):
        self.out, self.cfg, self.enabled = out, cfg, is_main
        self.log = self.bar = self.tb = None
        if not is_main:
            return
        _rewrite_log(out / "log.jsonl", start if start else None)
        self.log = open(out / "log.jsonl", "a")
        self.tb = _tensorboard(out / "tb")
        from tqdm.auto import tqdm

        self.bar = tqdm(total=cfg.steps, initial=start, unit="step", desc="train", disable=not progress,
                        dynamic_ncols=True)

    def message(self, text: str) -> None:
        if self.enabled:
            self.bar.write(text) if self.bar is not None and not self.bar.disable else print(text, flush=True)

    def step(self, entry: dict) -> None:
        if not self.enabled:
            return
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()  # a killed run keeps every step it logged
        self.bar.update(1)
        self.bar.set_postfix_str(_postfix(entry), refresh=False)
        if "val_loss" in entry:
            self.message(f"step {entry['step']}/{self.cfg.steps}: {_postfix(entry)}, val loss {entry['val_loss']:.4f}")
        if self.tb is not None:
            for key, value in entry.items():
                if key != "step" and value is not None:
                    self.tb.add_scalar(key, value, entry["step"])

    def plot(self, title: str) -> Path | None:
        """loss.png from the whole log (the steps before a resume included)."""
        if not self.enabled:
            return None
        from gpt2ladder.plots import loss_curves

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


# --- signals ------------------------------------------------------------------------------------


class StopSignals:
    """Ctrl-C and SIGTERM ask the loop to stop after the step in flight; a second Ctrl-C stops at once.

    The previous handlers are restored on exit. Outside the main thread (where Python allows no
    handlers) this does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# --- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult:
    exit_code: int  # 0 done, 128 + signal number when stopped by a signal
    step: int
    loss: float | None
    val_loss: float | None
    out: Path


def build_engine(cfg: TrainConfig, setup: Setup, device: torch.device, parallelize=None) -> Engine:
    """The model (from the seed, or from real GPT-2 weights) with its optimizer, for this setup.

    `parallelize` (DDP or FSDP2, from `distributed.py`) runs after the weights are in, before the optimizer.
    """
    model_cfg = cfg.model_config()
    model = None
    if cfg.init_from:
        from gpt2ladder.hf import load_hf_gpt2

        model = build_model(model_cfg, setup, device, cfg.seed)
        load_hf_gpt2(cfg.init_from, model)
    optim = OptimConfig(lr=cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip)
    return Engine(model_cfg, setup, device, seed=cfg.seed, optim=optim,
                  compile_backend=cfg.compile_backend, model=model, parallelize=parallelize)


def weights_finite(model: torch.nn.Module, ranks=distributed.SINGLE) -> bool:
    """One host sync for all parameters; under FSDP2 each rank checks its shard and all must agree."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    finite = torch.stack([torch.isfinite(t).all() for t in local]).all().float()
    return bool(ranks.mean(finite) == 1)


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """`load_state_dict`, but each group's learning rate keeps the type it had here.

    The CUDA-graph rung uses a device tensor as lr (a replayed graph reads it in place); a saved one
    would come back as a CPU tensor (or a float from a run without that rung) and break the capture.
    """
    before = [group["lr"] for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, lr in zip(optimizer.param_groups, before):
        value = float(group["lr"])
        if isinstance(lr, torch.Tensor):
            lr.fill_(value)
            group["lr"] = lr
        else:
            group["lr"] = value


class Trainer:
    """The loop's state: engine, batches, step; `run` trains to cfg.steps or until a signal."""

    def __init__(self, cfg: TrainConfig, device: torch.device, out: Path, ranks=distributed.SINGLE,
                 strategy: str | None = None):
        self.cfg, self.device, self.out, self.ranks = cfg, device, out, ranks
        self.strategy = strategy  # "ddp" or "fsdp" under torchrun (ranks is then a distributed.Dist)
        self.accum = cfg.grad_accum(ranks.world_size)
        self.tokens = data_mod.load_tokens(cfg.data)  # DataUnavailable: no random stand-in for training
        self.setup = setup_for(list(cfg.rungs))
        parallelize = (functools.partial(distributed.wrap_for_data_parallel, dist=ranks, strategy=strategy)
                       if strategy else None)
        self.engine = build_engine(cfg, self.setup, device, parallelize)
        self.batches = data_mod.Batches(self.tokens.train, cfg.tokens_per_step // cfg.seq_len, cfg.seq_len,
                                        seed=cfg.seed, rank=ranks.rank, world_size=ranks.world_size)
        self.val = (data_mod.eval_batches(self.tokens.val, cfg.batch_size, cfg.seq_len, cfg.eval_batches)
                    if cfg.eval_every else [])
        self.ckpt_path = out / FILENAME
        self.step = 0
        self.saved_step: int | None = None  # the step the checkpoint on disk holds
        raw = self.engine.raw_model
        self.flops_per_token = flops_per_token(raw.config, cfg.seq_len, raw.num_params())
        from gpt2ladder.hardware import detect

        self.peak = peak_flops(detect(device).name)
        self.step_ms: list[float] = []  # this session's steps
        self.last_loss: float | None = None
        self.last_val_loss: float | None = None

    # checkpoints

    def state(self) -> dict:
        """The checkpoint's contents. Under FSDP2 a collective: every rank calls it, rank 0 gets the state."""
        e = self.engine
        return {
            "model": distributed.model_state(e.raw_model),
            "optimizer": distributed.optimizer_state(e.raw_model, e.optimizer),
            "scaler": e.scaler.state_dict() if e.scaler else None, "step": self.step,
            "train_config": self.cfg.to_dict(), "model_config": e.raw_model.config.to_dict(),
            "setup": self.setup.to_dict(), "rng": rng_state(), "data": self.batches.state_dict(),
            "data_source": {"source": self.tokens.source, "sha256": self.tokens.sha256},
        }

    def save(self) -> None:
        """Checkpoint the current step, unless the weights went non-finite (the last good one stays)."""
        if not weights_finite(self.engine.raw_model, self.ranks):
            raise LadderError(f"the weights became non-finite at step {self.step}; stopped without saving "
                              f"them ({self._kept()}); try a lower --lr")
        state = self.state()  # every rank: under FSDP2 gathering the full state is a collective
        if self.ranks.is_main:
            save_checkpoint(self.ckpt_path, state)
        self.saved_step = self.step

    def _kept(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"{self.ckpt_path} still holds step {self.saved_step}"

    def resume(self) -> list[str]:
        """Load OUT/ckpt.pt into this run; returns the train-config fields that differ from the saved."""
        state = load_checkpoint(self.ckpt_path)
        raw = self.engine.raw_model
        # attention ("manual" or "sdpa") changes no tensor, so a run may resume on another kernel
        diffs = config_differences(state["model_config"], raw.config.to_dict(), ignore=("attention",))
        if diffs:
            raise UsageError(f"--resume: {self.ckpt_path} holds another model than requested "
                             f"({'; '.join(diffs)}); use the run's --preset and --rungs, or another --out")
        if distributed.is_sharded(raw):  # every rank keeps its shard of the full tensors
            distributed.load_state(raw, self.engine.optimizer, state["model"], state["optimizer"])
        else:
            raw.load_state_dict(state["model"])
            load_optimizer_state(self.engine.optimizer, state["optimizer"])
        if self.engine.scaler and state.get("scaler"):
            self.engine.scaler.load_state_dict(state["scaler"])
        self.batches.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        self.step = self.saved_step = int(state["step"])
        return config_differences(state["train_config"], self.cfg.to_dict())

    # steps

    def train_step(self) -> dict:
        """One optimizer step over tokens_per_step tokens; the clock covers data, step and the loss sync."""
        cfg = self.cfg
        t0 = time.perf_counter()
        x, y = self.batches.next()  # (accum * B, T) rows of this rank
        shape = (self.accum, cfg.batch_size, cfg.seq_len)
        x, y = data_mod.to_device(x.view(shape), y.view(shape), self.device)
        lr = lr_at(self.step, cfg)
        self.engine.set_lr(lr)
        loss = float(self.ranks.mean(self.engine.step(x, y)))  # the host sync that ends the step
        ms = (time.perf_counter() - t0) * 1000
        self.step += 1
        if not math.isfinite(loss):
            raise LadderError(f"the loss became {loss} at step {self.step}; stopped without saving "
                              f"({self._kept()}); try a lower --lr")
        self.step_ms.append(ms)
        tokens_per_s = cfg.tokens_per_step / (ms / 1000)  # all processes together
        entry = {"step": self.step, "loss": loss, "lr": lr, "ms": round(ms, 3),
                 "tokens_per_s": round(tokens_per_s, 1),
                 "mfu": mfu(tokens_per_s / self.ranks.world_size, self.flops_per_token, self.peak)}
        if self.ranks.world_size > 1:
            entry["tokens_per_s_per_gpu"] = round(tokens_per_s / self.ranks.world_size, 1)
        return entry

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss on the fixed batches, through the same (maybe compiled) forward."""
        model = self.engine.model
        model.eval()
        try:
            total = torch.zeros((), device=self.device)
            with self.engine.precision():
                for x, y in self.val:
                    total += self.engine.loss(*data_mod.to_device(x, y, self.device)).float()
            loss = float(self.ranks.mean(total)) / len(self.val)
        finally:
            model.train()
        if not math.isfinite(loss):  # weights that are finite but huge: do not checkpoint them
            raise LadderError(f"the validation loss became {loss} at step {self.step}; stopped without "
                              f"saving ({self._kept()}); try a lower --lr")
        return loss

    def _due(self, every: int) -> bool:
        return bool(every) and (self.step % every == 0 or self.step == self.cfg.steps)

    def _stop_agreed(self, stop: StopSignals) -> bool:
        """Whether to stop after this step. Under torchrun every rank stops after the same step (a signal
        seen by any rank counts for all): saving is a collective, and a rank that ran on would hang."""
        asked = stop.signum is not None
        if self.ranks.world_size == 1:
            return asked
        return bool(self.ranks.mean(torch.tensor(float(asked))) > 0)

    def run(self, stop: StopSignals, report: Reporter) -> int:
        """Train until cfg.steps or a signal; 0, or 128 + the signal's number."""
        while self.step < self.cfg.steps:
            entry = self.train_step()
            self.last_loss = entry["loss"]
            if self._due(self.cfg.eval_every):
                entry["val_loss"] = self.last_val_loss = self.evaluate()
            report.step(entry)  # logged before the checkpoint, so the log always reaches its step
            stopping = self._stop_agreed(stop)
            if self._due(self.cfg.ckpt_every) or stopping:
                self.save()
            if stopping:
                return 128 + (stop.signum or signal.SIGTERM)
        if self.saved_step != self.step:
            self.save()
        return 0


def run_training(cfg: TrainConfig, device: torch.device, out: Path, *, resume: bool = False,
                 progress: bool = True, ranks=distributed.SINGLE, strategy: str | None = None) -> TrainResult:
    """Train (or continue) the run in `out`; every user-visible side effect happens on the main rank."""
    ckpt = out / FILENAME
    if not resume and ckpt.exists():
        raise UsageError(f"{out} already holds a checkpoint; pass --resume to continue it, or another --out")
    trainer = Trainer(cfg, device, out, ranks, strategy)
    changed = trainer.resume() if resume else []  # fails before the log or checkpoint is touched
    if ranks.is_main:
        from gpt2ladder.report import prepare_out_dir

        prepare_out_dir(out)
        remove_stale_temps(ckpt)
        _write_config(out, trainer, ranks)
    report = Reporter(out, cfg, is_main=ranks.is_main, progress=progress, start=trainer.step)
    try:
        _announce(report, trainer, changed, resume)
        with StopSignals() as stop:
            code = trainer.run(stop, report)
        report.plot(f"{cfg.preset} on {trainer.tokens.source}, {cfg.tokens_per_step:,} tokens/step")
    finally:
        report.close()
    return _finish(report, trainer, code, stop.signum)


def _write_config(out: Path, trainer: Trainer, ranks) -> None:
    from gpt2ladder.hardware import detect
    from gpt2ladder.report import record_header, write_json

    record = {**record_header(detect(trainer.device), trainer.device), "command": "train",
              "train_config": trainer.cfg.to_dict(), "model": trainer.engine.raw_model.config.to_dict(),
              "setup": trainer.setup.to_dict(), "world_size": ranks.world_size, "strategy": trainer.strategy,
              "grad_accum": trainer.accum,
              "data": {"source": trainer.tokens.source, "sha256": trainer.tokens.sha256,
                       "n_tokens": trainer.tokens.n_tokens},
              "resumed_from_step": trainer.step or None}
    write_json(out / "config.json", record)


def _announce(report: Reporter, trainer: Trainer, changed: list[str], resume: bool) -> None:
    cfg = trainer.cfg
    n_params = trainer.engine.raw_model.num_params(non_embedding=False)
    report.message(f"gpt2ladder train: {cfg.preset} ({n_params / 1e6:.1f}M parameters) on {trainer.device}, "
                   f"rungs: {', '.join(cfg.rungs)}; {cfg.steps} steps of {cfg.tokens_per_step:,} tokens "
                   f"({cfg.batch_size} x {cfg.seq_len} x {trainer.accum} micro-batches"
                   f"{f' x {trainer.ranks.world_size} processes, {trainer.strategy}' if trainer.strategy else ''}); "
                   f"data: {trainer.tokens.source}")
    if resume:
        report.message(f"resuming from step {trainer.step} of {trainer.ckpt_path}")
    if changed:
        report.message(f"notice: resuming with other settings than the checkpoint's: {'; '.join(changed)}")


def _finish(report: Reporter, trainer: Trainer, code: int, signum: int | None) -> TrainResult:
    loss, val = trainer.last_loss, trainer.last_val_loss
    if signum is not None:
        report.message(f"stopped by {signal.Signals(signum).name} after step {trainer.step}; checkpoint saved "
                       f"to {trainer.ckpt_path}; continue with --resume")
    elif trainer.step_ms:
        timed = trainer.step_ms[1:] or trainer.step_ms  # the first step pays for compilation
        ms = statistics.median(timed)
        report.message(f"done: step {trainer.step}, loss {loss:.4f}"
                       + (f", val loss {val:.4f}" if val is not None else "")
                       + f", {ms:.1f} ms/step, {trainer.cfg.tokens_per_step / ms * 1000:,.0f} tokens/s"
                       + _per_gpu(trainer, ms) + f"; wrote {trainer.out}/log.jsonl, ckpt.pt, loss.png")
    else:
        report.message(f"nothing to do: {trainer.ckpt_path} already holds step {trainer.step} of {trainer.cfg.steps}")
    return TrainResult(code, trainer.step, loss, val, trainer.out)


def _per_gpu(trainer: Trainer, ms: float) -> str:
    """Throughput per process and (on CUDA) this process's peak memory, for multi-GPU and big-model runs."""
    world = trainer.ranks.world_size
    unit = "GPU" if trainer.device.type == "cuda" else "process"
    text = f" ({trainer.cfg.tokens_per_step / ms * 1000 / world:,.0f} per {unit})" if world > 1 else ""
    if trainer.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(trainer.device) / 2**30
        text += f", peak memory {peak:.1f} GiB" + (" per GPU (rank 0's)" if world > 1 else "")
    return text


# --- the command --------------------------------------------------------------------------------


def defaults_for(device: torch.device) -> dict:
    """GPU: GPT-2 124M at B=16 x 1024 for 1000 steps. Elsewhere: the tiny preset, minutes on a laptop."""
    if device.type == "cuda":
        return {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 1000}
    return {"preset": "tiny", "batch_size": 8, "seq_len": 128, "steps": 200}


def usable_rungs(spec: str, caps, notify=print) -> tuple[str, ...]:
    """The requested rungs less those this machine cannot run (each named with its reason)."""
    from gpt2ladder.bench import resolve_rungs

    names = resolve_rungs(spec, caps)
    usable = []
    for name in names:
        reason = why_unavailable(name, caps)
        if reason:
            notify(f"notice: leaving out rung {name}: {reason}")
        else:
            usable.append(name)
    return tuple(usable) or ("baseline",)


def config_from_args(args, device: torch.device, caps, world_size: int = 1, notify=print) -> TrainConfig:
    d = defaults_for(device)
    steps = args.steps or d["steps"]
    batch = args.batch_size or d["batch_size"]
    name = args.preset or d["preset"]
    block = model_config_for(name, args.init_from).block_size
    seq_len = args.seq_len or min(d["seq_len"] or block, block)
    return TrainConfig(
        preset=name, rungs=usable_rungs(args.rungs, caps, notify), batch_size=batch, seq_len=seq_len,
        tokens_per_step=args.tokens_per_step or batch * seq_len * world_size, steps=steps,
        lr=args.lr, min_lr=args.lr / 10 if args.min_lr is None else args.min_lr,
        warmup_steps=int(0.05 * steps) if args.warmup_steps is None else args.warmup_steps,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip,
        eval_every=max(1, steps // 10) if args.eval_every is None else args.eval_every,
        eval_batches=args.eval_batches,
        ckpt_every=max(1, steps // 5) if args.ckpt_every is None else args.ckpt_every,
        seed=args.seed, data=args.data, init_from=args.init_from,
        compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor",
    )


def train_command(args) -> int:
    with distributed.launched(args.device) as dist:  # a plain single process without torchrun
        return _train_command(args, dist)


def _train_command(args, dist: distributed.Dist) -> int:
    from gpt2ladder.hardware import detect
    from gpt2ladder.report import prepare_out_dir

    device = distributed.local_device(dist, args.device)
    notify = print if dist.is_main else (lambda *a, **k: None)
    cfg = config_from_args(args, device, detect(device), dist.world_size, notify)
    strategy = distributed.resolve_strategy(args.strategy, cfg.preset, dist)
    cfg = _rungs_for_strategy(cfg, strategy, notify)
    out = prepare_out_dir(args.out)
    result = run_training(cfg, device, out, resume=args.resume, progress=not args.no_progress, ranks=dist,
                          strategy=strategy)
    return result.exit_code


def _rungs_for_strategy(cfg: TrainConfig, strategy: str | None, notify) -> TrainConfig:
    """Leave out the rungs the data-parallel strategy cannot run (CUDA graphs), saying why."""
    keep = []
    for name in cfg.rungs:
        reason = distributed.rung_problem(name, strategy)
        if reason:
            notify(f"notice: leaving out rung {name}: {reason}")
        else:
            keep.append(name)
    return cfg if len(keep) == len(cfg.rungs) else dataclasses.replace(cfg, rungs=tuple(keep) or ("baseline",))
