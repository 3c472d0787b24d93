"""Tests for measure/parity.py and its report: every rung trains to the baseline's loss, the verdict rule,
the outputs."""

import dataclasses
import json
import math
import urllib.request

import pytest
import torch

from gpt2ladder.cli import main
from gpt2ladder.commands import parity as parity_command
from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.ladder import LADDER, parse_rungs
from gpt2ladder.measure import parity
from gpt2ladder.measure.parity import (
    ParityConfig,
    allowed_gap,
    judge,
    run_parity,
    verdict,
)
from gpt2ladder.model.recipe import parse_recipe
from gpt2ladder.report import parity as parity_report
from gpt2ladder.runtime.hardware import detect
from gpt2ladder.training.schedule import lr_at

CPU = torch.device("cpu")
CPU_CAPS = detect(CPU)  # what a command detects once and passes down
TINY = dict(batch_size=2, seq_len=32, eval_batches=2, compile_backend="eager")


@pytest.fixture(scope="module")
def record(shakespeare_cache):
    """The whole ladder on CPU: the fp32 rungs run (compile with the eager backend), the rest are skipped."""
    cfg = ParityConfig(rungs=tuple(parse_rungs("all")), steps=4, eval_every=2, **TINY)
    return run_parity(cfg, CPU, progress=False, caps=CPU_CAPS)


def _ok(record):
    return [r for r in record["rungs"] if r["status"] == "ok"]


# --- the rule, on synthetic numbers ---------------------------------------------------------------


def test_allowed_gap_is_the_spread_between_floor_and_tolerance():
    assert allowed_gap(4.0, spread=0.05, tolerance=0.02, floor=0.005) == pytest.approx(0.05)
    assert allowed_gap(4.0, spread=0.001, tolerance=0.02, floor=0.005) == pytest.approx(0.02)  # floor
    assert allowed_gap(4.0, spread=0.5, tolerance=0.02, floor=0.005) == pytest.approx(0.08)  # tolerance cap


@pytest.mark.parametrize("val, spread, passes", [
    (4.03, 0.05, True),  # within the spread
    (3.96, 0.05, True),  # either direction
    (4.30, 0.05, False),  # far off
    (4.06, 0.05, False),  # just outside the spread
    (4.09, 1.00, False),  # over the 2% tolerance even though the baseline is very noisy
    (4.019, 0.0, True),  # a zero spread still allows the 0.5% floor
    (float("nan"), 0.05, False),  # a rung that diverged
    (float("inf"), 1.00, False),
])
def test_verdict(val, spread, passes):
    assert verdict(val, 4.0, spread, tolerance=0.02, floor=0.005) is passes


def test_judge_marks_each_row_against_the_reference():
    cfg = ParityConfig(tolerance=0.02, floor=0.005)
    reference = {"final_val": 5.0, "final_train": 5.2, "first_loss": 10.9}
    rows = [{"name": n, "status": "ok", "final_val": v, "final_train": 5.1, "first_loss": 10.9}
            for n, v in (("close", 5.04), ("far", 5.5), ("capped", 5.2))]
    rows.append({"name": "gone", "status": "skipped", "reason": "no GPU"})
    judge(rows, reference, spread=0.3, cfg=cfg)
    assert [r.get("verdict") for r in rows] == ["PASS", "FAIL", "FAIL", None]
    assert rows[0]["val_diff"] == pytest.approx(0.04) and rows[0]["val_rel"] == pytest.approx(0.008)
    assert rows[0]["train_diff"] == pytest.approx(-0.1)


def test_final_train_loss_is_the_mean_of_the_last_tenth():
    assert parity.final_train_loss([9.0] * 18 + [1.0, 3.0]) == pytest.approx(2.0)
    assert parity.final_train_loss([5.0]) == 5.0


