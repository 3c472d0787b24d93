"""Optimizers by name, built from the model's parameter groups: `adamw` (GPT-2's) and `muon` (the muon part).

`muon`: the Blocks' matrices take Muon's update (momentum, then an approximate orthogonalisation by a
Newton-Schulz iteration); every other parameter (embeddings, an untied head, biases and gains) takes AdamW's,
each group at its own learning rate. Every group's learning rate is its `lr_scale` times the schedule's, so one
schedule drives them all; under a CUDA graph each group's rate is a device tensor the replayed step reads.

Muon is written here rather than taken from `torch.optim.Muon` (PyTorch 2.9+, and tested against it there)
because the step needs what that class does not do: run inside a captured CUDA graph with a tensor learning
rate, orthogonalise the matrices of one iterated shape together as one batched product instead of one at a time
(tall matrices turned wide, the side the iteration runs on, so GPT-2's 3072x768 c_fc and 768x3072 c_proj are one
batch), treat c_attn's weight as its q, k and v matrices, and share one optimizer (one state dict, one `step`)
with AdamW.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from gpt2ladder.kernels import gram
from gpt2ladder.runtime import compile_workers

# Newton-Schulz's quintic coefficients and step count, as published with Muon (K. Jordan, 2024) and used by
# torch.optim.Muon: they maximise the slope at zero, so 5 steps take every singular value near 1.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def best_odd_quintic(lo: float, hi: float) -> tuple[float, float, float]:
    """(a, b, c) of the odd quintic p(x) = a x + b x^3 + c x^5 nearest to 1 on [lo, hi] in the largest error: by
    Remez's exchange, p - 1 takes its largest size with alternating signs at lo, at p's two extrema between them,
    and at hi. On an interval too narrow to tell apart from a point, the quintic whose slope and curvature vanish at
    hi (1 at hi, and the limit of the others)."""
    if lo / hi > 1 - 5e-6:
        return 15 / 8 / hi, -10 / 8 / hi ** 3, 3 / 8 / hi ** 5
    inner = [(3 * lo + hi) / 4, (lo + 3 * hi) / 4]
    error = math.inf
    for _ in range(100):
        points = [lo, *inner, hi]
        system = torch.tensor([[x, x ** 3, x ** 5, (-1.0) ** i] for i, x in enumerate(points)], dtype=torch.float64)
        a, b, c, e = torch.linalg.solve(system, torch.ones(4, dtype=torch.float64)).tolist()
        root = math.sqrt(9 * b * b - 20 * a * c)  # p'(x) = a + 3 b x^2 + 5 c x^4 = 0
        inner = sorted(math.sqrt((-3 * b + sign * root) / (10 * c)) for sign in (-1.0, 1.0))
        if abs(e - error) < 1e-15:
            break
        error = e
    return a, b, c


# The polar_express part's margin for bfloat16's rounding: the iteration's start is divided by (1 + this) its
# Frobenius norm, and its steps but the last tolerate singular values up to 1 + this. With 1%, a bfloat16 step's
# error (up to 0.02 in spectral norm, measured on a CPU) took 60% of the room (0.033 at the third step) past which
# the later steps diverge; 2% is modded-nanogpt's choice, whose coefficients (with the cushion below) these are.
POLAR_EXPRESS_SAFETY = 0.02


def polar_express_coefficients(steps: int = NS_STEPS, lower: float = 1e-3, cushion: float = 0.02,
                               safety: float = POLAR_EXPRESS_SAFETY) -> tuple[tuple[float, float, float], ...]:
    """The polar_express part's iteration (Amsel, Persson, Musco and Gower, "The Polar Express", 2025): at each step
    the odd quintic nearest to 1 on the interval the singular values lie in, from [lower, 1], the next interval
    being the last one's image. `cushion`: each step's interval starts at no less than this share of its end, as
    the paper's method plans it, and its quintic is rescaled so the interval's ends land equally far either side
    of 1. `safety`: every step but the last tolerates values up to 1 +
    safety (bfloat16's rounding), as `orthogonalise` divides the start by (1 + safety) its Frobenius norm."""
    hi, out = 1.0, []
    for step in range(steps):
        a, b, c = best_odd_quintic(max(lower, cushion * hi), hi)
        if lower < cushion * hi:
            ends = sum(a * x + b * x ** 3 + c * x ** 5 for x in (lower, hi))
            a, b, c = (2 / ends * k for k in (a, b, c))
        if step < steps - 1:
            s = 1 + safety
            a, b, c = a / s, b / s ** 3, c / s ** 5
        out.append((a, b, c))
        lower = a * lower + b * lower ** 3 + c * lower ** 5
        hi = 2 - lower
    return tuple(out)


POLAR_EXPRESS = polar_express_coefficients()


def orthogonalise(g: torch.Tensor, steps: int = NS_STEPS, eps: float = NS_EPS, symmetric: bool = False,
                  polar: bool = False) -> torch.Tensor:
    """An approximation of U V^T for each matrix of g = U S V^T, (n, rows, cols), in bfloat16: the Newton-Schulz
    iteration X <- a X + (b A + c A^2) X with A = X X^T, from X = g / ||g||_F (so every singular value <= 1).

    `symmetric` (the ns_kernel rung): A and b A + c A^2, both symmetric, come from the Triton kernel of
    kernels/gram.py, which computes only their tiles on and above the diagonal; the product with X stays cuBLAS's.
    `polar` (the polar_express part): each of the `steps` has its own a, b, c (`polar_express_coefficients`), from
    X = g / ((1 + POLAR_EXPRESS_SAFETY) ||g||_F)."""
    if polar:
        schedule = POLAR_EXPRESS if steps == NS_STEPS else polar_express_coefficients(steps)
    else:
        schedule = (NS_COEFFICIENTS,) * steps
    x = g.bfloat16()
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide side: A is then the smaller square
        x = x.mT
    norm = x.norm(dim=(-2, -1), keepdim=True)
    x = x / (norm * (1 + POLAR_EXPRESS_SAFETY) if polar else norm).clamp(min=eps)
    for a, b, c in schedule:
        if symmetric:
            A = gram.symmetric_gram(x)
            poly = gram.symmetric_gram(A, alpha=c, addend=A, beta=b)
        else:
            A = x @ x.mT
            poly = torch.baddbmm(A, A, A, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a)
    return x.mT if tall else x


def shape_scale(rows: int, cols: int) -> float:
    """Muon's learning-rate factor for a (rows x cols) matrix, sqrt(max(1, rows / cols)): the update's RMS then
    does not depend on the matrix's aspect (torch.optim.Muon's "original" adjustment)."""
    return math.sqrt(max(1.0, rows / cols))


def wide_matrices(w: torch.Tensor, blocks: int) -> torch.Tensor:
    """w's matrices, its rows split into `blocks`, as a (blocks, rows, cols) view turned wide (rows <= cols): the
    side `orthogonalise` iterates on, so tall and wide matrices of one iterated shape stack as one batch."""
    m = w.view(blocks, w.size(0) // blocks, w.size(1))
    return m.mT if m.size(1) > m.size(2) else m


def momentum_update(grads: list[torch.Tensor], bufs: list[torch.Tensor], mu: float | torch.Tensor, nesterov: bool,
                    blocks: list[int]) -> torch.Tensor:
    """Muon's momentum, B <- mu B + g for each parameter, and the updates to orthogonalise (g + mu B with Nesterov,
    else B): every parameter's `wide_matrices`, stacked in bfloat16, (n, rows, cols), the precision
    `orthogonalise` computes in. mu is a number, or a 0-d tensor (the momentum_warmup part's, which a CUDA graph
    reads in place)."""
    torch._foreach_mul_(bufs, mu)
    torch._foreach_add_(bufs, grads)
    if not nesterov:
        updates = bufs
    elif isinstance(mu, torch.Tensor):  # alpha takes only a number: mu B, then g added in place (one new list)
        updates = torch._foreach_mul(bufs, mu)
        torch._foreach_add_(updates, grads)
    else:
        updates = torch._foreach_add(grads, bufs, alpha=mu)
    return torch.cat([wide_matrices(u, k) for u, k in zip(updates, blocks)]).bfloat16()


def apply_updates(params: list[torch.Tensor], ortho: torch.Tensor, blocks: list[int], steps: list) -> None:
    """p <- p - step x o for each parameter, its step and its matrices' orthogonalised updates (bfloat16, stacked
    wide as `momentum_update` stacks them), in the parameter's dtype; a step is a number or a 0-d tensor (the
    learning rate under a CUDA graph)."""
    for p, o, k, step in zip(params, ortho.split(blocks), blocks, steps):
        wide_matrices(p, k).sub_(o.to(p.dtype) * step)  # a view of p: the update lands in p, turned back


# Inductor's options for Muon's compiled passes. Its loop reordering after fusion stops the momentum pass at GPT-2's
# size with an AssertionError in Scheduler.reorder_loops_by_dep_pair (torch 2.11, H100): the stacked batch reads the
# tall matrices (c_fc's) transposed beside the wide ones. The passes are elementwise over the matrices, so they keep
# the loop order the stacking gives them.
PASS_OPTIONS = {"loop_ordering_after_fusion": False}


def compile_pass(fn, backend: str):
    """One of Muon's passes compiled for its shapes, with PASS_OPTIONS where the backend is Inductor."""
    if backend == "inductor":
        compile_workers.detach()
    return torch.compile(fn, backend=backend, dynamic=False, options=PASS_OPTIONS if backend == "inductor" else None)


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the groups marked `muon`, AdamW (torch's, fused where asked) for the rest, as one optimizer.

    A parameter's `muon_blocks` (default 1) splits its rows into that many matrices orthogonalised apart
    (c_attn's weight holds q, k and v). AdamW's groups and state are this optimizer's own dicts, so its state
    dict, its learning rates and the CUDA graph's snapshot see one optimizer.

    `compile_backend` (the compile rung's, on a GPU): the passes around the orthogonalisation (the momentum, the
    stacked bfloat16 updates, the step onto the weights) are compiled, so each becomes one fused pass over the
    matrices instead of several; the arithmetic is the same.

    `symmetric` (the ns_kernel rung, on a GPU with Triton): `orthogonalise`'s two symmetric products of each step
    by the Triton kernel that computes only their tiles on and above the diagonal.

    `polar` (the polar_express part): the orthogonalisation's steps each with their own coefficients.
    """

    def __init__(self, groups: list[dict], *, lr, momentum: float = 0.95, nesterov: bool = True,
                 betas=(0.9, 0.95), eps: float = 1e-8, compile_backend: str | None = None, symmetric: bool = False,
                 polar: bool = False, **adamw_options):
        super().__init__(groups, dict(lr=lr, weight_decay=0.0, muon=False, momentum=momentum, nesterov=nesterov))
        self._adamw_args = dict(lr=lr, betas=betas, eps=eps, **adamw_options)
        self.symmetric, self.polar = symmetric, polar
        self._link_adamw()
        self._momentum, self._apply = momentum_update, apply_updates
        if compile_backend is not None:
            self._momentum = compile_pass(momentum_update, compile_backend)
            self._apply = compile_pass(apply_updates, compile_backend)

    def _link_adamw(self) -> None:
        adam_groups = [g for g in self.param_groups if not g["muon"]]
        self.adamw = torch.optim.AdamW(adam_groups, **self._adamw_args) if adam_groups else None
        if self.adamw is not None:
            self.adamw.state = self.state  # one state: AdamW's moments beside Muon's momentum

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # new group dicts and a new state: AdamW follows them
        adam_groups = [g for g in self.param_groups if not g["muon"]]
        if self.adamw is not None:
            self.adamw.param_groups = adam_groups
            self.adamw.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                closure()
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group)
        if self.adamw is not None:
            self.adamw.step()

    def _muon_step(self, group: dict) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        for p in params:
            self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
        lr = group["lr"]
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])  # decoupled, before the update
        buckets: dict[tuple, list[torch.Tensor]] = defaultdict(list)
        for p in params:  # by the shape the iteration runs on: a tall matrix and its transpose share a batch
            buckets[tuple(wide_matrices(p, getattr(p, "muon_blocks", 1)).shape[1:])].append(p)
        for same in buckets.values():
            blocks = [getattr(p, "muon_blocks", 1) for p in same]
            bufs = [self.state[p]["momentum_buffer"] for p in same]
            stacked = self._momentum([p.grad for p in same], bufs, group["momentum"], group["nesterov"], blocks)
            ortho = orthogonalise(stacked, symmetric=self.symmetric, polar=self.polar)
            scales = [shape_scale(p.size(0) // k, p.size(1)) for p, k in zip(same, blocks)]  # each p's own aspect
            steps = {s: self._step(lr * s, ortho.device) for s in dict.fromkeys(scales)}  # one per scale, not per p
            self._apply(same, ortho, blocks, [steps[s] for s in scales])

    def _step(self, step, device: torch.device):
        """A learning rate times a shape's scale, as a 0-d tensor where the passes are compiled: compiled once,
        whatever the schedule's rate (a tensor already under a CUDA graph)."""
        if self._apply is not apply_updates and not isinstance(step, torch.Tensor):
            return torch.tensor(step, device=device)
        return step


def strategy_problem(optimizer: str, strategy: str | None, parts: tuple[str, ...] = ()) -> str | None:
    """Why a recipe with this optimizer and these parts cannot train under this data-parallel strategy, or None."""
    if optimizer == "muon" and strategy == "fsdp":
        return ("the muon recipe part orthogonalises whole matrices, which FSDP2 shards: run it under DDP "
                "(--strategy ddp) or on one GPU")
    if "bf16_tables" in parts and strategy == "fsdp":
        return ("the bf16_tables recipe part keeps bf16 tables beside fp32 weights, and FSDP2 gathers a group's "
                "parameters in one dtype: run it under DDP (--strategy ddp) or on one GPU")
    return None


def param_groups(model: torch.nn.Module, optimizer: str, *, lr: float, weight_decay: float, muon_lr: float,
                 embed_lr: float | None = None, head_lr: float | None = None) -> list[dict]:
    """The optimizer's groups, each with `lr_scale`: its peak learning rate over `lr`, the one the schedule sets.

    adamw: matrices with weight decay, vectors (biases, gains) without, all at lr.
    muon: the Blocks' matrices (Muon, at muon_lr, no decay); the token embedding, position table and value
    embeddings (AdamW at embed_lr), an untied head (at head_lr) and the vectors, the parts' learned scalars among
    them (at lr), none decayed.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adamw":
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay, "lr_scale": 1.0},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr_scale": 1.0}]
    blocks = {id(p) for block in model.transformer.h for p in block.parameters() if p.dim() == 2}
    for block in model.transformer.h:
        block.attn.c_attn.weight.muon_blocks = 3  # q, k and v, each its own matrix
    tables = [p for p in params if p.dim() == 2 and id(p) not in blocks]
    head = model.lm_head.weight
    untied_head = head is not model.transformer.wte.weight
    groups = [
        {"params": [p for p in params if id(p) in blocks], "muon": True, "lr_scale": muon_lr / lr, "weight_decay": 0.0},
        {"params": [p for p in tables if p is not head or not untied_head], "lr_scale": (embed_lr or lr) / lr},
        {"params": [head] if untied_head else [], "lr_scale": (head_lr or lr) / lr},
        {"params": [p for p in params if p.dim() < 2], "lr_scale": 1.0},
    ]
    return [{"weight_decay": 0.0, **g} for g in groups if g["params"]]
