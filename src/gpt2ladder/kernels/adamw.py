"""AdamW over every parameter tensor in one Triton launch, behind the `adamw_kernel` rung.

PyTorch's fused AdamW updates GPT-2 124M's parameters in 9 multi-tensor launches: fp32 parameters, gradients and
both moments, 28 bytes read or written per parameter, below the rate the card copies at. Here one launch covers
them all. The tensors are not kernel
arguments but rows of tables in device memory, built on the host and kept between steps:
  - the tensor table (int64, one row per tensor): the addresses of its parameter, gradient, exp_avg,
    exp_avg_sq and step count, of its group's learning rate where that is a tensor (0 where it is a float),
    its number of elements, its group, how many programs share it, and the address of a bfloat16 copy of
    the parameter to write beside the update (0 for none);
  - the group table (float64, one row per parameter group): learning rate (where a float), weight decay,
    beta1, beta2, eps, in double precision as AdamW keeps them on the host;
  - the work table (int64, one row per program): which tensor, and the first element of its chunk.
The work table depends on the tensors' sizes alone and is built once; the tensor and group tables are
rebuilt when an address or a hyperparameter changes (gradients are new tensors after each backward, unless
a CUDA graph replays the step, which reuses its own). A table is uploaded from pinned host memory, so that
building one while a graph is being captured is safe: the upload is captured too, and PyTorch never hands
pinned memory allocated during a capture to anything else.

Everything a step reads that can change between graph replays stays on the device: the learning rate
where it is a tensor, the step counts, the gradient scale (clipping's factor, or a GradScaler's), the
found-inf flag. The step counts are state like the moments: every program reads its tensor's count, and
the last program to finish with a tensor (an atomic ticket per tensor) writes the count + 1 and resets
the ticket, so one launch both reads and advances them without a race.

The arithmetic is torch.optim.AdamW's (decoupled weight decay; not amsgrad, not maximize): the bias
corrections, step size and decay factor in float64 from the float32 step count, each then rounded to
float32 as AdamW's own expressions round them; per element, in float32 with correctly rounded divisions
and square root,
    g = grad / grad_scale (stored back, as fused AdamW stores the unscaled gradient, unless told not to)
    p = p * (1 - lr * weight_decay)
    m = m + (1 - beta1) * (g - m)
    v = v * beta2 + (1 - beta2) * g * g
    p = p - lr / (1 - beta1^t) * (m / (sqrt(v) / sqrt(1 - beta2^t) + eps)),
and, where the parameter has a copy, the copy = p in bfloat16 (the weight_cast rung's copies, which its own
multi-tensor copy at the start of the next step then need not make: speedups/weight_cast.py).
Off CUDA, or without Triton, the optimizer that launches it (speedups/kernel_adamw.py) runs
torch.optim.AdamW instead: that is the reference the kernel must match (tests/kernels/test_adamw_kernel.py
runs the kernel through Triton's CPU interpreter against it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: torch.optim.AdamW runs instead
    triton = None

# (elements per block, blocks per program, warps): a program updates BLOCK x ITERS elements of one tensor.
# The fastest of nine benchmarks/micro/adamw.py tried at GPT-2 124M's 148 tensors on a Hopper GPU.
TILE = (1024, 4, 4)
TENSOR_FIELDS = ("param", "grad", "exp_avg", "exp_avg_sq", "step", "lr", "numel", "group", "programs", "cast")
GROUP_FIELDS = ("lr", "weight_decay", "beta1", "beta2", "eps")


@dataclass(frozen=True)
class Group:
    """One parameter group's hyperparameters; `lr` a float, or a 0-dim float32 tensor on the parameters'
    device that the kernel reads in place (so a CUDA graph's replays read its current value)."""

    lr: float | torch.Tensor
    weight_decay: float
    beta1: float
    beta2: float
    eps: float

    def row(self) -> tuple[float, ...]:
        lr = 0.0 if isinstance(self.lr, torch.Tensor) else float(self.lr)
        return lr, float(self.weight_decay), float(self.beta1), float(self.beta2), float(self.eps)


def kernels_available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def work_rows(numels: list[int], chunk: int) -> torch.Tensor:
    """(programs, 2) int64: (tensor index, first element) of each program's chunk; an empty tensor gets
    one program all the same, which advances its step count."""
    counts = torch.tensor([-(-n // chunk) or 1 for n in numels], dtype=torch.int64)
    tensor = torch.repeat_interleave(torch.arange(len(numels)), counts)
    first = torch.cumsum(counts, 0) - counts  # each tensor's first program
    return torch.stack([tensor, (torch.arange(len(tensor)) - first[tensor]) * chunk], 1)


def upload(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`rows` on `device`, copied from pinned memory where that is a GPU (legal inside a graph capture)."""
    if device.type != "cuda":
        return rows.to(device)
    return rows.pin_memory().to(device, non_blocking=True)


class Tables:
    """The tables one launch reads, for one list of tensors, rebuilt only when what they hold changes.

    `tensors` gives, per tensor, (param, grad, exp_avg, exp_avg_sq, step, group index, bfloat16 copy or None),
    all contiguous on one device, float32 but the copy, the step a 0-dim tensor there. A table is never changed in
    place, only replaced; those a launch read while a CUDA graph was being captured are kept for as long as this
    object lives, since the graph reads them at every replay.
    """

    def __init__(self, tile: tuple[int, int, int] | None = None):
        self.tile = tile or TILE
        self.work = self.tensors = self.groups = self.tickets = None
        self.aligned = self.casts = False
        self._keys = (None, None, None)
        self.captured: list[torch.Tensor] = []

    def update(self, tensors: list[tuple], groups: list[Group]) -> None:
        block, iters, _ = self.tile
        chunk = block * iters
        device = tensors[0][0].device
        numels = [t[0].numel() for t in tensors]
        work_key = (tuple(numels), chunk, device)
        rows = [(*(x.data_ptr() for x in t[:5]), _lr_address(groups[t[5]].lr, device), n, t[5], -(-n // chunk) or 1,
                 0 if t[6] is None else t[6].data_ptr()) for t, n in zip(tensors, numels)]
        group_rows = [g.row() for g in groups]
        if work_key != self._keys[0]:
            self.work = upload(work_rows(numels, chunk), device)
            self.tickets = torch.zeros(len(tensors), dtype=torch.int32, device=device)
        if rows != self._keys[1]:
            self.tensors = upload(torch.tensor(rows, dtype=torch.int64), device)
        if group_rows != self._keys[2]:
            self.groups = upload(torch.tensor(group_rows, dtype=torch.float64), device)
        self._keys = (work_key, rows, group_rows)
        # Every address a multiple of 16 bytes and every size of 4 elements: the kernel may then load and store
        # four floats at a time.
        self.aligned = all(a % 16 == 0 for row in rows for a in (*row[:4], row[9])) and all(n % 4 == 0 for n in numels)
        self.casts = any(row[9] for row in rows)

    def launch(self, grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None,
               store_grads: bool = True) -> None:
        """One AdamW step of every tensor of the last `update`: `grad_scale` (float32, 0-dim, on the device)
        divides every gradient, which is stored so divided unless `store_grads` is False (then the gradients are
        left as they were, a write of every gradient saved); a nonzero `found_inf` skips the whole step."""
        block, iters, warps = self.tile
        if self.work.is_cuda and torch.cuda.is_current_stream_capturing():
            self.captured += [self.work, self.tensors, self.groups, self.tickets]
        _adamw_kernel[(self.work.shape[0],)](self.work, self.tensors, self.groups, self.tickets,
                                             self.work if grad_scale is None else grad_scale,
                                             self.work if found_inf is None else found_inf,
                                             HAS_SCALE=grad_scale is not None, HAS_INF=found_inf is not None,
                                             STORE_GRADS=store_grads,
                                             ALIGNED=self.aligned, CASTS=self.casts, BLOCK=block, ITERS=iters,
                                             num_warps=warps)


def _lr_address(lr, device: torch.device) -> int:
    """Where the kernel reads a tensor learning rate, or 0 for a float (in the group table)."""
    if not isinstance(lr, torch.Tensor):
        return 0
    if lr.dtype != torch.float32 or lr.device != device or lr.numel() != 1:
        raise ValueError(f"a tensor learning rate must be one float32 on {device}; this is {lr.dtype} on {lr.device}")
    return lr.data_ptr()


if triton is not None:

    @triton.jit
    def _pointer(address, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
        # an int64 address as a pointer to DTYPE, said to be 16-byte aligned where the host checked it is
        pointer = address.to(tl.pointer_type(DTYPE))
        if ALIGNED:  # said of the pointer, not of the integer: only then does Triton load four floats at a time
            pointer = tl.multiple_of(pointer, 16)
        return pointer

    @triton.jit
    def _bf16_bits(x):
        # x rounded to bfloat16, to nearest even, as its 16 bits: what x.to(tl.bfloat16) gives on a GPU, written
        # out so that Triton's CPU interpreter, whose conversion truncates, computes the same bits
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return tl.where(x == x, rounded, 0x7FC0).to(tl.uint16)  # a NaN stays a (quiet) NaN

    @triton.jit
    def _adamw_kernel(work_ptr, tensors_ptr, groups_ptr, tickets_ptr, scale_ptr, inf_ptr, HAS_SCALE: tl.constexpr,
                      HAS_INF: tl.constexpr, STORE_GRADS: tl.constexpr, ALIGNED: tl.constexpr, CASTS: tl.constexpr,
                      BLOCK: tl.constexpr, ITERS: tl.constexpr):
        # Program pid updates elements [start, start + BLOCK * ITERS) of tensor t, as the work table says; the
        # tensor table's row t is TENSOR_FIELDS, the group table's row GROUP_FIELDS.
        pid = tl.program_id(0)
        t = tl.load(work_ptr + 2 * pid)
        start = tl.load(work_ptr + 2 * pid + 1)
        row = tensors_ptr + t * 10
        param = _pointer(tl.load(row), tl.float32, ALIGNED)
        grad = _pointer(tl.load(row + 1), tl.float32, ALIGNED)
        exp_avg = _pointer(tl.load(row + 2), tl.float32, ALIGNED)
        exp_avg_sq = _pointer(tl.load(row + 3), tl.float32, ALIGNED)
        step_ptr = tl.load(row + 4).to(tl.pointer_type(tl.float32))
        lr_address = tl.load(row + 5)
        numel = tl.load(row + 6)
        hyper = groups_ptr + tl.load(row + 7) * 5
        programs = tl.load(row + 8)
        if CASTS:
            cast_address = tl.load(row + 9)
            cast = _pointer(cast_address, tl.uint16, ALIGNED)

        count = tl.load(step_ptr)
        step = count + 1.0  # float32, as AdamW counts
        new_count = step
        if HAS_INF:  # a nonzero found_inf (a GradScaler's overflow) skips the step: nothing is read or written
            skip = tl.load(inf_ptr) != 0.0
            numel = tl.where(skip, 0, numel)
            new_count = tl.where(skip, count, step)
        if ALIGNED:
            start = tl.multiple_of(start, BLOCK)
            numel = tl.multiple_of(numel, 4)  # so the mask is constant over every four elements too
        lr = tl.load(hyper)
        if lr_address != 0:  # a tensor learning rate, read where it is
            lr = tl.load(lr_address.to(tl.pointer_type(tl.float32))).to(tl.float64)
        weight_decay = tl.load(hyper + 1)
        beta1 = tl.load(hyper + 2)
        beta2 = tl.load(hyper + 3)
        eps = tl.load(hyper + 4).to(tl.float32)
        # The step's scalars in float64, as AdamW computes them on the host, each then rounded to float32.
        t64 = step.to(tl.float64)
        correction1 = 1.0 - tl.exp(t64 * tl.log(beta1))
        correction2 = 1.0 - tl.exp(t64 * tl.log(beta2))
        step_size = (lr / correction1).to(tl.float32)
        correction2_sqrt = tl.sqrt(correction2).to(tl.float32)
        decay = (1.0 - lr * weight_decay).to(tl.float32)
        w1 = (1.0 - beta1).to(tl.float32)
        b2 = beta2.to(tl.float32)
        w2 = (1.0 - beta2).to(tl.float32)
        if HAS_SCALE:
            scale = tl.load(scale_ptr)

        for i in tl.static_range(ITERS):
            offs = start + i * BLOCK + tl.arange(0, BLOCK)
            mask = offs < numel
            g = tl.load(grad + offs, mask=mask)
            if HAS_SCALE:
                g = tl.div_rn(g, scale)
                if STORE_GRADS:
                    tl.store(grad + offs, g, mask=mask)
            p = tl.load(param + offs, mask=mask) * decay
            m = tl.load(exp_avg + offs, mask=mask)
            v = tl.load(exp_avg_sq + offs, mask=mask)
            m = m + w1 * (g - m)
            v = v * b2 + w2 * g * g
            denom = tl.div_rn(tl.sqrt_rn(v), correction2_sqrt) + eps
            p = p - step_size * tl.div_rn(m, denom)
            tl.store(param + offs, p, mask=mask)
            tl.store(exp_avg + offs, m, mask=mask)
            tl.store(exp_avg_sq + offs, v, mask=mask)
            if CASTS:
                if cast_address != 0:
                    tl.store(cast + offs, _bf16_bits(p), mask=mask)

        # Every warp has read the step count before this program takes its ticket; the last of the tensor's
        # programs writes the new count and leaves the ticket at 0 for the next launch.
        tl.debug_barrier()
        ticket = tl.atomic_add(tickets_ptr + t, 1)
        last = ticket == programs - 1
        tl.store(step_ptr, new_count, mask=last)
        tl.store(tickets_ptr + t, 0, mask=last)
