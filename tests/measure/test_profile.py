"""Tests for measure/profile.py and its report: the kernel-name categorizer, the attribution of step time,
the outputs."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from gpt2ladder.cli import main
from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV
from gpt2ladder.errors import UsageError
from gpt2ladder.measure import profile
from gpt2ladder.measure.profile import (
    CATEGORIES,
    STEP_MARK,
    ProfileConfig,
    attribute,
    categorize,
    run_profile,
    settled_steps,
)
from gpt2ladder.report import profile as profile_report
from gpt2ladder.runtime.hardware import detect

CPU = torch.device("cpu")
CPU_CAPS = detect(CPU)  # what a command detects once and passes down

KERNELS = [
    # the loss_kernel rung's own Triton kernels, and its custom op as the CPU profiler names it
    ("_loss_stats_kernel", "loss"),
    ("_loss_grad_kernel", "loss"),
    ("gpt2ladder::logit_grad", "loss"),
    # Inductor's Triton kernels, named after the ops they fuse
    ("triton_per_fused__log_softmax__to_copy_nll_loss_forward_1", "loss"),
    ("triton_red_fused__log_softmax_backward_data_nll_loss_backward_3", "loss"),
    ("triton_poi_fused_add_gelu_native_layer_norm_2", "elementwise"),
    ("triton_red_fused__to_copy_native_layer_norm_native_layer_norm_backward_5", "elementwise"),
    ("triton_poi_fused_gelu_gelu_backward_view_9", "elementwise"),
    ("_add_norm_bwd_kernel", "elementwise"),  # the norm_kernel rung's kernels are norms, not "other"
    ("_colsum_kernel", "elementwise"),
    ("aten::_foreach_copy_", "copies"),  # the weight_cast rung's casts, outside optimizer.step()
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<2>, at::native::(anonymous namespace)::CopyFunctor<c10::BFloat16, float, 2, 1, 1>>", "copies"),
    ("triton_poi_fused__to_copy_3", "copies"),
    ("triton_poi_fused_clone_permute_view_7", "copies"),
    ("triton_poi_fused_embedding_0", "copies"),
    ("triton_poi_fused_add_embedding_0", "elementwise"),
    ("triton_per_fused__softmax_masked_fill_mul_4", "attention"),
    ("triton_tem_fused_addmm_0", "matmul"),
    # seen on an H200 with torch 2.11: compiled manual attention, compiled cross-entropy, the fused loss
    ("triton_per_fused__softmax__softmax_backward_data__to_copy_bitwise_not_masked_fill_mul_view_14", "attention"),
    ("triton_per_fused__softmax__to_copy_bitwise_not_exp_masked_fill_mul_prepare_softmax_online_sub_view_16",
     "attention"),
    ("triton_poi_fused__log_softmax__log_softmax_backward_data__to_copy_add_arange_eq_expand_nll_loss_backward_3",
     "loss"),
    ("triton_red_fused__to_copy_arange_exp_ge_logsumexp_masked_fill_neg_scatter_add_sub_unsqueeze_view_18", "loss"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
     "attention"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#2}>(int)", "copies"),  # autocast's casts
    # cuBLAS / CUTLASS / nvjet matmuls
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel",
     "matmul"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1"
     "::Params)", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NTN", "matmul"),
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, true, false>(float*)",
     "matmul"),
    # attention kernels, including CUTLASS- and wgmma-based ones
    ("flash_fwd_kernel", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>(params)",
     "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*)", "attention"),
    # eager PyTorch kernels
    ("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", "loss"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, long>(float*)", "loss"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>(...)", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
     "elementwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const::{lambda(float)#1}>(int)", "copies"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float)", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
     "at::native::sum_functor<float, float, float>>>>(float)", "elementwise"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>()",
     "copies"),
    ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>()", "copies"),
    ("void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>(float*)", "optimizer"),
    ("Memcpy HtoD (Pageable -> Device)", "copies"),
    ("Memset (Device)", "copies"),
    ("gpt2ladder_fill_u32", "copies"),  # memset_fill's kernels, where the memsets they replace were
    # CPU operators (the CPU profile's "kernels")
    ("aten::mm", "matmul"),
    ("aten::addmm", "matmul"),
    ("aten::bmm", "matmul"),
    ("aten::native_layer_norm", "elementwise"),
    ("aten::gelu_backward", "elementwise"),
    ("aten::add", "elementwise"),
    ("aten::_log_softmax", "loss"),
    ("aten::nll_loss_forward", "loss"),
    ("aten::_softmax", "attention"),
    ("aten::masked_fill", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
    ("aten::_foreach_mul_", "optimizer"),
    ("aten::_fused_adamw_", "optimizer"),
    ("Optimizer.step#AdamW.step", "optimizer"),
    ("aten::copy_", "copies"),
    ("aten::transpose", "copies"),
    ("aten::embedding_dense_backward", "copies"),
    ("aten::empty_strided", "other"),
    ("autograd::engine::evaluate_function: MmBackward0", "other"),
    ("NllLossBackward0", "other"),
    ("## Call CompiledFxGraph fxdtkaujq5vjm2owinjjqanm3wxzqec4tsbrw6maz ##", "elementwise"),
    ("some_kernel_nobody_has_heard_of", "other"),
]


@pytest.mark.parametrize("name, category", KERNELS, ids=[k[0][:60] for k in KERNELS])
def test_categorize(name, category):
    assert categorize(name) == category


def test_every_rule_names_a_known_category():
    assert {c for c, _ in profile.RULES} <= set(CATEGORIES) - {"idle"}


# --- attribution, on synthetic profiler events --------------------------------------------------


def _event(name, start, end, device=DeviceType.CUDA, *, id=0, parent=None, self_us=None, annotation=False):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                           id=id, cpu_parent=parent, is_async=False, is_user_annotation=annotation,
                           self_cpu_time_total=(end - start) if self_us is None else self_us)


def test_gpu_time_is_split_by_kernel_with_idle_the_uncovered_rest():
    cpu = DeviceType.CPU
    step_op = _event("Optimizer.step#AdamW.step", 50, 60, cpu, id=7)
    mul = _event("aten::mul_", 51, 52, cpu, id=8, parent=step_op)
    events = [
        _event(STEP_MARK, 0, 100, cpu), _event(STEP_MARK, 200, 300, cpu), step_op, mul,
        # record_function ranges mirrored on the GPU timeline: neither step time nor kernel time
        _event(STEP_MARK, 5, 98, annotation=True), _event("Optimizer.step#AdamW.step", 70, 80, annotation=True),
        _event("sm90_xmma_gemm_bf16", 10, 40),  # 30 us matmul
        _event("flash_fwd_kernel", 30, 50),  # overlaps the gemm by 10 us (another stream)
        _event("void at::native::vectorized_elementwise_kernel<4, AddFunctor>", 70, 80, id=30),  # optimizer's
        _event("triton_poi_fused_add_gelu_2", 210, 250),
        _event("Memcpy HtoD (Pageable -> Device)", 150, 160),  # between steps: not part of a step
        _event("triton_poi_fused__to_copy_3", 290, 320),  # runs past the step's end: clipped to 10 us
    ]
    result = attribute(events, on_gpu=True, steps=2, links={30: 8})
    ms = result["categories_ms"]
    assert result["ms_per_step"] == pytest.approx(0.1)  # 200 us over 2 steps
    assert ms["matmul"] == pytest.approx(0.015) and ms["attention"] == pytest.approx(0.010)
    assert ms["optimizer"] == pytest.approx(0.005)  # named elementwise, launched inside optimizer.step
    assert ms["elementwise"] == pytest.approx(0.020) and ms["copies"] == pytest.approx(0.005)
    busy = (50 - 10) + 10 + 40 + 10  # the union: the overlap counts once
    assert result["busy_ms"] == pytest.approx(busy / 2000)
    assert ms["idle"] == pytest.approx((200 - busy) / 2000)
    assert result["top_kernels"][0]["name"] == "triton_poi_fused_add_gelu_2"


def test_cpu_time_is_operator_self_time():
    cpu = DeviceType.CPU
    mark = _event(STEP_MARK, 0, 100, cpu, self_us=10)
    linear = _event("aten::linear", 0, 50, cpu, parent=mark, self_us=5)
    events = [mark, linear, _event("aten::addmm", 1, 46, cpu, parent=linear),
              _event("aten::gelu", 50, 80, cpu, parent=mark), _event("aten::add", 500, 600, cpu)]  # last: outside
    result = attribute(events, on_gpu=False, steps=1)
    ms = result["categories_ms"]
    assert ms["matmul"] == pytest.approx(0.050) and ms["elementwise"] == pytest.approx(0.030)
    assert ms["idle"] == pytest.approx(0.020) and sum(ms.values()) == pytest.approx(result["ms_per_step"])


def test_union_length_counts_overlaps_once():
    assert profile._union_length([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25


# --- a real profile on CPU ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def record(shakespeare_cache, module_tmp):
    trace_dir = module_tmp("traces")
    cfg = ProfileConfig(rungs=("baseline", "tf32", "flash"), batch_size=2, seq_len=32, steps=2, warmup=1,
                        compile_backend="eager", trace_dir=str(trace_dir))
    return run_profile(cfg, CPU, progress=False, caps=CPU_CAPS)


def test_cpu_profile_of_two_rungs(record):
    rows = {r["name"]: r for r in record["rungs"]}
    assert rows["tf32"]["status"] == "skipped" and "CUDA" in rows["tf32"]["reason"]
    for name in ("baseline", "flash"):
        r = rows[name]
        assert r["status"] == "ok" and set(r["categories_ms"]) == set(CATEGORIES)
        total = sum(r["categories_ms"].values())
        assert total == pytest.approx(r["ms_per_step"], rel=0.05)
        assert total == pytest.approx(r["clock_ms_per_step"], rel=0.25)  # an independent clock agrees
        for category in ("matmul", "attention", "loss", "optimizer", "elementwise"):
            assert r["categories_ms"][category] > 0, (name, category)
        assert r["categories_ms"]["idle"] < 0.5 * r["ms_per_step"]
        tops = [k["ms_per_step"] for k in r["top_kernels"]]
        assert 0 < len(tops) <= profile.TOP_KERNELS and tops == sorted(tops, reverse=True)
    assert rows["flash"]["setup"]["attention"] == "sdpa"


def test_profile_outputs_are_written(record, tmp_path):
    paths = profile_report.write_outputs(record, tmp_path)
    saved = json.loads(paths[0].read_text())
    for key in ("git_sha", "versions", "device", "config", "categories", "rules", "rungs"):
        assert key in saved
    md = paths[1].read_text()
    assert "| baseline |" in md and "top kernels" in md and "skipped: TF32" in md
    png = paths[2].read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "matmul" in profile_report.format_table(record)


def test_chrome_traces_are_written_per_rung(record):
    trace_dir = record["config"]["trace_dir"]
    for name in ("baseline", "flash"):
        trace = json.loads(open(f"{trace_dir}/trace-{name}.json").read())
        assert any(e.get("name") == STEP_MARK for e in trace["traceEvents"])


def test_command_writes_the_files(shakespeare_cache, tmp_path, capsys):
    args = ["profile", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--steps", "1",
            "--warmup", "0", "--batch-size", "2", "--seq-len", "16", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 0
    assert "matmul" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} >= {"profile.json", "profile.md", "profile.png"}
    assert not list(tmp_path.glob("trace-*.json"))  # traces only with --trace


def test_last_only_profiles_the_top_rung_named_as_the_set_it_measures(shakespeare_cache, tmp_path, monkeypatch):
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")
    args = ["profile", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline,compile,tf32", "--last-only",
            "--steps", "1", "--warmup", "0", "--batch-size", "2", "--seq-len", "16", "--out", str(tmp_path),
            "--no-progress"]
    assert main(args) == 0
    record = json.loads((tmp_path / "profile.json").read_text())
    rows = record["rungs"]
    assert record["config"]["compile_backend"] == "eager"
    # tf32 cannot run on a CPU, so the top of what can run is compile, with baseline under it
    assert [(r["name"], r["status"], r["applied"]) for r in rows] == [("baseline..compile", "ok",
                                                                       ["baseline", "compile"])]
    assert "baseline, compile" in rows[0]["summary"]
    assert profile_report.format_table(record).splitlines()[1].startswith("baseline..compile")


def test_profile_of_only_skipped_rungs_fails_in_one_line(shakespeare_cache, tmp_path, capsys):
    args = ["profile", "--device", "cpu", "--preset", "tiny", "--rungs", "tf32,cuda_graph", "--steps", "1",
            "--warmup", "0", "--batch-size", "2", "--seq-len", "16", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no rung could be measured: tf32 skipped" in err
    assert (tmp_path / "profile.json").exists()  # the rows with their reasons are still written


def _warmup(*compiled):
    return [{"ms": 100.0 * (i + 1), "compiled": c} for i, c in enumerate(compiled)]


def test_the_unprofiled_time_comes_from_the_later_steps_after_the_first_and_the_last_compile():
    assert settled_steps(_warmup(False, False, False, False)) == [300.0, 400.0]
    assert settled_steps(_warmup(True, False, False, False, False)) == [400.0, 500.0]
    assert settled_steps(_warmup(True, True, False)) == [300.0]
    assert settled_steps(_warmup(False, False, True)) == [] and settled_steps([]) == []
    # The first step is cold without a compile too (a CPU's, an eager rung's): alone, it gives no figure.
    assert settled_steps(_warmup(False)) == [] and settled_steps(_warmup(False, False)) == [200.0]


def test_one_warm_up_step_of_an_eager_rung_gives_no_unprofiled_time(shakespeare_cache):
    cfg = ProfileConfig(rungs=("baseline",), batch_size=2, seq_len=16, steps=1, warmup=1)
    record = run_profile(cfg, CPU, progress=False, caps=CPU_CAPS)
    (row,) = record["rungs"]
    assert not row["warmup_steps"][0]["compiled"] and row["unprofiled_ms_per_step"] is None
    table = profile_report.format_table(record)
    assert table.splitlines()[1].split()[-1] == "n/a"
    assert ("'unprofiled' = median of the later warm-up steps after the first and after the last one that compiled, "
            "without the profiler; n/a: no warm-up step came after those, raise --warmup") in table


def test_profile_names_the_recipe_and_the_rungs_it_leaves_out_of_auto(shakespeare_cache, tmp_path, capsys,
                                                                       monkeypatch):
    from gpt2ladder.model.recipe import parse_recipe

    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")
    monkeypatch.setattr("gpt2ladder.commands.profile.detect", lambda device: dataclasses.replace(
        CPU_CAPS, compile_problem=None))  # a CPU where the model compiles: auto holds tied_grad
    args = ["profile", "--device", "cpu", "--preset", "tiny", "--recipe", "speedrun", "--rungs", "auto",
            "--last-only", "--steps", "1", "--warmup", "1", "--batch-size", "2", "--seq-len", "16",
            "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"gpt2ladder profile: tiny on {CPU_CAPS.name}, recipe speedrun, batch 2 x 16, 1 profiled "
                             "step after 1 warm-up, rungs: baseline, compile, flash, vocab, fused_adamw, fused_loss")
    assert out[1] == ("notice: leaving out rung tied_grad: the tied_grad rung's graph pass is written for GPT-2's own "
                      "Blocks; recipe speedrun changes them")
    md = (tmp_path / "profile.md").read_text().splitlines()
    assert md[0] == f"# gpt2ladder profile: tiny on {CPU_CAPS.name}, recipe speedrun"
    assert md[2].startswith("- batch 2 x 16, 1 profiled step after 1 warm-up; categories by ")


def test_a_compiled_rung_is_timed_unprofiled_only_after_compiling(shakespeare_cache):
    cfg = ProfileConfig(rungs=("baseline", "compile"), batch_size=2, seq_len=16, steps=1, warmup=2,
                        compile_backend="eager")
    plain, compiled = run_profile(cfg, CPU, progress=False, caps=CPU_CAPS)["rungs"]
    assert [s["compiled"] for s in plain["warmup_steps"]] == [False, False]
    assert [s["compiled"] for s in compiled["warmup_steps"]] == [True, False]
    assert compiled["unprofiled_ms_per_step"] == compiled["warmup_steps"][1]["ms"]
    assert compiled["unprofiled_steps"] == 1
    # One warm-up step, and it compiles: no step to take the figure from, so none is given.
    record = run_profile(dataclasses.replace(cfg, warmup=1, last_only=True), CPU, progress=False, caps=CPU_CAPS)
    (row,) = record["rungs"]
    assert row["warmup_steps"][0]["compiled"] and row["unprofiled_ms_per_step"] is None
    table = profile_report.format_table(record)
    assert table.splitlines()[1].split()[-1] == "n/a" and "raise --warmup" in table


def test_config_rejects_bad_values():
    with pytest.raises(UsageError, match="--warmup"):
        ProfileConfig(warmup=-1)
    with pytest.raises(UsageError, match="block size"):
        ProfileConfig(seq_len=10_000)


def test_the_profilers_own_log_lines_stay_out_of_the_output(shakespeare_cache, tmp_path, capfd):
    assert main(["profile", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2",
                 "--seq-len", "16", "--steps", "1", "--warmup", "1", "--out", str(tmp_path), "--no-progress"]) == 0
    out, err = capfd.readouterr()
    assert "profiler_start" not in out + err and "ms/step" in out
