"""`--rungs best` says when its own measurements contradict each other: too noisy to rank."""

from gpt2ladder.measure.best import best_summary, decide, too_noisy
from gpt2ladder.report.bench import format_markdown


def _row(name, ms, p10=None, p90=None, status="ok"):
    return {"name": name, "status": status, "ms_per_step": ms, "ms_p10": ms * 0.98 if p10 is None else p10,
            "ms_p90": ms * 1.02 if p90 is None else p90}


# The rows of a --rungs best run on a loaded 2-core CPU (tiny, batch 2 x 64, 4 timed steps): vocab adds
# 47 classifier rows yet measured 5x slower than flash, and the kept set 3x slower than compile.
LOADED = [_row("baseline", 1465.2, 593.7, 1921.5), _row("compile", 336.4, 304.4, 354.9),
          _row("flash", 350.1, 307.7, 365.8), _row("vocab", 1831.7, 1670.5, 1929.5),
          _row("fused_adamw", 1375.6, 593.9, 1420.2), _row("fused_loss", 514.8, 392.8, 803.2),
          _row("best", 1035.9, 820.0, 1100.0)]


def test_a_kept_set_slower_than_a_part_of_it_is_too_noisy_to_rank():
    kept, _ = decide(LOADED[:-1])
    assert kept == ["baseline", "compile", "fused_adamw"]
    note = too_noisy(LOADED, kept)
    assert note.startswith("too noisy to rank") and "1035.9 ms" in note and "compile at 336.4 ms" in note


def test_a_consistent_run_ranks():
    rows = [_row("baseline", 400.0), _row("compile", 200.0), _row("flash", 150.0), _row("best", 151.0)]
    assert too_noisy(rows, ["baseline", "compile", "flash"]) is None


def test_only_rows_made_of_kept_rungs_can_contradict_the_kept_set():
    # flash was dropped: the rows from flash on hold a rung the kept set lacks, so best may be slower
    # than them for a real reason; compile, a part of the kept set, is slower than best: no contradiction.
    rows = [_row("baseline", 400.0), _row("compile", 200.0), _row("flash", 150.0), _row("vocab", 100.0),
            _row("best", 180.0)]
    assert too_noisy(rows, ["baseline", "compile", "vocab"]) is None
    # a skipped rung is applied to no row: the rows after it are still parts of the kept set
    rows = [_row("baseline", 400.0), _row("tf32", 0.0, status="skipped"), _row("compile", 200.0),
            _row("best", 300.0)]
    assert "compile at 200.0 ms" in too_noisy(rows, ["baseline", "compile"])


def test_within_both_spreads_is_no_contradiction():
    rows = [_row("baseline", 400.0), _row("compile", 200.0, 180.0, 230.0), _row("best", 215.0, 205.0, 240.0)]
    assert too_noisy(rows, ["baseline", "compile"]) is None
    assert too_noisy(rows[:2] + [_row("best", 0.0, status="failed")], ["baseline", "compile"]) is None


def test_the_summary_and_the_markdown_say_it_too():
    kept, decisions = decide(LOADED[:-1])
    best = {"rungs": kept, "decisions": decisions, "too_noisy": too_noisy(LOADED, kept)}
    assert best["too_noisy"] in best_summary({"rungs": LOADED, "best": best})
    record = {"rungs": [{**r, "speedup_vs_baseline": 1.0, "speedup_vs_prev": None, "tokens_per_s": 1.0,
                         "mfu": None, "peak_mem_bytes": None, "loss": 10.0, "logits_dtype": "float32",
                         "weight_dtype": "float32"} for r in LOADED],
              "best": best, "config": {"preset": "tiny", "batch_size": 2, "seq_len": 64, "steps": 4, "warmup": 1},
              "device": {"name": "cpu"}, "data": {"source": "random"}, "peak_flops": None, "date": "today",
              "versions": {"torch": "2.13", "cuda": None, "triton": None}, "gpt2ladder": "0.1", "git_sha": "x"}
    assert f"- {best['too_noisy']}" in format_markdown(record)
    best["too_noisy"] = None
    assert ("too noisy" not in format_markdown(record)
            and "too noisy" not in best_summary({"rungs": LOADED, "best": best}))
