"""The race: rungs, the target's checks, the arithmetic of a row (median, range, gain, within noise, not reached),
a real race of two rungs through the command (race.json, .md, .png), continuing one, one cut off, and the inputs it
refuses in one line."""

import dataclasses
import json
import math
import re
import shutil
import statistics
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt2ladder import cli, defaults
from gpt2ladder.commands import race as race_command
from gpt2ladder.commands.defaults import DEFAULTS, MUON_RATES
from gpt2ladder.data import manifest
from gpt2ladder.data import shards as fmt
from gpt2ladder.errors import UsageError
from gpt2ladder.measure import race
from gpt2ladder.measure.doctor import diagnose
from gpt2ladder.model.recipe import SPEEDRUN, WSD_DECAY_FRACTION
from gpt2ladder.report import race as report
from gpt2ladder.report.doctor import format_report
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.training import runlog
from gpt2ladder.training.config import TrainConfig

CPU_CAPS = Capabilities("cpu", "cpu (x86_64)", compile_problem=None)
SMALL = ["--steps", "4", "--eval-every", "2", "--batch-size", "2", "--seq-len", "32", "--device", "cpu",
         "--no-progress"]


# --- rungs, targets, recipes ------------------------------------------------------------------------------


def test_rungs_default_to_gpt2_and_every_part_and_a_list_is_put_in_race_order():
    from gpt2ladder.model.recipe import WSD_DECAY_FRACTION, PARTS

    assert race.parse_race_rungs(None) == race.parse_race_rungs("all") == race.RACE_RUNGS
    assert race.RACE_RUNGS == ("gpt2", *(p.name for p in PARTS), "speedrun")
    assert race.parse_race_rungs("rope, gpt2,muon") == ("gpt2", "muon", "rope")
    with pytest.raises(UsageError, match="unknown race rung flash; choose from: all, gpt2, muon"):
        race.parse_race_rungs("gpt2,flash")


def test_a_rung_of_parts_joined_by_plus_is_its_own_recipe_after_the_race_order_in_the_order_given():
    from gpt2ladder.model.recipe import parse_recipe

    names = race.parse_race_rungs("speedrun+unet_skips+bf16_tables, speedrun+unet_skips,gpt2,speedrun")
    assert names == ("gpt2", "speedrun", "speedrun+unet_skips+bf16_tables", "speedrun+unet_skips")
    got = dict(race.race_rungs(("gpt2", "muon", "speedrun", "speedrun+unet_skips", "muon+rope")))
    assert got["speedrun+unet_skips"] == parse_recipe("speedrun,unet_skips").name
    assert got["muon+rope"] == "muon,rope" and got["muon"] == "muon"  # not stacked on the rungs before it
    with pytest.raises(UsageError, match="race rung speedrun\\+nope: unknown recipe part nope"):
        race.parse_race_rungs("gpt2,speedrun+nope")
    assert race.parse_race_rungs(" speedrun + unet_skips ") == ("speedrun+unet_skips",)  # as its folder is named
    for spec in ("gpt2+", "speedrun++unet_skips", "speedrun-", "speedrun+-wsd"):
        with pytest.raises(UsageError, match="has an empty part beside a \\+ or - sign"):
            race.parse_race_rungs(spec)
    for spec, twins in [("speedrun,speedrun+muon", "speedrun and speedrun+muon"),
                        ("speedrun,speedrun+value_embeds", "speedrun and speedrun+value_embeds"),
                        ("gpt2,muon,gpt2+muon", "muon and gpt2+muon"),
                        ("unet_skips+speedrun,speedrun+unet_skips", "unet_skips+speedrun and speedrun+unet_skips")]:
        with pytest.raises(UsageError, match=f"race rungs {re.escape(twins)} both train recipe"):
            race.race_rungs(race.parse_race_rungs(spec))
    assert len(race.race_rungs(race.RACE_RUNGS)) == len(race.RACE_RUNGS)  # every rung its own recipe


def test_a_rung_written_with_minus_takes_parts_away_and_is_read_against_what_it_takes_them_from():
    """speedrun-wsd is speedrun's parts but wsd, read against speedrun; signs are read left to right; taking away a
    part the recipe does not have, or leaving a recipe no one can train, is one line; a minus rung that trains
    another rung's recipe is refused as any twin is."""
    from gpt2ladder.model.recipe import SPEEDRUN, parse_recipe

    names = race.parse_race_rungs("speedrun - wsd,gpt2,speedrun,speedrun-rope-qk_norm,speedrun+unet_skips-wsd")
    assert names == ("gpt2", "speedrun", "speedrun-wsd", "speedrun-rope-qk_norm", "speedrun+unet_skips-wsd")
    got = dict(race.race_rungs(names))
    assert got["speedrun-wsd"] == parse_recipe(",".join(p for p in SPEEDRUN if p != "wsd")).name
    assert got["speedrun-rope-qk_norm"] == parse_recipe(",".join(p for p in SPEEDRUN
                                                                 if p not in ("rope", "qk_norm"))).name
    assert got["speedrun+unet_skips-wsd"] == parse_recipe("speedrun,unet_skips").name.replace(",wsd", "")
    assert race.stacked_recipe("momentum_warmup+speedrun").momentum_warmup  # checked whole, not piece by piece
    for spec, says in [("speedrun-unet_skips", "takes away unet_skips, which the parts before it do not have"),
                       ("speedrun-gpt2", "takes away gpt2"), ("speedrun-muon+momentum_warmup", "has no muon"),
                       ("speedrun-nope", "unknown recipe part nope"), ("speedrun-speedrun", "takes every part away"),
                       ("speedrun-speedrun+wsd", "takes every part away"),
                       ("speedrun+gpt2", "adds gpt2, which is no part")]:
        with pytest.raises(UsageError, match=f"race rung {re.escape(spec)}: .*{says}"):
            race.parse_race_rungs(spec)
    rungs = [race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names)]
    cfg = dataclasses.replace(_cfg(), rungs=tuple(rungs))
    rows = [race.rung_row(r, [_run(s, 10.0 + i + s / 10) for s in range(3)], cfg) for i, r in enumerate(cfg.rungs)]
    race.add_gains(rows)
    # speedrun-rope-qk_norm and speedrun+unet_skips-wsd: no speedrun-rope, no speedrun+unet_skips raced: speedrun
    assert [r["gain_vs"] for r in rows] == [None, "gpt2", "speedrun", "speedrun", "speedrun"]
    with pytest.raises(UsageError, match="--rungs all stands alone"):
        race.parse_race_rungs("all,speedrun-wsd")
    assert f", {11.1 / 13.1:.2f}x against speedrun, earlier validation in 0/3 seeds, 1 tokens" in \
        report.progress_line(rows[3], 9.0)
    for row in rows:
        row["read_every"] = 200
    race.add_gains(rows)  # 200 steps of 11 ms: 2.2 s, more than the 2 s between the medians
    assert (f", {11.1 / 13.1:.2f}x against speedrun, under one validation, "
            "earlier validation in 0/3 seeds, 1 tokens") in \
        report.progress_line(rows[3], 9.0)
    with pytest.raises(UsageError, match="race rungs value_embeds and speedrun-wsd both train recipe"):
        race.race_rungs(race.parse_race_rungs("gpt2,muon,rope,qk_norm,relu2,rmsnorm,zero_init,untied_head,softcap,"
                                              "value_embeds,speedrun-wsd"))


def test_the_race_owns_folders_of_its_rungs_and_of_parts_joined_by_plus_only():
    own = race_command.OWN_FILES
    assert all(re.fullmatch(own, n) for n in ("race.json", "gpt2", "speedrun+value_embeds", "muon+rope+qk_norm",
                                              "speedrun-wsd", "speedrun+value_embeds-wsd"))
    assert not any(re.fullmatch(own, n) for n in ("notes+draft", "speedrun + value_embeds", "speedrun+", "runs"))


def test_rung_k_trains_the_parts_of_rungs_0_to_k():
    assert race.race_rungs(("gpt2", "muon", "rope")) == [("gpt2", "gpt2"), ("muon", "muon"), ("rope", "muon,rope")]
    assert race.race_rungs(("gpt2", "rope")) == [("gpt2", "gpt2"), ("rope", "rope")]


def test_the_speedrun_rung_trains_the_speedrun_recipe_whatever_rungs_come_before():
    from gpt2ladder.model.recipe import parse_recipe

    speedrun = parse_recipe("speedrun").name
    assert race.race_rungs(("gpt2", "speedrun")) == [("gpt2", "gpt2"), ("speedrun", speedrun)]
    assert race.race_rungs(("gpt2", "muon", "speedrun"))[1:] == [("muon", "muon"), ("speedrun", speedrun)]


def _logged(seed, curve, status="ok"):
    return {"seed": seed, "status": status, "reason": None if status == "ok" else "cut off", "reached": False,
            "curve": [{"step": s, "tokens": 64 * s, "train_seconds": t, "val_loss": v} for s, t, v in curve],
            "train_seconds": None, "wall_seconds": None, "tokens": None, "steps": None}


def test_a_target_read_off_the_gpt2_rung_is_its_worst_seeds_last_validation_and_times_its_runs():
    runs = [_logged(0, [(2, 1.0, 9.5), (4, 2.0, 9.1)]), _logged(1, [(2, 1.1, 9.3), (4, 2.1, 9.2)])]
    target = race.baseline_target(runs)
    assert target == 9.2  # every seed reaches it: seed 1 at its last validation, seed 0 there too
    timed = [race.timed_to(r, target) for r in runs]
    assert [(t["reached"], t["steps"], t["tokens"], t["train_seconds"]) for t in timed] == [
        (True, 4, 256, 2.0), (True, 4, 256, 2.1)]
    assert timed[0]["wall_seconds"] is None  # an older version's log, whose validations kept no clock: not made up
    assert timed[0]["validation_seconds"] is None and timed[0]["warmup_seconds"] is None
    assert race.timed_to(runs[0], 9.35)["steps"] == 4 and race.timed_to(runs[1], 9.35)["steps"] == 2
    assert not race.timed_to(runs[0], 9.0)["reached"]
    assert race.baseline_target([runs[0], _logged(1, [(2, 1.0, 9.4)], status="stopped")]) is None


def test_a_target_set_after_the_run_takes_the_wall_validation_and_compile_seconds_of_the_clock_where_it_hit():
    run = _logged(0, [(2, 1.0, 9.5), (4, 2.0, 9.1)])
    clocks = [{"wall_seconds": 6.0, "validation_seconds": 0.5, "warmup_seconds": 3.0},
              {"wall_seconds": 9.0, "validation_seconds": 1.0, "warmup_seconds": 3.0}]
    run["curve"] = [{**point, **clock} for point, clock in zip(run["curve"], clocks)]
    assert race.timed_to(run, 9.5) == {**run, "reached": True, "train_seconds": 1.0, "steps": 2, "tokens": 128,
                                       **clocks[0]}
    assert race.timed_to(run, 9.2) == {**run, "reached": True, "train_seconds": 2.0, "steps": 4, "tokens": 256,
                                       **clocks[1]}


def test_a_runs_line_gives_the_loss_measured_where_its_time_was_read_and_what_its_first_step_did():
    """The validation at the run's target step (a target that rose since the run stopped reads an earlier one), not
    its last; its first step named by its step rungs."""
    curve = [{"step": s, "val_loss": v} for s, v in ((2, 5.0), (4, 4.25), (6, 3.5))]
    result = {"seed": 1, "status": "ok", "reached": True, "steps": 4, "train_seconds": 1.0, "warmup_seconds": 2.0,
              "validation_seconds": 0.5, "wall_seconds": 4.0, "curve": curve}
    assert report.run_line("r", result, 4.5) == ("  r seed 1: val loss 4.2500 (target 4.5) at step 4 in 1.0 s of "
                                                 "training (2.0 s compile and capture, 0.5 s validation apart; 4.0 s "
                                                 "wall)")
    assert "(2.0 s warm-up step," in report.run_line("r", result, 4.5, ("baseline",))
    assert "(2.0 s compile," in report.run_line("r", result, 4.5, ("compile", "bf16"))


@pytest.mark.parametrize("bad", [0.0, -1.0, math.log(50257), 10.85, 50.0])
def test_a_target_no_run_can_be_timed_to_is_refused(bad):
    """At or above ln 50257 (about an untrained model's loss) the first validation meets it: refused, as train does."""
    with pytest.raises(UsageError, match=r"--target-val-loss must be above 0 and below 10\.8249 "):
        race.check_target(bad)
    race.check_target(3.28)  # FineWeb's
    race.check_target(10.8)
    race.check_target(10.8248)  # below the bound the message names
    with pytest.raises(UsageError, match=r"below 10\.8249 .*got 10\.82491$"):  # not rounded to the bound
        race.check_target(10.82491)


def test_fineweb_is_known_by_its_prepared_manifests_source_name(tmp_path):
    (tmp_path / manifest.FINAL).write_text(json.dumps({
        "format": manifest.FORMAT, "version": manifest.VERSION, "shards": [],
        "source": {"kind": "hf", "name": "HuggingFaceFW/fineweb", "subset": "sample-10BT", "split": "train"}}))
    assert race_command.corpus_source(str(tmp_path)) == "HuggingFaceFW/fineweb"
    args = types.SimpleNamespace(target_val_loss=None, data=str(tmp_path), preset=None)
    assert race_command.target_for(args, types.SimpleNamespace(source="fw10B")) == (
        3.28, "HuggingFaceFW/fineweb's known target")
    assert race.known_target("HuggingFaceFW/fineweb-edu") is None  # another corpus, another loss
    shakespeare = types.SimpleNamespace(target_val_loss=None, data=None, preset="tiny")
    target, why = race_command.target_for(shakespeare, None)
    assert target == race_command.SHAKESPEARE_DEMO_TARGETS["tiny"] and "demo" in why


def test_a_recipe_the_gpu_cannot_run_says_why_and_doctor_lists_every_race_rung():
    turing = Capabilities("cuda", "Tesla T4", capability=(7, 5))
    assert "compute capability 8.0" in race.recipe_problem("muon,rope", turing)
    assert race.recipe_problem("rope", turing) is None and race.recipe_problem("muon", CPU_CAPS) is None
    d = diagnose(turing)
    assert list(d["race"]) == list(race.RACE_RUNGS)
    assert d["race"]["gpt2"]["usable"] and not d["race"]["wsd"]["usable"]
    text = format_report(diagnose(CPU_CAPS))
    assert "race rungs" in text and "+ rope, on step rungs baseline" in text
    assert f"recipe {','.join(SPEEDRUN)}, on step rungs" in text  # speedrun: its own recipe, not a part on top
    assert "compile" not in race.step_rungs_for("muon", CPU_CAPS)  # a CPU's race never compiles


# --- a row's arithmetic -----------------------------------------------------------------------------------


def _run(seed, seconds, reached=True, status="ok"):
    if status != "ok":
        return {"seed": seed, "status": status, "reason": "its loss exploded at step 3"}
    figures = {k: (seconds if k == "train_seconds" else 1.0) if reached else None for k in race.METRICS}
    if reached:
        figures["steps"] = round(seconds * 100)  # 10 ms a step: a sooner time is an earlier validation
    return {"seed": seed, "status": "ok", "reached": reached, "ms_per_step": 10.0 + seed, "mfu": None, **figures}


def _cfg(seeds=3):
    train = TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4, eval_every=2, target_val_loss=9.0)
    rungs = tuple(race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(("gpt2", "muon", "rope")))
    return race.RaceConfig(rungs=rungs, seeds=seeds, train=train)


def _rows(*runs_per_rung, seeds=3):
    cfg = _cfg(seeds)
    rows = [race.rung_row(r, runs, cfg) for r, runs in zip(cfg.rungs, runs_per_rung)]
    race.add_gains(rows)
    return rows


