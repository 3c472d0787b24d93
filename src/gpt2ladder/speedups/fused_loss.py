"""The classifier and its loss as one autograd node, optionally with float8 matmuls: the `fused_loss`,
`fp8_head` and `loss_kernel` rungs.

Written by hand because it is the point of three rungs. The ordinary path writes the (N, V) logits,
reads them for the loss, reads them again in backward to form softmax - onehot, and writes that
gradient. Here the loss and the gradient come out of one compiled kernel over the logits, which
writes the gradient once at its final width, and the two gradient matmuls run right away, so backward
only scales saved tensors. With `kernel=True` (the `loss_kernel` rung) hand-written Triton kernels
replace it (`kernels/loss.py`).

With `fp8=True` the three classifier matmuls use float8 (`torch._scaled_mm`). The scaling passes
that made off-the-shelf float8 slower at this size are avoided where the range is known ahead: the
logit gradient softmax - onehot always lies in [-1, 1], so it needs no amax pass at all; the
activations and the weight are small (N x 768, V x 768) and their amax fuses into the cast.
"""

from __future__ import annotations

import torch

from gpt2ladder.kernels import loss as loss_kernel
from gpt2ladder.model.gpt import Classifier
from gpt2ladder.speedups.common import compute_dtype, linear_like, scaled_mm
from gpt2ladder.speedups.float8 import E4M3, E5M2, col_major, fp8_shapes_ok, to_fp8

GRAD_SCALE = 2.0**15  # |softmax - onehot| <= 1, so x 2^15 stays under e5m2's max of 57344


