"""How one training step runs: the `Setup` that the ladder's rungs build field by field.

A plain frozen record, kept beside the model's shape (`config.py`) and below everything that reads
it: the model rewrites (`speedups/`) read the fields that replace modules, the engine
(`runtime/engine.py`) honours the rest, and every record and checkpoint stores it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}  # Setup.autocast -> its dtype


@dataclass(frozen=True)
class Setup:
    """How one training step runs. The baseline is the write-up's starting point: fp32 everything, eager."""

    matmul_precision: str = "highest"  # torch.set_float32_matmul_precision: highest=fp32, high=TF32
    autocast: str | None = None  # None, "bfloat16" or "float16" (fp16 brings a GradScaler)
    compile: bool = False
    attention: str = "manual"  # "manual" or "sdpa"
    vocab_multiple: int = 1
    fused_adamw: bool = False
    cuda_graph: bool = False  # capture the whole step (forward, backward, optimizer) and replay it
    fused_loss: bool = False  # classifier + cross-entropy + its gradient in one pass over the logits
    fp8_head: bool = False  # classifier matmuls in float8 (Hopper and newer)
    loss_kernel: bool = False  # the fused loss's pass over the logits as hand-written Triton kernels
    bf16_residual: bool = False  # the residual stream between Blocks in bf16 instead of fp32
    rotary_kernel: bool = False  # the modern attention's QK-norm and rotary turn, forward and backward, in Triton
    gelu_kernel: bool = False  # the MLP's GELU forward, and its backward with c_fc's bias gradient, in Triton
    fp32_wgrad: bool = False  # the Blocks' weight gradients written in fp32 by the matmul itself
    weight_cast: bool = False  # the Blocks' weights cast to bf16 once per step, by one multi-tensor copy
    norm_kernel: bool = False  # each residual add and the layer norm after it as Triton kernels
    proj_bias: bool = False  # the Blocks' output-projection biases added, and their gradients summed, by those kernels
    qkv_grad: bool = False  # the q, k, v gradients assembled, with c_attn's bias gradient, by one Triton kernel
    fp8_fc: bool = False  # c_fc's forward matmul alone in float8, from the norm kernel's float8 copy
    fp8_proj: bool = False  # the MLP's c_proj forward matmul in float8, from the GELU kernel's float8 copy
    fp8_dgrad: bool = False  # the input gradients of c_attn and the MLP's c_proj multiplied in float8
    fp8_forward: bool = False  # c_attn's and c_fc's forward matmuls in float8, from the norm kernels' float8 copies
    adamw_kernel: bool = False  # AdamW's update of every parameter as one Triton launch
    ns_kernel: bool = False  # Muon's symmetric Newton-Schulz products by a Triton kernel that skips their lower tiles
    memset_fill: bool = False  # the captured graph's small memset nodes stored by kernels instead
    tied_grad: bool = False  # the tied embedding's gradient rows added into the classifier's, not into zeros
    cublaslt: bool = False  # PyTorch's matmuls through cuBLASLt (its heuristic's first algorithm) instead of cuBLAS
    bias_in_wgrad: bool = False  # c_attn's bias gradient summed by its weight-gradient product, over columns of ones

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype autocast runs matmuls in, or None without autocast."""
        return None if self.autocast is None else AUTOCAST_DTYPES[self.autocast]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
