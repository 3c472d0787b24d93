"""The modern family: GPT-2's network with the parts of the recipes switched on one at a time.

Each part is a small named unit below (rotary positions, QK-norm, ReLU^2, RMS norm without gains and no
biases, zero-initialised output projections, an untied head, soft-capped logits, value embeddings mixed into
the attention's values, U-Net skips from the first half of the Blocks to the second, attention within
documents and a sliding window, the embedded tokens mixed into every Block's input); `ModelConfig.parts` says
which are on. With none on, `ModernGPT` builds the same modules, in the same order and under the same names,
as `GPT`, draws the same initial weights and computes the same function: each part is then the only
difference from GPT-2 (a test holds both). The module names stay GPT-2's (`c_attn`, `c_fc`, `c_proj`,
`ln_1`, ...), so the generic step rungs find the same seams; the rewrites written for GPT-2's exact blocks
decline this family in one line (`ladder.py`).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, Branch, Classifier, init_weights, manual_attention, split_heads
from gpt2ladder.model.recipe import DOC_WINDOW, SOFTCAP, VALUE_EMBED_TABLES
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

ROPE_BASE = 10000.0  # the rotary frequencies' base, as in RoFormer and Llama
# The value_embeds part's (a, b) in v <- a v + b ve at the start: both weigh the same, so the tables get a gradient
# from the first step, and the mixed value keeps about v's scale.
VALUE_MIX_INIT = (0.5, 0.5)
# The unet_skips part's weights at the start: each kept output is added whole, as the residual stream carries it,
# so the skips act from the first step (the vectors' learning rate moves a weight slowly).
SKIP_INIT = 1.0
# The embed_skips part's (a, b) in x <- a x + b x0 at the start: the residual stream whole and none of the embedding,
# so the model starts as the one without the part and learns how much of x0 each Block takes.
EMBED_MIX_INIT = (1.0, 0.0)


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


def value_embed_tables(n_layer: int) -> tuple[int | None, ...]:
    """The value_embeds part: which table each Block mixes into its values (None: none). The first k Blocks use
    tables 0..k-1 and the last k Blocks the same tables in the same order, k = VALUE_EMBED_TABLES; with fewer than
    2 VALUE_EMBED_TABLES Blocks, k is half of them (at least 1), so no Block is at both ends with two tables."""
    k = max(1, min(VALUE_EMBED_TABLES, n_layer // 2))
    tables: list[int | None] = [None] * n_layer
    for i in range(k):
        tables[i] = tables[n_layer - k + i] = i
    return tuple(tables)


def value_embed_count(n_layer: int) -> int:
    return len({t for t in value_embed_tables(n_layer) if t is not None})


def mix_values(v: torch.Tensor, ve: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """The value_embeds part: a v + b ve for mix = (a, b); v (B, nh, T, hs), ve (B, T, C) split into v's heads. In
    v's dtype, so that under autocast the attention's operands stay alike."""
    B, nh, T, hs = v.shape
    ve = ve.view(B, T, nh, hs).transpose(1, 2).to(v.dtype)  # (B, nh, T, hs)
    mix = mix.to(v.dtype)
    return mix[0] * v + mix[1] * ve


def document_ids(idx: torch.Tensor, end_of_text: int) -> torch.Tensor:
    """The doc_windows part: each token's document, (B, T), the count of end_of_text tokens up to and including
    it: a document begins at its <|endoftext|> (the data puts one before each document)."""
    return (idx == end_of_text).cumsum(dim=1)


def doc_window_mask(docs: torch.Tensor, window: int = DOC_WINDOW) -> torch.Tensor:
    """The doc_windows part as a boolean mask, (B, 1, T, T): query i sees key j when j <= i, i - j < window and both
    are of one document. The plain attention's mask (every row holds at least its diagonal)."""
    pos = torch.arange(docs.shape[1], device=docs.device)
    back = pos[:, None] - pos[None, :]  # (T, T): how far back key j lies from query i
    same = docs[:, :, None] == docs[:, None, :]  # (B, T, T)
    return ((back >= 0) & (back < window) & same)[:, None]


