"""The one table of per-device defaults: what each command runs when a flag is not given.

On a CUDA GPU the write-up's run: GPT-2 124M at batch 16 x 1024 tokens. Anywhere else (a CPU, Apple's
MPS) the tiny preset, so every command finishes in minutes on a laptop. A `seq_len` of None means the
preset's block size. `--help` texts are written from this table, so they cannot disagree with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the CLI reads this table for --help without importing torch
    import torch

# Read by `bench`, `train`, `parity`, `profile` and `race` only: lets CPU tests run the compile rung with backend
# "eager" (seconds, not minutes). Not a user setting; the default is Inductor, the backend the rung is about.
COMPILE_BACKEND_ENV = "GPT2LADDER_COMPILE_BACKEND"

# Why each command's rungs default differs (said in its --help too): bench climbs the write-up's five ("seed"),
# the ladder its published tables and golden outputs compare; train runs as fast as this machine allows
# ("auto"); parity and profile cover every rung on a GPU ("all": each checked, or said why it cannot run),
# and off one only rungs that run there: most rungs need CUDA, and a list of them skipped says nothing new
# (parity there climbs the write-up's rungs only, each compiled rung costing a compilation of its own).
RUNGS_WHY = {
    "bench": "the write-up's five, the ladder its published tables compare",
    "train": "as fast as this machine allows",
    "parity": "on a GPU every rung is checked or said why not; on CPU the write-up's rungs that run there, as "
              "each compiled rung's run compiles for about half a minute",
    "profile": "on a GPU every rung is profiled or said why not; elsewhere most rungs need CUDA",
}

DEFAULTS: dict[str, dict[str, dict]] = {
    "bench": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 20, "warmup": 5},
              "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 128, "steps": 10, "warmup": 3}},
    "train": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 1000},
              "cpu": {"preset": "tiny", "batch_size": 8, "seq_len": 128, "steps": 200},
              # The same on every device. A resumed run keeps its own values instead (commands/train.py).
              "any": {"rungs": "auto", "lr": 6e-4, "weight_decay": 0.1, "grad_clip": 1.0, "eval_batches": 20,
                      "seed": 0}},
    "parity": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 300, "rungs": "all"},
               "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 64, "steps": 60,
                       "rungs": "baseline,compile,flash,vocab"}},
    # A CPU races the tiny preset on short steps at a higher rate, so the whole race ends in minutes. `validations`:
    # how many times a run planned for --steps validates (--eval-every is steps / validations).
    "race": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 1000, "seeds": 3, "lr": 6e-4,
                     "validations": 40, "eval_batches": 20},
             "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 64, "steps": 60, "seeds": 1, "lr": 3e-3,
                     "validations": 12, "eval_batches": 4}},
    "profile": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "rungs": "all"},
                "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 128, "rungs": "auto"}},
}


# The rates of a recipe with the muon part (train and the race): Muon's for the Blocks' matrices, AdamW's for the
# embeddings and an untied head; the vectors (biases, gains) keep --lr. Chosen for 16 x 1024 tokens a step: the
# speedrun recipe's time to a loss on the code corpus was measured with them (benchmarks/RECORDS.md).
MUON_RATES = {"muon_lr": 0.02, "embed_lr": 0.035, "head_lr": 0.0007}


def defaults(command: str, device: "torch.device") -> dict:
    """The defaults of `command` for this device."""
    return {**DEFAULTS[command].get("any", {}), **DEFAULTS[command]["gpu" if device.type == "cuda" else "cpu"]}


def default_text(command: str, key: str) -> str:
    """How `--help` states a default: '16 on a GPU, 4 on CPU' (or one value when both agree)."""
    if key in DEFAULTS[command].get("any", {}):
        return f"{DEFAULTS[command]['any'][key]}"
    gpu, cpu = DEFAULTS[command]["gpu"][key], DEFAULTS[command]["cpu"][key]
    gpu = "the block size" if gpu is None else gpu
    return f"{gpu}" if gpu == cpu else f"{gpu} on a GPU, {cpu} on CPU"
