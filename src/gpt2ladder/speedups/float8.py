"""Per-tensor float8 helpers: the casts and layouts the `fp8_head` rung's classifier matmuls use
(`speedups/fused_loss.py`).

`to_fp8` casts a tensor with one scale for the whole tensor, its amax mapped to the format's largest value;
`col_major` gives `torch._scaled_mm` its second operand in the layout it wants; `fp8_shapes_ok` says whether
`_scaled_mm` takes a matmul's sizes.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def to_fp8(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaled cast: (t / scale in float8, scale), the amax mapped to the format's max."""
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = amax / torch.finfo(dtype).max
    return (t.float() / scale).to(dtype), scale


def col_major(t: torch.Tensor) -> torch.Tensor:
    """Same values, column-major storage: the layout `_scaled_mm` wants for its second operand."""
    return t.t().contiguous().t()


def fp8_shapes_ok(*sizes: int) -> bool:
    """`_scaled_mm` needs every matmul dimension to be a multiple of 16."""
    return all(n % 16 == 0 for n in sizes)
