"""A training run around the loop: its run directory claimed, the checkpoint it continues, config.json,
what it says when it starts and when it ends.

A run directory holds config.json, log.jsonl (one line per step, flushed as written), ckpt.pt (the
newest good checkpoint, replaced atomically), ckpt.prev.pt (the one before it), best.pt (the lowest
validation loss, when validation runs), loss.png and, when tensorboard is installed, tb/. One process
owns it (`lock.py`); every side effect a user sees (printing, the log, plots, TensorBoard, checkpoint
files) happens only on the main rank. --resume refuses another text than the checkpoint's unless
--allow-data-change is given.

Exit codes: 0 when done (all --steps, or --target-val-loss reached); 130 after Ctrl-C (SIGINT) and 143
after SIGTERM, both of which finish the step in flight (a validation under way is left between two
batches) and save a checkpoint first; 1 or 2 with a one-line error otherwise.

With --target-val-loss the step whose validation reaches the target carries a "target" field in log.jsonl:
the target, the training time (`train_s`, the sum of the timed steps; `warmup_s` the steps that compiled
and captured, `warmup_steps` of them, apart), the wall time from the run's start (`wall_s`), the tokens
trained on, and the time validation, HellaSwag and checkpoints took between the steps. Across a resume
they keep adding up (`clock.py` says what is and is not counted); the summary line says the same. Every step
that validated or scored HellaSwag carries the same figures as they stood after it in a "clock" field, with or
without a target, so a target chosen after the run is timed from its log too.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.evals import runner
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.gpt import describe_shape
from gpt2ladder.model.recipe import recipe_label
from gpt2ladder.model.setup import Setup
from gpt2ladder.report.notices import first_step_did
from gpt2ladder.report.records import prepare_out_dir, record_header, write_json
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.training import lock
from gpt2ladder.training.outdirs import check_run_out
from gpt2ladder.training.checkpoint import BEST, FILENAME, PREVIOUS, RESUME_KEYS, last_good, remove_stale_temps
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.runlog import Reporter
from gpt2ladder.training.schedule import lr_at
from gpt2ladder.training.signals import StopSignals
from gpt2ladder.training.trainer import Trainer, data_change


@dataclass(frozen=True)
class TrainResult:
    exit_code: int  # 0 done, 128 + signal number when stopped by a signal
    step: int
    loss: float | None
    val_loss: float | None
    out: Path


@dataclass(frozen=True)
class Saved:
    """The checkpoint --resume continues, read once while the directory is held: its contents, the file
    it came from, and what finding it said (a damaged ckpt.pt passed over for the one before it)."""

    state: dict
    path: Path
    notices: tuple[str, ...] = ()


def run_training(cfg: TrainConfig, device: torch.device, out: Path, *, resume: bool = False,
                 progress: bool = True, dist=distributed.SINGLE, strategy: str | None = None,
                 tokens: data_mod.TokenData | None = None, allow_data_change: bool = False,
                 caps: Capabilities) -> TrainResult:
    """Train (or continue, with `cfg` as it is) the run in `out`, which this process holds locked
    meanwhile. `tokens` (default: `cfg.data`, read now) are the text; `caps` what the device can do, as the
    caller detected it (`runtime.hardware.detect`, once). `gpt2ladder train` takes these steps itself, deciding
    the settings in between."""
    check_run_out(out)
    with claimed(out, dist):
        saved = saved_run(out, dist, resume)
        if tokens is None:
            refuse = other_text_refused(saved, allow_data_change)
            tokens = data_mod.load_tokens(cfg.data, notify=print if dist.is_main else _silent, identify=refuse,
                                          check=lambda t: refuse(t.source, t.sha256))
        return train_claimed(cfg, device, out, saved, tokens=tokens, progress=progress, dist=dist, strategy=strategy,
                             allow_data_change=allow_data_change, caps=caps,
                             hellaswag=prepared_hellaswag(cfg, dist))


def other_text_refused(saved: Saved | None, allowed: bool):
    """(source, sha256) -> None: a UsageError for another text than the resumed checkpoint's (unless `allowed`),
    asked as soon as a text's sha256 is known, before it is tokenized or a corpus's tokens are checked."""
    def refuse(source: str, sha256: str) -> None:
        if saved is not None:
            data_change(saved.state, saved.path, source, sha256, allowed)
    return refuse


def prepared_hellaswag(cfg: TrainConfig, dist=distributed.SINGLE) -> runner.Prepared | None:
    """HellaSwag's examples for --hellaswag-every (None without it), read before the run says anything: rank 0
    first, downloading the official set once when it is not in the cache; then the other ranks read that
    file. A problem is rank 0's one line; the other ranks stop without a word."""
    if not cfg.hellaswag_every:
        return None
    prepared, failed = None, None
    if dist.is_main:
        try:
            prepared = runner.prepare("hellaswag", cfg.hellaswag_data, flag="--hellaswag-data FILE")
        except LadderError as err:
            failed = err
    if dist.world_size > 1 and distributed.reduce_floats([float(failed is not None)], dist, "max")[0]:
        raise failed or UsageError("rank 0 could not read HellaSwag's data and has said why")
    if failed is not None:
        raise failed
    return prepared if dist.is_main else runner.prepare("hellaswag", cfg.hellaswag_data, download=False,
                                                         flag="--hellaswag-data FILE")


