"""The modern family: GPT-2's network with the parts of the recipes switched on one at a time.

Each part is a small named unit below (rotary positions, QK-norm, ReLU^2, RMS norm without gains and no
biases, zero-initialised output projections, an untied head, soft-capped logits); `ModelConfig.parts` says
which are on. With none on, `ModernGPT` builds the same modules, in the same order and under the same
names, as `GPT`, draws the same initial weights and computes the same function: each part is then the only
difference from GPT-2 (a test holds both). The module names stay GPT-2's (`c_attn`, `c_fc`, `c_proj`, `ln_1`,
...), so the generic step rungs find the same seams; the rewrites written for GPT-2's exact blocks decline
this family in one line (`ladder.py`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, Branch, Classifier, init_weights, manual_attention, split_heads
from gpt2ladder.model.recipe import SOFTCAP

ROPE_BASE = 10000.0  # the rotary frequencies' base, as in RoFormer and Llama


class RMSNorm(nn.Module):
    """The rmsnorm part's norm: x / rms(x), no gain and no bias (nothing to learn)."""

    def __init__(self, n_embd: int):
        super().__init__()
        self.n_embd = n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.n_embd,))


def norm(cfg: ModelConfig) -> nn.Module:
    return RMSNorm(cfg.n_embd) if cfg.has("rmsnorm") else nn.LayerNorm(cfg.n_embd)


def rotary_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency, (block_size, head_size / 2) in fp32: the rope part's rotation angles."""
    half = cfg.head_size // 2
    freqs = ROPE_BASE ** (-torch.arange(half, dtype=torch.float32) / half)  # (hs/2,)
    angles = torch.outer(torch.arange(cfg.block_size, dtype=torch.float32), freqs)  # (T, hs/2)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rope part: each pair (x1, x2) of a head's halves turned by its position's angle. x: (B, nh, T, hs)."""
    T = x.shape[-2]
    cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)  # (T, hs/2), broadcast over batch and heads
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def qk_norm(x: torch.Tensor) -> torch.Tensor:
    """The qk_norm part: a head's query or key divided by its RMS over the head's dimensions (epsilon: the machine
    epsilon of x's dtype, c_attn's output's, whatever autocast computes the norm in)."""
    return F.rms_norm(x, (x.shape[-1],), eps=torch.finfo(x.dtype).eps)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """The relu2 part's activation: ReLU squared."""
    return F.relu(x).square()


class ModernAttention(Branch):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        bias = not cfg.has("rmsnorm")
        self.n_head = cfg.n_head
        self.attention = cfg.attention
        self.qk_norm = cfg.has("qk_norm")
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=bias)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=bias)
        self.c_proj.residual_scaled = True
        self.rope = cfg.has("rope")
        if self.rope:  # not saved: made again from the shape
            cos, sin = rotary_tables(cfg)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        if cfg.attention == "manual":
            mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
            self.register_buffer("bias", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def in_proj(self) -> tuple[nn.Linear, bool]:
        return self.c_attn, self.c_attn.bias is not None

    def after_in_proj(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(qkv, self.n_head)  # (B, nh, T, hs) each
        if self.qk_norm:
            q, k = qk_norm(q), qk_norm(k)
        if self.rope:
            q, k = rotate(q, self.rope_cos, self.rope_sin), rotate(k, self.rope_cos, self.rope_sin)
        B, nh, T, hs = q.shape
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = manual_attention(q, k, v, self.bias[:, :, :T, :T])
        return y.transpose(1, 2).contiguous().view(B, T, nh * hs)  # (B, T, C)


class ModernMLP(Branch):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        bias = not cfg.has("rmsnorm")
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=bias)
        self.act = relu2 if cfg.has("relu2") else nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=bias)
        self.c_proj.residual_scaled = True

    def in_proj(self) -> tuple[nn.Linear, bool]:
        return self.c_fc, self.c_fc.bias is not None

    def after_in_proj(self, h: torch.Tensor) -> torch.Tensor:
        return self.act(h)


class ModernBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = norm(cfg)
        self.attn = ModernAttention(cfg)
        self.ln_2 = norm(cfg)
        self.mlp = ModernMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ModernGPT(GPT):
    """GPT with the recipe's model parts; `forward`, `hidden`'s contract and the loss are GPT's."""

    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.config = cfg
        modules = dict(wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd))
        if not cfg.has("rope"):
            modules["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        modules.update(h=nn.ModuleList(ModernBlock(cfg) for _ in range(cfg.n_layer)), ln_f=norm(cfg))
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = Classifier(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        if cfg.has("softcap"):
            self.lm_head.softcap = SOFTCAP
        if not cfg.has("untied_head"):
            self.transformer.wte.weight = self.lm_head.weight  # tied, as in GPT-2

    @property
    def tied(self) -> bool:
        return self.transformer.wte.weight is self.lm_head.weight

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(idx.shape[1], device=idx.device))
        return x

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once; with non_embedding, less the tables that are looked up rather than multiplied
        (the position table, and an untied token embedding), so 6N counts the matmuls' FLOPs."""
        n = sum(p.numel() for p in self.parameters())
        if not non_embedding:
            return n
        if "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n if self.tied else n - self.transformer.wte.weight.numel()


def parameter_count(cfg: ModelConfig, padded_vocab: int) -> int:
    """Parameters of the model this shape builds (a tied classifier counted once), from the shape alone: what
    the batch planner reads before any model exists."""
    C, bias = cfg.n_embd, not cfg.has("rmsnorm")
    gains = 0 if cfg.has("rmsnorm") else 2 * C  # a LayerNorm's weight and bias
    block = 12 * C * C + (9 * C if bias else 0) + 2 * gains  # c_attn, c_proj, c_fc, c_proj; biases; two norms
    table = padded_vocab * C * (2 if cfg.has("untied_head") else 1)
    positions = 0 if cfg.has("rope") else cfg.block_size * C
    return table + positions + cfg.n_layer * block + gains


@torch.no_grad()
def init_modern_weights(model: ModernGPT, seed: int) -> ModernGPT:
    """GPT-2's initialisation (`gpt.init_weights`: the same draws in the same order), then the parts' own: zero
    output projections (zero_init; drawn first, so the other weights keep GPT-2's numbers), a zero classifier
    (untied_head)."""
    init_weights(model, seed)
    if model.config.has("zero_init"):
        for module in model.modules():
            if isinstance(module, nn.Linear) and getattr(module, "residual_scaled", False):
                module.weight.zero_()
    if not model.tied:
        model.lm_head.weight.zero_()
    return model
