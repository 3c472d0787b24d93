"""The AdamW kernel (src/gpt2ladder/kernels/adamw.py) computes torch.optim.AdamW's step: through Triton's CPU
interpreter, KernelAdamW's kernel path against AdamW's single-tensor step, over several steps of two parameter
groups of odd sizes, with and without a gradient scale, a tensor learning rate changed between steps, a skipped
(found-inf) step, a state_dict handed between the two, and bfloat16 copies of some parameters written beside the
update; on the host, the tables it reads and when they are rebuilt. tests/kernels/test_kernels_gpu.py runs it on a
GPU, captured in a CUDA graph."""

import importlib.util

import pytest
import torch

from gpt2ladder.kernels import adamw as ka

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs the triton package (its interpreter)")

# Run with TRITON_INTERPRET=1: KernelAdamW takes its kernel path on CPU tensors, counted, against AdamW.
SCRIPT = r"""
import json, sys, torch, triton, triton.language as tl
from gpt2ladder.kernels import adamw as ka
from gpt2ladder.speedups.kernel_adamw import KernelAdamW

ka.kernels_available = lambda device: True  # the interpreter runs the kernel on CPU tensors
launches = []
real_launch = ka.Tables.launch
ka.Tables.launch = lambda self, *a: launches.append(self.tile) or real_launch(self, *a)
RTOL, ATOL = 1e-6, 1e-7


class Copies:  # bfloat16 copies of some parameters, as KernelAdamW reads the weight_cast rung's
    def __init__(self, sources):
        self.sources = sources
        self.copies = [torch.full(s.shape, 7.0, dtype=torch.bfloat16) for s in sources]
        self.said = []

    def pairs(self):
        return self.copies, self.sources

    def written(self, sources):
        self.said.append(len(sources))

    def equal(self):  # every copy the bits of its parameter rounded to bfloat16 as PyTorch rounds it
        return all(torch.equal(c.view(torch.int16), s.detach().to(torch.bfloat16).view(torch.int16))
                   for c, s in zip(*self.pairs()))


@triton.jit
def bits_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, ka._bf16_bits(tl.load(x_ptr + offs, mask=offs < n)).to(tl.int32), mask=offs < n)


def make(shapes, lr, cls, **kw):
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    half = len(params) // 2
    groups = [{"params": params[:half], "weight_decay": 0.1}, {"params": params[half:], "weight_decay": 0.0}]
    return params, cls(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **kw)


def worst(a, b):
    # the largest |a - b| in units of the tolerance: <= 1 passes
    return ((a - b).abs() / (ATOL + RTOL * b.abs())).max().item() if a.numel() else 0.0


def step_both(pairs, scale, found_inf, lrs, gen):
    (ka_params, ka_opt), (ref_params, ref_opt) = pairs
    for p, q in zip(ka_params, ref_params):
        g = torch.randn(p.shape, generator=gen)
        p.grad, q.grad = g.clone(), g.clone()
    before = [(p.detach().clone(), p.grad.clone()) for p in ka_params]
    keeps = scale is None or ka_opt.unscaled_grads  # else the kernel leaves each gradient as it was given
    if found_inf is not None:
        ka_opt.found_inf = torch.tensor(float(found_inf))
    if scale is not None:
        ka_opt.grad_scale = torch.tensor(scale)
        for q in ref_params:
            q.grad.div_(scale)  # what fused AdamW does with its grad_scale; the single-tensor step takes none
    ka_opt.step()
    for name in ("grad_scale", "found_inf"):
        if hasattr(ka_opt, name):
            delattr(ka_opt, name)
    if found_inf:  # a skipped step changes nothing, not even the gradients
        return {"skipped_unchanged": all(torch.equal(p, b) and torch.equal(p.grad, g)
                                         for p, (b, g) in zip(ka_params, before))}
    ref_opt.step()
    out = {"param": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0, "steps_equal": True, "grads_equal": True,
           "copies_equal": ka_opt.casts is None or ka_opt.casts.equal()}
    for p, q, (_, given) in zip(ka_params, ref_params, before):
        out["param"] = max(out["param"], worst(p.detach(), q.detach()))
        # the kernel stores the divided gradient, or with unscaled_grads off leaves the one it was given
        out["grads_equal"] &= torch.equal(p.grad, q.grad if keeps else given)
        for key in ("exp_avg", "exp_avg_sq"):
            out[key] = max(out[key], worst(ka_opt.state[p][key], ref_opt.state[q][key]))
        out["steps_equal"] &= torch.equal(ka_opt.state[p]["step"], ref_opt.state[q]["step"])
    for lr in lrs:
        lr.fill_(lr.item() * 1.5)
    return out


out = []
for case in json.loads(sys.argv[1]):
    shapes = [tuple(s) for s in case["shapes"]]
    lrs = [torch.tensor(1e-2), torch.tensor(1e-2)]
    pairs = [make(shapes, lrs[0], KernelAdamW, tile=tuple(case["tile"]), unscaled_grads=case.get("unscaled", True)),
             make(shapes, lrs[1], torch.optim.AdamW, foreach=False)]
    if case.get("casts"):
        pairs[0][1].casts = Copies([pairs[0][0][i] for i in case["casts"]])
    gen = torch.Generator().manual_seed(2)
    launches.clear()
    steps = []
    for i, (scale, found_inf) in enumerate(zip(case["scales"], case["found_inf"])):
        if i == case.get("swap_at"):  # hand the state over: the kernel's to AdamW's and AdamW's to the kernel's
            (kp, ko), (rp, ro) = pairs
            saved_kernel, saved_ref = ko.state_dict(), ro.state_dict()
            ko.load_state_dict(saved_ref)
            ro.load_state_dict(saved_kernel)
            steps.append({"same_keys": sorted(saved_kernel["state"][0]) == sorted(saved_ref["state"][0])
                          and [sorted(g) for g in saved_kernel["param_groups"]]
                          == [sorted(g) for g in saved_ref["param_groups"]]})
        steps.append(step_both(pairs, scale, found_inf, lrs, gen))
    said = pairs[0][1].casts.said if case.get("casts") else []
    out.append({"steps": steps, "launches": len(launches), "said_written": said})

special = torch.tensor([1 + 2**-8, 1 + 2**-7 + 2**-8, -(1 + 2**-7 + 2**-8), 1 + 3 * 2**-9, 1 + 2**-8 + 2**-20,
                        -(1 + 2**-8), 3.39e38, -3.4e38, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-40, 0.0,
                        -0.0, 1.5e-45])  # ties to the even below and above, overflow, subnormals
values = torch.cat([special, torch.randn(1000) * torch.logspace(-38, 38, 1000)])
bits = torch.zeros(len(values), dtype=torch.int32)
bits_kernel[(1,)](values, bits, len(values), BLOCK=2048)
expected = values.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
nan = values.isnan()  # any NaN will do (PyTorch's own payload depends on its code path)
out.append({"bf16_bits_equal": torch.equal(bits[~nan], expected[~nan]) and nan.any().item()
            and bool(((bits[nan] & 0x7F80) == 0x7F80).all() and ((bits[nan] & 0x7F) != 0).all())})
print(json.dumps(out))
"""

