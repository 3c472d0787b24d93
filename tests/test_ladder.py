"""Each rung changes only what it declares, and the ladder composes as rung k = rungs 0..k."""

import dataclasses

import pytest
import torch

from gpt2ladder.errors import UsageError
from gpt2ladder.ladder import (
    LADDER,
    available_rungs,
    declined_by_recipe,
    WRITEUP_RUNGS,
    parse_rungs,
    resolve_rungs,
    setup_for,
    why_unavailable,
)
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.model.setup import Setup

CPU = torch.device("cpu")


def observe(engine: Engine) -> dict:
    """What a step actually runs with, read from the built objects rather than from the Setup."""
    with engine.precision():
        precision = torch.get_float32_matmul_precision()
    with engine.autocast():
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    model = engine.raw_model
    return {
        "precision": precision,
        "autocast": autocast,
        "compiled": engine.forward is not engine.model,
        "attention": model.config.attention,
        "rows": model.lm_head.weight.shape[0],
        "fused_adamw": bool(engine.optimizer.defaults.get("fused")),
        "loss_fn": model.lm_head.fused,
        "fp8": getattr(model.lm_head, "fp8", False),
        "loss_kernel": getattr(model.lm_head, "kernel", False),
        "residual": model.config.low_precision_residual,
        "gelu_kernel": sum(type(m).__name__ == "KernelMLP" for m in model.modules()),
        "fp32_wgrad": sum(type(m).__name__ == "Fp32WgradLinear" for m in model.modules()),
        "weight_cast": len(model.weight_casts.linears) if hasattr(model, "weight_casts") else 0,
        "norm_kernel": sum(type(m).__name__ == "NormBlock" for m in model.modules()),
        "proj_bias": sum(getattr(m, "defer_bias", False) for m in model.modules()),
        "qkv_grad": sum(type(m).__name__ == "KernelAttention" for m in model.modules()),
        "fp8_forward": sum(getattr(m, "fp8_attn_in", False) + getattr(m, "fp8_mlp_in", False) for m in model.modules()),
        "fp8_proj": sum(getattr(m, "fp8_mlp_out", False) for m in model.modules()),
        "fp8_dgrad": sorted(n.split(".", 3)[3] for n, m in model.named_modules() if getattr(m, "dgrad8", False)),
        "adamw_kernel": type(engine.optimizer).__name__,
        "graph": engine.setup.cuda_graph,
        "memset_fill": engine.setup.memset_fill,  # acted on only when a graph is captured (a CUDA test)
        "tied_grad": engine.setup.tied_grad,  # acted on only where Inductor compiles (tests/speedups/test_tied_grad.py)
        "cublaslt": engine.setup.cublaslt,  # acted on only on CUDA (tests/speedups/test_cublaslt_gpu.py)
    }


EXPECTED = {  # rung -> the observable properties it may change
    "baseline": set(),
    "tf32": {"precision"},
    "bf16": {"autocast"},
    "compile": {"compiled"},
    "flash": {"attention"},
    "vocab": {"rows"},
    "fused_adamw": {"fused_adamw"},
    "fused_loss": {"loss_fn"},
    "fp8_head": {"fp8"},
    "loss_kernel": {"loss_kernel"},
    "cuda_graph": {"graph"},
    "bf16_residual": {"residual"},
    "gelu_kernel": {"gelu_kernel"},
    "fp32_wgrad": {"fp32_wgrad"},
    "weight_cast": {"weight_cast"},
    "norm_kernel": {"norm_kernel"},
    "proj_bias": {"proj_bias"},
    "qkv_grad": {"qkv_grad"},
    "fp8_fc": {"fp8_forward"},  # the norm Blocks' float8 inputs, c_fc's only
    "fp8_proj": {"fp8_proj"},  # the MLPs' c_proj fed in float8 by the GELU kernel
    "fp8_dgrad": {"fp8_dgrad"},  # c_attn's and the MLP's c_proj's input gradients in float8
    "fp8_forward": {"fp8_forward"},
    "adamw_kernel": {"adamw_kernel"},  # the fused_adamw it sets is on below it already
    "memset_fill": {"memset_fill"},  # it edits the graph of the cuda_graph rung below it
    "cublaslt": {"cublaslt"},  # the BLAS library the step's matmuls call
    "tied_grad": {"tied_grad"},  # a pass over the compiled backward's graph
}


def test_every_rung_has_an_expectation():
    assert [r.name for r in LADDER if r.name in EXPECTED] == list(EXPECTED)


