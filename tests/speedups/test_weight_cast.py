"""The weight_cast rung: the Blocks' matmuls read bf16 copies refreshed once per step, and the step computes
the same numbers as casting beside each matmul."""

import contextlib
import dataclasses

import pytest
import torch

from gpt2ladder import speedups
from gpt2ladder.ladder import setup_for, strategy_problem
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear
from gpt2ladder.speedups.weight_cast import WeightCasts, weight_casts

CPU = torch.device("cpu")
BASE = dataclasses.replace(setup_for(["baseline", "bf16", "flash", "vocab", "fused_adamw"]), fp32_wgrad=True)


SMALL = dataclasses.replace(PRESETS["tiny"], vocab_size=501)  # the tiny model with a small vocabulary: faster on a CPU


def _batches(n=3):
    gen = torch.Generator().manual_seed(5)
    return [(torch.randint(0, 501, (2, 2, 32), generator=gen), torch.randint(0, 501, (2, 2, 32), generator=gen))
            for _ in range(n)]


def test_the_rewrite_gives_every_block_linear_a_copy_in_the_autocast_dtype():
    engine = Engine(PRESETS["tiny"], dataclasses.replace(BASE, weight_cast=True), CPU)
    casts = weight_casts(engine.raw_model)
    linears = [m for m in engine.raw_model.modules() if isinstance(m, Fp32WgradLinear)]
    assert casts is not None and len(linears) == 4 * PRESETS["tiny"].n_layer
    assert all(m.casts.weight.dtype == torch.bfloat16 and m.casts.weight.shape == m.weight.shape for m in linears)
    copies, sources = casts.pairs()
    assert len(copies) == 2 * len(linears)  # GPT-2's Linears all have a bias
    # Outside a step the matmuls do not read the copies, so a stale copy is never used.
    assert linears[0].casts.fresh() == (None, None)
    with casts.fresh():
        assert all(torch.equal(c, s.to(torch.bfloat16)) for c, s in zip(copies, sources))
        weight, bias = linears[0].casts.fresh()
        assert weight is linears[0].casts.weight and bias is linears[0].casts.bias
    assert linears[0].casts.fresh() == (None, None)
    # The state dict is the model's own: the copies are not in it.
    assert not any("cast" in k for k in engine.raw_model.state_dict())


def test_without_autocast_there_is_nothing_to_cast():
    setup = dataclasses.replace(BASE, autocast=None, weight_cast=True)
    engine = Engine(PRESETS["tiny"], setup, CPU)
    assert weight_casts(engine.raw_model) is None


@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_steps_compute_the_same_numbers_as_casting_beside_each_matmul(backend):
    """Eager and through AOT autograd, with gradient accumulation: the same losses and weights, bit for bit."""
    losses, weights = {}, {}
    for on in (False, True):
        setup = dataclasses.replace(BASE, weight_cast=on, compile=backend is not None)
        engine = Engine(SMALL, setup, CPU, compile_backend=backend or "inductor")
        (x, y), = _batches(1)
        losses[on] = [engine.step(x, y).item() for _ in range(3)]  # one batch again: the loss on it must fall
        weights[on] = engine.raw_model.state_dict()
    assert losses[True] == losses[False]
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])
    assert losses[True][-1] < losses[True][0]


def test_a_step_reads_the_weights_as_they_are_now():
    """Weights changed between steps (a resume, a load) are what the next step's copies hold."""
    engine = Engine(SMALL, dataclasses.replace(BASE, weight_cast=True), CPU)
    fresh = Engine(SMALL, dataclasses.replace(BASE, weight_cast=True), CPU, seed=1)
    (x, y), = _batches(1)
    engine.step(x, y)
    engine.load_state_dict(fresh.state_dict())
    assert engine.step(x, y).item() == fresh.step(x, y).item()


def test_the_rewrite_runs_after_fp32_wgrad_and_fsdp_refuses_it():
    names = [r.name for r in speedups.REWRITES]
    assert names.index("weight_cast") > names.index("fp32_wgrad")
    assert "shard" in strategy_problem("weight_cast", "fsdp")
    assert strategy_problem("weight_cast", "ddp") is None and strategy_problem("weight_cast", None) is None


def test_the_step_reads_the_copies(monkeypatch):
    """Copies changed after their refresh change the step's loss: the matmuls read them, not the weights."""
    (x, y), = _batches(1)
    setup = dataclasses.replace(BASE, weight_cast=True)
    plain = Engine(PRESETS["tiny"], setup, CPU).step(x, y).item()
    refresh = WeightCasts.fresh

    @contextlib.contextmanager
    def tripled(self):
        with refresh(self):
            copies, _ = self.pairs()
            with torch.no_grad():
                torch._foreach_mul_(copies, 3.0)
            yield

    monkeypatch.setattr(WeightCasts, "fresh", tripled)
    assert Engine(PRESETS["tiny"], setup, CPU).step(x, y).item() != plain


def test_copies_said_written_are_not_made_again_until_a_weight_changes(monkeypatch):
    """What the adamw_kernel rung's optimizer relies on when it writes the copies itself: `fresh()` skips its copy
    while every weight is the one, at the version, said written, and makes them all again otherwise."""
    engine = Engine(PRESETS["tiny"], dataclasses.replace(BASE, weight_cast=True), CPU)
    casts = weight_casts(engine.raw_model)
    made = []
    real = WeightCasts.refresh
    monkeypatch.setattr(WeightCasts, "refresh", lambda self: made.append(1) or real(self))
    (x, y), = _batches(1)
    engine.step(x, y)
    assert len(made) == 1 and not casts.current()  # fused AdamW changed the weights after the copy
    copies, sources = casts.pairs()
    with torch.no_grad():  # as the kernel writes them: the copies change, the weights' versions do not
        torch._foreach_copy_(copies, [s.detach() for s in sources])
    casts.written(sources)
    assert casts.current()
    with casts.fresh():
        pass
    assert len(made) == 1
    casts.written(sources[1:])  # one copy not written: all are made again
    with casts.fresh():
        pass
    assert len(made) == 2 and not casts.current()
    casts.written(sources)
    with torch.no_grad():
        sources[3].mul_(2.0)  # a weight changed in place, by anything but the kernel
    assert not casts.current()
    with casts.fresh():
        assert torch.equal(copies[3], sources[3].detach().to(torch.bfloat16))
    assert len(made) == 3


def test_copies_of_one_shape_are_views_of_one_tensor():
    """Each shape's copies lie side by side: every copy a contiguous view of its shape's stack, none shared."""
    engine = Engine(PRESETS["tiny"], dataclasses.replace(BASE, weight_cast=True), CPU)
    casts = weight_casts(engine.raw_model)
    n_layer = PRESETS["tiny"].n_layer
    assert sorted(len(members) for _, members in casts.stacks) == [n_layer] * 4  # c_attn, c_proj, c_fc, mlp.c_proj
    for stack, members in casts.stacks:
        for i, m in enumerate(members):
            assert m.casts.weight.is_contiguous() and m.casts.weight.data_ptr() == stack[i].data_ptr()
            assert m.casts.weight.shape == m.weight.shape
    ptrs = [m.casts.weight.data_ptr() for m in casts.linears]
    assert len(set(ptrs)) == len(ptrs)
