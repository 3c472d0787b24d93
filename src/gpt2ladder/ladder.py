"""The ladder: each speed-up as a named rung that changes fields of a `Setup`.

A rung is a name, one sentence of what it changes and why that is faster, the fields it sets, and a
check that says why it cannot apply on this machine. Rung k of the ladder is rungs 0..k applied in
order to the baseline setup. Adding a rung = one `Rung(...)` entry below plus, if it needs new
machinery, one field in `Setup` (`model/setup.py`) that the engine honours or, for a rewrite of the
model, one entry in `speedups.REWRITES`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from gpt2ladder.errors import UsageError
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.model.recipe import GPT2, Recipe, recipe_label
from gpt2ladder.model.setup import Setup


@dataclass(frozen=True)
class Rung:
    name: str
    summary: str  # one sentence: what it changes and why it is faster
    kind: str  # "precision", "memory" or "overhead": the colour of its bar
    changes: dict = field(default_factory=dict)  # the Setup fields this rung sets, and to what
    # Returns None when the rung can run here, else the reason it cannot.
    unavailable: Callable[[Capabilities], str | None] = field(repr=False, default=lambda caps: None)
    writeup: bool = False  # one of the write-up's five (and its baseline): what `--rungs seed` climbs
    # Measured slower than the rung before it, or no faster (within noise), where it was tried (its record in
    # benchmarks/RECORDS.md), or not yet measured on a GPU: climbed by `all` and tried by `--rungs best`, but
    # not part of `auto`, which `train` uses and `doctor` recommends.
    opt_in: bool = False
    # Where `parity` found its loss off the fp32 baseline's by more than the rule allows: the rung is still
    # measured (`all`, `best`) and reported, but `best` never keeps it, however fast.
    parity_failure: str | None = None
    # Cuts GPU work that, without a CUDA graph, launch gaps hide: `auto` leaves it out where no graph can
    # be captured (FSDP2), since there it measured slower (see GRAPH_ONLY_REASON).
    pays_with_graph: bool = False
    # Data-parallel strategies ("ddp", "fsdp") the rung cannot run under, each with the reason.
    refused_under: dict = field(default_factory=dict)
    # Returns None when the rung applies to this recipe's model and optimizer, else why it does not.
    declines: Callable[[Recipe], str | None] = field(repr=False, default=lambda recipe: None)

    def apply(self, setup: Setup) -> Setup:
        return dataclasses.replace(setup, **self.changes)


def _needs_ampere(what: str) -> Callable[[Capabilities], str | None]:
    def check(caps: Capabilities) -> str | None:
        if caps.device_type != "cuda":
            return f"{what} needs a CUDA GPU of compute capability 8.0 (Ampere) or newer; this is {caps.device_type}"
        if caps.capability < (8, 0):
            cc = "%d.%d" % caps.capability
            return f"{what} needs compute capability 8.0 (Ampere) or newer; {caps.name} is {cc}"
        return None

    return check


def _needs_compile(caps: Capabilities) -> str | None:
    return caps.compile_problem


def _needs_cuda(what: str) -> Callable[[Capabilities], str | None]:
    return lambda caps: None if caps.device_type == "cuda" else f"{what} needs a CUDA GPU; this is {caps.device_type}"


def _needs_cublaslt(caps: Capabilities) -> str | None:
    """PyTorch sends its matmuls to cuBLASLt on NVIDIA's CUDA, but not on Windows, where it calls that choice
    unsupported, nor on ROCm, whose builds choose between hipBLAS and hipBLASLt themselves."""
    if caps.device_type == "cuda" and caps.os == "Windows":
        return "PyTorch cannot send its matmuls to cuBLASLt on Windows (preferred_blas_library is unsupported there)"
    if caps.device_type == "cuda" and caps.hip_version is not None:
        return "on ROCm PyTorch chooses its BLAS library (hipBLAS or hipBLASLt) itself; the cublaslt rung is for CUDA"
    return _needs_cuda("the cublaslt rung")(caps)


def _needs_no_bf16(caps: Capabilities) -> str | None:
    """fp16 + GradScaler stands in for bf16 only on GPUs that lack bf16 (before Ampere)."""
    if caps.device_type != "cuda":
        return f"float16 autocast with a GradScaler needs a CUDA GPU; this is {caps.device_type}"
    if caps.bf16_supported:
        return f"only for GPUs without bfloat16; {caps.name} runs the bf16 rung, which needs no GradScaler"
    return None


def _needs_fused_loss(caps: Capabilities) -> str | None:
    """The fused loss forms its gradient in the forward pass, where fp16's GradScaler cannot reach it."""
    if caps.device_type == "cuda" and not caps.bf16_supported:
        return ("the fused loss computes its gradient before the fp16 GradScaler scales it, so float16 "
                f"would overflow or flush it; it needs bfloat16 (compute capability 8.0+), {caps.name} is "
                f"{caps.capability_text}")
    return caps.compile_problem