def test_a_row_is_the_median_and_range_over_the_seeds_and_its_gain_over_the_rung_before():
    gpt2, muon, rope = _rows([_run(0, 30.0), _run(1, 10.0), _run(2, 20.0)], [_run(0, 8.0), _run(1, 5.0), _run(2, 6.0)],
                             [_run(0, 4.0), _run(1, 7.0), _run(2, 5.0)])
    assert gpt2["train_seconds"] == {"median": 20.0, "min": 10.0, "max": 30.0, "seeds": [30.0, 10.0, 20.0]}
    assert gpt2["reached"] and gpt2["seeds_reached"] == 3 and gpt2["ms_per_step"] == 11.0
    assert gpt2["gain_vs_prev"] is None
    assert muon["gain_vs_prev"] == pytest.approx(20.0 / 6.0) and muon["within_noise_of_prev"] is False
    assert rope["gain_vs_prev"] == pytest.approx(6.0 / 5.0) and rope["within_noise_of_prev"] is True  # 4-7 meets 5-8
    assert report.vs_prev(muon) == "3.33x, earlier validation in 3/3 seeds"
    # seeds 0 and 2: 4 against 8, 5 against 6
    assert report.vs_prev(rope) == "within noise, earlier validation in 2/3 seeds"
    assert report.time_text(muon) == "6.0 (5.0-8.0)"


def test_a_plus_rung_is_read_against_the_rung_it_adds_its_last_part_to():
    """speedrun+unet_skips+doc_windows is read against speedrun+unet_skips, not against the bf16_tables rung
    raced between them, and the table names it; speedrun+bf16_tables+doc_windows, with no speedrun+bf16_tables raced,
    against speedrun; a + rung no start of which the race has is read against the row above."""
    names = ("gpt2", "speedrun", "speedrun+unet_skips", "speedrun+unet_skips+bf16_tables",
             "speedrun+unet_skips+doc_windows", "speedrun+bf16_tables+doc_windows", "momentum_warmup+speedrun")
    cfg = dataclasses.replace(_cfg(), rungs=tuple(race.RaceRung(n, r, ("baseline",), 2)
                                                  for n, r in race.race_rungs(names)))
    times = (40.0, 20.0, 19.0, 25.0, 18.0, 30.0, 21.0)
    rows = [race.rung_row(r, [_run(s, t + s / 10) for s in range(3)], cfg) for r, t in zip(cfg.rungs, times)]
    race.add_gains(rows)
    assert [r["gain_vs"] for r in rows] == [None, "gpt2", "speedrun", "speedrun+unet_skips", "speedrun+unet_skips",
                                           "speedrun",  # no speedrun+bf16_tables raced
                                           "speedrun+bf16_tables+doc_windows"]  # momentum_warmup alone is no recipe
    assert rows[4]["gain_vs_prev"] == pytest.approx(19.1 / 18.1)  # against 19.x, not against bf16_tables' 25.x
    assert rows[5]["gain_vs_prev"] == pytest.approx(20.1 / 30.1)  # no speedrun+bf16_tables row: speedrun
    record = {"rungs": rows}
    table = report.rows(record)
    assert table[3][2] == f"{19.1 / 25.1:.2f}x, earlier validation in 0/3 seeds"
    assert table[4][2] == f"{19.1 / 18.1:.2f}x, earlier validation in 3/3 seeds vs speedrun+unet_skips"
    assert table[5][2] == f"{20.1 / 30.1:.2f}x, earlier validation in 0/3 seeds vs speedrun"
    assert table[6][2] == f"{30.1 / 21.1:.2f}x, earlier validation in 3/3 seeds"
    assert "against speedrun+unet_skips" in report.progress_line(rows[4], 9.0)


def _finished_folder(where, entries, save_at_end):
    where.mkdir(parents=True)
    (where / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    train_config = {} if save_at_end is None else {"save_at_end": save_at_end}
    (where / "config.json").write_text(json.dumps({"train_config": train_config, "cards": ["cpu"]}))
    (where / "ckpt.pt").write_bytes(b"a signal's checkpoint")
    return where


@pytest.mark.parametrize("save_at_end, kept", [(False, False), (None, True), (True, True)])
def test_a_run_is_finished_when_its_last_step_was_measured_and_a_signals_checkpoint_then_goes(tmp_path, save_at_end,
                                                                                              kept):
    """A log at its last step with that step's validation cut short by a signal is not finished (--resume measures
    it); one measured is, and the checkpoint a signal left after it goes, where the run was started without
    --keep-weights (an older race's runs, whose config has no save_at_end, kept theirs on purpose)."""
    cfg = dataclasses.replace(_cfg().train, save_at_end=False)
    step = {"loss": 9.0, "ms": 5.0}
    cut = [{"step": 2, **step, "val_loss": 9.5}, {"step": 4, **step}]
    assert race.finished_run(_finished_folder(tmp_path / "cut", cut, False), cfg, 0) is None
    assert (tmp_path / "cut" / "ckpt.pt").exists()
    done = _finished_folder(tmp_path / "done", [cut[0], {**cut[1], "val_loss": 9.2}], save_at_end)
    result = race.finished_run(done, cfg, 0)
    assert result["steps_run"] == 4 and result["curve"][-1]["val_loss"] == 9.2
    assert (done / "ckpt.pt").exists() is kept


@pytest.mark.parametrize("eval_every, under", [(50, False), (200, True), (None, None)])
def test_a_gain_finer_than_one_validation_interval_is_marked(eval_every, under):
    """Medians 20.1 and 19.05 s, ranges apart: beyond the seeds' noise, but 1.05 s apart, which is less than 200
    steps at 11 ms (2.2 s) and more than 50 steps (0.55 s)."""
    cfg = _cfg()
    rows = [race.rung_row(r, runs, cfg) for r, runs in zip(cfg.rungs, (
        [_run(0, 20.0), _run(1, 20.1), _run(2, 20.2)], [_run(0, 19.0), _run(1, 19.05), _run(2, 19.1)]))]
    race.add_gains(rows, eval_every)
    assert rows[1]["within_noise_of_prev"] is False and rows[1]["within_one_validation_of_prev"] is under
    assert report.vs_prev(rows[1]) == ("1.06x" + (", under one validation" if under else "")
                                       + ", earlier validation in 3/3 seeds")


def test_the_seeds_count_the_validations_alone_and_only_seeds_both_rungs_reached():
    """Seed by seed against the row read against: the same validation on quicker steps is not an earlier validation
    (the gain counts the step's speed; this does not), a seed the other row did not reach is not compared, and one
    seed shared says nothing in the table."""
    cfg = _cfg()
    ran = [_run(0, 10.0), _run(1, 10.0), _run(2, 10.0)]
    same_step = {**_run(0, 9.9), "steps": 1000}  # the same validation (step 1000), 0.1 s sooner on quicker steps
    earlier, later = _run(1, 9.0), _run(2, 11.0)
    rows = [race.rung_row(r, runs, cfg) for r, runs in zip(cfg.rungs, (ran, [same_step, earlier, later]))]
    race.add_gains(rows)
    assert rows[1]["seeds_earlier"] == {"earlier": 1, "of": 3}
    assert report.seeds_text(rows[1]) == ", earlier validation in 1/3 seeds"
    assert (race.seeds_earlier(rows[1], {"runs": [_run(1, 10.0), _run(2, 5.0, reached=False)]})
            == {"earlier": 1, "of": 1})
    assert race.seeds_earlier(rows[1], {"runs": [_run(5, 10.0)]}) is None
    assert report.seeds_text({"seeds_earlier": {"earlier": 1, "of": 1}}) == ""  # one seed: the gain says it all


def test_a_figure_one_seed_did_not_record_is_left_out_of_the_median_and_range_not_taken_for_zero():
    runs = [_run(0, 30.0), _run(1, 10.0), _run(2, 20.0)]
    runs[0]["wall_seconds"] = None  # a run made apart, read back from its log, that knows no wall time
    runs[1]["wall_seconds"] = 3.0
    (gpt2,) = _rows(runs, seeds=3)[:1]
    assert gpt2["wall_seconds"]["seeds"][0] is None
    assert gpt2["wall_seconds"]["median"] == statistics.median([3.0, 1.0]) == 2.0  # as 0, the median would be 1.0
    assert gpt2["wall_seconds"]["min"] == 1.0
    assert gpt2["train_seconds"]["median"] == 20.0


def test_a_rung_not_reached_by_every_seed_has_no_time_and_says_in_how_many_tokens():
    gpt2, muon = _rows([_run(0, 3.0), _run(1, 4.0), _run(2, 5.0)], [_run(0, 2.0), _run(1, 0, reached=False),
                                                                     _run(2, 2.5)])
    assert not muon["reached"] and muon["seeds_reached"] == 2
    assert muon["train_seconds"] == {"median": None, "min": None, "max": None, "seeds": [2.0, None, 2.5]}
    assert muon["gain_vs_prev"] is None
    record = {"rungs": [gpt2, muon]}
    assert report.rows(record)[1] == ["muon", "not reached in 256 tokens (2 of 3 seeds reached it)"]
    assert "not reached in 256 tokens" in report.progress_line(muon, 9.0)


def test_a_median_of_two_seeds_steps_is_shown_as_race_json_holds_it():
    """Two seeds at steps 180 and 190: the median is 185; at 180 and 195, 187.5, not a step rounded to (no step was
    measured there)."""
    for steps, shown in (((180, 190), "185"), ((180, 195), "187.5")):
        runs = [{**_run(seed, 1.8 + seed), "steps": n, "tokens": 64 * n} for seed, n in enumerate(steps)]
        (row,) = _rows(runs, seeds=2)
        cells = report.rows({"rungs": [row]})[0]
        assert cells[report.HEADERS.index("steps")] == shown
        assert cells[report.HEADERS.index("tokens")] == f"{64 * sum(steps) / 2:,.0f}"


def test_a_run_stopped_before_its_first_step_says_so():
    """Its reason names no step 0, and says --resume trains it (there is no checkpoint to continue)."""
    row = {"name": "muon", "status": "stopped", "reason": "before its first step; --resume trains it"}
    assert report.rows({"rungs": [row]}) == [["muon", "stopped: before its first step; --resume trains it"]]


def test_a_failed_seed_is_its_rows_reason():
    (row,) = _rows([_run(0, 3.0), _run(1, 0, status="failed")], seeds=2)
    assert row["status"] == "failed" and not row["reached"] and "exploded" in row["reason"]


def test_a_run_read_back_from_its_log_to_the_target_or_to_its_end():
    cfg = TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4, eval_every=2, target_val_loss=9.0)
    clock = {"train_s": 0.33, "warmup_s": 0.9, "warmup_steps": 1, "wall_s": 5.0, "tokens": 256, "validation_s": 0.2,
             "hellaswag_s": 0.0, "checkpoints_s": 0.0, "from_step": 0}
    log = [{"step": 1, "loss": 10.8, "ms": 900.0, "mfu": None},
           {"step": 2, "loss": 10.0, "ms": 100.0, "mfu": None, "val_loss": 9.5},  # an older version's: no clock
           {"step": 3, "loss": 9.5, "ms": 120.0, "mfu": None},
           {"step": 4, "loss": 9.0, "ms": 110.0, "mfu": None, "val_loss": 8.9, "clock": clock,
            "target": {"val_loss": 9.0, **clock}}]
    got = race.run_result(log, cfg, 0, "d")
    assert got["reached"] and got["steps"] == 4 and got["tokens"] == 256 and got["train_seconds"] == 0.33
    assert got["warmup_seconds"] == 0.9 and got["validation_seconds"] == 0.2 and got["ms_per_step"] == 110.0
    assert got["curve"] == [{"step": 2, "tokens": 128, "train_seconds": 0.1, "val_loss": 9.5},
                            {"step": 4, "tokens": 256, "train_seconds": 0.33, "val_loss": 8.9, "wall_seconds": 5.0,
                             "validation_seconds": 0.2, "warmup_seconds": 0.9}]  # the clock's three, no more
    missed = race.run_result(log[:3] + [{k: v for k, v in log[3].items() if k != "target"}], cfg, 1, "d")
    assert not missed["reached"] and missed["train_seconds"] is None and missed["steps_run"] == 4
    assert got["cards"] == []  # no config.json in "d": a run made apart names no card


def test_a_resumed_runs_curve_leaves_out_each_sessions_first_step_as_the_trainers_clock_does():
    cfg = TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4, eval_every=2)
    log = [{"step": 1, "ms": 900.0, "mfu": None, "warmup": True},
           {"step": 2, "ms": 100.0, "mfu": None, "val_loss": 9.5},
           {"step": 3, "ms": 800.0, "mfu": None, "warmup": True},  # resumed here: compiled again
           {"step": 4, "ms": 110.0, "mfu": None, "val_loss": 8.9}]
    got = race.run_result(log, cfg, 0, "d")
    assert [p["train_seconds"] for p in got["curve"]] == [0.1, 0.21] and got["ms_per_step"] == 105.0
    assert race.warmup_steps(log) == {0, 2}
    unmarked = [{k: v for k, v in e.items() if k != "warmup"} for e in log]
    assert race.warmup_steps(unmarked) == {0}  # an older version's log
    assert race.warmup_steps(unmarked[:3] + log[3:]) == {0}
    assert race.warmup_steps(unmarked[:2] + log[2:]) == {0, 2}  # begun by an older version, resumed by this one
    assert race.warmup_steps([]) == set()


def test_a_run_names_the_cards_its_config_records_and_one_race_card_is_said_without_a_mixed_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"device": {"name": "NVIDIA H200"}}))  # before `cards`
    assert race.run_cards(tmp_path) == ["NVIDIA H200"]
    (tmp_path / "config.json").write_text(json.dumps({"device": {"name": "NVIDIA H200"},
                                                      "cards": ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]}))
    assert race.run_cards(tmp_path) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]  # resumed on another card
    (tmp_path / "config.json").write_text("{damaged")
    assert race.run_cards(tmp_path) == []
    rows = [{"name": "gpt2", "cards": ["NVIDIA H200"], "runs": [{"cards": ["NVIDIA H200"]}, {"cards": []}]}]
    assert race.cards_of(rows) == ["NVIDIA H200"]
    record = {"cards": ["NVIDIA H200"], "device": {"name": "NVIDIA H200"}, "rungs": rows}
    assert report.cards_text(record) == "NVIDIA H200" and report.mixed_cards_line(record) == []
    assert report.cards_text({"device": {"name": "cpu"}}) == "cpu"  # a record from before runs named their card
    assert race.other_cards({"cards": ["NVIDIA H200", "cpu"]}, "cpu") == ["NVIDIA H200"]
    assert race.other_cards({"device": {"name": "NVIDIA H200"}}, "cpu") == ["NVIDIA H200"]  # a race.json before `cards`
    assert race.other_cards(None, "cpu") == []


# --- a real race, through the command ---------------------------------------------------------------------


def _no_network(*args, **kwargs):
    raise urllib.error.URLError("network is off in tests")


def _main(argv):
    import contextlib
    import io

    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        code = cli.main(argv)
    return code, said.getvalue()


# The race that the tests of reuse, --resume and targets that fall start from: gpt2 and muon to gpt2's own loss.
GPT2_MUON = ["--rungs", "gpt2,muon", "--target-val-loss", "gpt2", *SMALL]


def _race_once(module_tmp, name: str, *extra: str) -> Path:
    out = module_tmp(name) / "race"
    assert _main(["race", *GPT2_MUON, "--out", str(out), *extra])[0] == 0
    return out


@pytest.fixture(scope="module")
def gpt2_muon_race(shakespeare_cache, module_tmp) -> Path:
    """The GPT2_MUON race, finished (run once: the tests race on from copies of it)."""
    return _race_once(module_tmp, "gpt2-muon")


@pytest.fixture(scope="module")
def gpt2_muon_race_kept(shakespeare_cache, module_tmp) -> Path:
    """The GPT2_MUON race run with --keep-weights, finished (run once: the tests race on from copies of it)."""
    return _race_once(module_tmp, "gpt2-muon-kept", "--keep-weights")


def _copy(race_dir: Path, out: Path) -> Path:
    """A finished race copied to `out`: what the same race run at `out` would have left there."""
    return shutil.copytree(race_dir, out)


def _signal_at_first_step(monkeypatch, at: int = 1) -> list:
    """Engine.step sends this process SIGINT during its first call, or its `at`-th (the step completes, is saved,
    and the run stops); returns the calls made."""
    import os
    import signal

    from gpt2ladder.runtime.engine import Engine

    real_step, calls = Engine.step, []

    def step(self, x, y):
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, x, y)

    monkeypatch.setattr(Engine, "step", step)
    return calls


