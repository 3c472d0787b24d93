"""The race: the second ladder, judged by the time to a target validation loss.

Its rungs are recipes (`model/recipe.py`): rung k is GPT-2 with parts 0..k switched on, in the race's order
(`RACE_RUNGS`). Every rung is a real training run (`training/run.py`), one per seed, each in its own run directory
(OUT/<rung>/seed<k>/), all from the same seeds on the same data order and planned for the same number of steps (but
a rung that plans its own, `@steps=N`), at the top of the step ladder this machine supports for that recipe. A run
stops at its first validation at or below the target, or when its planned steps run out: then the target was not
reached in its tokens.

A rung's time is the training time of its run up to that validation: the sum of its timed steps (the trainer's
clock, `training/clock.py`), without the first step, which compiles and captures, and without validation and
checkpoints, which run between the steps; both are reported apart, with the wall time. The schedule is the one
planned for all the steps, so a rung that reaches the target early did so with its learning rate still high: the
time read is that of a run planned for a fixed budget, the same way for every rung (a rung may plan its own,
`speedrun@steps=1000`: its schedule's horizon is then part of its recipe, and its time is read the same way). Over
the seeds: the median, and the range (lowest to highest). A rung is "within noise" of the rung before when their
ranges overlap.

Everything a row says is read back from its runs' log.jsonl, so a race cut off keeps the runs it finished, and
continuing it (`resume`) skips them; a run stopped part-way by a signal continues from the checkpoint it saved then.
Each run records the card it ran on (its config.json): a race continued on another card says so in its record, as
seconds measured on two cards are not one race's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder import defaults as rules
from gpt2ladder.defaults import MAX_STEPS
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.ladder import resolve_rungs
from gpt2ladder.model.modern import block_mask_problem
from gpt2ladder.model.recipe import (ADD, PARTS, SIGNS, TAKE, WSD_DECAY_FRACTION, parse_recipe, race_recipes,
                                     written_parts)
from gpt2ladder.report.records import record_header
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.runtime.metrics import peak_flops
from gpt2ladder.training.checkpoint import FILENAME, PREVIOUS, kept_none
from gpt2ladder.training.config import UNTRAINED_LOSS, TrainConfig, with_defaults
from gpt2ladder.training.run import claimed, run_cards, saved_run, train_claimed
from gpt2ladder.training.runlog import read_log

# The race's order: GPT-2, then each part on top, then `speedrun` (the recipe of that name, whatever rungs it follows).
RACE_RUNGS = ("gpt2", *(p.name for p in PARTS), "speedrun")
# A rung of its own recipe, written as parts joined by this (`speedrun+unet_skips`), or taken away by DROP from
# the parts before (`speedrun-wsd`: an ablation of the race's top): the recipe's own signs (`model/recipe.py`).
STACK, DROP, _SIGNS = ADD, TAKE, SIGNS
# `--target-val-loss gpt2`: the target is the gpt2 rung's validation loss at the end of its planned steps.
BASELINE_TARGET = "gpt2"
# Known targets, by a prepared corpus's source name: GPT-2 124M's validation loss on FineWeb, the speedrun's
# yardstick.
KNOWN_TARGETS = {"huggingfacefw/fineweb": 3.28}
# Why a CPU's race runs no step rung that compiles: Inductor compiling each recipe's model on a CPU takes longer
# than the run it would speed up.
CPU_COMPILE = "on a CPU the race does not compile: compiling each rung's model would take longer than its run"
# The settings each run of a race has of its own, or that say how its step runs: not the race's (`settings`).
RUN_OWN = ("recipe", "rungs", "batch_size", "seed", "compile_backend")
# TrainConfig's settings, but the model's shape.
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "model")
# The settings of how a run saves itself: they change no figure of the race, so a race continued by a version that
# saves otherwise is the same race.
SAVING = ("ckpt_every", "keep_best", "save_at_end")
METRICS = ("train_seconds", "wall_seconds", "tokens", "steps", "warmup_seconds", "validation_seconds")
# The figures of the run's clock (`training/clock.py`) a validation curve's point keeps, by the race's names: the log
# entry of each validation carries the clock as it stood after it.
CLOCK_SECONDS = {"wall_seconds": "wall_s", "validation_seconds": "validation_s", "warmup_seconds": "warmup_s"}


# A rung of another rung's recipe trained with settings of its own, each after this sign (`speedrun@muon_lr=0.03`,
# `gpt2@lr=0.0012@warmup_steps=150`): a sweep of rates raced in one table, each row read against its base rung.
SET = "@"
# The settings a rung may give itself, and what each must be: TrainConfig's learning rates, warm-up, planned steps
# and batch (tokens per step).
RUNG_SETTINGS = {"lr": float, "min_lr": float, "warmup_steps": int, "muon_lr": float, "embed_lr": float,
                 "head_lr": float, "decay_fraction": float, "steps": int, "tokens_per_step": int}
MUON_SETTINGS = ("muon_lr", "embed_lr", "head_lr")
WSD_SETTINGS = ("decay_fraction",)


def is_written(name: str) -> bool:
    """Whether a rung is written with `+`, `-` or `@`: a recipe of its own, or another rung's with settings of its
    own, not a rung of the race's order."""
    return STACK in name or DROP in name or SET in name


def split_settings(name: str) -> tuple[str, dict]:
    """A rung's base name and the settings it gives itself: `speedrun@muon_lr=0.03` is ("speedrun", {"muon_lr":
    0.03}). A UsageError for an unknown setting, one given twice, or a value that is not a positive number (a
    whole one, or zero, for warmup_steps)."""
    base, *given = name.split(SET)
    settings: dict = {}
    if given and not base:
        raise UsageError(f"race rung {name} names no rung before its {SET}: write the rung it trains as, such as "
                         f"speedrun{SET}muon_lr=0.03")
    for item in given:
        key, _, text = item.partition("=")
        kind = RUNG_SETTINGS.get(key)
        if kind is None:
            raise UsageError(f"race rung {name}: {SET}{item} sets no known setting; a rung may set "
                             f"{', '.join(f'{k}=X' for k in RUNG_SETTINGS)}")
        if key in settings:
            raise UsageError(f"race rung {name}: {key} is set twice")
        value = kind(text) if re.fullmatch(_NUMBER[kind], text) else None  # plain ASCII digits, as a folder's name
        if (value is None or (value == 0 and key != "warmup_steps") or value == float("inf")
                or (kind is int and value > MAX_STEPS)):
            what = ("a positive number" if kind is float else f"a whole number of tokens, 1 to {MAX_STEPS:,}"
                    if key == "tokens_per_step" else f"a whole number of steps, {int(key == 'steps')} to {MAX_STEPS:,}")
            raise UsageError(f"race rung {name}: {key} must be {what}, got {text!r}")
        settings[key] = value
    if settings.get("decay_fraction", 0) > 1:
        raise UsageError(f"race rung {name}: decay_fraction is a share of the steps, at most 1, got "
                         f"{settings['decay_fraction']:g}")
    if settings.get("min_lr", 0) > settings.get("lr", float("inf")):
        raise UsageError(f"race rung {name}: its min_lr {settings['min_lr']:g} is above its lr {settings['lr']:g}")
    return base, settings