def _needs_triton_gpu(what: str) -> Callable[[Capabilities], str | None]:
    def check(caps: Capabilities) -> str | None:
        if caps.device_type != "cuda":
            return f"{what} needs a CUDA GPU; this is {caps.device_type}"
        if caps.triton_version is None:
            return f"{what} is written in Triton, which is not installed (pip install triton)"
        return None

    return check


def _needs_loss_kernel(caps: Capabilities) -> str | None:
    return _needs_triton_gpu("the loss_kernel rung")(caps) or _needs_fused_loss(caps)


def _needs_norm_kernel(caps: Capabilities) -> str | None:
    """The kernels normalise the bf16 residual stream, which the rung turns on."""
    return _needs_triton_gpu("the norm_kernel rung")(caps) or _needs_ampere("a bfloat16 residual stream")(caps)


def _needs_proj_bias(caps: Capabilities) -> str | None:
    """The norm kernels add the biases: what they need, said of this rung."""
    return (_needs_triton_gpu("the proj_bias rung (the norm kernels add its biases)")(caps)
            or _needs_ampere("a bfloat16 residual stream")(caps))


def _needs_mm_out_dtype(caps: Capabilities) -> str | None:
    import torch

    if "dtype" not in torch.ops.aten.mm.overloads():
        return (f"an fp32-output bf16 matmul (torch.mm's out_dtype) needs PyTorch 2.8 or newer; "
                f"this is {torch.__version__}")
    return _needs_ampere("an fp32-output bf16 matmul")(caps)


def _needs_fp8(caps: Capabilities) -> str | None:
    if caps.device_type != "cuda":
        return f"float8 matmuls need a CUDA GPU of compute capability 8.9 or newer; this is {caps.device_type}"
    if caps.capability < (8, 9):
        major, minor = caps.capability
        return f"float8 matmuls need compute capability 8.9 (Ada/Hopper) or newer; {caps.name} is {major}.{minor}"
    return caps.compile_problem  # the casts are only cheap when compile fuses them into neighbours


def _needs_fp8_rows(caps: Capabilities) -> str | None:
    """Float8 products with a scale per row of each operand, which some GPUs with float8 cannot run."""
    if problem := _needs_fp8(caps):
        return problem
    if caps.fp8_rowwise:
        return f"float8 matmuls with a scale per row do not run on {caps.name} with this PyTorch: {caps.fp8_rowwise}"
    return None


def _needs_fp8_forward(caps: Capabilities) -> str | None:
    """Float8 forward products (row-scaled), the norm kernels that write their operand, and fp32_wgrad's gradients."""
    return _needs_fp8_rows(caps) or _needs_norm_kernel(caps) or _needs_mm_out_dtype(caps)


