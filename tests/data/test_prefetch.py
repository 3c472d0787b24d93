"""The prefetcher: the loader's batches in the loader's order, a position that is what was handed out
(not what was made ahead), a failure raised on the training thread, and a thread that stops."""

import time

import numpy as np
import pytest
import torch

from gpt2ladder.data import Batches, Prefetcher
from gpu_support import needs_cuda


def loader(seed=0):
    return Batches(np.arange(10_000, dtype=np.uint16), 4, 16, seed=seed)


def test_batches_come_in_the_loaders_order():
    want = loader()
    with Prefetcher(loader(), "cpu") as p:
        for _ in range(12):
            x, y = p.next()
            wx, wy = want.next()
            assert torch.equal(x, wx) and torch.equal(y, wy)
        assert p.state_dict() == {"position": 12, "seed": 0}  # what was handed out, not what was made ahead


def test_a_resume_through_the_prefetcher_continues_exactly():
    straight = [loader(3).batch(i) for i in range(10)]
    with Prefetcher(loader(3), "cpu") as p:
        for _ in range(4):
            p.next()
        state = p.state_dict()
    fresh = Batches(np.arange(10_000, dtype=np.uint16), 4, 16, seed=0)
    with Prefetcher(fresh, "cpu") as resumed:
        resumed.next()  # made ahead from position 0 and dropped by the load
        resumed.load_state_dict(state)
        for i in range(4, 10):
            assert torch.equal(resumed.next()[0], straight[i][0])


class Failing:
    """A loader whose third batch cannot be read (a shard gone from under a run)."""

    batch_size, seq_len, world_size, position = 4, 16, 1, 0

    def batch(self, index):
        if index == 2:
            raise OSError("shard vanished")
        return torch.zeros(4, 16, dtype=torch.int64), torch.zeros(4, 16, dtype=torch.int64)

    def state_dict(self):
        return {"position": self.position}


def test_a_loader_failure_is_raised_by_next_every_time():
    with Prefetcher(Failing(), "cpu") as p:
        p.next(), p.next()
        for _ in range(2):
            with pytest.raises(OSError, match="shard vanished"):
                p.next()


class Slow(Failing):
    def batch(self, index):
        time.sleep(0.05)
        return torch.full((4, 16), index, dtype=torch.int64), torch.zeros(4, 16, dtype=torch.int64)


def test_host_and_wait_times_account_for_a_slow_loader():
    with Prefetcher(Slow(), "cpu") as p:
        x, _ = p.next()  # nothing made ahead yet: this one waits for the thread
        assert int(x[0, 0]) == 0 and p.host_ms >= 40 and p.wait_ms > 0


def test_close_stops_the_thread_even_when_it_is_blocked_on_a_full_queue():
    p = Prefetcher(loader(), "cpu", depth=1)
    time.sleep(0.1)  # the thread fills the queue and blocks
    thread = p._thread
    p.close()
    assert not thread.is_alive()


@needs_cuda
@pytest.mark.gpu
def test_gpu_batches_from_pinned_buffers_are_the_loaders():
    """No synchronize between batches, and each copy queued behind a matmul, as behind a training step: a
    buffer filled again before its copy ran would hand the device a later batch's rows."""
    want = loader(5)
    busy = torch.randn(4096, 4096, device="cuda")
    got = []
    with Prefetcher(loader(5), "cuda", depth=2) as p:
        for _ in range(10):  # more batches than buffers: each buffer is filled again after its copy
            busy @ busy  # keeps the stream busy, so the copy runs well after next() returns
            x, y = p.next()
            assert x.is_cuda and x.dtype == torch.int64
            got.append((x, y))
        torch.cuda.synchronize()
        for x, y in got:
            wx, wy = want.next()
            assert torch.equal(x.cpu(), wx) and torch.equal(y.cpu(), wy)
        assert all(s.x.is_pinned() for s in p._slots)
