"""What a CUDA-graph capture does around its warm-up, on a CPU: the weights and optimizer state wait in host
memory, AdamW's state is made before the warm-up, and everything the warm-up changed is put back."""

import torch

from gpt2ladder.model.config import ModelConfig
from gpt2ladder.runtime.engine import Engine, _allocate_optimizer_state, _restore, _snapshot
from gpt2ladder.model.setup import Setup

CPU = torch.device("cpu")
SMALL = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=256)


def engine_and_batch():
    engine = Engine(SMALL, Setup(), CPU, seed=0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, SMALL.vocab_size, (2, 16), generator=gen)
    return engine, x


def state_tensors(optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


def test_the_snapshot_holds_copies_not_the_tensors():
    engine, x = engine_and_batch()
    engine.step(x, x)  # AdamW has state now, as after resuming
    snapshot = _snapshot(engine.raw_model, engine.optimizer)
    saved = list(snapshot["params"].values()) + [v for s in snapshot["state"].values() for v in s.values()
                                                 if torch.is_tensor(v)]
    assert saved and all(t.device.type == "cpu" for t in saved)
    live = {t.untyped_storage().data_ptr()
            for t in list(engine.raw_model.parameters()) + state_tensors(engine.optimizer)}
    assert not live & {t.untyped_storage().data_ptr() for t in saved}  # copies, not the tensors themselves


def test_a_warm_up_after_the_state_is_made_is_undone_exactly():
    engine, x = engine_and_batch()
    fresh, _ = engine_and_batch()
    snapshot = _snapshot(engine.raw_model, engine.optimizer)
    _allocate_optimizer_state(engine.optimizer)
    assert state_tensors(engine.optimizer) and all(p.grad is None for p in engine.raw_model.parameters())
    for _ in range(3):  # the warm-up
        engine.step(x, x)
    _restore(engine.raw_model, engine.optimizer, snapshot)
    for p, q in zip(engine.raw_model.parameters(), fresh.raw_model.parameters()):
        assert torch.equal(p, q)
    assert all(not t.any() for t in state_tensors(engine.optimizer))  # as AdamW starts
    assert torch.equal(engine.step(x, x), fresh.step(x, x))
    for p, q in zip(engine.raw_model.parameters(), fresh.raw_model.parameters()):
        assert torch.equal(p, q)


def test_state_there_before_the_capture_comes_back_as_it_was():
    engine, x = engine_and_batch()
    engine.step(x, x)
    before = [t.clone() for t in state_tensors(engine.optimizer)]
    snapshot = _snapshot(engine.raw_model, engine.optimizer)
    _allocate_optimizer_state(engine.optimizer)  # there already: nothing to make
    engine.step(x, x)
    _restore(engine.raw_model, engine.optimizer, snapshot)
    assert all(torch.equal(a, b) for a, b in zip(state_tensors(engine.optimizer), before))