def _needs_graph_edits(caps: Capabilities) -> str | None:
    """Editing a captured graph before it is instantiated (PyTorch's keep_graph, the driver's graph calls)."""
    return _needs_cuda("editing a captured CUDA graph")(caps) or caps.graph_edits


def _gpt2_blocks(what: str) -> Callable[[Recipe], str | None]:
    """A rewrite written for GPT-2's own Blocks (biased Linears, LayerNorm, GELU, learned positions)."""
    def check(recipe: Recipe) -> str | None:
        if recipe.family == "gpt2":
            return None
        return f"{what} is written for GPT-2's own Blocks; recipe {recipe_label(recipe.name)} changes them"

    return check


def _rotary_parts(recipe: Recipe) -> str | None:
    if recipe.has("rope") or recipe.has("qk_norm"):
        return None
    return (f"the rotary_kernel rung acts on rotary positions and QK-norm; recipe {recipe_label(recipe.name)} has "
            "neither")


def _adamw_only(recipe: Recipe) -> str | None:
    return (None if recipe.optimizer == "adamw"
            else "the adamw_kernel rung updates by AdamW alone; this recipe uses Muon")


def _muon_only(recipe: Recipe) -> str | None:
    if recipe.optimizer == "muon":
        return None
    return (f"the ns_kernel rung computes Muon's Newton-Schulz products; recipe {recipe_label(recipe.name)} has no "
            "muon part")


def _causal_attention(recipe: Recipe) -> str | None:
    if recipe.has("doc_windows"):
        return ("the flash rung's causal SDPA is replaced by doc_windows' attention within documents and a window "
                "(FlexAttention where compiled on a GPU)")
    return None


