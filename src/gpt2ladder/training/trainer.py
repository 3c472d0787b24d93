"""The training loop: steps, validation, HellaSwag and the checkpoint decisions of one run, resumable exactly.

A `Trainer` holds the loop's state (engine, batches, step) and `run` trains to `cfg.steps`, until a signal
or until validation reaches `cfg.target_val_loss`. Resumed, it logs the same per-step losses as a run never
interrupted: batch i is a function of (seed, i), the learning rate a function of the step, and the
checkpoint holds weights, optimizer, data position and RNG states. The run around the loop (the lock,
config.json, what is printed) is `run.py`.

The device is kept fed: batches are made ahead on a thread (`data/prefetch.py`), and on a GPU nothing in a
step waits for the device. Each step's loss and time are read back a step later (`inflight.py`), so the
log is written a step behind; at every point where the loop needs all of them (validation, HellaSwag, a
checkpoint, a signal, the end) it reads every step in flight first, so the log is complete and in order
before anything is measured or saved. Validation, HellaSwag and checkpoints are timed apart from the steps
(`clock.py`), and the entry of a step that validated or scored HellaSwag keeps the run's clock as it stands after
them (`clock`), so a target set after the run (the race's gpt2 rung) reads its wall time there.

Nothing lost: a checkpoint is written only once its weights are known good, i.e. finite, with a
validation loss (or, at a step without validation, the loss on one batch) that has not exploded
(`health.py`); a run whose loss goes non-finite or explodes stops naming the step, and the last good
checkpoint stays. ckpt.pt and ckpt.prev.pt hold the whole state (what --resume needs); best.pt, the
lowest validation loss so far, holds the weights alone (what `sample` and `export` need). A signal during
validation ends it between two batches: the finished step stands and is saved with its measurements marked
pending, and `--resume` measures that step first, so its log, its target step and its tokens are those of a
run never interrupted. A run that reached its target is done: resumed, it has nothing to do.

Data parallel under torchrun: the process's place is a `distributed.Dist` (rank, world size, and a
`mean` that all-reduces), the model is wrapped by DDP or sharded by FSDP2 (the strategy), batches are
split by rank, losses are averaged over ranks, and checkpoint files are written only where `is_main`.
A checkpoint holds the full, unwrapped state (`Engine.state_dict`), so a run resumes on any number of
processes (the same --tokens-per-step gives the same curve). Whether any rank was asked to stop travels in
the loss's all-reduce, so every rank stops after the same step.

Where a loop feature goes: a batch source is `data.training_batches` (anything with `next`, `batch(i)`,
`state_dict` and `load_state_dict`); a measurement every N steps sits beside `evaluate` in `_at_point`, due
by `_due` and counted in `_point_due`; a reason to stop early joins the signal in `_stopping`, which every
rank must agree on.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.errors import LadderError, UsageError, describe_failure
from gpt2ladder.evals import runner
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.setup import Setup
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.engine import Engine, OptimConfig, build_model
from gpt2ladder.runtime.hardware import Capabilities, free_memory
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
from gpt2ladder.training.clock import RunClock
from gpt2ladder.training.config import TrainConfig, with_defaults
from gpt2ladder.training.health import loss_limit, loss_problem
from gpt2ladder.training.inflight import Finished, InFlight, readback_lag
from gpt2ladder.training.runlog import Reporter
from gpt2ladder.training.schedule import lr_at, momentum_at
from gpt2ladder.training.signals import StopRequested, StopSignals, until_stopped


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
    optim = optim_config(cfg)
    return Engine(cfg.model, setup, device, seed=cfg.seed, optim=optim,
                  compile_backend=cfg.compile_backend, model=model, parallelize=parallelize)


def optim_config(cfg: TrainConfig) -> OptimConfig:
    """The recipe's optimizer with the run's rates."""
    muon_lr = OptimConfig.muon_lr if cfg.muon_lr is None else cfg.muon_lr
    return OptimConfig.of(cfg.parsed_recipe, lr=cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                          muon_lr=muon_lr, embed_lr=cfg.embed_lr, head_lr=cfg.head_lr)


def training_batches(cfg: TrainConfig, tokens: data_mod.TokenData, dist=distributed.SINGLE):
    """This rank's share of each optimizer step's sequences, a pure function of (seed, step): random windows
    of a text (`Batches`), seeded passes over a corpus of shards (`OrderedBatches`)."""
    return data_mod.training_batches(tokens, cfg.tokens_per_step // cfg.seq_len, cfg.seq_len, seed=cfg.seed,
                                     rank=dist.rank, world_size=dist.world_size)


def validation_width(cfg: TrainConfig) -> int:
    """Sequences per validation batch: the config's val_batch, else a step's."""
    return cfg.val_batch or cfg.tokens_per_step // cfg.seq_len


def validation_batches(cfg: TrainConfig, tokens: data_mod.TokenData) -> list:
    """Batches of a whole step's sequences, or of cfg.val_batch (a corpus: its first cfg.val_tokens validation
    tokens), cut to equal pieces of at most the micro-batch: the same data on any card and any number of processes
    (every rank evaluates all of them). None when the run never validates."""
    if not cfg.eval_every:
        return []
    full = data_mod.validation_batches(tokens, validation_width(cfg), cfg.seq_len, cfg.eval_batches, cfg.val_tokens)
    rows = math.gcd(*(len(x) for x, _ in full)) or 1  # a step's sequences, or the fewer of a corpus's only batch
    return data_mod.micro_batches(full, max(d for d in range(1, min(cfg.batch_size, rows) + 1) if rows % d == 0))


def weights_finite(model: torch.nn.Module, dist=distributed.SINGLE) -> bool:
    """One host sync for all parameters; under FSDP2 each rank checks its shard and all must agree."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    finite = torch.stack([torch.isfinite(t).all() for t in local]).all().float()
    return bool(dist.mean(finite) == 1)


