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

from gpt2ladder.kernels.rotary import Rotary
from gpt2ladder.model.modern import ModernAttention
from gpt2ladder.speedups.common import replace_modules


class RotaryKernelAttention(ModernAttention):
    def heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, nh, T, hs) from the kernel's one pass; the attention after them is ModernAttention's (with the
        value embeddings and the document windows where the recipe has them)."""
        T = qkv.shape[1]
        cos, sin = (self.rope_cos[:T], self.rope_sin[:T]) if self.rope else (None, None)
        return tuple(t.transpose(1, 2) for t in Rotary.apply(qkv, cos, sin, self.n_head, self.qk_norm))


def _rebuilt(attention: ModernAttention) -> RotaryKernelAttention:
    new = RotaryKernelAttention.__new__(RotaryKernelAttention)
    new.__dict__.update({k: dict(v) if isinstance(v, dict) else v for k, v in attention.__dict__.items()})
    return new


def use_rotary_kernel(model: nn.Module) -> list[str]:
    """Replace every modern attention with rotary positions or QK-norm by a `RotaryKernelAttention`; their names."""
    return replace_modules(model, lambda name, m: type(m) is ModernAttention and (m.rope or m.qk_norm), _rebuilt)