# FlexAttention's tile: the queries and keys its kernel takes at a time, and the grain of a BlockMask.
FLEX_BLOCK = 128


def block_mask_problem() -> str | None:
    """Why this torch cannot build the doc_windows part's BlockMask (given both sides' lists and its lengths, which
    PyTorch 2.6 added), or None."""
    if "seq_lengths" in inspect.signature(BlockMask.__init__).parameters:
        return None
    return (f"the doc_windows part builds FlexAttention's BlockMask as PyTorch 2.6+ does; this is {torch.__version__}: "
            "upgrade torch, or leave doc_windows out of the recipe")


def doc_window_block_mask(docs: torch.Tensor, window: int = DOC_WINDOW, block: int = FLEX_BLOCK) -> BlockMask:
    """The same mask as FlexAttention's BlockMask, built from this batch's documents: its kernel skips the tiles
    that no query of a tile may see, and skips the mask's test on the tiles every query sees whole.

    The tiles are found with plain tensor arithmetic on each tile's first and last document (the documents never
    decrease along a row), not with `create_block_mask`: built with it inside the compiled forward, GPT-2's step at
    its full size stopped on an illegal memory access (torch 2.11), which pytorch/pytorch#160018 reports of a
    compiled `create_block_mask` whose mask reads a tensor, as this one reads the documents. A row that is not a
    whole number of tiles takes `create_block_mask`."""
    B, T = docs.shape

    def may_attend(b, h, q, k):
        return (k <= q) & (q - k < window) & (docs[b, q] == docs[b, k])

    if T % block:
        return create_block_mask(may_attend, B, None, T, T, device=docs.device)
    partial, full = doc_window_tiles(docs, window, block)
    by_query = [*_listed(partial), *_listed(full)]
    # Both sides given, not left to BlockMask.from_kv_blocks: under compile on a GPU, the mask it built from these
    # very lists (each equal to create_block_mask's) gave attention far from the masked softmax's (docs/recipes.md).
    by_key = [*_listed(partial.mT), *_listed(full.mT)]  # the backward's view: each key tile's query tiles
    return BlockMask(seq_lengths=(T, T), kv_num_blocks=by_query[0], kv_indices=by_query[1],
                     full_kv_num_blocks=by_query[2], full_kv_indices=by_query[3], q_num_blocks=by_key[0],
                     q_indices=by_key[1], full_q_num_blocks=by_key[2], full_q_indices=by_key[3],
                     BLOCK_SIZE=(block, block), mask_mod=may_attend)


def doc_window_tiles(docs: torch.Tensor, window: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full), each (B, n, n) over (query tile, key tile) for n = T / block: a full tile is one every query
    of its tile sees whole (no test needed), a partial one is one some query sees part of.

    Key tile j lies at or before query tile i. The pair nearest each other, the key tile's last token and the query
    tile's first, is (i - j) * block - (block - 1) apart and is of one document when the key tile's last document is
    the query tile's first: a query sees part of the tile exactly when that pair (or, on the diagonal, a token and
    itself) may attend. Every query sees the whole tile when j < i, the farthest pair, (i - j) * block + block - 1
    apart, is inside the window, and one document spans both tiles."""
    B, T = docs.shape
    n = T // block
    tiles = docs.view(B, n, block)
    first, last = tiles[:, :, 0], tiles[:, :, -1]
    i = torch.arange(n, device=docs.device)
    apart = (i[:, None] - i[None, :]) * block  # (n, n): how far key tile j starts before query tile i
    near = (apart >= 0) & (apart - (block - 1) < window) & (last[:, None, :] >= first[:, :, None])
    whole = (apart > 0) & (apart + block - 1 < window) & (first[:, None, :] == last[:, :, None])
    return near & ~whole, whole


def _listed(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B, n, n) tile map as a BlockMask's (count, indices) for one head shared by all: each row's marked tiles
    listed first, in order, then the rest (placed by running counts: no sort)."""
    marked = tiles.to(torch.int32)
    count = marked.sum(dim=-1, dtype=torch.int32)
    slot = torch.where(tiles, marked.cumsum(-1), count[..., None] + (1 - marked).cumsum(-1)) - 1
    order = torch.arange(tiles.shape[-1], device=tiles.device, dtype=torch.int32).expand_as(slot)
    indices = torch.empty_like(order).scatter_(-1, slot.long(), order)
    return count[:, None].contiguous(), indices[:, None].contiguous()


