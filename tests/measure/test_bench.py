"""The bench climbs the ladder end to end and writes a sane table, JSON, Markdown and chart."""

import json

import pytest
import torch

from gpt2ladder.cli import main
from gpt2ladder.errors import UsageError
from gpt2ladder.measure.bench import BenchConfig, add_speedups, run_bench
from gpt2ladder.measure.best import decide
from gpt2ladder.runtime.hardware import detect

CPU = torch.device("cpu")
CPU_CAPS = detect(CPU)  # what a command detects once and passes down


@pytest.fixture(scope="module")
def record(shakespeare_cache):
    cfg = BenchConfig(preset="tiny", rungs=("baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw",
                                            "fused_loss", "fp8_head", "loss_kernel", "cuda_graph", "bf16_residual",
                                            "gelu_kernel", "fp32_wgrad"),
                      batch_size=2, seq_len=32, steps=3, warmup=1, compile_backend="eager")
    return run_bench(cfg, CPU, progress=False, caps=CPU_CAPS)


def test_record_describes_itself(record):
    assert record["device"]["type"] == "cpu"
    assert record["versions"]["torch"] == torch.__version__
    assert record["config"]["batch_size"] == 2 and record["model"]["n_layer"] == 2
    assert record["data"]["source"] == "tinyshakespeare" and record["data"]["n_tokens"] == 338_025
    assert "git_sha" in record and record["date"]


def test_cpu_rows_are_measured_or_skipped_with_a_reason(record):
    status = {r["name"]: r["status"] for r in record["rungs"]}
    assert status == {"baseline": "ok", "tf32": "skipped", "bf16": "skipped", "compile": "ok", "flash": "ok",
                      "vocab": "ok", "fused_adamw": "ok", "fused_loss": "ok", "fp8_head": "skipped",
                      "loss_kernel": "skipped", "cuda_graph": "skipped", "bf16_residual": "skipped",
                      "gelu_kernel": "skipped", "fp32_wgrad": "skipped"}
    for r in record["rungs"]:
        if r["status"] == "skipped":
            assert "CUDA" in r["reason"] or "cuda" in r["reason"]


def test_measured_rows_have_sane_numbers(record):
    for r in (r for r in record["rungs"] if r["status"] == "ok"):
        assert 0 < r["ms_p10"] <= r["ms_per_step"] <= r["ms_p90"]
        assert r["ms_min"] <= r["ms_p10"] and r["ms_p90"] <= r["ms_max"]
        assert r["n_timed"] == 3 and len(r["samples_ms"]) == 3
        assert r["tokens_per_s"] == pytest.approx(2 * 32 / (r["ms_per_step"] / 1000))
        assert 9.0 < r["loss"] < 11.5  # a few steps from ln(50257) = 10.8
        assert r["mfu"] is None  # no known peak for a CPU
        assert r["weight_dtype"] == "float32" and r["logits_dtype"] == "float32"


def test_every_fp32_rung_trains_the_same_model(record):
    """Same seed, same batches, same function: on CPU in fp32 every measured rung ends at the same loss."""
    losses = [r["loss"] for r in record["rungs"] if r["status"] == "ok"]
    assert max(losses) - min(losses) < 1e-3


def _row(name, ms, spread=0.5, status="ok"):
    return {"name": name, "status": status, "ms_per_step": ms, "ms_p10": ms - spread, "ms_p90": ms + spread}


def test_speedups_and_noise():
    rows = [_row("a", 100.0), {"name": "s", "status": "skipped"}, _row("b", 50.0), _row("c", 49.8), _row("d", 40.0)]
    add_speedups(rows)
    assert rows[0]["speedup_vs_baseline"] == 1 and rows[0]["speedup_vs_prev"] is None
    assert rows[2]["speedup_vs_prev"] == 2 and rows[4]["speedup_vs_baseline"] == 2.5
    assert [rows[i]["within_noise_of_prev"] for i in (0, 2, 3, 4)] == [None, False, True, False]