_NUMBER = {int: r"[0-9]+", float: r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"}


def parse_race_rungs(spec: str | None) -> tuple[str, ...]:
    """`all` (or None): every rung; else a comma list of race rungs, put in the race's order, then the rungs written
    with `+` and `-` (`speedrun+unet_skips`, `speedrun-wsd`: each a recipe of its own, as `speedrun` is), in the
    order given."""
    if spec is None or spec.strip() == "all":
        return RACE_RUNGS
    given = [_spelled(n) for n in spec.split(",") if n.strip()]
    names = list(dict.fromkeys(given))
    twice = [n for n in names if given.count(n) > 1]
    if twice:
        raise UsageError(f"race rung {twice[0]} is given twice in --rungs; a rung races once (its seeds: --seeds)")
    stacked = [n for n in names if is_written(n)]
    unknown = [n for n in names if n not in RACE_RUNGS and n not in stacked]
    if "all" in names:
        raise UsageError("--rungs all stands alone (every rung of the race's order and speedrun); to add rungs, list "
                         "the ones you want")
    if unknown or not names:
        raise UsageError(f"unknown race rung {', '.join(unknown) or repr(spec)}; choose from: all, "
                         f"{', '.join(RACE_RUNGS)}, or parts joined by {STACK} or taken away by {DROP} "
                         f"(speedrun{STACK}unet_skips, speedrun{DROP}wsd), or a rung with settings of its own "
                         f"(speedrun{SET}muon_lr=0.03)")
    for name in stacked:
        base, _ = split_settings(name)
        if SET in name and base not in names:
            raise UsageError(f"race rung {name} trains rung {base}'s recipe with settings of its own, and is read "
                             f"against it: add {base} to --rungs")
        if SET in name and base in stacked and stacked.index(base) > stacked.index(name):
            raise UsageError(f"race rung {name} is read against {base}, which races after it: list {base} first")
        if is_written(base):
            stacked_recipe(base)  # its parts are known
    return (*(n for n in RACE_RUNGS if n in names), *stacked)


def _spelled(name: str) -> str:
    """A rung's name as its folder is named: `speedrun + unet_skips - wsd` is `speedrun+unet_skips-wsd`, and
    `speedrun @ muon_lr = 0.03` is `speedrun@muon_lr=0.03`."""
    base, *given = (piece.strip() for piece in name.split(SET))
    if given:
        return SET.join([_spelled(base), *("=".join(p.strip() for p in item.split("=")) for item in given)])
    name = base
    if not is_written(name):
        return name
    pieces = _SIGNS.split(name)  # [first, sign, piece, sign, piece, ...]
    if not all(pieces):
        raise UsageError(f"race rung {name!r} has an empty part beside a {STACK} or {DROP} sign; write parts joined "
                         f"by {STACK} or taken away by {DROP}, such as speedrun{STACK}unet_skips or speedrun{DROP}wsd")
    return "".join(pieces)


def stacked_recipe(name: str):
    """The recipe of a rung written with `+` and `-`, read left to right (`recipe.written_parts`):
    `speedrun+unet_skips` is speedrun's parts and unet_skips; `speedrun-wsd` speedrun's parts but wsd."""
    try:
        return parse_recipe(",".join(written_parts(name)))
    except UsageError as err:
        raise UsageError(f"race rung {name}: {err}") from None


def check_target(target: float) -> None:
    """A UsageError for a target no run can be timed to."""
    if not 0 < target < UNTRAINED_LOSS:  # about an untrained model's score: its time would say little
        raise UsageError(f"--target-val-loss must be above 0 and below {UNTRAINED_LOSS:.4f} (ln 50257, about an "
                         f"untrained model's loss), got {target:.10g}")


def known_target(source_name: str | None) -> float | None:
    """The target a corpus is known by (its prepared manifest's source name), or None."""
    return KNOWN_TARGETS.get((source_name or "").lower())


def recipe_problem(recipe_name: str, caps: Capabilities) -> str | None:
    """Why this torch or device cannot train the recipe, or None."""
    recipe = parse_recipe(recipe_name)
    if recipe.has("rmsnorm") or recipe.has("qk_norm"):
        if not hasattr(torch.nn.functional, "rms_norm"):
            return (f"recipe {recipe.name} needs torch.nn.functional.rms_norm (PyTorch 2.4+); this is "
                    f"{torch.__version__}")
    if recipe.has("doc_windows") and (problem := block_mask_problem()):
        return problem
    if recipe.optimizer == "muon" and caps.device_type == "cuda" and not caps.bf16_supported:
        return (f"the muon part orthogonalises its updates in bfloat16 products, which need bfloat16 tensor cores "
                f"(compute capability 8.0 or newer); {caps.name} is {caps.capability_text}")
    return None


def step_rungs_for(recipe_name: str, caps: Capabilities) -> tuple[str, ...]:
    """The top of the step ladder a race rung climbs here: what `--rungs auto` gives its recipe, and on a CPU none
    that compiles (CPU_COMPILE says why)."""
    planned = caps if caps.device_type == "cuda" else dataclasses.replace(caps, compile_problem=CPU_COMPILE)
    return tuple(resolve_rungs("auto", planned, None, parse_recipe(recipe_name))) or ("baseline",)


@dataclass(frozen=True)
class RaceRung:
    """One rung as it runs here: its name, its recipe, and how its step runs (the step ladder's rungs, the
    micro-batch)."""

    name: str
    recipe: str
    step_rungs: tuple[str, ...]
    batch_size: int

    @property
    def settings(self) -> dict:
        """The settings it gives itself (`speedrun@muon_lr=0.03`), over the race's."""
        return split_settings(self.name)[1]

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "settings": self.settings}