def test_a_race_stopped_resumed_read_back_and_refused_over_again(shakespeare_cache, tmp_path, monkeypatch, capsys):
    """One race of gpt2 and muon, one seed, four steps of 64 tokens, to a target both reach (a single race keeps the
    suite quick): a signal stops it in its first run, --resume finishes it, a second --resume trains nothing, and
    another race over it, or one of other settings, is refused."""
    from gpt2ladder.training.checkpoint import rng_state, set_rng_state

    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    argv = ["race", "--rungs", "gpt2,muon", "--target-val-loss", "10.6", "--out", str(tmp_path), *SMALL]
    calls, saved = _signal_at_first_step(monkeypatch), rng_state()
    bars, made = [], runlog.Reporter.__init__

    def reporter(self, *args, **kwargs):  # each run's bar: named by its rung and seed, cleared when it ends
        bars.append((kwargs["label"], kwargs["leave"]))
        made(self, *args, **kwargs)

    monkeypatch.setattr(runlog.Reporter, "__init__", reporter)
    try:
        code, text = _main(argv)
        assert code == 130 and "the race stopped; --resume continues it" in text
        record = json.loads((tmp_path / "race.json").read_text())
        assert record["partial"] and [(r["name"], r["status"]) for r in record["rungs"]] == [("gpt2", "stopped")]
        assert "gpt2  stopped: at step 1; --resume continues it" in text  # said once, with its step
        assert "a row it did not finish says so" in (tmp_path / "race.md").read_text()
        code, text = _main([*argv, "--resume"])
    finally:
        set_rng_state(saved)
    assert code == 0, text
    assert "resuming from step 1" in (tmp_path / "gpt2" / "seed0" / "train.txt").read_text()
    for r in ("gpt2", "muon"):  # nor the checkpoint the signal saved for --resume, once the run is done
        assert not list((tmp_path / r / "seed0").glob("*.pt"))
    capsys.readouterr()
    assert cli.main(["sample", str(tmp_path / "gpt2" / "seed0"), "--device", "cpu"]) != 0  # and says why
    assert "this run kept no weights (a race's run; race --keep-weights keeps them)" in capsys.readouterr().err
    record = _check_rows(tmp_path, text)
    assert len(calls) == sum(r["steps"]["median"] for r in record["rungs"])  # no step twice
    assert bars == [("gpt2 seed 0", False)] * 2 + [("muon seed 0", False)]
    _check_resume_trains_nothing(tmp_path, argv, monkeypatch)
    _check_refusals(tmp_path, capsys)


def test_a_race_to_the_gpt2_rungs_own_loss(shakespeare_cache, tmp_path, monkeypatch):
    """--target-val-loss gpt2: the gpt2 rung runs all its steps first; its worst seed's last validation is the
    target, which the rungs after it race to, and which a resumed race reads the same way."""
    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    argv = ["race", "--rungs", "gpt2,muon,muon+relu2", "--target-val-loss", "gpt2", "--out", str(tmp_path), *SMALL]
    code, text = _main([*argv, "--keep-weights"])
    assert code == 0, text
    record = json.loads((tmp_path / "race.json").read_text())
    gpt2, muon, stacked = record["rungs"]
    assert (stacked["name"], stacked["recipe"], stacked["status"]) == ("muon+relu2", "muon,relu2", "ok")
    last = gpt2["runs"][0]["curve"][-1]
    assert record["target_val_loss"] == last["val_loss"] and "gpt2 rung" in record["target_source"]
    assert record["config"]["settings"]["target_val_loss"] == "gpt2"
    assert gpt2["runs"][0]["steps_run"] == 4 and gpt2["reached"]  # it ran all its planned steps
    assert gpt2["steps"]["median"] == next(p["step"] for p in gpt2["runs"][0]["curve"]
                                           if p["val_loss"] <= last["val_loss"])
    assert muon["status"] == "ok" and muon["reached"] == (muon["runs"][0]["curve"][-1]["val_loss"] <= last["val_loss"])
    assert f"target: validation loss {last['val_loss']:g}, the gpt2 rung's after 4 steps" in text
    (run,) = gpt2["runs"]  # timed from the run's clock at the validation that met the target
    hit = next(p for p in run["curve"] if p["val_loss"] <= last["val_loss"])
    assert [run[k] for k in race.CLOCK_SECONDS] == [hit[k] for k in race.CLOCK_SECONDS]
    assert run["validation_seconds"] > 0 and run["warmup_seconds"] > 0
    assert run["wall_seconds"] > run["train_seconds"] + run["warmup_seconds"] + run["validation_seconds"]
    assert gpt2["wall_seconds"]["median"] == run["wall_seconds"]
    assert [_cells(record)[h] for h in ("wall s", "warm-up s", "validation s")] == [
        f"{gpt2[k]['median']:.1f}" for k in ("wall_seconds", "warmup_seconds", "validation_seconds")]
    assert (tmp_path / "race.md").is_file() and (tmp_path / "race.png").stat().st_size > 0
    card = record["device"]["name"]
    assert record["cards"] == [card] and gpt2["cards"] == muon["cards"] == [card]
    for r in ("gpt2", "muon"):  # --keep-weights: saved at the end only, and no best.pt on the way
        ran = json.loads((tmp_path / r / "seed0" / "config.json").read_text())["train_config"]
        assert ran["ckpt_every"] == 0 and ran["keep_best"] is False and ran["save_at_end"] is True
        assert (tmp_path / r / "seed0" / "ckpt.pt").is_file() and not (tmp_path / r / "seed0" / "best.pt").exists()
        assert "ckpt.pt, loss.png" in (tmp_path / r / "seed0" / "train.txt").read_text()
    # the gpt2 run as if it had trained on another card, and by a version whose validations kept no clock, in a race
    # whose race.json is as old: the race read back says so, names both cards, and knows no wall time for gpt2
    ran = tmp_path / "gpt2" / "seed0" / "config.json"
    ran.write_text(ran.read_text().replace(json.dumps(card), json.dumps("NVIDIA H100 80GB HBM3")))
    log = tmp_path / "gpt2" / "seed0" / "log.jsonl"
    log.write_text("".join(json.dumps({k: v for k, v in e.items() if k != "clock"}) + "\n" for e in _lines(log)))
    for row in record["rungs"]:
        for point in (p for r in row["runs"] for p in r["curve"]):
            for key in race.CLOCK_SECONDS:
                del point[key]
    (tmp_path / "race.json").write_text(json.dumps({**record, "cards": ["NVIDIA H100 80GB HBM3", card]}))
    code, text = _main([*argv, "--resume"])  # read back (without --keep-weights: the same race): nothing trained
    assert code == 0 and text.count("(finished earlier)") == 3
    assert f"notice: runs of this race trained on NVIDIA H100 80GB HBM3, and this one trains on {card}" in text
    again = json.loads((tmp_path / "race.json").read_text())
    assert again["rungs"][0]["wall_seconds"]["median"] is None and _cells(again)["wall s"] == "-"
    assert again["rungs"][0]["train_seconds"] == gpt2["train_seconds"]
    assert again["rungs"][1]["wall_seconds"] == muon["wall_seconds"]  # its log has its clock
    assert again["target_val_loss"] == last["val_loss"] and again["cards"] == ["NVIDIA H100 80GB HBM3", card]
    md = (tmp_path / "race.md").read_text()
    assert f"# gpt2ladder race: model tiny on NVIDIA H100 80GB HBM3 and {card} (mixed cards), to validation loss" in md
    assert f"- mixed cards: gpt2 on NVIDIA H100 80GB HBM3; muon on {card}; muon+relu2 on {card}." in md


