"""`doctor` decides from a Capabilities record alone: simulated machines, then the real one end to end."""

import dataclasses
import io
import json

import pytest
import torch

from gpt2ladder.cli import main
from gpt2ladder.ladder import LADDER, resolve_rungs, setup_for, why_unavailable
from gpt2ladder.measure.doctor import (
    diagnose,
    feature_checks,
    recommended_rungs,
    sdpa_checks,
)
from gpt2ladder.measure.harness import climb
from gpt2ladder.model.recipe import GPT2
from gpt2ladder.report import doctor as doctor_report
from gpt2ladder.report.doctor import marks_for
from gpt2ladder.runtime.hardware import (
    WINDOWS_TRITON_INSTALL,
    Capabilities,
    compile_problem,
    detect,
)


def gpu(name, cc, os="Linux", triton="3.6.0", **kw):
    """A simulated CUDA machine; compile_problem comes from the real rule, so the chain is tested."""
    return Capabilities("cuda", name, cc, 80 * 2**30,
                        compile_problem("cuda", os, triton, capability=cc, cc="gcc"), os=os,
                        triton_version=triton, torch_version="2.11.0", cuda_version="13.0", **kw)


CPU = Capabilities("cpu", "cpu (x86_64)", compile_problem=None, cxx_compiler="g++")
T4 = gpu("Tesla T4", (7, 5))
A100 = gpu("NVIDIA A100-SXM4-80GB", (8, 0))
H100 = gpu("NVIDIA H100 80GB HBM3", (9, 0))
H200 = gpu("NVIDIA H200", (9, 0))
NO_TRITON = gpu("NVIDIA H200", (9, 0), triton=None)
WINDOWS = gpu("NVIDIA GeForce RTX 5070", (12, 0), os="Windows", triton=None)
WINDOWS_TRITON = gpu("NVIDIA GeForce RTX 5070", (12, 0), os="Windows", triton="3.8.0")
MPS = Capabilities("mps", "Apple GPU, mps (arm64)", os="Darwin")
MACHINES = [CPU, T4, A100, H100, H200, NO_TRITON, WINDOWS, WINDOWS_TRITON, MPS]


def usable(caps):
    return {c.key: c.usable for c in feature_checks(caps)}


@pytest.mark.parametrize("caps,expected", [
    (CPU, dict(tf32=False, bf16=False, fp16=False, fp8=False, compile=True, cuda_graphs=False)),
    (T4, dict(tf32=False, bf16=False, fp16=True, fp8=False, compile=True, cuda_graphs=True)),
    (A100, dict(tf32=True, bf16=True, fp16=True, fp8=False, compile=True, cuda_graphs=True)),
    (H100, dict(tf32=True, bf16=True, fp16=True, fp8=True, compile=True, cuda_graphs=True)),
    (NO_TRITON, dict(tf32=True, bf16=True, fp16=True, fp8=False, compile=False, cuda_graphs=True)),
    (MPS, dict(tf32=False, bf16=False, fp16=False, fp8=False, compile=True, cuda_graphs=False)),
])
def test_features_per_machine(caps, expected):
    assert usable(caps) == expected
    for check in feature_checks(caps):
        assert check.reason and len(check.reason.splitlines()) == 1


def test_every_rung_skipped_here_is_skipped_for_a_reason_naming_itself_or_what_it_needs():
    """proj_bias is skipped for its own reason, not norm_kernel's; tied_grad's line is one sentence."""
    reason = why_unavailable("proj_bias", CPU)
    assert "proj_bias" in reason and "norm_kernel" not in reason
    tied = next(r for r in LADDER if r.name == "tied_grad").summary
    assert tied.count(". ") == 0 and tied.endswith(".")  # one sentence; docs/rungs.md says the rest


def test_pre_ampere_offers_fp16_with_a_grad_scaler_instead_of_bf16():
    reasons = {c.key: c.reason for c in feature_checks(T4)}
    assert "8.0" in reasons["bf16"] and "7.5" in reasons["bf16"] and "Tesla T4" in reasons["bf16"]
    assert "8.0" in reasons["tf32"]
    assert "GradScaler" in reasons["fp16"] and "no bfloat16" in reasons["fp16"]
    rungs = recommended_rungs(T4)
    assert "fp16" in rungs and "bf16" not in rungs and "tf32" not in rungs
    # the fused loss forms its gradient before the GradScaler scales it: not with fp16
    assert "fused_loss" not in rungs and "GradScaler" in why_unavailable("fused_loss", T4)
    assert setup_for(rungs).autocast == "float16"