class FusedLossHead(Classifier):
    """The classifier (the same tied weight) whose training loss forms its gradients in the forward pass.

    `fp8`: the three classifier matmuls in float8. `kernel`: the pass over the logits runs as the Triton
    kernels of `kernels/loss.py` where they can (CUDA with Triton), else as the PyTorch expressions below.
    """

    fused = True
    fp8 = False
    kernel = False

    @classmethod
    def from_head(cls, head: Classifier, fp8: bool = False, kernel: bool = False) -> "FusedLossHead":
        new = linear_like(cls, head)
        new.fp8, new.kernel, new.softcap = fp8, kernel, head.softcap
        return new

    def loss(self, x: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
        dtype = compute_dtype(x)
        x2 = x.reshape(-1, x.size(-1))
        use_fp8 = self.fp8 and fp8_shapes_ok(*x2.shape, self.weight.shape[0])
        use_kernel = self.kernel and loss_kernel.available(x2)
        return LossAndGrad.apply(x2, self.weight, targets.reshape(-1), vocab_size, dtype, use_fp8, use_kernel,
                                 self.softcap)


class LossAndGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, vocab_size: int, dtype: torch.dtype, fp8: bool, kernel: bool,
                softcap: float | None = None):
        with torch.autocast(x.device.type, enabled=False):
            if fp8:
                loss, grad_x, grad_w = _fp8_loss_and_grads(x, weight, targets, vocab_size, kernel, softcap)
            else:
                loss, grad_x, grad_w = _loss_and_grads(x.to(dtype), weight.to(dtype), targets, vocab_size, kernel,
                                                       softcap)
        ctx.save_for_backward(grad_x, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad_loss, grad_w * grad_loss, None, None, None, None, None, None


def _capped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """The logits in fp32, soft-capped (softcap * tanh(z / softcap)) where the softcap part asks."""
    lf = logits.float()
    return lf if softcap is None else softcap * torch.tanh(lf / softcap)


def _lse_and_loss(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, softcap: float | None = None):
    """Per-row log-sum-exp over the real vocabulary (fp32, (N, 1)) and the mean cross-entropy."""
    lf = _real_columns(_capped(logits, softcap), vocab_size)
    lse = torch.logsumexp(lf, dim=1, keepdim=True)  # (N, 1)
    loss = (lse.squeeze(1) - lf.gather(1, targets[:, None]).squeeze(1)).mean()
    return lse, loss


def _real_columns(lf: torch.Tensor, vocab_size: int, vocab_dim: int = 1) -> torch.Tensor:
    """Padded columns set to -inf: they take no part in the softmax and get exactly zero gradient."""
    if lf.shape[vocab_dim] <= vocab_size:
        return lf
    return lf.masked_fill(_vocab_index(lf, vocab_dim) >= vocab_size, float("-inf"))


def _vocab_index(t: torch.Tensor, vocab_dim: int) -> torch.Tensor:
    """The vocabulary index of every element, shaped to broadcast against t (2-D)."""
    idx = torch.arange(t.shape[vocab_dim], device=t.device)
    return idx[None, :] if vocab_dim == 1 else idx[:, None]


def _logit_grad(logits, lse, targets, vocab_size: int, scale: float, dtype: torch.dtype,
                vocab_dim: int = 1, softcap: float | None = None) -> torch.Tensor:
    """(softmax - onehot) x scale in `dtype`, as one elementwise expression of the logits.

    The one-hot is a comparison with the vocabulary index rather than a scatter into a materialised
    fp32 gradient, so under compile this is a single pass: read the logits, write the gradient at its
    final width (bf16, or e5m2 for float8). A scatter would force an fp32 (N, V) tensor to memory and
    a second pass to scale and cast it. `vocab_dim=0` takes the transposed logits (V, N) with lse and
    targets as (1, N) and gives the transposed gradient. With a soft cap s = c tanh(z / c) the gradient goes on
    through ds/dz = 1 - tanh(z / c)^2, which keeps it within [-1, 1].
    """
    lf = _real_columns(_capped(logits, softcap), vocab_size, vocab_dim)
    onehot = (_vocab_index(lf, vocab_dim) == targets).float()
    grad = torch.exp(lf - lse) - onehot
    if softcap is not None:
        grad = grad * (1 - torch.tanh(logits.float() / softcap).square())
    return (grad * scale).to(dtype)


EAGER_CHUNK_ROWS = 4096  # rows per piece when the loss pass runs eagerly (see `_loss_pass`)


def _loss_pass(logits, targets, vocab_size: int, scale: float, dtype: torch.dtype, transposed: bool,
               kernel: bool = False, softcap: float | None = None):
    """The mean loss, the logit gradient x scale in `dtype` (N, Vp) and, if asked, its transpose (Vp, N).

    With `kernel` the Triton kernels of `kernels/loss.py` compute all three. Otherwise PyTorch expressions:
    compiled, the expressions fuse and no fp32 (N, Vp) tensor exists. Run eagerly (a model without
    compile, or `--batch-size auto`'s memory probe) each expression would materialise one, several
    GB at GPT-2's batch sizes, so the rows go through in pieces there; the numbers are the same.
    """
    if kernel:
        rows, grad, grad_t = loss_kernel.logit_grad(logits, targets, vocab_size, scale, dtype, transposed,
                                                    softcap or 0.0)
        return rows.mean(), grad, (grad_t if transposed else None)
    n = logits.shape[0]
    if torch.compiler.is_compiling() or n <= EAGER_CHUNK_ROWS:
        return _loss_pass_rows(logits, targets, vocab_size, scale, dtype, transposed, softcap)
    grad = logits.new_empty(logits.shape, dtype=dtype)
    grad_t = logits.new_empty(logits.shape[::-1], dtype=dtype) if transposed else None
    total = torch.zeros((), device=logits.device)
    for i in range(0, n, EAGER_CHUNK_ROWS):
        rows = slice(i, min(n, i + EAGER_CHUNK_ROWS))
        loss, grad[rows], g_t = _loss_pass_rows(logits[rows], targets[rows], vocab_size, scale, dtype, transposed,
                                                softcap)
        total += loss * (rows.stop - rows.start)
        if transposed:
            grad_t[:, rows] = g_t
    return total / n, grad, grad_t


def _loss_pass_rows(logits, targets, vocab_size: int, scale: float, dtype: torch.dtype, transposed: bool,
                    softcap: float | None = None):
    lse, loss = _lse_and_loss(logits, targets, vocab_size, softcap)
    grad = _logit_grad(logits, lse, targets[:, None], vocab_size, scale, dtype, softcap=softcap)
    if not transposed:
        return loss, grad, None
    # Evaluated over the transposed logits, so it is written straight in (Vp, N) layout rather than
    # by a transpose that reads `grad` back.
    return loss, grad, _logit_grad(logits.t(), lse.t(), targets[None, :], vocab_size, scale, dtype, vocab_dim=0,
                                   softcap=softcap)


def _loss_and_grads(x, w, targets, vocab_size, kernel: bool = False, softcap: float | None = None):
    logits = x @ w.t()  # (N, Vp)
    loss, grad, _ = _loss_pass(logits, targets, vocab_size, 1.0 / x.shape[0], x.dtype, False, kernel, softcap)
    return loss, grad @ w, grad.t() @ x  # loss, (N, C), (Vp, C)


def _fp8_loss_and_grads(x, w, targets, vocab_size, kernel: bool = False, softcap: float | None = None):
    n = x.shape[0]
    x8, sx = to_fp8(x, E4M3)  # (N, C)
    w8, sw = to_fp8(w, E4M3)  # (Vp, C)
    logits = scaled_mm(x8, w8.t(), sx, sw, torch.bfloat16, fast_accum=True)  # (N, Vp)
    # No amax pass: |softmax - onehot| <= 1, so the scale is known ahead. Float8 matmuls on Hopper take
    # both operands contracted along their contiguous dimension, so the weight gradient (a sum over
    # the N rows) needs the gradient transposed too.
    loss, g8, g8_t = _loss_pass(logits, targets, vocab_size, GRAD_SCALE, E5M2, True, kernel, softcap)
    g_scale = torch.tensor(1.0 / (GRAD_SCALE * n), device=x.device)
    grad_x = scaled_mm(g8, col_major(w8), g_scale, sw, torch.bfloat16)  # (N, C)
    grad_w = scaled_mm(g8_t.contiguous(), col_major(x8), g_scale, sx, torch.float32)  # (Vp, C)
    return loss, grad_x, grad_w
