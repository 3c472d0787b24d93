"""The ordered loader: every window once per epoch, batch i a pure function of (seed, i), ranks that
split each batch, a resume that continues exactly; and the one factory the trainer calls."""

import numpy as np
import pytest
import torch

from gpt2ladder.data import (Batches, OrderedBatches, TokenData, check_splits, eval_batches, training_batches,
                             validation_batches)
from gpt2ladder.data import shards as fmt
from gpt2ladder.data.corpus import ShardedTokens
from gpt2ladder.errors import LadderError, UsageError

T = 8


def corpus(tmp_path, sizes=(41, 97, 64, 9, 120)) -> TokenData:
    """Shards of distinct tokens (token = its position in the corpus), so a window names itself."""
    shards, at = [], 0
    for i, n in enumerate(sizes):
        path = tmp_path / fmt.shard_name("c", "train", i + 1)
        fmt.write_shard(path, np.arange(at, at + n, dtype=np.uint16))
        shards.append(fmt.open_shard(path, fmt.LLMC))
        at += n
    val = tmp_path / fmt.shard_name("c", "val", 0)
    fmt.write_shard(val, np.arange(at, at + 200, dtype=np.uint16))
    return TokenData(ShardedTokens(shards), ShardedTokens([fmt.open_shard(val, fmt.LLMC)]), "c", "id", at + 200)