def rows_that_fit(run, seq_len: int) -> int:
    """How many sequences of `seq_len` tokens a no-grad forward may take on this GPU beside what training holds
    (`run`: a Trainer), the fewest of any rank's: every rank must make the same forwards (each one's
    collectives under FSDP2, the stop check between them). What is reserved counts, not what is allocated: a
    CUDA graph's pool keeps the step's activations reserved between steps, and no forward outside it can use
    them. The cache goes back first, so what stays reserved is what training holds."""
    free_memory(run.device)
    free = HEADROOM * run.caps.usable_memory - torch.cuda.memory_reserved(run.device)
    rows = max(1, int(free // eval_bytes_per_sequence(run.engine.raw_model.config, seq_len)))
    return int(distributed.reduce_floats([rows], run.dist, "min")[0])


def data_change(state: dict, path: Path, source: str, sha256: str, allowed: bool = False) -> str | None:
    """How the text `source` (with this sha256) differs from the one the checkpoint (`state`, read from `path`) was
    trained on, or None where they are the same (or it names none); a UsageError unless the change is `allowed`.
    `train` asks this as soon as the new text is known (before a text is tokenized or a corpus's tokens are
    checked), the loop again when it resumes."""
    saved = state.get("data_source") or {}
    if not saved.get("sha256") or saved["sha256"] == sha256:
        return None
    change = f"{saved.get('source')} (sha256 {saved['sha256'][:12]}...) -> {source} (sha256 {sha256[:12]}...)"
    if not allowed:
        raise UsageError(f"--resume: {path} was trained on another text than this run's ({change}); pass "
                         "--allow-data-change to continue on the new one, or give the run's own --data")
    return change


class Trainer:
    """The loop's state: engine, batches, step; `run` trains to cfg.steps, a signal or the target."""

    def __init__(self, cfg: TrainConfig, device: torch.device, out: Path, tokens: data_mod.TokenData,
                 dist=distributed.SINGLE, strategy: str | None = None, *, caps: Capabilities,
                 setup: Setup | None = None, resuming: bool = False, hellaswag: runner.Prepared | None = None):
        self.cfg, self.device, self.out, self.tokens, self.dist = cfg, device, out, tokens, dist
        self.schedule = cfg.parsed_recipe.schedule
        self.clock = RunClock()  # from now: the wall time counts the model's building too
        self.strategy = strategy  # "ddp" or "fsdp" under torchrun, None for one process
        self.caps = caps  # what validation plans its memory against, as the caller detected it
        self.accum = cfg.grad_accum(dist.world_size)
        data_mod.check_splits(tokens, cfg.seq_len, validate=bool(cfg.eval_every))
        self.setup = setup_for(list(cfg.rungs)) if setup is None else setup  # the caller's, computed once
        parallelize = distributed.parallelize_for(dist, strategy)
        self.engine = build_engine(cfg, self.setup, device, parallelize, init_weights=not resuming)
        self.batches = training_batches(cfg, tokens, dist)
        self.feed: data_mod.Prefetcher | None = None  # the batches made ahead, while `run` runs
        self.val = validation_batches(cfg, tokens)
        self.val_rows: int | None = None  # sequences a validation forward may take here, planned once (on a GPU)
        self.hellaswag = hellaswag  # the examples, prepared before the run starts (cfg.hellaswag_every)
        self.inflight = InFlight(device, readback_lag(device))
        self.ckpt_path = out / FILENAME
        self.step = 0  # steps queued; the engine's weights are this step's
        self.first_step = 1  # this session's first, which compiles and captures
        self.saved_step: int | None = None  # the step the checkpoint on disk holds
        self.written: set[str] = set()  # the names of the checkpoint files this session wrote (on rank 0)
        self.kept_path = self.ckpt_path  # where it is (ckpt.prev.pt after resuming from that)
        raw = self.engine.raw_model
        self.flops_per_token = flops_per_token(raw.config, cfg.seq_len, raw.num_params())
        self.peak = peak_flops(self.caps.name)
        self.limit = loss_limit(raw.config.vocab_size)  # above it a loss has exploded
        self.step_ms: list[float] = []  # this session's steps
        self.last_loss: float | None = None
        self.last_val_loss: float | None = None
        self.val_step: int | None = None  # the step last_val_loss was measured at
        self.near = False  # the last validation was within cfg.eval_near of the target: validate every near_every
        self.best: dict | None = None  # {"step", "val_loss"}: the lowest validation loss, kept in best.pt
        self.reached: dict | None = None  # the target's figures, once validation reached cfg.target_val_loss
        self.pending: dict | None = None  # the log entry of a step whose measurements a signal cut short
        self.remeasured = False  # this session made the saved step's pending measurements
        self.peer_asked = False  # under torchrun: some rank was asked to stop (read back with a step's loss)
        self.notices: list[str] = []  # what resuming found, said when the run starts

    # checkpoints

    def state(self) -> dict:
        """The checkpoint's contents. Under FSDP2 a collective: every rank calls it, rank 0 gets the state.
        The data position is the batch the next step takes, whatever the prefetcher has made ahead."""
        return {**self.engine.state_dict(), **self._facts(), "rng": rng_state(),
                "data": (self.feed or self.batches).state_dict(), "clock": self.clock.state_dict(),
                "reached": self.reached, "pending": self.pending, "near": self.near}

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
        started = time.perf_counter()
        if not weights_finite(self.engine.raw_model, self.dist):
            raise LadderError(f"the weights became non-finite at step {self.step}; stopped without saving "
                              f"them ({self._kept()}); try a lower --lr")
        if self.val_step != self.step:  # validation has not looked at these weights: one batch does
            self._check_loss("the loss of these weights on one batch", self._mean_loss(self._probe_batch()))
        state = self.state()  # every rank: under FSDP2 gathering the full state is a collective
        if self.dist.is_main:
            moved = self.ckpt_path.exists()  # the checkpoint before this one becomes ckpt.prev.pt
            save_checkpoint(self.ckpt_path, state, previous=self.out / PREVIOUS)
            self.written.update((FILENAME, PREVIOUS) if moved else (FILENAME,))
        self.saved_step, self.kept_path = self.step, self.ckpt_path
        self.clock.add_between("checkpoints", time.perf_counter() - started)

    def save_best(self) -> None:
        """best.pt for this step's new lowest validation loss (weights validation has just checked)."""
        started = time.perf_counter()
        state = self.weights_state()  # a collective under FSDP2, as state()
        if self.dist.is_main:
            save_checkpoint(self.out / BEST, state)
            self.written.add(BEST)
        self.clock.add_between("checkpoints", time.perf_counter() - started)

    def _kept(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"{self.kept_path} still holds step {self.saved_step}"

    def resume(self, state: dict, path: Path, allow_data_change: bool = False) -> list[str]:
        """Continue from a checkpoint (`state`, read from `path`); returns the train-config fields that
        differ from the saved ones."""
        saved_recipe = (state.get("train_config") or {}).get("recipe", "gpt2")
        if saved_recipe != self.cfg.recipe:
            raise UsageError(f"--resume: {path} trains recipe {saved_recipe}, not {self.cfg.recipe}; give the run's "
                             "own --recipe (or none), or another --out")
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
            self.step = self.saved_step = int(state["step"])
            self.clock = self.clock.resumed(state.get("clock"), self.step)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:  # a valid hash, odd contents
            raise LadderError(f"checkpoint {path} cannot be resumed (damaged, or not written by this gpt2ladder): "
                              f"{describe_failure(err)}") from None
        self.first_step = self.step + 1
        self.kept_path = path
        self.best = None if data_changed else state.get("best")  # a loss on other text is no yardstick
        self.pending = state.get("pending")
        # Resumed, it validates where it would have; near another target or margin, from its next validation on.
        saved = state.get("train_config") or {}
        same = all(saved.get(k) == getattr(self.cfg, k) for k in ("target_val_loss", "eval_near"))
        self.near = bool(state.get("near")) and same and not data_changed
        self.reached = self._still_reached(state, data_changed)
        saved = state["train_config"]  # a field newer than the checkpoint reads as its default: nothing changed
        changed = config_differences(with_defaults(saved), self.cfg.to_dict())
        return changed + self._schedule_change(with_defaults(saved))

    def _schedule_change(self, saved: dict) -> list[str]:
        """Where the schedule's settings changed and steps remain: the rate it gives the next step, beside the one
        the checkpoint's last step trained at (a run extended past its end warms back up from its floor)."""
        cfg, keys = self.cfg, ("steps", "lr", "min_lr", "warmup_steps", "decay_fraction")
        if (not self.step or self.step >= cfg.steps or self.reached is not None
                or all(saved.get(k) == getattr(cfg, k) for k in keys)):
            return []
        before = lr_at(self.step - 1, *(saved.get(k, getattr(cfg, k)) for k in keys[1:4]), saved.get("steps", 0),
                       self.schedule, saved.get("decay_fraction") or cfg.decay_fraction)
        now = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps, self.schedule, cfg.decay_fraction)
        return [f"the learning rate follows the schedule for these settings: {now:.3g} at step {self.step + 1}, "
                f"where step {self.step} trained at {before:.3g}"]

    def _still_reached(self, state: dict, data_changed: bool) -> dict | None:
        """The checkpoint's target figures when its validation loss also meets this run's target: such a run
        is done. Another text, a lower target or none at all trains on."""
        reached, val, target = state.get("reached"), state.get("val_loss"), self.cfg.target_val_loss
        if reached is None or val is None or target is None or data_changed or val > target:
            return None
        self.last_val_loss, self.val_step = val, self.step
        return reached

    def _check_data(self, state: dict, path: Path, allowed: bool) -> bool:
        """Whether the text differs from the checkpoint's; a UsageError unless that is allowed."""
        change = data_change(state, path, self.tokens.source, self.tokens.sha256, allowed)
        if change is None:
            return False
        self.notices.append(f"notice: resuming on another text than the checkpoint's: {change}; "
                            "the best validation loss starts again")
        return True

    # steps

    def train_step(self, stop: StopSignals | None = None) -> None:
        """Queue one optimizer step over tokens_per_step tokens. Its loss and time are read back later
        (`inflight.py`): on a GPU once the device has run it, with the next step queued behind it."""
        cfg = self.cfg
        self.inflight.start()  # the time covers the batch's copy, the step and the loss's reduction
        x, y = self.feed.next()  # (accum * B, T) rows of this rank, on the device
        shape = (self.accum, cfg.batch_size, cfg.seq_len)
        lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps, self.schedule, cfg.decay_fraction)
        self.engine.set_lr(lr)
        facts = {"step": self.step + 1, "lr": lr}
        if self.engine.optim_cfg.momentum_warmup:
            facts["momentum"] = momentum_at(self.step)
            self.engine.set_momentum(facts["momentum"])
        loss = self.engine.step(x.view(shape), y.view(shape))
        self.step += 1
        if self.device.type != "cpu":  # the loader's share of the step (the CPU's log keeps its keys)
            facts["data"] = {"host_ms": round(self.feed.host_ms, 3), "wait_ms": round(self.feed.wait_ms, 3)}
        self.inflight.queue(self._reduced(loss, stop), facts)

    def _reduced(self, loss: torch.Tensor, stop: StopSignals | None) -> torch.Tensor:
        """The step's loss averaged over ranks, as a 1-d tensor read back with the step. Under torchrun the same
        all-reduce carries whether any rank has been asked to stop: every rank reads the same answer after the
        same step, and saving (a collective) needs every rank to stop there."""
        if self.dist.world_size == 1:
            return loss.detach().reshape(1)
        asked = float(stop is not None and stop.requested)
        flag = torch.full((1,), asked, dtype=torch.float32, device=loss.device)  # a fill kernel: no host sync
        return self.dist.mean(torch.cat([loss.detach().float().reshape(1), flag]))

    def _entry(self, done: Finished) -> dict:
        """A finished step's log entry, once its loss is known good (a bad one stops the run naming the step);
        its time joins the run's clock."""
        cfg, step, loss = self.cfg, done.facts["step"], done.values[0]
        self._check_loss("the loss", loss, step)
        self.peer_asked = self.peer_asked or (len(done.values) > 1 and done.values[1] > 0)
        self.last_loss = loss
        self.step_ms.append(done.ms)
        self.clock.add_step(done.ms, cfg.tokens_per_step, warmup=step == self.first_step)
        tokens_per_s = cfg.tokens_per_step / (done.ms / 1000)  # all processes together
        entry = {"step": step, "loss": loss, "lr": done.facts["lr"],
                 **({"momentum": done.facts["momentum"]} if "momentum" in done.facts else {}), "ms": round(done.ms, 3),
                 "tokens_per_s": round(tokens_per_s, 1),
                 "mfu": mfu(tokens_per_s / self.dist.world_size, self.flops_per_token, self.peak)}
        if step == self.first_step:
            entry["warmup"] = True  # this session's first step: compile and capture, outside the training time
        if self.dist.world_size > 1:
            entry["tokens_per_s_per_gpu"] = round(tokens_per_s / self.dist.world_size, 1)
        return {**entry, **done.facts.get("data", {})}

    def _log_finished(self, report: Reporter, everything: bool) -> dict | None:
        """Log the steps the device has finished, oldest first, each checked before it is logged. With
        `everything`, every step in flight: the newest one's entry (this step's) comes back unlogged, for what
        its step measures to join it."""
        held = None
        for done in self.inflight.finished(everything):
            if held is not None:
                report.step(held)
            held = self._entry(done)
        if everything:
            return held
        if held is not None:
            report.step(held)
        return None

    def evaluate(self, stop: StopSignals | None = None) -> float:
        """Mean validation loss on the fixed batches; stops the run if it is not finite or has exploded. A stop
        asked for meanwhile ends it between two batches (StopRequested)."""
        started = time.perf_counter()
        try:
            self.val = self._val_that_fits()
            loss = self._mean_loss(self.val, stop)
        finally:
            self.clock.add_between("validation", time.perf_counter() - started)
        self._check_loss("the validation loss", loss)  # finite but huge weights: do not checkpoint them
        self.last_val_loss, self.val_step = loss, self.step
        target = self.cfg.target_val_loss
        self.near = bool(self.cfg.eval_near) and target is not None and loss - target <= self.cfg.eval_near
        return loss

    @torch.no_grad()
    def _mean_loss(self, batches: list, stop: StopSignals | None = None) -> float:
        """Mean loss over batches through the same (maybe compiled) forward, in eval mode, all ranks averaged;
        with `stop`, a stop asked for is honoured before the next batch."""
        model = self.engine.model
        model.eval()
        try:
            total = torch.zeros((), device=self.device)
            with self.engine.precision():
                for x, y in until_stopped(batches, stop, self._agree()):
                    total += self.engine.loss(*data_mod.to_device(x, y, self.device)).float()
            return float(self.dist.mean(total)) / len(batches)
        finally:
            model.train()

    def score_hellaswag(self, stop: StopSignals | None = None) -> dict:
        """HellaSwag through the run's own forward (compiled when the run compiles) and precision, in eval mode:
        the entry log.jsonl keeps at this step, which `export` reads for the model card."""
        if stop is not None:
            stop.check(self._agree())  # a signal already asked for: not worth a pass over every example
        started = time.perf_counter()
        model, raw = self.engine.model, self.engine.raw_model
        model.eval()
        try:
            result = runner.evaluate(self.hellaswag, self.engine.forward, device=self.device,
                                     block_size=raw.config.block_size, vocab_size=raw.config.vocab_size,
                                     batch_size=self._hellaswag_batch(), autocast=self.setup.autocast,
                                     matmul_precision=self.setup.matmul_precision, progress=False)
        finally:
            model.train()
            self.clock.add_between("HellaSwag", time.perf_counter() - started)
        return runner.log_entry(self.hellaswag, result)

    def _hellaswag_batch(self) -> int:
        """Examples per forward: `gpt2ladder eval`'s, fewer on a GPU where their rows at the full block would
        not fit beside what training holds."""
        want = runner.BATCH_SIZE.get(self.device.type, runner.BATCH_SIZE["cpu"])
        if self.device.type != "cuda":
            return want
        rows = rows_that_fit(self, self.engine.raw_model.config.block_size)
        return max(1, min(want, rows // self.hellaswag.n_choices))

    def _agree(self):
        """Under torchrun, how a pass between steps learns whether any rank was asked to stop (a collective,
        so all leave it at the same batch); None for one process."""
        if self.dist.world_size == 1:
            return None
        return lambda mine: bool(self.dist.mean(torch.tensor(float(mine))) > 0)

    def _probe_batch(self) -> list:
        """One fixed batch to check weights no validation has seen: the first validation batch, else the
        first micro-batch of the training stream (a pure function of the seed: no state changes)."""
        if self.val:
            return self.val[:1]
        x, y = self.batches.batch(0)
        return [(x[:self.cfg.batch_size], y[:self.cfg.batch_size])]

    def _check_loss(self, what: str, loss: float, step: int | None = None) -> None:
        problem = loss_problem(loss, self.limit)
        if problem:
            raise LadderError(f"{what} {problem} at step {self.step if step is None else step}; stopped without "
                              f"saving ({self._kept()}); try a lower --lr")

    def _improves_best(self, val: float) -> bool:
        if self.best is not None and val >= self.best["val_loss"]:
            return False
        self.best = {"step": self.step, "val_loss": val}
        return True

    def _reached(self, entry: dict) -> bool:
        """Whether this step's validation reached the target; if so, the time it took (the entry's clock) joins its
        log entry as `target`."""
        target = self.cfg.target_val_loss
        if target is None or "val_loss" not in entry or entry["val_loss"] > target:
            return False
        entry["target"] = {"val_loss": target, **entry.get("clock", self.clock.summary())}
        self.reached = {"step": self.step, **entry["target"]}
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
        what training holds (a CUDA graph keeps its activations' memory): the same rows, equal pieces. Planned at
        the session's first validation, when training's memory is in place, and kept: planning collects Python's
        garbage and empties the CUDA cache, which every forward after it would fill again."""
        if self.device.type != "cuda" or not self.val:
            return self.val
        size = len(self.val[0][0])
        if self.val_rows is None:
            self.val_rows = rows_that_fit(self, self.cfg.seq_len)
        fits = self.val_rows
        if fits >= size:
            return self.val
        return data_mod.micro_batches(self.val, max(d for d in range(1, fits + 1) if size % d == 0))

    def _due(self, every: int) -> bool:
        return bool(every) and (self.step % every == 0 or self.step == self.cfg.steps)

    def _validation_due(self) -> bool:
        """Every eval_every steps; near the target (`cfg.eval_near`), every near_every."""
        return self._due(self.cfg.eval_every) or (self.near and self._due(self.cfg.near_every))

    def _point_due(self) -> bool:
        """Whether this step needs every step before it read and logged: it measures or saves, or ends the run."""
        cfg = self.cfg
        every = (cfg.ckpt_every, cfg.hellaswag_every)
        return self.step == cfg.steps or self._validation_due() or any(self._due(n) for n in every)

    def _stopping(self, stop: StopSignals) -> bool:
        """Whether to stop after this step. Under torchrun every rank stops after the same step: a signal seen
        by any rank counts for all once it is read back with a step's loss (the same step on every rank, so
        a step or two after the signal). Saving is a collective, and a rank that ran on would hang."""
        return stop.requested if self.dist.world_size == 1 else self.peer_asked

    def run(self, stop: StopSignals, report: Reporter) -> int:
        """Train until cfg.steps, a signal or the target; 0, or 128 + the signal's number. The batches come
        from a prefetching thread, stopped by `close()`."""
        self.feed = data_mod.Prefetcher(self.batches, self.device)
        if self.pending is not None:  # the saved step's measurements, which a signal cut short, come first
            self.remeasured = True
            code = self._at_point(dict(self.pending), stop, report, again=True)
            if code is not None:
                return code
        while self.step < self.cfg.steps and self.reached is None:
            self.train_step(stop)
            # A stop is a point too: every step in flight is read and logged before the save.
            entry = self._log_finished(report, everything=self._point_due() or self._stopping(stop))
            code = None if entry is None else self._at_point(entry, stop, report)
            if code is not None:
                return code
        if self.saved_step != self.step and self.cfg.save_at_end:
            self.save()
        return 0

    def _at_point(self, entry: dict, stop: StopSignals, report: Reporter, again: bool = False) -> int | None:
        """This step, every step before it logged: what it measures, its log entry, its checkpoints. The exit
        code when the run ends here (a signal, the target reached), else None. `again`: the saved step's
        measurements, cut short by a signal, now made (its checkpoint is saved again without the mark)."""
        cfg = self.cfg
        best = interrupted = False
        self.pending = None
        try:
            measured = self._measure(stop)
        except StopRequested:  # the step stands; what it measures is left out, and measured on --resume
            interrupted, measured, self.pending = True, {}, dict(entry)
        entry.update(measured)
        if measured:  # the run's clock after this step's measurements: a target set after the run is timed by it
            entry["clock"] = self.clock.summary()
        if "val_loss" in measured:
            best = self._improves_best(measured["val_loss"])
        reached = self._reached(entry)
        report.step(entry)  # logged before the checkpoint, so the log always reaches its step
        stopping = interrupted or self._stopping(stop)
        ends = reached or self.step == cfg.steps  # a run that saves nothing at its end saves nothing here either
        if (again and (cfg.save_at_end or not ends)) or self._due(cfg.ckpt_every) or stopping \
                or (reached and cfg.save_at_end):
            self._save_unless_forced(stop)
        if best and cfg.keep_best:
            self.save_best()
        if stopping:
            return 128 + (stop.signum or signal.SIGTERM)
        return 0 if reached else None

    def _measure(self, stop: StopSignals) -> dict:
        """What this step measures (validation, HellaSwag), all of it or nothing: a stop asked for meanwhile
        raises StopRequested."""
        measured = {}
        if self._validation_due():
            measured["val_loss"] = self.evaluate(stop)
        if self._due(self.cfg.hellaswag_every):
            measured["hellaswag"] = self.score_hellaswag(stop)
        return measured

    def close(self) -> None:
        """Stop the prefetching thread (the run's `finally`)."""
        if self.feed is not None:
            self.feed.close()
