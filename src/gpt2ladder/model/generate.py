"""Text generation: extend a batch of token ids one token at a time, greedy or sampled.

Sampling only ever draws from the real vocabulary: the padded rows of a 50304-row classifier are
sliced off before the softmax, so no id the tokenizer cannot decode is ever produced.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Extend idx (B, T) by max_new_tokens tokens; `model` may be a torch.compile'd GPT.

    temperature 0 (or top_k 1) is greedy decoding. The same generator seed gives the same tokens.
    """
    cfg = model.config  # a compiled module forwards attribute access to the original
    for _ in range(max_new_tokens):
        context = idx[:, -cfg.block_size:]  # the model has no positions beyond block_size
        logits, _ = model(context)
        logits = logits[:, -1, :cfg.vocab_size].float()  # (B, vocab): padded rows never compete
        idx = torch.cat([idx, pick(logits, temperature, top_k, generator)], dim=1)
    return idx


def pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """One token id per row, (B, 1)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # Shifted so the largest logit is 0 before dividing: a tiny temperature (1e-45) then sends the
    # others to -inf, the greedy limit, instead of every logit to +-inf and the softmax to NaN.
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
