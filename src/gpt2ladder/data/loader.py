"""Batches from a corpus of shards: every window once per epoch, in a seeded order, batch i a pure function
of (seed, i), so a checkpoint holds only the position and every torchrun rank its own rows.

A text keeps `Batches` (random windows with replacement: a 338k-token text is seen many times anyway, and
the golden runs pin those batches); `training_batches` and `validation_batches` pick, so the trainer makes
one call for either.

The order, hand-written because its determinism is the point: the corpus is cut into non-overlapping
windows of T+1 tokens at a stride of T (each token is a target once per epoch); epoch e visits the shards in
a permutation seeded by (seed, e) and, inside shard s, its windows in a permutation seeded by (seed, e, s).
Memory is one shard's permutation, never the corpus's.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from gpt2ladder.data.batches import Batches, _check_batch_args, eval_batches
from gpt2ladder.data.corpus import ShardedTokens
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE

ORDER = "windows-v1"  # names this order in checkpoints; a loader of another order refuses them


class OrderedBatches:
    """Seeded passes over a corpus without replacement; the same interface as `Batches`."""

    def __init__(self, tokens: ShardedTokens, batch_size: int, seq_len: int,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        _check_batch_args(len(tokens), batch_size, seq_len, seed, rank, world_size)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.position = 0
        self.counts = np.array([max(0, (len(a) - 1) // seq_len) for a in tokens.arrays], dtype=np.int64)
        self.per_epoch = int(self.counts.sum())
        if self.per_epoch == 0:
            raise UsageError(f"no shard of the corpus holds one sequence of {seq_len + 1} tokens; use a smaller "
                             "--seq-len")
        self._epoch: tuple[int, np.ndarray, np.ndarray] | None = None  # (e, shard order, cumulative windows)
        self._perms: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()  # the caches above are shared with a prefetching thread

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if self._epoch is None or self._epoch[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.counts))
            self._epoch = (epoch, order, np.cumsum(self.counts[order]))
        return self._epoch[1], self._epoch[2]

    def _perm(self, epoch: int, shard: int) -> np.ndarray:
        key = (epoch, shard)
        if key not in self._perms:
            if len(self._perms) >= 2:  # a batch spans at most a few shards; keep memory at one or two
                self._perms.pop(next(iter(self._perms)))
            self._perms[key] = np.random.default_rng([self.seed, epoch, shard]).permutation(self.counts[shard])
        return self._perms[key]

    def windows(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global window numbers g (counted over all epochs) as (shard, window inside that shard) arrays."""
        shards, inside = np.empty_like(g), np.empty_like(g)
        epochs, r = np.divmod(g, self.per_epoch)
        for epoch in np.unique(epochs):
            rows = epochs == epoch
            order, cum = self._layout(int(epoch))
            j = np.searchsorted(cum, r[rows], side="right")
            shards[rows] = order[j]
            inside[rows] = r[rows] - np.where(j > 0, cum[j - 1], 0)
        n_shards = len(self.counts)
        for key in np.unique(epochs * n_shards + shards):  # a few (epoch, shard) pairs per batch
            rows = epochs * n_shards + shards == key
            epoch, shard = divmod(int(key), n_shards)
            inside[rows] = self._perm(epoch, shard)[inside[rows]]
        return shards, inside

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number index for this rank: inputs x and targets y (x shifted by one), int64 (B/W, T)."""
        share = self.batch_size // self.world_size
        first = index * self.batch_size + self.rank * share
        with self._lock:
            shards, windows = self.windows(first + np.arange(share, dtype=np.int64))
        rows = np.empty((share, self.seq_len + 1), dtype=np.int64)
        span = np.arange(self.seq_len + 1)
        for shard in np.unique(shards):
            at = shards == shard
            rows[at] = self.tokens.arrays[shard][windows[at][:, None] * self.seq_len + span]
        if rows.max(initial=0) >= GPT2_VOCAB_SIZE:  # a shard damaged since its check; cheap beside the gather
            r, c = np.argwhere(rows >= GPT2_VOCAB_SIZE)[0]
            damaged(self.tokens.shards[shards[r]], int(windows[r]) * self.seq_len + int(c), int(rows[r, c]))
        x = torch.from_numpy(np.ascontiguousarray(rows[:, :-1]))  # (B/W, T)
        y = torch.from_numpy(np.ascontiguousarray(rows[:, 1:]))  # (B/W, T)
        return x, y

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at the current position, then advance."""
        xy = self.batch(self.position)
        self.position += 1
        return xy

    def __iter__(self) -> OrderedBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "order": ORDER}

    def load_state_dict(self, state: dict) -> None:
        """Resume from a checkpoint; the saved seed wins so the resumed run continues the same stream."""
        if state.get("order", ORDER) != ORDER:
            raise LadderError(f"the checkpoint's batches follow the order {state['order']!r}, which this gpt2ladder "
                              f"does not make ({ORDER!r}); resume with the gpt2ladder that wrote it")
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
        with self._lock:
            self._epoch, self._perms = None, {}


