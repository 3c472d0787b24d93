"""multi_kernel and triton_tuning, on the CPU: each rung asks torch.compile for its Inductor option (and only
Inductor), the options join tied_grad's pass rather than replace it, Inductor accepts them in a real compile of the
tiny model's step (on a CPU Inductor writes C++, which neither option touches), and both need a GPU with Triton. Their kernels are exercised on a GPU (test_inductor_search_gpu.py)."""

import pytest
import torch

from gpt2ladder.ladder import resolve_rungs, setup_for, why_unavailable
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime import engine as engine_module
from gpt2ladder.runtime.engine import Engine, inductor_options
from gpt2ladder.runtime.hardware import Capabilities

H200 = Capabilities("cuda", "NVIDIA H200", (9, 0), triton_version="3.6.0")
COMPILED = ["baseline", "compile", "flash", "vocab", "fused_adamw"]


def test_each_rung_is_one_inductor_option():
    assert inductor_options(setup_for(resolve_rungs("auto", H200))) == {}
    assert inductor_options(setup_for(["multi_kernel"])) == {"triton.multi_kernel": 1}
    assert inductor_options(setup_for(["triton_tuning"])) == {"coordinate_descent_tuning": True}
    assert inductor_options(setup_for(["multi_kernel", "triton_tuning"])) == {"triton.multi_kernel": 1,
                                                                           "coordinate_descent_tuning": True}
    assert setup_for(["multi_kernel"]).compile and setup_for(["triton_tuning"]).compile


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_the_engine_hands_the_options_to_inductor_beside_tied_grads_pass(monkeypatch, backend):
    seen = []

    def compile_(module, backend, options=None):
        seen.append(options)
        return module

    monkeypatch.setattr(engine_module.torch, "compile", compile_)
    Engine(PRESETS["tiny"], setup_for(COMPILED + ["tied_grad", "multi_kernel", "triton_tuning"]), torch.device("cpu"),
           compile_backend=backend)
    Engine(PRESETS["tiny"], setup_for(COMPILED), torch.device("cpu"), compile_backend=backend)
    if backend == "inductor":
        (searched, plain) = seen
        assert searched.pop("post_grad_custom_post_pass") is not None  # tied_grad's pass is still there
        assert searched == {"triton.multi_kernel": 1, "coordinate_descent_tuning": True} and plain is None
    else:
        assert seen == [None, None]  # options are Inductor's: another backend gets none


def test_inductor_takes_both_options_in_a_real_compile_of_the_step():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 50257, (2, 64), generator=gen), torch.randint(0, 50257, (2, 64), generator=gen)
    engine = Engine(PRESETS["tiny"], setup_for(COMPILED + ["multi_kernel", "triton_tuning"]), torch.device("cpu"),
                    seed=0)
    first, second = engine.step(x, y).item(), engine.step(x, y).item()
    assert second < first  # the compiled step ran (an option Inductor refused would have raised) and learns


def test_both_need_a_gpu_with_triton_and_stay_out_of_auto_until_timed():
    cpu = Capabilities("cpu", "cpu", (0, 0))
    no_triton = Capabilities("cuda", "NVIDIA H200", (9, 0), triton_version=None)
    for name in ("multi_kernel", "triton_tuning"):
        assert why_unavailable(name, H200) is None
        assert "needs a CUDA GPU" in why_unavailable(name, cpu)
        assert "Triton" in why_unavailable(name, no_triton)
        assert name not in resolve_rungs("auto", H200) and name in resolve_rungs("best", H200)