def _silent(*args, **kwargs) -> None:
    """The notices of ranks other than 0 (every rank finds the same)."""


@contextlib.contextmanager
def claimed(out: Path, dist=distributed.SINGLE):
    """`with claimed(out, dist):` this process holds the run directory (rank 0 locks it) until the block ends."""
    held = lock_run(out, dist)
    try:
        yield
    finally:
        if held is not None:
            held.release()


def lock_run(out: Path, dist=distributed.SINGLE) -> lock.RunLock | None:
    """Rank 0 locks `out` (the others never write there); every rank learns whether it could."""
    if dist.is_main:
        prepare_out_dir(out)
    held, holder = lock.try_lock(out) if dist.is_main else (None, None)
    if dist.is_main and not lock.CAN_LOCK:
        print(f"notice: this platform has no fcntl.flock; nothing stops a second run from using {out} too")
    free = float(holder is None)
    if dist.world_size > 1:  # a collective: every rank stops if rank 0 could not lock
        free = float(dist.mean(torch.tensor(free)))
    if free < 1:
        raise UsageError(f"{out} is in use by another gpt2ladder run ({holder or 'rank 0 found it locked'}); "
                         "wait for it to finish, or use another --out")
    return held


def saved_run(out: Path, dist=distributed.SINGLE, resume: bool = True) -> Saved | None:
    """With `resume`, the run's last good checkpoint (ckpt.pt, else ckpt.prev.pt; never best.pt, which
    lacks what resuming needs), read before the log or any checkpoint is touched. Without, None: a new
    run, which may not start over a checkpoint (that is what --resume is for)."""
    if not resume:
        if (out / FILENAME).exists() or (out / PREVIOUS).exists():
            raise UsageError(f"{out} already holds a checkpoint; pass --resume to continue it, or another --out")
        return None
    notices: list[str] = []
    state, path = last_good(out, notices.append, set_aside=dist.is_main, needs=RESUME_KEYS)
    return Saved(state, path, tuple(notices))


def train_claimed(cfg: TrainConfig, device: torch.device, out: Path, saved: Saved | None, *,
                  tokens: data_mod.TokenData, progress: bool = True, dist=distributed.SINGLE,
                  strategy: str | None = None, allow_data_change: bool = False, caps: Capabilities,
                  setup: Setup | None = None, batch_plan=None,
                  notices=(), hellaswag: runner.Prepared | None = None, bar: tuple[str, bool] = ("train", True)
                  ) -> TrainResult:
    """The run in a directory this process holds: the loop set up (and resumed), then trained to its end.

    Nothing is printed before the loop is ready, so any input the loop refuses (a text too short, a
    checkpoint of another model or text) fails first. `batch_plan` (how the micro-batch was chosen) goes
    into config.json and the first line, `notices` (the command's, e.g. rungs left out) after it;
    `hellaswag` is what `prepared_hellaswag` read for cfg.hellaswag_every; `caps` what the device can do, as the
    caller detected it; `setup` how the step runs, `setup_for(cfg.rungs)` (computed here when not given); `bar` the
    progress bar's label and whether it stays on the terminal when the run ends."""
    setup = setup_for(list(cfg.rungs)) if setup is None else setup
    if cfg.hellaswag_every and hellaswag is None:
        raise ValueError("cfg.hellaswag_every needs the examples: pass hellaswag=prepared_hellaswag(cfg, dist)")
    # Noted from the start of the set-up (the model built, the checkpoint read), so that a signal before the first
    # step ends the run with its line, and one during the first step's compile stops it after that step.
    with StopSignals() as stop:
        trainer = Trainer(cfg, device, out, tokens, dist, strategy, caps=caps, setup=setup,
                          resuming=saved is not None, hellaswag=hellaswag)
        changed = []
        if saved is not None:
            trainer.notices += saved.notices
            changed = trainer.resume(saved.state, saved.path, allow_data_change)  # fails before the log is touched
            if trainer.step > cfg.steps:
                raise UsageError(f"{saved.path} holds step {trainer.step}, past --steps {cfg.steps}: give --steps "
                                 f"{trainer.step} or more to continue the run (or leave --steps out)")
        # A run with nothing left to train (all its steps, or its target reached) keeps the config.json it trained by.
        idle = trainer.pending is None and (trainer.step >= cfg.steps or trainer.reached is not None)
        if dist.is_main:
            for name in (FILENAME, PREVIOUS, BEST):
                remove_stale_temps(out / name)
            if not idle:
                _write_config(out, trainer, caps, batch_plan)
        # a step whose measurements a signal cut short is logged again once they are made
        report = Reporter(out, cfg, is_main=dist.is_main, progress=progress,
                          start=trainer.step - (trainer.pending is not None), label=bar[0], leave=bar[1])
        try:
            report.message(first_line(cfg, dist.world_size, batch_plan))
            for line in notices:
                report.message(line)
            _announce(report, trainer, changed, saved is not None)
            # Asked during the set-up: no step is begun. Under torchrun the loop decides, as every rank must agree.
            early = dist.world_size == 1 and stop.requested
            if early:
                code = 128 + stop.signum
            else:
                code = trainer.run(stop, report)
                model = Path(cfg.init_from).name if cfg.init_from else cfg.preset
                report.plot(f"{model} on {tokens.source}, {cfg.tokens_per_step:,} tokens/step")
        finally:
            trainer.close()
            report.close()
    return _finish(report, trainer, code, stop.signum, early)


