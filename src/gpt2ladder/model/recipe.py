"""What is trained, apart from how a step runs: a recipe is a model family with its parts, an optimizer and a
learning-rate schedule.

`--recipe gpt2` (the default) is GPT-2 with AdamW and warm-up + cosine, the write-up's recipe. A recipe is
otherwise a comma list of parts, each switching one thing on top of GPT-2 (`--recipe muon,rope,relu2`);
`speedrun` names the list at the top of the race, and an item may add parts with `+` and take them away
with `-`, read left to right (`--recipe speedrun-relu2`, the race's ablation rung of that name). The step
ladder's rungs (`ladder.py`) say how a step of whichever recipe runs; the race (`gpt2ladder race`) climbs these
parts one at a time, judged by the time to a target validation loss.

A recipe resolves into three plain settings that travel down apart: the model's `family` and `parts`
(`ModelConfig`), the optimizer's name (`runtime/optim.py`) and the schedule's name (`training/schedule.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpt2ladder.errors import UsageError


@dataclass(frozen=True)
class Part:
    name: str
    kind: str  # "model", "optimizer" or "schedule": which of the three settings it changes
    summary: str  # one sentence: what it changes


VALUE_EMBED_TABLES = 3  # the value_embeds part's tables: the first and the last this many Blocks use one each
# The doc_windows part's sliding window, in tokens: half the default sequence of 1024, so that the window cuts the
# attention's work in long documents (a query sees at most this many keys) and still reaches far back.
DOC_WINDOW = 512

# In the race's order: rung k of the race is parts 0..k on top of GPT-2 (`gpt2`, the race's first rung).
PARTS: tuple[Part, ...] = (
    Part("muon", "optimizer", "The Blocks' matrices are updated by Muon (momentum, then orthogonalised by a "
         "Newton-Schulz iteration, c_attn's q, k and v apart); embeddings, head, biases and gains by AdamW, "
         "each group at its own learning rate."),
    Part("rope", "model", "Rotary position embeddings rotate each head's queries and keys by their position; the "
         "learned position table goes."),
    Part("qk_norm", "model", "Queries and keys are RMS-normalised per head before attention, which bounds the "
         "attention logits."),
    Part("relu2", "model", "The MLP's GELU becomes ReLU squared."),
    Part("rmsnorm", "model", "Every layer norm becomes an RMS norm without gains, and no Linear has a bias."),
    Part("zero_init", "model", "The attention's and MLP's output projections start at zero, so every Block starts "
         "as the identity."),
    Part("untied_head", "model", "The classifier gets its own weight (initialised at zero) instead of sharing the "
         "token embedding's."),
    Part("softcap", "model", "The logits are soft-capped, 15 tanh(z / 15), which keeps them bounded."),
    Part("value_embeds", "model", f"{VALUE_EMBED_TABLES} more token-embedding tables are looked up from the input "
         f"tokens and mixed into the values of the first {VALUE_EMBED_TABLES} and the last {VALUE_EMBED_TABLES} "
         "Blocks' attention, v <- a v + b ve, with a and b learned per Block."),
    Part("unet_skips", "model", "The outputs of the first half of the Blocks are kept and added, in reverse order "
         "and each scaled by a learned weight, to the inputs of the second half."),
    Part("doc_windows", "model", "A token attends only to the earlier tokens of its own document (documents begin "
         f"at <|endoftext|>) within a sliding window of the last {DOC_WINDOW}, through FlexAttention where it "
         "compiles on a GPU."),
    Part("wsd", "schedule", "The learning rate stays at its peak after warm-up and decays linearly to the floor "
         "over the last 40% of the steps (stable, then decay), where cosine decays all along."),
    Part("momentum_warmup", "optimizer", "Muon's momentum rises linearly from 0.85 to 0.95 over the first 300 steps "
         "instead of starting at 0.95 (it needs muon)."),
    Part("polar_express", "optimizer", "Muon's orthogonalisation takes each of its 5 steps with its own "
         "coefficients, the odd quintic nearest to 1 on the range the singular values are in by then (Polar "
         "Express), so the update's singular values end nearer 1 (it needs muon)."),
    Part("bf16_tables", "model", "The tables that are only looked up (the untied token embedding, the position table, "
         "the value embeddings' tables) are kept in bf16, and so their gradients and AdamW's moments: half the bytes "
         "their update reads and writes (it needs muon, which decays no table, and untied_head)."),
    Part("embed_skips", "model", "Every Block's input mixes in the embedded tokens, x <- a x + b x0 (x0 the residual "
         "stream's start), with a (from 1) and b (from 0) learned per Block, so each layer can read the tokens "
         "themselves again."),
)

PARTS_BY_NAME = {p.name: p for p in PARTS}
MODEL_PARTS = tuple(p.name for p in PARTS if p.kind == "model")
SOFTCAP = 15.0  # the softcap part's cap on the logits
WSD_DECAY_FRACTION = 0.4  # the wsd part's share of the steps spent decaying
# The momentum_warmup part's Muon momentum: from the first to the second over the first MOMENTUM_WARMUP_STEPS steps,
# as modded-nanogpt's records since late 2024 warm it (0.85 to 0.95 over 300 steps); without the part, the second.
MOMENTUM_WARMUP = (0.85, 0.95)
MOMENTUM_WARMUP_STEPS = 300
# The parts that change Muon, so a recipe with one needs muon: what each does to it.
MUON_ONLY = {"momentum_warmup": "warms Muon's momentum", "polar_express": "changes Muon's orthogonalisation",
             "bf16_tables": "keeps tables in bf16, where AdamW's weight decay (under muon, none) would round away"}
# The race's top, written out: a part joins it only once the race has shown it beats the rung before it by more
# than the seeds' spread (a new part is not in it by being in PARTS).
SPEEDRUN = ("muon", "rope", "qk_norm", "relu2", "rmsnorm", "zero_init", "untied_head", "softcap", "value_embeds", "wsd")


@dataclass(frozen=True)
class Recipe:
    """A model family with its parts, an optimizer and a schedule. `parts` are in `PARTS` order."""

    parts: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The canonical spelling `--recipe` takes back: gpt2, or the parts in order."""
        return ",".join(self.parts) if self.parts else "gpt2"

    @property
    def family(self) -> str:
        """"gpt2" when no model part is on (the model is GPT-2 itself), else "modern"."""
        return "modern" if self.model_parts else "gpt2"

    @property
    def model_parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.parts if p in MODEL_PARTS)

    @property
    def optimizer(self) -> str:
        return "muon" if "muon" in self.parts else "adamw"

    @property
    def schedule(self) -> str:
        return "wsd" if "wsd" in self.parts else "cosine"

    @property
    def momentum_warmup(self) -> bool:
        """Muon's momentum follows `training/schedule.momentum_at` instead of staying at its peak."""
        return "momentum_warmup" in self.parts

    @property
    def polar_express(self) -> bool:
        """Muon orthogonalises with `runtime/optim.POLAR_EXPRESS`'s coefficients, one set a step."""
        return "polar_express" in self.parts

    def has(self, part: str) -> bool:
        return part in self.parts