def test_best_keeps_only_rungs_that_pay_outside_the_noise():
    rows = [_row("a", 40.0), _row("b", 30.0), _row("c", 30.5), {"name": "d", "status": "skipped", "reason": "x"},
            _row("e", 25.0), _row("f", 24.0, spread=1.0)]  # f: 1.04x, but its p10-p90 overlaps e's
    kept, decisions = decide(rows)
    assert kept == ["a", "b", "e"]
    assert [d["kept"] for d in decisions] == [True, True, False, False, True, False]
    assert "within noise" in decisions[5]["why"]


def test_best_never_keeps_a_rung_that_fails_parity_however_fast(monkeypatch):
    import dataclasses

    from gpt2ladder.measure import best

    failing = dataclasses.replace(best.RUNGS_BY_NAME["fp8_proj"], parity_failure="its val loss left the rule")
    monkeypatch.setitem(best.RUNGS_BY_NAME, "fp8_proj", failing)
    rows = [_row("cuda_graph", 30.0), _row("fp8_proj", 20.0),  # 1.5x faster, and the wrong loss
            _row("fp8_forward", 15.0)]
    kept, decisions = decide(rows)
    assert kept == ["cuda_graph", "fp8_forward"]
    assert "fails parity" in decisions[1]["why"] and not decisions[1]["kept"]


def test_best_says_what_it_kept_and_why_it_dropped_the_others():
    from gpt2ladder.measure.best import best_summary

    rows = [_row("baseline", 40.0), _row("compile", 60.0), _row("best", 41.0)]
    record = {"rungs": rows, "best": {"rungs": ["baseline"], "decisions": decide(rows[:2])[1]}}
    text = best_summary(record)
    assert "kept: baseline" in text and "dropped compile: 0.667x" in text and "slower than it" in text


