"""What the rewrites share: the dtype autocast would compute in, and building a module of another class
around the parameters of an existing one (so the state dict, the weight tying and the function stay)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The matmul dtype autocast would pick here; the rewritten ops run with autocast off and cast themselves."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def linear_like(cls: type[nn.Linear], linear: nn.Linear) -> nn.Linear:
    """A `cls` (an nn.Linear subclass) holding the very parameters of `linear`: nothing is copied."""
    new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    new.weight, new.bias = linear.weight, linear.bias
    new.__dict__.update({k: v for k, v in linear.__dict__.items() if not k.startswith("_") and k not in new.__dict__})
    return new


def replace_modules(model: nn.Module, wanted, build) -> list[str]:
    """Replace every submodule for which `wanted(name, module)` holds by `build(module)`; their names."""
    targets = [(name, module) for name, module in model.named_modules() if name and wanted(name, module)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, build(module))
    return [name for name, _ in targets]


def matmul_without_bias(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x @ linear.weight.T, the bias left to whoever adds it next: the Linear's own bias-less matmul where it
    has one (the fp32_wgrad rung's), else F.linear without the bias."""
    return linear.matmul(x) if hasattr(linear, "matmul") else F.linear(x, linear.weight)


def matmul_bias_without_grad(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x @ linear.weight.T + linear.bias, the bias taking no gradient here: whoever reads the output sums it."""
    if hasattr(linear, "matmul"):
        return linear.matmul(x, bias_without_grad=True)
    return F.linear(x, linear.weight, linear.bias.detach())


def in_blocks(name: str) -> bool:
    """Whether a module name lies inside the transformer's Blocks (transformer.h.N...)."""
    return ".h." in f".{name}"
