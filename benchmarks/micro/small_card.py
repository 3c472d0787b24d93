"""Run a gpt2ladder command on this GPU made to look like a smaller card: no flag, as a user of one would.

    PYTHONPATH=src python3 benchmarks/micro/small_card.py 4 -- train --steps 50 --out /tmp/t4

A real card of G GiB reports G GiB and keeps about 0.5 GiB of it for the CUDA context, so PyTorch's
allocator gets G - 0.5 GiB. The stand-in caps this process's allocator there
(torch.cuda.set_per_process_memory_fraction) and makes the calls gpt2ladder reads a card's memory
from answer as that card would:
- torch.cuda.get_device_properties(d).total_memory: G GiB (every other property is the device's own);
- torch.cuda.mem_get_info(d): (what the capped allocator could still take, G GiB);
- torch.cuda.set_per_process_memory_fraction(f, d), which --gpu-memory calls: f of the G GiB card,
  never above the stand-in's own cap.
Bandwidth and FLOP/s stay the big card's, and PyTorch's own out-of-memory messages still name its
capacity. At exit it prints the command's peak allocated and reserved memory (the reserved memory is
what the cap limits), the highest over the whole command however often it reset the peak statistics.
"""

from __future__ import annotations

import atexit
import sys
from dataclasses import dataclass

import torch

from gpt2ladder.runtime.hardware import CUDA_CONTEXT_BYTES, GiB


@dataclass(frozen=True)
class StandIn:
    """A card of `card` bytes played by a device that reports `device_total` bytes."""

    card: int
    device_total: int

    @property
    def allocator(self) -> int:
        """Bytes the card's allocator gets: the card less the CUDA context."""
        return self.card - CUDA_CONTEXT_BYTES

    def fraction(self, share: float = 1.0) -> float:
        """The device's own memory fraction for `share` of the card, never above the allocator's cap."""
        return min(share * self.card, self.allocator) / self.device_total

    def free(self, device_free: int, reserved: int) -> int:
        """What mem_get_info reports free: what the capped allocator could still take."""
        return max(0, min(device_free, self.allocator - reserved))


class _Properties:
    """A device's properties as it reports them, but for its total memory."""

    def __init__(self, real, total_memory: int):
        self._real, self.total_memory = real, total_memory

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __repr__(self) -> str:
        return f"{self._real!r} (as a card of {self.total_memory / GiB:g} GiB)"


def stand_in(gib: float, device_total: int) -> StandIn:
    card = int(gib * GiB)
    if not CUDA_CONTEXT_BYTES < card <= device_total:
        raise SystemExit(f"small_card.py: a card of {gib:g} GiB must be above {CUDA_CONTEXT_BYTES / GiB:g} GiB "
                         f"and at most the device's {device_total / GiB:.1f} GiB")
    return StandIn(card, device_total)


def install(gib: float, modules=(torch.cuda, torch.cuda.memory)) -> dict[int, StandIn]:
    """Make every visible device a card of `gib` GiB to this process; the stand-ins by device index."""
    cuda = modules[0]
    real = {name: getattr(cuda, name) for name in ("get_device_properties", "mem_get_info",
                                                    "set_per_process_memory_fraction", "reset_peak_memory_stats")}
    cards = {i: stand_in(gib, real["get_device_properties"](i).total_memory) for i in range(cuda.device_count())}
    for i, card in cards.items():
        real["set_per_process_memory_fraction"](card.fraction(), i)
    peaks = {i: [0, 0] for i in cards}  # the highest allocated and reserved bytes seen, across resets

    def index(device) -> int:
        if isinstance(device, int):
            return device
        device = torch.device(device) if device is not None else None
        return device.index if device is not None and device.index is not None else cuda.current_device()

    def get_device_properties(device=None):
        i = index(device)
        return _Properties(real["get_device_properties"](i), cards[i].card)

    def mem_get_info(device=None):
        i = index(device)
        device_free, _ = real["mem_get_info"](i)
        return cards[i].free(device_free, cuda.memory_reserved(i)), cards[i].card

    def set_per_process_memory_fraction(fraction, device=None):
        i = index(device)
        real["set_per_process_memory_fraction"](cards[i].fraction(fraction), i)

    def reset_peak_memory_stats(device=None):
        i = index(device)
        peaks[i] = [max(peaks[i][0], cuda.max_memory_allocated(i)), max(peaks[i][1], cuda.max_memory_reserved(i))]
        real["reset_peak_memory_stats"](i)

    patched = {"get_device_properties": get_device_properties, "mem_get_info": mem_get_info,
               "set_per_process_memory_fraction": set_per_process_memory_fraction,
               "reset_peak_memory_stats": reset_peak_memory_stats}
    for module in modules:
        for name, fn in patched.items():
            if hasattr(module, name):
                setattr(module, name, fn)
    atexit.register(_say_peaks, cuda, cards, peaks)
    return cards


def _say_peaks(cuda, cards: dict[int, StandIn], peaks: dict[int, list[int]]) -> None:
    for i, card in cards.items():
        allocated = max(peaks[i][0], cuda.max_memory_allocated(i))
        reserved = max(peaks[i][1], cuda.max_memory_reserved(i))
        print(f"small card: GPU {i} as a {card.card / GiB:g} GiB card: peak allocated {allocated / GiB:.2f} GiB, "
              f"peak reserved {reserved / GiB:.2f} GiB of the {card.allocator / GiB:.2f} GiB its allocator may hold",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit("usage: small_card.py GIB -- GPT2LADDER_ARGS...")
    for i, card in install(float(sys.argv[1])).items():
        print(f"small card: GPU {i} ({card.device_total / GiB:.1f} GiB) stands in for a {card.card / GiB:g} GiB "
              f"card; its allocator is capped at {card.allocator / GiB:.2f} GiB", file=sys.stderr, flush=True)
    from gpt2ladder.cli import main

    sys.exit(main(sys.argv[3:]))
