"""The one table of defaults: what each command runs when a flag is not given, and what a config or the
optimizer built without a value takes.

On a CUDA GPU the write-up's run: GPT-2 124M at batch 16 x 1024 tokens. Anywhere else (a CPU, Apple's
MPS) the tiny preset, so every command finishes in minutes on a laptop. A `seq_len` of None means the
preset's block size. `--help` texts are written from this table, so they cannot disagree with it; the
configs of training/ and measure/ and the optimizer's settings (runtime/engine.py) take their field defaults
from it, so a library caller gets what a command on a CPU gets. It sits at the bottom of the layers and
imports nothing of the package.
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

# The values several commands share, decided once.
LR = 6e-4  # peak learning rate, GPT-2 124M's (nanoGPT's and the write-up's)
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0  # a training run's gradient-norm clip; the timed step of bench and profile does not clip (OPTIM)
SEED = 0
# --eval-near: nats above the target within which a run validates NEAR_SPLIT times as often (0: never).
EVAL_NEAR = 0.0
NEAR_SPLIT = 8
MAX_STEPS = 10**9  # optimizer steps of a run: step x tokens per step stays inside int64
# A config built without rungs (the library, tests): the fp32 step. A command resolves its own `rungs` default
# ("seed", "auto", "all") against the machine before it builds one.
PLAIN_RUNGS = ("baseline",)

# The rates of a recipe with the muon part (train and the race): Muon's for the Blocks' matrices, AdamW's for the
# embeddings and an untied head; the vectors (biases, gains) keep --lr. Chosen for 16 x 1024 tokens a step on the code
# corpus (benchmarks/RECORDS.md): Muon's 0.01 brought speedrun to gpt2's loss sooner than 0.02 in every seed, at 1500
# steps and at one pass, and the race's ladder of parts was measured with it.
MUON_RATES = {"muon_lr": 0.01, "embed_lr": 0.035, "head_lr": 0.0007}

DEFAULTS: dict[str, dict[str, dict]] = {
    "bench": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 20, "warmup": 5},
              "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 128, "steps": 10, "warmup": 3},
              "any": {"rungs": "seed", "seed": SEED}},
    "train": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 1000},
              "cpu": {"preset": "tiny", "batch_size": 8, "seq_len": 128, "steps": 200},
              # The same on every device. A resumed run keeps its own values instead (commands/train.py).
              "any": {"rungs": "auto", "lr": LR, "weight_decay": WEIGHT_DECAY, "grad_clip": GRAD_CLIP,
                      "eval_batches": 20, "seed": SEED, "hellaswag_every": 0}},
    "parity": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 300, "rungs": "all"},
               "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 64, "steps": 60,
                       "rungs": "baseline,compile,flash,vocab"},
               # `seeds`: fp32 baseline runs whose spread is the yardstick; `tolerance`: the largest relative gap
               # ever accepted; `floor`: the smallest always accepted (no flag sets it)
               "any": {"seeds": 2, "tolerance": 0.02, "floor": 0.005, "lr": LR, "eval_batches": 10, "seed": SEED}},
    # A CPU races the tiny preset on short steps at a higher rate, so the whole race ends in minutes; the untied
    # head's rate and Muon's are raised as --lr is (5x), else the zero-initialised head barely moves in 60 steps and
    # every rung from untied_head on missed the demo target, and at Muon's rate the muon rung missed it too.
    # `validations`: how many times a run planned for --steps validates (--eval-every is steps / validations).
    "race": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 1000, "seeds": 3, "lr": LR,
                     "muon_lr": MUON_RATES["muon_lr"], "head_lr": MUON_RATES["head_lr"], "validations": 40,
                     "eval_batches": 20},
             "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 64, "steps": 60, "seeds": 1, "lr": 3e-3,
                     "muon_lr": 0.05, "head_lr": 3.5e-3, "validations": 12, "eval_batches": 4}},
    "profile": {"gpu": {"preset": "gpt2", "batch_size": 16, "seq_len": None, "rungs": "all"},
                "cpu": {"preset": "tiny", "batch_size": 4, "seq_len": 128, "rungs": "auto"},
                "any": {"steps": 5, "warmup": 5, "seed": SEED}},
    # `num_tokens`: per sample, or the model's context when that is shorter; `top_k` 0 keeps every token.
    "sample": {"gpu": {}, "cpu": {},
               "any": {"num_tokens": 200, "num_samples": 1, "temperature": 0.8, "top_k": 200, "seed": 1337}},
    # HellaSwag: examples per forward pass (each example is one row per choice); off a CUDA GPU, the CPU's.
    "eval": {"gpu": {"batch_size": 16}, "cpu": {"batch_size": 4}},
}


# The optimizer's settings where a caller gives none (runtime/engine.py's OptimConfig): AdamW as GPT-2 trained,
# and the timed step of bench and profile unclipped, as the write-up's step is (0 disables clipping). Muon's rate
# for the Blocks' matrices is the recipe's; the embeddings' and head's rates (None) fall back to `lr`.
OPTIM = {"lr": LR, "weight_decay": WEIGHT_DECAY, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 0.0,
         "name": "adamw", "muon_lr": MUON_RATES["muon_lr"], "muon_momentum": 0.95, "embed_lr": None, "head_lr": None,
         "momentum_warmup": False, "polar_express": False}


# The rules by which train derives a setting from others where no flag gives it (a resumed run keeps its own).
def min_lr(lr: float) -> float:
    """The end of the cosine decay: a tenth of the peak, as nanoGPT's."""
    return lr / 10


def warmup_steps(steps: int) -> int:
    """Linear warm-up over 5% of the steps."""
    return int(0.05 * steps)


def eval_every(steps: int) -> int:
    """A tenth of the run, at least every other step (one batch each way would otherwise be a quarter)."""
    return max(2, steps // 10)


def ckpt_every(steps: int) -> int:
    """A checkpoint every fifth of the run."""
    return max(1, steps // 5)


# Validation is a bounded share of a run's time: a validation batch is a forward pass over a whole step's
# tokens, about a third of a training step (no backward, no optimizer), and by default all validations
# together cost at most about VALIDATION_SHARE of the run.
VALIDATION_SHARE = 0.15
EVAL_BATCH_COST = 1 / 3  # of a training step


def eval_batches(steps: int, every: int, most: int) -> int:
    """Validation batches for a run of `steps` validating every `every` (and at the last step): as many as keep
    validation within VALIDATION_SHARE of the run, at least 1, at most `most` (the table's)."""
    if not every:
        return most
    validations = -(-steps // every)  # the last step validates too
    budget = VALIDATION_SHARE / (1 - VALIDATION_SHARE) * steps / EVAL_BATCH_COST  # batches in all
    return max(1, min(most, int(budget // validations)))


def library(command: str) -> dict:
    """What a config of `command` built without a value takes: the CPU's defaults (no device is known below the
    commands), its rungs the plain step."""
    return {**DEFAULTS[command].get("any", {}), **DEFAULTS[command]["cpu"], "rungs": PLAIN_RUNGS}


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
