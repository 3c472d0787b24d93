"""Validation beside training on a GPU, simulated on a CPU: its batch is planned from the memory reserved,
since a CUDA graph's pool keeps the step's activations reserved (not allocated) between steps."""

from types import SimpleNamespace

import torch

from gpt2ladder.model.config import preset
from gpt2ladder.runtime.distributed import SINGLE
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.training import trainer as trainer_mod

GiB = 2**30


def test_validation_is_cut_to_what_fits_beside_what_training_reserves(monkeypatch):
    freed = []
    monkeypatch.setattr(trainer_mod, "free_memory", freed.append)  # the cache goes back first
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 2 * GiB)  # weights, gradients, AdamW
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: int(4.3 * GiB))  # and the graph's pool
    val = [(torch.zeros(4, 1024, dtype=torch.long), torch.zeros(4, 1024, dtype=torch.long))] * 2
    run = SimpleNamespace(device=torch.device("cuda", 0), val=val, val_rows=None, cfg=SimpleNamespace(seq_len=1024),
                          dist=SINGLE,
                          caps=Capabilities("cuda", "a card", (8, 6), total_memory=6 * GiB),
                          engine=SimpleNamespace(raw_model=SimpleNamespace(config=preset("gpt2"))))
    cut = trainer_mod.Trainer._val_that_fits(run)
    # 0.92 x 5.5 GiB - 4.3 GiB leaves 0.76 GiB: one sequence of validation (0.53 GiB), not the four that
    # the 3 GiB left beside what is allocated would have let in
    assert freed == [run.device] and [len(x) for x, _ in cut] == [1] * 8
    assert torch.equal(torch.cat([x for x, _ in cut]), torch.cat([x for x, _ in val]))
    # planned once: later validations keep the plan, without emptying the cache before each
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: int(2.5 * GiB))
    again = trainer_mod.Trainer._val_that_fits(run)
    assert freed == [run.device] and run.val_rows == 1 and [len(x) for x, _ in again] == [1] * 8
