"""The training loop: steps, validation and the checkpoint decisions of one run, resumable exactly.

A `Trainer` holds the loop's state (engine, batches, step) and `run` trains to `cfg.steps` or until a
signal. Resumed, it logs the same per-step losses as a run never interrupted: batch i is a function of
(seed, i), the learning rate a function of the step, and the checkpoint holds weights, optimizer, data
position and RNG states. The run around the loop (the lock, config.json, what is printed) is `run.py`.

Nothing lost: a checkpoint is written only once its weights are known good, i.e. finite, with a
validation loss (or, at a step without validation, the loss on one batch) that has not exploded
(`health.py`); a run whose loss goes non-finite or explodes stops naming the step, and the last good
checkpoint stays. ckpt.pt and ckpt.prev.pt hold the whole state (what --resume needs); best.pt, the
lowest validation loss so far, holds the weights alone (what `sample` and `export` need).

Data parallel under torchrun: the process's place is a `distributed.Dist` (rank, world size, and a
`mean` that all-reduces), the model is wrapped by DDP or sharded by FSDP2 (the strategy), batches are
split by rank, losses are averaged over ranks, and checkpoint files are written only where `is_main`.
A checkpoint holds the full, unwrapped state (`Engine.state_dict`), so a run resumes on any number of
processes (the same --tokens-per-step gives the same curve).

Where a loop feature goes: a batch source is `training_batches` (anything with `next`, `batch(i)`,
`state_dict` and `load_state_dict`); a measurement every N steps sits beside `evaluate` in `run`, due by
`_due`; a reason to stop early joins the signal in `_stop_agreed`, which every rank must agree on.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.errors import LadderError, UsageError, describe_failure
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.setup import Setup
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.engine import Engine, OptimConfig, build_model
from gpt2ladder.runtime.hardware import Capabilities, detect, free_memory
from gpt2ladder.runtime.memory import HEADROOM, eval_bytes_per_sequence
from gpt2ladder.runtime.metrics import flops_per_token, mfu, peak_flops
from gpt2ladder.training.checkpoint import (
    BEST,
    FILENAME,
    PREVIOUS,
    config_differences,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.health import loss_limit, loss_problem
from gpt2ladder.training.runlog import Reporter
from gpt2ladder.training.schedule import lr_at
from gpt2ladder.training.signals import StopSignals


def build_engine(cfg: TrainConfig, setup: Setup, device: torch.device, parallelize=None,
                 init_weights: bool = True) -> Engine:
    """The model (from the seed, or from real GPT-2 weights) with its optimizer, for this setup.

    `parallelize` (DDP or FSDP2, from `runtime/distributed.py`) runs after the weights are in, before the optimizer.
    Without `init_weights` --init-from's file is not read: a resumed run's weights come from its checkpoint.
    """
    model = None
    if cfg.init_from and init_weights:
        from gpt2ladder.model.hf import load_hf_gpt2

        model = build_model(cfg.model, setup, device, cfg.seed)
        load_hf_gpt2(cfg.init_from, model)
    optim = OptimConfig(lr=cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip)
    return Engine(cfg.model, setup, device, seed=cfg.seed, optim=optim,
                  compile_backend=cfg.compile_backend, model=model, parallelize=parallelize)


def training_batches(cfg: TrainConfig, tokens: data_mod.TokenData, dist=distributed.SINGLE) -> data_mod.Batches:
    """This rank's share of each optimizer step's sequences: a pure function of (seed, step)."""
    return data_mod.Batches(tokens.train, cfg.tokens_per_step // cfg.seq_len, cfg.seq_len, seed=cfg.seed,
                            rank=dist.rank, world_size=dist.world_size)


def validation_batches(cfg: TrainConfig, tokens: data_mod.TokenData) -> list:
    """Batches of a whole step's sequences, cut to the micro-batch: the same data on any card and any
    number of processes (every rank evaluates all of them). None when the run never validates."""
    if not cfg.eval_every:
        return []
    full = data_mod.eval_batches(tokens.val, cfg.tokens_per_step // cfg.seq_len, cfg.seq_len, cfg.eval_batches)
    return data_mod.micro_batches(full, cfg.batch_size)


def weights_finite(model: torch.nn.Module, dist=distributed.SINGLE) -> bool:
    """One host sync for all parameters; under FSDP2 each rank checks its shard and all must agree."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    finite = torch.stack([torch.isfinite(t).all() for t in local]).all().float()
    return bool(dist.mean(finite) == 1)


