"""AdamW whose CUDA step is one Triton launch over every parameter: the `adamw_kernel` rung's optimizer.

`KernelAdamW` is a torch.optim.AdamW: the same constructor, the same state (per parameter a float32 step
count tensor, exp_avg and exp_avg_sq) and so the same state_dict, so a checkpoint moves between the two
and `--resume` works either way. Its `step()` runs the kernel of kernels/adamw.py where it can: Triton
installed, every parameter a plain float32 CUDA tensor that is contiguous (as are its gradient and moments),
and no group asks for what the kernel does not compute (amsgrad, maximize, differentiable). Anywhere else it
runs AdamW's own step, which is also what the kernel must match.

On the kernel's path the step counts live on the parameters' device whatever `capturable` says, and a
`grad_scale` set on the optimizer for one step (the engine's clipping factor, or a GradScaler's) divides
every gradient, as fused AdamW's does; so does AdamW's path, for an optimizer that is not fused, where
AdamW itself would refuse it. Nothing on the kernel's path reads a device value back to the host, so the
step can be captured in a CUDA graph and replayed.

Given the weight_cast rung's copies (`casts`), the kernel also writes each Block weight's bfloat16 copy as it
updates the weight, and tells the copies so: the next step's multi-tensor copy then goes (speedups/weight_cast.py
says when it does not). The engine hands them over wherever the rung is on (measured faster in the step).
"""

from __future__ import annotations

import torch

from gpt2ladder.kernels import adamw as kernel
from gpt2ladder.speedups.weight_cast import WeightCasts


class KernelAdamW(torch.optim.AdamW):
    """torch.optim.AdamW, stepped by one Triton launch on CUDA; `tile` = (elements per block, blocks per
    program, warps), kernels/adamw.py's TILE when not given."""

    takes_grad_scale = True  # the engine may hand it clipping's factor as `grad_scale` (runtime/engine.py)

    def __init__(self, params, *args, tile: tuple[int, int, int] | None = None, casts: WeightCasts | None = None,
                 unscaled_grads: bool = True, **kwargs):
        super().__init__(params, *args, **kwargs)
        self.tables = kernel.Tables(tile) if kernel.triton is not None else None
        self.casts = casts  # bfloat16 copies to write beside the update, or None
        # After a step with a grad_scale the gradients are left divided by it, as fused AdamW leaves them. False lets
        # the kernel leave them as they were, which saves a write of every gradient (AdamW's own path, off the
        # kernel's, still divides them in place: it must, to step with them).
        self.unscaled_grads = unscaled_grads

    @torch.no_grad()
    def step(self, closure=None):
        if not self._kernel_runs():
            return self._adamw_step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        tensors, groups = self._tensors()
        self.tables.update(tensors, groups)
        self.tables.launch(getattr(self, "grad_scale", None), getattr(self, "found_inf", None), self.unscaled_grads)
        if self.casts is not None:
            self.casts.written([t[0] for t in tensors if t[6] is not None])
        return loss

    def _kernel_runs(self) -> bool:
        """Whether this step can run as the kernel: Triton, plain float32 CUDA tensors, AdamW's default variant."""
        if self.tables is None:  # no Triton
            return False
        if any(g["amsgrad"] or g["maximize"] or g["differentiable"] for g in self.param_groups):
            return False
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        tensors = [(p, p.grad, *(self.state[p][k] for k in ("exp_avg", "exp_avg_sq") if k in self.state[p]))
                   for p in params]
        return bool(params) and all(_plain(t, params[0].device) for ts in tensors for t in ts)

    def _tensors(self) -> tuple[list[tuple], list[kernel.Group]]:
        """Per parameter with a gradient (param, grad, exp_avg, exp_avg_sq, step, group index, its bfloat16 copy or
        None), its state made as AdamW makes it where it has none yet; and each group's hyperparameters."""
        copies = self._copies()
        tensors, groups = [], []
        for i, group in enumerate(self.param_groups):
            beta1, beta2 = group["betas"]
            groups.append(kernel.Group(group["lr"], group["weight_decay"], beta1, beta2, group["eps"]))
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif state["step"].device != p.device or state["step"].dtype != torch.float32:
                    # loaded from an AdamW that kept its counts on the host (neither fused nor capturable)
                    state["step"] = state["step"].to(p.device, torch.float32)
                tensors.append((p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], i, copies.get(p)))
        return tensors, groups

    def _copies(self) -> dict[torch.Tensor, torch.Tensor]:
        """{weight: its bfloat16 copy} of the weight_cast rung's copies, where the kernel can write them."""
        if self.casts is None:
            return {}
        copies, sources = self.casts.pairs()
        return {s: c for c, s in zip(copies, sources)
                if c.dtype == torch.bfloat16 and c.is_contiguous() and c.device == s.device}

    def _adamw_step(self, closure):
        """AdamW's own step; an unfused one cannot take a `grad_scale`, so the gradients are divided first."""
        scale = getattr(self, "grad_scale", None)
        if scale is None or self.defaults.get("fused"):
            return super().step(closure)
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        torch._foreach_div_(grads, scale)
        del self.grad_scale
        try:
            return super().step(closure)
        finally:
            self.grad_scale = scale


def _plain(t: torch.Tensor, device: torch.device) -> bool:
    """A dense float32 tensor on `device` whose elements lie in order in memory (no DTensor, no view with gaps)."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and kernel.kernels_available(t.device) and t.device == device
            and t.dtype == torch.float32 and not t.is_sparse and t.is_contiguous())