LADDER: tuple[Rung, ...] = (
    Rung("baseline", "fp32 everywhere, the four-line attention, vocabulary 50257, eager PyTorch.",
         "precision", {}, writeup=True),
    Rung("tf32", "Matmuls run on the tensor cores in TF32 (10-bit mantissa inside the multiply, fp32 in and out).",
         "precision", {"matmul_precision": "high"}, _needs_ampere("TF32"), writeup=True),
    Rung("bf16", "Autocast runs matmuls in bfloat16, halving the bytes every activation moves; weights stay fp32.",
         "precision", {"autocast": "bfloat16"}, _needs_ampere("bfloat16 autocast"), writeup=True),
    Rung("fp16", "Where bf16 is missing (before Ampere), autocast runs matmuls in float16 on the tensor cores; "
         "a GradScaler keeps small gradients from rounding to zero.",
         "precision", {"autocast": "float16"}, _needs_no_bf16),
    Rung("compile", "torch.compile removes the Python interpreter and fuses elementwise chains into single kernels.",
         "memory", {"compile": True}, _needs_compile, writeup=True),
    Rung("flash", "scaled_dot_product_attention(is_causal=True) never writes the T x T score matrix to memory.",
         "memory", {"attention": "sdpa"}, writeup=True, declines=_causal_attention),
    Rung("vocab", "The classifier gets 50304 rows (a multiple of 128), so its matmul tiles evenly.",
         "memory", {"vocab_multiple": 128}, writeup=True),
    Rung("fused_adamw", "AdamW updates every parameter in a few fused kernels instead of a loop of small ones.",
         "overhead", {"fused_adamw": True}),
    Rung("fused_loss", "The classifier's cross-entropy and its gradient come from one pass over the logits.",
         "memory", {"fused_loss": True}, _needs_fused_loss),
    Rung("fp8_head", "The classifier's three matmuls run in float8 inside the fused loss (which it turns on, "
         "with the 50304-row vocabulary it needs), at twice the bf16 tensor-core rate.",
         "precision", {"fp8_head": True, "fused_loss": True, "vocab_multiple": 128}, _needs_fp8),
    Rung("loss_kernel", "The fused loss's pass over the logits runs as hand-written Triton kernels (row "
         "log-sum-exp, then the gradient tiles, then for float8 a transpose of their bytes), which read the logits "
         "twice instead of three times and store the transposed float8 copy contiguously.",
         "memory", {"loss_kernel": True, "fused_loss": True}, _needs_loss_kernel),
    # FSDP2 frees and re-gathers parameter storage from Python every step; a replayed graph would not. (Under
    # DDP the graph captures the all-reduces too: runtime/engine.py.)
    Rung("cuda_graph", "The whole step is captured once as a CUDA graph and replayed, so no launch gaps remain.",
         "overhead", {"cuda_graph": True}, _needs_cuda("capturing a CUDA graph"),
         refused_under={"fsdp": "a captured CUDA graph cannot replay FSDP2's per-step parameter gathering"}),
    # After the graph: rungs that cut GPU work, measured where launch gaps no longer hide it (ungraphed,
    # bf16_residual measured slower than without it).
    Rung("bf16_residual", "The residual stream between Blocks is kept in bfloat16 (autocast leaves it in fp32), so "
         "every residual add, layer norm and their gradients move half the bytes (the norms still compute in "
         "fp32, and the embeddings' gradients still add up in fp32).",
         "memory", {"bf16_residual": True, "autocast": "bfloat16"}, _needs_ampere("a bfloat16 residual stream"),
         pays_with_graph=True),
    Rung("rotary_kernel", "The modern attention's queries and keys are RMS-normalised and turned by their position's "
         "angle (QK-norm, rotary positions) in one Triton pass with v's copy, written token-major for attention, and "
         "their gradients go back into c_attn's output gradient in one pass each, where compile wrote several.",
         "memory", {"rotary_kernel": True}, _needs_triton_gpu("the rotary_kernel rung"), declines=_rotary_parts),
    Rung("gelu_kernel", "The MLP's GELU runs as two Triton kernels: forward as h / (1 + exp(-2z)), one exp2 and a "
         "division where compile's kernel evaluates a long tanh and was bound by that arithmetic, not by memory; "
         "backward writes the input gradient and c_fc's bias gradient in one pass.",
         "memory", {"gelu_kernel": True}, _needs_triton_gpu("the gelu_kernel rung"), pays_with_graph=True,
         declines=_gpt2_blocks("the gelu_kernel rung")),
    Rung("fp32_wgrad", "Each Block's weight gradients leave their bf16 matmul in fp32 (cuBLAS's out_dtype), "
         "instead of being rounded to bf16 and cast to fp32 by 48 extra kernels; more precise as well.",
         "memory", {"fp32_wgrad": True}, _needs_mm_out_dtype, pays_with_graph=True,
         declines=_gpt2_blocks("the fp32_wgrad rung")),
    Rung("weight_cast", "The Blocks' weights and biases are kept in bfloat16 copies between steps, where autocast "
         "cast each one beside its matmul in 72 small kernels (the same rounding, so the same numbers): one "
         "multi-tensor copy at the start of the step makes them or, with adamw_kernel, the optimizer writes them "
         "beside its update.",
         "overhead", {"weight_cast": True, "fp32_wgrad": True, "autocast": "bfloat16"}, _needs_mm_out_dtype,
         pays_with_graph=True, refused_under={
             "fsdp": "FSDP2 replaces every parameter by its shard and gathers it inside the step, after the copies "
                     "are made"},
         declines=_gpt2_blocks("the weight_cast rung")),
    Rung("norm_kernel", "Each residual add and the layer norm after it run as Triton kernels whose backward ends "
         "the norm's weight and bias gradients in one small launch, where compile's ended them in two aten sums "
         "with a memset before each (92 launches per step).",
         "overhead", {"norm_kernel": True, "bf16_residual": True, "autocast": "bfloat16"},
         _needs_norm_kernel, pays_with_graph=True,
         declines=_gpt2_blocks("the norm_kernel rung")),
    Rung("proj_bias", "The attention's and MLP's output projections leave their biases to the norm kernels, which "
         "add them with the residual and sum their gradients with the norm's own, where compile summed each in two "
         "more reductions (48 launches per step).",
         "overhead", {"proj_bias": True, "norm_kernel": True, "bf16_residual": True, "autocast": "bfloat16"},
         _needs_proj_bias, pays_with_graph=True, refused_under={
             "fsdp": "the MLP's output bias is read by the next Block's norm, after FSDP2 has freed the gathered "
                     "parameters of the Block it belongs to"},
         declines=_gpt2_blocks("the proj_bias rung")),
    Rung("qkv_grad", "The attention's q, k and v gradients are written side by side into c_attn's output gradient "
         "by one Triton kernel that also sums c_attn's bias gradient from the same values, where compile assembled "
         "them in one pass and summed the bias in a second. Opt-in: compile fuses both passes into their "
         "neighbours, and in the step the kernel did not pay.",
         "memory", {"qkv_grad": True}, _needs_triton_gpu("the qkv_grad rung"), opt_in=True, pays_with_graph=True,
         declines=_gpt2_blocks("the qkv_grad rung")),
    Rung("fp8_fc", "The MLP's input projection (c_fc) alone multiplies in float8 in the forward pass, from the norm "
         "kernel's float8 copy of its input (as fp8_forward, without c_attn, whose rounding reaches the attention "
         "scores); the gradients stay bf16 matmuls. Its loss stays beside the fp32 baseline's, as the rungs' "
         "before it do.",
         "precision", {"fp8_fc": True, "norm_kernel": True, "bf16_residual": True, "autocast": "bfloat16"},
         _needs_fp8_forward, pays_with_graph=True,
         declines=_gpt2_blocks("the fp8_fc rung")),
    Rung("fp8_proj", "The MLP's output projection (c_proj) multiplies in float8 in the forward pass as well, from a "
         "float8 copy of the GELU's output with one scale per row that the GELU kernel writes beside it; the "
         "gradients stay bf16 matmuls. Opt-in: within the parity rule, but slower a step, the GELU kernel holding "
         "whole rows to scale them costing more than the float8 product saves.",
         "precision", {"fp8_proj": True, "gelu_kernel": True, "norm_kernel": True,
                       "bf16_residual": True, "autocast": "bfloat16"},
         _needs_fp8_forward, opt_in=True, pays_with_graph=True,
         declines=_gpt2_blocks("the fp8_proj rung")),
    Rung("fp8_dgrad", "The input gradients of the attention's input projection (c_attn) and the MLP's output "
         "projection (c_proj) multiply in float8, at twice the bf16 tensor-core rate: the output gradient cast with "
         "one scale per token, the weight with one per input feature; the weight gradients stay bf16 matmuls "
         "written in fp32.",
         "precision", {"fp8_dgrad": True, "fp32_wgrad": True, "autocast": "bfloat16"},
         lambda caps: _needs_fp8_rows(caps) or _needs_mm_out_dtype(caps), pays_with_graph=True,
         declines=_gpt2_blocks("the fp8_dgrad rung")),
    Rung("fp8_forward", "The attention's and MLP's input projections (c_attn, c_fc) multiply in float8 in the "
         "forward pass, at twice the bf16 tensor-core rate: the norm kernels write their output in float8 with one "
         "scale per row beside the bf16 one, and each weight is cast per output feature; the gradients stay bf16 "
         "matmuls. Opt-in: faster a step and within the parity rule, but its training loss runs above the fp32 "
         "baseline's where the other rungs' do not, and to a given loss it took as many steps as without it, so "
         "no less time.",
         "precision", {"fp8_forward": True, "norm_kernel": True, "bf16_residual": True, "autocast": "bfloat16"},
         _needs_fp8_forward, opt_in=True, pays_with_graph=True,
         declines=_gpt2_blocks("the fp8_forward rung")),
    Rung("adamw_kernel", "AdamW updates every parameter in one Triton launch that finds each tensor in a table of "
         "addresses, with the same arithmetic and optimizer state, where fused AdamW makes 9 multi-tensor launches.",
         "memory", {"adamw_kernel": True, "fused_adamw": True}, _needs_triton_gpu("the adamw_kernel rung"),
         pays_with_graph=True, refused_under={
             "fsdp": "FSDP2's parameters are sharded DTensors, which the kernel's table of addresses cannot hold"},
         declines=_adamw_only),
    Rung("ns_kernel", "Muon's two symmetric products of each Newton-Schulz step (the gram matrix A = X X^T, and "
         "b A + c A^2) run as a Triton kernel that computes only the output tiles on and above the diagonal (21 of 36 "
         "at 768 x 768 with 128-wide tiles) and writes each one's mirror below it, where cuBLAS computed every tile. "
         "Opt-in: slower a step than cuBLAS's full products.",
         "overhead", {"ns_kernel": True}, _needs_triton_gpu("the ns_kernel rung"), opt_in=True,
         declines=_muon_only),
    Rung("memset_fill", "The CUDA graph's small memset nodes (cuBLAS zeroes 4 bytes of its workspace before most "
         "matmuls, 128 times a step of GPT-2 124M) become kernels that store the same bytes, since a kernel after a "
         "kernel starts sooner than one after a memset.",
         "overhead", {"memset_fill": True}, _needs_graph_edits,
         pays_with_graph=True, refused_under={
             "fsdp": "a captured CUDA graph cannot replay FSDP2's per-step parameter gathering"}),
    Rung("cublaslt", "PyTorch's matmuls go through cuBLASLt, taking its heuristic's first algorithm, instead of "
         "cuBLAS, whose choice for three of a Block's four weight gradients is a split-K product with a reduction "
         "kernel after it, where cuBLASLt's runs without one.",
         "overhead", {"cublaslt": True}, _needs_cublaslt),
    Rung("bias_in_wgrad", "The norm kernel before each attention writes its output with 8 columns of ones after "
         "every row, and c_attn's weight-gradient product runs over them too, so that one of its output columns is "
         "the bias gradient: the pass that summed that gradient apart, over c_attn's (tokens x 3C) output gradient, "
         "goes, for a product 1% wider and a copy of the weight gradient. It takes the place of qkv_grad's kernel "
         "and of fp8_forward's float8 c_attn, which sum that bias their own way, where a ladder climbed them.",
         "memory", {"bias_in_wgrad": True, "norm_kernel": True, "bf16_residual": True, "fp32_wgrad": True,
                    "autocast": "bfloat16", "qkv_grad": False, "fp8_forward": False},
         lambda caps: (_needs_triton_gpu("the bias_in_wgrad rung")(caps) or _needs_ampere("a bfloat16 residual "
                                                                                     "stream")(caps)
                       or _needs_mm_out_dtype(caps)), pays_with_graph=True,
         declines=_gpt2_blocks("the bias_in_wgrad rung")),
    Rung("tied_grad", "The token embedding's gradient rows are added into the tied classifier's gradient, not into a "
         "zeroed copy of the 50304 x 768 weight that is then added to it, saving a write and a pass over 154 MB a "
         "step where the model compiles as one graph (not under DDP's graph per bucket).",
         "memory", {"tied_grad": True}, _needs_compile,
         declines=_gpt2_blocks("the tied_grad rung's graph pass")),
)