def windows_of(sizes) -> set[tuple[int, ...]]:
    """Every non-overlapping window of T+1 tokens at a stride of T inside each shard."""
    found, at = set(), 0
    for n in sizes:
        found |= {tuple(range(at + w * T, at + w * T + T + 1)) for w in range((n - 1) // T)}
        at += n
    return found


def rows(x: torch.Tensor, y: torch.Tensor) -> list[tuple[int, ...]]:
    assert (x[:, 1:] == y[:, :-1]).all()  # targets are the inputs shifted by one
    return [tuple(r) + (int(last),) for r, last in zip(x.tolist(), y[:, -1])]


def test_an_epoch_visits_every_window_once_and_the_next_in_another_order(tmp_path):
    td = corpus(tmp_path)
    loader = OrderedBatches(td.train, 4, T, seed=1)
    expected = windows_of((41, 97, 64, 9, 120))
    assert loader.per_epoch == len(expected) == 39  # the 9-token shard holds one window of 9, no more
    epochs = [[w for i in range(e * 39, (e + 1) * 39) for w in rows(*_one(loader, i))] for e in range(2)]
    assert all(len(e) == 39 and set(e) == expected for e in epochs)  # without replacement, none left out
    assert epochs[0] != epochs[1]


def _one(loader, window_index):
    """The row of global window number window_index, through a batch of one row."""
    single = OrderedBatches(loader.tokens, 1, T, seed=loader.seed)
    return single.batch(window_index)


def test_a_batch_is_a_pure_function_of_seed_and_index(tmp_path):
    td = corpus(tmp_path)
    a = OrderedBatches(td.train, 4, T, seed=5)
    later = [a.next() for _ in range(30)]  # across an epoch's end (39 windows = 9.75 batches)
    fresh = OrderedBatches(td.train, 4, T, seed=5)
    for i in (29, 3, 17, 0):
        assert all((p == q).all() for p, q in zip(fresh.batch(i), later[i]))
    other = OrderedBatches(td.train, 4, T, seed=6)
    assert not all((other.batch(i)[0] == later[i][0]).all() for i in range(5))


def test_ranks_split_every_batch_into_disjoint_rows(tmp_path):
    td = corpus(tmp_path)
    whole = OrderedBatches(td.train, 6, T, seed=2)
    parts = [OrderedBatches(td.train, 6, T, seed=2, rank=r, world_size=3) for r in range(3)]
    for i in range(12):
        x, y = whole.batch(i)
        assert torch.equal(torch.cat([p.batch(i)[0] for p in parts]), x)
        assert torch.equal(torch.cat([p.batch(i)[1] for p in parts]), y)
        assert parts[0].batch(i)[0].shape == (2, T)


def test_a_resume_continues_on_the_batches_of_an_uninterrupted_run(tmp_path):
    td = corpus(tmp_path)
    straight = OrderedBatches(td.train, 4, T, seed=3)
    expected = [straight.next() for _ in range(25)]
    first = OrderedBatches(td.train, 4, T, seed=3)
    for _ in range(11):
        first.next()
    state = first.state_dict()
    assert state == {"position": 11, "seed": 3, "order": "windows-v1"}
    resumed = OrderedBatches(td.train, 4, T, seed=99)  # the checkpoint's seed wins
    resumed.load_state_dict(state)
    for want in expected[11:]:
        assert all(torch.equal(p, q) for p, q in zip(resumed.next(), want))
    with pytest.raises(LadderError, match="order 'other'"):
        resumed.load_state_dict({**state, "order": "other"})


def test_training_batches_keep_batches_for_a_text_and_order_a_corpus(tmp_path):
    text = np.arange(5000, dtype=np.uint16) % 50257
    td = TokenData(text[:4500], text[4500:], "t", "sha", 5000)
    made = training_batches(td, 4, T, seed=7, rank=1, world_size=2)
    assert type(made) is Batches  # the golden train run's batches, bit for bit
    assert torch.equal(made.batch(3)[0], Batches(td.train, 4, T, seed=7, rank=1, world_size=2).batch(3)[0])
    assert type(training_batches(corpus(tmp_path), 4, T)) is OrderedBatches


def test_validation_reads_the_start_of_the_validation_shards_every_time(tmp_path):
    td = corpus(tmp_path)
    start = len(td.train)
    batches = validation_batches(td, 3, T, n_batches=2, val_tokens=60)  # 7 windows: two batches of 3
    assert [x.shape[0] for x, _ in batches] == [3, 3]
    got = [w for x, y in batches for w in rows(x, y)]
    assert got == [tuple(range(start + w * T, start + w * T + T + 1)) for w in range(6)]
    again = validation_batches(td, 3, T, n_batches=2, val_tokens=60)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    assert len(validation_batches(td, 3, T, n_batches=2)) == 2  # default: n_batches of full batches
    assert [x.shape[0] for x, _ in validation_batches(td, 50, T, 1, val_tokens=10**6)] == [24]  # all there is


def test_validation_of_a_text_is_eval_batches(tmp_path):
    text = np.arange(5000, dtype=np.uint16)
    td = TokenData(text[:4500], text[4500:], "t", "sha", 5000)
    for (a, _), (b, _) in zip(validation_batches(td, 4, T, 3, val_tokens=10), eval_batches(td.val, 4, T, 3)):
        assert torch.equal(a, b)


def test_a_corpus_too_small_for_a_sequence_is_one_line(tmp_path):
    td = corpus(tmp_path, sizes=(5, 7, 8))
    with pytest.raises(UsageError, match="no shard of the corpus holds one sequence of 9 tokens"):
        OrderedBatches(td.train, 2, T)
    with pytest.raises(UsageError, match="no shard of the corpus holds one sequence of 9 tokens \\(its largest "
                                         "training shard holds 8\\)"):  # said before any shard is scanned
        check_splits(td, T, validate=False)
    check_splits(td, T - 1, validate=False)  # 8 tokens: one sequence of 7 and its targets
    with pytest.raises(UsageError, match="validation shards hold 200 tokens, too few for one sequence of 201"):
        validation_batches(td, 2, 200, 1)


def test_a_corpus_without_validation_shards_says_so_in_its_terms(tmp_path):
    from gpt2ladder.data import check_splits

    td = corpus(tmp_path)
    td = TokenData(td.train, ShardedTokens([]), "c", "id", len(td.train))
    check_splits(td, T, validate=False)
    with pytest.raises(UsageError, match=r"the corpus has 331 tokens, and its validation split \(the validation "
                                         r"\(\*_val_\*\) shards\) 0: too few .*--eval-every 0"):
        check_splits(td, T, validate=True)


def _rot(path, at: int, token: int) -> None:
    """One token of a shard overwritten in place after the shard was opened (and checked)."""
    with open(path, "r+b") as f:
        f.seek(fmt.HEADER_BYTES + 2 * at)
        f.write(np.array([token], dtype=fmt.TOKEN).tobytes())


def test_a_token_outside_the_vocabulary_stops_the_batch_naming_its_shard_and_place(tmp_path):
    td = corpus(tmp_path)
    batches = OrderedBatches(td.train, 4, T, seed=0)
    _rot(tmp_path / fmt.shard_name("c", "train", 3), 17, 50257)
    with pytest.raises(LadderError, match=r"c_train_000003.bin holds token id 50257 at token 17 \(byte 1,058\), "
                                          "outside GPT-2's vocabulary") as err:
        for i in range(2 * batches.per_epoch):  # the damaged window comes up within an epoch
            batches.batch(i)
    assert "\n" not in str(err.value)
    _rot(tmp_path / fmt.shard_name("c", "val", 0), 150, 65535)
    with pytest.raises(LadderError, match="c_val_000000.bin holds token id 65535 at token 150"):
        validation_batches(td, 4, T, 10)
    text = np.arange(500, dtype=np.uint16)
    text[321] = 50300
    with pytest.raises(LadderError, match="the text's tokens hold id 50300 at position 321"):
        for i in range(200):
            Batches(text, 4, T, seed=0).batch(i)
