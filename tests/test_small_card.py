"""benchmarks/micro/small_card.py: the big card made to look like a small one, checked on a CPU against a
simulated device; what the product then reads is what a real card of that size would report."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpt2ladder.runtime import hardware
from gpt2ladder.runtime.hardware import Capabilities, cap_memory

GiB = 2**30
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "micro" / "small_card.py"
H200_TOTAL = int(139.8 * GiB)
NAMES = ("get_device_properties", "mem_get_info", "set_per_process_memory_fraction", "reset_peak_memory_stats")


@pytest.fixture(scope="module")
def small_card():
    spec = importlib.util.spec_from_file_location("small_card", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture
def h200(monkeypatch):
    """A simulated one-GPU H200 (139.8 GiB, 0.3 GiB held by this process): the fractions set are recorded."""
    device = SimpleNamespace(fractions=[], resets=[])
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=H200_TOTAL, multi_processor_count=132)
    fakes = {"get_device_properties": lambda d=None: props,
             "mem_get_info": lambda d=None: (H200_TOTAL - GiB, H200_TOTAL),
             "set_per_process_memory_fraction": lambda f, d=None: device.fractions.append((f, d)),
             "reset_peak_memory_stats": lambda d=None: device.resets.append(d),
             "memory_reserved": lambda d=None: int(0.3 * GiB), "device_count": lambda: 1,
             "max_memory_allocated": lambda d=None: 2 * GiB, "max_memory_reserved": lambda d=None: int(2.5 * GiB)}
    for module in (torch.cuda, torch.cuda.memory):  # every name restored after the test, patched or not
        for name, fake in fakes.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, fake)
    device.at_exit = []
    monkeypatch.setattr("atexit.register", lambda fn, *args: device.at_exit.append((fn, args)))
    return device


@pytest.mark.parametrize("gib", [4, 6, 8])
def test_the_stand_in_caps_the_allocator_where_a_real_card_would(gib, small_card):
    card = small_card.stand_in(gib, H200_TOTAL)
    assert card.allocator == (gib - 0.5) * GiB
    assert card.fraction() * H200_TOTAL == pytest.approx((gib - 0.5) * GiB)
    assert card.fraction(0.5) * H200_TOTAL == pytest.approx(gib / 2 * GiB)  # half of the card it plays
    assert card.free(H200_TOTAL, reserved=GiB) == (gib - 1.5) * GiB
    assert card.free(GiB // 4, reserved=0) == GiB // 4  # never more than the device has free
    with pytest.raises(SystemExit, match="above 0.5 GiB"):
        small_card.stand_in(0.5, H200_TOTAL)


@pytest.mark.parametrize("gib", [4, 6, 8])
def test_with_no_flag_the_product_plans_for_the_card_stood_in_for(gib, small_card, h200):
    small_card.install(gib)
    assert h200.fractions == [(pytest.approx((gib - 0.5) * GiB / H200_TOTAL), 0)]
    facts = hardware._cuda_facts(torch.device("cuda", 0))
    assert facts["name"] == "NVIDIA H200" and facts["total_memory"] == gib * GiB
    assert torch.cuda.get_device_properties(0).multi_processor_count == 132  # the rest is the device's own
    seen = Capabilities(**facts)
    real = Capabilities("cuda", "a card", (8, 6), total_memory=gib * GiB)
    assert seen.usable_memory == real.usable_memory == (gib - 0.5) * GiB
    assert torch.cuda.mem_get_info(0) == ((gib - 0.5) * GiB - int(0.3 * GiB), gib * GiB)  # 0.3 GiB already held


def test_gpu_memory_on_the_stand_in_is_a_share_of_the_card_it_plays(small_card, h200):
    small_card.install(8)
    caps = Capabilities(**hardware._cuda_facts(torch.device("cuda", 0)))
    capped = cap_memory(torch.device("cuda", 0), caps, 4)
    assert capped.usable_memory == int(3.5 * GiB)
    assert h200.fractions[-1] == (pytest.approx(3.5 * GiB / H200_TOTAL), 0)


def test_the_peaks_said_at_exit_are_the_highest_across_resets(small_card, h200, monkeypatch, capsys):
    small_card.install(4)
    torch.cuda.reset_peak_memory_stats(torch.device("cuda", 0))  # bench resets before every rung
    assert h200.resets == [0]
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: GiB)  # a lighter rung after the reset
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: GiB)
    (say, args), = h200.at_exit
    say(*args)
    assert ("GPU 0 as a 4 GiB card: peak allocated 2.00 GiB, peak reserved 2.50 GiB of the 3.50 GiB its allocator "
            "may hold") in capsys.readouterr().err
