"""What a training run is: every setting of `gpt2ladder train`, frozen, saved in config.json and in
every checkpoint. Nothing here reads a file: the command decides the model's shape (a preset, or the
config.json beside --init-from's weights) and hands it in."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from gpt2ladder import defaults
from gpt2ladder.errors import UsageError
from gpt2ladder.model.config import ModelConfig, preset
from gpt2ladder.model.recipe import WSD_DECAY_FRACTION, Recipe, parse_recipe

# Validation batches are made once and held for the run: a number meant for --steps would fill the memory
# before the first step instead of failing in one line.
MAX_EVAL_BATCHES = 10_000
# ln(50257) = 10.82 nats a token, a uniform guess over GPT-2's tokens and about what an untrained model scores: the
# time to a target at or above it would say little about training.
UNTRAINED_LOSS = math.log(50257)


# A config built without a value takes what `train` decides on a CPU with no flags (`gpt2ladder/defaults.py`),
# its rungs the plain step's.
_D = defaults.library("train")


@dataclass(frozen=True)
class TrainConfig:
    preset: str = _D["preset"]
    rungs: tuple[str, ...] = _D["rungs"]
    batch_size: int = _D["batch_size"]  # micro-batch, sequences per forward pass on one device
    seq_len: int = _D["seq_len"]
    # all devices, all micro-batches: accumulation fills the gap
    tokens_per_step: int = _D["batch_size"] * _D["seq_len"]
    steps: int = _D["steps"]
    lr: float = _D["lr"]
    min_lr: float = defaults.min_lr(_D["lr"])
    warmup_steps: int = defaults.warmup_steps(_D["steps"])
    weight_decay: float = _D["weight_decay"]
    grad_clip: float = _D["grad_clip"]  # 0 = off
    eval_every: int = defaults.eval_every(_D["steps"])  # 0 = never (the last step is always validated when this is on)
    eval_batches: int = defaults.eval_batches(_D["steps"], defaults.eval_every(_D["steps"]), _D["eval_batches"])
    ckpt_every: int = defaults.ckpt_every(_D["steps"])  # 0 = only at the end and on a signal
    keep_best: bool = True  # best.pt, the weights at each new lowest validation loss (a race's runs keep none)
    save_at_end: bool = True  # ckpt.pt at the target or the last step (a race's runs: only with --keep-weights)
    # A corpus of shards: the tokens of its validation shards every evaluation reads, from their start;
    # None = eval_batches steps' worth. A text validates on eval_batches random windows instead.
    val_tokens: int | None = None
    # Sequences per validation batch, before the micro-batch cuts it; None: a step's (tokens_per_step / seq_len). A
    # race's rung that steps on a batch of its own validates on the race's batches, so its losses are the others'.
    val_batch: int | None = None
    hellaswag_every: int = _D["hellaswag_every"]  # 0 = never (the last step is always scored when this is on)
    hellaswag_data: str | None = None  # a file in HellaSwag's format; None = the official validation set
    target_val_loss: float | None = None  # stop at the first validation at or below it; None = run all steps
    # Near the target, validate NEAR_SPLIT times as often: once a validation lands within eval_near nats above
    # target_val_loss, every eval_every // NEAR_SPLIT steps (at least 1), so the time to the target is read finer.
    # 0 = never.
    eval_near: float = defaults.EVAL_NEAR
    seed: int = _D["seed"]
    data: str | None = None  # a text file; None = Tiny Shakespeare (never random tokens)
    init_from: str | None = None  # local Hugging Face GPT-2 weights: a folder, or its model.safetensors
    compile_backend: str = "inductor"
    # What is trained (`model/recipe.py`): "gpt2", or the canonical list of parts on top of it. Its model parts
    # are set on `model`; its optimizer and schedule are read by the trainer.
    recipe: str = "gpt2"
    muon_lr: float | None = None  # the muon part's peak rate for the Blocks' matrices; None: the optimizer's default
    embed_lr: float | None = None  # the muon part's AdamW rate for the embeddings; None: lr
    head_lr: float | None = None  # the muon part's AdamW rate for an untied head; None: lr
    decay_fraction: float = WSD_DECAY_FRACTION  # the wsd part's share of the steps spent decaying
    # The shape (layers, heads, width, positions), before any rung pads or rewires it; None: the preset's.
    # Saved beside the settings, as built, under `model_config` (to_dict leaves it out).
    model: ModelConfig | None = None

    def __post_init__(self) -> None:
        recipe = parse_recipe(self.recipe)
        object.__setattr__(self, "recipe", recipe.name)  # frozen: set once, here, as are the next two
        if self.model is None:
            object.__setattr__(self, "model", preset(self.preset))
        object.__setattr__(self, "model", dataclasses.replace(self.model, parts=recipe.model_parts))
        for name in ("batch_size", "seq_len", "tokens_per_step", "steps", "eval_batches"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{_flag(name)} must be a positive integer, got {getattr(self, name)}")
        if self.eval_batches > MAX_EVAL_BATCHES:
            raise UsageError(f"--eval-batches is at most {MAX_EVAL_BATCHES:,} (they are built once and kept in "
                             f"memory for the whole run), got {self.eval_batches}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "hellaswag_every", "seed"):
            if getattr(self, name) < 0:
                raise UsageError(f"{_flag(name)} must be zero or more, got {getattr(self, name)}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip", "muon_lr", "embed_lr", "head_lr"):
            if getattr(self, name) is None:
                continue
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise UsageError(f"{_flag(name)} must be a finite number >= 0, got {getattr(self, name)}")
        if not (math.isfinite(self.decay_fraction) and 0 < self.decay_fraction <= 1):
            raise UsageError(f"--decay-fraction must be above 0 and at most 1, got {self.decay_fraction}")
        self._check_targets()
        if self.lr == 0 or self.min_lr > self.lr:
            raise UsageError(f"need 0 < --min-lr <= --lr, got --lr {self.lr} and --min-lr {self.min_lr}")
        block = self.model.block_size
        if self.seq_len > block:
            raise UsageError(f"--seq-len {self.seq_len} exceeds the model's block size of {block}")
        self.grad_accum(1)

    def _check_targets(self) -> None:
        if self.val_tokens is not None and self.val_tokens < 1:
            raise UsageError(f"--val-tokens must be at least 1, got {self.val_tokens}")
        if self.val_batch is not None and self.val_batch < 1:
            raise UsageError(f"val_batch must be at least 1 sequence, got {self.val_batch}")
        if not (math.isfinite(self.eval_near) and self.eval_near >= 0):
            raise UsageError(f"--eval-near must be a finite number of nats >= 0, got {self.eval_near}")
        target = self.target_val_loss
        if target is None:
            return
        if not (math.isfinite(target) and 0 < target < UNTRAINED_LOSS):
            raise UsageError(f"--target-val-loss must be a finite number above 0 and below {UNTRAINED_LOSS:.4f} (ln "
                             f"50257, about an untrained model's loss), got {target:.10g}")
        if not self.eval_every:
            raise UsageError("--target-val-loss needs validation: give --eval-every N (not 0)")

    @property
    def near_every(self) -> int:
        """The steps between validations near the target (`eval_near`)."""
        return max(1, self.eval_every // defaults.NEAR_SPLIT)

    def grad_accum(self, world_size: int = 1) -> int:
        """Micro-batches per optimizer step on each device."""
        per_pass = self.batch_size * self.seq_len * world_size
        if self.tokens_per_step % per_pass:
            raise UsageError(f"--tokens-per-step {self.tokens_per_step} is not a multiple of batch size x "
                             f"seq len x processes = {self.batch_size} x {self.seq_len} x {world_size} = {per_pass}")
        return self.tokens_per_step // per_pass

    @property
    def parsed_recipe(self) -> Recipe:
        return parse_recipe(self.recipe)

    def to_dict(self) -> dict:
        """The settings as config.json and every checkpoint hold them (the shape is kept beside them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}


