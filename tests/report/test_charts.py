"""The charts say what a reader must know, and no two of their words overlap: read from the figures'
artists (titles, texts, lines, boxes), not from pixels."""

import sys
from pathlib import Path

import pytest

from gpt2ladder.report.parity import parity_figure
from gpt2ladder.report.plots import ladder_bars_chart, ladder_bars_figure, ladder_figure, pyplot
from gpt2ladder.report.profile import profile_figure

sys.path.insert(0, str(Path(__file__).parent))
from chart_boxes import overlaps, text_boxes  # noqa: E402

NOTE = ("too noisy to rank: the kept rungs together took 1035.9 ms, slower than compile at 336.4 ms, whose "
        "rungs they all include: step times changed during the run by more than the rungs differ")


@pytest.fixture
def figures():
    """Collects the figures a test makes and closes them."""
    made = []
    yield made.append
    for fig in made:
        pyplot().close(fig)


def _row(name, ms, spread=0.02, kind="memory", **extra):
    return {"name": name, "status": "ok", "kind": kind, "ms_per_step": ms, "ms_p10": ms * (1 - spread),
            "ms_p90": ms * (1 + spread), **extra}


def ladder_record(source="tinyshakespeare", note=None, n=6):
    rows = [_row("baseline", 400.0, kind="baseline")] + [_row(f"rung{i}", 300.0 - 20 * i) for i in range(1, n)]
    rows.append({"name": "tf32", "status": "skipped", "kind": "precision", "reason": "needs CUDA"})
    rows.append(_row("best", 450.0, spread=0.05, kind="best", within_noise_of_prev=True))  # the tallest, at the right
    record = {"config": {"preset": "tiny", "batch_size": 2, "seq_len": 64}, "device": {"name": "cpu (x86_64)"},
              "data": {"source": source, "n_tokens": 400_000}, "rungs": rows}
    if note is not None:
        record["best"] = {"rungs": ["baseline"], "decisions": [], "too_noisy": note}
    return record


def _texts(fig) -> str:
    return "\n".join(text for text, _, _ in text_boxes(fig))


def test_a_ladder_on_random_tokens_says_so_in_its_title(figures):
    random_run, text_run = ladder_figure(ladder_record(source="random")), ladder_figure(ladder_record())
    figures(random_run), figures(text_run)
    assert "random tokens" in random_run.axes[0].get_title()
    assert "random" not in text_run.axes[0].get_title()


def test_a_ladder_too_noisy_to_rank_says_so_on_the_chart(figures):
    noisy, clean = ladder_figure(ladder_record(note=NOTE)), ladder_figure(ladder_record(note=None))
    figures(noisy), figures(clean)
    assert "too noisy to rank" in _texts(noisy) and "336.4 ms" in " ".join(_texts(noisy).split())
    assert "too noisy" not in _texts(clean)


@pytest.mark.parametrize("n", [3, 16])
def test_no_two_words_of_the_ladder_overlap(figures, n):
    """The tallest bar at the right (where the legend used to sit), a skipped rung, the noise note."""
    fig = ladder_figure(ladder_record(source="random", note=NOTE, n=n))
    figures(fig)
    assert overlaps(fig) == []


@pytest.mark.parametrize("n", [3, 14])
def test_the_compact_ladder_has_a_bar_per_rung_that_ran_and_no_overlapping_words(figures, n):
    record = ladder_record(n=n)
    fig = ladder_bars_figure(record)
    figures(fig)
    ran = [r for r in record["rungs"] if r["status"] == "ok"]
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "baseline" and labels[1:-1] == [f"+ rung{i}" for i in range(1, n)] and labels[-1] == "best"
    assert len(fig.axes[0].patches) == len(ran)  # the skipped tf32 has no bar
    assert overlaps(fig) == []


def test_the_compact_ladder_is_saved_at_the_width_asked(tmp_path):
    from PIL import Image

    path = ladder_bars_chart(ladder_record(n=14), tmp_path / "ladder-bars.png", width_px=1000)
    assert Image.open(path).size[0] == 1000


