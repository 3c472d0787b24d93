"""The model families, each with what the rest of the package asks of it: how to build and initialise one,
and how many parameters a shape has before any is built.

`gpt2` is GPT-2 itself (`gpt.py`); `modern` is GPT-2 with the recipe's model parts switched on (`modern.py`).
Which family a `ModelConfig` is follows from its parts.
"""

from __future__ import annotations

from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.modern import ModernGPT, bf16_table_count, init_modern_weights, parameter_count


def build(cfg: ModelConfig) -> GPT:
    """An uninitialised model of cfg's family."""
    return ModernGPT(cfg) if cfg.family == "modern" else GPT(cfg)


def initialise(model: GPT, seed: int) -> GPT:
    """The family's initialisation; the weights depend on the seed alone (drawn on the CPU)."""
    return init_modern_weights(model, seed) if isinstance(model, ModernGPT) else init_weights(model, seed)


def built(cfg: ModelConfig, seed: int) -> GPT:
    return initialise(build(cfg), seed)


def parameters(cfg: ModelConfig) -> int:
    """Parameters of the model cfg builds (the tied classifier counted once), without building it: GPT-2's
    count is the modern family's with no part on."""
    return parameter_count(cfg, cfg.padded_vocab_size)


def bf16_table_parameters(cfg: ModelConfig) -> int:
    """Parameters of the tables the bf16_tables part keeps in bf16 (0 without it), without building the model."""
    return bf16_table_count(cfg, cfg.padded_vocab_size)


def matrix_parameters(cfg: ModelConfig) -> int:
    """Parameters of the Blocks' matrices: the ones Muon updates."""
    return cfg.n_layer * 12 * cfg.n_embd ** 2

