"""The profile: where one training step's time goes, by category, for each rung of the ladder.

Each rung (cumulative, as in `bench`) runs its warm-up steps, then `steps` steps under torch.profiler,
each step inside a marked range that ends after a synchronize. The time inside those ranges is split
into categories:

- on a GPU, by CUDA kernel time: every kernel (clipped to the step ranges) goes to the category of its
  name, and idle = step wall time minus the union of the busy kernel intervals (launch gaps, host
  overhead, the final synchronize);
- on a CPU, by the self time of each operator (time in the op, not in the ops it calls), and idle =
  step wall time minus those self times (Python and dispatch between operators).

Decisions about categories (the names are the rule table `RULES` below):
- A kernel counts as "matmul" by what it is, wherever it runs: the manual attention's two batched
  matmuls (QK^T and AV) are matmul, and its mask and softmax over the (T, T) scores are attention. A
  fused attention kernel (flash, memory-efficient, cuDNN) is all attention. So baseline -> flash moves
  time out of matmul *and* attention.
- Everything launched inside `optimizer.step()` (and zero_grad) is optimizer, whatever its name: on a
  CPU, AdamW is a loop of plain `aten::mul_`/`lerp_`/`sqrt` ops only its context identifies.
- Inductor's Triton kernels are classified by the fused op names in their generated names; a kernel
  that fuses only data movement (`_to_copy`, `clone`, `permute`...) is a copy, any other is elementwise
  unless it fuses a loss op (`_log_softmax`, `nll_loss`...) or attention's softmax.
- On a CPU, Inductor's C++ kernels are not recorded one by one; their time is the self time of the
  compiled graph's call, counted as elementwise (fused kernels; matmuls stay separate `aten::mm` calls).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType

from gpt2ladder import data as data_mod
from gpt2ladder import defaults
from gpt2ladder.data.files import atomic_path
from gpt2ladder.errors import LadderError
from gpt2ladder.ladder import setup_for, why_unavailable
from gpt2ladder.measure.harness import Row, climb, guarded, timed_step, tokens_for
from gpt2ladder.model.recipe import parse_recipe, with_recipe
from gpt2ladder.model.config import ModelConfig, check_run_shape, preset
from gpt2ladder.report.fd_filter import lines_dropped
from gpt2ladder.report.progress import progress_bar
from gpt2ladder.report.records import record_header
from gpt2ladder.runtime.engine import Engine, OptimConfig, compilations
from gpt2ladder.runtime.hardware import Capabilities

CATEGORIES = ("matmul", "attention", "elementwise", "loss", "optimizer", "copies", "other", "idle")
CATEGORY_LABELS = {"matmul": "matmul", "attention": "attention", "elementwise": "elementwise & norms",
                   "loss": "loss", "optimizer": "optimizer", "copies": "copies & transposes",
                   "other": "other", "idle": "idle"}
STEP_MARK = "gpt2ladder.step"
TOP_KERNELS = 40  # in profile.json; profile.md lists the first 5 per rung
_RUNTIME_CALL = re.compile(r"cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, ...

# Ops that only move or re-view data; a fused Triton kernel made of nothing else is a copy.
_DATA_OPS = ("embedding_dense_backward|embedding|_to_copy|copy|clone|transpose|permute|view|cat|stack|slice|"
             "select|index|expand|unsqueeze|squeeze|constant_pad_nd|split|\\d+")

# The first rule whose pattern occurs in the lower-cased name wins, so order matters: a fused kernel
# holding a loss op is loss before it is elementwise, fmha_cutlass is attention before cutlass is matmul.
RULES: tuple[tuple[str, str], ...] = (
    ("other", r"^autograd::|^[a-z0-9_]+backward\d*$"),  # autograd's own bookkeeping around each op
    ("loss", r"log_?softmax|nll_?loss|cross_?entropy|logsumexp|^_loss_|logit_grad"),
    ("attention", r"flash|fmha|sdpa|attention|softmax|masked_fill"),
    ("matmul", r"gemm|gemv|cutlass|cublas|xmma|nvjet|wgmma|triton_tem_|scaled_mm|"
               r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear)$"),
    # A multi-tensor copy outside optimizer.step() (the weight_cast rung's casts) moves data; inside it,
    # everything is optimizer by its context anyway.
    ("copies", r"_foreach_copy|copyfunctor"),
    ("optimizer", r"adam|multi_tensor_apply|_foreach|^optimizer\.|lpnorm"),
    ("copies", rf"^triton_[a-z]+_fused(_+({_DATA_OPS}))+$"),
    ("elementwise", r"^triton_|cpp_fused|compiledfxgraph"),  # every other fused kernel computes
    ("copies", r"copy|memcpy|memset|gpt2ladder_fill|transpose|permute|clone|contiguous|catarray|gather|scatter|"
               r"index|embedding|^aten::(cat|stack|t|view|reshape|_unsafe_view|as_strided|expand|slice|select|split|"
               r"unbind|unsqueeze|squeeze|narrow|detach|alias)$"),
    ("other", r"^aten::(empty|empty_strided|empty_like|resize_|item|_local_scalar_dense)$"),
    ("elementwise", r"layer_?norm|add_norm|colsum|gelu|tanh|elementwise|reduce_kernel|gammabeta|^aten::"),
)
_COMPILED_RULES = tuple((category, re.compile(pattern)) for category, pattern in RULES)


def categorize(kernel_name: str) -> str:
    """The category of a kernel or operator name, by the first matching rule; "other" if none."""
    name = kernel_name.lower()
    for category, pattern in _COMPILED_RULES:
        if pattern.search(name):
            return category
    return "other"


_D = defaults.library("profile")  # a config built without a value: what `profile` decides on a CPU


@dataclass(frozen=True)
class ProfileConfig:
    preset: str = _D["preset"]
    rungs: tuple[str, ...] = _D["rungs"]
    batch_size: int = _D["batch_size"]
    seq_len: int = _D["seq_len"]
    steps: int = _D["steps"]  # profiled steps per rung
    warmup: int = _D["warmup"]  # unprofiled steps first: compile, autotuning, allocator growth
    seed: int = _D["seed"]
    data: str | None = None  # a text file; None = Tiny Shakespeare (random tokens if unavailable)
    compile_backend: str = "inductor"
    trace_dir: str | None = None  # write a Chrome trace per rung here (trace-<rung>.json)
    last_only: bool = False  # profile only the top of the ladder: every named rung applied together
    model: ModelConfig | None = None  # the preset's shape; None: looked up here, once (the record's "model")
    recipe: str = "gpt2"  # what is trained (`model/recipe.py`); its model parts are set on `model`

    def __post_init__(self) -> None:
        if self.model is None:
            object.__setattr__(self, "model", preset(self.preset))  # frozen: set once, here
        object.__setattr__(self, "recipe", parse_recipe(self.recipe).name)
        object.__setattr__(self, "model", with_recipe(self.model, self.recipe))
        check_run_shape(self.model, self.preset, batch_size=self.batch_size, seq_len=self.seq_len, steps=self.steps,
                        warmup=self.warmup)

    def to_dict(self) -> dict:
        """The record's "config": every field but the shape, which the record keeps as "model"."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}