def parity_record(identical=True, steps=40):
    """The shape of a real run: a fast fall from ln(vocab) in the first steps, then a slow one."""
    base = [9.0 + 1.9 * 0.5**i - 0.01 * i for i in range(steps)]
    rung = base if identical else [v + 1e-3 for v in base]
    runs = [{"seed": 0, "final_val": 8.7, "train_loss": base},
            {"seed": 1, "final_val": 8.75, "train_loss": [v + 0.1 * 0.5**i + 0.02 for i, v in enumerate(base)]}]
    rungs = [{"name": name, "status": "ok", "verdict": "PASS", "final_val": 8.7, "train_loss": losses}
             for name, losses in (("baseline", base), ("flash", rung), ("vocab", base))]
    rungs.append({"name": "tf32", "status": "skipped", "reason": "needs CUDA"})
    return {"config": {"steps": steps, "preset": "tiny"}, "device": {"name": "cpu"}, "rule": {"allowed_abs": 0.05},
            "baseline_runs": runs, "rungs": rungs}


def test_parity_plots_every_run_from_its_first_step(figures):
    fig = parity_figure(parity_record())
    figures(fig)
    train = fig.axes[0]
    lines = [line for line in train.get_lines() if len(line.get_xdata())]
    assert lines and all(line.get_xdata()[0] == 1 for line in lines)
    low, high = train.get_ylim()
    assert low <= 8.62 and high >= 11.02  # every step of every run is in view, seed 1's first (11.02) too


def test_identical_parity_curves_each_stay_visible(figures):
    fig = parity_figure(parity_record())
    figures(fig)
    train, difference = fig.axes[0], fig.axes[1]
    labels = train.get_legend_handles_labels()[1]
    assert "baseline (identical)" in labels and "vocab (identical)" in labels
    widths = {line.get_label().split()[0]: line.get_linewidth() for line in train.get_lines()}
    assert widths["baseline"] > widths["flash"] > widths["vocab"]  # drawn widest first: stripes, not one line
    rung_lines = [line for line in difference.get_lines() if len(line.get_xdata()) == 40]
    assert len(rung_lines) == 4  # seed 1 and the three rungs, against the zero line
    assert all(list(line.get_ydata()) == [0.0] * 40 for line in rung_lines[1:])


def test_a_rung_off_the_baseline_says_by_how_much(figures):
    fig = parity_figure(parity_record(identical=False))
    figures(fig)
    assert "flash (max |Δ| 0.001)" in fig.axes[0].get_legend_handles_labels()[1]


def test_no_two_words_of_the_parity_plot_overlap(figures):
    fig = parity_figure(parity_record())
    figures(fig)
    assert overlaps(fig) == []


def profile_record():
    categories = {"matmul": "matmul", "optimizer": "optimizer", "idle": "idle"}
    ok = {"status": "ok", "ms_per_step": 100.0, "categories_ms": {"matmul": 60.0, "optimizer": 30.0, "idle": 10.0},
          "timed_by": "CPU operator self time"}
    rungs = [{"name": "baseline", **ok}, {"name": "tf32", "status": "skipped", "reason": "needs CUDA"},
             {"name": "flash", **ok}]
    return {"config": {"preset": "tiny", "batch_size": 2, "seq_len": 32}, "device": {"name": "cpu"},
            "categories": categories, "rungs": rungs}


def test_the_profiles_skipped_label_stands_clear_of_the_axis(figures):
    fig = profile_figure(profile_record())
    figures(fig)
    boxes = {text: box for text, box, _ in text_boxes(fig)}
    assert boxes["skipped"].x0 > boxes["left spine"].x1
    assert overlaps(fig) == []


def busy_record():
    """A run on a busy machine: flash drawn at 0.38x the baseline, its p90 2.5 times its p10."""
    rows = [_row("baseline", 400.0, spread=0.3, kind="baseline"), _row("compile", 380.0, spread=0.4),
            {**_row("flash", 152.0), "ms_p10": 100.0, "ms_p90": 250.0}, _row("vocab", 160.0, spread=0.3)]
    return {"config": {"preset": "tiny", "batch_size": 2, "seq_len": 64}, "device": {"name": "cpu (x86_64)"},
            "data": {"source": "tinyshakespeare", "n_tokens": 400_000}, "rungs": rows}