def test_a_race_at_several_budgets_writes_each_race_and_compares_them(shakespeare_cache, tmp_path, monkeypatch, capsys):
    """--steps 8,4: a race per budget, the shortest first, each in steps-N/ with its own target (gpt2's after that
    budget); budgets.json gives each rung's median and its share of gpt2's at each budget; --resume trains nothing
    again and writes the same figures; without it the folder is refused before anything runs."""
    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    small = [a for a in SMALL if a not in ("--steps", "4")]
    argv = ["race", "--rungs", "gpt2,muon", "--target-val-loss", "gpt2", "--steps", "8,4", "--out", str(tmp_path),
            *small]
    code, text = _main(argv)
    assert code == 0, text
    assert text.index("budget: runs planned for 4 steps") < text.index("budget: runs planned for 8 steps")
    record = json.loads((tmp_path / "budgets.json").read_text())
    assert [b["steps"] for b in record["budgets"]] == [4, 8] and not record["partial"]
    for budget in record["budgets"]:
        raced = json.loads((tmp_path / f"steps-{budget['steps']}" / "race.json").read_text())
        assert (raced["config"]["settings"]["steps"] == budget["steps"]
                and budget["planned_tokens"] == budget["steps"] * 64)
        assert budget["target_val_loss"] == raced["target_val_loss"] is not None
        gpt2, muon = budget["rungs"]
        assert gpt2["train_seconds"] == raced["rungs"][0]["train_seconds"] and gpt2["share_of_first"] == 1.0
        want = muon["train_seconds"]["median"] / gpt2["train_seconds"]["median"] if muon["reached"] else None
        assert muon["share_of_first"] == want
    assert record["budgets"][0]["target_val_loss"] != record["budgets"][1]["target_val_loss"]  # each budget's own
    table = (tmp_path / "budgets.md").read_text()
    assert "| rung | 4 steps (256 tokens) | 8 steps (512 tokens) |" in table
    assert f"| gpt2 | {record['budgets'][0]['rungs'][0]['train_seconds']['median']:.1f} |" in table
    assert (tmp_path / "budgets.png").stat().st_size > 0 and "wrote " in text and "budgets.md" in text
    code, again = _main([*argv, "--resume"])
    assert code == 0 and again.count("(finished earlier)") == 4
    assert json.loads((tmp_path / "budgets.json").read_text())["budgets"] == record["budgets"]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    capsys.readouterr()
    refusals = {"already holds a race at budgets 4, 8": argv,  # another race over it, without --resume
                "leaves out 4": [*argv[:6], "8,16", *argv[7:], "--resume"],  # budgets.json would drop one
                "give --steps 4,8 to continue it": [*argv[:6], "8", *argv[7:], "--resume"]}  # one race into it
    for says, refused in refusals.items():
        assert cli.main(refused) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_races_at_budgets_stopped_in_the_second_keep_the_first_and_resume(shakespeare_cache, tmp_path, monkeypatch):
    """A signal in the first step of the second budget's race: exit 130, budgets.json written with the first budget
    whole and the second stopped (partial); --resume finishes the second without training the first again."""
    from gpt2ladder.training.checkpoint import rng_state, set_rng_state

    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    small = [a for a in SMALL if a not in ("--steps", "4")]
    argv = ["race", "--rungs", "gpt2", "--target-val-loss", "10.8", "--steps", "2,4", "--out", str(tmp_path), *small]
    calls, saved = _signal_at_first_step(monkeypatch, at=3), rng_state()  # steps 1-2: the 2-step race
    try:
        code, text = _main(argv)
        assert code == 130, text
        record = json.loads((tmp_path / "budgets.json").read_text())
        assert record["partial"] and [b["steps"] for b in record["budgets"]] == [2, 4]
        assert record["budgets"][0]["rungs"][0]["status"] == "ok" and record["budgets"][1]["partial"]
        assert record["budgets"][1]["rungs"][0]["status"] == "stopped"
        code, text = _main([*argv, "--resume"])
    finally:
        set_rng_state(saved)
    assert code == 0, text
    record = json.loads((tmp_path / "budgets.json").read_text())
    assert not record["partial"] and [b["rungs"][0]["status"] for b in record["budgets"]] == ["ok", "ok"]
    assert len(calls) == sum(b["rungs"][0]["tokens"]["median"] // 64 for b in record["budgets"])  # no step twice
    assert "gpt2 seed 0: " in text and "(finished earlier)" in text.split("budget: runs planned for 4")[0]


def _budget(steps, *seconds, eval_every=10, ms=10.0):
    """A race.json at one budget: a rung per list of seeds' training seconds (None: not reached)."""
    rows = []
    for i, secs in enumerate(seconds):
        reached = None not in secs
        rows.append({"name": f"r{i}", "recipe": f"r{i}", "reached": reached, "status": "ok", "ms_per_step": ms,
                     "tokens": race.spread([1] * len(secs), reached),
                     "train_seconds": race.spread(list(secs), reached)})
    return {"config": {"settings": {"steps": steps, "tokens_per_step": 64, "eval_every": eval_every}},
            "target_val_loss": 3.0, "target_source": "given", "partial": False, "cards": ["cpu"], "rungs": rows}


def test_a_budgets_cell_keeps_the_races_noise_rule_and_the_chart_draws_gaps(tmp_path):
    """Against the first rung at the same budget: ranges apart and medians 10 s apart is a share; overlapping
    ranges are within noise; apart but nearer than one validation (200 steps of 10 ms = 2 s) is under one
    validation; a rung that missed a budget is a gap in its line and the chart still draws."""
    import warnings

    records = [_budget(4, [20.0, 21.0, 22.0], [10.0, 11.0, 12.0], [19.0, 21.5, 23.0], [22.1, 22.2, 22.3],
                       eval_every=200),
               _budget(8, [30.0, 31.0, 32.0], [None, 5.0, 6.0], [None], [15.0, 16.0, 17.0])]
    record = race.budgets_record(records, torch.device("cpu"), CPU_CAPS, partial=False)
    cells = {r[0]: r[1:] for r in report._budget_rows(record)}
    assert cells["r1"][:2] == ["11.0 (0.52)", "not reached"]
    assert cells["r2"][:2] == ["21.5 (1.02, within noise)", "not reached"]
    assert cells["r3"][:2] == ["22.2 (1.06, under one validation)", "16.0 (0.52)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no empty-legend warning, no NaN complaint
        report.budgets_chart(record, tmp_path / "b.png")
        nothing = race.budgets_record([_budget(4, [None])], torch.device("cpu"), CPU_CAPS, partial=True)
        report.budgets_chart(nothing, tmp_path / "none.png")
    assert (tmp_path / "b.png").stat().st_size > 0 and (tmp_path / "none.png").stat().st_size > 0
    assert "partial" in report.format_budgets(nothing)


def test_one_target_at_every_budget_gives_each_rungs_shortest_budget_that_reaches_it():
    """With one target at every budget, a rung's shortest planned budget whose every seed reached it and its median
    seconds there (a seed that missed leaves that budget out); with a target per budget, no such column."""
    records = [_budget(8, [30.0, 31.0, 32.0], [None, 5.0, 6.0], [None]),  # given longest first: read shortest first
               _budget(4, [20.0, 21.0, 22.0], [None, 1.0, 2.0], [None])]
    record = race.budgets_record(records[::-1], torch.device("cpu"), CPU_CAPS, partial=False)
    assert race.shortest_budgets(record["budgets"][::-1]) == record["shortest"]  # the order given is not read
    assert [(r["name"], r["steps"]) for r in record["shortest"]] == [("r0", 4), ("r1", None), ("r2", None)]
    assert record["shortest"][0]["train_seconds"]["median"] == 21.0
    records[0]["rungs"][1]["train_seconds"] = race.spread([4.0, 5.0, 6.0], True)
    records[0]["rungs"][1]["reached"] = True
    record = race.budgets_record(records[::-1], torch.device("cpu"), CPU_CAPS, partial=False)
    cells = {r[0]: r[-1] for r in report._budget_rows(record)}
    assert cells == {"target": "", "r0": "4 steps: 21.0 s", "r1": "8 steps: 5.0 s", "r2": "none of these"}
    md = report.format_budgets(record)
    assert "| shortest budget to it |" in md and "every seed reached it" in md
    assert race.budgets_record(records[:1], torch.device("cpu"), CPU_CAPS, partial=True)["shortest"] is None
    for r in records:  # --target-val-loss gpt2: each budget's own target, equal or not
        r["config"]["settings"]["target_val_loss"] = "gpt2"
    assert race.budgets_record(records[::-1], torch.device("cpu"), CPU_CAPS, partial=False)["shortest"] is None
    records[1]["target_val_loss"] = 3.1
    record = race.budgets_record(records[::-1], torch.device("cpu"), CPU_CAPS, partial=False)
    assert record["shortest"] is None and "shortest" not in report.format_budgets(record)


def test_the_budgets_record_says_which_rungs_plan_steps_of_a_batch_of_their_own():
    """A column's header states the race's tokens; a rung with its own @tokens_per_step is named under it, and each
    budget's row keeps the rung's own batch (the race's where it has none)."""
    plain = _budget(4, [20.0], [10.0])
    own = _budget(4, [20.0], [10.0])
    own["rungs"][1].update(name="r1@tokens_per_step=32", tokens_per_step=32)
    assert "its own" not in report.format_budgets(race.budgets_record([plain], torch.device("cpu"), CPU_CAPS, False))
    record = race.budgets_record([own], torch.device("cpu"), CPU_CAPS, partial=False)
    assert [row["tokens_per_step"] for row in record["budgets"][0]["rungs"]] == [64, 32]
    md = report.format_budgets(record)
    assert "| rung | 4 steps (256 tokens) |" in md
    assert "- r1@tokens_per_step=32: each a rung whose steps are of a batch of its own (@tokens_per_step)" in md


@pytest.mark.parametrize("steps, says", [("4,4", "given twice"), ("4,x", "expected a positive integer"),
                                         (",", "comma list")])
def test_a_bad_list_of_budgets_is_one_line(steps, says, tmp_path, capsys):
    assert cli.main(["race", "--steps", steps, "--out", str(tmp_path / "out"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") <= 3 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_folder_of_other_files_is_refused_for_several_budgets(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["race", "--steps", "4,8", "--out", str(tmp_path), *SMALL[2:]]) == 2
    assert "notes.txt" in capsys.readouterr().err and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def _cells(record: dict, row: int = 0) -> dict:
    """A rung's row of race.md's table, by its headers."""
    return dict(zip(report.headers(record), report.rows(record)[row]))


def _lines(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_race_cut_off_inside_the_rung_that_sets_its_target_still_writes_its_record(tmp_path):
    """race.md and race.png of a race stopped in the gpt2 rung under --target-val-loss gpt2: no target yet, said."""
    from gpt2ladder.report.records import write_record

    cfg = race.RaceConfig(rungs=(race.RaceRung("gpt2", "gpt2", ("baseline",), 2),), seeds=2,
                          train=TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4, eval_every=2),
                          target_source="the gpt2 rung's", from_baseline=True)
    runs = {"gpt2": [{**_logged(0, [(2, 1.0, 9.5), (4, 2.0, 9.1)]), "steps_run": 4, "planned_tokens": 256,
                      "ms_per_step": 5.0, "mfu": None, "warmup_seconds": None, "validation_seconds": None}]}
    tokens = types.SimpleNamespace(source="t", n_tokens=9, sha256="abc")
    record = race.race_record(cfg, torch.device("cpu"), CPU_CAPS, tokens, runs, partial=True)
    assert record["target_val_loss"] is None
    paths = write_record(tmp_path, "race", record, report.format_markdown, report.race_chart)
    assert "to validation loss gpt2's (not set: its rung did not finish)" in (tmp_path / "race.md").read_text()
    assert all(p.stat().st_size > 0 for p in paths)


def _check_rows(out, text) -> dict:
    record = json.loads((out / "race.json").read_text())
    assert record["command"] == "race" and record["target_val_loss"] == 10.6 and not record["partial"]
    assert {"git_sha", "device", "versions", "date"} <= record.keys()
    gpt2, muon = record["rungs"]
    assert (gpt2["name"], gpt2["recipe"], muon["recipe"]) == ("gpt2", "gpt2", "muon")
    ran = [json.loads((out / r / "seed0" / "config.json").read_text())["train_config"] for r in ("gpt2", "muon")]
    assert ran[0]["muon_lr"] is None  # each rung its own rates, a CPU's raised as --lr is
    assert ran[1]["muon_lr"] == DEFAULTS["race"]["cpu"]["muon_lr"] == pytest.approx(5 * MUON_RATES["muon_lr"])
    assert ran[1]["head_lr"] == DEFAULTS["race"]["cpu"]["head_lr"] == pytest.approx(5 * MUON_RATES["head_lr"])
    assert ran[0]["save_at_end"] is ran[1]["save_at_end"] is False  # no --keep-weights
    for row in (gpt2, muon):
        assert row["reached"] and row["status"] == "ok"
        for key in ("train_seconds", "wall_seconds", "tokens", "steps"):
            assert row[key]["median"] == row[key]["seeds"][0] and len(row[key]["seeds"]) == 1
        (run,) = row["runs"]
        assert run["curve"][-1]["val_loss"] <= 10.6 and all(p["val_loss"] > 10.6 for p in run["curve"][:-1])
        assert row["tokens"]["median"] == row["steps"]["median"] * 64
        assert (out / row["name"] / "seed0" / "log.jsonl").is_file()
        assert "compile" not in row["step_rungs"]
    assert muon["within_noise_of_prev"] is (muon["train_seconds"]["median"] == gpt2["train_seconds"]["median"])
    assert (out / "race.md").read_text().count("| gpt2 |") == 2 and (out / "race.png").stat().st_size > 0
    assert "race gpt2: target 10.6 reached in" in text and "race muon: target 10.6 reached in" in text
    for row in (gpt2, muon):  # each run's line: the loss it measured, not the target; its first step a warm-up
        (run,) = row["runs"]
        assert (f"{row['name']} seed 0: val loss {run['curve'][-1]['val_loss']:.4f} (target 10.6) at step "
                f"{run['steps']} in {run['train_seconds']:.1f} s of training ({run['warmup_seconds']:.1f} s warm-up "
                "step,") in text
    return record


def _check_resume_trains_nothing(out, argv, monkeypatch):
    before = json.loads((out / "race.json").read_text())

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(race, "train_run", no_training)
    code, text = _main([*argv, "--resume"])
    assert code == 0 and text.count("(finished earlier)") == 2
    after = json.loads((out / "race.json").read_text())
    assert [r["train_seconds"] for r in after["rungs"]] == [r["train_seconds"] for r in before["rungs"]]


def _check_refusals(out, capsys):
    capsys.readouterr()
    assert cli.main(["race", "--target-val-loss", "10.6", "--out", str(out), *SMALL]) == 2
    assert "already holds a race" in capsys.readouterr().err
    assert cli.main(["race", "--rungs", "gpt2,muon", "--target-val-loss", "10.5", "--out", str(out), "--resume",
                     *SMALL]) == 2
    err = capsys.readouterr().err
    assert "ran with other settings (target_val_loss)" in err and len(err.strip().splitlines()) == 1


# --- bad input: one line, exit 2, nothing started -----------------------------------------------------------


def _corpus(folder, train_tokens=2000):
    folder.mkdir()
    fmt.write_shard(folder / "c_val_000000.bin", np.arange(500, dtype=np.uint16))
    fmt.write_shard(folder / "c_train_000001.bin", np.arange(train_tokens, dtype=np.uint16))
    return folder


@pytest.mark.parametrize("argv, says", [
    (["--rungs", "gpt2,flash"], "unknown race rung flash"),
    (["--rungs", "gpt2,speedrun+flash"], "race rung speedrun+flash: unknown recipe part flash"),
    (["--rungs", "gpt2,speedrun,speedrun+muon"], "race rungs speedrun and speedrun+muon both train recipe"),
    (["--target-val-loss", "11"], "--target-val-loss must be above 0 and below 10.8249 (ln 50257"),
    (["--rungs", "gpt2,speedrun,gpt2"], "race rung gpt2 is given twice in --rungs"),
    (["--rungs", "gpt2,speedrun-wsd,speedrun - wsd"], "race rung speedrun-wsd is given twice in --rungs"),
    (["--eval-every", "100"], "the race validates every 100 steps of 64 tokens, more than the 60 steps a run is "
     "planned for: give --eval-every 60 or fewer"),
    (["--target-val-loss", "5", "--steps", "20", "--eval-every", "10", "--rungs", "gpt2,gpt2@steps=5"],
     "more than the 5 steps of 64 tokens rung gpt2@steps=5 trains: give --eval-every 5 or fewer"),
    (["--target-val-loss", "5", "--steps", "20", "--eval-every", "12", "--tokens-per-step", "128", "--rungs",
      "gpt2,gpt2@tokens_per_step=64@steps=20"],  # the advice in the race's steps, not the rung's (of half the tokens)
     "every 12 steps of 128 tokens, more than the 10 steps of 128 tokens rung gpt2@tokens_per_step=64@steps=20 trains: "
     "give --eval-every 10 or fewer"),
    (["--resume"], "--resume: OUT is not a folder, so there is no race to continue"),
    (["--target-val-loss", "-1"], "argument --target-val-loss: expected a positive number"),
    (["--rungs", "muon", "--target-val-loss", "gpt2"], "--rungs must start with gpt2"),
    (["--target-val-loss", "abc"], "expected a positive number or gpt2, got abc"),
    (["--data", "TEXT"], "no --target-val-loss, and text.txt has no known target"),
    (["--data", "SHORT", "--target-val-loss", "5"], "too few for one sequence of 33; use a longer text or a smaller "
     "--seq-len"),  # and not --eval-every 0, which a race refuses
    (["--data", "CORPUS", "--target-val-loss", "5", "--steps", "100"], "fewer than one rung's 6,400"),
    (["--data", "CORPUS", "--target-val-loss", "5", "--steps", "20", "--rungs", "gpt2,speedrun,speedrun@steps=100"],
     "fewer than one rung's 6,400 (rung speedrun@steps=100's 100 steps of 64 tokens)"),
    (["--target-val-loss", "5", "--steps", "2,4", "--rungs", "gpt2,speedrun,speedrun@steps=3"],
     "race rung speedrun@steps=3 is planned for steps of its own, which are no budget's: race it at one --steps"),
    (["--data", "CORPUS", "--target-val-loss", "5", "--steps", "20", "--eval-every", "2", "--rungs",
      "gpt2,gpt2@tokens_per_step=128"],
     "fewer than one rung's 2,560 (rung gpt2@tokens_per_step=128's 20 steps of 128 tokens)"),
    (["--target-val-loss", "5", "--rungs", "gpt2,gpt2@tokens_per_step=48"], "race rung gpt2@tokens_per_step=48: "
     "tokens_per_step must be a whole number of 32-token sequences, got 48"),
    (["--target-val-loss", "5", "--eval-every", "3", "--rungs", "gpt2,gpt2@tokens_per_step=96"], "race rung "
     "gpt2@tokens_per_step=96: --tokens-per-step 96 is not a multiple of batch size x seq len x processes = 2 x 32"),
    (["--target-val-loss", "5", "--eval-every", "1", "--rungs", "gpt2,gpt2@tokens_per_step=128"],
     "race rung gpt2@tokens_per_step=128: the race validates every 64 tokens (1 step of 64), not a whole number of "
     "its steps of 128"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_starts(argv, says, tmp_path, capsys, shakespeare_cache):
    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question. " * 40)
    corpus = _corpus(tmp_path / "corpus")
    (tmp_path / "short.txt").write_text("To be, or not to be. " * 8)  # about 56 tokens: 5 for validation
    files = {"TEXT": tmp_path / "text.txt", "CORPUS": corpus, "SHORT": tmp_path / "short.txt"}
    argv = [str(files[a]) if a in files else a for a in argv]
    out = tmp_path / "out"
    says = says.replace("OUT", str(out))
    small = ["--batch-size", "2", "--seq-len", "32", "--device", "cpu"]
    assert cli.main(["race", *small, "--out", str(out), *argv]) == 2
    captured = capsys.readouterr()
    assert says in captured.err and len(captured.err.strip().splitlines()) == 1 and "race:" not in captured.out
    assert not out.exists() and "--eval-every 0" not in captured.err


@pytest.mark.parametrize("rungs, says", [
    ("gpt2,gpt2@tokens_per_step=100000000", "race rung gpt2@tokens_per_step=100000000: the batches made on the host "
     "(100,000,256 tokens"),
    ("gpt2,speedrun", None),
])
def test_a_rung_whose_own_batch_does_not_fit_the_host_names_its_own_setting(rungs, says, monkeypatch, tmp_path,
                                                                             capsys, shakespeare_cache):
    """On a host of 1 GiB, a rung of 100M-token steps is refused in one line that names @tokens_per_step, the
    setting that made its batch, before anything starts; the race's own rungs on the same host are not refused."""
    monkeypatch.setattr("gpt2ladder.runtime.hardware._host_memory", lambda: 1 << 30)
    out = tmp_path / "out"
    argv = ["race", "--batch-size", "2", "--seq-len", "32", "--device", "cpu", "--target-val-loss", "5",
            "--rungs", rungs, "--out", str(out)]
    if says is None:  # the check itself: what a 1-GiB host refuses is the rung's batch, not the race
        monkeypatch.setattr(race_command, "_race", lambda *a, **k: (0, {}))
        assert cli.main(argv) == 0
        return
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("use a smaller @tokens_per_step, --tokens-per-step or --eval-batches")
    assert not out.exists()


def test_under_torchrun_the_race_says_it_runs_on_one_process(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["race", "--out", str(tmp_path / "out"), "--device", "cpu"]) == 2
    assert "runs on one process" in capsys.readouterr().err and not (tmp_path / "out").exists()


# --- rungs with settings of their own (`speedrun@muon_lr=0.03`) ---------------------------------------------


def test_a_rung_with_settings_trains_its_base_rungs_recipe_with_them():
    names = race.parse_race_rungs("gpt2, speedrun @ muon_lr = 0.03, speedrun, gpt2@lr=3e-4@warmup_steps=0, "
                                  "speedrun-wsd")
    assert names == ("gpt2", "speedrun", "speedrun@muon_lr=0.03", "gpt2@lr=3e-4@warmup_steps=0", "speedrun-wsd")
    recipes = dict(race.race_rungs(names))
    assert recipes["speedrun@muon_lr=0.03"] == recipes["speedrun"] and recipes["gpt2@lr=3e-4@warmup_steps=0"] == "gpt2"
    assert race.split_settings("gpt2@lr=3e-4@warmup_steps=0") == ("gpt2", {"lr": 3e-4, "warmup_steps": 0})
    train = TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4, eval_every=2, target_val_loss=9.0,
                        lr=6e-4, min_lr=6e-5, warmup_steps=2, muon_lr=0.02)
    rungs = tuple(race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names))
    cfg = race.RaceConfig(rungs=rungs, seeds=1, train=train)
    by = {r.name: cfg.run_config(r, 0) for r in rungs}
    assert by["speedrun@muon_lr=0.03"] == dataclasses.replace(by["speedrun"], muon_lr=0.03)  # nothing else differs
    swept = by["gpt2@lr=3e-4@warmup_steps=0"]
    assert (swept.lr, swept.warmup_steps) == (3e-4, 0) and swept.min_lr == pytest.approx(3e-5)  # a tenth, as the race's
    assert by["gpt2"].lr == 6e-4 and by["gpt2"].muon_lr is None  # AdamW's run leaves the muon part's rates unset
    assert rungs[2].to_dict()["settings"] == {"muon_lr": 0.03}


def test_a_rung_with_settings_is_read_against_its_base_rung_and_no_other_rung_against_it():
    names = ("gpt2", "speedrun", "speedrun@muon_lr=0.03", "speedrun-wsd", "speedrun-wsd@muon_lr=0.04")
    rungs = [race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names)]
    cfg = dataclasses.replace(_cfg(), rungs=tuple(rungs))
    rows = [race.rung_row(r, [_run(s, 10.0 + i + s / 10) for s in range(3)], cfg) for i, r in enumerate(cfg.rungs)]
    race.add_gains(rows)
    # speedrun-wsd against speedrun, not against speedrun@muon_lr=0.03 (the same recipe, other rates)
    assert [r["gain_vs"] for r in rows] == [None, "gpt2", "speedrun", "speedrun", "speedrun-wsd"]


@pytest.mark.parametrize("spec, says", [
    ("gpt2,speedrun@muon_lr=0.03", "trains rung speedrun's recipe with settings of its own, and is read against it: "
                                   "add speedrun to --rungs"),
    ("gpt2,gpt2@muon_lr=0.1", "muon_lr is the muon part's, and gpt2 trains recipe gpt2, which has no muon"),
    ("gpt2,gpt2@decay_fraction=0.5", "decay_fraction is the wsd part's, and gpt2 trains recipe gpt2, which has no wsd"),
    ("gpt2,speedrun,speedrun@decay_fraction=1.5", "decay_fraction is a share of the steps, at most 1, got 1.5"),
    ("gpt2,gpt2@lr=0", "lr must be a positive number, got '0'"),
    ("gpt2,gpt2@lr=x", "lr must be a positive number, got 'x'"),
    ("gpt2,gpt2@lr=nan", "lr must be a positive number"),
    ("gpt2,gpt2@warmup_steps=1.5", "warmup_steps must be a whole number of steps, 0 to"),
    ("gpt2,gpt2@foo=1", "@foo=1 sets no known setting; a rung may set lr=X, min_lr=X, warmup_steps=X"),
    ("gpt2,gpt2@lr=1@lr=2", "lr is set twice"),
    ("gpt2,gpt2@", "@ sets no known setting"),
    ("gpt2,@lr=1", "race rung @lr=1 names no rung before its @"),
    # an Arabic-Indic one: float() reads it, a folder would not
    ("gpt2,gpt2@lr=\u0661", "lr must be a positive number"),
    ("gpt2,gpt2@lr=1_0", "lr must be a positive number"),
    ("gpt2,gpt2@warmup_steps=-1", "warmup_steps must be a whole number of steps, 0 to"),
    ("gpt2,speedrun,speedrun@steps=0", "steps must be a whole number of steps, 1 to 1,000,000,000, got '0'"),
    ("gpt2,speedrun,speedrun@steps=1000000001", "steps must be a whole number of steps, 1 to 1,000,000,000"),
    ("gpt2,gpt2@warmup_steps=99999999999", "warmup_steps must be a whole number of steps, 0 to 1,000,000,000"),
    ("gpt2,speedrun,speedrun@steps=1e3", "steps must be a whole number of steps, 1 to 1,000,000,000, got '1e3'"),
    ("gpt2,gpt2@tokens_per_step=0", "tokens_per_step must be a whole number of tokens, 1 to 1,000,000,000, got '0'"),
    ("gpt2,gpt2@tokens_per_step=4096.0", "tokens_per_step must be a whole number of tokens, 1 to 1,000,000,000"),
    ("gpt2,gpt2@lr=0.001@min_lr=0.01", "its min_lr 0.01 is above its lr 0.001"),
    ("gpt2,speedrun,speedrun-wsd@lr=0.001,speedrun-wsd", "is read against speedrun-wsd, which races after it: list "
                                                         "speedrun-wsd first"),
    ("gpt2,speedrun,speedrun@muon_lr=0.03,speedrun@muon_lr=0.030", "both train recipe muon,rope")])
def test_a_rung_whose_settings_cannot_be_raced_is_one_line(spec, says):
    with pytest.raises(UsageError, match=re.escape(says)) as err:
        race.race_rungs(race.parse_race_rungs(spec))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("names, twin", [
    (("gpt2", "gpt2@lr=0.0006"), "gpt2"),  # the race's own rate
    (("gpt2", "gpt2@lr=0.003@min_lr=0.0003"), "gpt2"),  # the race's min_lr is lr / 10, 0.00030000000000000003
    (("gpt2", "gpt2@lr=0.001", "gpt2@lr=0.001@min_lr=0.0001"), "gpt2@lr=0.001")])  # two names, one run
def test_a_rung_whose_runs_another_rung_trains_already_is_refused(names, twin):
    train = TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4, eval_every=2, target_val_loss=9.0,
                        lr=0.003 if "0.003" in names[1] else 6e-4, min_lr=(0.003 if "0.003" in names[1] else 6e-4) / 10)
    rungs = tuple(race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names))
    with pytest.raises(UsageError, match=f"gives itself the settings rung {re.escape(twin)} trains with already"):
        race.RaceConfig(rungs=rungs, seeds=1, train=train)


def test_a_written_rung_with_no_recipe_alone_before_it_is_read_against_a_rung_without_settings():
    names = ("gpt2", "gpt2@lr=0.002", "momentum_warmup+speedrun")
    rungs = [race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names)]
    cfg = dataclasses.replace(_cfg(), rungs=tuple(rungs))
    rows = [race.rung_row(r, [_run(s, 10.0 + i + s / 10) for s in range(3)], cfg) for i, r in enumerate(cfg.rungs)]
    race.add_gains(rows)
    assert [r["gain_vs"] for r in rows] == [None, "gpt2", "gpt2"]


def test_a_rung_planned_for_steps_of_its_own_warms_up_as_train_would_for_them():
    """`speedrun@steps=N` plans the rung's runs for N steps: its schedule (warm-up, decay) spans N, validated on the
    race's grid, and its row's planned tokens are its own; its warm-up is `train --steps N`'s (5% of N, also where
    the race's odd steps would scale to one less: 224 of 4497 is 149.4 of 3000), and a warm-up it sets is its own."""
    names = ("gpt2", "speedrun", "speedrun@steps=600", "speedrun@steps=700@warmup_steps=0", "speedrun@steps=3000")
    rungs = tuple(race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names))
    train = TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4497, eval_every=37, target_val_loss=9.0,
                        lr=6e-4, min_lr=6e-5, warmup_steps=224, muon_lr=0.02)
    cfg = race.RaceConfig(rungs=rungs, seeds=1, train=train)
    by = {r.name: cfg.run_config(r, 0) for r in rungs}
    assert by["speedrun@steps=600"] == dataclasses.replace(by["speedrun"], steps=600, warmup_steps=30)
    assert by["speedrun@steps=3000"].warmup_steps == 150 == defaults.warmup_steps(3000)
    assert (by["speedrun@steps=700@warmup_steps=0"].steps, by["speedrun@steps=700@warmup_steps=0"].warmup_steps) == (
        700, 0)
    rows = [race.rung_row(r, [_run(0, 10.0)], cfg) for r in rungs]
    assert [row["planned_tokens"] for row in rows] == [4497 * 64, 4497 * 64, 600 * 64, 700 * 64, 3000 * 64]
    with pytest.raises(UsageError, match="gives itself the settings rung speedrun trains with already"):
        race.RaceConfig(rungs=(*rungs[:2], race.RaceRung("speedrun@steps=4497", rungs[1].recipe, ("baseline",), 2)),
                        seeds=1, train=train)