# --- attributing a profile --------------------------------------------------------------------------


def _under_optimizer(op) -> bool:
    """Whether a CPU op is, or runs inside, `optimizer.step()` / `zero_grad()`."""
    while op is not None:
        if op.name.startswith("Optimizer."):
            return True
        op = op.cpu_parent
    return False


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals (kernels on several streams overlap)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def _in_window(start: float, windows: list[tuple[float, float]]) -> bool:
    return any(w0 <= start <= w1 for w0, w1 in windows)


def launch_links(prof) -> dict[int, int]:
    """Device event id -> id of the CPU op that launched it, from the raw Kineto events.

    Read there because older torch (2.11, say) keeps the link off `FunctionEvent`.
    """
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        return {}
    return {k.correlation_id(): k.linked_correlation_id() for k in results.events()
            if k.device_type() == DeviceType.CUDA and k.linked_correlation_id() > 0}


def _is_annotation(event, links: dict[int, int]) -> bool:
    """A record_function range mirrored on the GPU timeline (the step marker, optimizer.step): not work.

    Older torch lacks the flag; there a device event that no CPU call launched is an annotation.
    """
    flag = getattr(event, "is_user_annotation", None)
    if flag is not None:
        return bool(flag)
    return bool(links) and event.id not in links


def device_items(events, windows, links: dict[int, int]) -> list[tuple[str, str, float, float]]:
    """(name, category, start, end) of every GPU kernel, memcpy and memset, clipped to the step ranges."""
    # CUDA runtime calls (cudaLaunchKernel...) number their events in another id space: ops only.
    ops = {e.id: e for e in events if e.device_type == DeviceType.CPU and not _RUNTIME_CALL.match(e.name)}
    items = []
    for e in events:
        if e.device_type != DeviceType.CUDA or _is_annotation(e, links):
            continue
        for w0, w1 in windows:
            s, t = max(e.time_range.start, w0), min(e.time_range.end, w1)
            if t > s:
                optim = e.id in links and _under_optimizer(ops.get(links[e.id]))
                items.append((e.name, "optimizer" if optim else categorize(e.name), s, t))
    return items