def test_spreads_wider_than_the_differences_are_said_on_the_chart_and_first_in_the_table(figures):
    from gpt2ladder.report.bench import format_markdown, spread_note

    note = spread_note(busy_record()["rungs"])
    assert note and "spreads wider than the differences" in note and "flash" in note and "2.5x" in note
    assert spread_note(ladder_record()["rungs"]) is None  # differences well outside the spreads
    fig = ladder_figure(busy_record())
    figures(fig)
    assert "spreads wider than the differences" in " ".join(_texts(fig).split()) and overlaps(fig) == []
    record = {**busy_record(), "versions": {"torch": "x", "cuda": None, "triton": None}, "gpt2ladder": "0",
              "git_sha": "abc", "peak_flops": None, "date": "today", "config": {**busy_record()["config"],
                                                                               "steps": 5, "warmup": 1}}
    record["rungs"] = [{**r, "peak_mem_bytes": None, "speedup_vs_baseline": 1.0, "tokens_per_s": 1.0, "mfu": None,
                        "loss": 10.0, "logits_dtype": "float32", "weight_dtype": "float32"} for r in record["rungs"]]
    assert format_markdown(record).splitlines()[2] == f"- **{note}**"


def test_the_rungs_best_dropped_are_marked_on_the_chart(figures):
    record = ladder_record()
    record["best"] = {"rungs": ["baseline", "rung1"], "too_noisy": None,
                      "decisions": [{"rung": "baseline", "kept": True}, {"rung": "rung1", "kept": True},
                                    {"rung": "rung2", "kept": False}]}
    fig = ladder_figure(record)
    figures(fig)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[2] == "+ rung2 (dropped)" and not any("dropped" in t for i, t in enumerate(ticks) if i != 2)
    assert "dropped" in _texts(fig) and overlaps(fig) == []


def race_record(n):
    """An ablation's record: gpt2, speedrun, then n - 2 rungs each read against speedrun or a recipe of a long name,
    each gain under one validation and counting its seeds at an earlier validation (the longest label a bar carries),
    one seed's curve each."""
    def row(i, name, seconds):
        against = None if i == 0 else "gpt2" if i == 1 else "speedrun" if i % 2 else "speedrun-relu2+value_embeds"
        curve = [{"train_seconds": s, "val_loss": 2.0 + 4.0 / (1 + s)} for s in (1.0, seconds / 2, seconds)]
        return {"name": name, "status": "ok", "reached": True, "runs": [{"curve": curve}],
                "train_seconds": {"median": seconds, "min": seconds, "max": seconds},
                "gain_vs": against, "gain_vs_prev": None if i == 0 else 1.01, "within_noise_of_prev": False,
                "within_one_validation_of_prev": i > 1, "seeds_earlier": {"earlier": 3, "of": 3}}
    names = ["gpt2", "speedrun", *(f"speedrun-part{i}" for i in range(n - 2))]
    return {"target_val_loss": 2.1, "config": {"settings": {"preset": "gpt2"}}, "data": {"source": "code-shards"},
            "cards": ["NVIDIA H100 80GB HBM3"], "rungs": [row(i, name, 43.0 if i == 0 else 20.0 + i % 3)
                                                       for i, name in enumerate(names)]}


@pytest.mark.parametrize("n", [2, 4, 11, 16])
def test_no_two_words_of_the_race_chart_overlap(figures, n):
    """Each bar's labels (its seconds, its gain, 'under one validation', its seeds at an earlier validation, the rung
    it is read against) stay clear of its neighbours' however many rungs the race has."""
    from gpt2ladder.report.race import race_figure

    fig = race_figure(race_record(n))
    figures(fig)
    assert len(fig.axes[0].patches) == n
    assert overlaps(fig) == []
    if n > 2:  # a long recipe read against: one line per part it takes away or adds
        assert "\nvs speedrun\n-relu2\n+value_embeds" in "\n".join(t.get_text() for t in fig.axes[0].texts)


def test_a_rate_written_with_an_exponent_stays_on_one_line_of_its_bars_label(figures):
    from gpt2ladder.report.race import race_figure

    record = race_record(3)
    record["rungs"][2]["gain_vs"] = "gpt2@lr=1e-3"
    fig = race_figure(record)
    figures(fig)
    assert "\nvs gpt2\n@lr=1e-3" in "\n".join(t.get_text() for t in fig.axes[0].texts)


def test_only_rungs_with_a_curve_are_in_the_race_charts_legend(figures):
    """A partial race's rung that has not run, or whose run stopped before its first validation, draws no curve, so
    the legend leaves it out; a race where no run validated has no legend at all."""
    from gpt2ladder.report.race import race_figure

    record = race_record(4)
    record["rungs"][2]["runs"] = []
    record["rungs"][3]["runs"] = [{"curve": []}]
    fig = race_figure(record)
    figures(fig)
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["gpt2", "speedrun"]
    for r in record["rungs"]:
        r["runs"] = []
    fig = race_figure(record)
    figures(fig)
    assert fig.axes[1].get_legend() is None