@pytest.mark.parametrize("k", range(1, len(EXPECTED)))
def test_each_rung_changes_only_what_it_declares(k):
    names = list(EXPECTED)
    before = Engine(PRESETS["tiny"], setup_for(names[:k]), CPU, compile_backend="eager")
    after = Engine(PRESETS["tiny"], setup_for(names[: k + 1]), CPU, compile_backend="eager")
    a, b = observe(before), observe(after)
    changed = {key for key in a if a[key] != b[key]}
    assert changed == EXPECTED[names[k]]
    assert torch.get_float32_matmul_precision() == "highest"  # nothing leaks out of the step


def test_rungs_have_a_reason_sentence_and_a_kind():
    for rung in LADDER:
        assert rung.summary.endswith(".") and len(rung.summary) > 30
        assert rung.kind in ("precision", "memory", "overhead")


def test_writeup_rungs_are_the_write_ups_five_plus_baseline():
    assert WRITEUP_RUNGS == ("baseline", "tf32", "bf16", "compile", "flash", "vocab")


def test_parse_rungs():
    assert parse_rungs("seed") == list(WRITEUP_RUNGS)  # the user's word for them
    assert parse_rungs("all") == [r.name for r in LADDER]
    assert parse_rungs("vocab, baseline") == ["baseline", "vocab"]  # ladder order
    with pytest.raises(UsageError, match="unknown rung warp"):
        parse_rungs("baseline,warp")


def test_setup_for_is_cumulative():
    s = setup_for(["baseline", "tf32", "bf16", "compile", "flash", "vocab"])
    assert s == Setup(matmul_precision="high", autocast="bfloat16", compile=True, attention="sdpa", vocab_multiple=128)


CPU_CAPS = Capabilities("cpu", "cpu (x86_64)")
T4 = Capabilities("cuda", "Tesla T4", (7, 5))
A100 = Capabilities("cuda", "NVIDIA A100-SXM4-80GB", (8, 0))
H200 = Capabilities("cuda", "NVIDIA H200", (9, 0))
NO_TRITON = Capabilities("cuda", "NVIDIA H200", (9, 0), compile_problem="torch.compile on CUDA needs Triton")
H200_TRITON = Capabilities("cuda", "NVIDIA H200", (9, 0), triton_version="3.5.1")
T4_TRITON = Capabilities("cuda", "Tesla T4", (7, 5), triton_version="3.5.1")