def test_a_race_with_a_rung_of_its_own_steps_trains_it_for_them(tmp_path, shakespeare_cache):
    """End to end: the rung's runs stop at their own last step (or the target), its row says its own planned tokens,
    and race.md says so (at several budgets such a rung is refused, as is a corpus too small for it: bad input)."""
    out = tmp_path / "race"
    code, text = _main(["race", "--rungs", "gpt2,speedrun,speedrun@steps=2", "--target-val-loss", "1.0", "--out",
                        str(out), *SMALL])
    assert code == 0, text
    record = json.loads((out / "race.json").read_text())
    rows = {r["name"]: r for r in record["rungs"]}
    assert rows["speedrun@steps=2"]["planned_tokens"] == 2 * 64 and rows["speedrun"]["planned_tokens"] == 4 * 64
    assert [r["steps_run"] for r in rows["speedrun@steps=2"]["runs"]] == [2]  # the target is far below: all its steps
    assert [r["steps_run"] for r in rows["speedrun"]["runs"]] == [4]
    config = json.loads((race.run_dir(out, "speedrun@steps=2", 0) / "config.json").read_text())["train_config"]
    assert config["steps"] == 2
    assert "not reached in 128 tokens" in (out / "race.md").read_text()
    assert "but a rung with @steps=N, planned for N" in (out / "race.md").read_text()


def test_a_rung_with_a_batch_of_its_own_validates_on_the_races_batches_after_the_same_tokens():
    """`gpt2@tokens_per_step=32` in a race of 64-token steps validated every 2: steps of 32 tokens, validated every 4
    of them on the race's 2-sequence batches; its row says its own batch and planned tokens. The race's own batch is
    the rung it is set on, refused as a twin."""
    names = ("gpt2", "speedrun", "gpt2@tokens_per_step=32", "speedrun@tokens_per_step=128@steps=2")
    rungs = tuple(race.RaceRung(n, r, ("baseline",), 1) for n, r in race.race_rungs(names))
    train = TrainConfig(batch_size=1, seq_len=32, tokens_per_step=64, steps=4, eval_every=2, target_val_loss=9.0,
                        warmup_steps=2, muon_lr=0.02)
    cfg = race.RaceConfig(rungs=rungs, seeds=1, train=train)
    by = {r.name: cfg.run_config(r, 0) for r in rungs}
    assert by["gpt2"].val_batch is None and by["speedrun"].val_batch is None
    assert by["gpt2@tokens_per_step=32"] == dataclasses.replace(by["gpt2"], tokens_per_step=32, val_batch=2,
                                                                eval_every=4)
    big = by["speedrun@tokens_per_step=128@steps=2"]
    assert (big.tokens_per_step, big.steps, big.eval_every, big.val_batch, big.warmup_steps) == (128, 2, 1, 2, 0)
    assert cfg.own_batch_rungs == names[2:] and _cfg().own_batch_rungs == ()
    rows = [race.rung_row(r, [_run(0, 10.0)], cfg) for r in rungs]
    assert [(row["tokens_per_step"], row["planned_tokens"]) for row in rows] == [(64, 256), (64, 256), (32, 128),
                                                                                (128, 256)]
    with pytest.raises(UsageError, match="gives itself the settings rung gpt2 trains with already"):
        race.RaceConfig(rungs=(rungs[0], race.RaceRung("gpt2@tokens_per_step=64", "gpt2", ("baseline",), 1)),
                        seeds=1, train=train)


@pytest.mark.parametrize("kind", ["text", "corpus"])
def test_a_run_with_a_validation_batch_of_its_own_validates_on_the_same_rows(kind, tmp_path):
    """val_batch: the validation rows of a run stepping on 2 sequences with val_batch 4 are those of a run stepping
    on 4 (random windows of a text, the first tokens of a corpus), cut into equal pieces the micro-batch holds,
    so the mean over the pieces is the mean over the rows."""
    from gpt2ladder import data as data_mod
    from gpt2ladder.training import trainer

    if kind == "text":
        (tmp_path / "text.txt").write_text("To be, or not to be, that is the question. " * 200)
        tokens = data_mod.load_tokens(str(tmp_path / "text.txt"))
    else:
        tokens = data_mod.load_tokens(str(_corpus(tmp_path / "corpus")))
    wide = TrainConfig(batch_size=4, seq_len=16, tokens_per_step=64, steps=4, eval_every=2, eval_batches=3)
    own = dataclasses.replace(wide, batch_size=3, tokens_per_step=48, val_batch=4)
    narrow = dataclasses.replace(wide, batch_size=3, tokens_per_step=48)

    def rows(cfg):
        return torch.cat([x for x, _ in trainer.validation_batches(cfg, tokens)])

    assert torch.equal(rows(own), rows(wide)) and not torch.equal(rows(narrow), rows(wide))
    assert {len(x) for x, _ in trainer.validation_batches(own, tokens)} == {2}  # 4 rows a batch, in pieces of 2
    if kind == "corpus":  # fewer rows than a batch: the only batch, 3 rows, in equal pieces (the mean is the rows')
        few = dataclasses.replace(own, val_tokens=50, batch_size=2, tokens_per_step=32)
        assert [len(x) for x, _ in trainer.validation_batches(few, tokens)] == [1, 1, 1]
    with pytest.raises(UsageError, match="val_batch must be at least 1"):
        dataclasses.replace(wide, val_batch=0)


def test_rows_of_other_batches_are_read_seed_by_seed_on_their_tokens_and_their_own_validation_interval():
    """seeds_earlier counts tokens, not steps (40 steps of 32 tokens come before 30 of 64), and the validation
    interval is each row's own steps (read_every) at its own step time."""
    cfg = _cfg(seeds=1)
    row, other = (race.rung_row(r, [_run(0, 1.0)], cfg) for r in cfg.rungs[:2])
    row["runs"][0]["steps"], other["runs"][0]["steps"] = 40, 30
    row["tokens_per_step"], row["read_every"], row["ms_per_step"], other["ms_per_step"] = 32, 4, 100.0, 150.0
    assert race.seeds_earlier(row, other) == {"earlier": 1, "of": 1}
    row["train_seconds"] = {"median": 1.0, "min": 1.0, "max": 1.0}
    other["train_seconds"] = {"median": 1.35, "min": 1.35, "max": 1.35}
    assert race.noise_rule(row, other, 2) == (False, True)  # 4 steps x 100 ms = 0.4 s > 0.35 s; 2 x 150 ms is not
    del row["read_every"]
    assert race.noise_rule(row, other, 2) == (False, False)


def test_a_race_with_a_rung_of_its_own_batch_validates_it_after_the_same_tokens(tmp_path, shakespeare_cache):
    """End to end on CPU: the rung's curve lies on the race's grid of tokens, its run validated on the race's
    batches, and race.md says what its batch is."""
    out = tmp_path / "race"
    code, text = _main(["race", "--rungs", "gpt2,gpt2@tokens_per_step=128@steps=2", "--target-val-loss", "1.0",
                        "--out", str(out), "--keep-weights", *SMALL])
    assert code == 0, text
    assert "an @tokens_per_step rung of its own, validated after the same tokens" in text
    rows = {r["name"]: r for r in json.loads((out / "race.json").read_text())["rungs"]}
    own = rows["gpt2@tokens_per_step=128@steps=2"]
    assert [p["tokens"] for p in own["runs"][0]["curve"]] == [p["tokens"] for p in rows["gpt2"]["runs"][0]["curve"]]
    assert [p["step"] for p in own["runs"][0]["curve"]] == [1, 2]
    config = json.loads((race.run_dir(out, own["name"], 0) / "config.json").read_text())["train_config"]
    assert [config[k] for k in ("tokens_per_step", "val_batch", "eval_every", "batch_size")] == [128, 2, 1, 2]
    assert "a rung with @tokens_per_step=N, steps of N tokens" in (out / "race.md").read_text()
    run = race.run_dir(out, own["name"], 0)  # trained on by `train --resume`, it keeps validating on the same rows
    code, text = _main(["train", "--resume", "--out", str(run), "--steps", "3", "--device", "cpu", "--no-progress"])
    assert code == 0, text
    assert json.loads((run / "config.json").read_text())["train_config"]["val_batch"] == 2


def test_the_decay_fraction_reaches_the_wsd_rungs_alone_and_a_race_from_before_it_resumes():
    """A race's --decay-fraction (here 0.5) reaches the rungs with wsd, a rung's own @decay_fraction overrides it,
    and a rung without wsd runs at the default, so its runs are any race's of that recipe. A race.json written
    before the setting existed resumes as a race at the default, and not as one at another."""
    names = ("gpt2", "speedrun", "speedrun@decay_fraction=0.6")
    rungs = tuple(race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names))
    cfg = dataclasses.replace(_cfg(), rungs=rungs)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, decay_fraction=0.5))
    assert [cfg.run_config(r, 0).decay_fraction for r in rungs] == [WSD_DECAY_FRACTION, 0.5, 0.6]
    older = json.loads(json.dumps({"config": _cfg().to_dict()}))
    del older["config"]["settings"]["decay_fraction"]
    race.check_same_race(_cfg(), older)  # the default: the same race
    with pytest.raises(UsageError, match=r"ran with other settings \(decay_fraction\)"):
        race.check_same_race(cfg, older)


def test_a_resumed_race_may_add_rungs_but_not_leave_out_one_it_has_runs_of():
    """A race.json is written whole from the race's rungs: continuing with fewer would drop the rows of the ones left
    out, which on another machine (race.json carried, the run folders not) are their only copy."""
    cfg = _cfg()
    fewer = dataclasses.replace(cfg, rungs=cfg.rungs[:2])
    earlier = json.loads(json.dumps({"config": cfg.to_dict(), "data": {"sha256": "abc"}, "rungs": [
        {"name": r.name, "recipe": r.recipe, "runs": [{"seed": 0, "status": "ok"}] if r.name != "rope" else []}
        for r in cfg.rungs]}))
    race.check_same_race(fewer, earlier, "abc")  # rope has no runs yet: left out, nothing is lost
    race.check_same_race(cfg, earlier, "abc")
    earlier["rungs"][2]["runs"] = [{"seed": 0, "status": "stopped"}]
    with pytest.raises(UsageError, match="has runs of rung rope, which --rungs leaves out"):
        race.check_same_race(fewer, earlier, "abc")
    race.check_same_race(cfg, earlier, "abc")
    older = {k: v for k, v in earlier.items() if k != "data"}  # a record that names no corpus: its runs train again
    race.check_same_race(fewer, older, "abc")