ODD = [[37, 5], [3], [], [1], [0], [300], [8, 65], [128], [129]]  # chunks of 128: partial, smaller, exact, empty
ALIGNED = [[8, 4], [64], [4], [32, 12], [48]]  # every size a multiple of 4: the kernel's four-at-a-time path
CASES = [
    # tile, shapes, per step: the gradient scale (None: none) and found_inf (None: not given)
    {"tile": [64, 2, 4], "shapes": ODD, "scales": [None, 3.0, None, 0.5, 2.0], "found_inf": [None] * 5},
    {"tile": [32, 1, 1], "shapes": ALIGNED, "scales": [None, 3.0, None, None, 4.0], "found_inf": [None] * 5},
    # a skipped step (found_inf 1), then steps that go on as if it had never been: the step counts too
    {"tile": [64, 2, 4], "shapes": ODD, "scales": [2.0, 2.0, 2.0, None], "found_inf": [0, 1, 0, None]},
    # the state handed between KernelAdamW and AdamW after two steps, both ways, and the steps after it
    {"tile": [16, 4, 2], "shapes": ODD, "scales": [None, 3.0, None, 2.0], "found_inf": [None] * 4, "swap_at": 2},
    # bfloat16 copies of some parameters (the weight_cast rung's), a skipped step among the steps
    {"tile": [64, 2, 4], "shapes": ODD, "scales": [None, 2.0, 2.0, None], "found_inf": [None, 0, 1, None],
     "casts": [0, 2, 5, 6]},
    {"tile": [32, 1, 1], "shapes": ALIGNED, "scales": [None, 3.0, None], "found_inf": [None] * 3, "casts": [0, 3]},
    # told not to store the divided gradients: the same update, the gradients left as they were given
    {"tile": [64, 2, 4], "shapes": ODD, "scales": [3.0, None, 0.5], "found_inf": [None] * 3, "unscaled": False},
    {"tile": [32, 1, 1], "shapes": ALIGNED, "scales": [2.0, 4.0, None], "found_inf": [None, 0, None], "unscaled": False,
     "casts": [1, 2]},
]


