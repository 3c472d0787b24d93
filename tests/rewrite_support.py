"""What the CPU tests of the module rewrites share (tests/kernels/test_gelu_kernel.py,
tests/kernels/test_qkv_kernel.py): a rewrite replaces every Block's module and keeps the state dict, and a compiled
training step trains alike with it."""

import dataclasses

import pytest
import torch

from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, init_weights


def assert_rewires_every_block(rewrite, attr: str, cls: type) -> None:
    """`rewrite(model)` replaces each Block's `attr` by a `cls`, names them, keeps the state dict, and is idempotent."""
    model = init_weights(GPT(PRESETS["tiny"]), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = rewrite(model)
    assert names == [f"transformer.h.{i}.{attr}" for i in range(PRESETS["tiny"].n_layer)]
    assert all(type(getattr(b, attr)) is cls for b in model.transformer.h)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert rewrite(model) == []  # idempotent


def assert_compiled_steps_match(rungs: list[str], field: str, attr: str, cls: type) -> None:
    """Three compiled steps on one batch (AOT autograd: compile's tracing of forward and backward, on the CPU) with the
    Setup's `field` off and on give the same losses, and the loss falls; with it on, each Block's `attr` is a `cls`."""
    from gpt2ladder.ladder import setup_for
    from gpt2ladder.runtime.engine import Engine

    gen = torch.Generator().manual_seed(3)
    batch = (torch.randint(0, 50257, (2, 32), generator=gen), torch.randint(0, 50257, (2, 32), generator=gen))
    batches = [batch] * 3  # one batch thrice: its loss must fall
    setup = setup_for(rungs)
    losses = {}
    for on in (False, True):
        engine = Engine(PRESETS["tiny"], dataclasses.replace(setup, **{field: on}), torch.device("cpu"),
                        compile_backend="aot_eager")
        assert (type(getattr(engine.raw_model.transformer.h[0], attr)) is cls) == on
        losses[on] = [engine.step(x, y).item() for x, y in batches]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    assert losses[True][-1] < losses[True][0]
