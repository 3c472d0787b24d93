"""The per-tensor float8 helpers the fused loss's float8 classifier uses compute what they claim: the scaled cast, and
the CPU stand-in for `torch._scaled_mm`."""

import pytest
import torch

from gpt2ladder.speedups.common import scaled_mm
from gpt2ladder.speedups.float8 import E4M3, to_fp8


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_float8_product_is_pytorchs(rows, out_dtype):
    """Off CUDA `scaled_mm` multiplies in fp32 instead of PyTorch's slow reference kernel: the same numbers, per-tensor
    and per-row scales, with and without a bias (to fp32's rounding of the sums)."""
    gen = torch.Generator().manual_seed(1)
    a8 = (torch.randn(32, 48, generator=gen) * 3).to(E4M3)
    b8 = torch.randn(64, 48, generator=gen).to(E4M3).t()
    sa, sb = (torch.rand(32, 1, generator=gen), torch.rand(1, 64, generator=gen)) if rows else \
        (torch.tensor(0.5), torch.tensor(2.0))
    bias = torch.randn(64, generator=gen).to(out_dtype) if out_dtype == torch.bfloat16 else None
    ref = torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype)
    got = scaled_mm(a8, b8, sa, sb, out_dtype, bias)
    assert got.dtype == out_dtype
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)


def test_scaled_cast_maps_amax_to_the_format_max_and_round_trips():
    t = torch.tensor([0.5, -3.0, 1e-3, 2.0])
    q, scale = to_fp8(t, E4M3)
    assert q.float().abs().max() == torch.finfo(E4M3).max  # the largest magnitude uses the whole range
    back = q.float() * scale
    assert back[1] == -3.0
    assert ((back - t).abs() <= 2**-4 * t.abs() + 1e-6).all()  # e4m3: 3 mantissa bits, <= 1/16 off