def race_rungs(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, recipe name) of each rung: rung k is the parts of rungs 0..k; `speedrun` and the rungs written with
    `+` and `-` are each their own recipe."""
    own = {n: (stacked_recipe(n) if is_written(n) else parse_recipe(n))
           for n in names if n == "speedrun" or (is_written(n) and SET not in n)}
    parts = [n for n in names if n not in own and SET not in n]
    try:
        recipes = {**dict(zip(parts, race_recipes(parts))), **own}
    except UsageError as err:  # a rung trains the parts of the rungs before it, and those make no recipe
        raise UsageError(f"race rungs {','.join(parts)}: each trains the parts of the rungs before it, "
                         f"and {err}") from None
    for name in names:  # a rung with settings of its own trains its base rung's recipe
        if SET in name:
            base, settings = split_settings(name)
            recipes[name] = recipes[base]
            muon_only = [k for k in settings if k in MUON_SETTINGS]
            if muon_only and recipes[name].optimizer != "muon":
                raise UsageError(f"race rung {name}: {', '.join(muon_only)} {'is' if len(muon_only) == 1 else 'are'} "
                                 f"the muon part's, and {base} trains recipe {recipes[name].name}, which has no muon")
            if any(k in WSD_SETTINGS for k in settings) and recipes[name].schedule != "wsd":
                raise UsageError(f"race rung {name}: decay_fraction is the wsd part's, and {base} trains recipe "
                                 f"{recipes[name].name}, which has no wsd")
    trained: dict[tuple, str] = {}
    for name in names:  # two rungs of one recipe and settings would train the same runs twice
        key = (recipes[name].name, tuple(sorted(split_settings(name)[1].items())))
        twin = trained.setdefault(key, name)
        if twin != name:
            raise UsageError(f"race rungs {twin} and {name} both train recipe {recipes[name].name}"
                             f"{' with the same settings' if key[1] else ''}; drop one of them")
    return [(name, recipes[name].name) for name in names]


@dataclass(frozen=True)
class RaceConfig:
    """What a race runs, every choice made: the rungs as they run here, the seeds, and the settings every run
    shares (`train`: its recipe, step rungs, micro-batch and seed are each run's own)."""

    rungs: tuple[RaceRung, ...]
    seeds: int
    train: TrainConfig
    target_source: str = "given"  # where the target came from: given, the corpus it is known for, or the gpt2 rung
    # The target is the first rung's (gpt2's) validation loss after its planned steps, the highest over its seeds:
    # train.target_val_loss stays None until that rung has run.
    from_baseline: bool = False

    def __post_init__(self) -> None:
        if self.from_baseline:
            if not self.rungs or self.rungs[0].name != BASELINE_TARGET:
                raise UsageError("--target-val-loss gpt2 reads the target off the gpt2 rung, so --rungs must start "
                                 "with gpt2")
        elif self.train.target_val_loss is None:
            raise ValueError("a race needs train.target_val_loss")
        if self.train.target_val_loss is not None:
            check_target(self.train.target_val_loss)
        if self.seeds < 1:
            raise UsageError(f"--seeds must be a positive integer, got {self.seeds}")
        for i, rung in enumerate(self.rungs):  # a rung with settings of its own that trains another's runs again
            twin = next((other for other in self.rungs[:i] if rung.settings and other.recipe == rung.recipe
                         and _same_run(self.run_config(rung, 0), self.run_config(other, 0))), None)
            if twin is not None:
                raise UsageError(f"race rung {rung.name} gives itself the settings rung {twin.name} trains with "
                                 "already; drop it, or give it others")

    @property
    def target(self) -> float | None:
        """The target; None while it is still to be read off the gpt2 rung."""
        return self.train.target_val_loss

    @property
    def own_batch_rungs(self) -> tuple[str, ...]:
        """The rungs whose steps are of a batch of their own (`@tokens_per_step` other than the race's)."""
        race = self.train.tokens_per_step
        return tuple(r.name for r in self.rungs if r.settings.get("tokens_per_step", race) != race)

    def with_target(self, target: float) -> "RaceConfig":
        return dataclasses.replace(self, train=dataclasses.replace(self.train, target_val_loss=target))

    def run_config(self, rung: RaceRung, seed: int) -> TrainConfig:
        """The run of this rung and seed (`plan_run`)."""
        return plan_run(self.train, rung, seed)

    def settings(self) -> dict:
        """What every run of the race shares: a race continued with --resume must share them too."""
        shared = {k: v for k, v in self.train.to_dict().items() if k not in RUN_OWN}
        if self.from_baseline:
            shared["target_val_loss"] = BASELINE_TARGET  # read off the gpt2 rung, the same in every session
        return {**shared, "model": self.train.model.to_dict()}

    def to_dict(self) -> dict:
        """As race.json keeps it; `compile_backend`, each run's own (not a setting --resume compares), for --reuse."""
        return {"rungs": [r.to_dict() for r in self.rungs], "seeds": self.seeds, "target_source": self.target_source,
                "settings": self.settings(), "compile_backend": self.train.compile_backend}


def plan_run(train: TrainConfig, rung: RaceRung, seed: int) -> TrainConfig:
    """The run of this rung and seed in a race whose runs share `train`: AdamW's recipes leave the muon part's rates
    unset, as `train` does."""
    recipe = parse_recipe(rung.recipe)
    rates = {} if recipe.optimizer == "muon" else {"muon_lr": None, "embed_lr": None, "head_lr": None}
    if recipe.schedule != "wsd":  # its runs, which no decay_fraction changes, are every race's with that recipe
        rates["decay_fraction"] = WSD_DECAY_FRACTION
    own = rung.settings
    if "lr" in own and "min_lr" not in own:  # the decay ends at a tenth of the peak, as the race's own rate's does
        own = {**own, "min_lr": own["lr"] * train.min_lr / train.lr}
    if "steps" in own and "warmup_steps" not in own:  # warmed up as `train --steps N` would be
        own = {**own, "warmup_steps": rules.warmup_steps(own["steps"])}
    if "tokens_per_step" in own:  # its own batch: validated on the race's batches, at the race's tokens
        own = {**own, **own_batch(train, rung.name, own["tokens_per_step"])}
    return dataclasses.replace(train, recipe=rung.recipe, rungs=rung.step_rungs, batch_size=rung.batch_size,
                               seed=seed, **rates, **own)


def own_batch(s: TrainConfig, name: str, tokens_per_step: int) -> dict:
    """The settings of a run that steps on tokens_per_step tokens of its own, in a race whose runs share `s`: it
    validates on the race's batches (val_batch) and after as many tokens as the race's runs do (eval_every in its
    own steps), so its losses and their tokens are the other rungs'. A UsageError where a step is no whole number
    of sequences, or the race's validation interval no whole number of its steps."""
    if tokens_per_step == s.tokens_per_step:  # the race's own: the run of the rung it is set on
        return {}
    check_sequences(name, tokens_per_step, s.seq_len)
    interval = s.eval_every * s.tokens_per_step
    if interval % tokens_per_step:
        raise UsageError(f"race rung {name}: the race validates every {interval:,} tokens ({s.eval_every} "
                         f"step{'s' * (s.eval_every != 1)} of {s.tokens_per_step:,}), not a whole number of its "
                         f"steps of {tokens_per_step:,}; give tokens_per_step that divides it, or another "
                         "--eval-every")
    return {"val_batch": s.tokens_per_step // s.seq_len, "eval_every": interval // tokens_per_step}


def check_sequences(name: str, tokens_per_step: int, seq_len: int) -> None:
    """A UsageError where a rung's own tokens_per_step is no whole number of sequences."""
    if tokens_per_step % seq_len:
        raise UsageError(f"race rung {name}: tokens_per_step must be a whole number of {seq_len}-token sequences, "
                         f"got {tokens_per_step:,}")


def _same_run(a: TrainConfig, b: TrainConfig) -> bool:
    """Whether two runs' configs are one run's: the same settings, rates equal to float rounding (a race's min_lr is
    its lr / 10, 0.00030000000000000003 where a rung writes 0.0003)."""
    one, two = a.to_dict(), b.to_dict()
    return one.keys() == two.keys() and all(
        math.isclose(x, y, rel_tol=1e-9) if isinstance(x, float) and isinstance(y, float) else x == y
        for x, y in ((one[k], two[k]) for k in one))


def run_dir(out: Path, rung: str, seed: int) -> Path:
    return out / rung / f"seed{seed}"


def check_new_race(out: Path, resume: bool) -> None:
    """Without --resume, a race may not start over another one's runs (that is what --resume is for)."""
    if resume:
        return
    held = [p for p in (out / "race.json", *out.glob(f"*/seed*/{FILENAME}"), *out.glob(f"*/seed*/{PREVIOUS}"))
            if p.exists()]
    if held:
        raise UsageError(f"{out} already holds a race ({held[0]}); pass --resume to continue it, or another --out")


def other_cards(earlier: dict | None, card: str) -> list[str]:
    """The cards other than this one that the runs of the race in this folder trained on."""
    if not earlier:
        return []
    named = earlier.get("cards") or [(earlier.get("device") or {}).get("name")]  # a record from before `cards`
    return [c for c in named if c and c != card]


def check_same_race(cfg: RaceConfig, earlier: dict | None, data_sha256: str | None = None) -> None:
    """--resume continues a race of the same settings on the same corpus (where its record names the corpus's
    sha256, which then stands for its path: a record carried to another machine finds the corpus elsewhere), each
    rung training the same recipe (rungs may be added after the last, and seeds; none it has runs of left out)."""
    if earlier is None:
        return
    data = earlier.get("data")
    held = data.get("sha256") if isinstance(data, dict) else None
    if data_sha256 is not None and held is not None and held != data_sha256:
        raise UsageError(f"--resume: the race in this folder trained on another corpus (sha256 {str(held)[:12]}…, "
                         f"this one's {data_sha256[:12]}…); give its --data, or another --out")
    before = (earlier.get("config") or {}).get("settings") or {}
    now = json.loads(json.dumps(cfg.settings()))  # as race.json holds them
    before = with_defaults(before, keys=now)  # a setting the race's version had no key for: its default
    moved = ("data",) if held is not None and held == data_sha256 else ()  # the same tokens at another path
    changed = sorted(k for k in set(before) | set(now) if k not in (*SAVING, *moved) and before.get(k) != now.get(k))
    if changed:
        raise UsageError(f"--resume: the race in this folder ran with other settings ({', '.join(changed)}); give "
                         "the same flags, or another --out")
    recipes = {r.name: r.recipe for r in cfg.rungs}
    for row in earlier.get("rungs") or []:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):  # a damaged row: no rung to compare
            continue
        # race.json is written from this race's rungs: one left out would lose the runs it records (read back where
        # the record names its corpus), their only copy where the run folders did not travel with it
        if row["name"] not in recipes and row.get("runs") and held is not None:
            raise UsageError(f"--resume: the race in this folder has runs of rung {row['name']}, which --rungs leaves "
                             "out (race.json would lose them); give its --rungs, or another --out")
        if recipes.get(row["name"], row.get("recipe")) != row.get("recipe"):
            raise UsageError(f"--resume: rung {row['name']} of the race in this folder trained recipe {row['recipe']}, "
                             f"and here it would train {recipes[row['name']]} (other rungs before it); give its "
                             "--rungs, or another --out")


def run_race(cfg: RaceConfig, device: torch.device, out: Path, caps: Capabilities, tokens: data_mod.TokenData, *,
             resume: bool = False, progress: bool = True, on_record=None, on_run=None,
             reuse: tuple[Path, ...] = (), recorded: dict | None = None, dry: bool = False) -> tuple[dict, int]:
    """Every (rung, seed) of the race, in order; the record and 0, or the exit code of the run a signal stopped.

    `on_record(record)` sees the record after each run (the command writes race.json there), `on_run(rung, seed,
    result, ran)` each run's result as it is known (`ran`: trained now, not read back from an earlier session or
    another race). A run that another race in `reuse` finished exactly so (`reused_run`) is copied, not trained.
    On --resume, `recorded` (`recorded_runs`: the finished runs of the race.json found in `out`) stands for a run
    whose folder holds no log: the race's record carried to another machine continues there.

    `dry` (--dry-run): each run is decided as above, but nothing is trained, copied, dropped or recorded: a run to
    train is a result of status "planned" (`reason` "train", "continue" from its checkpoint, or "again" from its
    start, its target having fallen), and the record returned is {"planned": True, "unknown_after": the gpt2 rung's
    name where its target waits on runs to train, so the rungs after it are not decided, else None, "target": the
    target where known}."""
    runs: dict[str, list[dict]] = {r.name: [] for r in cfg.rungs}
    recorded = recorded if resume else None
    code = 0

    def so_far() -> dict[str, list[dict]]:
        """The runs reached so far, each rung's with the recorded runs of the seeds not reached yet after them: a
        race that stops before it comes to them keeps them in its race.json, their only copy."""
        return {name: done + [recorded[(name, s)] for s in range(len(done), cfg.seeds) if (name, s) in recorded]
                for name, done in runs.items()} if recorded else runs

    for rung in cfg.rungs:
        for seed in range(cfg.seeds):
            where = run_dir(out, rung.name, seed)
            run_cfg = cfg.run_config(rung, seed)
            result = finished_run(where, run_cfg, seed, tidy=not dry) if resume else None
            if result is None and recorded and not run_cfg.save_at_end and not (where / "log.jsonl").exists():
                result = recorded.get((rung.name, seed))  # none under --keep-weights: its weights are not here
            if result is None and reuse and not (where / "log.jsonl").exists():
                result = reused_run(reuse, where, rung.name, run_cfg, seed, tokens.sha256, caps.name,
                                    race=(cfg, rung), copy=not dry)
            fell = False  # a run read back that stopped at a target that has fallen since: trained again
            if result is not None and cfg.target is not None:
                result = to_target(result, cfg.target, run_cfg.steps)
                fell = result is None
                # it stopped at a target that has fallen since: trained again from its start, its log rewritten
                if result is None and where.is_dir() and not dry:
                    with claimed(where):
                        drop_checkpoints(where)
                        (where / REUSED).unlink(missing_ok=True)
            ran = result is None
            if ran and dry:  # what it would be: trained again from its start, continued, or trained
                again = "again" if fell else "continue" if resume and _has_checkpoint(where) else "train"
                result = {"seed": seed, "dir": str(where), "status": "planned", "reason": again}
            elif ran:
                code, result = train_run(run_cfg, device, where, caps, tokens, seed, resume, progress)
            runs[rung.name].append(result)
            if on_run is not None:
                on_run(rung, seed, result, ran)
            if dry:
                continue
            record = race_record(cfg, device, caps, tokens, so_far(), partial=True)
            if on_record is not None:
                on_record(record)
            if code:
                return record, code
        if cfg.target is None:  # the gpt2 rung has run all its steps: its last validations set the target
            target = baseline_target(runs[rung.name])
            if target is None and dry:  # its runs to train set it: what the rungs after it read waits on them
                return {"planned": True, "unknown_after": rung.name, "target": None}, 0
            if target is None:
                raise LadderError(f"the {rung.name} rung did not finish every seed, so it sets no target: "
                                  f"{next(r['reason'] for r in runs[rung.name] if r['status'] != 'ok')}")
            cfg = cfg.with_target(target)
            runs[rung.name] = [timed_to(r, target) for r in runs[rung.name]]
            if on_record is not None and not dry:
                on_record(race_record(cfg, device, caps, tokens, so_far(), partial=True))
    if dry:
        return {"planned": True, "unknown_after": None, "target": cfg.target}, 0
    return race_record(cfg, device, caps, tokens, runs, partial=False), 0


# What a finished run's figures hold (`run_result`), so a run read back from a race.json makes its rung's row.
RUN_KEYS = ("seed", "status", "reached", "curve", "ms_per_step", "mfu", *METRICS)


def recorded_runs(earlier: dict | None, data_sha256: str,
                  rungs: tuple[RaceRung, ...] = ()) -> dict[tuple[str, int], dict]:
    """The finished runs of an earlier race.json, by (rung, seed), as it recorded them: on --resume they stand for
    run folders that are not there (the record alone carried to another machine). Nothing from a record that does
    not name this corpus's sha256 (a version before it wrote one), since nothing else there says what the runs read;
    a run that lacks a figure or its validation curve (a damaged record) is left out, and trained again; so are the
    runs of a row whose step ran otherwise than the same rung of `rungs` runs here (`step_unlike`)."""
    data = (earlier or {}).get("data")
    if not isinstance(data, dict) or data.get("sha256") != data_sha256:
        return {}
    return _finished_runs(earlier, rungs)


def _finished_runs(earlier: dict, rungs: tuple[RaceRung, ...] = ()) -> dict[tuple[str, int], dict]:
    """`recorded_runs` whatever corpus the record names."""
    here = {rung.name: rung for rung in rungs}
    found = {}
    for row in earlier.get("rungs") or []:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            continue
        if row["name"] in here and step_unlike(row, here[row["name"]]):
            continue
        for run in row["runs"] if isinstance(row.get("runs"), list) else []:
            if (isinstance(run, dict) and all(k in run for k in RUN_KEYS) and run["status"] == "ok"
                    and type(run["seed"]) is int and isinstance(run["curve"], list) and run["curve"]
                    and all(map(_legible_point, run["curve"]))):
                found[(row["name"], run["seed"])] = run
    return found


def _legible_point(point) -> bool:
    """Whether a recorded validation point holds what a run is timed by: its step, loss and training seconds."""
    return (isinstance(point, dict) and type(point.get("step")) is int
            and all(type(point.get(k)) in (int, float) for k in ("val_loss", "train_seconds")))


def recorded_apart(cfg: RaceConfig, earlier: dict | None, data_sha256: str, out: Path) -> list[tuple[str, str]]:
    """(rung, why) for each rung some of whose runs `recorded_runs` would have read from the record, and does not
    because the row's step ran otherwise (`step_unlike`): runs of this race's seeds, with no folder here, that
    train again. None under --keep-weights, whose runs all train (a record holds no weights)."""
    if cfg.train.save_at_end:
        return []
    kept = recorded_runs(earlier, data_sha256, cfg.rungs)
    apart = [key for key in recorded_runs(earlier, data_sha256) if key not in kept and _wanted_here(cfg, out, key)]
    rows = {row.get("name"): row for row in earlier["rungs"] if isinstance(row, dict)} if apart else {}
    return [(rung.name, step_unlike(rows[rung.name], rung)) for rung in cfg.rungs
            if any(name == rung.name for name, _ in apart)]


def unnamed_corpus_runs(cfg: RaceConfig, earlier: dict | None, out: Path) -> int:
    """How many finished runs of this race's rungs and seeds an earlier race.json holds, with no folder here, that
    `recorded_runs` cannot read because the record names no corpus sha256 (an older version wrote it): they train
    again. 0 under --keep-weights, whose runs all train."""
    data = (earlier or {}).get("data")
    if cfg.train.save_at_end or not isinstance(data, dict) or data.get("sha256"):
        return 0
    return len([key for key in _finished_runs(earlier) if _wanted_here(cfg, out, key)])


def _wanted_here(cfg: RaceConfig, out: Path, key: tuple[str, int]) -> bool:
    """Whether the run (rung, seed) is one of this race's with no folder in `out`: one a record would stand for."""
    name, seed = key
    return (any(rung.name == name for rung in cfg.rungs) and seed < cfg.seeds
            and not (run_dir(out, name, seed) / "log.jsonl").exists())


def step_unlike(row: dict, rung: RaceRung) -> str | None:
    """How a recorded row's step differs from this rung's here, in words: other step rungs (named, those it lacks
    and those it adds) or another micro-batch; None where they are the same or the row does not say (a version
    before it recorded them). Seconds of another step are not this race's: its runs train again."""
    ran = row.get("step_rungs")
    if not isinstance(ran, list) or not all(isinstance(r, str) for r in ran):  # not said, or not legibly
        ran = list(rung.step_rungs)
    missing = [r for r in rung.step_rungs if r not in ran]
    extra = [r for r in ran if r not in rung.step_rungs]
    if missing or extra:  # the rungs' switches apply together, so their order is no difference
        parts = [f"without {', '.join(missing)}"] * bool(missing) + [f"with {', '.join(extra)}"] * bool(extra)
        return f"its step ran {' and '.join(parts)}"
    batch = row.get("batch_size")
    if type(batch) is int and batch != rung.batch_size:
        return f"its step ran at micro-batch {batch}, here {rung.batch_size}"
    return None


def baseline_target(runs: list[dict]) -> float | None:
    """The target read off the gpt2 rung's runs: the highest of their last validation losses (so every seed reaches
    it), or None unless every run finished."""
    if not runs or any(r["status"] != "ok" or not r["curve"] for r in runs):
        return None
    return max(r["curve"][-1]["val_loss"] for r in runs)


def timed_to(result: dict, target: float) -> dict:
    """A run's figures to a target set after it ran, read off its validation curve: the training seconds, steps and
    tokens at its first validation at or below the target, and the wall, validation and compile seconds the run's
    clock had there (None where an older version wrote the log: its validations kept no clock)."""
    hit = next((point for point in result["curve"] if point["val_loss"] <= target), None)
    if hit is None:
        return {**result, "reached": False}
    return {**result, "reached": True, "train_seconds": hit["train_seconds"], "steps": hit["step"],
            "tokens": hit["tokens"], **{name: hit.get(name) for name in CLOCK_SECONDS}}


def to_target(result: dict, target: float, steps: int) -> dict | None:
    """A finished run read back (from its folder, a record or another race), timed to the race's target where that
    target has moved since the run stopped at its own: under --target-val-loss gpt2 the target is the highest of the
    gpt2 rung's last losses, so more seeds of it raise it, and a gpt2 run trained again (not bit for bit the same)
    can lower it. Where it rose, the run's time is its first validation at or below it, which came before the step
    it stopped at. Where it fell below the last loss of a run that ran all its `steps`, the run did not reach it;
    where it fell below the loss at which a run stopped short of them, None: that run must train on. Else the run
    is as it was."""
    if result.get("status") != "ok":
        return result
    first = next((point for point in result["curve"] if point["val_loss"] <= target), None)
    if first is None:
        if result["curve"][-1]["step"] < steps:
            return None
        return result if not result["reached"] else {**result, "reached": False, **dict.fromkeys(METRICS)}
    if result["reached"] and first["step"] == result["steps"]:
        return result
    return timed_to(result, target)  # earlier (it rose) or later (it fell, after an earlier rise) on its curve


def train_run(cfg: TrainConfig, device, where: Path, caps, tokens, seed: int, resume: bool,
              progress: bool) -> tuple[int, dict]:
    """One run, trained (or continued from its checkpoint) to the target or its last step; what the trainer says
    goes to its train.txt. A run that fails (its loss exploded) is a row that says why; the race goes on."""
    where.mkdir(parents=True, exist_ok=True)
    with claimed(where):
        saved = saved_run(where, resume=resume and _has_checkpoint(where))
        try:
            with open(where / "train.txt", "a", encoding="utf-8") as said, contextlib.redirect_stdout(said):
                result = train_claimed(cfg, device, where, saved, tokens=tokens, progress=progress, caps=caps,
                                       bar=(f"{where.parent.name} seed {seed}", False))  # its line follows it
        except UsageError:
            raise
        except LadderError as err:
            return 0, {"seed": seed, "dir": str(where), "status": "failed", "reason": str(err)}
        if result.exit_code:
            return result.exit_code, {"seed": seed, "dir": str(where), "status": "stopped",
                                      "reason": f"at step {result.step}; --resume continues it" if result.step else
                                      "before its first step; --resume trains it"}
        if not cfg.save_at_end:
            drop_checkpoints(where)
    return 0, run_result(read_log(where / "log.jsonl"), cfg, seed, where)


def drop_checkpoints(where: Path) -> None:
    """A finished run's checkpoints, which a signal saved for --resume: the race keeps no weights without
    --keep-weights."""
    for name in (FILENAME, PREVIOUS):
        (where / name).unlink(missing_ok=True)


def _has_checkpoint(where: Path) -> bool:
    return (where / FILENAME).exists() or (where / PREVIOUS).exists()


def finished_run(where: Path, cfg: TrainConfig, seed: int, tidy: bool = True) -> dict | None:
    """The result of a run an earlier session finished (it reached the target, or ran all its steps and, validating,
    measured its last), else None: a signal during the last step's validation leaves that step in the log unmeasured,
    and the run's checkpoint measures it on --resume. A finished run that a signal stopped after its last validation
    kept a checkpoint for --resume: dropped here, as its session would have, where the run was started without
    --keep-weights (unless `tidy` is off: a dry run changes nothing)."""
    entries = read_log(where / "log.jsonl")
    if not _finished(entries, cfg):
        return None
    # started without --keep-weights (an older race's runs kept theirs)
    if tidy and not cfg.save_at_end and kept_none(where):
        with claimed(where):
            drop_checkpoints(where)
    return run_result(entries, cfg, seed, where)


# A run's settings that another race's run may differ in and still be this run: how it saves itself, and where its
# corpus lies (its identity is the sha256 its config.json records).
REUSE_IGNORES = (*SAVING, "data")


def _as_run(settings: dict) -> dict:
    """A run's settings as they act: without a target (the gpt2 rung's runs under --target-val-loss gpt2) there is
    nothing to validate near, so its eval_near is no difference."""
    return {**settings, "eval_near": 0.0} if settings.get("target_val_loss") is None else settings


# What a reused run's folder gets from the run it copies: no weights, nothing else; log.jsonl last, since a log that
# ends finished is what makes a run finished.
REUSED_FILES = ("config.json", "train.txt", "loss.png", "log.jsonl")
REUSED = "reused.json"  # where the copy says which run it is


def reused_run(sources: tuple[Path, ...], where: Path, rung: str, cfg: TrainConfig, seed: int,
               data_sha256: str, card: str | None = None, race: tuple[RaceConfig, RaceRung] | None = None,
               copy: bool = True) -> dict | None:
    """This rung's run of this seed, copied into `where` from the first race folder of `sources` that finished it
    with these very settings on this corpus, on this `card` (None: any; seconds from two cards are not one race's),
    and its result (`reused_from` names the run); None where none did, and
    always for a run that must keep its weights (--keep-weights), since no weights are copied. The gpt2 rung's runs
    planned for one budget, for one, serve every race at that budget.

    A source without the run's folder serves it from its race.json (a record carried without its runs), where
    `race` (this race and rung) is given and the row's run is that run (`recorded_unlike`): nothing is copied, and
    the result, `reused_from` naming the race.json, is what this race's record keeps of it. Without `copy` (a dry
    run) a folder's run is read where it is, nothing written."""
    if cfg.save_at_end:
        return None
    here = where.resolve()
    for source in sources:
        found = run_dir(source, rung, seed).resolve()
        if here == found or here.is_relative_to(found) or found.is_relative_to(here):
            continue
        unlike = _unlike(found, cfg, data_sha256, card)
        if unlike is None and race is not None and not found.is_dir():
            unlike, run = recorded_unlike(source, *race, seed, data_sha256, card)
            if unlike == "":
                return run
        if unlike != "":
            continue
        if not copy:
            return {**run_result(read_log(found / "log.jsonl"), cfg, seed, found), "reused_from": str(found)}
        where.mkdir(parents=True, exist_ok=True)
        with claimed(where):
            (where / REUSED).write_text(json.dumps({"from": str(found)}) + "\n", encoding="utf-8")
            for name in REUSED_FILES:  # plain files only, each whole before the next
                path = found / name
                if path.is_file() and not path.is_symlink():
                    shutil.copyfile(path, where / f"{name}.tmp")
                    (where / f"{name}.tmp").replace(where / name)
        return run_result(read_log(where / "log.jsonl"), cfg, seed, where)
    return None


RECORD = "race.json"


def recorded_unlike(source: Path, cfg: RaceConfig, rung: RaceRung, seed: int, data_sha256: str,
                    card: str | None = None) -> tuple[str | None, dict | None]:
    """How the run of this rung and seed that the race.json in `source` records differs from this race's, and the
    run as recorded: ("", run) where a row of it, the rung's own or another of its recipe (`speedrun@muon_lr=0.01`
    for `speedrun` where 0.01 is this race's rate), holds that very run, finished, on this corpus and `card` (None:
    any), `reused_from` naming the race.json (and the row, where it is another); (None, None) where the record holds
    no readable finished run of its rung and seed; else (why in words, None), from the rung's own row: the recipe
    or step it ran otherwise, the settings it ran with otherwise (named), another corpus, another card (named).

    A row's run is planned as the recorded race planned it (`plan_run` on its settings, with the row's own), so a
    race-wide setting that this rung's run does not read (Muon's rates for an AdamW rung) is no difference. Its
    target is the record's, but for the runs of the race's first rung under `--target-val-loss gpt2`, which ran
    without one. Of a race to gpt2's loss that validated more often near its target (--eval-near), the runs after
    its gpt2 rung serve none: when a run ran, the target read off gpt2's runs may have been another, and race.json
    does not say; its gpt2 runs validated on the grid, and serve. A race to a given target keeps it in its settings
    (--resume refuses another), so its runs serve a race to the same target, --eval-near or not."""
    try:
        record = json.loads((source / RECORD).read_text(encoding="utf-8"))
        config = record["config"]
        first = record["rungs"][0]["name"]
        settings = config["settings"]
        rows = [r for r in record["rungs"] if isinstance(r, dict) and isinstance(r.get("name"), str)]
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return None, None
    if not isinstance(settings, dict):
        return None, None
    runs = _finished_runs(record)
    wanted = _as_run(json.loads(json.dumps(cfg.run_config(rung, seed).to_dict())))
    why = None
    for row in sorted(rows, key=lambda r: r["name"] != rung.name):  # its own row first: its why is the one told
        run = runs.get((row["name"], seed))
        if run is None or (row["name"] != rung.name and row.get("recipe") != rung.recipe):
            continue
        unlike = _row_unlike(row, run, rung, seed, wanted, cfg, config, record, row["name"] == first)
        if unlike == "":
            data = record.get("data")
            if not isinstance(data, dict) or data.get("sha256") != data_sha256:
                unlike = "trained on another corpus"
            else:
                cards = [c for c in run["cards"] if isinstance(c, str)] if isinstance(run.get("cards"), list) else []
                elsewhere = [c for c in cards if c != card] if card is not None else []
                unlike = f"trained on another card ({', '.join(elsewhere)})" if elsewhere else ""
        if unlike == "":
            named = "" if row["name"] == rung.name else f", its {row['name']} seed {seed}"
            return "", {**run, "reused_from": f"{(source / RECORD).resolve()}{named}"}
        if row["name"] == rung.name:
            why = unlike
    return why, None


def _row_unlike(row: dict, run: dict, rung: RaceRung, seed: int, wanted: dict, cfg: RaceConfig, config: dict,
                record: dict, first: bool) -> str:
    """How a recorded row's run of this seed, planned as its race planned it, differs from this rung's run here
    (`wanted`, as config.json holds it): "" where it is that run."""
    if row.get("recipe") != rung.recipe:
        return f"trained recipe {row.get('recipe')}, here {rung.recipe}"
    if step := step_unlike(row, rung):
        return f"ran its step {step.removeprefix('its step ran ')}"
    try:
        own = RaceRung(row["name"], rung.recipe, rung.step_rungs, rung.batch_size)
        own.settings  # a name whose settings do not read: a damaged row
    except UsageError:
        return "is a row whose name names no settings"
    ran = _recorded_run_config(cfg, own, seed, config, record.get("target_val_loss"), first)
    if isinstance(ran, str):
        return ran
    ran = _as_run(ran)
    other = sorted(k for k, v in wanted.items() if k not in REUSE_IGNORES and ran.get(k) != v)
    if other:
        return f"ran with other settings ({', '.join(other)})"
    if ran.get("eval_near") and config["settings"].get("target_val_loss") == BASELINE_TARGET:
        return "validated more often near its race's target then (--eval-near), which race.json does not keep"
    return ""


def _recorded_run_config(cfg: RaceConfig, rung: RaceRung, seed: int, config: dict, target, first: bool) -> dict | str:
    """The settings (as config.json holds them) of the run (rung, seed) of a recorded race, from what race.json
    keeps of its config (the settings its runs shared, its compile backend): this race's rung, planned on those
    settings. Where they plan no run (another model's shape; a batch this rung's micro-batch does not divide), why,
    in words."""
    settings = config["settings"]
    if json.loads(json.dumps(cfg.train.model.to_dict())) != settings.get("model"):
        return "ran on another model"
    backend = {"compile_backend": config["compile_backend"]} if "compile_backend" in config else {}
    held = with_defaults({**{k: v for k, v in settings.items() if k != "model"}, **backend})
    if held.get("target_val_loss") == BASELINE_TARGET:  # read off its gpt2 rung: its record's target
        held["target_val_loss"] = None if first else target
    shared = {k: tuple(v) if isinstance(v, list) else v for k, v in held.items()
              if k in TRAIN_FIELDS and (k not in RUN_OWN or k == "compile_backend")}
    try:
        planned = plan_run(dataclasses.replace(cfg.train, **shared), rung, seed)
    except (UsageError, ValueError, TypeError):  # settings no run of this rung can have
        now = json.loads(json.dumps({**cfg.settings(), "compile_backend": cfg.train.compile_backend}))
        other = sorted(k for k in shared if k != "target_val_loss" and now.get(k) != held.get(k))
        return f"ran with other settings ({', '.join(other) or 'that plan no run here'})"
    return json.loads(json.dumps(planned.to_dict()))


def _unlike(found: Path, cfg: TrainConfig, data_sha256: str, card: str | None = None) -> str | None:
    """How the run in `found` differs from a run of `cfg` on this corpus and `card` (None: any): "" where it is that
    run, finished (so it may be copied); None where it holds no readable run; else in words: the settings it ran with
    otherwise (named), another corpus, another card (named), or not finished."""
    try:
        held = json.loads((found / "config.json").read_text(encoding="utf-8"))
        entries = read_log(found / "log.jsonl")
    except (OSError, ValueError):
        return None
    settings = held.get("train_config") if isinstance(held, dict) else None
    data = held.get("data") if isinstance(held, dict) else None
    if not isinstance(settings, dict):
        return None
    wanted = _as_run(json.loads(json.dumps(cfg.to_dict())))  # as config.json holds it
    ran = _as_run(with_defaults(settings))  # a setting the run's version had no key for: its default
    other = sorted(k for k, v in wanted.items() if k not in REUSE_IGNORES and ran.get(k) != v)
    if other:
        return f"ran with other settings ({', '.join(other)})"
    if not isinstance(data, dict) or data.get("sha256") != data_sha256:
        return "trained on another corpus"
    elsewhere = [c for c in run_cards(found) if c != card] if card is not None else []
    if elsewhere:
        return f"trained on another card ({', '.join(elsewhere)})"
    return "" if _finished(entries, cfg) else "did not finish"


def reuse_miss(source: Path, cfg: RaceConfig, target: float | None, data_sha256: str,
               card: str | None = None) -> str | None:
    """Why a --reuse folder gives this race none of its runs, in words: the first of its runs of this race's rungs
    and seeds that says why (other settings, named; another corpus; another card; not finished), or that it holds
    none of them. None where one of its runs could be copied (the race stopped before it came to that run).
    `target`: the race's, as its record has it (under --target-val-loss gpt2, known once the gpt2 rung has run)."""
    if cfg.train.save_at_end:
        return "under --keep-weights every run is trained, since no weights are copied"
    why = []
    for i, rung in enumerate(cfg.rungs):
        if not (cfg.from_baseline and i == 0):  # the gpt2 rung's runs, which set the target, are planned without one
            if target is None:
                break
            cfg = cfg.with_target(target)
        for seed in range(cfg.seeds):
            found = run_dir(source, rung.name, seed)
            unlike = _unlike(found, cfg.run_config(rung, seed), data_sha256, card)
            if unlike is None and not found.is_dir():  # the run as the folder's race.json records it
                unlike = recorded_unlike(source, cfg, rung, seed, data_sha256, card)[0]
            if unlike == "":
                return None
            if unlike is not None:
                why.append(f"its {rung.name} seed {seed} {unlike}")
    return why[0] if why else "it holds no run of this race's rungs and seeds"


def _finished(entries: list[dict], cfg: TrainConfig) -> bool:
    """Whether a run's log ends finished: at the target, or at its last step with that step's validation."""
    return bool(entries) and (any("target" in e for e in entries) or (
        entries[-1]["step"] >= cfg.steps and (not cfg.eval_every or "val_loss" in entries[-1])))


def reused_from(where: Path) -> str | None:
    """The run a reused run's folder was copied from (`reused_run`), or None for a run trained here."""
    try:
        return json.loads((Path(where) / REUSED).read_text(encoding="utf-8"))["from"]
    except (OSError, ValueError, KeyError):
        return None


def run_result(entries: list[dict], cfg: TrainConfig, seed: int, where: Path) -> dict:
    """A finished run's figures from its log: to the target (None where it was not reached), its step time,
    MFU and validation curve. The curve's training seconds add up every logged step but each session's first
    (`warmup_steps`), as the trainer's clock does; its wall, validation and compile seconds are the clock's at that
    validation, where the log has it."""
    hit = next((e for e in entries if "target" in e), None)
    warm = warmup_steps(entries)
    curve, train_ms = [], 0.0
    for i, e in enumerate(entries):
        train_ms += 0.0 if i in warm else e["ms"]
        if "val_loss" in e:
            curve.append({"step": e["step"], "tokens": e["step"] * cfg.tokens_per_step,
                          "train_seconds": round(train_ms / 1000, 3), "val_loss": e["val_loss"], **clock_seconds(e)})
    timed = [e for i, e in enumerate(entries) if i not in warm] or entries
    mfus = [e["mfu"] for e in timed if e.get("mfu") is not None]
    result = {"seed": seed, "dir": str(where), "status": "ok", "cards": run_cards(where), "reached": hit is not None,
              "reused_from": reused_from(where),
              "steps_run": entries[-1]["step"], "planned_tokens": cfg.steps * cfg.tokens_per_step,
              "ms_per_step": statistics.median(e["ms"] for e in timed),
              "mfu": statistics.median(mfus) if mfus else None, "curve": curve}
    got = hit["target"] if hit else {}
    figures = {"train_seconds": got.get("train_s"), "wall_seconds": got.get("wall_s"), "tokens": got.get("tokens"),
               "steps": hit["step"] if hit else None, "warmup_seconds": got.get("warmup_s"),
               "validation_seconds": got.get("validation_s")}
    return {**result, **figures}


def clock_seconds(entry: dict) -> dict:
    """The wall, validation and compile seconds of the run's clock at a log entry; none in an older version's log."""
    clock = entry.get("clock") or {}
    return {name: clock[key] for name, key in CLOCK_SECONDS.items() if key in clock}


def warmup_steps(entries: list[dict]) -> set[int]:
    """The positions in a log of the steps that compiled and captured: those marked `warmup` (each session's first),
    and the log's first, which began a session whether or not the version that wrote it marked it."""
    marked = {i for i, e in enumerate(entries) if e.get("warmup")}
    return {0} | marked if entries else set()  # the first entry began a session, marked or not (an older version's)


def cards_of(rows: list[dict]) -> list[str]:
    """The cards the race's runs trained on, in the order they first appear: more than one, and their seconds are
    not one race's."""
    return list(dict.fromkeys(c for row in rows for run in row["runs"] for c in run.get("cards") or []))


def race_record(cfg: RaceConfig, device, caps: Capabilities, tokens, runs: dict[str, list[dict]],
                partial: bool) -> dict:
    """race.json: the record header, what was raced, and a row per rung that has run; `cards` the cards its runs
    trained on (the header's `device` is the card of the session that wrote it)."""
    rows = [rung_row(r, runs[r.name], cfg) for r in cfg.rungs if runs[r.name]]
    add_gains(rows, cfg.train.eval_every)
    data = {"source": tokens.source, "n_tokens": tokens.n_tokens, "sha256": tokens.sha256}
    return {**record_header(caps, device), "command": "race", "config": cfg.to_dict(), "cards": cards_of(rows),
            "target_val_loss": cfg.target, "target_source": cfg.target_source,
            "model": cfg.train.model.to_dict(), "data": data,
            "peak_flops": peak_flops(caps.name), "partial": partial, "rungs": rows}


def rung_row(rung: RaceRung, runs: list[dict], cfg: RaceConfig) -> dict:
    """A rung's row: each figure as its median and range over the seeds, and every seed's own."""
    ok = [r for r in runs if r["status"] == "ok"]
    failed = [r for r in runs if r["status"] != "ok"]
    run = cfg.run_config(rung, 0)
    complete = len(ok) == cfg.seeds
    reached = complete and all(r["reached"] for r in ok)
    status = "ok" if complete else (failed[0]["status"] if failed else "partial")
    row = {"name": rung.name, "recipe": rung.recipe, "step_rungs": list(rung.step_rungs),
           "batch_size": rung.batch_size, "status": status,
           "reason": failed[0]["reason"] if failed else None, "seeds_run": len(ok),
           "seeds_reached": sum(r["reached"] for r in ok), "reached": reached,
           "planned_tokens": run.steps * run.tokens_per_step, "tokens_per_step": run.tokens_per_step,
           "read_every": read_every(ok),
           "cards": list(dict.fromkeys(c for r in runs for c in r.get("cards") or []))}
    for key in METRICS:
        row[key] = spread([r[key] for r in ok], reached)
    for key in ("ms_per_step", "mfu"):
        values = [r[key] for r in ok if r[key] is not None]
        row[key] = statistics.median(values) if values else None
    row["runs"] = runs
    return row


def spread(values: list, reached: bool) -> dict:
    """{"median", "min", "max", "seeds"}: the median and range only where every seed reached the target (a seed
    that did not has no time to the target: it is beyond the budget, not a number to average)."""
    known = [v for v in values if v is not None]  # a figure a run did not record (a run made apart, read back)
    if not reached or not known:
        return {"median": None, "min": None, "max": None, "seeds": values}
    return {"median": statistics.median(known), "min": min(known), "max": max(known), "seeds": values}


def base_row(rows: list[dict], i: int) -> dict | None:
    """The row that row i's gain is read against: the row before it, except for a rung written with `+` or `-`, which
    is read against the longest start of its name the race has raced before it: the rung its last part is added to
    or taken from (`speedrun+unet_skips+doc_windows` against `speedrun+unet_skips`, not against a
    `speedrun+unet_skips+polar_express` raced between them; `speedrun-wsd` against `speedrun`), else the one before
    that (`speedrun-rope-qk_norm` against `speedrun` where no `speedrun-rope` ran)."""
    if i == 0:
        return None
    base, settings = split_settings(rows[i]["name"])
    if settings:  # a rung with settings of its own against the rung whose recipe it trains
        return next((row for row in reversed(rows[:i]) if row["name"] == base), rows[i - 1])
    pieces = _SIGNS.split(rows[i]["name"])
    for end in range(len(pieces) - 2, 0, -2):  # all but the last sign and its piece, then one fewer, ...
        head = "".join(pieces[:end])
        try:
            recipe = (stacked_recipe(head) if is_written(head) else parse_recipe(head)).name
        except UsageError:  # no recipe alone (momentum_warmup+speedrun: momentum_warmup without muon)
            continue
        for row in reversed(rows[:i]):
            if row["recipe"] == recipe and SET not in row["name"]:
                return row
    return next((row for row in reversed(rows[:i]) if SET not in row["name"]), rows[i - 1])


def read_every(runs: list[dict]) -> int | None:
    """The resolution of a rung's time: the most steps, over its runs that reached the target, between the validation
    its time was read at and the validation before it (`eval_every`, or fewer where --eval-near validated more often
    near the target); None where no run's curve says."""
    gaps = []
    for run in runs:
        steps = [point["step"] for point in run.get("curve") or []]
        if run.get("reached") and run.get("steps") in steps:
            at = steps.index(run["steps"])
            gaps.append(run["steps"] - (steps[at - 1] if at else 0))
    return max(gaps) if gaps else None


def add_gains(rows: list[dict], eval_every: int | None = None) -> None:
    """Each row's gain over its `base_row` (`gain_vs` names it) in training seconds to the target (that row's median
    over this one's), whether the two are within noise (their seeds' ranges overlap), and whether their medians lie
    nearer than one validation interval (a row's `read_every` steps, else `eval_every`, at its step time, the
    longer of the two rows'): the time is read at
    validations, so a run that crosses the target one validation sooner on slower steps may gain less than the
    reading can tell. And seed by seed (`seeds_earlier`), which the noise rule does not read: in how many of the seeds
    both rows ran this row reached the target at an earlier validation. (The `_prev` keys keep the names records
    have had: "prev" is the base row.)"""
    for i, row in enumerate(rows):
        prev = base_row(rows, i)
        row["gain_vs"] = prev and prev["name"]
        row["gain_vs_prev"] = row["within_noise_of_prev"] = row["within_one_validation_of_prev"] = None
        row["seeds_earlier"] = None
        if prev is not None and row["reached"] and prev["reached"]:
            now, before = row["train_seconds"], prev["train_seconds"]
            row["gain_vs_prev"] = before["median"] / now["median"] if now["median"] > 0 else None
            row["within_noise_of_prev"], row["within_one_validation_of_prev"] = noise_rule(row, prev, eval_every)
            row["seeds_earlier"] = seeds_earlier(row, prev)


def seeds_earlier(row: dict, other: dict) -> dict | None:
    """{"earlier", "of"}: of the seeds both rows' runs reached the target in with their steps known (`of`), those in
    which this row's run reached it at an earlier validation (on fewer tokens: a rung may step on a batch of its own)
    than the other row's run of the same seed; None where they share none. The time's gain also counts the step's
    speed; this counts the validations alone."""
    both = all(r.get("tokens_per_step") for r in (row, other))  # else read in steps: one batch for every row

    def tokens(r: dict) -> dict:
        per_step = r["tokens_per_step"] if both else 1
        return {run["seed"]: run["steps"] * per_step for run in r.get("runs") or []
                if run.get("status") == "ok" and run.get("reached") and run.get("steps") is not None}
    mine, theirs = tokens(row), tokens(other)
    shared = sorted(mine.keys() & theirs.keys())
    if not shared:
        return None
    return {"earlier": sum(mine[s] < theirs[s] for s in shared), "of": len(shared)}


def noise_rule(row: dict, other: dict, eval_every: int | None) -> tuple[bool, bool | None]:
    """Whether two reached rows' training seconds are within noise (their seeds' ranges overlap), and whether their
    medians lie nearer than one validation interval (each row's `read_every` steps, else `eval_every`, at its own
    step time, the longer of the two; None where a step time or the interval is unknown)."""
    a, b = row["train_seconds"], other["train_seconds"]
    nearer = None
    every = [r.get("read_every") or eval_every for r in (row, other)]
    if all(every) and row["ms_per_step"] and other["ms_per_step"]:
        interval = max(e * r["ms_per_step"] for e, r in zip(every, (row, other))) / 1000
        nearer = abs(a["median"] - b["median"]) < interval
    return overlap(a, b), nearer


def overlap(a: dict, b: dict) -> bool:
    """Whether two ranges {"min", "max"} overlap (one seed each: the same value)."""
    return a["min"] <= b["max"] and b["min"] <= a["max"]


def budgets_record(records: list[dict], device, caps: Capabilities, partial: bool) -> dict:
    """budgets.json (`race --steps A,B,...`): per budget, the race planned for that many steps (its race.json in
    steps-N/), its target, and per rung the training seconds to that target (median, range, seeds), and the
    median's share of the first rung's median: how much of the first rung's time the rung needs at that budget,
    with the race's noise rule against the first rung (its seeds' ranges overlap: within noise; the medians nearer
    than one validation interval: under one validation)."""
    budgets = []
    for rec in records:
        s = rec["config"]["settings"]
        first = rec["rungs"][0] if rec["rungs"] else None
        base = first["train_seconds"]["median"] if first and first["reached"] else None
        rows = []
        for r in rec["rungs"]:
            row = {"name": r["name"], "recipe": r["recipe"], "reached": r["reached"], "status": r["status"],
                   "train_seconds": r["train_seconds"], "tokens": r["tokens"], "ms_per_step": r["ms_per_step"],
                   "tokens_per_step": r.get("tokens_per_step", s["tokens_per_step"]),
                   "share_of_first": None, "within_noise_of_first": None, "within_one_validation_of_first": None}
            if base and r["reached"] and r["train_seconds"]["median"] is not None:
                row["share_of_first"] = r["train_seconds"]["median"] / base
                if r is not first:
                    row["within_noise_of_first"], row["within_one_validation_of_first"] = noise_rule(
                        r, first, s["eval_every"])
            rows.append(row)
        budgets.append({"steps": s["steps"], "tokens_per_step": s["tokens_per_step"],
                        "planned_tokens": s["steps"] * s["tokens_per_step"], "target_val_loss": rec["target_val_loss"],
                        "target_source": rec["target_source"], "partial": rec["partial"], "cards": rec.get("cards"),
                        "target_from_gpt2": s.get("target_val_loss") == BASELINE_TARGET,
                        "race": f"steps-{s['steps']}/race.json", "rungs": rows})
    return {**record_header(caps, device), "command": "race", "kind": "budgets", "partial": partial,
            "budgets": budgets, "shortest": shortest_budgets(budgets)}


def shortest_budgets(budgets: list[dict]) -> list[dict] | None:
    """Where every budget races to one target (a number given, or the corpus's): per rung, the shortest planned
    budget whose every seed reached it, and the median training seconds there (steps None: none of them did).
    None where the budgets' targets are each gpt2's after that budget, or one is not set yet, or one budget ran."""
    targets = {b["target_val_loss"] for b in budgets}
    if len(budgets) < 2 or len(targets) != 1 or None in targets or any(b.get("target_from_gpt2") for b in budgets):
        return None
    names = list(dict.fromkeys(r["name"] for b in budgets for r in b["rungs"]))
    out = []
    for name in names:
        rows = [(b["steps"], r) for b in sorted(budgets, key=lambda b: b["steps"]) for r in b["rungs"]
                if r["name"] == name and r["status"] == "ok" and r["reached"]]
        steps, row = rows[0] if rows else (None, None)
        out.append({"name": name, "steps": steps, "train_seconds": row and row["train_seconds"]})
    return out
