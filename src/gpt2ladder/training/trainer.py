"""Training: train GPT-2 at the fastest setting this machine allows, and resume exactly.

A run directory holds config.json, log.jsonl (one line per step, flushed as written), ckpt.pt (the
newest good checkpoint, replaced atomically), ckpt.prev.pt (the one before it), best.pt (the lowest
validation loss, when validation runs), loss.png and, when tensorboard is installed, tb/. A run
killed at any moment (even kill -9) and resumed with --resume logs the same per-step losses as one
never interrupted: batch i is a function of (seed, i), the learning rate a function of the step, and
the checkpoint holds weights, optimizer, data position and RNG states.

Nothing lost: one process owns the directory (training/lock.py); a checkpoint is written only once
its weights are known good, i.e. finite, with a validation loss (or, at a step without validation, the
loss on one batch) that has not exploded (training/health.py); a run whose loss goes non-finite or
explodes stops naming the step, and the last good checkpoint stays. --resume refuses another text
than the checkpoint's unless --allow-data-change is given.

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

import functools
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.errors import LadderError, UsageError, describe_failure
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.gpt import describe_shape
from gpt2ladder.report.records import prepare_out_dir, record_header, write_json
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.engine import Engine, OptimConfig, build_model
from gpt2ladder.runtime.hardware import detect, free_memory
from gpt2ladder.runtime.memory import HEADROOM, eval_bytes_per_sequence
from gpt2ladder.runtime.metrics import flops_per_token, mfu, peak_flops
from gpt2ladder.runtime.setup import Setup
from gpt2ladder.training import lock
from gpt2ladder.training.checkpoint import (
    BEST,
    FILENAME,
    PREVIOUS,
    RESUME_KEYS,
    config_differences,
    last_good,
    link_or_copy,
    remove_stale_temps,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.health import loss_limit, loss_problem
from gpt2ladder.training.runlog import Reporter
from gpt2ladder.training.schedule import lr_at
from gpt2ladder.training.signals import StopSignals


def _silent(*args, **kwargs) -> None:
    """The notices of ranks other than 0 (every rank finds the same)."""


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
        from gpt2ladder.model.hf import load_hf_gpt2

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
        self.tokens = data_mod.load_tokens(cfg.data, notify=print if ranks.is_main else _silent)  # no random stand-in
        data_mod.check_splits(self.tokens, cfg.seq_len, validate=bool(cfg.eval_every))
        self.setup = setup_for(list(cfg.rungs))
        parallelize = (functools.partial(distributed.wrap_for_data_parallel, dist=ranks, strategy=strategy)
                       if strategy else None)
        self.engine = build_engine(cfg, self.setup, device, parallelize)
        self.batches = data_mod.Batches(self.tokens.train, cfg.tokens_per_step // cfg.seq_len, cfg.seq_len,
                                        seed=cfg.seed, rank=ranks.rank, world_size=ranks.world_size)
        # Validation batches of a whole step's sequences, cut to the micro-batch: the same data on any card
        # and any number of processes (every rank evaluates all of them).
        step_batch = cfg.tokens_per_step // cfg.seq_len
        self.val = (data_mod.micro_batches(data_mod.eval_batches(self.tokens.val, step_batch, cfg.seq_len,
                                                                 cfg.eval_batches), cfg.batch_size)
                    if cfg.eval_every else [])
        self.ckpt_path = out / FILENAME
        self.step = 0
        self.saved_step: int | None = None  # the step the checkpoint on disk holds
        self.kept_path = self.ckpt_path  # where it is (ckpt.prev.pt after resuming from that)
        raw = self.engine.raw_model
        self.flops_per_token = flops_per_token(raw.config, cfg.seq_len, raw.num_params())
        self.peak = peak_flops(detect(device).name)
        self.limit = loss_limit(raw.config.vocab_size)  # above it a loss has exploded
        self.step_ms: list[float] = []  # this session's steps
        self.caps = None  # what validation plans its memory against (run_training sets it)
        self.last_loss: float | None = None
        self.last_val_loss: float | None = None
        self.val_step: int | None = None  # the step last_val_loss was measured at
        self.best: dict | None = None  # {"step", "val_loss"}: the lowest validation loss, kept in best.pt
        self.notices: list[str] = []  # what resuming found, said when the run starts

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
            "val_loss": self.last_val_loss if self.val_step == self.step else None, "best": self.best,
        }

    def save(self) -> None:
        """Checkpoint the current step once its weights are known good; the last good checkpoint stays
        (as ckpt.prev.pt once this one is in place) otherwise."""
        if not weights_finite(self.engine.raw_model, self.ranks):
            raise LadderError(f"the weights became non-finite at step {self.step}; stopped without saving "
                              f"them ({self._kept()}); try a lower --lr")
        if self.val_step != self.step:  # validation has not looked at these weights: one batch does
            self._check_loss("the loss of these weights on one batch", self._mean_loss(self._probe_batch()))
        state = self.state()  # every rank: under FSDP2 gathering the full state is a collective
        if self.ranks.is_main:
            save_checkpoint(self.ckpt_path, state, previous=self.out / PREVIOUS)
        self.saved_step, self.kept_path = self.step, self.ckpt_path

    def save_best(self) -> None:
        """best.pt for this step's new lowest validation loss: ckpt.pt itself when just saved, else a save."""
        if self.saved_step == self.step:
            if self.ranks.is_main:
                link_or_copy(self.ckpt_path, self.out / BEST)
            return
        state = self.state()
        if self.ranks.is_main:
            save_checkpoint(self.out / BEST, state)

    def _kept(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"{self.kept_path} still holds step {self.saved_step}"

    def resume(self, allow_data_change: bool = False) -> list[str]:
        """Load the run's last good checkpoint; returns the train-config fields that differ from the saved."""
        notify = self.notices.append
        state, path = last_good(self.out, notify, set_aside=self.ranks.is_main, needs=RESUME_KEYS)
        raw = self.engine.raw_model
        # attention ("manual" or "sdpa") changes no tensor, so a run may resume on another kernel
        diffs = config_differences(state["model_config"], raw.config.to_dict(), ignore=("attention",))
        if diffs:
            raise UsageError(f"--resume: {path} holds another model than requested "
                             f"({'; '.join(diffs)}); use the run's --preset and --rungs, or another --out")
        data_changed = self._check_data(state, path, allow_data_change)
        try:
            self._load(state)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:  # a valid hash, odd contents
            raise LadderError(f"checkpoint {path} cannot be resumed (damaged, or not written by this gpt2ladder): "
                              f"{describe_failure(err)}") from None
        self.step = self.saved_step = int(state["step"])
        self.kept_path = path
        self.best = None if data_changed else state.get("best")  # a loss on other text is no yardstick
        return config_differences(state["train_config"], self.cfg.to_dict())

    def _load(self, state: dict) -> None:
        raw = self.engine.raw_model
        if distributed.is_sharded(raw):  # every rank keeps its shard of the full tensors
            distributed.load_state(raw, self.engine.optimizer, state["model"], state["optimizer"])
        else:
            raw.load_state_dict(state["model"])
            load_optimizer_state(self.engine.optimizer, state["optimizer"])
        if self.engine.scaler and state.get("scaler"):
            self.engine.scaler.load_state_dict(state["scaler"])
        self.batches.load_state_dict(state["data"])
        set_rng_state(state["rng"])

    def _check_data(self, state: dict, path: Path, allowed: bool) -> bool:
        """Whether the text differs from the checkpoint's; a UsageError unless that is allowed."""
        saved = state.get("data_source") or {}
        if not saved.get("sha256") or saved["sha256"] == self.tokens.sha256:
            return False
        change = (f"{saved.get('source')} (sha256 {saved['sha256'][:12]}...) -> {self.tokens.source} "
                  f"(sha256 {self.tokens.sha256[:12]}...)")
        if not allowed:
            raise UsageError(f"--resume: {path} was trained on another text than this run's ({change}); pass "
                             "--allow-data-change to continue on the new one, or give the run's own --data")
        self.notices.append(f"notice: resuming on another text than the checkpoint's: {change}; "
                            "the best validation loss starts again")
        return True

    # steps

    def train_step(self) -> dict:
        """One optimizer step over tokens_per_step tokens; the clock covers data, step and the loss sync."""
        cfg = self.cfg
        t0 = time.perf_counter()
        x, y = self.batches.next()  # (accum * B, T) rows of this rank
        shape = (self.accum, cfg.batch_size, cfg.seq_len)
        x, y = data_mod.to_device(x.view(shape), y.view(shape), self.device)
        lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
        self.engine.set_lr(lr)
        loss = float(self.ranks.mean(self.engine.step(x, y)))  # the host sync that ends the step
        ms = (time.perf_counter() - t0) * 1000
        self.step += 1
        self._check_loss("the loss", loss)
        self.step_ms.append(ms)
        tokens_per_s = cfg.tokens_per_step / (ms / 1000)  # all processes together
        entry = {"step": self.step, "loss": loss, "lr": lr, "ms": round(ms, 3),
                 "tokens_per_s": round(tokens_per_s, 1),
                 "mfu": mfu(tokens_per_s / self.ranks.world_size, self.flops_per_token, self.peak)}
        if self.ranks.world_size > 1:
            entry["tokens_per_s_per_gpu"] = round(tokens_per_s / self.ranks.world_size, 1)
        return entry

    def evaluate(self) -> float:
        """Mean validation loss on the fixed batches; stops the run if it is not finite or has exploded."""
        self.val = self._val_that_fits()
        loss = self._mean_loss(self.val)
        self._check_loss("the validation loss", loss)  # finite but huge weights: do not checkpoint them
        self.last_val_loss, self.val_step = loss, self.step
        return loss

    @torch.no_grad()
    def _mean_loss(self, batches: list) -> float:
        """Mean loss over batches through the same (maybe compiled) forward, in eval mode, all ranks averaged."""
        model = self.engine.model
        model.eval()
        try:
            total = torch.zeros((), device=self.device)
            with self.engine.precision():
                for x, y in batches:
                    total += self.engine.loss(*data_mod.to_device(x, y, self.device)).float()
            return float(self.ranks.mean(total)) / len(batches)
        finally:
            model.train()

    def _probe_batch(self) -> list:
        """One fixed batch to check weights no validation has seen: the first validation batch, else the
        first micro-batch of the training stream (a pure function of the seed: no state changes)."""
        if self.val:
            return self.val[:1]
        x, y = self.batches.batch(0)
        return [(x[:self.cfg.batch_size], y[:self.cfg.batch_size])]

    def _check_loss(self, what: str, loss: float) -> None:
        problem = loss_problem(loss, self.limit)
        if problem:
            raise LadderError(f"{what} {problem} at step {self.step}; stopped without saving "
                              f"({self._kept()}); try a lower --lr")

    def _improves_best(self, val: float) -> bool:
        if self.best is not None and val >= self.best["val_loss"]:
            return False
        self.best = {"step": self.step, "val_loss": val}
        return True

    def _save_unless_forced(self, stop: StopSignals) -> None:
        """save(), but a second Ctrl-C during it exits as Ctrl-C (130): torch.save reports a
        KeyboardInterrupt raised inside its writer as a failed write ("unexpected pos")."""
        try:
            self.save()
        except LadderError:
            if stop.forced:
                raise KeyboardInterrupt from None
            raise

    def _val_that_fits(self) -> list:
        """The validation batches, cut further where the micro-batch's no-grad forward would not fit next to
        what training holds (a CUDA graph keeps its activations' memory): the same rows, equal pieces."""
        if self.device.type != "cuda" or not self.val or self.caps is None:
            return self.val
        size = len(self.val[0][0])
        # What is reserved, not what is allocated: a CUDA graph's pool keeps the step's activations
        # reserved between steps, and validation cannot use them. The cache goes back first, so what
        # stays reserved is what training holds.
        free_memory(self.device)
        free = HEADROOM * self.caps.usable_memory - torch.cuda.memory_reserved(self.device)
        per = eval_bytes_per_sequence(self.engine.raw_model.config, self.cfg.seq_len)
        fits = max(1, int(free // per))
        if fits >= size:
            return self.val
        return data_mod.micro_batches(self.val, max(d for d in range(1, fits + 1) if size % d == 0))

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
            best = False
            if self._due(self.cfg.eval_every):
                entry["val_loss"] = self.evaluate()
                best = self._improves_best(entry["val_loss"])
            report.step(entry)  # logged before the checkpoint, so the log always reaches its step
            stopping = self._stop_agreed(stop)
            if self._due(self.cfg.ckpt_every) or stopping:
                self._save_unless_forced(stop)
            if best:
                self.save_best()
            if stopping:
                return 128 + (stop.signum or signal.SIGTERM)
        if self.saved_step != self.step:
            self.save()
        return 0


def run_training(cfg: TrainConfig, device: torch.device, out: Path, *, resume: bool = False,
                 progress: bool = True, ranks=distributed.SINGLE, strategy: str | None = None,
                 allow_data_change: bool = False, caps=None, batch_plan=None) -> TrainResult:
    """Train (or continue) the run in `out`, which this process holds locked meanwhile; every
    user-visible side effect happens on the main rank. `caps` (default: detected) and `batch_plan` (how
    the micro-batch was chosen) go into config.json."""
    held = lock_run(out, ranks)
    try:
        return _run_locked(cfg, device, out, resume, progress, ranks, strategy, allow_data_change,
                           caps or detect(device), batch_plan)
    finally:
        if held is not None:
            held.release()


def lock_run(out: Path, ranks=distributed.SINGLE) -> lock.RunLock | None:
    """Rank 0 locks `out` (the others never write there); every rank learns whether it could."""
    if ranks.is_main:
        prepare_out_dir(out)
    held, holder = lock.try_lock(out) if ranks.is_main else (None, None)
    if ranks.is_main and not lock.CAN_LOCK:
        print(f"notice: this platform has no fcntl.flock; nothing stops a second run from using {out} too")
    free = float(holder is None)
    if ranks.world_size > 1:  # a collective: every rank stops if rank 0 could not lock
        free = float(ranks.mean(torch.tensor(free)))
    if free < 1:
        raise UsageError(f"{out} is in use by another gpt2ladder run ({holder or 'rank 0 found it locked'}); "
                         "wait for it to finish, or use another --out")
    return held


def _run_locked(cfg: TrainConfig, device: torch.device, out: Path, resume: bool, progress: bool, ranks,
                strategy: str | None, allow_data_change: bool, caps, batch_plan) -> TrainResult:
    if not resume and ((out / FILENAME).exists() or (out / PREVIOUS).exists()):
        raise UsageError(f"{out} already holds a checkpoint; pass --resume to continue it, or another --out")
    trainer = Trainer(cfg, device, out, ranks, strategy)
    trainer.caps = caps
    changed = trainer.resume(allow_data_change) if resume else []  # fails before the log or checkpoint is touched
    if ranks.is_main:
        for name in (FILENAME, PREVIOUS, BEST):
            remove_stale_temps(out / name)
        _write_config(out, trainer, ranks, caps, batch_plan)
    report = Reporter(out, cfg, is_main=ranks.is_main, progress=progress, start=trainer.step)
    try:
        _announce(report, trainer, changed, resume)
        with StopSignals() as stop:
            code = trainer.run(stop, report)
        model = Path(cfg.init_from).name if cfg.init_from else cfg.preset
        report.plot(f"{model} on {trainer.tokens.source}, {cfg.tokens_per_step:,} tokens/step")
    finally:
        report.close()
    return _finish(report, trainer, code, stop.signum)


def _write_config(out: Path, trainer: Trainer, ranks, caps, batch_plan=None) -> None:
    plan = {**batch_plan.to_dict(), "reason": batch_plan.reason()} if batch_plan else None
    record = {**record_header(caps, trainer.device), "command": "train", "batch_plan": plan,
              "train_config": trainer.cfg.to_dict(), "model": trainer.engine.raw_model.config.to_dict(),
              "setup": trainer.setup.to_dict(), "world_size": ranks.world_size, "strategy": trainer.strategy,
              "grad_accum": trainer.accum,
              "data": {"source": trainer.tokens.source, "sha256": trainer.tokens.sha256,
                       "n_tokens": trainer.tokens.n_tokens},
              "resumed_from_step": trainer.step or None}
    write_json(out / "config.json", record)


def _model_label(trainer: Trainer) -> str:
    """The preset, or the shape actually read when the weights come from a file (the preset did not choose it)."""
    cfg, raw = trainer.cfg, trainer.engine.raw_model
    if cfg.init_from:
        return f"{describe_shape(raw)} from {cfg.init_from}"
    return f"{cfg.preset} ({raw.num_params(non_embedding=False) / 1e6:.1f}M parameters)"


def _announce(report: Reporter, trainer: Trainer, changed: list[str], resume: bool) -> None:
    cfg = trainer.cfg
    report.message(f"model: {_model_label(trainer)} on {trainer.device}, "
                   f"rungs: {', '.join(cfg.rungs)}; {cfg.steps} steps of {cfg.tokens_per_step:,} tokens "
                   f"({cfg.batch_size} x {cfg.seq_len} x {trainer.accum} micro-batches"
                   f"{f' x {trainer.ranks.world_size} processes, {trainer.strategy}' if trainer.strategy else ''}); "
                   f"data: {trainer.tokens.source}")
    for notice in trainer.notices:
        report.message(notice)
    if resume:
        report.message(f"resuming from step {trainer.step} of {trainer.kept_path}")
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