def test_fp16_rung_sits_after_bf16_and_only_runs_without_bf16():
    names = [r.name for r in LADDER]
    assert names.index("fp16") == names.index("bf16") + 1
    assert next(r for r in LADDER if r.name == "fp16").kind == "precision"
    for caps in (A100, H200, CPU, MPS):
        assert "fp16" not in recommended_rungs(caps)
    assert "runs the bf16 rung" in why_unavailable("fp16", A100)
    assert "uses bf16" in {c.key: c.reason for c in feature_checks(A100)}["fp16"]


def test_pre_ampere_bench_reports_bf16_skipped_with_the_reason():
    row = climb(("baseline", "bf16"), lambda name: why_unavailable(name, T4))[1].skipped()
    assert row["status"] == "skipped" and "compute capability 8.0" in row["reason"] and "7.5" in row["reason"]


def test_ampere_and_hopper():
    gpt2 = [r for r in LADDER if not r.declines(GPT2)]  # the rotary kernels act on a modern recipe's parts only
    assert recommended_rungs(A100) == [r.name for r in gpt2
                                       if r.name not in ("fp16", "fp8_head", "fp8_fc", "fp8_dgrad") and not r.opt_in]
    assert "8.9" in {c.key: c.reason for c in feature_checks(A100)}["fp8"]
    assert recommended_rungs(H100) == recommended_rungs(H200) == [r.name for r in gpt2
                                                                  if r.name != "fp16" and not r.opt_in]


def test_no_triton_skips_every_rung_that_compiles_with_the_install_hint():
    reason = {c.key: c.reason for c in feature_checks(NO_TRITON)}["compile"]
    assert "Triton" in reason and "pip install triton" in reason
    rungs = recommended_rungs(NO_TRITON)
    assert "compile" not in rungs and "fused_loss" not in rungs and "fp8_head" not in rungs
    assert "fp8_fc" not in rungs and "fp8_dgrad" not in rungs
    assert {"tf32", "bf16", "flash", "vocab", "cuda_graph"} <= set(rungs)


def test_windows_without_triton_shows_the_exact_install_line():
    line = 'pip install -U "triton-windows>=3.8,<3.9"'
    assert line == WINDOWS_TRITON_INSTALL
    assert line in {c.key: c.reason for c in feature_checks(WINDOWS)}["compile"]
    assert line in doctor_report.format_report(diagnose(WINDOWS))
    assert line in diagnose(WINDOWS)["features"]["compile"]["reason"]
    assert "compile" not in recommended_rungs(WINDOWS)


def test_windows_with_triton_windows_installed():
    check = {c.key: c for c in feature_checks(WINDOWS_TRITON)}["compile"]
    assert check.usable and "triton-windows 3.8.0" in check.reason
    assert "compile" in recommended_rungs(WINDOWS_TRITON)


def test_cpu_without_a_compiler():
    caps = Capabilities("cpu", "cpu", compile_problem=compile_problem("cpu", "Linux", None, None))
    assert "C++ compiler" in {c.key: c.reason for c in feature_checks(caps)}["compile"]
    assert recommended_rungs(caps) == ["baseline", "flash", "vocab", "fused_adamw"]


@pytest.mark.parametrize("caps", MACHINES)
def test_doctor_recommends_exactly_what_rungs_auto_runs(caps):
    assert recommended_rungs(caps) == resolve_rungs("auto", caps)
    assert diagnose(caps)["recommended_rungs"] == resolve_rungs("auto", caps)


