"""Training batches: random windows of a token array, batch i a pure function of (seed, i), so a
resumed or multi-process run sees exactly the batches of one uninterrupted run."""

from __future__ import annotations

import numpy as np
import torch

from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE


def _check_batch_args(n_tokens: int, batch_size: int, seq_len: int,
                      seed: int, rank: int, world_size: int) -> None:
    if batch_size < 1 or seq_len < 1:
        raise UsageError(f"batch size and sequence length must be at least 1, got {batch_size} and {seq_len}")
    if seed < 0:
        raise UsageError(f"seed must be non-negative, got {seed}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not valid for world size {world_size}")
    if batch_size % world_size:
        raise UsageError(f"batch size {batch_size} is not divisible by world size {world_size}")
    if n_tokens < seq_len + 1:
        raise UsageError(
            f"the text has {n_tokens} token{'' if n_tokens == 1 else 's'}, too few for one sequence of {seq_len + 1}; "
            "use a longer text or a smaller --seq-len"
        )


def check_splits(tokens, seq_len: int, validate: bool, skippable: bool = True) -> None:
    """A UsageError unless the text (a TokenData) holds one sequence of seq_len + 1 tokens in its training
    split and, when there is validation, in its validation split; the message counts the whole text, and offers
    --eval-every 0 where validation is `skippable` (not in a race, which times the runs to a validation loss)."""
    need = seq_len + 1
    corpus = not isinstance(tokens.train, np.ndarray)  # a corpus of shards: its splits are files, not shares
    where = ("training shards", "validation (*_val_*) shards") if corpus else ("first 90%", "last 10%")
    splits = [("training", tokens.train, where[0])] + ([("validation", tokens.val, where[1])] if validate else [])
    for name, part, place in splits:
        if len(part) < need:
            plural = "" if tokens.n_tokens == 1 else "s"
            raise UsageError(
                f"the {'corpus' if corpus else 'text'} has {tokens.n_tokens:,} token{plural}, and its {name} "
                f"split (the {place}) {len(part):,}: too few for one sequence of {need}; use a "
                f"{'larger corpus' if corpus else 'longer text'} or a smaller --seq-len"
                + (", or --eval-every 0" if name == "validation" and skippable else ""))
    if corpus and len(tokens.train) and max(len(a) for a in tokens.train.arrays) < need:  # no window spans shards
        raise UsageError(f"no shard of the corpus holds one sequence of {need} tokens (its largest training shard "
                         f"holds {max(len(a) for a in tokens.train.arrays):,}); use a smaller --seq-len")


class Batches:
    """Random windows of a token array; batch i depends only on (seed, i), never on earlier calls.

    batch_size is the global batch; this rank gets its contiguous share of the rows, so the ranks
    together see exactly what one process would. Hand-written because this determinism is the point.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        _check_batch_args(len(tokens), batch_size, seq_len, seed, rank, world_size)
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.position = 0

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number index for this rank: inputs x and targets y (x shifted by one), int64 (B/W, T)."""
        rng = np.random.default_rng([self.seed, index])
        # offsets <= len - T - 1 so the shifted target window still fits
        offsets = rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)
        share = self.batch_size // self.world_size
        offsets = offsets[self.rank * share:(self.rank + 1) * share]
        windows = np.asarray(self.tokens[offsets[:, None] + np.arange(self.seq_len + 1)], dtype=np.int64)
        if windows.max(initial=0) >= GPT2_VOCAB_SIZE:  # the memory-mapped tokens changed since their check
            r, c = np.argwhere(windows >= GPT2_VOCAB_SIZE)[0]
            raise LadderError(f"the text's tokens hold id {int(windows[r, c])} at position {int(offsets[r]) + c:,}, "
                              f"outside GPT-2's vocabulary of {GPT2_VOCAB_SIZE:,}: damaged since they were checked")
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))  # (B/W, T)
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))  # (B/W, T)
        return x, y

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at the current position, then advance."""
        xy = self.batch(self.position)
        self.position += 1
        return xy

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from a checkpoint; the saved seed wins so the resumed run continues the same stream."""
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))


def to_device(x: torch.Tensor, y: torch.Tensor,
              device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Move a batch to device; on CUDA from pinned memory, so the copy need not block the host."""
    device = torch.device(device)
    if device.type == "cuda":
        # non_blocking only overlaps with compute when the source is page-locked
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int, n_batches: int,
                 seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of batches, so every validation loss in a run (and across runs) uses the same data."""
    if n_batches < 0:
        raise UsageError(f"number of eval batches must be non-negative, got {n_batches}")
    sampler = Batches(tokens, batch_size, seq_len, seed=seed)
    return [sampler.next() for _ in range(n_batches)]


def micro_batches(batches: list[tuple[torch.Tensor, torch.Tensor]],
                  size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same rows cut into batches of at most `size` sequences: what fits the device, and the same
    data whatever the card (validation stays comparable across micro-batch sizes)."""
    return [(x[i:i + size], y[i:i + size]) for x, y in batches for i in range(0, len(x), size)]