GPT2 = Recipe()


def parse_recipe(spec: str | None) -> Recipe:
    """`gpt2` (or None), `speedrun`, or a comma list of items, each a part, `speedrun` (its parts) or `gpt2` (none),
    or such names written with `+` and `-` (`speedrun-relu2`: `written_parts`); the recipe has every item's parts,
    put in `PARTS` order (so `speedrun,unet_skips` is the speedrun with U-net skips on top)."""
    if spec is None or spec.strip() == "gpt2":
        return GPT2
    if spec.strip() == "speedrun":
        return Recipe(SPEEDRUN)
    if "@" in spec:  # a race rung's settings (speedrun@muon_lr=0.03): train takes them as flags
        name, *settings = (piece.strip() for piece in spec.split("@"))
        pairs = [tuple(p.strip() for p in setting.split("=", 1)) for setting in settings]
        said = f"recipe {spec.strip()!r}: @ gives a race rung settings of its own"
        if not name or any(len(pair) != 2 or not all(pair) for pair in pairs):
            raise UsageError(f"{said}, written name@key=value; train takes them as flags (--recipe speedrun "
                             "--muon-lr 0.03)")
        flags = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in pairs)
        raise UsageError(f"{said}; train takes them as flags: --recipe {name} {flags}")
    items = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in items if not SIGNS.search(n) and n not in NAMES]
    if unknown or not items:
        raise UsageError(f"unknown recipe part {', '.join(unknown) or repr(spec)}; choose from: {', '.join(NAMES)}")
    try:
        names = [p for n in items for p in written_parts(n)]
    except UsageError as err:
        raise UsageError(f"recipe {spec.strip()!r}: {err}") from None
    if not names:  # `gpt2,gpt2`: GPT-2's own
        return GPT2
    for part, what in MUON_ONLY.items():
        if part in names and "muon" not in names:
            raise UsageError(f"recipe {spec.strip()!r}: {part} {what}, and the recipe has no muon; add muon (or "
                             "speedrun) to it")
    if "bf16_tables" in names and "untied_head" not in names:
        raise UsageError(f"recipe {spec.strip()!r}: bf16_tables keeps the token embedding in bf16 only where it is "
                         "not the classifier's weight too; add untied_head (or speedrun) to it")
    order = {p.name: i for i, p in enumerate(PARTS)}
    return Recipe(tuple(sorted(dict.fromkeys(names), key=order.__getitem__)))



