"""The model rewrites that rungs ask for, applied by `apply` in one fixed order.

A rewrite replaces modules of a built `GPT` by modules that hold the very same parameters (so the
state dict, the weight tying and the function the model computes stay) and run them another way.
Which rewrites run is read off the `Setup`; the order is the `REWRITES` tuple, and each rewrite names
the ones that must run before it and why. `check_order` asserts those constraints, and `apply` runs
it, so a rewrite moved to the wrong place fails at once instead of silently leaving modules alone.

Rewrites that change only how a step runs (precision, compile, CUDA graphs, the optimizer) are not
here: the engine (`runtime/engine.py`) applies those around the model. (The adamw_kernel rung's optimizer,
`kernel_adamw.py`, sits beside the rewrites as a rung's module, but the engine builds it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

from gpt2ladder.model.setup import Setup


def _fused_loss(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.fused_loss import FusedLossHead

    # The new head holds the same weight Parameter, so it stays tied to the token embedding.
    model.lm_head = FusedLossHead.from_head(model.lm_head, fp8=setup.fp8_head, kernel=setup.loss_kernel)
    return ["lm_head"]


def _gelu_kernel(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.gelu_mlp import use_gelu_kernel

    return use_gelu_kernel(model)


def _rotary_kernel(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.rotary_attention import use_rotary_kernel

    return use_rotary_kernel(model)


def _fp32_wgrad(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.fp32_wgrad import use_fp32_wgrad

    return use_fp32_wgrad(model)


def _fp8_dgrad(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.fp32_wgrad import use_fp8_dgrad

    return use_fp8_dgrad(model)


def _weight_cast(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.weight_cast import use_weight_casts

    if setup.autocast_dtype is None:
        return []  # nothing to cast: the matmuls run in the weights' own dtype
    return use_weight_casts(model, setup.autocast_dtype)


def _qkv_grad(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.qkv_grad import use_qkv_kernel

    return use_qkv_kernel(model)


def _norm_kernel(model: nn.Module, setup: Setup) -> list[str]:
    from gpt2ladder.speedups.norm_block import use_norm_kernel

    return use_norm_kernel(model, defer_bias=setup.proj_bias, fp8_forward=setup.fp8_forward, fp8_fc=setup.fp8_fc,
                           fp8_proj=setup.fp8_proj, bias_ones=setup.bias_in_wgrad)


@dataclass(frozen=True)
class Rewrite:
    name: str
    wanted: Callable[[Setup], bool]  # whether a setup asks for it
    rewrite: Callable[[nn.Module, Setup], list[str]]  # in place; the names of the modules replaced
    after: tuple[str, ...] = ()  # rewrites that must already have run, when they run at all
    why: str = ""  # why that order


REWRITES: tuple[Rewrite, ...] = (
    Rewrite("fused_loss", lambda s: s.fused_loss or s.fp8_head, _fused_loss),
    Rewrite("gelu_kernel", lambda s: s.gelu_kernel, _gelu_kernel),
    Rewrite("rotary_kernel", lambda s: s.rotary_kernel, _rotary_kernel),
    Rewrite("fp32_wgrad", lambda s: s.fp32_wgrad, _fp32_wgrad, after=("gelu_kernel",),
            why="the GELU kernel's MLP must first see its c_fc as a plain Linear to take it"),
    Rewrite("fp8_dgrad", lambda s: s.fp8_dgrad, _fp8_dgrad, after=("fp32_wgrad",),
            why="it marks the Linears fp32_wgrad makes, whose backward forms the input gradient in float8"),
    Rewrite("weight_cast", lambda s: s.weight_cast, _weight_cast, after=("fp32_wgrad",),
            why="it gives copies to the Linears that fp32_wgrad makes, which are the ones that read them"),
    Rewrite("qkv_grad", lambda s: s.qkv_grad, _qkv_grad),
    Rewrite("norm_kernel", lambda s: s.norm_kernel, _norm_kernel, after=("qkv_grad", "gelu_kernel", "fp32_wgrad"),
            why="NormBlock keeps the attention and MLP it finds, so they must already be the ones that run (with "
                "fp8_proj, only the GELU kernel's MLP writes c_proj's float8 operand; with bias_in_wgrad, only an "
                "fp32_wgrad c_attn sums its bias through the columns of ones)"),
)


def check_order(rewrites: tuple[Rewrite, ...] = REWRITES) -> None:
    """Every rewrite comes after the ones it names; a misordered tuple is a bug, so it fails loudly."""
    seen: set[str] = set()
    names = {r.name for r in rewrites}
    for r in rewrites:
        unknown = set(r.after) - names
        assert not unknown, f"rewrite {r.name} names unknown rewrites {sorted(unknown)}"
        early = set(r.after) - seen
        assert not early, f"rewrite {r.name} must come after {sorted(early)}: {r.why}"
        seen.add(r.name)


def apply(model: nn.Module, setup: Setup, rewrites: tuple[Rewrite, ...] = REWRITES) -> dict[str, list[str]]:
    """Apply every rewrite the setup asks for, in order; {rewrite: the modules it replaced}."""
    check_order(rewrites)
    return {r.name: r.rewrite(model, setup) for r in rewrites if r.wanted(setup)}