def host_items(events, windows) -> list[tuple[str, str, float]]:
    """(name, category, self time) of every CPU operator inside the step ranges, the marker excluded."""
    items = []
    for e in events:
        if e.device_type != DeviceType.CPU or e.name == STEP_MARK or e.is_async:
            continue
        if _in_window(e.time_range.start, windows):
            category = "optimizer" if _under_optimizer(e) else categorize(e.name)
            items.append((e.name, category, e.self_cpu_time_total))
    return items


def attribute(events, on_gpu: bool, steps: int, links: dict[int, int] | None = None) -> dict:
    """Milliseconds per step by category (idle included), and the kernels that took the most time."""
    # The marker's CPU ranges; it also appears on the GPU timeline, which must not count twice.
    windows = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.name == STEP_MARK and e.device_type == DeviceType.CPU)
    if not windows:
        raise LadderError("the profiler recorded no steps; is another profiler running?")
    wall = sum(w1 - w0 for w0, w1 in windows)
    if on_gpu:
        spans = device_items(events, windows, links or {})
        items = [(n, c, t - s) for n, c, s, t in spans]
        busy = _union_length([(s, t) for _, _, s, t in spans])
    else:
        items = host_items(events, windows)
        busy = sum(us for _, _, us in items)
    per_cat = dict.fromkeys(CATEGORIES, 0.0)
    for _, category, us in items:
        per_cat[category] += us
    per_cat["idle"] = max(0.0, wall - busy)
    ms = {c: v / 1000 / steps for c, v in per_cat.items()}
    return {"ms_per_step": wall / 1000 / steps, "categories_ms": ms, "busy_ms": busy / 1000 / steps,
            "top_kernels": top_kernels(items, wall, steps), "timed_by": "CUDA kernel time" if on_gpu
            else "CPU operator self time"}


def top_kernels(items, wall_us: float, steps: int, n: int = TOP_KERNELS) -> list[dict]:
    """The n (name, category) pairs that took the most time; one name can be optimizer and elsewhere."""
    totals: dict[tuple[str, str], list] = defaultdict(lambda: [0.0, 0])
    for name, category, us in items:
        totals[name, category][0] += us
        totals[name, category][1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": name, "category": cat, "ms_per_step": us / 1000 / steps, "calls_per_step": count / steps,
             "share": us / wall_us if wall_us else 0.0} for (name, cat), (us, count) in ranked]


# --- profiling the rungs ----------------------------------------------------------------------------


# The profiler's C++ library logs its start and stop straight to fd 2 ("USDT:2026-... profiler_stop"),
# past Python and past its own log-level settings.
KINETO_STARTS = (b"USDT", b"STAGE", b"INFO", b"WARNING")
KINETO_LINE = re.compile(rb"(USDT|STAGE|INFO|WARNING):?\S*\s*\d{4}-\d\d-\d\d [^\n]*\.cpp:\d+\][^\n]*\n")


