"""What the measuring commands tell people beyond their tables: the warning before a GPT-2-sized bench
on a CPU, why a bench or profile measured nothing at all, the rungs a command leaves out, and what a run's
first step did."""

from __future__ import annotations

from pathlib import Path

import torch

from gpt2ladder.errors import out_of_memory_advice
from gpt2ladder.ladder import declined_by_recipe
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.recipe import Recipe, parse_recipe
from gpt2ladder.model.setup import Setup
from gpt2ladder.runtime.hardware import Capabilities, matmul_rate
from gpt2ladder.runtime.memory import parameters
from gpt2ladder.runtime.metrics import flops_per_token


def first_step_work(compiles: bool, captures: bool) -> str | None:
    """What a session's first step, left out of the training time, paid for: "compile and capture", "compile" or
    "capture"; None where it did neither (a warm-up alone, as on a CPU without compile)."""
    return {(True, True): "compile and capture", (True, False): "compile", (False, True): "capture"}.get(
        (compiles, captures))


def left_out(name: str, why: str) -> str:
    """The notice for a rung a command leaves out, and why: one a --rungs list names, or one of `auto`'s."""
    return f"notice: leaving out rung {name}: {why}"


def recipe_left_out(spec: str, caps: Capabilities, recipe: str | Recipe, strategy: str | None = None) -> list[str]:
    """Under --rungs auto, a notice for each rung of the gpt2 recipe's `auto` (what `doctor` recommends) that this
    recipe leaves out, worded as for a list that names it, so that none goes without a word; none for another
    --rungs."""
    if spec != "auto":
        return []
    recipe = parse_recipe(recipe) if isinstance(recipe, str) else recipe
    return [left_out(name, why) for name, why in declined_by_recipe(caps, strategy, recipe).items()]


def first_step_did(compiles: bool, captures: bool) -> str | None:
    """`first_step_work` as what a run's warm-up steps did, which reads right after one step or several:
    "compiled and captured", "compiled" or "captured"; None where they did neither."""
    work = first_step_work(compiles, captures)
    return work and work.replace("compile", "compiled").replace("capture", "captured")


def cpu_warning(model_cfg: ModelConfig, cfg, n_rungs: int, rate: float | None = None) -> str:
    """A notice before a GPT-2-sized bench on a CPU: how long it takes at least, from this CPU's matmul rate."""
    rate = matmul_rate(torch.device("cpu")) if rate is None else rate
    n_params = parameters(model_cfg, Setup()) - model_cfg.block_size * model_cfg.n_embd  # without wpe, as MFU counts
    flops = flops_per_token(model_cfg, cfg.seq_len, n_params) * cfg.batch_size * cfg.seq_len
    seconds = flops / rate * (cfg.steps + cfg.warmup) * n_rungs
    return (f"notice: {cfg.preset} on a CPU: one step of batch {cfg.batch_size} x {cfg.seq_len} is "
            f"{flops / 1e12:.1f} TFLOP; at this CPU's fp32 matmul rate ({rate / 1e9:.0f} GFLOP/s, measured now) "
            f"the {(cfg.steps + cfg.warmup) * n_rungs} steps of this ladder take at least {_duration(seconds)}; "
            "--preset tiny runs the same ladder in about a minute")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def nothing_measured(record: dict, where: Path, *, auto_batch: bool = False) -> str | None:
    """Why a bench or profile ran no rung at all (exit 1, its files still written), or None when one ran.
    `auto_batch`: the command takes `--batch-size auto` (bench), so the advice may name it."""
    rows = record["rungs"]
    if any(r["status"] == "ok" for r in rows):
        return None
    tried = [r for r in rows if r["status"] != "skipped"]
    if tried and all(r["status"] == "oom" for r in tried):
        batch = record["config"]["batch_size"]
        advice = out_of_memory_advice(batch, auto_batch=auto_batch)
        return f"every rung ran out of memory at batch size {batch}; {advice} (rows in {where})"
    first = (tried or rows)[0]
    return f"no rung could be measured: {first['name']} {first['status']}: {first['reason']} (rows in {where})"
