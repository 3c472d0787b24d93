"""What a card's allocator can hold, one rule for a real card and for --gpu-memory: simulated cards on a CPU."""

from types import SimpleNamespace

import pytest
import torch

from gpt2ladder.errors import UsageError
from gpt2ladder.runtime import hardware
from gpt2ladder.runtime.hardware import CUDA_CONTEXT_BYTES, Capabilities, allocator_memory, cap_memory

GiB = 2**30
CUDA0 = torch.device("cuda", 0)
H200 = Capabilities("cuda", "NVIDIA H200", (9, 0), total_memory=int(139.8 * GiB), free_memory=139 * GiB)


@pytest.fixture
def fractions(monkeypatch):
    """The fractions cap_memory hands the allocator, recorded instead of set."""
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i=None: calls.append((f, i)))
    return calls


@pytest.mark.parametrize("gib", [4, 6, 8])
def test_a_card_keeps_half_a_gib_for_the_cuda_context(gib):
    card = Capabilities("cuda", "a card", (8, 6), total_memory=gib * GiB)
    assert CUDA_CONTEXT_BYTES == GiB // 2
    assert card.usable_memory == gib * GiB - GiB // 2


@pytest.mark.parametrize("gib", [4, 6, 8])
def test_gpu_memory_plans_for_what_that_card_would_hold(gib, fractions):
    capped = cap_memory(CUDA0, H200, gib)
    card = Capabilities("cuda", "a card", (8, 6), total_memory=gib * GiB)
    assert capped.usable_memory == card.usable_memory == (gib - 0.5) * GiB
    assert capped.memory_cap == gib * GiB  # the record names the card, not the allocator's share
    (fraction, index), = fractions
    assert isinstance(fraction, float) and index == 0
    assert fraction * H200.total_memory == pytest.approx((gib - 0.5) * GiB)


def test_what_cuda_reports_free_is_what_a_real_card_plans_with():
    """A real card's free memory already lacks the context and other processes' memory."""
    busy = Capabilities("cuda", "a card", (8, 6), total_memory=8 * GiB, free_memory=5 * GiB)
    assert busy.usable_memory == 5 * GiB
    assert allocator_memory(8 * GiB, free=5 * GiB, card=4 * GiB) == int(3.5 * GiB)  # a stand-in on it
    assert allocator_memory(140 * GiB, free=3 * GiB, card=4 * GiB) == 3 * GiB  # a busy big card
    assert allocator_memory(0) == 0 and Capabilities("cpu", "cpu").usable_memory == 0
    assert Capabilities("mps", "Apple GPU", total_memory=16 * GiB).usable_memory == 16 * GiB  # no CUDA context


@pytest.mark.parametrize("gib, words", [(0.5, "CUDA context"), (0.25, "above 0.5"), (200, "at most this GPU's")])
def test_gpu_memory_out_of_range_is_a_usage_error(gib, words, fractions):
    with pytest.raises(UsageError, match=words):
        cap_memory(CUDA0, H200, gib)
    assert fractions == []


def test_detect_reads_what_the_allocator_could_hold(monkeypatch):
    props = SimpleNamespace(name="NVIDIA GeForce GTX 1650", major=7, minor=5, total_memory=4 * GiB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (int(3.2 * GiB), 4 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: GiB // 4)  # this process already holds
    facts = hardware._cuda_facts(CUDA0)
    assert facts["total_memory"] == 4 * GiB and facts["free_memory"] == int(3.45 * GiB)
    caps = Capabilities(**facts)
    assert caps.usable_memory == int(3.45 * GiB)