def settled_steps(warmup: list[dict]) -> list[float]:
    """The warm-up steps an un-profiled step time may be taken from: the later half of those after the first
    step and after the last step that compiled or captured a graph. The first step is cold wherever it runs (on
    a CPU too: the allocator grows in it), and the first steps after a compile still grow the allocator."""
    last = max((i for i, step in enumerate(warmup) if step["compiled"]), default=0)
    after = [step["ms"] for step in warmup[last + 1:]]
    return after[len(after) // 2:]


def warm_up(engine: Engine, batches, device: torch.device, steps: int, bar) -> list[dict]:
    """`steps` un-profiled steps, each with its time and whether it compiled (or captured a CUDA graph)."""
    out = []
    for _ in range(steps):
        before = (compilations(), engine.captures)
        ms = timed_step(engine, batches, device)[0]
        out.append({"ms": ms, "compiled": (compilations(), engine.captures) != before})
        bar.update(1)
    return out


def profile_setup(setup, cfg: ProfileConfig, tokens, device: torch.device, label: str, progress: bool) -> dict:
    """Warm up, then profile `cfg.steps` steps of one setup; the attribution of their time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    engine = Engine(cfg.model, setup, device, seed=cfg.seed, compile_backend=cfg.compile_backend,
                    optim=OptimConfig.of(parse_recipe(cfg.recipe)))
    batches = data_mod.Batches(tokens.train, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    bar = progress_bar(cfg.warmup + cfg.steps, label, progress)
    warmup = warm_up(engine, batches, device, cfg.warmup, bar)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    clock_ms = []  # the same steps by the wall clock: an independent check of the profiler's total
    with lines_dropped(KINETO_LINE, KINETO_STARTS), profile(activities=activities) as prof:
        for _ in range(cfg.steps):
            clock_ms.append(timed_step(engine, batches, device, functools.partial(record_function, STEP_MARK))[0])
            bar.update(1)
    bar.close()
    del engine
    if cfg.trace_dir:
        with atomic_path(Path(cfg.trace_dir) / f"trace-{label}.json") as tmp:  # never through a link there
            prof.export_chrome_trace(str(tmp))
    result = attribute(prof.events(), device.type == "cuda", cfg.steps, launch_links(prof))
    # The profiler's own overhead inflates launch-bound steps; settled warm-up steps show by how much.
    settled = settled_steps(warmup)
    result["unprofiled_ms_per_step"] = statistics.median(settled) if settled else None
    result["unprofiled_steps"] = len(settled)
    result["warmup_steps"] = warmup
    result["clock_ms_per_step"] = statistics.fmean(clock_ms)
    return result


def profile_rung(row: Row, cfg: ProfileConfig, tokens, device, progress: bool) -> dict:
    """One row: the setup of `row.applied` profiled, or why it was not."""
    if row.reason:
        return row.skipped()
    setup = setup_for(list(row.applied))
    result = guarded(lambda: profile_setup(setup, cfg, tokens, device, row.name, progress), device, cfg.batch_size)
    return {**row.rung_fields(), **(top_fields(row) if cfg.last_only else {}), "applied": list(row.applied),
            "setup": setup.to_dict(), **result}


def top_fields(row: Row) -> dict:
    """--last-only's one row measures every rung applied together, not the last rung: it is named as the set
    (baseline..tied_grad), which the trace file keeps too."""
    if len(row.applied) < 2:
        return {}
    return {"name": f"{row.applied[0]}..{row.applied[-1]}",
            "summary": f"the top of the ladder here: {', '.join(row.applied)}, applied together"}


def run_profile(cfg: ProfileConfig, device: torch.device, progress: bool = True, notify=print, *,
                caps: Capabilities, tokens: data_mod.TokenData | None = None) -> dict:
    """Profile every rung in `cfg.rungs` (cumulatively) on `tokens` (default: `cfg.data`'s, read now) and
    return the self-describing record; `caps` is what the caller detected of the device."""
    tokens = tokens_for(cfg.data, cfg.seed, notify) if tokens is None else tokens
    data_mod.check_splits(tokens, cfg.seq_len, validate=False)  # one line now, not a failed row per rung
    rows = [profile_rung(row, cfg, tokens, device, progress)
            for row in climb(cfg.rungs, lambda name: why_unavailable(name, caps, recipe=parse_recipe(cfg.recipe)),
                                    cfg.last_only)]
    return {**record_header(caps, device), "command": "profile", "config": cfg.to_dict(),
            "model": cfg.model.to_dict(), "data": {"source": tokens.source, "n_tokens": tokens.n_tokens},
            "categories": {c: CATEGORY_LABELS[c] for c in CATEGORIES}, "rules": [list(r) for r in RULES],
            "rungs": rows}