def test_cli_writes_table_json_markdown_and_png(shakespeare_cache, tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["bench", "--rungs", "baseline,flash,vocab", "--batch-size", "2", "--seq-len", "32", "--steps", "2",
                 "--warmup", "1", "--out", str(out), "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    assert "ms/step" in text and "baseline" in text and "vocab" in text
    record = json.loads((out / "ladder.json").read_text())
    assert [r["name"] for r in record["rungs"]] == ["baseline", "flash", "vocab"]
    assert all(r["status"] == "ok" and r["ms_per_step"] > 0 for r in record["rungs"])
    md = (out / "ladder.md").read_text()
    assert "| baseline |" in md and "| vocab |" in md
    assert "partial" not in md
    assert (out / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_rung_is_printed_and_kept_as_it_finishes(shakespeare_cache, tmp_path, capsys):
    """A long bench that is cut off still leaves the rungs it measured in ladder.json (partial: true)."""
    seen = []

    def on_row(record):
        seen.append([r["name"] for r in record["rungs"]])
        assert record["partial"] is True and list(record["config"]["rungs"]) == ["baseline", "flash", "vocab"]

    cfg = BenchConfig(preset="tiny", rungs=("baseline", "flash", "vocab"), batch_size=2, seq_len=32, steps=2,
                      warmup=1, compile_backend="eager")
    final = run_bench(cfg, CPU, progress=False, caps=CPU_CAPS, on_row=on_row)
    assert seen == [["baseline"], ["baseline", "flash"], ["baseline", "flash", "vocab"]]
    assert final["partial"] is False

    from gpt2ladder.commands.bench import _row_writer

    write = _row_writer(tmp_path)
    (tmp_path / "ladder.md").write_text("an earlier run's table")
    write({**final, "partial": True, "rungs": final["rungs"][:1]})
    write({**final, "partial": True, "rungs": final["rungs"][:2]})
    assert not (tmp_path / "ladder.md").exists()  # no table that disagrees with the partial json
    kept = json.loads((tmp_path / "ladder.json").read_text())
    assert kept["partial"] is True and [r["name"] for r in kept["rungs"]] == ["baseline", "flash"]
    header, first, second = capsys.readouterr().out.strip().splitlines()  # the table once, a row at a time
    assert header.startswith("rung") and first.startswith("baseline") and second.startswith("flash")
    assert header.index("ms/step") == first.index(first.split()[1])  # columns line up under the header
    from gpt2ladder.report.bench import format_markdown

    assert "- partial: the run stopped" in format_markdown(kept)


def test_bad_bench_config():
    with pytest.raises(UsageError, match="block size"):
        BenchConfig(preset="tiny", seq_len=257)
    with pytest.raises(UsageError, match="positive"):
        BenchConfig(preset="tiny", steps=0)


@pytest.mark.slow
def test_the_default_bench_climbs_the_write_ups_ladder(shakespeare_cache, tmp_path, monkeypatch, capsys):
    """The README's main job as a user runs it, with no flags (compile through the eager backend here, and
    2 timed steps after 1 warm-up in the defaults table instead of 10 after 3: the same run, shorter)."""
    from gpt2ladder.commands.defaults import DEFAULTS

    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    monkeypatch.setitem(DEFAULTS["bench"], "cpu", {**DEFAULTS["bench"]["cpu"], "steps": 2, "warmup": 1})
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--no-progress"]) == 0
    record = json.loads((tmp_path / "runs" / "bench" / "ladder.json").read_text())  # the default --out
    assert record["config"]["preset"] == "tiny" and record["config"]["batch_size"] == 4
    assert record["config"]["seq_len"] == 128 and (record["config"]["steps"], record["config"]["warmup"]) == (2, 1)
    assert capsys.readouterr().out.count("\nbaseline ") == 1  # the table is printed once
    assert [r["name"] for r in record["rungs"] if r["status"] == "ok"] == ["baseline", "compile", "flash", "vocab"]


def test_last_only_times_just_the_top_rung(shakespeare_cache):
    cfg = BenchConfig(preset="tiny", rungs=("baseline", "tf32", "compile", "flash"), batch_size=2, seq_len=32,
                      steps=2, warmup=1, compile_backend="eager", last_only=True)
    rows = run_bench(cfg, CPU, progress=False, caps=CPU_CAPS)["rungs"]
    assert [r["name"] for r in rows] == ["flash"]  # tf32 cannot run on a CPU, the rest stack up
    assert rows[0]["status"] == "ok" and rows[0]["setup"]["compile"] and rows[0]["setup"]["attention"] == "sdpa"
    assert rows[0]["setup"]["matmul_precision"] == "highest"


def test_from_times_the_rungs_from_there_on_with_the_ones_before_applied(shakespeare_cache, tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["bench", "--rungs", "baseline,tf32,flash,vocab,fused_adamw", "--from", "vocab", "--batch-size", "2",
                 "--seq-len", "32", "--steps", "2", "--warmup", "1", "--out", str(out), "--no-progress"])
    assert code == 0
    record = json.loads((out / "ladder.json").read_text())
    rows = record["rungs"]
    assert [r["name"] for r in rows] == ["vocab", "fused_adamw"] and record["config"]["start"] == "vocab"
    assert rows[0]["setup"]["attention"] == "sdpa" and rows[0]["setup"]["matmul_precision"] == "highest"  # no tf32
    assert rows[0]["speedup_vs_baseline"] == 1.0 and rows[1]["setup"]["fused_adamw"]
    assert "- timed from vocab on: the rungs before it applied, not timed" in (out / "ladder.md").read_text()
    text = capsys.readouterr().out
    assert "\nbaseline " not in text and "\nflash " not in text


def test_from_with_last_only_times_that_rung_and_the_top():
    from gpt2ladder.measure.harness import climb

    names = ["baseline", "tf32", "flash", "vocab", "fused_adamw", "fused_loss"]
    why_not = {"tf32": "no TF32 here", "fused_loss": "not here"}.get
    rows = climb(names, why_not, last_only=True, start="flash")
    assert [(r.name, r.applied) for r in rows] == [("flash", ("baseline", "flash")),
                                                   ("fused_adamw", ("baseline", "flash", "vocab", "fused_adamw"))]
    assert all(r.reason is None for r in rows)  # the top under its own name, though the last named cannot run
    assert [r.name for r in climb(names, why_not, last_only=True, start="fused_loss")] == ["fused_adamw"]
    # nothing after the start can run: one row, not the same row twice
    assert [r.name for r in climb(names, why_not, last_only=True, start="fused_adamw")] == ["fused_adamw"]
    assert [r.name for r in climb(names, why_not, last_only=True)] == ["fused_adamw"]  # without --from: the top
    assert [r.name for r in climb(names, why_not, start="vocab")] == ["vocab", "fused_adamw", "fused_loss"]


def test_best_batch_candidates_are_fractions_of_the_largest_fit():
    from gpt2ladder.measure.batch import batch_candidates

    assert batch_candidates(232) == [232, 168, 112, 80, 56]  # multiples of 8 from 16 up
    assert batch_candidates(8) == [8, 6, 4, 3, 2]
    assert batch_candidates(1) == [1]
    assert all(b <= 100 for b in batch_candidates(100)) and len(set(batch_candidates(100))) == 5


def test_best_batch_keeps_the_size_with_the_most_tokens_per_second(shakespeare_cache, tmp_path, monkeypatch, capsys):
    """Each candidate is timed at the top rung; the record is the winner's, with every size tried."""
    import dataclasses

    import gpt2ladder.commands.bench as command
    import gpt2ladder.measure.bench as bench

    # On a GPU the memory plan gives the largest size; here, on a CPU, 8 stands in for it.
    monkeypatch.setattr(command, "_choose_batch",
                        lambda request, *a: (dataclasses.replace(request.cfg, batch_size=8), None))
    real = bench._timed_steps

    def timed_steps(engine, batches, cfg, *args, **kwargs):
        if cfg.batch_size == 6:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        samples, losses = real(engine, batches, cfg, *args, **kwargs)
        return [s + (1e5 if cfg.batch_size == 8 else 0.0) for s in samples], losses  # 8 fits but is (very) slow

    monkeypatch.setattr(bench, "_timed_steps", timed_steps)
    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    code = main(["bench", "--batch-size", "best", "--rungs", "baseline,compile", "--last-only", "--seq-len", "32",
                 "--steps", "2", "--warmup", "1", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    record = json.loads((tmp_path / "ladder.json").read_text())
    search = record["batch_search"]
    assert [t["batch_size"] for t in search["tried"]] == [8, 6, 4, 3, 2]
    assert [t["status"] for t in search["tried"]] == ["ok", "oom", "ok", "ok", "ok"]
    measured = [t for t in search["tried"] if t["status"] == "ok"]
    fastest = max(measured, key=lambda t: t["tokens_per_s"])
    assert search["chosen"] == fastest["batch_size"] != 8 and search["largest_fit"] == 8
    assert record["config"]["batch_size"] == search["chosen"] and record["rungs"][-1]["name"] == "compile"
    assert record["rungs"][-1]["tokens_per_s"] == fastest["tokens_per_s"]  # the winner's own measurement
    assert "--batch-size best: 8 sequences fit" in (tmp_path / "ladder.md").read_text()
    assert "--batch-size best: timing 6 sequences" in capsys.readouterr().out



def test_mfu_under_torchrun_is_per_gpu(monkeypatch):
    """N GPUs do N times the tokens against N times the peak: MFU uses the per-GPU share."""
    import gpt2ladder.measure.bench as bench
    from gpt2ladder.measure.harness import Row
    from gpt2ladder.model.config import preset
    from gpt2ladder.runtime.hardware import Capabilities
    from gpt2ladder.runtime.metrics import flops_per_token, mfu, peak_flops

    model_cfg = preset("gpt2")
    timed = {"tokens_per_s": 1_000_000.0, "tokens_per_s_per_gpu": 500_000.0, "model_config": model_cfg,
             "n_params": 124_000_000}
    monkeypatch.setattr(bench, "_time_setup", lambda *a, **k: dict(timed))
    caps = Capabilities("cuda", "NVIDIA H200", (9, 0))
    cfg = BenchConfig(preset="gpt2", rungs=("baseline",), batch_size=16, seq_len=1024, steps=1, warmup=0)
    row = bench.measure_rung(Row("baseline", ("baseline",)), cfg, None, CPU, caps, progress=False)
    per_gpu = mfu(500_000.0, flops_per_token(model_cfg, 1024, 124_000_000), peak_flops("NVIDIA H200"))
    assert row["mfu"] == pytest.approx(per_gpu) and 0.2 < row["mfu"] < 0.5


def test_chart_labels_mark_each_step_up_but_not_the_best_combination():
    from gpt2ladder.report.plots import ladder_labels

    rows = [{"name": "baseline", "kind": "baseline"}, {"name": "tf32", "kind": "precision"},
            {"name": "best", "kind": "best"}]
    assert ladder_labels(rows) == ["baseline", "+ tf32", "best"]


def test_a_gpt2_bench_on_a_cpu_says_up_front_how_long_it_takes_at_least():
    from gpt2ladder.report.notices import cpu_warning
    from gpt2ladder.model.config import preset

    cfg = BenchConfig(preset="gpt2", rungs=("baseline",), batch_size=4, seq_len=128, steps=10, warmup=3)
    text = cpu_warning(preset("gpt2"), cfg, n_rungs=4, rate=100e9)  # a CPU at 100 GFLOP/s
    # 4 x 128 tokens x ~0.75 GFLOP per token = ~0.38 TFLOP a step; 52 steps at 100 GFLOP/s: >= 3 minutes
    assert "0.4 TFLOP" in text and "52 steps" in text and "at least 3 min" in text and "--preset tiny" in text


def test_a_rung_whose_loss_is_not_a_number_fails_instead_of_reporting_a_time(shakespeare_cache, monkeypatch):
    """A step that trains to NaN (on an H200, Inductor's coordinate-descent tuning once did) ran fast, but not as
    the model: its row fails with the loss it reached, and `best` cannot keep it."""
    from gpt2ladder.measure import bench as bench_module

    step = bench_module.Engine.step

    def diverging(engine, x, y):
        loss = step(engine, x, y)
        return loss * float("nan") if engine.setup.attention == "sdpa" else loss

    monkeypatch.setattr(bench_module.Engine, "step", diverging)
    cfg = BenchConfig(preset="tiny", rungs=("baseline", "flash"), batch_size=2, seq_len=32, steps=2, warmup=1)
    rows = {r["name"]: r for r in run_bench(cfg, CPU, progress=False, caps=CPU_CAPS)["rungs"]}
    assert rows["baseline"]["status"] == "ok"
    flash = rows["flash"]
    assert flash["status"] == "failed" and "ms_per_step" not in flash
    assert flash["reason"].startswith("NotTraining: its loss was nan after 3 steps")
    kept, _ = decide(list(rows.values()))
    assert kept == ["baseline"]


def test_a_failure_whose_first_line_introduces_its_cause_is_described_with_it():
    from gpt2ladder.errors import describe_failure

    err = RuntimeError("backend='inductor' raised:\nAssertionError: a kernel's arguments\n\nSet TORCH_LOGS=+dynamo")
    assert describe_failure(err) == "RuntimeError: backend='inductor' raised: AssertionError: a kernel's arguments"
    assert describe_failure(ValueError("one line\nmore")) == "ValueError: one line"


@pytest.mark.parametrize("command", ["bench", "train"])
@pytest.mark.parametrize("recipe, refused", [("speedrun", True), ("rope", False)])
def test_a_muon_recipe_under_fsdp_is_refused_before_it_runs(command, recipe, refused):
    """FSDP2 shards the matrices Muon orthogonalises whole: trained or timed, the step would be another computation."""
    from gpt2ladder.cli import build_parser
    from gpt2ladder.commands.bench import bench_config
    from gpt2ladder.commands.train import config_from_args
    from gpt2ladder.runtime import distributed
    from gpt2ladder.runtime.hardware import Capabilities

    args = build_parser().parse_args([command, "--recipe", recipe, "--strategy", "fsdp", "--rungs", "baseline"])
    two = distributed.Dist(rank=0, world_size=2, backend="gloo")
    caps = Capabilities("cpu", "cpu (x86_64)", compile_problem=None)

    def build():
        if command == "bench":
            return bench_config(args, torch.device("cpu"), caps, two).strategy
        return config_from_args(args, torch.device("cpu"), caps, two, notify=lambda *a, **k: None)[1]

    if refused:
        with pytest.raises(UsageError, match="orthogonalises whole matrices.*--strategy ddp"):
            build()
    else:
        assert build() == "fsdp"