class Trainer:
    """The loop's state: engine, batches, step; `run` trains to cfg.steps or until a signal."""

    def __init__(self, cfg: TrainConfig, device: torch.device, out: Path, tokens: data_mod.TokenData,
                 dist=distributed.SINGLE, strategy: str | None = None, caps: Capabilities | None = None,
                 resuming: bool = False):
        self.cfg, self.device, self.out, self.tokens, self.dist = cfg, device, out, tokens, dist
        self.strategy = strategy  # "ddp" or "fsdp" under torchrun, None for one process
        self.caps = detect(device) if caps is None else caps  # what validation plans its memory against
        self.accum = cfg.grad_accum(dist.world_size)
        data_mod.check_splits(tokens, cfg.seq_len, validate=bool(cfg.eval_every))
        self.setup = setup_for(list(cfg.rungs))
        parallelize = distributed.parallelize_for(dist, strategy)
        self.engine = build_engine(cfg, self.setup, device, parallelize, init_weights=not resuming)
        self.batches = training_batches(cfg, tokens, dist)
        self.val = validation_batches(cfg, tokens)
        self.ckpt_path = out / FILENAME
        self.step = 0
        self.saved_step: int | None = None  # the step the checkpoint on disk holds
        self.kept_path = self.ckpt_path  # where it is (ckpt.prev.pt after resuming from that)
        raw = self.engine.raw_model
        self.flops_per_token = flops_per_token(raw.config, cfg.seq_len, raw.num_params())
        self.peak = peak_flops(self.caps.name)
        self.limit = loss_limit(raw.config.vocab_size)  # above it a loss has exploded
        self.step_ms: list[float] = []  # this session's steps
        self.last_loss: float | None = None
        self.last_val_loss: float | None = None
        self.val_step: int | None = None  # the step last_val_loss was measured at
        self.best: dict | None = None  # {"step", "val_loss"}: the lowest validation loss, kept in best.pt
        self.notices: list[str] = []  # what resuming found, said when the run starts

    # checkpoints

    def state(self) -> dict:
        """The checkpoint's contents. Under FSDP2 a collective: every rank calls it, rank 0 gets the state."""
        return {**self.engine.state_dict(), **self._facts(), "rng": rng_state(), "data": self.batches.state_dict()}

    def weights_state(self) -> dict:
        """best.pt's contents: the weights and what describes them, without the optimizer's state (twice
        the weights' size), the data position or the RNG states, which only resuming needs."""
        return {"model": self.engine.weights(), **self._facts()}

    def _facts(self) -> dict:
        return {"step": self.step, "train_config": self.cfg.to_dict(),
                "model_config": self.engine.raw_model.config.to_dict(), "setup": self.setup.to_dict(),
                "data_source": {"source": self.tokens.source, "sha256": self.tokens.sha256},
                "val_loss": self.last_val_loss if self.val_step == self.step else None, "best": self.best}

    def save(self) -> None:
        """Checkpoint the current step once its weights are known good; the last good checkpoint stays
        (as ckpt.prev.pt once this one is in place) otherwise."""
        if not weights_finite(self.engine.raw_model, self.dist):
            raise LadderError(f"the weights became non-finite at step {self.step}; stopped without saving "
                              f"them ({self._kept()}); try a lower --lr")
        if self.val_step != self.step:  # validation has not looked at these weights: one batch does
            self._check_loss("the loss of these weights on one batch", self._mean_loss(self._probe_batch()))
        state = self.state()  # every rank: under FSDP2 gathering the full state is a collective
        if self.dist.is_main:
            save_checkpoint(self.ckpt_path, state, previous=self.out / PREVIOUS)
        self.saved_step, self.kept_path = self.step, self.ckpt_path

    def save_best(self) -> None:
        """best.pt for this step's new lowest validation loss (weights validation has just checked)."""
        state = self.weights_state()  # a collective under FSDP2, as state()
        if self.dist.is_main:
            save_checkpoint(self.out / BEST, state)

    def _kept(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"{self.kept_path} still holds step {self.saved_step}"

    def resume(self, state: dict, path: Path, allow_data_change: bool = False) -> list[str]:
        """Continue from a checkpoint (`state`, read from `path`); returns the train-config fields that
        differ from the saved ones."""
        # attention ("manual" or "sdpa") changes no tensor, so a run may resume on another kernel
        diffs = config_differences(state["model_config"], self.engine.raw_model.config.to_dict(), ignore=("attention",))
        if diffs:
            raise UsageError(f"--resume: {path} holds another model than requested "
                             f"({'; '.join(diffs)}); use the run's --preset and --rungs, or another --out")
        data_changed = self._check_data(state, path, allow_data_change)
        try:
            self.engine.load_state_dict(state)
            self.batches.load_state_dict(state["data"])
            set_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:  # a valid hash, odd contents
            raise LadderError(f"checkpoint {path} cannot be resumed (damaged, or not written by this gpt2ladder): "
                              f"{describe_failure(err)}") from None
        self.step = self.saved_step = int(state["step"])
        self.kept_path = path
        self.best = None if data_changed else state.get("best")  # a loss on other text is no yardstick
        return config_differences(state["train_config"], self.cfg.to_dict())

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
        loss = float(self.dist.mean(self.engine.step(x, y)))  # the host sync that ends the step
        ms = (time.perf_counter() - t0) * 1000
        self.step += 1
        self._check_loss("the loss", loss)
        self.step_ms.append(ms)
        tokens_per_s = cfg.tokens_per_step / (ms / 1000)  # all processes together
        entry = {"step": self.step, "loss": loss, "lr": lr, "ms": round(ms, 3),
                 "tokens_per_s": round(tokens_per_s, 1),
                 "mfu": mfu(tokens_per_s / self.dist.world_size, self.flops_per_token, self.peak)}
        if self.dist.world_size > 1:
            entry["tokens_per_s_per_gpu"] = round(tokens_per_s / self.dist.world_size, 1)
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
            return float(self.dist.mean(total)) / len(batches)
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
        if self.device.type != "cuda" or not self.val:
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
        if self.dist.world_size == 1:
            return asked
        return bool(self.dist.mean(torch.tensor(float(asked))) > 0)

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
