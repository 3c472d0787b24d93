"""Text generation: extend a batch of token ids one token at a time, greedy or sampled.

Sampling only ever draws from the real vocabulary: the padded rows of a 50304-row classifier are
sliced off before the softmax, so no id the tokenizer cannot decode is ever produced.
"""

from __future__ import annotations

from typing import Iterator

import torch


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Extend idx (B, T) by max_new_tokens tokens; `model` may be a torch.compile'd GPT.

    temperature 0 (or top_k 1) is greedy decoding. The same generator seed gives the same tokens.
    """
    return torch.cat([idx, *stream(model, idx, max_new_tokens, temperature, top_k, generator)], dim=1)


@torch.no_grad()
def stream(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
    """`generate`, one token at a time: yields each new (B, 1) as soon as it is picked."""
    cfg = model.config  # a compiled module forwards attribute access to the original
    for _ in range(max_new_tokens):
        context = idx[:, -cfg.block_size:]  # the model has no positions beyond block_size
        logits, _ = model(context)
        logits = logits[:, -1, :cfg.vocab_size].float()  # (B, vocab): padded rows never compete
        token = pick(logits, temperature, top_k, generator)
        idx = torch.cat([idx, token], dim=1)
        yield token


def pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """One token id per row, (B, 1)."""
    # A temperature is used in the logits' float32: below its smallest normal number it is the greedy
    # limit (rounded to zero it would make the largest logit 0/0 = NaN), above its largest the uniform
    # limit among the candidates (rounded to inf it would make the masked ones -inf/inf = NaN).
    limits = torch.finfo(logits.dtype)
    if temperature < limits.smallest_normal:
        return logits.argmax(dim=-1, keepdim=True)
    # Shifted so the largest logit is 0 before dividing: a tiny temperature (1e-30) then sends the
    # others to -inf, the greedy limit, instead of every logit to +-inf and the softmax to NaN.
    logits = logits - logits.max(dim=-1, keepdim=True).values
    if top_k:  # before dividing: a huge temperature would round the logits into ties that top-k cannot split
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits / min(temperature, limits.max), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
