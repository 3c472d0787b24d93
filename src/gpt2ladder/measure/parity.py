"""Parity: show that every rung of the ladder trains to the loss the fp32 baseline reaches.

Every rung trains for the same number of steps from the same initial weights (`build_model` with one
seed gives identical numbers, padded vocabulary or not) on the same batches, with the same AdamW and
learning-rate schedule; only the setup differs. The fp32 baseline also trains `seeds` times with
different seeds for both the initial weights and the data order: how far apart those runs end is the
ordinary run-to-run variation (the spread), the yardstick a rung's gap is measured against.

Verdict per rung: PASS when |val_rung - val_base| <= min(max(spread, floor x val_base), tolerance x val_base).
The floor keeps two baseline runs that happen to land close together from failing honest rungs; the
tolerance caps the allowance however noisy the baseline is.

Validation runs the rung's weights through the eager model (`engine.raw_model`) under the rung's
precision and autocast: the train loss already measures the rung's own (maybe compiled) forward, and
an eager eval spares every compiled rung a second compile for the no-grad graph.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder import defaults
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.ladder import RUNGS_BY_NAME, setup_for, why_unavailable
from gpt2ladder.measure.harness import Row, climb, guarded
from gpt2ladder.model.recipe import WSD_DECAY_FRACTION, parse_recipe, with_recipe
from gpt2ladder.model.config import ModelConfig, preset
from gpt2ladder.report.progress import on_terminal, progress_bar
from gpt2ladder.report.records import record_header
from gpt2ladder.runtime.engine import Engine, OptimConfig
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.model.setup import Setup
from gpt2ladder.training.schedule import lr_at, momentum_at

MIN_LR_FRACTION = 0.1  # the cosine decays to lr/10, as nanoGPT does
GRAD_CLIP = defaults.GRAD_CLIP  # every run clips, as a training run does
MAX_SEEDS = 100  # the run list is built up front: a huge --seeds would fill the memory, not fail in one line
MAX_EVAL_BATCHES = 10_000  # on the device for the whole command


_D = defaults.library("parity")  # a config built without a value: what `parity` decides on a CPU


@dataclass(frozen=True)
class ParityConfig:
    preset: str = _D["preset"]
    rungs: tuple[str, ...] = _D["rungs"]
    batch_size: int = _D["batch_size"]  # sequences per optimizer step
    micro_batch: int | None = None  # sequences per forward pass (gradient accumulation); None: batch_size
    seq_len: int = _D["seq_len"]
    steps: int = _D["steps"]
    seeds: int = _D["seeds"]  # fp32 baseline runs (seed, seed+1, ...) whose spread is the yardstick
    tolerance: float = _D["tolerance"]  # the largest relative val-loss gap ever accepted
    floor: float = _D["floor"]  # the smallest relative gap always accepted (inside the tolerance)
    lr: float = _D["lr"]
    warmup_steps: int | None = None  # None: 5% of the steps
    eval_every: int | None = None  # None: a tenth of the steps
    eval_batches: int = _D["eval_batches"]
    seed: int = _D["seed"]  # the reference seed: every rung starts from these weights and sees these batches
    data: str | None = None  # a text file; None = Tiny Shakespeare
    compile_backend: str = "inductor"
    model: ModelConfig | None = None  # the preset's shape; None: looked up here, once (the record's "model")
    recipe: str = "gpt2"  # what is trained (`model/recipe.py`); its model parts are set on `model`

    def __post_init__(self) -> None:
        if self.model is None:
            object.__setattr__(self, "model", preset(self.preset))  # frozen: set once, here
        object.__setattr__(self, "recipe", parse_recipe(self.recipe).name)
        object.__setattr__(self, "model", with_recipe(self.model, self.recipe))
        if self.micro_batch is not None and (self.micro_batch <= 0 or self.batch_size % self.micro_batch):
            raise UsageError(f"the micro-batch {self.micro_batch} must divide --batch-size {self.batch_size}")
        for name in ("batch_size", "seq_len", "steps", "eval_batches"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if not 2 <= self.seeds <= MAX_SEEDS:
            raise UsageError(f"--seeds must be from 2 (the spread needs two baseline runs) to {MAX_SEEDS} (each is "
                             f"a training run), got {self.seeds}")
        if self.eval_batches > MAX_EVAL_BATCHES:
            raise UsageError(f"--eval-batches is at most {MAX_EVAL_BATCHES:,} (they are kept on the device for the "
                             f"whole command), got {self.eval_batches}")
        if not 0 < self.tolerance < 1:
            raise UsageError(f"--tolerance is a fraction between 0 and 1 (0.02 = 2%), got {self.tolerance}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UsageError(f"--lr must be a finite positive number, got {self.lr}")
        if self.eval_every is not None and self.eval_every <= 0:
            raise UsageError(f"--eval-every must be a positive integer, got {self.eval_every}")
        if self.seq_len > self.model.block_size:
            raise UsageError(f"--seq-len {self.seq_len} exceeds the {self.preset} block size of "
                             f"{self.model.block_size}")

    def to_dict(self) -> dict:
        """The record's (and a shard's) "config": every field but the shape, which the record keeps as "model"."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}

    @property
    def micro(self) -> int:
        return self.micro_batch or self.batch_size

    @property
    def n_warmup(self) -> int:
        return max(1, self.steps // 20) if self.warmup_steps is None else self.warmup_steps

    @property
    def eval_interval(self) -> int:
        return self.eval_every or max(1, self.steps // 10)


@dataclass(frozen=True)
class _Context:
    """What every training run of one parity command shares."""

    cfg: ParityConfig
    tokens: data_mod.TokenData
    evals: list  # fixed validation batches, already on the device
    device: torch.device
    progress: bool


# --- the rule ---------------------------------------------------------------------------------------


def allowed_gap(base_val: float, spread: float, tolerance: float, floor: float) -> float:
    """The largest |val_rung - val_base| that passes: the spread, at least the floor, at most the tolerance."""
    return min(max(spread, floor * base_val), tolerance * base_val)


def verdict(val: float, base_val: float, spread: float, tolerance: float, floor: float) -> bool:
    """PASS (True) when the rung's final val loss is within the allowed gap of the baseline's."""
    if not (math.isfinite(val) and math.isfinite(base_val)):
        return False
    return abs(val - base_val) <= allowed_gap(base_val, spread, tolerance, floor)


def rule_text(cfg: ParityConfig) -> str:
    return (f"PASS when |val_rung - val_base| <= min(max(spread, {cfg.floor:.1%} of val_base), "
            f"{cfg.tolerance:.1%} of val_base); spread = the largest difference of final val loss among "
            f"{cfg.seeds} fp32 baseline runs with seeds {cfg.seed}..{cfg.seed + cfg.seeds - 1} "
            "(initial weights and data order)")


def final_train_loss(losses: list[float]) -> float:
    """Mean of the last 10% of steps (at least one), so a single noisy batch does not decide."""
    tail = losses[-max(1, round(len(losses) * 0.1)):]
    return sum(tail) / len(tail)


# --- training one run -------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(engine: Engine, evals: list) -> float:
    """Mean loss over the fixed validation batches, eager, under the rung's precision and autocast."""
    model = engine.raw_model
    model.eval()
    try:
        with engine.precision(), engine.autocast():
            losses = [model(x, y)[1].float() for x, y in evals]
    finally:
        model.train()
    return float(torch.stack(losses).mean())


def train_run(setup: Setup, seed: int, ctx: _Context, label: str) -> dict:
    """Train one setup from `seed`'s weights on `seed`'s batches; the losses as plain floats."""
    cfg = ctx.cfg
    engine = Engine(cfg.model, setup, ctx.device, seed=seed, compile_backend=cfg.compile_backend,
                    optim=_optim(cfg))
    batches = data_mod.Batches(ctx.tokens.train, cfg.batch_size, cfg.seq_len, seed=seed)
    val = [[0, evaluate(engine, ctx.evals)]]
    losses = []  # device tensors: read back once at the end, not one host sync per step
    bar = progress_bar(cfg.steps, label, ctx.progress)
    for step in range(cfg.steps):
        engine.set_lr(lr_at(step, cfg.lr, cfg.lr * MIN_LR_FRACTION, cfg.n_warmup, cfg.steps,
                            parse_recipe(cfg.recipe).schedule))
        if engine.optim_cfg.momentum_warmup:
            engine.set_momentum(momentum_at(step))
        x, y = batches.next()
        if cfg.micro != cfg.batch_size:  # (accumulation steps, micro-batch, T): one optimizer step
            x, y = (t.view(-1, cfg.micro, cfg.seq_len) for t in (x, y))
        losses.append(engine.step(*data_mod.to_device(x, y, ctx.device)))
        if (step + 1) % cfg.eval_interval == 0 or step + 1 == cfg.steps:
            val.append([step + 1, evaluate(engine, ctx.evals)])
            bar.set_postfix_str(f"val {val[-1][1]:.4f}")
        bar.update(1)
    bar.close()
    train = torch.stack(losses).float().cpu().tolist()
    del engine
    return {"seed": seed, "first_loss": train[0], "final_train": final_train_loss(train),
            "final_val": val[-1][1], "train_loss": train, "val": val}


# --- the ladder -------------------------------------------------------------------------------------


def _rows(cfg: ParityConfig, why_not) -> list[Row]:
    return climb(cfg.rungs, why_not)


def _trains(row: Row) -> bool:
    """Whether a row needs a training run of its own: the baseline rung is the seed-0 baseline run."""
    return row.reason is None and setup_for(list(row.applied)) != Setup()


def unit_ids(cfg: ParityConfig, skipped: dict[str, str]) -> list[str]:
    """The ids of the runs a report on `cfg` needs, given the rungs the machine that ran them skipped."""
    return ([f"baseline-seed{cfg.seed + i}" for i in range(cfg.seeds)]
            + [r.name for r in _rows(cfg, skipped.get) if _trains(r)])


def work_units(cfg: ParityConfig, caps) -> tuple[list[dict], dict[str, str]]:
    """Every training run the report needs, in a fixed order, and the rungs this machine skips (why).

    Units are the fp32 baseline at each seed, then each runnable rung, cumulative like `bench`
    (rung k = every runnable rung up to k). Each unit is independent, so `--shard K/N` can spread them
    over several GPUs.
    """
    rows = _rows(cfg, lambda name: why_unavailable(name, caps, recipe=parse_recipe(cfg.recipe)))
    units = [{"id": f"baseline-seed{cfg.seed + i}", "setup": Setup(), "seed": cfg.seed + i,
              "label": f"fp32 seed {cfg.seed + i}"} for i in range(cfg.seeds)]
    units += [{"id": r.name, "setup": setup_for(list(r.applied)), "seed": cfg.seed, "label": r.name}
              for r in rows if _trains(r)]
    return units, {r.name: r.reason for r in rows if r.reason}


def run_units(ctx: _Context, units: list[dict]) -> dict[str, dict]:
    """Each unit's run; off a terminal (where no bar shows), one line as each finishes."""
    results, lines = {}, ctx.progress and not on_terminal()
    for i, u in enumerate(units, 1):
        started = time.perf_counter()
        results[u["id"]] = guarded(lambda u=u: train_run(u["setup"], u["seed"], ctx, u["label"]), ctx.device,
                                   ctx.cfg.micro)
        if lines:
            print(f"parity: {i}/{len(units)} {u['label']}: {_outcome(results[u['id']])}, "
                   f"{time.perf_counter() - started:.0f} s", flush=True)
    return results


def _outcome(result: dict) -> str:
    if result["status"] != "ok":
        return f"{result['status']} ({result.get('reason', '')})"[:120]
    return f"final val loss {result['final_val']:.4f}"


def assemble(cfg: ParityConfig, results: dict[str, dict], skipped: dict[str, str]) -> dict:
    """The report from the units' results: baseline runs, spread, one judged row per rung."""
    runs = []
    for i in range(cfg.seeds):
        seed = cfg.seed + i
        run = results.get(f"baseline-seed{seed}", {"status": "failed", "reason": "was not run (a shard is missing)"})
        if run["status"] != "ok":
            raise LadderError(f"the fp32 baseline (seed {seed}) failed, so there is nothing to compare "
                              f"against: {run['reason']}")
        runs.append(run)
    reference = runs[0]
    vals = [r["final_val"] for r in runs]
    spread = max(vals) - min(vals)  # the largest |difference| between any two baseline runs
    missing = {"status": "failed", "reason": "was not run (a shard is missing)"}
    rows = []
    for row in _rows(cfg, skipped.get):
        if row.reason:
            rows.append(skipped_row(row, cfg.recipe))
            continue
        setup = setup_for(list(row.applied))
        result = results.get(row.name, missing) if _trains(row) else reference
        rows.append({**row.rung_fields(), "applied": list(row.applied), "setup": setup.to_dict(), **result})
    judge(rows, reference, spread, cfg)
    allowed = allowed_gap(reference["final_val"], spread, cfg.tolerance, cfg.floor)
    rule = {"text": rule_text(cfg), "spread": spread, "floor": cfg.floor, "tolerance": cfg.tolerance,
            "baseline_val": reference["final_val"], "allowed_abs": allowed,
            "allowed_rel": allowed / reference["final_val"]}
    passed = all(r.get("verdict") == "PASS" for r in rows if r["status"] != "skipped")
    return {"command": "parity", "config": cfg.to_dict(), "schedule": _schedule(cfg),
            "model": cfg.model.to_dict(), "rule": rule, "baseline_runs": runs, "rungs": rows,
            "passed": passed}


def skipped_row(row: Row, recipe: str) -> dict:
    """A rung that did not run, with `skipped_by`: "recipe" where the recipe leaves it out (its reason is the rung's
    own for this recipe: no machine would run it), else "machine"."""
    by = "recipe" if row.reason == RUNGS_BY_NAME[row.name].declines(parse_recipe(recipe)) else "machine"
    return {**row.skipped(), "skipped_by": by}


def judge(rows: list[dict], reference: dict, spread: float, cfg: ParityConfig) -> None:
    """Add the gaps to the reference and the verdict to every row that trained."""
    base_val, base_train = reference["final_val"], reference["final_train"]
    for row in rows:
        if row["status"] != "ok":
            continue
        row["train_diff"] = row["final_train"] - base_train
        row["train_rel"] = row["train_diff"] / base_train
        row["val_diff"] = row["final_val"] - base_val
        row["val_rel"] = row["val_diff"] / base_val
        row["first_loss_diff"] = row["first_loss"] - reference["first_loss"]
        ok = verdict(row["final_val"], base_val, spread, cfg.tolerance, cfg.floor)
        row["verdict"] = "PASS" if ok else "FAIL"


def parity_tokens(cfg: ParityConfig) -> data_mod.TokenData:
    """The text every run trains and validates on, long enough for both splits; never random tokens
    (a loss on noise shows nothing), so a text that cannot be had is the error."""
    tokens = data_mod.load_tokens(Path(cfg.data) if cfg.data else None)
    data_mod.check_splits(tokens, cfg.seq_len, validate=True)
    return tokens


def _context(cfg: ParityConfig, tokens: data_mod.TokenData, device: torch.device, progress: bool) -> _Context:
    # Built at the step's batch size and cut to the micro-batch: the same validation data on any card.
    full = data_mod.eval_batches(tokens.val, cfg.batch_size, cfg.seq_len, cfg.eval_batches)
    evals = [data_mod.to_device(x, y, device) for x, y in data_mod.micro_batches(full, cfg.micro)]
    return _Context(cfg, tokens, evals, device, progress)


def run_parity(cfg: ParityConfig, device: torch.device, progress: bool = True,
               shard: tuple[int, int] = (0, 1), *, caps: Capabilities,
               tokens: data_mod.TokenData | None = None) -> dict:
    """Train the baseline seeds and every rung (or shard k of n of those runs) on `tokens` (default:
    `parity_tokens(cfg)`); the record. `caps` is what the caller detected of the device.

    With n > 1 the record holds this shard's raw results only; `merge_shards` makes the report.
    """
    tokens = parity_tokens(cfg) if tokens is None else tokens
    ctx = _context(cfg, tokens, device, progress)
    units, skipped = work_units(cfg, caps)
    k, n = shard
    results = run_units(ctx, units[k::n])
    header = {**record_header(caps, device),
              "data": {"source": tokens.source, "sha256": tokens.sha256, "n_tokens": tokens.n_tokens}}
    if n > 1:
        return {**header, "command": "parity-shard", "shard": [k, n], "config": cfg.to_dict(),
                "skipped": skipped, "results": results}
    return {**header, **assemble(cfg, results, skipped)}


def merge_shards(shards: list[dict]) -> dict:
    """One report from parity shard records (shards may come from several GPUs and commands).

    The shards must share every setting but the rung path, and each shard's path up to the last rung it ran must
    be the start of the longest such path: a rung's run then trains the same setup whichever command ran it, so a
    later command can add rungs to an earlier one's runs (its fp32 baselines, for one) instead of repeating them,
    and the rungs a shard's path names after its own runs (which its runs never trained) do not matter.
    """
    def settings(s: dict) -> str:
        # The micro-batch only splits the same step over accumulation: shards of cards of any size merge.
        return json.dumps({k: v for k, v in s["config"].items() if k not in ("rungs", "micro_batch")}, sort_keys=True)

    if len({settings(s) for s in shards}) != 1:
        raise UsageError("the parity shards were run with different settings; merge shards of one configuration")
    longest = _merged_path(shards)
    results: dict[str, dict] = {}
    for s in shards:
        for uid, r in s["results"].items():
            if uid in results:
                raise UsageError(f"the parity run {uid!r} is in more than one shard; merge one of them")
            results[uid] = r
    cfg = ParityConfig(**{**{k: tuple(v) if isinstance(v, list) else v for k, v in shards[0]["config"].items()},
                          "rungs": tuple(longest)})
    skipped = {k: v for s in shards for k, v in s["skipped"].items()}
    missing = [uid for uid in unit_ids(cfg, skipped) if uid not in results]
    if missing:
        raise UsageError(f"parity runs missing from the shards: {', '.join(missing)}; run the shards that hold them")
    header = {k: v for k, v in shards[0].items() if k not in ("command", "shard", "config", "skipped", "results")}
    header["devices"] = sorted({s["device"]["name"] for s in shards})
    header["shards"] = [{"shard": s["shard"], "git_sha": s.get("git_sha"), "rungs": list(s["config"]["rungs"]),
                         "runs": sorted(s["results"])} for s in shards]
    return {**header, **assemble(cfg, results, skipped)}


def _merged_path(shards: list[dict]) -> list[str]:
    """The rung path of the merged report: the longest of the shards' paths that starts with every shard's path up to
    the last rung it ran (so a rung named but run by no shard is missing, not dropped); a UsageError where none does."""
    def ran(shard: dict) -> list[str]:
        rungs = list(shard["config"]["rungs"])
        done = [i for i, name in enumerate(rungs) if name in shard["results"]]
        return rungs[:max(done) + 1] if done else []

    used = [ran(s) for s in shards]
    fits = [list(s["config"]["rungs"]) for s in shards]
    fits = [p for p in fits if all(p[:len(u)] == u for u in used)]
    longest = max(fits, key=len, default=None)
    if longest is None or any(p != longest[:len(p)] for p in fits):
        raise UsageError("the parity shards follow different rung paths; each must be the start of the longest")
    return longest


def _optim(cfg: ParityConfig) -> OptimConfig:
    return OptimConfig.of(parse_recipe(cfg.recipe), lr=cfg.lr, grad_clip=GRAD_CLIP)


def _decay_text(schedule: str) -> str:
    """How the rate decays after warm-up, in words: the recipe's schedule (`training/schedule.py`)."""
    if schedule == "wsd":
        return (f"held at lr, then linear to {MIN_LR_FRACTION:g} x lr over the last {WSD_DECAY_FRACTION:g} of the "
                "steps (wsd)")
    return f"cosine to {MIN_LR_FRACTION:g} x lr at the last step"


def _schedule(cfg: ParityConfig) -> dict:
    return {"optimizer": dataclasses.asdict(_optim(cfg)),
            "warmup_steps": cfg.n_warmup, "decay": _decay_text(parse_recipe(cfg.recipe).schedule),
            "eval_every": cfg.eval_interval, "eval_batches": cfg.eval_batches,
            "final_train_loss": "mean of the last 10% of steps"}
