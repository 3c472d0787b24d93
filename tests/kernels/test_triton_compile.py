"""Every Triton kernel of the package compiles for the GPUs it targets, here on a machine without one.

The CPU interpreter (tests/kernels/test_loss_kernel.py, test_gelu_kernel.py, test_qkv_kernel.py,
test_adamw_kernel.py, test_weight8_kernel.py, test_gram_kernel.py) checks what the kernels compute, but it runs them
as Python and accepts
code the compiler rejects (a kernel reading a plain module global, for one). Compiling to a cubin for sm_80 (A100),
sm_90 (H100, H200) and sm_120 (the RTX 50 series) needs only the triton package.
"""

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")

C = "constexpr"
KERNELS = {  # kernel -> (signature, constexpr values), as the launchers call them at GPT-2's shapes
    "kernels.loss._loss_stats_kernel": (
        {"logits_ptr": "*bf16", "targets_ptr": "*i64", "lse_ptr": "*fp32", "loss_ptr": "*fp32", "n_rows": "i32",
         "n_cols": "i32", "vocab_size": C, "BLOCK_M": C, "BLOCK_V": C, "WIDE": C},
        {"vocab_size": 50257, "BLOCK_M": 1, "BLOCK_V": 2048, "WIDE": False}),
    **{f"kernels.loss._loss_grad_kernel#{variant}": (
        {"logits_ptr": "*bf16", "targets_ptr": "*i64", "lse_ptr": "*fp32", "g_ptr": "*fp8e5", "gt_ptr": "*fp8e5",
         "n_rows": "i32", "n_cols": "i32", "vocab_size": "i32", "scale": "fp32", "WRITE_T": C, "BLOCK_M": C,
         "BLOCK_V": C, "ROWS_FAST": C, "WIDE": C},
        {"WRITE_T": write_t, "BLOCK_M": bm, "BLOCK_V": bv, "ROWS_FAST": True, "WIDE": False})
        for variant, write_t, bm, bv in (("both-layouts", True, 32, 64), ("row-major", False, 4, 512))},
    **{f"kernels.loss._transpose_kernel#{'wide' if wide else 'narrow'}": (
        {"src_ptr": "*fp8e5", "dst_ptr": "*fp8e5", "n_rows": "i32", "n_cols": "i32", "BLOCK_R": C, "BLOCK_C": C,
         "WIDE": C},
        {"BLOCK_R": 128, "BLOCK_C": 128, "WIDE": wide}) for wide in (False, True)},
    "kernels.gelu._gelu_grad_kernel": (
        {"grad_ptr": "*bf16", "h0_ptr": "*bf16", "bias_ptr": "*fp32", "dh_ptr": "*bf16", "dbias_ptr": "*fp32",
         "n_rows": "i32", "n_cols": "i32", "BLOCK_M": C, "BLOCK_N": C, "ROW_BLOCKS": C, "WIDE": C},
        {"BLOCK_M": 32, "BLOCK_N": 64, "ROW_BLOCKS": 1, "WIDE": False}),
    "kernels.gelu._gelu_fwd_fp8_blocks_kernel": (
        {"h0_ptr": "*bf16", "bias_ptr": "*fp32", "out_ptr": "*bf16", "q_ptr": "*fp8e4nv", "qs_ptr": "*fp32",
         "n_rows": "i32", "n_cols": "i32", "Q_MAX": C, "QB": C, "BLOCK_M": C, "BLOCK_N": C, "WIDE": C},
        {"Q_MAX": 448.0, "QB": 128, "BLOCK_M": 32, "BLOCK_N": 128, "WIDE": False}),
    "kernels.gelu._gelu_fwd_kernel": (
        {"h0_ptr": "*bf16", "bias_ptr": "*fp32", "out_ptr": "*bf16", "n_rows": "i32", "n_cols": "i32",
         "BLOCK_M": C, "BLOCK_N": C, "WIDE": C},
        {"BLOCK_M": 8, "BLOCK_N": 256, "WIDE": False}),
    **{f"kernels.norm._add_norm_fwd_kernel#{variant}": (
        {"h_ptr": "*bf16", "p_ptr": "*bf16", "pb_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "s_ptr": "*bf16",
         "y_ptr": "*bf16", "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "q_ptr": "*fp8e4nv" if q else "*bf16",
         "qs_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32", "y_stride": "i32", "eps": "fp32", "HAS_PB": C,
         "HAS_Q": C, "Q_MAX": C, "ONES": C, "BLOCK_M": C, "BLOCK_C": C},
        {"HAS_PB": pb, "HAS_Q": q, "Q_MAX": 448.0, "ONES": ones, "BLOCK_M": 4, "BLOCK_C": 1024})
        for variant, pb, q, ones in (("plain", False, False, 0), ("pbias", True, False, 0), ("fp8", True, True, 0),
                                     ("ones", True, False, 8))},
    **{f"kernels.norm._add_norm_bwd_kernel#{'pbias' if pb else 'plain'}": (
        {"dy_ptr": "*bf16", "ds_ptr": "*bf16", "s_ptr": "*bf16", "w_ptr": "*fp32", "mean_ptr": "*fp32",
         "rstd_ptr": "*fp32", "dsum_ptr": "*bf16", "part_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32",
         "programs": "i32", "HAS_PB": C, "STEPS": C, "BLOCK_M": C, "BLOCK_C": C, "PREFETCH": C},
        {"HAS_PB": pb, "STEPS": 16, "BLOCK_M": 4, "BLOCK_C": 1024, "PREFETCH": True}) for pb in (False, True)},
    "kernels.qkv._qkv_grad_kernel": (
        {"dq_ptr": "*bf16", "dk_ptr": "*bf16", "dv_ptr": "*bf16", "out_ptr": "*bf16", "dbias_ptr": "*fp32", "T": "i32",
         "nh": "i32", **{f"s{g}_{d}": "i32" for g in "qkv" for d in "bht"}, "HS": C, "BLOCK_T": C, "ROW_TILES": C},
        {"HS": 64, "BLOCK_T": 64, "ROW_TILES": 4}),
    "kernels.weight8._weight8_kernel": (  # a row-major weight: Triton's launcher makes a unit stride a constant
        {"w_ptr": "*bf16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32",
         "stride_r": "i32", "stride_c": C, "INV_Q_MAX": C, "BLOCK_C": C, "BLOCK_R": C, "STEPS": C},
        {"stride_c": 1, "INV_Q_MAX": 1 / 448, "BLOCK_C": 16, "BLOCK_R": 256, "STEPS": 9}),
    **{f"kernels.adamw._adamw_kernel#{variant}": (
        {"work_ptr": "*i64", "tensors_ptr": "*i64", "groups_ptr": "*fp64", "tickets_ptr": "*i32", "scale_ptr": "*fp32",
         "inf_ptr": "*fp32", "HAS_SCALE": C, "HAS_INF": C, "ALIGNED": C, "CASTS": C, "BLOCK": C, "ITERS": C},
        {"HAS_SCALE": scale, "HAS_INF": inf, "ALIGNED": aligned, "CASTS": casts, "BLOCK": 1024, "ITERS": 4})
        for variant, scale, inf, aligned, casts in (("plain", False, False, True, False),
                                                    ("scaled", True, False, True, False),
                                                    ("casts", True, False, True, True),
                                                    ("amp", True, True, False, False))},
    **{f"kernels.gram._gram_kernel#{variant}": (  # unit strides: Triton's launcher makes them constants
        {"x_ptr": "*bf16", "add_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "alpha": "fp32", "beta": "fp32",
         "s_xn": "i32", "s_xm": "i32", "s_xk": C, "s_an": "i32", "s_am": "i32", "s_ak": C, "K": C, "HAS_ADD": C,
         "BLOCK": C, "BLOCK_K": C},
        {"s_xk": 1, "s_ak": 1, "K": k, "HAS_ADD": add, "BLOCK": 128, "BLOCK_K": 64})
        for variant, k, add in (("gram", 3072, False), ("poly", 768, True))},
    "kernels.norm._colsum_kernel": (
        {"part_ptr": "*fp32", "dw_ptr": "*fp32", "db_ptr": "*fp32", "dpb_ptr": "*fp32", "n_cols": "i32", "N_PARTS": C,
         "BLOCK_P": C, "BLOCK_N": C},
        {"N_PARTS": 264, "BLOCK_P": 256, "BLOCK_N": 16}),
}


@pytest.mark.parametrize("capability", [80, 90, 120])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_compiles_to_a_cubin(name, capability):
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget

    module, kernel = name.split("#")[0].rsplit(".", 1)  # after a '#': which variant of the kernel
    fn = getattr(importlib.import_module(f"gpt2ladder.{module}"), kernel)
    signature, constexprs = KERNELS[name]
    if capability < 89 and "fp8" in str(signature):
        pytest.skip("float8 stores need compute capability 8.9+")
    compiled = triton.compile(triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", capability, 32))
    assert len(compiled.asm["cubin"]) > 1000