def masked_attention(q, k, v, mask: torch.Tensor | BlockMask, manual: bool) -> torch.Tensor:
    """The doc_windows part's attention of q, k, v (B, nh, T, hs) under its mask: FlexAttention for a BlockMask (q
    and k in v's dtype, where autocast may have left them in fp32), else the four-line attention (`manual`) or SDPA
    with the boolean mask."""
    if isinstance(mask, BlockMask):
        return flex_attention(q.to(v.dtype), k.to(v.dtype), v, block_mask=mask)
    if manual:
        return manual_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class ModernAttention(Branch):
    def __init__(self, cfg: ModelConfig, value_embed: bool = False):
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
        if value_embed:  # the value_embeds part's (a, b), set by init_modern_weights
            self.value_mix = nn.Parameter(torch.tensor(VALUE_MIX_INIT))
        if cfg.attention == "manual" and not cfg.has("doc_windows"):
            mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
            self.register_buffer("bias", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def forward(self, x: torch.Tensor, ve: torch.Tensor | None = None,
                mask: torch.Tensor | BlockMask | None = None) -> torch.Tensor:
        """x (B, T, C); ve, this Block's value embedding of the input tokens (value_embeds); mask, the batch's
        doc_windows mask (else causal)."""
        return self.c_proj(self.after_in_proj(self.in_product(x), ve, mask))

    def in_proj(self) -> tuple[nn.Linear, bool]:
        return self.c_attn, self.c_attn.bias is not None

    def heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v, (B, nh, T, hs) each, from c_attn's output (B, T, 3C): q and k RMS-normalised (qk_norm) and turned
        by their positions (rope). The rotary_kernel rung replaces this alone."""
        q, k, v = split_heads(qkv, self.n_head)  # (B, nh, T, hs) each
        if self.qk_norm:
            q, k = qk_norm(q), qk_norm(k)
        if self.rope:
            q, k = rotate(q, self.rope_cos, self.rope_sin), rotate(k, self.rope_cos, self.rope_sin)
        return q, k, v

    def after_in_proj(self, qkv: torch.Tensor, ve: torch.Tensor | None = None,
                      mask: torch.Tensor | BlockMask | None = None) -> torch.Tensor:
        q, k, v = self.heads(qkv)
        if ve is not None:
            v = mix_values(v, ve, self.value_mix)
        B, nh, T, hs = q.shape
        if mask is not None:
            y = masked_attention(q, k, v, mask, manual=self.attention == "manual")
        elif self.attention == "sdpa":
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
    def __init__(self, cfg: ModelConfig, value_embed: bool = False):
        super().__init__()
        self.ln_1 = norm(cfg)
        self.attn = ModernAttention(cfg, value_embed)
        self.ln_2 = norm(cfg)
        self.mlp = ModernMLP(cfg)

    def forward(self, x: torch.Tensor, ve: torch.Tensor | None = None,
                mask: torch.Tensor | BlockMask | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), ve, mask)
        return x + self.mlp(self.ln_2(x))


class ModernGPT(GPT):
    """GPT with the recipe's model parts; `forward`, `hidden`'s contract and the loss are GPT's."""

    def __init__(self, cfg: ModelConfig):
        nn.Module.__init__(self)
        self.config = cfg
        self.value_embed_of = value_embed_tables(cfg.n_layer) if cfg.has("value_embeds") else (None,) * cfg.n_layer
        modules = dict(wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd))
        if not cfg.has("rope"):
            modules["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        blocks = (ModernBlock(cfg, value_embed=table is not None) for table in self.value_embed_of)
        modules.update(h=nn.ModuleList(blocks), ln_f=norm(cfg))
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = Classifier(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        if cfg.has("softcap"):
            self.lm_head.softcap = SOFTCAP
        if not cfg.has("untied_head"):
            self.transformer.wte.weight = self.lm_head.weight  # tied, as in GPT-2
        if cfg.has("value_embeds"):  # after the classifier: GPT-2's weights are drawn first, as without them
            tables = (nn.Embedding(cfg.padded_vocab_size, cfg.n_embd) for _ in range(value_embed_count(cfg.n_layer)))
            self.value_embeds = nn.ModuleList(tables)
            for table in self.value_embeds:
                table.token_table = True  # drawn as the token embedding is (`gpt.init_weights`)
        if cfg.has("unet_skips"):  # one weight per kept output, set by init_modern_weights
            self.skip_weights = nn.Parameter(torch.full((cfg.n_layer // 2,), SKIP_INIT))
        if cfg.has("embed_skips"):  # each Block's a and b, two vectors (so AdamW's undecayed vectors take them)
            self.residual_mix = nn.Parameter(torch.full((cfg.n_layer,), EMBED_MIX_INIT[0]))
            self.embed_mix = nn.Parameter(torch.full((cfg.n_layer,), EMBED_MIX_INIT[1]))
        if cfg.has("bf16_tables"):  # from the start, so a model built to load a checkpoint into has them too
            for table in self.lookup_tables():
                table.to(torch.bfloat16)

    def lookup_tables(self) -> list[nn.Embedding]:
        """The tables that are only looked up, never multiplied: an untied token embedding, the position table and
        the value embeddings' tables (the bf16_tables part keeps these in bf16)."""
        tables = [] if self.tied else [self.transformer.wte]
        if "wpe" in self.transformer:
            tables.append(self.transformer.wpe)
        return tables + list(getattr(self, "value_embeds", []))

    @property
    def tied(self) -> bool:
        return self.transformer.wte.weight is self.lm_head.weight

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """The residual stream's start, in fp32 whatever the tables' dtype (bf16_tables): each lookup is widened
        before the sum, and the hidden states' own cast (bf16_residual) comes after it, as for GPT-2."""
        x = self.transformer.wte(idx).float()
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(idx.shape[1], device=idx.device)).float()
        return x

    def run_blocks(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The Blocks, with what the parts give them beside x: each its value embedding of idx (value_embeds), the
        batch's attention mask (doc_windows), the first half's outputs kept for the second's inputs (unet_skips), the
        residual stream's start mixed into each input (embed_skips, after the skip a Block's input takes)."""
        values = [table(idx) for table in self.value_embeds] if self.config.has("value_embeds") else []
        mask = self.attention_mask(idx) if self.config.has("doc_windows") else None
        n = len(self.transformer.h)
        half = n // 2 if self.config.has("unet_skips") else 0
        x0 = x if self.config.has("embed_skips") else None
        kept = []
        for i, block in enumerate(self.transformer.h):
            if i >= n - half:  # the second half: the first half's outputs, the last kept first
                x = unet_skip(x, kept.pop(), self.skip_weights[n - 1 - i])
            if x0 is not None:
                x = embed_skip(x, x0, self.residual_mix[i], self.embed_mix[i])
            table = self.value_embed_of[i]
            x = block(x, None if table is None else values[table], mask)
            if i < half:
                kept.append(x)
        return x

    def attention_mask(self, idx: torch.Tensor) -> torch.Tensor | BlockMask:
        """The doc_windows part's mask for this batch of tokens, made inside the forward since it depends on them:
        FlexAttention's BlockMask where the model is being compiled for a GPU (its fused kernel then runs; uncompiled
        it would compute every score), else the boolean mask the plain attention takes."""
        docs = document_ids(idx, end_of_text=self.config.vocab_size - 1)  # <|endoftext|>, 50256 in GPT-2's
        if idx.is_cuda and torch.compiler.is_compiling():
            return doc_window_block_mask(docs)
        return doc_window_mask(docs)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once; with non_embedding, less the tables that are looked up rather than multiplied
        (the position table, an untied token embedding and the value embeddings), so 6N counts the matmuls' FLOPs."""
        n = sum(p.numel() for p in self.parameters())
        if not non_embedding:
            return n
        if "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        if self.config.has("value_embeds"):
            n -= sum(table.weight.numel() for table in self.value_embeds)
        return n if self.tied else n - self.transformer.wte.weight.numel()


def unet_skip(x: torch.Tensor, kept: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The unet_skips part: a second-half Block's input x plus its first-half partner's output, scaled by the pair's
    learned weight, in x's dtype (a bf16 residual stream stays bf16)."""
    return x + weight.to(x.dtype) * kept.to(x.dtype)


def embed_skip(x: torch.Tensor, x0: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The embed_skips part: a Block's input x mixed with the residual stream's start x0 (the embedded tokens),
    a x + b x0 with the Block's learned a and b, in x's dtype (a bf16 residual stream stays bf16)."""
    return a.to(x.dtype) * x + b.to(x.dtype) * x0.to(x.dtype)


def parameter_count(cfg: ModelConfig, padded_vocab: int) -> int:
    """Parameters of the model this shape builds (a tied classifier counted once), from the shape alone: what
    the batch planner reads before any model exists."""
    C, bias = cfg.n_embd, not cfg.has("rmsnorm")
    gains = 0 if cfg.has("rmsnorm") else 2 * C  # a LayerNorm's weight and bias
    block = 12 * C * C + (9 * C if bias else 0) + 2 * gains  # c_attn, c_proj, c_fc, c_proj; biases; two norms
    table = padded_vocab * C * (2 if cfg.has("untied_head") else 1)
    positions = 0 if cfg.has("rope") else cfg.block_size * C
    n = table + positions + cfg.n_layer * block + gains
    if cfg.has("value_embeds"):  # the tables, and each using Block's (a, b)
        uses = sum(t is not None for t in value_embed_tables(cfg.n_layer))
        n += value_embed_count(cfg.n_layer) * padded_vocab * C + 2 * uses
    if cfg.has("unet_skips"):
        n += cfg.n_layer // 2
    if cfg.has("embed_skips"):  # each Block's (a, b)
        n += 2 * cfg.n_layer
    return n


def bf16_table_count(cfg: ModelConfig, padded_vocab: int) -> int:
    """Parameters the bf16_tables part keeps in bf16 (`ModernGPT.lookup_tables`), from the shape alone; 0 without it."""
    if not cfg.has("bf16_tables"):
        return 0
    C = cfg.n_embd
    n = (padded_vocab * C if cfg.has("untied_head") else 0) + (0 if cfg.has("rope") else cfg.block_size * C)
    return n + (value_embed_count(cfg.n_layer) * padded_vocab * C if cfg.has("value_embeds") else 0)


@torch.no_grad()
def init_modern_weights(model: ModernGPT, seed: int) -> ModernGPT:
    """GPT-2's initialisation (`gpt.init_weights`: the same draws in the same order, then the value embeddings'
    tables as the token embedding's), then the parts' own: zero output projections (zero_init; drawn first, so the
    other weights keep GPT-2's numbers), a zero classifier (untied_head), the value mixes at VALUE_MIX_INIT
    (value_embeds), the skip weights at SKIP_INIT (unet_skips) and the embedding mixes at EMBED_MIX_INIT
    (embed_skips)."""
    init_weights(model, seed)
    for module in model.modules():
        if isinstance(module, ModernAttention) and hasattr(module, "value_mix"):
            module.value_mix.copy_(torch.tensor(VALUE_MIX_INIT))
    if model.config.has("unet_skips"):
        model.skip_weights.fill_(SKIP_INIT)
    if model.config.has("embed_skips"):
        model.residual_mix.fill_(EMBED_MIX_INIT[0])
        model.embed_mix.fill_(EMBED_MIX_INIT[1])
    if model.config.has("zero_init"):
        for module in model.modules():
            if isinstance(module, nn.Linear) and getattr(module, "residual_scaled", False):
                module.weight.zero_()
    if not model.tied:
        model.lm_head.weight.zero_()
    return model
