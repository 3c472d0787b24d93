"""GPT-2: the network itself, in OpenAI/Hugging Face parameter names so real GPT-2 weights load by name.

Nothing here knows about speed-ups beyond the three that change the model's tensors, all read from
`ModelConfig`: which attention kernel runs, how many vocabulary rows are allocated and whether the
residual stream follows autocast's dtype. The rewrites of `speedups/` replace modules (the classifier,
MLPs, Linears) by others holding the same parameters; every other rung (precision, compile, fused
optimizer, ...) acts from outside, in `runtime/engine.py`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.model.config import ModelConfig


class Branch(nn.Module):
    """A Block's attention or MLP: an input projection, what follows it, then the output projection `c_proj`; the
    seams the speed-ups cut at (speedups/norm_block.py, speedups/fp8_forward.py)."""

    # Whether the input projection's bias, added in its matmul, takes its gradient from after_in_proj's backward
    # instead of the matmul's (speedups/qkv_grad.py).
    in_bias_grad_apart = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.pre_proj(x))

    def pre_proj(self, x: torch.Tensor) -> torch.Tensor:
        """Everything before the output projection c_proj."""
        return self.after_in_proj(self.in_product(x))

    def in_product(self, x: torch.Tensor) -> torch.Tensor:
        """The input projection of x, as after_in_proj takes it (a branch whose input bias is added elsewhere, or
        takes its gradient elsewhere, overrides this)."""
        linear, _ = self.in_proj()
        return linear(x)

    def in_proj(self) -> tuple[nn.Linear, bool]:
        """The input projection's Linear, and whether its bias is added in its matmul."""
        raise NotImplementedError

    def after_in_proj(self, h: torch.Tensor) -> torch.Tensor:
        """From the input projection's output to c_proj's input."""
        raise NotImplementedError


