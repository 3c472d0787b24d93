"""Multiple choice by likelihood, as a pure function of the logits: for each choice (a row holding the
context and one ending), the summed next-token cross-entropy over the ending's tokens and its mean
per token. The choice with the lowest sum is the model's answer for `acc`, the one with the lowest
mean for `acc_norm` (the completion-style convention of build-nanogpt's and llm.c's HellaSwag, which
keeps long endings from losing only because they have more tokens)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ending_losses(logits: torch.Tensor, tokens: torch.Tensor, ending: torch.Tensor,
                  vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, mean) over each row's ending tokens of -log p(token | the tokens before it), both (R,).

    logits (R, T, V >= vocab_size) from one forward over tokens (R, T); ending (R, T) is True where a
    row's ending tokens are. The token at t is predicted by the logits at t - 1, so an ending must not
    start at position 0. Padded vocabulary columns (V > vocab_size) never enter the softmax. Only the
    ending positions are taken to fp32, so a batch's logits are never copied whole.
    """
    predicted = ending[:, 1:]  # (R, T-1): targets that are ending tokens
    if bool(ending[:, 0].any()) or bool((predicted.sum(dim=1) == 0).any()):
        raise ValueError("every row needs an ending of at least one token after at least one context token")
    picked = logits[:, :-1][predicted][:, :vocab_size].float()  # (K, vocab_size)
    losses = F.cross_entropy(picked, tokens[:, 1:][predicted], reduction="none")  # (K,)
    rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1).expand_as(predicted)[predicted]
    sums = torch.zeros(tokens.shape[0], device=losses.device, dtype=losses.dtype).index_add_(0, rows, losses)
    return sums, sums / predicted.sum(dim=1)


def choose(sums: torch.Tensor, means: torch.Tensor, n_choices: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example (rows grouped n_choices at a time): the choice of lowest summed loss and of lowest
    mean loss, both (N,); a tie goes to the first such choice."""
    return sums.view(-1, n_choices).argmin(dim=1), means.view(-1, n_choices).argmin(dim=1)
