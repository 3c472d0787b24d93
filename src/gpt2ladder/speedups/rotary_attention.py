"""The modern family's attention with its queries and keys made ready by the Triton kernels of `kernels/rotary.py`:
the `rotary_kernel` rung.

`RotaryKernelAttention` holds the very modules and buffers of the `ModernAttention` it replaces (so the state dict
and the function stay); only the path from c_attn's output to attention changes: one node gives q, k and v, RMS-
normalised and turned where the recipe asks, token-major, and takes their three gradients back into c_attn's output
gradient in one pass each.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.kernels.rotary import Rotary
from gpt2ladder.model.gpt import manual_attention
from gpt2ladder.model.modern import ModernAttention
from gpt2ladder.speedups.common import replace_modules


class RotaryKernelAttention(ModernAttention):
    def after_in_proj(self, qkv: torch.Tensor) -> torch.Tensor:
        B, T, _ = qkv.shape
        cos, sin = (self.rope_cos[:T], self.rope_sin[:T]) if self.rope else (None, None)
        q, k, v = (t.transpose(1, 2) for t in Rotary.apply(qkv, cos, sin, self.n_head, self.qk_norm))  # (B, nh, T, hs)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = manual_attention(q, k, v, self.bias[:, :, :T, :T])
        return y.transpose(1, 2).contiguous().view(B, T, -1)  # (B, T, C)


def _rebuilt(attention: ModernAttention) -> RotaryKernelAttention:
    new = RotaryKernelAttention.__new__(RotaryKernelAttention)
    new.__dict__.update({k: dict(v) if isinstance(v, dict) else v for k, v in attention.__dict__.items()})
    return new


def use_rotary_kernel(model: nn.Module) -> list[str]:
    """Replace every modern attention with rotary positions or QK-norm by a `RotaryKernelAttention`; their names."""
    return replace_modules(model, lambda name, m: type(m) is ModernAttention and (m.rope or m.qk_norm), _rebuilt)