def test_a_race_of_a_rate_against_the_base_rung_trains_each_run_with_its_own(tmp_path, shakespeare_cache):
    out = tmp_path / "out"
    code, text = _main(["race", "--rungs", "gpt2,gpt2@lr=0.002", "--target-val-loss", "10.6", "--out", str(out),
                        *SMALL])
    assert code == 0, text
    ran = {r: json.loads((out / r / "seed0" / "config.json").read_text())["train_config"]
           for r in ("gpt2", "gpt2@lr=0.002")}
    assert ran["gpt2@lr=0.002"]["lr"] == 0.002 and ran["gpt2@lr=0.002"]["min_lr"] == pytest.approx(0.0002)
    assert ran["gpt2"]["lr"] == DEFAULTS["race"]["cpu"]["lr"] != 0.002
    record = json.loads((out / "race.json").read_text())
    swept = record["rungs"][1]
    assert (swept["name"], swept["recipe"], swept["gain_vs"]) == ("gpt2@lr=0.002", "gpt2", "gpt2")
    assert record["config"]["rungs"][1]["settings"] == {"lr": 0.002}
    assert "race gpt2@lr=0.002:" in text
    # its folder is the race's own: --resume reads both rungs back, and trains a rung added with settings
    code, again = _main(["race", "--rungs", "gpt2, gpt2 @ lr = 0.002, gpt2@warmup_steps=2", "--target-val-loss", "10.6",
                         "--out", str(out), "--resume", *SMALL])
    assert code == 0, again
    assert again.count("(finished earlier)") == 2 and "race gpt2@warmup_steps=2:" in again
    assert json.loads((out / "gpt2@warmup_steps=2" / "seed0" / "config.json").read_text())["train_config"][
        "warmup_steps"] == 2


# --- --reuse: another race's finished runs ----------------------------------------------------------------------


def test_reuse_miss_says_why_a_folder_gives_none_of_a_races_runs(tmp_path):
    cfg = _cfg(seeds=1)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, save_at_end=False))  # as without --keep-weights
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc") == "it holds no run of this race's rungs and seeds"
    where = race.run_dir(tmp_path, "muon", 0)
    where.mkdir(parents=True)
    held = {"train_config": json.loads(json.dumps(cfg.run_config(cfg.rungs[1], 0).to_dict())), "data": {"sha256": "x"}}
    (where / "config.json").write_text(json.dumps(held))
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc") == "its muon seed 0 trained on another corpus"
    held["data"]["sha256"] = "abc"
    (where / "config.json").write_text(json.dumps(held))
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc") == "its muon seed 0 did not finish"  # no log
    (where / "log.jsonl").write_text(json.dumps({"step": 2, "loss": 8.6, "ms": 1.0, "val_loss": 8.5, "target": {}})
                                     + "\n")
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc") is None  # finished: the race would copy it once it got there
    # a run is copied onto its own card alone: seconds from two cards are not one race's
    (where / "config.json").write_text(json.dumps({**held, "cards": ["H100"], "device": {"name": "H100"}}))
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc", "H100") is None
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc", "H200") == "its muon seed 0 trained on another card (H100)"
    muon = cfg.run_config(cfg.rungs[1], 0)
    assert race.reused_run((tmp_path,), tmp_path / "o" / "muon" / "seed0", "muon", muon, 0, "abc", "H200") is None
    assert not (tmp_path / "o").exists()
    assert race.reused_run((tmp_path,), tmp_path / "o" / "muon" / "seed0", "muon", muon, 0, "abc", "H100")["seed"] == 0
    (where / "config.json").write_text(json.dumps(held))
    saved = json.loads(json.dumps(held))
    saved["train_config"]["ckpt_every"] = 7  # how a run saves itself is not what it computes
    (where / "config.json").write_text(json.dumps(saved))
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc") is None
    older = json.loads(json.dumps(held))
    assert older["train_config"].pop("compile_backend") == "inductor"  # a version before the setting ran at its default
    (where / "config.json").write_text(json.dumps(older))
    assert race.reuse_miss(tmp_path, cfg, 9.0, "abc") is None
    for damaged in ([held], {**held, "train_config": "x"}, {**held, "data": "abc"}, {**held, "data": None}):
        (where / "config.json").write_text(json.dumps(damaged))  # a damaged folder is passed over, never raises
        assert race.reuse_miss(tmp_path, cfg, 9.0, "abc") in ("it holds no run of this race's rungs and seeds",
                                                              "its muon seed 0 trained on another corpus")
        muon = cfg.run_config(cfg.rungs[1], 0)
        assert race.reused_run((tmp_path,), tmp_path / "out" / "muon" / "seed0", "muon", muon, 0, "abc") is None
    (where / "config.json").write_text(json.dumps(held))
    assert race.reuse_miss(tmp_path, cfg, 8.0, "abc") == "its muon seed 0 ran with other settings (target_val_loss)"
    kept = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, save_at_end=True))
    assert "under --keep-weights every run is trained" in race.reuse_miss(tmp_path, kept, 9.0, "abc")
    # under --target-val-loss gpt2, only the gpt2 rung's runs are compared until the race knows its target
    baseline = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, target_val_loss=None), from_baseline=True)
    assert race.reuse_miss(tmp_path, baseline, None, "abc") == "it holds no run of this race's rungs and seeds"
    assert race.reuse_miss(tmp_path, baseline, 9.0, "abc") is None


_TRAIN_RUN = race.train_run


def _counting_trains(monkeypatch) -> list:
    """The recipes of the runs the race trains from here on, in order (each still trained)."""
    trained = []
    monkeypatch.setattr(race, "train_run", lambda cfg, *a, **k: trained.append(cfg.recipe) or _TRAIN_RUN(cfg, *a, **k))
    return trained


def test_a_race_reuses_another_races_runs_of_the_very_same_settings_and_trains_the_rest(tmp_path, monkeypatch,
                                                                                          capsys, gpt2_muon_race):
    tmp_path = tmp_path.resolve()  # the runs name their source resolved
    first, second, other = tmp_path / "first", tmp_path / "second", tmp_path / "other"
    base = ["--target-val-loss", "gpt2", *SMALL]
    _copy(gpt2_muon_race, first)
    (first / "gpt2" / "seed0" / "ckpt.pt").write_bytes(b"a kept checkpoint")  # as --keep-weights would leave one
    trained = _counting_trains(monkeypatch)
    code, text = _main(["race", "--rungs", "gpt2,rope", "--out", str(second), "--reuse", str(first), *base])
    assert code == 0 and trained == ["rope"]  # gpt2's run is the first race's, copied
    assert f"(reused from {first / 'gpt2' / 'seed0'})" in text and "no run copied" not in text
    gpt2 = [json.loads((d / "race.json").read_text())["rungs"][0] for d in (first, second)]
    assert gpt2[1]["runs"][0]["reused_from"] == str(first / "gpt2" / "seed0")
    assert gpt2[1]["runs"][0]["curve"] == gpt2[0]["runs"][0]["curve"]
    assert gpt2[1]["train_seconds"] == gpt2[0]["train_seconds"]  # so the target, read off it, is the same too
    copied = second / "gpt2" / "seed0"
    assert (copied / "log.jsonl").read_text() == (first / "gpt2" / "seed0" / "log.jsonl").read_text()
    assert not (copied / "ckpt.pt").exists()  # the race keeps no weights without --keep-weights
    assert f"gpt2 seed 0 from {first / 'gpt2' / 'seed0'}" in (second / "race.md").read_text()
    # read back on --resume, the run still says where it came from
    code, text = _main(["race", "--rungs", "gpt2,rope", "--out", str(second), "--resume", *base])
    assert code == 0 and trained == ["rope"] and text.count("(reused from") == 1
    assert json.loads((second / "race.json").read_text())["rungs"][0]["runs"][0]["reused_from"] == str(
        first / "gpt2" / "seed0")
    # another learning rate is another run, and a run that must keep its weights keeps its own: trained, not reused
    trained.clear()
    code, text = _main(["race", "--rungs", "gpt2", "--out", str(tmp_path / "kept"), "--reuse", str(first),
                        "--keep-weights", *base])
    assert code == 0 and trained == ["gpt2"] and (tmp_path / "kept" / "gpt2" / "seed0" / "ckpt.pt").is_file()
    notice = (f"notice: --reuse {first}: no run will be copied from it: under --keep-weights every run is trained, "
              "since no weights are copied")
    assert notice in text and text.index(notice) < text.index("gpt2 seed 0")  # before the run it cannot serve
    assert text.count("notice: --reuse") == 1  # not said again once the race is done
    trained.clear()
    code, text = _main(["race", "--rungs", "gpt2", "--lr", "0.002", "--out", str(other), "--reuse", str(first), *base])
    assert code == 0 and trained == ["gpt2"] and "reused" not in text
    assert f"notice: --reuse {first}: no run will be copied from it: its gpt2 seed 0 ran with other settings (lr, " \
        "min_lr)" in text
    # a folder whose gpt2 run ran at another rate, beside one that served: a notice for the first alone
    trained.clear()
    code, text = _main(["race", "--rungs", "gpt2,qk_norm", "--out", str(tmp_path / "third"), "--reuse", str(other),
                        "--reuse", str(first), *base])
    assert code == 0 and trained == ["qk_norm"] and text.count("notice: --reuse") == 1
    # said once the race is done: before, the runs after gpt2 waited on its target, so what the folder serves was
    # not known
    notice = f"notice: --reuse {other}: no run copied from it: its gpt2 seed 0 ran with other settings (lr, min_lr)"
    assert notice in text and text.index(notice) > text.index("wrote ")
    # a race that trains nothing (every run finished earlier) gives no notice: the folders cost it nothing
    code, text = _main(["race", "--rungs", "gpt2,qk_norm", "--out", str(tmp_path / "third"), "--resume", "--reuse",
                        str(other), *base])
    assert code == 0 and text.count("(finished earlier)") == 1 and "notice: --reuse" not in text
    # continued (--resume) with a rung to train, the notice comes once the race knows which runs it trained
    trained.clear()
    code, text = _main(["race", "--rungs", "gpt2,qk_norm,relu2", "--out", str(tmp_path / "third"), "--resume",
                        "--reuse", str(other), *base])
    assert code == 0 and trained == ["qk_norm,relu2"] and text.count("notice: --reuse") == 1
    notice = f"notice: --reuse {other}: no run copied from it: its gpt2 seed 0 ran with other settings (lr, min_lr)"
    assert notice in text and text.index(notice) > text.index("wrote ")
    capsys.readouterr()
    assert cli.main(["race", "--out", str(tmp_path / "x"), "--reuse", str(tmp_path / "none"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "--reuse" in err and "is not a folder" in err and len(err.strip().splitlines()) == 1


def test_a_race_reuses_the_runs_a_record_holds_without_their_folders(tmp_path, monkeypatch, gpt2_muon_race):
    """--reuse DIR where DIR holds a race.json alone (a record): its runs of this race's very settings, as that race
    planned them, serve this race; a race-wide setting a run does not read (Muon's rate, for gpt2) is no
    difference, one it reads is; the reusing race's own race.json keeps them for --resume."""
    tmp_path = tmp_path.resolve()
    first, record, second = tmp_path / "first", tmp_path / "record", tmp_path / "second"
    base = ["--target-val-loss", "gpt2", *SMALL]
    _copy(gpt2_muon_race, first)
    record.mkdir()
    shutil.copyfile(first / "race.json", record / "race.json")
    held = json.loads((record / "race.json").read_text())
    trained = _counting_trains(monkeypatch)
    code, text = _main(["race", "--rungs", "gpt2,muon", "--muon-lr", "0.03", "--out", str(second), "--reuse",
                        str(record), *base])
    assert code == 0, text
    assert trained == ["muon"]  # gpt2, an AdamW rung, reads no Muon rate: the record's run serves
    assert f"(reused from {record / 'race.json'})" in text
    assert f"notice: --reuse {record}" not in text  # it served a run
    again = json.loads((second / "race.json").read_text())
    assert again["rungs"][0]["runs"][0]["reused_from"] == str(record / "race.json")
    assert again["rungs"][0]["runs"][0]["curve"] == held["rungs"][0]["runs"][0]["curve"]
    assert again["target_val_loss"] == held["target_val_loss"]  # read off the same gpt2 run
    assert not (second / "gpt2").exists()  # nothing copied: the record holds no files of the run
    code, text = _main(["race", "--rungs", "gpt2,muon", "--muon-lr", "0.03", "--out", str(second), "--resume", *base])
    assert code == 0 and trained == ["muon"] and text.count("(finished earlier)") == 1
    assert text.count(f"(reused from {record / 'race.json'})") == 1  # read back, it still says where it came from
    # at the record's own settings both of its runs serve; at another AdamW rate, none does, and a notice says why
    trained.clear()
    code, text = _main(["race", "--rungs", "gpt2,muon", "--out", str(tmp_path / "same"), "--reuse", str(record), *base])
    assert code == 0 and trained == [] and text.count("(reused from") == 2
    code, text = _main(["race", "--rungs", "gpt2", "--lr", "0.002", "--out", str(tmp_path / "lr"), "--reuse",
                        str(record), *base])
    assert code == 0 and trained == ["gpt2"]
    assert f"notice: --reuse {record}: no run will be copied from it: its gpt2 seed 0 ran with other settings (lr, " \
        "min_lr)" in text
    # the second race's muon ran at 0.03 as the race's rate: a race of muon@muon_lr=0.03 reads it from that row
    trained.clear()
    shutil.copyfile(second / "race.json", record / "race.json")
    code, text = _main(["race", "--rungs", "gpt2,muon,muon@muon_lr=0.03", "--out", str(tmp_path / "named"),
                        "--reuse", str(record), *base])
    assert code == 0 and trained == ["muon"], text  # muon at the default rate is a run of its own
    assert f"(reused from {record / 'race.json'}, its muon seed 0)" in text


def test_recorded_unlike_names_what_differs_and_passes_a_damaged_record_over(tmp_path):
    cfg = _cfg(seeds=1)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, save_at_end=False))
    run = {"seed": 0, "status": "ok", "reached": True, "curve": [{"step": 2, "val_loss": 8.5, "train_seconds": 1.0}],
           "ms_per_step": 1.0, "mfu": None, "cards": ["H100"], **dict.fromkeys(race.METRICS, 1)}
    rows = [{"name": r.name, "recipe": r.recipe, "step_rungs": list(r.step_rungs), "batch_size": r.batch_size,
             "runs": [dict(run)]} for r in cfg.rungs]
    record = {"config": json.loads(json.dumps(cfg.to_dict())), "data": {"sha256": "abc"}, "target_val_loss": 9.0,
              "rungs": rows}
    muon = cfg.rungs[1]

    def unlike(rec, rung=muon, card="H100", sha="abc"):
        (tmp_path / "race.json").write_text(json.dumps(rec))
        return race.recorded_unlike(tmp_path, cfg, rung, 0, sha, card)

    why, got = unlike(record)
    assert why == "" and got["seed"] == 0
    assert unlike(record, card="H200")[0] == "trained on another card (H100)"
    assert unlike(record, sha="abd")[0] == "trained on another corpus"
    other = json.loads(json.dumps(record))
    other["config"]["settings"]["muon_lr"] = 0.05
    assert unlike(other)[0] == "ran with other settings (muon_lr)"
    assert unlike(other, rung=cfg.rungs[0])[0] == ""  # gpt2 reads no Muon rate
    other["config"]["settings"]["model"]["n_layer"] += 1
    assert unlike(other)[0] == "ran on another model"
    other = json.loads(json.dumps(record))
    other["rungs"][1]["step_rungs"] = ["baseline", "tf32"]
    assert unlike(other)[0] == "ran its step with tf32"
    other["rungs"][1]["recipe"] = "gpt2"
    assert unlike(other)[0] == "trained recipe gpt2, here muon"
    other = json.loads(json.dumps(record))
    other["config"]["compile_backend"] = "aot_eager"  # how it compiled changes its seconds
    assert unlike(other)[0] == "ran with other settings (compile_backend)"
    other = json.loads(json.dumps(record))
    other["config"]["settings"]["tokens_per_step"] = 96  # no whole number of this rung's micro-batches
    assert unlike(other)[0] == "ran with other settings (tokens_per_step)"
    other = json.loads(json.dumps(record))
    other["config"]["settings"]["eval_near"] = 0.5
    assert unlike(other)[0] == "ran with other settings (eval_near)"
    near = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_near=0.5))
    (tmp_path / "race.json").write_text(json.dumps(other))  # a given target, kept in its settings: it serves
    assert race.recorded_unlike(tmp_path, near, muon, 0, "abc", "H100")[0] == ""
    assert race.recorded_unlike(tmp_path, near.with_target(8.9), muon, 0, "abc", "H100")[0] == (
        "ran with other settings (target_val_loss)")
    # under --target-val-loss gpt2 the gpt2 rung's runs knew no target, so --eval-near did nothing to them: they serve
    # a race with or without it; the runs after them, which validated near the target, do not
    baseline = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, target_val_loss=None), from_baseline=True)
    other = json.loads(json.dumps(record))
    other["config"] = json.loads(json.dumps(dataclasses.replace(baseline, train=dataclasses.replace(
        baseline.train, eval_near=0.5)).to_dict()))
    (tmp_path / "race.json").write_text(json.dumps(other))
    for near, why in ((0.0, "ran with other settings (eval_near)"), (0.5, "validated more often near its race's "
                                                                      "target then (--eval-near), which race.json does "
                                                                      "not keep")):
        here = dataclasses.replace(baseline, train=dataclasses.replace(baseline.train, eval_near=near))
        assert race.recorded_unlike(tmp_path, here, cfg.rungs[0], 0, "abc", "H100")[0] == ""
        assert race.recorded_unlike(tmp_path, here.with_target(9.0), muon, 0, "abc", "H100")[0] == why
    other = json.loads(json.dumps(record))
    other["rungs"][1]["runs"][0]["cards"] = [None, "H100"]  # a damaged card is passed over, never raises
    served = {**other["rungs"][1]["runs"][0], "reused_from": str((tmp_path / "race.json").resolve())}
    assert unlike(other) == ("", served)
    assert unlike(other, card="H200")[0] == "trained on another card (H100)"
    damaged = []
    for point in ("x", {"step": 2, "val_loss": 8.5}, {"step": "2", "val_loss": 8.5, "train_seconds": 1.0},
                  {"step": 2, "val_loss": None, "train_seconds": 1.0}):
        other = json.loads(json.dumps(record))
        other["rungs"][1]["runs"][0]["curve"].append(point)  # a point a run could not be timed by
        damaged.append(other)
    other = json.loads(json.dumps(record))
    other["rungs"][1]["runs"][0]["status"] = "stopped"
    for damaged in (*damaged, other, {"rungs": "x"}, [], {**record, "config": None}, {**record, "rungs": [None]}):
        assert unlike(damaged) == (None, None)
    (tmp_path / "race.json").write_text("{")
    assert race.recorded_unlike(tmp_path, cfg, muon, 0, "abc") == (None, None)
    assert race.recorded_unlike(tmp_path / "none", cfg, muon, 0, "abc") == (None, None)