def first_line(cfg: TrainConfig, world_size: int, plan) -> str:
    """micro-batch x accumulation = tokens per step, and why that micro-batch."""
    accum = cfg.grad_accum(world_size)
    text = (f"gpt2ladder train: micro-batch {cfg.batch_size} x {accum} accumulation step{'s' if accum > 1 else ''}"
            f"{f' x {world_size} processes' if world_size > 1 else ''} = {cfg.tokens_per_step:,} tokens per step "
            f"({cfg.tokens_per_step // cfg.seq_len} sequences of {cfg.seq_len})")
    return text + (f"; {plan.reason()}" if plan else "")


def _write_config(out: Path, trainer: Trainer, caps, batch_plan=None) -> None:
    plan = {**batch_plan.to_dict(), "reason": batch_plan.reason()} if batch_plan else None
    header = record_header(caps, trainer.device)
    cards = [*(run_cards(out) if trainer.step else []), header["device"]["name"]]
    record = {**header, "cards": list(dict.fromkeys(cards)), "command": "train", "batch_plan": plan,
              "train_config": trainer.cfg.to_dict(), "model": trainer.engine.raw_model.config.to_dict(),
              "setup": trainer.setup.to_dict(), "world_size": trainer.dist.world_size, "strategy": trainer.strategy,
              "grad_accum": trainer.accum,
              "data": {"source": trainer.tokens.source, "sha256": trainer.tokens.sha256,
                       "n_tokens": trainer.tokens.n_tokens},
              "resumed_from_step": trainer.step or None}
    write_json(out / "config.json", record)