RUNGS_BY_NAME = {r.name: r for r in LADDER}
WRITEUP_RUNGS = tuple(r.name for r in LADDER if r.writeup)


def parse_rungs(spec: str) -> list[str]:
    """`seed` (the write-up's five: the ladder the product was seeded with), `all`, or comma-separated
    names in ladder order."""
    if spec == "seed":
        return list(WRITEUP_RUNGS)
    if spec == "all":
        return [r.name for r in LADDER]
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNGS_BY_NAME]
    if unknown or not names:
        valid = ", ".join(["seed", "all", "auto", "best"] + list(RUNGS_BY_NAME))
        raise UsageError(f"unknown rung {', '.join(unknown) or repr(spec)}; choose from: {valid}")
    order = {r.name: i for i, r in enumerate(LADDER)}
    return sorted(dict.fromkeys(names), key=order.__getitem__)


def setup_for(names: list[str]) -> Setup:
    """The setup after applying the named rungs, in ladder order, to the baseline."""
    setup = Setup()
    for name in names:
        setup = RUNGS_BY_NAME[name].apply(setup)
    return setup


def why_unavailable(name: str, caps: Capabilities, strategy: str | None = None, recipe: Recipe = GPT2) -> str | None:
    """Why a rung cannot run on this machine, under torchrun with this data-parallel strategy, or for this recipe."""
    rung = RUNGS_BY_NAME[name]
    return rung.unavailable(caps) or strategy_problem(name, strategy) or rung.declines(recipe)


