"""The adamw_kernel rung: the engine builds KernelAdamW, which off CUDA steps as AdamW does, takes clipping's factor
as its grad_scale, and keeps AdamW's state_dict, so checkpoints move between the two; through Triton's CPU
interpreter the engine trains with the kernel itself as with fused AdamW."""

import importlib.util

import pytest
import torch

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine, OptimConfig
from gpt2ladder.speedups.kernel_adamw import KernelAdamW

CPU = torch.device("cpu")
RUNGS = ["baseline", "fused_adamw"]
CLIPPED = OptimConfig(lr=3e-3, grad_clip=0.05)  # every step clipped hard, through the optimizer's grad_scale


def _batches(n=3, vocab=50257):
    gen = torch.Generator().manual_seed(4)
    return [(torch.randint(0, vocab, (2, 2, 32), generator=gen), torch.randint(0, vocab, (2, 2, 32), generator=gen))
            for _ in range(n)]


def _train(rungs, batches, optim=CLIPPED, engine=None):
    engine = engine or Engine(PRESETS["tiny"], setup_for(rungs), CPU, optim=optim)
    return engine, [engine.step(x, y).item() for x, y in batches]


def test_the_rung_builds_kernel_adamw_which_off_cuda_trains_as_fused_adamw():
    fused, fused_losses = _train(RUNGS, _batches())
    kernel, kernel_losses = _train(RUNGS + ["adamw_kernel"], _batches())
    assert type(fused.optimizer) is torch.optim.AdamW and type(kernel.optimizer) is KernelAdamW
    assert kernel.optimizer.defaults["fused"] and kernel._fused_clip  # clipped through its grad_scale
    assert not hasattr(kernel.optimizer, "grad_scale")  # given for one step only
    assert kernel_losses == fused_losses and kernel_losses[-1] < kernel_losses[0]
    weights = fused.raw_model.state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in kernel.raw_model.state_dict().items())


def test_an_unfused_kernel_adamw_divides_by_grad_scale_itself_off_cuda():
    """AdamW's own unfused step refuses a grad_scale; KernelAdamW's falls back to it all the same, dividing the
    gradients first, as fused AdamW does (and keeps the attribute for whoever set it)."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(33, 7, generator=gen)
    params = {name: torch.nn.Parameter(start.clone()) for name in ("unfused", "fused")}
    grad = torch.randn(33, 7, generator=gen)
    opts = {"unfused": KernelAdamW([params["unfused"]], lr=1e-2, fused=False),
            "fused": torch.optim.AdamW([params["fused"]], lr=1e-2, fused=True)}
    for name, opt in opts.items():
        params[name].grad = grad.clone()
        opt.grad_scale = torch.tensor(4.0)
        opt.step()
        assert torch.is_tensor(opt.grad_scale)
    assert torch.equal(params["unfused"].grad, params["fused"].grad)  # both store the divided gradient
    torch.testing.assert_close(params["unfused"], params["fused"], rtol=1e-6, atol=1e-7)
    assert (params["unfused"] - start).abs().min() > 1e-3  # every element moved by about lr


def test_state_dicts_move_between_kernel_adamw_and_adamw():
    """The same keys, tensors and groups; each loads the other's and trains on as if nothing had changed. Also
    through the engine, as --resume loads a checkpoint, into a run with or without the rung."""
    batches = _batches(4)
    for first, second in ((RUNGS + ["adamw_kernel"], RUNGS), (RUNGS, RUNGS + ["adamw_kernel"])):
        resumed, _ = _train(first, batches[:2])
        straight, straight_losses = _train(first, batches)
        saved = resumed.state_dict()["optimizer"]
        other = Engine(PRESETS["tiny"], setup_for(second), CPU, optim=CLIPPED)
        other.load_state_dict(resumed.state_dict())
        assert type(other.optimizer) is not type(resumed.optimizer)
        reloaded = other.optimizer.state_dict()
        assert reloaded["param_groups"] == saved["param_groups"]
        assert saved["state"].keys() == reloaded["state"].keys()
        for i, state in saved["state"].items():
            assert state.keys() == reloaded["state"][i].keys() == {"step", "exp_avg", "exp_avg_sq"}
            assert all(torch.equal(v, reloaded["state"][i][k]) and v.dtype == reloaded["state"][i][k].dtype
                       for k, v in state.items())
        _, losses = _train(second, batches[2:], engine=other)
        assert losses == straight_losses[2:]


# Run with TRITON_INTERPRET=1: the engine's step on CPU with KernelAdamW's kernel path, against fused AdamW.
SCRIPT = r"""
import dataclasses, json, sys, torch
from gpt2ladder.kernels import adamw as ka
ka.kernels_available = lambda device: True  # the interpreter runs the kernel on CPU tensors
launches = []
real_launch = ka.Tables.launch
ka.Tables.launch = lambda self, *a: launches.append(a[0] is not None) or real_launch(self, *a)
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine, OptimConfig

config = dataclasses.replace(PRESETS["tiny"], vocab_size=501, n_embd=64)  # small: the interpreter is slow
gen = torch.Generator().manual_seed(0)
x, y = (torch.randint(0, 501, (2, 2, 32), generator=gen) for _ in range(2))  # one batch, so the loss must fall
losses, weights = {}, {}
for rungs in json.loads(sys.argv[1]):
    engine = Engine(config, setup_for(rungs), torch.device("cpu"), optim=OptimConfig(lr=3e-3, grad_clip=0.05))
    losses[len(rungs)] = [engine.step(x, y).item() for _ in range(3)]
    weights[len(rungs)] = engine.raw_model.state_dict()