@needs_triton
def test_the_kernel_steps_as_adamw_does(triton_interpret):
    *results, bits = triton_interpret(SCRIPT, CASES)
    assert bits["bf16_bits_equal"]  # rounded to nearest even, ties, infinities, NaN and subnormals as PyTorch does
    for case, result in zip(CASES, results):
        assert result["launches"] == len(case["scales"]), case  # every step one launch, a skipped one too
        # the copies said to be written after every launch, all of them
        assert result["said_written"] == [len(case["casts"])] * len(case["scales"]) if "casts" in case else True
        for i, step in enumerate(result["steps"]):
            if "skipped_unchanged" in step:
                assert step["skipped_unchanged"], (case, i)
            elif "same_keys" in step:
                assert step["same_keys"], (case, i)
            else:
                assert step["steps_equal"] and step["grads_equal"] and step["copies_equal"], (case, i, step)
                # within 1e-6 relative (or 1e-7 absolute, where a value is near zero) of AdamW's float32 rounding
                assert max(step["param"], step["exp_avg"], step["exp_avg_sq"]) <= 1, (case, i, step)
        assert sum("param" in s for s in result["steps"]) >= 3


def test_work_rows_cover_every_tensor_in_chunks():
    rows = ka.work_rows([300, 1, 0, 256, 257], chunk=128)
    expected = [(0, 0), (0, 128), (0, 256), (1, 0), (2, 0), (3, 0), (3, 128), (4, 0), (4, 128), (4, 256)]
    assert [tuple(r) for r in rows.tolist()] == expected  # an empty tensor still gets a program: its step count


def _tensors(params, grads, state, casts=(None, None, None)):
    return [(p, g, *state[i], 0 if i < 2 else 1, casts[i]) for i, (p, g) in enumerate(zip(params, grads))]


def test_tables_are_rebuilt_only_when_an_address_or_a_hyperparameter_changes():
    params = [torch.zeros(300), torch.zeros(5), torch.zeros(1)]
    grads = [torch.ones_like(p) for p in params]
    state = [(torch.zeros_like(p), torch.zeros_like(p), torch.zeros(())) for p in params]
    lr = torch.tensor(1e-3)
    groups = [ka.Group(lr, 0.1, 0.9, 0.95, 1e-8), ka.Group(2e-3, 0.0, 0.8, 0.99, 1e-6)]
    tables = ka.Tables((64, 2, 1))
    tables.update(_tensors(params, grads, state), groups)
    work, tensor_rows, group_rows = tables.work, tables.tensors, tables.groups
    fields = dict(zip(ka.TENSOR_FIELDS, tensor_rows[1].tolist()))
    assert fields == {"param": params[1].data_ptr(), "grad": grads[1].data_ptr(),
                      "exp_avg": state[1][0].data_ptr(), "exp_avg_sq": state[1][1].data_ptr(),
                      "step": state[1][2].data_ptr(), "lr": lr.data_ptr(), "numel": 5, "group": 0, "programs": 1,
                      "cast": 0}
    assert tensor_rows[0, ka.TENSOR_FIELDS.index("programs")] == 3 and tensor_rows[2, 7] == 1  # 300 in 128s; group
    assert group_rows.dtype == torch.float64
    assert group_rows.tolist() == [[0.0, 0.1, 0.9, 0.95, 1e-8], [2e-3, 0.0, 0.8, 0.99, 1e-6]]  # a tensor lr: read there
    assert not tables.aligned and not tables.casts  # sizes 5 and 1; no copies to write

    lr.fill_(5e-3)  # read in place by the kernel: nothing to rebuild
    tables.update(_tensors(params, grads, state), groups)
    assert (tables.work, tables.tensors, tables.groups) == (work, tensor_rows, group_rows)

    grads[0] = torch.ones_like(params[0])  # a new gradient tensor, as after a backward
    groups[1] = ka.Group(3e-3, 0.0, 0.8, 0.99, 1e-6)  # a float learning rate changed
    tables.update(_tensors(params, grads, state), groups)
    assert tables.work is work and tables.tensors is not tensor_rows and tables.groups is not group_rows
    assert tables.tensors[0, 1] == grads[0].data_ptr() and tables.groups[1, 0] == 3e-3

    copy = torch.empty(300, dtype=torch.bfloat16)
    tables.update(_tensors(params, grads, state, (copy, None, None)), groups)
    assert tables.tensors[0, -1] == copy.data_ptr() and tables.tensors[1, -1] == 0 and tables.casts

def test_a_tensor_learning_rate_must_be_one_float32_on_the_parameters_device():
    p = torch.zeros(4)
    tensors = [(p, torch.ones(4), torch.zeros(4), torch.zeros(4), torch.zeros(()), 0, None)]
    with pytest.raises(ValueError, match="float32"):
        ka.Tables().update(tensors, [ka.Group(torch.tensor(1e-3, dtype=torch.float64), 0.0, 0.9, 0.95, 1e-8)])