def test_recorded_unlike_plans_the_records_runs_apart_from_this_races_other_rungs(tmp_path):
    """Rungs of this race that the record's settings would make twins (muon at the record's rate, and muon with it
    as its own) do not stop the record from serving a run they do not touch; a row of another name that ran the
    very run serves it."""
    train = TrainConfig(batch_size=2, seq_len=32, tokens_per_step=64, steps=4, eval_every=2, target_val_loss=9.0,
                        muon_lr=0.03)
    names = ("gpt2", "muon", "muon@muon_lr=0.05")
    rungs = tuple(race.RaceRung(n, r, ("baseline",), 2) for n, r in race.race_rungs(names))
    cfg = race.RaceConfig(rungs=rungs, seeds=1, train=dataclasses.replace(train, save_at_end=False))
    recorded = dataclasses.replace(cfg, rungs=rungs[:2], train=dataclasses.replace(cfg.train, muon_lr=0.05))
    run = {"seed": 0, "status": "ok", "reached": True, "curve": [{"step": 2, "val_loss": 8.5, "train_seconds": 1.0}],
           "ms_per_step": 1.0, "mfu": None, "cards": ["H100"], **dict.fromkeys(race.METRICS, 1)}
    record = {"config": json.loads(json.dumps(recorded.to_dict())), "data": {"sha256": "abc"},
              "target_val_loss": 9.0, "rungs": [{"name": r.name, "recipe": r.recipe, "step_rungs": ["baseline"],
                                                 "batch_size": 2, "runs": [dict(run)]} for r in rungs[:2]]}
    (tmp_path / "race.json").write_text(json.dumps(record))
    assert race.recorded_unlike(tmp_path, cfg, rungs[0], 0, "abc")[0] == ""  # gpt2 reads no Muon rate
    assert race.recorded_unlike(tmp_path, cfg, rungs[1], 0, "abc")[0] == "ran with other settings (muon_lr)"
    # muon@muon_lr=0.05 has no row there, but the record's muon row ran at 0.05: that very run, read as its own
    why, run = race.recorded_unlike(tmp_path, cfg, rungs[2], 0, "abc")
    assert why == "" and run["reused_from"] == f"{(tmp_path / 'race.json').resolve()}, its muon seed 0"
    assert race.recorded_unlike(tmp_path, cfg, rungs[2], 0, "abc", "H200")[0] is None  # the reason is its own row's


def test_a_dry_run_says_what_each_run_would_be_and_changes_nothing(tmp_path, monkeypatch, gpt2_muon_race):
    tmp_path = tmp_path.resolve()
    first, record = tmp_path / "first", tmp_path / "record"
    base = ["--target-val-loss", "gpt2", *SMALL]
    trained = _counting_trains(monkeypatch)
    fresh = tmp_path / "fresh"
    code, text = _main(["race", "--rungs", "gpt2,muon", "--out", str(fresh), "--dry-run", *base])
    assert code == 0 and trained == [] and not fresh.exists(), text
    assert "gpt2 seed 0: trains" in text and "1 run of the rungs after gpt2 waits on its target" in text
    assert "dry run: 2 runs: 1 to train, 1 waiting on the target; nothing trained or written" in text
    _copy(gpt2_muon_race, first)
    record.mkdir()
    shutil.copyfile(first / "race.json", record / "race.json")
    trained.clear()
    # a run stopped part-way, its checkpoint kept: --resume would continue it
    stopped = race.run_dir(first, "rope", 0)
    stopped.mkdir(parents=True)
    (stopped / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 9.0, "ms": 1.0}) + "\n")
    (stopped / "ckpt.pt").write_bytes(b"a checkpoint")
    def held():
        return {p: p.read_bytes() if p.is_file() else None for p in first.rglob("*")}

    before = held()
    code, text = _main(["race", "--rungs", "gpt2,muon,rope,qk_norm", "--out", str(first), "--resume", "--dry-run",
                        *base])
    assert code == 0 and trained == [], text
    assert "gpt2 seed 0: finished earlier" in text and "muon seed 0: finished earlier" in text
    assert "rope seed 0: continues from its checkpoint" in text and "qk_norm seed 0: trains" in text
    assert "dry run: 4 runs: 2 finished earlier, 1 to continue, 1 to train;" in text
    assert held() == before  # nothing written, made or dropped
    # from a record: its runs reused, the race's target known from them, so every rung after gpt2 is decided
    code, text = _main(["race", "--rungs", "gpt2,muon,rope", "--out", str(tmp_path / "other"), "--reuse",
                        str(record), "--dry-run", *base])
    assert code == 0 and trained == [] and not (tmp_path / "other").exists(), text
    assert f"gpt2 seed 0: reused from {record / 'race.json'}" in text and "rope seed 0: trains" in text
    assert "dry run: 3 runs: 2 reused, 1 to train;" in text
    code, text = _main(["race", "--rungs", "gpt2,muon,rope", "--out", str(tmp_path / "other"), "--reuse",
                        str(record), *base])
    assert code == 0 and trained == ["muon,rope"] and text.count("(reused from") == 2  # as the dry run said
    code, text = _main(["race", "--rungs", "gpt2", "--lr", "0.002", "--out", str(tmp_path / "lr"), "--reuse",
                        str(record), "--dry-run", *base])
    assert code == 0 and f"notice: --reuse {record}: no run would be copied from it: its gpt2 seed 0 ran with other " \
        "settings (lr, min_lr)" in text
    # at several budgets, each budget's race is planned and said
    code, text = _main(["race", "--rungs", "gpt2", "--out", str(tmp_path / "budgets"), "--dry-run",
                        "--target-val-loss", "gpt2", *SMALL[2:], "--steps", "4,6"])
    assert code == 0 and text.count("budget: runs planned for") == 2 and text.count("gpt2 seed 0: trains") == 2, text
    assert "gpt2ladder race --dry-run: 1 rung x 1 seed," in text
    assert not (tmp_path / "budgets").exists() and trained == ["muon,rope"]
    assert "dry run: 1 run: 1 to train;" in text
    # the checks of a real race are made: an --out that cannot be a folder is one line, exit 2
    code, text = _main(["race", "--rungs", "gpt2", "--out", str(record / "race.json" / "x"), "--dry-run", *base])
    assert code == 2


def test_a_dry_run_says_a_run_whose_target_fell_trains_again_from_its_start(tmp_path, monkeypatch,
                                                                              gpt2_muon_race_kept):
    """A run kept with its weights stopped at the target of its day; gpt2's runs, edited to end lower, now set a
    lower one: the race trains it again from its start, its checkpoint no start for it, and the dry run says so."""
    out = tmp_path / "out"
    base = ["--rungs", "gpt2,muon", "--target-val-loss", "gpt2", "--out", str(out), "--keep-weights", *SMALL]
    _copy(gpt2_muon_race_kept, out)
    assert (race.run_dir(out, "muon", 0) / "ckpt.pt").is_file()
    log = race.run_dir(out, "gpt2", 0) / "log.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    last = max(i for i, e in enumerate(entries) if "val_loss" in e)
    entries[last]["val_loss"] = 1.0  # below every loss muon's run reached
    log.write_text("".join(json.dumps(e) + "\n" for e in entries))
    trained = _counting_trains(monkeypatch)
    code, text = _main(["race", *base, "--resume", "--dry-run"])
    assert code == 0 and trained == [], text
    assert "muon seed 0: trains again from its start: the target fell below where it stopped" in text
    assert "dry run: 2 runs: 1 finished earlier, 1 to train;" in text
    code, text = _main(["race", *base, "--resume"])
    assert code == 0 and trained == ["muon"], text  # as the dry run said


def test_a_race_continues_from_its_record_alone_on_the_same_corpus(tmp_path, monkeypatch, capsys, gpt2_muon_race):
    """race.json keeps every finished run's figures: --resume in a folder that holds only a race's race.json (its
    record, carried to another machine without the run folders) reads those runs from it and trains the rest. A
    record of another corpus is refused in one line; one that names no corpus trains its runs again."""
    first, carried = tmp_path / "first", tmp_path / "carried"
    base = ["--target-val-loss", "gpt2", *SMALL]
    _copy(gpt2_muon_race, first)
    record = json.loads((first / "race.json").read_text())
    assert len(record["data"]["sha256"]) == 64
    carried.mkdir()
    (carried / "race.json").write_text(json.dumps(record))
    trained = _counting_trains(monkeypatch)
    code, text = _main(["race", "--rungs", "gpt2,muon,rope", "--out", str(carried), "--resume", *base])
    assert code == 0, text
    assert trained == ["muon,rope"] and text.count("(finished earlier)") == 2
    # each rung's line comes once, after its own last seed, though the record holds later rungs' runs by then
    assert [line.split(":")[0] for line in text.splitlines() if line.startswith("race ")] == \
        ["race gpt2", "race muon", "race rope"]
    again = json.loads((carried / "race.json").read_text())
    assert [r["name"] for r in again["rungs"]] == ["gpt2", "muon", "rope"]
    for before, now in zip(record["rungs"], again["rungs"]):
        assert now["runs"][0]["curve"] == before["runs"][0]["curve"]
        assert now["train_seconds"] == before["train_seconds"]
    assert again["target_val_loss"] == record["target_val_loss"]  # read off the recorded gpt2 run, as before
    assert not (carried / "gpt2").exists()  # nothing trained or copied for the recorded runs
    # a record that names no corpus (a version before it did) says nothing of what its runs read: they train again
    trained.clear()
    older = tmp_path / "older"
    older.mkdir()
    (older / "race.json").write_text(json.dumps({**record, "data": {k: v for k, v in record["data"].items()
                                                                     if k != "sha256"}}))
    code, text = _main(["race", "--rungs", "gpt2", "--out", str(older), "--resume", *base])
    assert code == 0 and trained == ["gpt2"]
    assert "notice: the race.json here names no corpus sha256 (an older version wrote it), so nothing says what its " \
           "runs read: 1 finished run it records train again" in text
    code, text = _main(["race", "--rungs", "gpt2", "--out", str(older), "--resume", *base])
    assert code == 0 and "names no corpus sha256" not in text  # the race.json it wrote names it; its run is read
    # a race stopped before it comes to the recorded runs keeps them in its race.json, their only copy
    trained.clear()
    stopping = tmp_path / "stopping"
    stopping.mkdir()
    (stopping / "race.json").write_text(json.dumps(record))

    def stopped(cfg, device, where, caps, tokens, seed, *a, **k):
        trained.append((cfg.recipe, seed))
        return 143, {"seed": seed, "dir": str(where), "status": "stopped", "reason": "stopped at step 1"}

    monkeypatch.setattr(race, "train_run", stopped)
    code, text = _main(["race", "--rungs", "gpt2,muon", "--seeds", "2", "--out", str(stopping), "--resume", *base])
    assert code == 143 and trained == [("gpt2", 1)]
    kept = {r["name"]: r["runs"] for r in json.loads((stopping / "race.json").read_text())["rungs"]}
    assert [(r["seed"], r["status"]) for r in kept["gpt2"]] == [(0, "ok"), (1, "stopped")]
    assert kept["muon"] == record["rungs"][1]["runs"]  # muon's seed 0, not reached, still there
    trained = _counting_trains(monkeypatch)
    code, text = _main(["race", "--rungs", "gpt2,muon", "--seeds", "2", "--out", str(stopping), "--resume", *base])
    assert code == 0 and trained == ["gpt2", "muon"]  # the two seed 1 runs; muon's seed 0 read from the record
    assert [line.split(":")[0] for line in text.splitlines() if line.startswith("race ")] == ["race gpt2", "race muon"]
    # under --keep-weights every run keeps its weights, which a record has none of: all trained
    trained.clear()
    kept_weights = tmp_path / "kept"
    kept_weights.mkdir()
    (kept_weights / "race.json").write_text(json.dumps(record))
    code, text = _main(["race", "--rungs", "gpt2,muon", "--out", str(kept_weights), "--resume", "--keep-weights",
                        *base])
    assert code == 0 and trained == ["gpt2", "muon"]
    # a row whose step ran at other step rungs (a version whose auto differed): its runs train again, with a notice
    trained.clear()
    stepped = tmp_path / "stepped"
    stepped.mkdir()
    moved = json.loads(json.dumps(record))
    moved["rungs"][1]["step_rungs"] = [*moved["rungs"][1]["step_rungs"], "cuda_graph"]
    (stepped / "race.json").write_text(json.dumps(moved))
    code, text = _main(["race", "--rungs", "gpt2,muon", "--out", str(stepped), "--resume", *base])
    assert code == 0 and trained == ["muon"] and text.count("(finished earlier)") == 1
    assert "notice: rung muon's recorded runs train again: its step ran with cuda_graph" in text
    assert "notice: rung gpt2" not in text
    # another corpus's record: one line, exit 2, nothing trained
    trained.clear()
    other = tmp_path / "other"
    other.mkdir()
    (other / "race.json").write_text(json.dumps({**record, "data": {**record["data"], "sha256": "0" * 64}}))
    capsys.readouterr()
    assert cli.main(["race", "--rungs", "gpt2", "--out", str(other), "--resume", *base]) == 2
    err = capsys.readouterr().err
    assert "trained on another corpus" in err and len(err.strip().splitlines()) == 1 and trained == []


