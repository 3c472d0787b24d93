"""Model shapes and presets: what GPT-2 is, independent of how fast it runs.

How it runs (precision, compile, attention kernel, vocabulary padding, ...) is a `Setup`, built by
the ladder's rungs (`ladder.py`); the engine copies the three fields of a setup that change the
model's tensors (attention implementation, vocabulary padding, the residual stream's dtype) into the
`ModelConfig` it builds (`runtime/engine.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpt2ladder.errors import UsageError
from gpt2ladder.model.recipe import MODEL_PARTS

GPT2_VOCAB_SIZE = 50257  # 50,000 BPE merges + 256 byte tokens + <|endoftext|>


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = GPT2_VOCAB_SIZE
    # Rows of the embedding/classifier are padded up to a multiple of this; 1 means no padding.
    vocab_multiple: int = 1
    # "manual": the four-line attention with an explicit causal mask (the write-up's baseline).
    # "sdpa": F.scaled_dot_product_attention(is_causal=True), which dispatches to flash kernels.
    attention: str = "manual"
    # Under autocast, keep the residual stream between Blocks in autocast's dtype instead of fp32. Off
    # autocast it changes nothing, so the same weights evaluate and sample anywhere.
    low_precision_residual: bool = False
    # The modern family's parts that are on (`model/recipe.py`, MODEL_PARTS); none: GPT-2 itself.
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "vocab_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:  # before any division by it
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        object.__setattr__(self, "parts", tuple(self.parts))  # a list, as JSON gives it back, is the same parts
        if unknown := [p for p in self.parts if p not in MODEL_PARTS]:
            raise UsageError(f"unknown model part {', '.join(unknown)}; choose from: {', '.join(MODEL_PARTS)}")
        if "rope" in self.parts and self.head_size % 2:
            raise UsageError(f"rotary positions need an even head size; {self.n_embd} / {self.n_head} is odd")
        if "unet_skips" in self.parts and self.n_layer < 2:
            raise UsageError("U-Net skips join a first half of the Blocks to a second; n_layer=1 has no halves")
        if self.n_embd % self.n_head:
            raise UsageError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.attention not in ("manual", "sdpa"):
            raise UsageError(f"unknown attention {self.attention!r} (choose manual or sdpa)")

    @property
    def padded_vocab_size(self) -> int:
        """Rows actually allocated: vocab_size rounded up to vocab_multiple (50257 -> 50304 at 128)."""
        m = self.vocab_multiple
        return (self.vocab_size + m - 1) // m * m

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def family(self) -> str:
        """"gpt2", or "modern" when any of the modern family's parts is on (`model/modern.py`)."""
        return "modern" if self.parts else "gpt2"

    def has(self, part: str) -> bool:
        return part in self.parts

    def to_dict(self) -> dict:
        """The fields; `parts` only when there are any, so GPT-2's records read as they always have."""
        d = dataclasses.asdict(self)
        if not self.parts:
            del d["parts"]
        else:
            d["parts"] = list(self.parts)
        return d


PRESETS: dict[str, ModelConfig] = {
    # A CPU-sized GPT-2: same code paths, the real GPT-2 tokenizer, seconds per rung on two cores.
    "tiny": ModelConfig(n_layer=2, n_head=4, n_embd=128, block_size=256),
    "gpt2": ModelConfig(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": ModelConfig(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": ModelConfig(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": ModelConfig(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None


def check_run_shape(model: ModelConfig, preset_name: str, **counts: int) -> None:
    """One-line usage errors for non-positive counts (batch_size, seq_len, steps; warmup may be 0)
    and for a sequence longer than the model's block size (`preset_name` names the model)."""
    for name, value in counts.items():
        if value < 0 or (value == 0 and name != "warmup"):
            kind = "zero or more" if name == "warmup" else "a positive integer"
            raise UsageError(f"--{name.replace('_', '-')} must be {kind}, got {value}")
    if counts.get("seq_len", 0) > model.block_size:
        raise UsageError(f"--seq-len {counts['seq_len']} exceeds the {preset_name} block size of {model.block_size}")