def damaged(shard, position: int, token: int):
    """Stop on a token outside the vocabulary that the shard's check did not see: the file changed since."""
    raise LadderError(f"token shard {shard.path} holds token id {token} at token {position:,} (byte "
                      f"{shard.offset + 2 * position:,}), outside GPT-2's vocabulary of {GPT2_VOCAB_SIZE:,}: "
                      "damaged since it was checked; restore or prepare it again")


def _check_stream(tokens: ShardedTokens, stream: np.ndarray) -> None:
    """The validation tokens (the start of `tokens`) against the vocabulary, as a training batch's are."""
    if stream.max(initial=0) >= GPT2_VOCAB_SIZE:
        at = int(np.argmax(stream >= GPT2_VOCAB_SIZE))
        s = int(np.searchsorted(tokens.starts, at, side="right")) - 1
        damaged(tokens.shards[s], at - int(tokens.starts[s]), int(stream[at]))


def training_batches(tokens, batch_size: int, seq_len: int, seed: int = 0, rank: int = 0,
                     world_size: int = 1) -> Batches | OrderedBatches:
    """The training stream of a TokenData: `Batches` for a text, `OrderedBatches` for a corpus of shards."""
    kind = OrderedBatches if isinstance(tokens.train, ShardedTokens) else Batches
    return kind(tokens.train, batch_size, seq_len, seed=seed, rank=rank, world_size=world_size)


def validation_batches(tokens, batch_size: int, seq_len: int, n_batches: int,
                       val_tokens: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed validation batches of a TokenData, the same at every evaluation.

    A text: `eval_batches` (n_batches random windows of its last 10%). A corpus: its validation shards read
    from the start, val_tokens of them (default: n_batches batches' worth; rounded down to whole sequences)
    as consecutive windows of T+1 at a stride of T, batch_size windows a batch; a last, partial batch is
    dropped unless it is the only one.
    """
    if not isinstance(tokens.val, ShardedTokens):
        return eval_batches(tokens.val, batch_size, seq_len, n_batches)
    if val_tokens is not None and val_tokens < 1:
        raise UsageError(f"--val-tokens must be at least 1, got {val_tokens}")
    want = val_tokens if val_tokens is not None else n_batches * batch_size * seq_len
    n_windows = min(want // seq_len, max(0, len(tokens.val) - 1) // seq_len)
    if n_windows < 1:
        raise UsageError(f"the corpus's validation shards hold {len(tokens.val):,} tokens, too few for one "
                         f"sequence of {seq_len + 1}; use a smaller --seq-len, or --eval-every 0")
    rows = n_windows if n_windows < batch_size else n_windows - n_windows % batch_size
    stream = np.asarray(tokens.val[0:rows * seq_len + 1], dtype=np.int64)
    _check_stream(tokens.val, stream)
    batches = []
    for b in range(0, rows, batch_size):
        n = min(batch_size, rows - b)
        starts = (b + np.arange(n))[:, None] * seq_len
        windows = stream[starts + np.arange(seq_len + 1)]
        batches.append((torch.from_numpy(np.ascontiguousarray(windows[:, :-1])),
                        torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))))
    return batches
