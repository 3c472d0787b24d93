"""The Triton loss kernels compute what the fused loss's PyTorch expressions compute.

The kernels run through Triton's CPU interpreter (TRITON_INTERPRET=1, in a subprocess since the flag
is read at import), with fp32 gradients so the comparison is exact up to exp's rounding; skipped where
Triton is not installed. The float8 rounding is the GPU's own conversion: tests/kernels/test_kernels_gpu.py checks it.
"""

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs the triton package (its CPU interpreter runs the kernels)")

SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import loss as lk
from gpt2ladder.speedups.fused_loss import _lse_and_loss, _logit_grad
out = []
for n, v, real, transposed, split, cap in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(n * 1000 + v)
    logits = (torch.randn(n, v, generator=gen) * 4).to(torch.bfloat16)
    targets = torch.randint(0, real, (n,), generator=gen)
    lse, loss = torch.full((n,), 7.0), torch.full((n,), 7.0)
    g, gt = torch.full((n, v), 7.0), torch.full((v, n), 7.0)
    lk.launch(logits, targets, real, 0.25, lse, loss, g, gt if transposed else None, split=split, softcap=cap)
    ref_lse, ref_loss = _lse_and_loss(logits, targets, real, softcap=cap or None)
    ref_g = _logit_grad(logits, ref_lse, targets[:, None], real, 0.25, torch.float32, softcap=cap or None)
    out.append({
        "lse": (lse - ref_lse.squeeze(1)).abs().max().item(),
        "loss": abs(loss.mean().item() - ref_loss.item()),
        "g": (g - ref_g).abs().max().item(),
        "gt_is_g_t": bool(torch.equal(gt, g.t())) if transposed else None,
        "gt_untouched": bool((gt == 7.0).all()),
        "padded": g[:, real:].abs().max().item() if v > real else 0.0,
        "target_negative": bool((g.gather(1, targets[:, None]) < 0).all()),
    })
print(json.dumps(out))
"""

CASES = [  # rows, columns, real vocabulary, transposed copy, made by the transpose kernel (else by the gradient's),
    # soft cap (0: none)
    (70, 300, 290, True, True, 0.0),  # rows not a multiple of any tile, columns not of 128, 10 padded columns
    (70, 300, 290, True, False, 0.0),
    (64, 256, 256, False, True, 0.0),  # exact tiles, no padding, no transposed copy
    (7, 1100, 1030, True, True, 0.0),  # fewer rows than one tile; more than one step of the statistics pass
    (300, 200, 190, True, True, 0.0),  # more rows than one transpose tile (128), columns fewer than one
    (70, 300, 290, True, True, 15.0),  # the softcap part's cap: logits of scale 4 bend a little
    (7, 1100, 1030, False, True, 3.0),  # a tight cap: most logits near it, padded columns still out
]


def test_kernels_match_the_pytorch_expressions(triton_interpret):
    results = triton_interpret(SCRIPT, CASES)
    for (n, v, real, transposed, _, _), r in zip(CASES, results):
        assert r["lse"] < 1e-5 and r["loss"] < 1e-5, (n, v, r)
        assert r["g"] < 1e-6, (n, v, r)  # fp32 out: the same numbers up to exp's rounding
        assert r["padded"] == 0.0 and r["target_negative"], (n, v, r)
        if transposed:
            assert r["gt_is_g_t"], (n, v, r)  # the transposed copy holds exactly the same values
        else:
            assert r["gt_untouched"], (n, v, r)  # no transposed store when none is asked for