# Each setting's default, which a checkpoint written before the setting existed is read as having.
TRAIN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}


def with_defaults(saved: dict, keys=None) -> dict:
    """Settings a run, checkpoint or race saved, each setting it has no key for (a version before the setting
    existed) at its default, which is what that version ran at; as JSON holds them (tuples as lists). `keys`: only
    these settings are filled in (all by default)."""
    missing = {k: v for k, v in TRAIN_DEFAULTS.items() if k not in saved and (keys is None or k in keys)}
    return {**json.loads(json.dumps(missing)), **saved}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# Each setting's type as a checkpoint holds it (JSON-like: rungs as a list, a float may be written as an int).
_INT, _NUM, _STR, _BOOL = (int,), (int, float), (str,), (bool,)
KINDS = {"preset": _STR, "rungs": (list, tuple), "batch_size": _INT, "seq_len": _INT, "tokens_per_step": _INT,
         "steps": _INT, "lr": _NUM, "min_lr": _NUM, "warmup_steps": _INT, "weight_decay": _NUM, "grad_clip": _NUM,
         "eval_every": _INT, "eval_batches": _INT, "ckpt_every": _INT, "val_tokens": _INT + (type(None),),
         "val_batch": _INT + (type(None),),
         "hellaswag_every": _INT, "hellaswag_data": _STR + (type(None),), "target_val_loss": _NUM + (type(None),),
         "seed": _INT, "data": _STR + (type(None),), "init_from": _STR + (type(None),), "compile_backend": _STR,
         "recipe": _STR, "muon_lr": _NUM + (type(None),), "embed_lr": _NUM + (type(None),),
         "head_lr": _NUM + (type(None),), "eval_near": _NUM, "keep_best": _BOOL, "save_at_end": _BOOL,
         "decay_fraction": _NUM}


def settings_problem(saved: dict, shape: ModelConfig) -> str | None:
    """What is wrong with settings read back (a checkpoint's train_config), checked as their flags are when
    given: a type no run writes, or a value a flag would refuse; None when they are fine. Unknown keys pass
    (a newer version's)."""
    for name, kinds in KINDS.items():
        value = saved.get(name)
        if name in saved and (not isinstance(value, kinds) or (isinstance(value, bool) and kinds != _BOOL)
                              or (name == "rungs" and not all(isinstance(r, str) for r in value))):
            return f"train_config.{name} = {value!r:.40}"
    try:
        TrainConfig(**{k: tuple(v) if k == "rungs" else v for k, v in saved.items() if k in KINDS}, model=shape)
    except UsageError as err:
        return f"train_config that a flag would refuse ({err})"
    return None
