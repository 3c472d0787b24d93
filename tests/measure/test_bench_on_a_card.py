"""`gpt2ladder bench` on a simulated GPU, end to end through the command: the card's facts, the probe and
the steps' times are made up here (a CPU runs no CUDA step), everything the command decides from them is
its own. On a card too small for one 1024-token sequence every rung runs at 512 and the first line says
why; without --steps a rung whose steps disagree is timed longer, up to the bound; --steps fixes the count."""

import itertools
import json
from types import SimpleNamespace

import pytest
import torch

import gpt2ladder.commands.bench as command
import gpt2ladder.measure.batch as batch_mod
import gpt2ladder.measure.bench as bench
from gpt2ladder import data as data_mod
from gpt2ladder.cli import main
from gpt2ladder.measure.timing import BOUND, SPREAD, StepRule
from gpt2ladder.report.progress import progress_bar
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.runtime.memory import GiB

CUDA = torch.device("cuda")


def hopper(gib: float) -> Capabilities:
    """A Hopper card of `gib` GiB: every rung of the write-up's ladder runs there."""
    return Capabilities("cuda", "NVIDIA H100 PCIe", (9, 0), total_memory=int(gib * GiB), triton_version="3.6.0")


class Card:
    """What the fakes saw: the probes' (batch, seq_len), each engine's setup and each timed batch's shape."""

    def __init__(self, times):
        self.times = times  # one iterator of milliseconds per rung, in the order the rungs are built
        self.probes, self.setups, self.shapes = [], [], []


@pytest.fixture
def card(monkeypatch, shakespeare_cache):
    """simulate(caps, times): make the bench command see `caps` as its CUDA device and time steps from
    `times` (one iterable per rung, warm-up steps included); returns the Card of what happened."""
    def simulate(caps: Capabilities, times) -> Card:
        seen = Card([iter(t) for t in times])

        def probe(cfg, setup, seq_len, batch, device, seed=0):
            seen.probes.append((batch, seq_len))
            return int(0.5 * caps.usable_memory)  # the probe's step fits: the plan stands as estimated

        class Engine:
            def __init__(self, model_cfg, setup, device, **kwargs):
                seen.setups.append(setup)
                self.times = seen.times[len(seen.setups) - 1]
                self.raw_model = SimpleNamespace(config=model_cfg, num_params=lambda: 124_000_000)

        def timed_step(engine, batches, device):
            seen.shapes.append(tuple(batches.next()[0].shape))
            return next(engine.times), torch.tensor(10.0)

        monkeypatch.setattr(distributed, "local_device", lambda dist, spec="auto": CUDA)
        monkeypatch.setattr(command, "detect", lambda device: caps)
        monkeypatch.setattr(batch_mod, "probe_peak", probe)
        monkeypatch.setattr(bench, "Engine", Engine)
        monkeypatch.setattr(bench, "timed_step", timed_step)
        monkeypatch.setattr(bench, "_dtypes", lambda engine, x: ("bfloat16", "float32"))
        monkeypatch.setattr(data_mod, "to_device", lambda x, y, device: (x, y))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2 * GiB)
        return seen

    return simulate


def _bench(tmp_path, capsys, *flags) -> tuple[list[str], dict]:
    assert main(["bench", "--no-progress", "--out", str(tmp_path), *flags]) == 0
    return capsys.readouterr().out.splitlines(), json.loads((tmp_path / "ladder.json").read_text())


def test_on_a_4_gib_card_every_rung_runs_at_512_tokens_and_the_first_line_says_why(card, tmp_path, capsys):
    seen = card(hopper(4), [itertools.repeat(10.0)] * 6)
    lines, record = _bench(tmp_path, capsys)
    plan = record["batch_plan"]
    assert (plan["seq_len"], plan["shortened_from"], plan["batch"]) == (512, 1024, 1)
    assert plan["full_length_heaviest"] == "bf16"
    assert lines[0] == f"gpt2ladder bench: {plan['reason']}"
    assert lines[0].startswith("gpt2ladder bench: sequences of 512 tokens: not even one of 1024 fits every rung "
                               "(the bf16 rung needs ")
    assert "so every rung runs at 512, the longest power of two that fits; batch 1: " in lines[0]
    assert "batch 1 x 512" in lines[1]
    assert record["config"]["seq_len"] == 512 and record["config"]["batch_size"] == 1
    measured = [r for r in record["rungs"] if r["status"] == "ok"]
    assert [r["name"] for r in measured] == ["baseline", "tf32", "bf16", "compile", "flash", "vocab"]
    assert seen.probes and set(seen.probes) == {(1, 512)}
    assert len(seen.setups) == 6 and set(seen.shapes) == {(1, 512)}  # every step of every rung: never a mix
    assert "sequences of 512 tokens: not even one of 1024" in (tmp_path / "ladder.md").read_text()