def run_cards(folder: Path) -> list[str]:
    """The cards a run trained on, as its config.json names them: every session's (`cards`), or the one it names
    (`device`, a config.json from before `cards`); none without one (a run made apart). Each session rewrites
    config.json, its `device` the session's own."""
    try:
        record = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        return [c for c in record.get("cards") or [record["device"]["name"]] if isinstance(c, str)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def _model_label(trainer: Trainer) -> str:
    """The preset, or the shape actually read when the weights come from a file (the preset did not choose it)."""
    cfg, raw = trainer.cfg, trainer.engine.raw_model
    if cfg.init_from:
        return f"{describe_shape(raw)} from {cfg.init_from}"
    return f"{cfg.preset} ({raw.num_params(non_embedding=False) / 1e6:.1f}M parameters)"


def _announce(report: Reporter, trainer: Trainer, changed: list[str], resume: bool) -> None:
    cfg = trainer.cfg
    report.message(f"model: {_model_label(trainer)} on {trainer.device}, recipe {recipe_label(cfg.recipe)}, "
                   f"rungs: {', '.join(cfg.rungs)}; {cfg.steps} step{'s' if cfg.steps != 1 else ''} of "
                   f"{cfg.tokens_per_step:,} tokens "
                   f"({cfg.batch_size} x {cfg.seq_len} x {trainer.accum} micro-batches"
                   f"{f' x {trainer.dist.world_size} processes, {trainer.strategy}' if trainer.strategy else ''}); "
                   f"data: {trainer.tokens.source}")
    for notice in trainer.notices:
        report.message(notice)
    if cfg.warmup_steps > cfg.steps:
        top = lr_at(cfg.steps - 1, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps, trainer.schedule)
        report.message(f"notice: --warmup-steps {cfg.warmup_steps} is more than --steps {cfg.steps}: the learning "
                       f"rate never reaches --lr {cfg.lr:g} (its last step trains at {top:.3g})")
    if resume:
        report.message(f"resuming from step {trainer.step} of {trainer.kept_path}")
    if changed:
        report.message(f"notice: resuming with other settings than the checkpoint's: {'; '.join(changed)}")


def _finish(report: Reporter, trainer: Trainer, code: int, signum: int | None, early: bool = False) -> TrainResult:
    """The run's last line; `early`: a signal came during the set-up, and no step was begun."""
    loss, val = trainer.last_loss, trainer.last_val_loss
    if early:
        kept = (f"{trainer.ckpt_path} still holds step {trainer.step}; continue with --resume" if trainer.step
                else "nothing was trained or saved")
        report.message(f"stopped by {signal.Signals(signum).name} before step {trainer.step + 1} began: {kept}")
    elif signum is not None:
        report.message(f"stopped by {signal.Signals(signum).name} after step {trainer.step}; checkpoint saved "
                       f"to {trainer.ckpt_path}; continue with --resume")
    elif trainer.step_ms:
        ms = statistics.median(trainer.step_ms[1:]) if len(trainer.step_ms) > 1 else None  # the first: a warm-up
        speed = (f", {ms:.1f} ms/step (median), {trainer.cfg.tokens_per_step / ms * 1000:,.0f} tokens/s"
                 + _per_gpu(trainer, ms) if ms is not None else
                 f", one step this session ({trainer.step_ms[0]:.1f} ms, a warm-up: no step timed apart from it)")
        report.message(_target_text(trainer) + f", loss {loss:.4f}"
                       + (f", val loss {val:.4f}" if val is not None and trainer.reached is None else "")
                       + speed + _between(trainer) + _wrote(trainer, "loss.png"))
    elif trainer.remeasured:
        report.message(_target_text(trainer) + (f", val loss {val:.4f}" if val is not None and trainer.reached is None
                                                else "") + f"; measured step {trainer.step} again, as a signal had "
                       "cut its measurements short" + _wrote(trainer))
    elif trainer.reached is not None:
        report.message(f"nothing to do: {trainer.ckpt_path} holds step {trainer.step}, whose validation loss "
                       f"{trainer.last_val_loss:.4f} already reached the target {trainer.cfg.target_val_loss:g}")
    else:
        report.message(f"nothing to do: {trainer.ckpt_path} already holds step {trainer.step} of {trainer.cfg.steps}")
    return TrainResult(code, trainer.step, loss, val, trainer.out)


def _wrote(trainer: Trainer, *more: str) -> str:
    """The done line's list of files written: the log, every checkpoint file this session wrote (ckpt.pt with its
    step where that is not the run's last: a run that saves nothing at its end), and `more`."""
    held = f" (step {trainer.saved_step})" if trainer.saved_step != trainer.step else ""
    saved = [name + held * (name == FILENAME) for name in (FILENAME, PREVIOUS, BEST) if name in trainer.written]
    return f"; wrote {trainer.out}/" + ", ".join(("log.jsonl", *saved, *more))


def _target_text(trainer: Trainer) -> str:
    """How the summary starts: the step it ended at and, with a target, whether and when it was reached."""
    target, got = trainer.cfg.target_val_loss, trainer.reached
    if target is None:
        return f"done: step {trainer.step}"
    if got is None:
        return f"done: step {trainer.step}, target val loss {target:g} not reached"
    since = f" since step {got['from_step']}" if got["from_step"] else ""
    warm = got["warmup_steps"]
    setup = trainer.engine.setup
    work = first_step_did(setup.compile, setup.cuda_graph and trainer.device.type == "cuda")
    does = f", which {work}" if work else ""
    return (f"done: val loss {trainer.last_val_loss:.4f} reached the target {target:g} at step {got['step']}: "
            f"{got['train_s']:.1f} s of training{since} (the timed steps; {got['warmup_s']:.1f} s more in {warm} "
            f"warm-up step{'s' if warm != 1 else ''}{does}), {got['wall_s']:.1f} s wall from the start, "
            f"{got['tokens']:,} tokens")


def _between(trainer: Trainer) -> str:
    """What this session spent between the steps, timed apart from them."""
    spent = [f"{kind} {s:.1f} s" for kind, s in trainer.clock.session_s.items() if s > 0]
    return f"; {', '.join(spent)} between the steps" if spent else ""


def _per_gpu(trainer: Trainer, ms: float) -> str:
    """Throughput per process and (on CUDA) this process's peak memory, for multi-GPU and big-model runs."""
    world = trainer.dist.world_size
    unit = "GPU" if trainer.device.type == "cuda" else "process"
    text = f" ({trainer.cfg.tokens_per_step / ms * 1000 / world:,.0f} per {unit})" if world > 1 else ""
    if trainer.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(trainer.device) / 2**30
        text += f", peak memory {peak:.1f} GiB" + (" per GPU (rank 0's)" if world > 1 else "")
    return text
