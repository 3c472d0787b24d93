"""The doctor: what this machine can run, why not, and which rungs `--rungs auto` will climb.

Every decision here is a pure function of a `hardware.Capabilities` record (detection lives in
runtime/hardware.py, rung availability in ladder.py), so simulated machines test it on a CPU. The rungs it
recommends are `ladder.available_rungs`, the very list `--rungs auto` uses.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpt2ladder.data.text import cache_dir
from gpt2ladder.errors import LadderError
from gpt2ladder.ladder import LADDER, available_rungs, setup_for, why_unavailable
from gpt2ladder.measure.batch import plan_training
from gpt2ladder.measure.race import RACE_RUNGS, race_rungs, recipe_problem, step_rungs_for
from gpt2ladder.model.config import preset
from gpt2ladder.model.recipe import PARTS_BY_NAME
from gpt2ladder.runtime.hardware import SDPA_BACKENDS, Capabilities
from gpt2ladder.runtime.memory import GiB, step_memory

SDPA_LABELS = {"flash": "flash", "mem_efficient": "memory-efficient", "cudnn": "cuDNN", "math": "math"}


@dataclass(frozen=True)
class Check:
    key: str  # stable name for scripts, e.g. "tf32"
    label: str  # what a person reads, e.g. "TF32"
    usable: bool | None  # None: not known (attention kernels that were not probed)
    reason: str  # one line: why it cannot run, or what it gives here


def recommended_rungs(caps: Capabilities) -> list[str]:
    """The rungs `--rungs auto` climbs on this machine (one decision, made in ladder.py)."""
    return available_rungs(caps)


def _from_rung(key: str, label: str, rung: str, caps: Capabilities, ok: str) -> Check:
    reason = why_unavailable(rung, caps)
    return Check(key, label, reason is None, reason or ok)


def _fp16(caps: Capabilities) -> Check:
    label = "fp16 + GradScaler"
    if caps.device_type != "cuda":
        return Check("fp16", label, False, why_unavailable("fp16", caps))
    if caps.bf16_supported:
        return Check("fp16", label, True, "works, but the ladder uses bf16 here: same speed, no GradScaler to manage")
    return Check("fp16", label, True, f"{caps.name} has no bfloat16 (compute capability {caps.capability_text} < 8.0): "
                 "the fp16 rung runs float16 autocast with a GradScaler instead")


def _compile(caps: Capabilities) -> Check:
    if caps.compile_problem:
        return Check("compile", "torch.compile", False, caps.compile_problem)
    if caps.device_type == "cuda":
        triton = "triton-windows" if caps.os == "Windows" else "Triton"
        how = f"Inductor generates {triton} {caps.triton_version} kernels"
    elif caps.device_type == "cpu":
        how = f"Inductor compiles C++ kernels with {caps.cxx_compiler or 'the system C++ compiler'}"
    else:
        how = f"Inductor generates kernels for {caps.device_type} (newer and less tested than CUDA)"
    return Check("compile", "torch.compile", True, how)


def feature_checks(caps: Capabilities) -> list[Check]:
    """Each speed-up technology: usable here or not, with a one-line reason."""
    cc = caps.capability_text
    return [
        _from_rung("tf32", "TF32", "tf32", caps, f"fp32 matmuls can run on the tensor cores (compute capability {cc})"),
        _from_rung("bf16", "bf16", "bf16", caps, "bfloat16 autocast on the tensor cores; fp32's range, no GradScaler"),
        _fp16(caps),
        _from_rung("fp8", "FP8", "fp8_head", caps, f"float8 matmuls (torch._scaled_mm) on compute capability {cc}"),
        _compile(caps),
        _from_rung("cuda_graphs", "CUDA graphs", "cuda_graph", caps, "a whole step can be captured once and replayed"),
    ]


def sdpa_checks(caps: Capabilities) -> list[Check]:
    """Each scaled_dot_product_attention kernel, from the probe `detect(..., probe=True)` ran."""
    probed = dict(caps.sdpa)
    checks = []
    for key in SDPA_BACKENDS:
        if key not in probed:
            checks.append(Check(key, SDPA_LABELS[key], None, "not probed"))
        else:
            problem = probed[key]
            checks.append(Check(key, SDPA_LABELS[key], problem is None, problem or "ran a forward and backward here"))
    return checks


def rung_checks(caps: Capabilities) -> list[Check]:
    checks = []
    for rung in LADDER:
        reason = rung.unavailable(caps)
        checks.append(Check(rung.name, rung.name, reason is None, reason or rung.summary))
    return checks


def race_checks(caps: Capabilities) -> list[Check]:
    """Each rung of `gpt2ladder race`: whether this torch and device can train its recipe, and the step rungs it
    climbs here, or why not."""
    checks = []
    for name, recipe in race_rungs(RACE_RUNGS):
        problem = recipe_problem(recipe, caps)
        what = "GPT-2" if name == "gpt2" else f"+ {name}" if name in PARTS_BY_NAME else f"recipe {recipe}"
        steps = ",".join(step_rungs_for(recipe, caps))
        checks.append(Check(name, name, problem is None, problem or f"{what}, on step rungs {steps}"))
    return checks


def memory_plan(caps: Capabilities, preset_name: str = "gpt2", batch: int = 16) -> dict | None:
    """On a GPU: for each rung of `auto` (cumulative), the largest batch of the preset's block size that
    fits this card's memory (the estimate of `runtime/memory.py`, not probed), and the micro-batch,
    accumulation and CUDA graph `train` would use for its default step of `batch` sequences
    (`plan_training`). None off CUDA."""
    if caps.device_type != "cuda" or not caps.usable_memory:
        return None
    cfg = preset(preset_name)
    rungs, applied = {}, []
    for name in available_rungs(caps):
        applied.append(name)
        est = step_memory(cfg, setup_for(applied), cfg.block_size)
        rungs[name] = {"largest_batch": est.largest_batch(caps.usable_memory),
                       "gib_per_sequence": round(est.per_sequence / GiB, 3)}
    micro, left_out = 0, False
    if applied:
        with contextlib.suppress(LadderError):  # nothing fits: said so below
            kept, plan, _ = plan_training(cfg, tuple(applied), cfg.block_size, caps, None, batch, validates=True,
                                          graph_only_too=True, probe=False)
            micro, left_out = plan.batch, "cuda_graph" in applied and "cuda_graph" not in kept
    return {"preset": preset_name, "seq_len": cfg.block_size, "memory_bytes": caps.usable_memory,
            "capped": bool(caps.memory_cap), "rungs": rungs,
            "train": {"micro_batch": micro, "accumulation": batch // micro if micro else None,
                      "tokens_per_step": batch * cfg.block_size, "cuda_graph_left_out": left_out}}


def data_disk(folder: Path | None = None) -> dict:
    """Free space where token caches go (`data.cache_dir()`, or `folder`), measured on the nearest folder
    that exists, since the cache may not have been made yet."""
    folder = Path(folder or cache_dir())
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return {"path": str(folder), "free_bytes": usage.free, "total_bytes": usage.total}


def diagnose(caps: Capabilities, disk: dict | None = None) -> dict:
    """The whole report as plain data: what `--json` prints (`disk`: `data_disk()`, when measured)."""
    def table(checks: list[Check]) -> dict:
        return {c.key: {"label": c.label, "usable": c.usable, "reason": c.reason} for c in checks}

    return {
        "device": {"type": caps.device_type, "name": caps.name,
                   "capability": list(caps.capability) if caps.device_type == "cuda" else None,
                   "capability_text": caps.capability_text,
                   "memory_bytes": caps.total_memory or None, "host_memory_bytes": caps.host_memory or None},
        "os": caps.os,
        "versions": {"python": caps.python_version, "torch": caps.torch_version, "cuda": caps.cuda_version,
                     "cudnn": cudnn_text(caps.cudnn_version), "triton": caps.triton_version},
        "features": table(feature_checks(caps)),
        "sdpa": {"probe": caps.sdpa_probe or None, "backends": table(sdpa_checks(caps))},
        "rungs": table(rung_checks(caps)),
        "recommended_rungs": recommended_rungs(caps),
        "race": table(race_checks(caps)),
        "memory": memory_plan(caps),
        "data_cache": disk,
    }


def cudnn_text(version: int | None) -> str | None:
    """cuDNN's integer version as major.minor.patch (cuDNN 9 packs it differently from cuDNN 8)."""
    if not version:
        return None
    if version >= 90000:
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"