def test_attention_kernels_come_from_the_probe():
    assert {c.usable for c in sdpa_checks(T4)} == {None}  # nothing probed: not known, not guessed
    probed = Capabilities("cuda", "Tesla T4", (7, 5), sdpa=(
        ("flash", "Flash attention only supports gpu architectures in the range [sm80, sm90]"),
        ("mem_efficient", None), ("cudnn", "cuDNN attention needs sm80 or newer"), ("math", None)))
    checks = {c.key: c for c in sdpa_checks(probed)}
    assert not checks["flash"].usable and "sm80" in checks["flash"].reason
    assert checks["mem_efficient"].usable and checks["math"].usable
    assert checks["cudnn"].label == "cuDNN" and checks["mem_efficient"].label == "memory-efficient"


@pytest.mark.parametrize("caps", MACHINES)
def test_report_is_aligned_and_json_ready(caps):
    text = doctor_report.format_report(diagnose(caps))
    json.dumps(diagnose(caps))  # serialisable as it is
    features = text.split("\nfeatures\n")[1].split("\n\n")[0].splitlines()
    assert len(features) == 6
    starts = {line.index(c.reason) for line, c in zip(features, feature_checks(caps))}
    assert len(starts) == 1  # every reason starts in the same column
    assert (f"recommended for the gpt2 recipe (what --rungs auto runs; another --recipe may leave some out, and says "
            f"which): {','.join(recommended_rungs(caps))}") in text


def test_marks_fall_back_to_words_where_the_terminal_cannot_show_ticks():
    assert marks_for(io.TextIOWrapper(io.BytesIO(), encoding="utf-8")) == ("✓", "✗", "?")
    assert marks_for(io.TextIOWrapper(io.BytesIO(), encoding="cp1252")) == ("yes", "no", "?")
    assert "  no  TF32" in doctor_report.format_report(diagnose(CPU), ("yes", "no", "?"))


def test_doctor_json_on_this_machine(capsys):
    assert main(["doctor", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    caps = detect(torch.device("cpu"))
    assert report["device"]["type"] == "cpu" and report["versions"]["torch"] == torch.__version__
    assert report["recommended_rungs"] == resolve_rungs("auto", caps)
    backends = report["sdpa"]["backends"]
    assert backends["math"]["usable"] is True and backends["mem_efficient"]["usable"] is False
    assert set(report["features"]) == {"tf32", "bf16", "fp16", "fp8", "compile", "cuda_graphs"}


def test_doctor_human_report_on_this_machine(capsys):
    assert main(["doctor", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpt2ladder doctor") and "versions   Python" in out and torch.__version__ in out
    assert "attention kernels behind the flash rung (causal, float32, head size 64)" in out
    assert ("recommended for the gpt2 recipe (what --rungs auto runs; another --recipe may leave some out, and says "
            "which): baseline,") in out


def test_doctor_reports_free_disk_for_the_data_cache(capsys, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "not" / "made" / "yet"))
    assert main(["doctor", "--device", "cpu", "--json"]) == 0
    disk = json.loads(capsys.readouterr().out)["data_cache"]
    usage = shutil.disk_usage(tmp_path)  # measured where the cache would be made
    assert disk["path"] == str(tmp_path / "not" / "made" / "yet") and disk["total_bytes"] == usage.total
    assert 0 < disk["free_bytes"] <= usage.total
    assert main(["doctor", "--device", "cpu"]) == 0
    assert f"data cache {tmp_path / 'not' / 'made' / 'yet'}: " in capsys.readouterr().out


@pytest.mark.parametrize("gib, line", [
    (4, "train: 16,384 tokens per step as micro-batch 1 x 16 accumulation steps, without a CUDA graph (it would not "
        "fit beside the step)"),
    (8, "train: 16,384 tokens per step as micro-batch 4 x 4 accumulation steps\n"),
    (80, "train: 16,384 tokens per step as micro-batch 16 x 1 accumulation step\n"),
])
def test_doctor_says_what_train_does_on_a_small_card(gib, line):
    """The micro-batch and graph `train` chooses (`plan_training`), for a card of `gib` GiB."""
    caps = dataclasses.replace(gpu("NVIDIA H100 PCIe", (9, 0)), total_memory=gib * 2**30)
    report = diagnose(caps)
    assert report["memory"]["memory_bytes"] == (gib - 0.5) * 2**30
    assert report["memory"]["train"]["cuda_graph_left_out"] == (gib == 4)
    assert line in doctor_report.format_report(report) + "\n"