def test_a_rung_whose_run_failed_says_so_once_and_the_race_goes_on(tmp_path, monkeypatch, shakespeare_cache):
    def failing(cfg, device, where, caps, tokens, seed, *a, **k):
        if cfg.recipe == "muon" and seed == 0:
            return 0, {"seed": seed, "dir": str(where), "status": "failed", "reason": "loss is nan"}
        return _TRAIN_RUN(cfg, device, where, caps, tokens, seed, *a, **k)

    monkeypatch.setattr(race, "train_run", failing)
    code, text = _main(["race", "--rungs", "gpt2,muon", "--seeds", "2", "--target-val-loss", "10.5",
                        "--out", str(tmp_path / "r"), *SMALL])
    lines = [line for line in text.splitlines() if line.startswith("race ")]
    assert code == 0 and [line.split(":")[0] for line in lines] == ["race gpt2", "race muon"], text
    assert lines[1] == "race muon: failed: loss is nan" and text.count("  muon seed ") == 2


def test_recorded_runs_are_a_records_finished_runs_whole_and_of_its_corpus():
    run = {"seed": 0, "status": "ok", "reached": True, "curve": [{"step": 2, "val_loss": 9.0, "train_seconds": 1.0}],
           "ms_per_step": 1.0, "mfu": None, **{k: 1.0 for k in race.METRICS}}
    record = {"data": {"sha256": "abc"}, "rungs": [
        {"name": "gpt2", "runs": [run, {**run, "seed": 1, "status": "stopped"}, {**run, "seed": 2, "curve": []}]},
        {"name": "muon", "runs": [{k: v for k, v in run.items() if k != "train_seconds"}, {**run, "seed": [1]},
                                  {**run, "seed": True}, "x", {**run, "seed": 4, "curve": [{"step": 2}]}]},
        {"name": None, "runs": [run]}, "x"]}
    assert race.recorded_runs(record, "abc") == {("gpt2", 0): run}
    assert race.recorded_runs(record, "other") == {}
    here = race.RaceRung("gpt2", "gpt2", ("baseline", "bf16"), 4)
    for held, kept in (({}, True), ({"step_rungs": ["baseline", "bf16"], "batch_size": 4}, True),
                       ({"step_rungs": ["baseline"]}, False), ({"batch_size": 2}, False)):
        rows = [{**record["rungs"][0], **held}]
        assert race.recorded_runs({**record, "rungs": rows}, "abc", (here,)) == ({("gpt2", 0): run} if kept else {})
    assert race.step_unlike({"step_rungs": ["baseline", "tf32"]}, here) == "its step ran without bf16 and with tf32"
    assert race.step_unlike({"step_rungs": ["bf16", "baseline"], "batch_size": 4}, here) is None  # applied together
    assert race.step_unlike({"batch_size": 8}, here) == "its step ran at micro-batch 8, here 4"
    for damaged in ({"step_rungs": [1, None]}, {"step_rungs": "bf16"}, {"batch_size": True}):  # not legible: no say
        assert race.step_unlike(damaged, here) is None
    bad = {**record, "rungs": [{"name": "gpt2", "runs": 5, "step_rungs": ["baseline"]}, {"runs": [run]}, 7]}
    assert race.recorded_runs(bad, "abc", (here,)) == {} == race.recorded_runs(bad, "abc")


def test_the_runs_a_record_holds_of_another_step_are_named_only_where_they_train_again(tmp_path):
    """`recorded_apart`: a rung whose recorded runs of this race's seeds, with no folder here, are passed over for
    their step; not one under --keep-weights (all its runs train), a seed beyond --seeds, a run with a folder here,
    a failed run (never read from a record) or a record of no known corpus."""
    run = {"seed": 0, "status": "ok", "reached": True, "curve": [{"step": 2, "val_loss": 9.0, "train_seconds": 1.0}],
           "ms_per_step": 1.0, "mfu": None, **{k: 1.0 for k in race.METRICS}}
    rungs = (race.RaceRung("gpt2", "gpt2", ("baseline", "bf16"), 4), race.RaceRung("muon", "muon", ("baseline",), 4))
    train = TrainConfig(batch_size=4, seq_len=32, tokens_per_step=128, steps=4, eval_every=2, target_val_loss=9.0,
                        save_at_end=False)  # a race's runs keep no weights unless --keep-weights
    cfg = race.RaceConfig(rungs=rungs, seeds=1, train=train)
    rows = [{"name": "gpt2", "step_rungs": ["baseline"], "batch_size": 4, "runs": [run, {**run, "seed": 1}]},
            {"name": "muon", "step_rungs": ["baseline"], "batch_size": 4, "runs": [{**run, "status": "failed"}]}]
    record = {"data": {"sha256": "abc"}, "rungs": rows}
    assert race.recorded_apart(cfg, record, "abc", tmp_path) == [("gpt2", "its step ran without bf16")]
    kept = dataclasses.replace(cfg, train=dataclasses.replace(train, save_at_end=True))
    assert race.recorded_apart(kept, record, "abc", tmp_path) == []
    assert race.recorded_apart(cfg, {**record, "data": {}}, "abc", tmp_path) == []
    assert race.unnamed_corpus_runs(cfg, record, tmp_path) == 0  # it names its corpus
    assert race.unnamed_corpus_runs(cfg, {**record, "data": {}}, tmp_path) == 1  # gpt2 seed 0; seed 1 not raced
    assert race.unnamed_corpus_runs(kept, {**record, "data": {}}, tmp_path) == 0
    assert race.recorded_apart(cfg, None, "abc", tmp_path) == []
    folder = race.run_dir(tmp_path, "gpt2", 0)
    folder.mkdir(parents=True)
    (folder / "log.jsonl").write_text("")
    assert race.recorded_apart(cfg, record, "abc", tmp_path) == []  # seed 0's folder is read; seed 1 is not raced
    assert race.recorded_runs({**record, "data": {"source": "t"}}, "abc") == {}
    assert race.recorded_runs(None, "abc") == {}


def test_a_run_read_back_is_timed_to_a_target_that_moved_since_it_stopped():
    """More seeds of the gpt2 rung can raise the target (the highest of their last losses): a run that stopped at
    the old one is timed to its first validation at or below the new one, read off its curve. A gpt2 run trained
    again can lower it: a run that ran all its steps above it did not reach it; one that stopped short of them above
    it must train on (None)."""
    curve = [{"step": 2, "tokens": 128, "train_seconds": 1.0, "val_loss": 10.2, "wall_seconds": 3.0},
             {"step": 4, "tokens": 256, "train_seconds": 2.0, "val_loss": 10.1, "wall_seconds": 4.0}]
    run = {"seed": 0, "status": "ok", "reached": True, "curve": curve, "train_seconds": 2.0, "steps": 4,
           "tokens": 256, "wall_seconds": 4.0}
    assert race.to_target(run, 10.1, steps=4) is run  # its own target: as it was
    risen = race.to_target(run, 10.25, steps=4)
    assert (risen["reached"], risen["steps"], risen["tokens"], risen["train_seconds"], risen["wall_seconds"]) == (
        True, 2, 128, 1.0, 3.0)
    short = {**run, "reached": False, "train_seconds": None, "steps": None, "tokens": None}  # its budget ran out
    assert race.to_target(short, 10.05, steps=4) is short
    assert race.to_target(short, 10.15, steps=4)["steps"] == 4
    fell = race.to_target(run, 10.05, steps=4)  # it reached the old target at its last step: not the new one
    assert not fell["reached"] and all(fell[k] is None for k in race.METRICS) and fell["curve"] == curve
    assert race.to_target(run, 10.05, steps=6) is None  # it stopped at step 4 of 6, above the new target
    assert race.to_target(run, 10.15, steps=6)["steps"] == 4  # above its old target: as it was, read off the curve
    early = race.to_target(run, 10.25, steps=6)  # timed to a risen target at step 2, then the target falls again
    assert early["steps"] == 2 and race.to_target(early, 10.15, steps=6)["steps"] == 4
    stopped = {"seed": 0, "status": "stopped", "reason": "stopped at step 3"}
    assert race.to_target(stopped, 10.25, steps=4) is stopped


def test_a_run_that_stopped_at_a_target_that_fell_since_is_trained_again(tmp_path, monkeypatch,
                                                                          gpt2_muon_race, gpt2_muon_race_kept):
    """A gpt2 run trained again is not bit for bit the run before, so the target it sets can fall below the loss at
    which a later rung's run stopped: that run is trained again, not read back as reaching a target it never did."""
    first, carried = tmp_path / "first", tmp_path / "carried"
    base = ["--target-val-loss", "gpt2", *SMALL]
    _copy(gpt2_muon_race, first)
    record = json.loads((first / "race.json").read_text())
    gpt2, muon = record["rungs"][0]["runs"][0], record["rungs"][1]["runs"][0]
    assert muon["reached"] and muon["curve"][-1]["step"] < 4  # it stopped at the target, short of its steps
    lower = muon["curve"][-1]["val_loss"] - 0.01
    reusing, kept = tmp_path / "reusing", tmp_path / "kept"
    assert _main(["race", "--rungs", "gpt2,muon", "--out", str(reusing), "--reuse", str(first), *base])[0] == 0
    _copy(gpt2_muon_race_kept, kept)

    def lower_gpt2(out):  # as a gpt2 run trained again, lower, would leave its log
        log = race.run_dir(out, "gpt2", 0) / "log.jsonl"
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        entries[-1]["val_loss"] = lower
        log.write_text("".join(json.dumps(e) + "\n" for e in entries))
    gpt2["curve"][-1]["val_loss"] = lower  # as a gpt2 run trained again, lower, would leave it
    carried.mkdir()
    (carried / "race.json").write_text(json.dumps(record))
    trained = _counting_trains(monkeypatch)
    code, text = _main(["race", "--rungs", "gpt2,muon", "--out", str(carried), "--resume", *base])
    assert code == 0, text
    assert trained == ["muon"]
    again = json.loads((carried / "race.json").read_text())
    assert again["target_val_loss"] == lower
    run = again["rungs"][1]["runs"][0]
    assert run["curve"][-1]["step"] > muon["curve"][-1]["step"]  # it trained past where it stopped before
    assert run["reached"] == (run["curve"][-1]["val_loss"] <= lower)
    # the same target again: nothing more to train
    trained.clear()
    assert _main(["race", "--rungs", "gpt2,muon", "--out", str(carried), "--resume", *base])[0] == 0
    assert trained == []
    # the same in a race's own folders: the gpt2 run's log now ends lower, and the muon run trains again
    lower_gpt2(first)
    trained.clear()
    assert _main(["race", "--rungs", "gpt2,muon", "--out", str(first), "--resume", *base])[0] == 0
    assert trained == ["muon"]
    retrained = json.loads((first / "race.json").read_text())["rungs"][1]["runs"][0]["curve"]
    assert [(p["step"], p["val_loss"]) for p in retrained] == [(p["step"], p["val_loss"]) for p in run["curve"]]
    # a run copied from another race is trained here, and no longer says it was copied
    lower_gpt2(reusing)
    assert (race.run_dir(reusing, "muon", 0) / "reused.json").exists()
    trained.clear()
    assert _main(["race", "--rungs", "gpt2,muon", "--out", str(reusing), "--resume", *base])[0] == 0
    assert trained == ["muon"] and not (race.run_dir(reusing, "muon", 0) / "reused.json").exists()
    assert json.loads((reusing / "race.json").read_text())["rungs"][1]["runs"][0]["reused_from"] is None
    # under --keep-weights the run's weights at its old stop are not continued from: it starts again
    lower_gpt2(kept)
    assert (race.run_dir(kept, "muon", 0) / "ckpt.pt").exists()
    trained.clear()
    assert _main(["race", "--rungs", "gpt2,muon", "--out", str(kept), "--resume", "--keep-weights", *base])[0] == 0
    assert trained == ["muon"]
    again = json.loads((kept / "race.json").read_text())["rungs"][1]["runs"][0]
    assert [(p["step"], p["val_loss"]) for p in again["curve"]] == [(p["step"], p["val_loss"]) for p in run["curve"]]
    assert again["steps"] != muon["steps"]  # continued from its old stop, its log would say it stopped there
    assert (race.run_dir(kept, "muon", 0) / "ckpt.pt").exists()  # its weights at its new end


def test_a_race_resumed_on_the_same_corpus_may_find_it_at_another_path():
    """Where the record names the corpus's sha256, that sha256 says which corpus it is, and its path may differ (a
    record carried to another machine); without it the path is compared, as every setting is."""
    def at(path):
        cfg = _cfg()
        return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, data=path))

    earlier = json.loads(json.dumps({"config": at("/here/code").to_dict(), "data": {"sha256": "abc"}}))
    race.check_same_race(at("/there/code"), earlier, "abc")
    with pytest.raises(UsageError, match="trained on another corpus"):
        race.check_same_race(at("/here/code"), earlier, "def")
    older = {**earlier, "data": {"source": "code"}}  # a version before race.json named the sha256
    race.check_same_race(at("/here/code"), older, "abc")
    with pytest.raises(UsageError, match=r"ran with other settings \(data\)"):
        race.check_same_race(at("/there/code"), older, "abc")


def test_a_rows_resolution_is_the_widest_gap_before_the_validation_its_seeds_were_read_at():
    """read_every: per run, the steps between the validation at or below the target and the one before it (the grid's
    37, or 4 where --eval-near validated more often, the first validation's own step); the widest over the seeds,
    None where no run reached the target. The noise rule reads it at the row's step time."""
    def run(seed, steps, at):
        return {"seed": seed, "status": "ok", "reached": at is not None, "steps": at,
                "curve": [{"step": s} for s in steps]}

    assert race.read_every([run(0, [37, 74, 111], 111), run(1, [37, 74, 78, 82], 82)]) == 37
    assert race.read_every([run(0, [37, 74, 78, 82], 82), run(1, [37, 41], 41)]) == 4
    assert race.read_every([run(0, [37], 37)]) == 37
    assert race.read_every([run(0, [37, 74], None), {"seed": 1, "status": "ok", "reached": True, "steps": 5}]) is None
    cfg = _cfg(seeds=1)
    rows = [race.rung_row(r, [_run(0, 1.0)], cfg) for r in cfg.rungs[:2]]
    assert rows[0]["read_every"] is None  # no curve: the race's eval_every stands in


def test_a_race_near_its_target_validates_its_runs_more_often(tmp_path, shakespeare_cache):
    """race --eval-near reaches every run's config; a race to gpt2's loss validates its gpt2 runs on the grid (they
    know no target while they train)."""
    out = tmp_path / "race"
    code, text = _main(["race", "--rungs", "gpt2,muon", "--target-val-loss", "gpt2", "--eval-near", "50", "--out",
                        str(out), "--steps", "16", "--eval-every", "8", *SMALL[4:]])
    assert code == 0, text
    rows = {r["name"]: r for r in json.loads((out / "race.json").read_text())["rungs"]}
    assert [p["step"] for p in rows["gpt2"]["runs"][0]["curve"]] == [8, 16]
    muon = [p["step"] for p in rows["muon"]["runs"][0]["curve"]]
    assert muon[0] == 8 and muon[1:] == list(range(9, muon[-1] + 1))  # every step once near gpt2's loss
    config = json.loads((race.run_dir(out, "muon", 0) / "config.json").read_text())["train_config"]
    assert config["eval_near"] == 50
    assert "validated every 8 steps (every 1 within 50 nats of the target)" in (out / "race.md").read_text()
    # its gpt2 run, validated on the grid, serves a race without --eval-near; its muon run, validated near, does not
    code, text = _main(["race", "--rungs", "gpt2,muon", "--target-val-loss", "gpt2", "--out", str(tmp_path / "again"),
                        "--steps", "16", "--eval-every", "8", "--reuse", str(out), "--dry-run", *SMALL[4:]])
    assert code == 0, text
    assert f"gpt2 seed 0: reused from {out.resolve() / 'gpt2' / 'seed0'}" in text and "muon seed 0: trains" in text