def test_a_length_asked_for_is_kept_and_a_card_too_small_for_it_is_one_line(card, tmp_path, capsys):
    card(hopper(4), [])
    assert main(["bench", "--no-progress", "--out", str(tmp_path), "--seq-len", "1024"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not even one sequence of 1024 tokens fits" in err and "--seq-len" in err


def test_on_a_card_that_fits_the_full_length_nothing_is_shortened(card, tmp_path, capsys):
    seen = card(hopper(8), [itertools.repeat(10.0)] * 6)
    lines, record = _bench(tmp_path, capsys)
    assert record["config"]["seq_len"] == 1024 and record["batch_plan"]["shortened_from"] is None
    assert lines[0].startswith("gpt2ladder bench: batch 2: the bf16 rung") and set(seen.shapes) == {(2, 1024)}


WARMUP = 5  # the bench's default on a GPU: the first draws of each rung's times


def _steady():
    return itertools.repeat(10.0)


def _settling():  # a few slow steps after the warm-up (clocks, the allocator), then steady ones
    return itertools.chain([10.0] * WARMUP, [14.0, 13.0, 12.0], itertools.repeat(10.0))


def _noisy():  # never narrows: half the steps take twice as long
    return itertools.cycle([10.0, 20.0])


def test_without_steps_a_rung_is_timed_until_its_range_narrows_or_the_bound(card, tmp_path, capsys):
    seen = card(hopper(80), [_steady(), _settling(), _noisy()])
    lines, record = _bench(tmp_path, capsys, "--rungs", "baseline,tf32,bf16")
    assert "batch 16 x 1024, 20 to 100 timed steps (more while the p10-p90 range is over 5% of the median) after " \
           "5 warm-up" in lines[1]
    steady, settling, noisy = record["rungs"]
    assert steady["n_timed"] == 20 and steady["timing"].startswith("20 steps, p10-p90 0.0%")
    assert 20 < settling["n_timed"] < BOUND and "narrowed to" in settling["timing"]
    spread = (settling["ms_p90"] - settling["ms_p10"]) / settling["ms_per_step"]
    assert spread <= SPREAD
    assert noisy["n_timed"] == BOUND and "the most it takes" in noisy["timing"]
    assert [len(r["samples_ms"]) for r in record["rungs"]] == [r["n_timed"] for r in record["rungs"]]
    assert len(seen.shapes) == 3 * WARMUP + sum(r["n_timed"] for r in record["rungs"])
    assert record["step_rule"] == StepRule.until_narrow(20).to_dict()
    md = (tmp_path / "ladder.md").read_text()
    assert f"- timed steps per rung: baseline 20, tf32 {settling['n_timed']}, bf16 {BOUND}\n" in md


def test_steps_given_fix_the_count_however_noisy_the_rung(card, tmp_path, capsys):
    card(hopper(80), [_steady(), _settling(), _noisy()])
    lines, record = _bench(tmp_path, capsys, "--rungs", "baseline,tf32,bf16", "--steps", "7")
    assert "batch 16 x 1024, 7 timed steps after 5 warm-up" in lines[1]
    assert [r["n_timed"] for r in record["rungs"]] == [7, 7, 7]
    assert "step_rule" not in record and not any("timing" in r for r in record["rungs"])
    md = (tmp_path / "ladder.md").read_text()
    assert "- batch 16 x seq 1024, 7 timed steps after 5 warm-up" in md and "timed steps per rung" not in md


def test_a_cpu_keeps_the_count_without_steps():
    cfg = bench.BenchConfig(preset="tiny", steps=10)
    assert command.step_rule(False, cfg, torch.device("cpu")) == StepRule.fixed(10)
    assert command.step_rule(False, cfg, CUDA) == StepRule.until_narrow(10)
    assert command.step_rule(True, cfg, CUDA) == StepRule.fixed(10)


def test_under_torchrun_every_rank_judges_the_slowest_ranks_steps(monkeypatch):
    """A step lasts as long as its slowest rank: that time is the sample every rank keeps and judges, so a
    steady rank beside a noisy one times as long as the noisy one would, and the two stop together."""
    other = itertools.cycle([10.0, 20.0])  # the other rank's steps
    monkeypatch.setattr(distributed, "reduce_floats", lambda values, dist, op="max": [max(values[0], next(other))])
    monkeypatch.setattr(bench, "timed_step", lambda engine, batches, device: (10.0, torch.tensor(1.0)))
    two = distributed.Dist(rank=0, local_rank=0, world_size=2, backend="gloo")
    cfg = bench.BenchConfig(preset="tiny", steps=20, warmup=0)
    samples, losses = bench._timed_steps(None, None, cfg, torch.device("cpu"), progress_bar(20, "x", False),
                                         StepRule.until_narrow(20), two)
    assert len(samples) == len(losses) == BOUND and sorted(set(samples)) == [10.0, 20.0]


def _baseline(tmp_path, batch: int):
    path = tmp_path / f"one-gpu-{batch}.json"
    rows = [{"name": "baseline", "status": "ok", "tokens_per_s": 1000.0}]
    path.write_text(json.dumps({"command": "bench", "config": {"preset": "gpt2", "batch_size": batch,
                                                                "seq_len": 1024}, "world_size": 1, "rungs": rows}))
    return path


def test_a_baseline_is_matched_against_the_step_as_planned_for_the_card(card, tmp_path, capsys):
    """An 8 GiB card plans batch 2 where 16 was asked for by default: a one-GPU baseline of that card (batch
    2) is the right one, and a baseline at 16 measured another step; each judged against the plan."""
    card(hopper(8), [itertools.repeat(10.0)])
    baseline = str(_baseline(tmp_path, 2))
    lines, record = _bench(tmp_path / "out", capsys, "--rungs", "baseline", "--baseline-json", baseline)
    assert record["config"]["batch_size"] == 2 and record["baseline"]["path"].endswith("one-gpu-2.json")
    assert record["rungs"][0]["scaling_efficiency"] == pytest.approx(record["rungs"][0]["tokens_per_s"] / 1000.0)
    card(hopper(8), [])
    assert main(["bench", "--no-progress", "--out", str(tmp_path / "again"), "--rungs", "baseline",
                 "--baseline-json", str(_baseline(tmp_path, 16))]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "measured another step per GPU (batch_size 16 vs 2)" in err
    assert not (tmp_path / "again").exists()  # refused before the output folder is made