def test_lr_warms_up_then_decays_to_a_tenth():
    cfg = ParityConfig(steps=100, lr=1e-3, warmup_steps=10)
    lrs = [lr_at(s, cfg.lr, cfg.lr * parity.MIN_LR_FRACTION, cfg.n_warmup, cfg.steps) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lr_at(100, cfg.lr, cfg.lr * parity.MIN_LR_FRACTION, cfg.n_warmup, cfg.steps) == pytest.approx(1e-4)


def test_the_record_names_the_recipes_own_decay():
    """parity trains a recipe on its own schedule (cosine, or wsd's hold then linear decay), and says which."""
    cosine = parity._schedule(ParityConfig(steps=100, lr=1e-3, warmup_steps=10))["decay"]
    wsd = parity._schedule(ParityConfig(steps=100, lr=1e-3, warmup_steps=10, recipe="speedrun"))["decay"]
    assert cosine.startswith("cosine to 0.1 x lr") and wsd.startswith("held at lr, then linear") and "(wsd)" in wsd


def test_smooth_is_a_trailing_mean():
    assert parity_report.smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("change, message", [
    (dict(seeds=1), "--seeds must be from 2"),
    (dict(tolerance=0.0), "--tolerance"),
    (dict(seq_len=4096), "exceeds the tiny block size"),
    (dict(eval_every=0), "--eval-every"),
])
def test_config_rejects_bad_values(change, message):
    with pytest.raises(UsageError, match=message):
        ParityConfig(**change)


# --- a real run on CPU ----------------------------------------------------------------------------


def test_every_fp32_rung_starts_from_the_baseline_loss(record):
    """Same weights, same batch: step 0's loss is the same function on every rung, padded vocabulary included."""
    ref = record["baseline_runs"][0]
    ran = [r["name"] for r in _ok(record)]
    assert {"baseline", "flash", "vocab", "fused_adamw"} <= set(ran)
    for row in _ok(record):
        assert abs(row["first_loss_diff"]) < 1e-5, row["name"]
        assert abs(row["val"][0][1] - ref["val"][0][1]) < 1e-5, row["name"]
    assert ref["first_loss"] == pytest.approx(math.log(50257), abs=0.3)  # an untrained GPT-2 is near uniform


def test_identical_setups_train_to_the_same_loss_and_pass(record):
    for row in _ok(record):
        assert abs(row["val_diff"]) < 1e-4 and abs(row["train_diff"]) < 1e-4, row["name"]
        assert row["verdict"] == "PASS"
    assert record["passed"] is True


def test_rungs_this_machine_cannot_run_are_skipped_with_the_reason(record):
    rows = {r["name"]: r for r in record["rungs"]}
    assert [r["name"] for r in record["rungs"]] == [r.name for r in LADDER]
    for name in ("tf32", "bf16", "fp8_head", "cuda_graph"):
        assert rows[name]["status"] == "skipped" and "CUDA" in rows[name]["reason"]
    assert rows["vocab"]["setup"]["vocab_multiple"] == 128 and rows["vocab"]["setup"]["attention"] == "sdpa"


def test_the_spread_comes_from_runs_that_really_differ(record):
    runs = record["baseline_runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    assert runs[0]["first_loss"] != runs[1]["first_loss"]  # other weights and other batches
    vals = [r["final_val"] for r in runs]
    assert record["rule"]["spread"] == pytest.approx(abs(vals[0] - vals[1]))
    assert record["rule"]["allowed_abs"] == pytest.approx(
        allowed_gap(vals[0], record["rule"]["spread"], 0.02, 0.005))


def test_curves_are_recorded_per_step_and_per_eval(record):
    for row in _ok(record) + record["baseline_runs"]:
        assert len(row["train_loss"]) == 4 and all(math.isfinite(v) for v in row["train_loss"])
        assert [s for s, _ in row["val"]] == [0, 2, 4]
        assert row["val"][-1][1] < row["val"][0][1]  # it learns
    assert record["schedule"]["eval_every"] == 2 and record["config"]["compile_backend"] == "eager"


def test_outputs_are_written_and_describe_themselves(record, tmp_path):
    paths = parity_report.write_outputs(record, tmp_path)
    saved = json.loads(paths[0].read_text())
    for key in ("git_sha", "versions", "device", "config", "model", "data", "rule", "baseline_runs", "rungs"):
        assert key in saved
    assert saved["data"]["source"] == "tinyshakespeare" and "PASS when" in saved["rule"]["text"]
    md = paths[1].read_text()
    assert "| vocab |" in md and "| PASS |" in md and "skipped: TF32 needs" in md and "PASS when" in md
    png = paths[2].read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    table = parity_report.format_table(record)
    skipped = sum(r["status"] == "skipped" for r in record["rungs"])
    assert skipped and "fused_adamw" in table and f"all rungs PASS; {skipped} skipped on this machine" in table


def test_the_table_is_aligned_and_shows_no_negative_zero(record):
    rows = [{**r, "val_diff": -1e-9, "train_diff": -0.0, "val_rel": -1e-12} if r["status"] == "ok" else r
            for r in record["rungs"]]
    lines = parity_report.format_table({**record, "rungs": rows}).splitlines()
    table = [line for line in lines[:len(rows) + 1]]
    full = [line for line in table if "skipped:" not in line]
    assert len({len(line.rstrip()) for line in full}) == 1, full  # every column ends where its header does
    start = {line.index("skipped:") for line in table if "skipped:" in line}
    assert len(start) == 1  # the reasons start in one column, however long the rung's name
    assert "-0.0000" not in "\n".join(table) and "-0.00 " not in "\n".join(table)


def test_off_a_terminal_each_training_run_is_one_line_as_it_finishes(shakespeare_cache, capsys):
    cfg = ParityConfig(rungs=("baseline", "flash"), steps=1, **TINY)
    run_parity(cfg, CPU, progress=True, caps=CPU_CAPS)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("parity: ")]
    assert [line.split(":")[1].strip() for line in lines] == ["1/3 fp32 seed 0", "2/3 fp32 seed 1", "3/3 flash"]
    assert all("final val loss" in line and line.endswith(" s") for line in lines)


def test_parity_and_profile_default_to_the_rungs_that_run_here_off_a_gpu():
    from gpt2ladder.commands.defaults import defaults

    from gpt2ladder.ladder import resolve_rungs, why_unavailable
    from gpt2ladder.runtime.hardware import detect

    caps = detect(CPU)
    for command in ("parity", "profile"):
        rungs = resolve_rungs(defaults(command, CPU)["rungs"], caps)
        assert rungs and (caps.compile_problem or all(why_unavailable(name, caps) is None for name in rungs))
        assert defaults(command, torch.device("cuda"))["rungs"] == "all"


def test_a_run_that_skipped_every_rung_does_not_say_they_passed(record):
    """Skipped rungs are not judged: with none judged the verdict line says so, not "all rungs PASS"."""
    skipped = {**record, "rungs": [{**r, "status": "skipped", "reason": "not on this machine"}
                                   for r in record["rungs"]]}
    assert parity_report.verdict_line(skipped) == f"no rung ran; {len(record['rungs'])} skipped on this machine"
    assert "PASS" not in parity_report.format_table(skipped).splitlines()[-1]


def test_the_verdict_line_says_which_rungs_the_recipe_left_out_and_how_many_the_machine_could_not_run(record):
    rows = [{**r, "skipped_by": "recipe"} if r["name"] == "tf32" else r for r in record["rungs"]]
    machine = sum(r["status"] == "skipped" for r in rows) - 1
    assert parity_report.verdict_line({**record, "rungs": rows}) == (
        f"all rungs PASS; 1 skipped by the recipe (tf32); {machine} skipped on this machine")


def test_a_recipe_run_names_its_recipe_its_muon_rate_and_the_rung_it_left_out(shakespeare_cache, tmp_path, capsys):
    """flash declines doc_windows: skipped by the recipe, not by this machine; Muon's rate is given beside AdamW's."""
    args = ["parity", "--device", "cpu", "--preset", "tiny", "--recipe", "muon,doc_windows", "--rungs",
            "baseline,flash", "--steps", "1", "--eval-batches", "1", "--batch-size", "2", "--seq-len", "32",
            "--no-progress", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["gpt2ladder parity: micro-batch 2 x 1 accumulation step = batch 2",
                       f"tiny on {CPU_CAPS.name}, recipe muon,doc_windows, batch 2 x 32, 1 step per run, 2 baseline "
                       "seeds, rungs: baseline, flash"]
    assert "all rungs PASS; 1 skipped by the recipe (flash)" in out
    record = json.loads((tmp_path / "parity.json").read_text())
    assert [r.get("skipped_by") for r in record["rungs"]] == [None, "recipe"]
    md = (tmp_path / "parity.md").read_text().splitlines()
    assert md[0] == f"# gpt2ladder parity: tiny on {CPU_CAPS.name}, recipe muon,doc_windows"
    assert md[2].startswith("- 1 step per run, batch 2 x 32, AdamW lr 0.0006 and Muon lr 0.01 for the Blocks' "
                            "matrices (warm-up 1, ")


def test_the_markdown_names_the_recipe_speedrun_by_name_and_gpt2s_rate_alone(record):
    md = parity_report.format_markdown(record).splitlines()
    assert md[0].endswith(", recipe gpt2") and ", lr 0.0006 (warm-up " in md[2] and "Muon" not in md[2]
    speedrun = {**record, "config": {**record["config"], "recipe": parse_recipe("speedrun").name}}
    assert parity_report.format_markdown(speedrun).splitlines()[0].endswith(", recipe speedrun")


def test_auto_names_the_rungs_the_recipe_leaves_out(capsys):
    from gpt2ladder.cli import build_parser
    from gpt2ladder.runtime.hardware import Capabilities

    caps = Capabilities("cpu", "cpu (x86_64)", compile_problem=None)
    notes = []
    args = build_parser().parse_args(["parity", "--rungs", "auto", "--recipe", "speedrun"])
    cfg = parity_command.config_from_args(args, CPU, caps, notes.append)
    assert "tied_grad" not in cfg.rungs and notes == [
        "notice: leaving out rung tied_grad: the tied_grad rung's graph pass is written for GPT-2's own Blocks; "
        "recipe speedrun changes them"]


# --- failures -------------------------------------------------------------------------------------


def _breaking(real, broken):
    """train_run that raises broken[field] for setups with that field set."""
    def train_run(setup, seed, ctx, label):
        for field, err in broken.items():
            if getattr(setup, field):
                raise err
        return real(setup, seed, ctx, label)
    return train_run


def test_a_rung_that_breaks_is_a_failed_row(shakespeare_cache, monkeypatch):
    monkeypatch.setattr(parity, "train_run", _breaking(parity.train_run, {
        "fused_loss": RuntimeError("boom\nsecond line"),  # checked first: this rung has fused_adamw too
        "fused_adamw": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
    }))
    cfg = ParityConfig(rungs=("baseline", "fused_adamw", "fused_loss"), steps=2, **TINY)
    record = run_parity(cfg, CPU, progress=False, caps=CPU_CAPS)
    rows = {r["name"]: r for r in record["rungs"]}
    assert rows["baseline"]["verdict"] == "PASS"
    assert rows["fused_adamw"]["status"] == "oom" and "out of memory" in rows["fused_adamw"]["reason"]
    if rows["fused_loss"]["status"] != "skipped":  # fused_loss needs compile, i.e. a C++ compiler here
        assert rows["fused_loss"]["reason"] == "RuntimeError: boom"
    assert record["passed"] is False
    assert "oom: out of memory" in parity_report.format_table(record)


def test_a_broken_baseline_stops_the_run(shakespeare_cache, monkeypatch):
    monkeypatch.setattr(parity, "train_run", _breaking(parity.train_run, {"matmul_precision": RuntimeError("x")}))
    with pytest.raises(LadderError, match="fp32 baseline .* failed"):
        run_parity(ParityConfig(steps=1, **TINY), CPU, progress=False, caps=CPU_CAPS)


# --- the command ----------------------------------------------------------------------------------

ARGS = ["parity", "--device", "cpu", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
        "--eval-batches", "1", "--no-progress"]


def test_command_writes_the_files_and_prints_the_table(shakespeare_cache, tmp_path, capsys):
    assert main(ARGS + ["--rungs", "baseline,flash", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "flash" in out and "PASS" in out and "rule: PASS when" in out
    assert {p.name for p in tmp_path.iterdir()} >= {"parity.json", "parity.md", "parity.png"}
    saved = json.loads((tmp_path / "parity.json").read_text())
    assert saved["config"]["rungs"] == ["baseline", "flash"] and saved["config"]["seeds"] == 2


def test_a_diverged_baseline_still_writes_the_plot_and_prints_the_summary(shakespeare_cache, tmp_path, capsys):
    """parity --lr 1e6: every loss is NaN. matplotlib refused NaN axis limits; now the files are written, the
    table printed, and one line on stderr says why nothing could be judged."""
    assert main(ARGS + ["--rungs", "baseline,flash", "--lr", "1e6", "--out", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "NOT every rung passes" in out and "FAIL" in out and "nan" in out
    assert err.count("\n") == 1 and "the fp32 baseline diverged" in err and "lower --lr" in err
    assert (tmp_path / "parity.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "parity.md").exists()


def test_the_plot_copes_with_some_runs_not_finite(tmp_path):
    record = {"config": {"steps": 4, "preset": "tiny"}, "device": {"name": "cpu"},
              "rule": {"allowed_abs": 0.05}, "baseline_runs": [
                  {"seed": 0, "final_val": 5.0, "train_loss": [6.0, 5.5, 5.2, 5.0]},
                  {"seed": 1, "final_val": 5.02, "train_loss": [6.0, 5.4, 5.3, 5.1]}],
              "rungs": [{"name": "flash", "status": "ok", "verdict": "FAIL", "final_val": float("inf"),
                         "train_loss": [6.0, float("inf"), float("nan"), float("nan")]}]}
    parity_report.plot_parity(record, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("extra, message", [
    (["--seeds", "1"], "--seeds must be from 2"),
    (["--seeds", str(10**12)], "--seeds must be from 2"),
    (["--eval-batches", str(10**12)], "--eval-batches is at most"),
    (["--rungs", "warp_drive"], "unknown rung"),
    (["--tolerance", "5"], "--tolerance"),
])
def test_command_usage_errors_are_one_line(extra, message, tmp_path, capsys):
    assert main(ARGS + extra + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_data_is_an_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "empty-cache"))

    def offline(*args, **kwargs):
        raise OSError("network is off in tests")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert main(ARGS + ["--rungs", "baseline", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "Tiny Shakespeare" in err and "--data" in err


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ParityConfig().steps = 3


# --- shards: one parity spread over several GPUs ---------------------------------------------------


def test_shards_merge_into_the_same_report_as_one_run(shakespeare_cache, tmp_path, capsys, monkeypatch):
    """Each training run is independent: three shards plus a merge equal the single-process report."""
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")  # a setting of the config, which the merge must keep
    common = ARGS + ["--rungs", "baseline,flash,vocab", "--seeds", "2"]
    assert main(common + ["--out", str(tmp_path / "whole")]) == 0
    for k in range(3):
        assert main(common + ["--shard", f"{k}/3", "--out", str(tmp_path / f"s{k}")]) == 0
    assert main(["parity", "--merge"] + [str(tmp_path / f"s{k}") for k in range(3)]
                + ["--out", str(tmp_path / "merged")]) == 0
    whole = json.loads((tmp_path / "whole" / "parity.json").read_text())
    merged = json.loads((tmp_path / "merged" / "parity.json").read_text())
    assert [r["name"] for r in merged["rungs"]] == [r["name"] for r in whole["rungs"]]
    for a, b in zip(whole["rungs"], merged["rungs"]):
        assert a["status"] == b["status"] and a.get("verdict") == b.get("verdict")
        if a["status"] == "ok":
            # Same runs, other order in the process: equal up to the last bits of compiled reductions.
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
            assert b["final_val"] == pytest.approx(a["final_val"], rel=1e-5)
    assert merged["rule"]["spread"] == whole["rule"]["spread"]
    assert whole["config"]["compile_backend"] == merged["config"]["compile_backend"] == "eager"
    assert (tmp_path / "merged" / "parity.png").exists()


def test_a_missing_shard_is_a_usage_error(shakespeare_cache, tmp_path, capsys):
    assert main(ARGS + ["--rungs", "baseline", "--shard", "0/2", "--out", str(tmp_path / "s0")]) == 0
    assert main(["parity", "--merge", str(tmp_path / "s0"), "--out", str(tmp_path / "m")]) == 2
    assert "parity runs missing from the shards: baseline-seed1" in capsys.readouterr().err
    # a folder of shards and one shard file merge together
    assert main(ARGS + ["--rungs", "baseline", "--shard", "1/2", "--out", str(tmp_path / "s1")]) == 0
    one_file = tmp_path / "s1" / "parity-shard-1-of-2.json"
    assert main(["parity", "--merge", str(tmp_path / "s0"), str(one_file), "--out", str(tmp_path / "m")]) == 0


def test_a_shard_from_before_the_micro_batch_setting_still_merges(shakespeare_cache, tmp_path, capsys):
    """Shards written before `micro_batch` existed ran every step as one pass, which is what None means."""
    for k in range(2):
        assert main(ARGS + ["--rungs", "baseline", "--shard", f"{k}/2", "--out", str(tmp_path / f"s{k}")]) == 0
    old = tmp_path / "s0" / "parity-shard-0-of-2.json"
    record = json.loads(old.read_text())
    del record["config"]["micro_batch"]
    old.write_text(json.dumps(record))
    assert main(["parity", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 0
    assert json.loads((tmp_path / "m" / "parity.json").read_text())["rungs"][0]["name"] == "baseline"
    record["config"]["flux"] = 1  # an unknown setting is still refused
    old.write_text(json.dumps(record))
    assert main(["parity", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m2")]) == 2
    assert "does not know (flux)" in capsys.readouterr().err


def test_a_file_that_is_not_a_shard_is_a_usage_error(tmp_path, capsys):
    bench_record = tmp_path / "ladder.json"
    bench_record.write_text(json.dumps({"command": "bench", "rungs": []}))
    assert main(["parity", "--merge", str(bench_record), "--out", str(tmp_path / "m")]) == 2
    assert "is not a parity shard record" in capsys.readouterr().err


def _shard(rungs, k, n, results, **config):
    cfg = ParityConfig(rungs=tuple(rungs), **config).to_dict()
    runs = {uid: {"status": "ok", "final_val": val, "final_train": val - 0.5, "first_loss": 10.8, "seed": 0}
            for uid, val in results.items()}
    return {"device": {"name": "cpu"}, "git_sha": "abc", "command": "parity-shard", "shard": [k, n],
            "config": cfg, "skipped": {}, "results": runs}


def test_shards_of_a_shorter_path_merge_into_a_longer_one():
    """A later command adds rungs to an earlier one's runs (its fp32 baselines) instead of repeating them."""
    first = _shard(["compile"], 0, 2, {"baseline-seed0": 5.0, "baseline-seed1": 5.02})
    later = _shard(["compile", "flash"], 1, 3, {"compile": 5.01, "flash": 4.99})
    merged = parity.merge_shards([first, later])
    assert [r["name"] for r in merged["rungs"]] == ["compile", "flash"]
    assert [r["verdict"] for r in merged["rungs"]] == ["PASS", "PASS"]
    assert merged["rule"]["spread"] == pytest.approx(0.02)
    assert [s["rungs"] for s in merged["shards"]] == [["compile"], ["compile", "flash"]]
    md = parity_report.format_markdown({**merged, "schedule": {"warmup_steps": 1, "decay": "cosine"},
                                 "data": {"source": "x"}, "versions": {"torch": "t", "cuda": None},
                                 "gpt2ladder": "0", "date": "d"})
    assert "- shard 1 of 3 (rungs compile, flash) at abc: compile, flash" in md
    with pytest.raises(UsageError, match="missing from the shards: flash"):
        parity.merge_shards([first, _shard(["compile", "flash"], 1, 3, {"compile": 5.01})])


def test_rungs_named_after_a_shards_own_runs_do_not_matter():
    """A shard whose path goes on past its runs (to a rung another shard replaced) merges: its runs trained the same
    setups either way."""
    base = _shard(["compile", "flash"], 0, 4, {"baseline-seed0": 5.0, "baseline-seed1": 5.02, "compile": 5.01})
    other_top = _shard(["compile", "flash", "vocab"], 2, 4, {"flash": 4.99})  # its vocab run is another shard's
    new_top = _shard(["compile", "flash", "fused_adamw"], 3, 4, {"fused_adamw": 5.0})
    merged = parity.merge_shards([base, other_top, new_top])
    assert [r["name"] for r in merged["rungs"]] == ["compile", "flash", "fused_adamw"]
    with pytest.raises(UsageError, match="different rung paths"):  # both tops cannot be one path
        parity.merge_shards([base, _shard(["compile", "flash", "vocab"], 2, 4, {"flash": 4.99, "vocab": 4.98}),
                             new_top])


def test_shards_that_cannot_be_one_report_are_usage_errors():
    base = _shard(["compile"], 0, 2, {"baseline-seed0": 5.0, "baseline-seed1": 5.02})
    with pytest.raises(UsageError, match="different rung paths"):  # flash's run would not include compile
        parity.merge_shards([_shard(["compile"], 0, 2, {"baseline-seed0": 5.0, "baseline-seed1": 5.02,
                                                        "compile": 5.01}),
                             _shard(["flash"], 1, 2, {"flash": 5.0})])
    with pytest.raises(UsageError, match="different settings"):
        parity.merge_shards([base, _shard(["compile"], 1, 2, {"compile": 5.0}, steps=7)])
    with pytest.raises(UsageError, match="more than one shard"):
        parity.merge_shards([base, _shard(["compile"], 1, 2, {"compile": 5.0, "baseline-seed1": 5.02})])


@pytest.mark.parametrize("text", ["3/3", "a/b", "1", "-1/2"])
def test_bad_shard_specs(text):
    with pytest.raises(UsageError, match="--shard"):
        parity_command.parse_shard(text)


@pytest.mark.parametrize("gib", [6, 8, 12, 24, 80])
def test_the_micro_batch_leaves_room_for_validation_beside_a_cuda_graph(gib, monkeypatch):
    """Parity validates each run at its micro-batch; beside a CUDA graph's pool that needs room of its own,
    which the plan does not count. The plan still holds: at the micro-batch chosen for the fp32 baseline,
    every graphed run of the ladder fits with its validation."""
    from gpt2ladder.measure import batch as batch_mod
    from gpt2ladder.runtime.hardware import Capabilities
    from gpt2ladder.runtime.memory import HEADROOM, GiB, eval_bytes_per_sequence, step_memory

    monkeypatch.setattr(batch_mod, "probe_peak", lambda *a, **k: GiB)  # the probe agrees with the estimate
    caps = Capabilities("cuda", "NVIDIA H100 PCIe", (9, 0), total_memory=gib * GiB, triton_version="3.6.0")
    cfg = parity_command.config_from_args(parity_command_args(), torch.device("cuda"), caps)
    cfg, plan = parity_command._plan(cfg, torch.device("cuda"), caps)
    graphed = [setup for _, setup in parity_command._runs(cfg, caps) if setup.cuda_graph]
    assert graphed and (cfg.preset, cfg.seq_len) == ("gpt2", 1024) and 16 % cfg.micro == 0
    for setup in graphed:
        step = step_memory(cfg.model, setup, cfg.seq_len, accumulates=cfg.micro < cfg.batch_size)
        shape = dataclasses.replace(cfg.model, vocab_multiple=setup.vocab_multiple)
        beside = cfg.micro * eval_bytes_per_sequence(shape, cfg.seq_len)
        assert step.at(cfg.micro) + beside <= HEADROOM * caps.usable_memory, setup


def parity_command_args():
    """parity's flags as the CLI parses them, none given."""
    from gpt2ladder.cli import build_parser

    return build_parser().parse_args(["parity"])