def strategy_problem(name: str, strategy: str | None) -> str | None:
    """Why a rung cannot run under this data-parallel strategy ("ddp", "fsdp"; None: one process)."""
    return RUNGS_BY_NAME[name].refused_under.get(strategy) if strategy else None


GRAPH_ONLY_REASON = ("it pays only inside a CUDA graph, which cannot be captured here: ungraphed, bf16_residual "
                     "measured slower than without it, and the DDP step slower with the rungs after cuda_graph "
                     "than without them")


def left_out_of_auto(caps: Capabilities, strategy: str | None = None, recipe: Recipe = GPT2) -> dict[str, str]:
    """The rungs this machine can run that `auto` leaves out, and why (opt-in ones are not listed)."""
    if why_unavailable("cuda_graph", caps, strategy) is None:
        return {}
    return {r.name: GRAPH_ONLY_REASON for r in LADDER
            if r.pays_with_graph and why_unavailable(r.name, caps, strategy, recipe) is None}


def declined_by_recipe(caps: Capabilities, strategy: str | None = None, recipe: Recipe = GPT2) -> dict[str, str]:
    """The rungs of `auto` for the gpt2 recipe on this machine (what `doctor` recommends) that this recipe's `auto`
    leaves out, and why: the reason `why_unavailable` gives, as for a --rungs list that names them."""
    kept = set(available_rungs(caps, strategy=strategy, recipe=recipe))
    return {name: why_unavailable(name, caps, strategy, recipe) for name in available_rungs(caps, strategy=strategy)
            if name not in kept}