def recipe_label(recipe: str | None) -> str:
    """How a run or a report names its recipe (`--recipe`, or a record's canonical name) to a person: speedrun where
    it is exactly speedrun's parts, else its canonical name (gpt2, or the parts in order)."""
    parsed = parse_recipe(recipe)
    return "speedrun" if parsed.parts == SPEEDRUN else parsed.name

# A recipe's name written with signs, read left to right: `+` adds the parts of the name after it, `-` takes them
# away (`speedrun-relu2+unet_skips`). The race names the rungs of such recipes so.
ADD, TAKE = "+", "-"
SIGNS = re.compile(r"\s*([" + re.escape(ADD + TAKE) + r"])\s*")
NAMES = ("gpt2", "speedrun", *(p.name for p in PARTS))
assert not any(SIGNS.search(n) for n in NAMES), "a part's name may not hold + or -"


def written_parts(name: str) -> tuple[str, ...]:
    """The parts of one name written with `+` and `-`, in the order they come: `speedrun-wsd` is speedrun's parts
    but wsd, `gpt2+muon` muon alone; a name without signs is its own parts. A UsageError for an unknown name, a part
    added that is none (`+gpt2`) or taken away that is not there, parts all taken away (even partway, as in
    `muon-muon+rope`), and an empty piece beside a sign."""
    pieces = SIGNS.split(name.strip())  # [first, sign, piece, sign, piece, ...]
    if not all(pieces):
        raise UsageError(f"it has an empty part beside a {ADD} or {TAKE} sign; write parts joined by {ADD} or taken "
                         f"away by {TAKE}, such as speedrun{ADD}unet_skips or speedrun{TAKE}wsd")
    parts = list(_parts_of(pieces[0]))
    for sign, piece in zip(pieces[1::2], pieces[2::2]):
        named = _parts_of(piece)
        if sign == ADD:
            if not named:
                raise UsageError(f"it adds {piece}, which is no part")
            parts += [p for p in named if p not in parts]
        elif not named or any(p not in parts for p in named):
            raise UsageError(f"it takes away {piece}, which the parts before it do not have")
        else:
            parts = [p for p in parts if p not in named]
            if not parts:
                raise UsageError("it takes every part away, which leaves GPT-2: name gpt2 instead")
    return tuple(parts)


def _parts_of(name: str) -> tuple[str, ...]:
    if name not in NAMES:
        raise UsageError(f"unknown recipe part {name}; choose from: {', '.join(NAMES)}")
    return SPEEDRUN if name == "speedrun" else () if name == "gpt2" else (name,)


def with_recipe(model: "ModelConfig", recipe: str | Recipe) -> "ModelConfig":
    """The shape with the recipe's model parts on (and no others)."""
    import dataclasses

    recipe = parse_recipe(recipe) if isinstance(recipe, str) else recipe
    return dataclasses.replace(model, parts=recipe.model_parts)


def race_recipes(names: list[str]) -> list[Recipe]:
    """Rung k of the race: GPT-2 with the first k of `names` (which start with "gpt2") switched on."""
    recipes, parts = [], []
    for name in names:
        if name != "gpt2":
            parts.append(name)
        recipes.append(parse_recipe(",".join(parts) or "gpt2"))
    return recipes