@pytest.mark.parametrize("caps,rung,available", [
    (CPU_CAPS, "tf32", False), (CPU_CAPS, "bf16", False), (CPU_CAPS, "compile", True), (CPU_CAPS, "cuda_graph", False),
    (T4, "tf32", False), (T4, "bf16", False), (T4, "fp8_head", False),
    (A100, "tf32", True), (A100, "bf16", True), (A100, "fp8_head", False),
    (H200, "fp8_head", True), (H200, "cuda_graph", True),
    (NO_TRITON, "compile", False), (NO_TRITON, "flash", True),
    (CPU_CAPS, "loss_kernel", False), (H200, "loss_kernel", False), (NO_TRITON, "loss_kernel", False),
    (T4_TRITON, "loss_kernel", False), (H200_TRITON, "loss_kernel", True),
    (CPU_CAPS, "bf16_residual", False), (T4, "bf16_residual", False), (A100, "bf16_residual", True),
    (CPU_CAPS, "gelu_kernel", False), (H200, "gelu_kernel", False), (T4_TRITON, "gelu_kernel", True),
    (CPU_CAPS, "fp32_wgrad", False), (T4, "fp32_wgrad", False), (A100, "fp32_wgrad", True),
    (CPU_CAPS, "weight_cast", False), (T4, "weight_cast", False), (A100, "weight_cast", True),
    (CPU_CAPS, "norm_kernel", False), (H200, "norm_kernel", False), (T4_TRITON, "norm_kernel", False),
    (H200_TRITON, "norm_kernel", True), (CPU_CAPS, "proj_bias", False), (H200_TRITON, "proj_bias", True),
    (CPU_CAPS, "fp8_forward", False), (H200, "fp8_forward", False),
    (Capabilities("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), triton_version="3.5.1"), "fp8_forward", False),
    (H200_TRITON, "fp8_forward", True),
    (CPU_CAPS, "adamw_kernel", False), (H200, "adamw_kernel", False), (T4_TRITON, "adamw_kernel", True),
    (CPU_CAPS, "cublaslt", False), (T4, "cublaslt", True), (dataclasses.replace(T4, os="Windows"), "cublaslt", False),
])
def test_availability(caps, rung, available):
    reason = why_unavailable(rung, caps)
    assert (reason is None) == available
    if reason:
        assert len(reason.splitlines()) == 1


def test_opt_in_rungs_are_climbed_by_all_and_tried_by_best_but_not_auto():

    opt_in = [r.name for r in LADDER if r.opt_in]
    assert opt_in == ["qkv_grad", "fp8_proj", "fp8_forward", "ns_kernel"]
    assert not set(opt_in) & set(resolve_rungs("auto", H200_TRITON))  # what train uses and doctor recommends
    assert resolve_rungs("auto", H200_TRITON)[-11:] == ["fp32_wgrad", "weight_cast", "norm_kernel", "proj_bias",
                                                        "fp8_fc", "fp8_dgrad", "adamw_kernel",
                                                        "memset_fill", "cublaslt",
                                                        "bias_in_wgrad", "tied_grad"]
    assert [n for n in resolve_rungs("best", H200_TRITON) if n in opt_in] == opt_in[:3]  # measured; kept if they pay
    assert [n for n in resolve_rungs("all", H200_TRITON) if n in opt_in] == opt_in  # ns_kernel: Muon's (it declines)
    assert "fp8_proj" not in resolve_rungs("best", A100)  # and only where float8 exists
    for caps in (T4, A100):  # cublaslt, then tied_grad, the last rungs of auto on a CUDA GPU without bias_in_wgrad
        assert resolve_rungs("auto", caps)[-3:] == ["memset_fill", "cublaslt", "tied_grad"]
    assert "cublaslt" not in resolve_rungs("auto", CPU_CAPS)
    assert resolve_rungs("auto", CPU_CAPS)[-2:] == ["fused_loss", "tied_grad"]  # wherever the model compiles


def test_a_gpu_whose_float8_products_cannot_scale_rows_keeps_the_tensor_scaled_head_only():
    """Where the row-scaled float8 product failed (`fp8_rowwise`, as on some Ada and Blackwell cards and PyTorch
    builds), `auto` climbs the float8 classifier (one scale per tensor) and leaves out the row-scaled rungs, each
    with a one-line reason that gives the GPU's own error."""
    error = "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmulAlgoGetHeuristic"
    caps = Capabilities("cuda", "NVIDIA GeForce RTX 5070", (12, 0), triton_version="3.5.1", fp8_rowwise=error)
    auto = resolve_rungs("auto", caps)
    assert "fp8_head" in auto and "loss_kernel" in auto and "adamw_kernel" in auto
    assert not {"fp8_fc", "fp8_dgrad"} & set(auto)
    for rung in ("fp8_fc", "fp8_dgrad", "fp8_forward", "fp8_proj"):
        reason = why_unavailable(rung, caps)
        assert "scale per row" in reason and "CUBLAS_STATUS_NOT_SUPPORTED" in reason and "RTX 5070" in reason
        assert len(reason.splitlines()) == 1
    assert resolve_rungs("auto", H200_TRITON)[-7:-4] == ["fp8_fc", "fp8_dgrad", "adamw_kernel"]  # fp8_rowwise None


def test_memset_fill_needs_a_graph_it_can_edit():
    assert why_unavailable("memset_fill", H200_TRITON) is None
    assert "CUDA GPU" in why_unavailable("memset_fill", CPU_CAPS)
    old_torch = Capabilities("cuda", "NVIDIA H200", (9, 0), graph_edits="needs a PyTorch that keeps it")
    assert why_unavailable("memset_fill", old_torch) == "needs a PyTorch that keeps it"
    assert resolve_rungs("auto", old_torch)[-3:] == ["fp8_dgrad", "cublaslt", "tied_grad"]  # the rest without it
    assert "FSDP2" in why_unavailable("memset_fill", H200_TRITON, "fsdp")


def test_auto_leaves_out_the_graph_only_rungs_where_no_graph_can_be_captured():
    from gpt2ladder.ladder import left_out_of_auto

    graph_only = ["bf16_residual", "gelu_kernel", "fp32_wgrad", "weight_cast", "norm_kernel", "proj_bias",
                  "qkv_grad", "fp8_fc", "fp8_proj", "fp8_dgrad", "fp8_forward", "adamw_kernel", "bias_in_wgrad"]
    assert left_out_of_auto(H200_TRITON) == {} and left_out_of_auto(H200_TRITON, "ddp") == {}
    left = left_out_of_auto(H200_TRITON, "fsdp")
    # weight_cast cannot run under FSDP2 at all (its copies would be of the shards), nor proj_bias (a Block's
    # bias read by the next Block, after FSDP2 freed it), nor adamw_kernel (its parameters are DTensors), so they
    # are not "left out"
    assert "shard" in why_unavailable("weight_cast", H200_TRITON, "fsdp")
    assert "freed" in why_unavailable("proj_bias", H200_TRITON, "fsdp")
    assert "DTensor" in why_unavailable("adamw_kernel", H200_TRITON, "fsdp")
    for refused in ("weight_cast", "proj_bias", "adamw_kernel"):
        graph_only.remove(refused)
    assert sorted(left) == sorted(graph_only) and all("CUDA graph" in why for why in left.values())
    fsdp_auto = resolve_rungs("auto", H200_TRITON, "fsdp")
    assert "cuda_graph" not in fsdp_auto and not set(graph_only) & set(fsdp_auto)
    assert resolve_rungs("auto", H200_TRITON, "ddp") == resolve_rungs("auto", H200_TRITON)  # graphed under DDP too
    assert set(graph_only) <= set(resolve_rungs("best", H200_TRITON, "fsdp"))  # best measures them anyway


def test_the_flash_rung_declines_doc_windows_in_one_line_and_the_other_new_parts_keep_every_generic_rung():
    from gpt2ladder.model.recipe import parse_recipe

    windowed = parse_recipe("muon,rope,value_embeds,unet_skips,doc_windows")
    reason = why_unavailable("flash", H200_TRITON, recipe=windowed)
    assert reason and "doc_windows" in reason and "\n" not in reason and len(reason) < 200
    assert "flash" not in available_rungs(H200_TRITON, recipe=windowed)
    generic = ("compile", "vocab", "fused_adamw", "fused_loss", "fp8_head", "cuda_graph", "bf16_residual",
               "memset_fill", "cublaslt")
    assert set(generic) <= set(available_rungs(H200_TRITON, recipe=windowed))
    skips = parse_recipe("muon,rope,value_embeds,unet_skips")
    assert available_rungs(H200_TRITON, recipe=skips) == available_rungs(H200_TRITON, recipe=parse_recipe("muon,rope"))


def test_a_recipe_that_changes_gpt2s_blocks_keeps_the_generic_rungs_and_says_why_for_the_others():
    from gpt2ladder.model.recipe import parse_recipe

    modern = parse_recipe("muon,rope,qk_norm,relu2,rmsnorm,softcap")
    gpt2_top = set(available_rungs(H200_TRITON))
    top = available_rungs(H200_TRITON, recipe=modern)
    for name in ("compile", "flash", "vocab", "fused_adamw", "fused_loss", "fp8_head", "loss_kernel", "cuda_graph",
                 "bf16_residual", "memset_fill", "cublaslt"):
        assert (name in top) == (name in gpt2_top), name
    declined = gpt2_top - set(top)
    assert declined >= {"gelu_kernel", "norm_kernel", "fp32_wgrad", "bias_in_wgrad", "tied_grad", "adamw_kernel"}
    for name in declined:
        reason = why_unavailable(name, H200_TRITON, recipe=modern)
        assert reason and "\n" not in reason and len(reason) < 200, name
    assert "Muon" in why_unavailable("adamw_kernel", H200_TRITON, recipe=parse_recipe("muon"))
    assert why_unavailable("norm_kernel", H200_TRITON, recipe=parse_recipe("muon")) is None  # GPT-2's own Blocks
    assert why_unavailable("loss_kernel", H200_TRITON, recipe=parse_recipe("softcap")) is None  # a soft-capped form


def test_the_rungs_a_recipe_leaves_out_of_auto_are_those_it_declines_each_with_the_reason_a_list_gets():
    """doctor recommends auto's rungs for the gpt2 recipe; another recipe's auto is that list less the rungs it
    declines (plus any only it can run), which train, parity and profile name with the reason a --rungs list gets."""
    from gpt2ladder.model.recipe import parse_recipe

    speedrun, windowed = parse_recipe("speedrun"), parse_recipe("speedrun+doc_windows")
    assert declined_by_recipe(CPU_CAPS) == {}
    assert declined_by_recipe(CPU_CAPS, recipe=speedrun) == {
        "tied_grad": why_unavailable("tied_grad", CPU_CAPS, recipe=speedrun)}
    assert list(declined_by_recipe(CPU_CAPS, recipe=windowed)) == ["flash", "tied_grad"]
    assert "doc_windows" in declined_by_recipe(CPU_CAPS, recipe=windowed)["flash"]
    for caps in (CPU_CAPS, H200_TRITON):
        for recipe in (speedrun, windowed):
            declined = declined_by_recipe(caps, recipe=recipe)
            gpt2 = available_rungs(caps)
            assert [n for n in gpt2 if n not in declined] == [n for n in available_rungs(caps, recipe=recipe)
                                                              if n in gpt2]