plain, kernel = weights[2], weights[3]
worst = max(((kernel[k] - v).abs() / (1e-5 + 1e-5 * v.abs())).max().item() for k, v in plain.items())
print(json.dumps({"losses": losses, "worst": worst, "launches": launches}))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_the_engine_trains_with_the_kernel_as_with_fused_adamw(triton_interpret):
    result = triton_interpret(SCRIPT, [RUNGS, RUNGS + ["adamw_kernel"]])
    plain, kernel = result["losses"]["2"], result["losses"]["3"]
    assert result["launches"] == [True] * 3  # one launch a step, each with clipping's factor as its grad_scale
    assert kernel[0] == plain[0] and kernel == pytest.approx(plain, rel=1e-6) and kernel[-1] < kernel[0]
    # Within 1e-5 (relative, or absolute near zero): Adam's update, about lr = 3e-3 in size wherever a gradient
    # is not zero, turns the last-bit differences of near-zero gradients into differences of that order.
    assert result["worst"] <= 1


# What the engine scripts below share, run with TRITON_INTERPRET=1: the kernel's path on CPU tensors,
# a narrower tiny model with a
# small vocabulary (the interpreter is slow), one batch, and an engine that clips (so the kernel gets a grad_scale).
ENGINE_PRELUDE = r"""
import dataclasses, json, sys, torch
from gpt2ladder.kernels import adamw as ka
ka.kernels_available = lambda device: True  # the interpreter runs the kernel on CPU tensors
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine, OptimConfig

config = dataclasses.replace(PRESETS["tiny"], vocab_size=501, n_embd=64)
gen = torch.Generator().manual_seed(0)
x, y = (torch.randint(0, 501, (2, 2, 32), generator=gen) for _ in range(2))


def three_steps(setup, **optimizer):  # three clipped steps, `optimizer` set on the engine's before the first
    engine = Engine(config, setup, torch.device("cpu"), optim=OptimConfig(lr=3e-3, grad_clip=0.05))
    for name, value in optimizer.items():
        setattr(engine.optimizer, name, value)
    return engine, [engine.step(x, y).item() for _ in range(3)]
"""

# The weight_cast rung's step with KernelAdamW writing the copies (as the engine builds it) and
# without (its copies taken away: the step's own multi-tensor copy), on a bf16-autocast CPU step.
CASTS_SCRIPT = ENGINE_PRELUDE + r"""
from gpt2ladder.speedups.weight_cast import WeightCasts, weight_casts

refreshes = []
real_refresh = WeightCasts.refresh
WeightCasts.refresh = lambda self: refreshes.append(1) or real_refresh(self)
setup = dataclasses.replace(setup_for(["baseline", "bf16", "flash", "vocab", "fused_adamw", "adamw_kernel"]),
                            fp32_wgrad=True, weight_cast=True)
out = {}
for writes in (False, True):
    refreshes.clear()
    engine, losses = three_steps(setup, **({} if writes else {"casts": None}))
    steps = len(refreshes)
    copies, sources = weight_casts(engine.raw_model).pairs()
    held = all(torch.equal(c, s.detach().to(torch.bfloat16)) for c, s in zip(copies, sources))
    engine.load_state_dict(engine.state_dict())  # a load makes them again, as the graph would not
    out[str(writes)] = {"losses": losses, "refreshes": steps, "after_load": len(refreshes) - steps, "held": held,
                        "given": engine.optimizer.casts is not None,
                        "weights": [v.sum().item() for v in engine.raw_model.state_dict().values()]}
print(json.dumps(out))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_copies_written_by_the_kernel_are_the_copies_the_step_would_make(triton_interpret):
    """Given the copies (as the engine gives them) the kernel writes the weight_cast rung's bfloat16 copies
    beside its update, so the
    step makes them only at the first step, and the training is the same bit for bit."""
    result = triton_interpret(CASTS_SCRIPT, [])
    copying, writing = result["False"], result["True"]
    assert not copying["given"] and writing["given"]
    assert copying["refreshes"] == 3 and writing["refreshes"] == 1  # the first step's copies, from the initial weights
    assert copying["after_load"] == writing["after_load"] == 1
    # after the last step each written copy is its weight, updated, in bfloat16; the step's own still the weight before
    assert writing["held"] and not copying["held"]
    assert writing["losses"] == copying["losses"] and writing["weights"] == copying["weights"]
    assert writing["losses"][-1] < writing["losses"][0]


# The engine's step with the kernel told to store the divided gradients, and not.
STORES_SCRIPT = ENGINE_PRELUDE + r"""
stored = []
real_launch = ka.Tables.launch
ka.Tables.launch = lambda self, *a: stored.append(a[2]) or real_launch(self, *a)
out = {}
for stores in (True, False):
    stored.clear()
    engine, losses = three_steps(setup_for(json.loads(sys.argv[1])), unscaled_grads=stores)
    out[str(stores)] = {"losses": losses, "stored": list(stored),
                        "weights": [v.tolist() for v in engine.raw_model.state_dict().values()]}
print(json.dumps(out))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_leaving_the_gradients_scaled_changes_no_update(triton_interpret):
    """KernelAdamW's `unscaled_grads` off in the engine's step: the kernel does not store the divided gradients
    (nothing reads them after the step), and the training is the same bit for bit."""
    result = triton_interpret(STORES_SCRIPT, RUNGS + ["adamw_kernel"])
    stores, leaves = result["True"], result["False"]
    assert stores["stored"] == [True] * 3 and leaves["stored"] == [False] * 3
    assert leaves["losses"] == stores["losses"] and leaves["weights"] == stores["weights"]
    assert leaves["losses"][-1] < leaves["losses"][0]
