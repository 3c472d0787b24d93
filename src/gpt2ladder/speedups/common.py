"""What the rewrites share: the dtype autocast would compute in, building a module of another class around the
parameters of an existing one (so the state dict, the weight tying and the function stay), and the float8 product
with one scale per row of each operand."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The matmul dtype autocast would pick here; the rewritten ops run with autocast off and cast themselves."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def scaled_mm(a8, b8, scale_a, scale_b, out_dtype: torch.dtype, bias=None, fast_accum: bool = False) -> torch.Tensor:
    """`torch._scaled_mm(a8, b8, ...)` for float8 a8 (M, K), b8 (K, N) with per-tensor scales (0-d) or row scales of
    a8 (M, 1) and column scales of b8 (1, N): on CUDA that call; elsewhere the same product in fp32, which holds
    every product of two float8 values exactly (PyTorch's own CPU kernel for it is a slow reference one)."""
    if a8.is_cuda:
        return torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype,
                                use_fast_accum=fast_accum)
    y = (a8.float() @ b8.float()) * scale_a * scale_b
    return (y if bias is None else y + bias.float()).to(out_dtype)


def scaled_matmul(x8, sx, w8, sw, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """(x8 * sx[:, None]) @ (w8 * sw[:, None]).T + bias in `out_dtype`, for 2-D float8 x8 (N, in), w8 (out, in) and
    fp32 row scales, with fast accumulation: `scaled_mm` (w8 contiguous, so that w8.T is the column-major operand
    `torch._scaled_mm` takes)."""
    return scaled_mm(x8, w8.t(), sx[:, None], sw[None, :], out_dtype, bias, fast_accum=True)


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