class CausalSelfAttention(Branch):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.attention = cfg.attention
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.c_proj.residual_scaled = True
        if cfg.attention == "manual":
            # Lower-triangular mask; not saved, so checkpoints of both attentions are interchangeable.
            mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
            self.register_buffer("bias", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def in_proj(self) -> tuple[nn.Linear, bool]:
        return self.c_attn, True

    def after_in_proj(self, qkv: torch.Tensor) -> torch.Tensor:
        """From c_attn's output, q, k and v side by side (B, T, 3C), to the heads' outputs, (B, T, C)."""
        return self.attend(*self.split_heads(qkv))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The heads' outputs, (B, T, C), from q, k, v (B, nh, T, hs)."""
        B, nh, T, hs = q.shape
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        else:
            y = manual_attention(q, k, v, self.bias[:, :, :T, :T])
        return y.transpose(1, 2).contiguous().view(B, T, nh * hs)  # (B, T, C)

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (B, nh, T, hs) views of c_attn's output (B, T, 3C)."""
        return split_heads(qkv, self.n_head)


def split_heads(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (B, nh, T, hs) views of (B, T, 3C), q, k and v side by side."""
    B, T, C = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    return tuple(t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in qkv.split(C, dim=2))


def manual_attention(q, k, v, mask: torch.Tensor) -> torch.Tensor:
    """The write-up's four lines: the (T, T) score matrix is written to memory and read back four times."""
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
    att = att.masked_fill(~mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v  # (B, nh, T, hs)


class MLP(Branch):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.c_proj.residual_scaled = True

    def in_proj(self) -> tuple[nn.Linear, bool]:
        return self.c_fc, True

    def after_in_proj(self, h: torch.Tensor) -> torch.Tensor:
        """The GELU's output, (B, T, 4C)."""
        return self.gelu(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Classifier(nn.Linear):
    """The classifier (lm_head), tied to the token embedding: logits over the padded vocabulary.

    `loss` is its training loss. The fused-loss rewrite replaces the head by a subclass with `fused`
    set, whose loss forms the gradients in the forward pass and returns no logits.
    """

    fused = False
    # Set by the softcap part (`model/modern.py`): logits become softcap * tanh(z / softcap). None: plain logits.
    softcap: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)

    def loss(self, x: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        return cross_entropy(self(x), targets, vocab_size)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                ln_f=nn.LayerNorm(cfg.n_embd),
            )
        )
        self.lm_head = Classifier(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final-layer-norm activations, (B, T, C): everything but the classifier."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block size {self.config.block_size}")
        x = self.embed(idx)  # (B, T, C)
        device = idx.device.type
        if self.config.low_precision_residual and torch.is_autocast_enabled(device):
            # From here on every residual add, layer-norm input and their gradients are bf16: half the
            # bytes. Cast after the embedding sum, so the embeddings' gradients still add up in fp32.
            x = x.to(torch.get_autocast_dtype(device))
        return self.transformer.ln_f(self.run_blocks(x, idx))

    def run_blocks(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The Blocks in turn on the embedded tokens x, (B, T, C); idx, the tokens, is for a family whose Blocks
        read them too (`modern.py`)."""
        for block in self.transformer.h:
            x = block(x)
        return x

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """The token and position embeddings' sum, (B, T, C)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.transformer.wte(idx) + self.transformer.wpe(pos)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Returns (logits over the padded vocabulary, mean cross-entropy over the real one)."""
        x = self.hidden(idx)
        if targets is not None and self.lm_head.fused and torch.is_grad_enabled():
            # The fused loss forms its gradients in the forward pass: only worth it when training.
            return None, self.lm_head.loss(x, targets, self.config.vocab_size)
        logits = self.lm_head(x)  # (B, T, padded_vocab)
        if targets is None:
            return logits, None
        return logits, cross_entropy(logits, targets, self.config.vocab_size)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once (the tied classifier is the embedding); minus wpe if non_embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n


def describe_shape(model: GPT) -> str:
    """"12 layers, 12 heads, 768 wide, 124.4M parameters": the shape itself, for a banner when the weights
    come from a file (a preset's name would not say what was read). Padded vocabulary rows are not counted."""
    c = model.config
    n = model.num_params(non_embedding=False) - (c.padded_vocab_size - c.vocab_size) * c.n_embd
    layers, heads = (f"{k} {word}{'s' if k != 1 else ''}" for k, word in ((c.n_layer, "layer"), (c.n_head, "head")))
    return f"{layers}, {heads}, {c.n_embd} wide, {n / 1e6:.1f}M parameters"


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mean next-token loss over the real vocabulary only.

    Slicing off the padded columns keeps the loss exactly the unpadded model's: padded rows never enter
    the softmax, so they get no gradient and the padded model computes the same function.
    """
    real = logits[..., :vocab_size]
    return F.cross_entropy(real.reshape(-1, vocab_size).float(), targets.reshape(-1))


@torch.no_grad()
def init_weights(model: GPT, seed: int) -> GPT:
    """GPT-2 initialisation, identical for every rung given the seed.

    Weights are drawn on the CPU from one generator, in a fixed order, at the unpadded vocabulary size;
    padded embedding rows are zero. So a padded or unpadded, CPU or GPU model starts from the same
    numbers, and rungs can be compared loss for loss.
    """
    gen = torch.Generator().manual_seed(seed)
    std_resid = 0.02 / math.sqrt(2 * model.config.n_layer)  # residual branches add up over 2L layers
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if module is model.lm_head:
                continue  # tied to wte, initialised there
            std = std_resid if getattr(module, "residual_scaled", False) else 0.02
            _normal_(module.weight, std, gen)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            _normal_(module.weight, 0.02, gen, rows=_real_rows(model, module))
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
    return model


def _real_rows(model: GPT, module: nn.Embedding) -> int:
    """The rows drawn: a table of the vocabulary (the token embedding, or one marked `token_table`) has its padded
    rows left at zero."""
    token_table = module is model.transformer.wte or getattr(module, "token_table", False)
    return model.config.vocab_size if token_table else module.num_embeddings


def _normal_(weight: torch.Tensor, std: float, gen: torch.Generator, rows: int | None = None) -> None:
    rows = weight.shape[0] if rows is None else rows
    values = torch.randn((rows, *weight.shape[1:]), generator=gen) * std
    weight.zero_()
    weight[:rows].copy_(values.to(weight.dtype))