def available_rungs(caps: Capabilities, opt_in: bool = False, strategy: str | None = None,
                    recipe: Recipe = GPT2) -> list[str]:
    """Every rung this machine can run, in ladder order: what `--rungs auto` climbs and `doctor` recommends.

    With `opt_in` also the rungs that did not pay where they were measured (`--rungs best` tries them,
    and measures which pay); without it, also not those that pay only inside a CUDA graph where none
    can be captured.
    """
    names = [r.name for r in LADDER
             if why_unavailable(r.name, caps, strategy, recipe) is None and (opt_in or not r.opt_in)]
    return names if opt_in else [n for n in names if n not in left_out_of_auto(caps, strategy, recipe)]


def resolve_rungs(spec: str, caps: Capabilities, strategy: str | None = None, recipe: Recipe = GPT2) -> list[str]:
    """`auto` = every rung this machine supports but the opt-in ones; `best` = all it supports (to be
    measured and decided); the others are parsed by `parse_rungs`."""
    if spec == "auto":
        return available_rungs(caps, strategy=strategy, recipe=recipe)  # the list `gpt2ladder doctor` recommends
    if spec == "best":  # the candidates; best keeps those that pay
        return available_rungs(caps, opt_in=True, strategy=strategy, recipe=recipe)
    return parse_rungs(spec)
