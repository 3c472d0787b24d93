"""`--rungs best`: keep only the rungs that pay on this machine, and measure that combination.

Every rung of the full ladder has been timed (rung k = rungs 0..k); a rung beyond the baseline is kept
when its step is at least `MIN_GAIN` faster than the one before it, outside the noise (its p10-p90
below the other's), and `parity` has not found it changing the loss (`Rung.parity_failure`). The kept
combination is then timed for real, as one more row, so the record never claims a figure it did not
measure. That row also checks the run: where it contradicts the climb (`too_noisy`), the record, the
table and the chart say so.
"""

from __future__ import annotations

from gpt2ladder.ladder import RUNGS_BY_NAME
from gpt2ladder.measure.bench import add_speedups, measure_rung, within_noise
from gpt2ladder.measure.harness import Row
from gpt2ladder.measure.timing import StepRule
from gpt2ladder.runtime import distributed

MIN_GAIN = 1.01  # a 1% faster median; smaller differences are within run-to-run noise


def decide(rows: list[dict]) -> tuple[list[str], list[dict]]:
    """Which measured rungs to keep, and why, from a bench record's rows (pure; tested on numbers)."""
    kept, decisions, prev = [], [], None
    for r in rows:
        if r["status"] != "ok":
            decisions.append({"rung": r["name"], "kept": False, "why": f"{r['status']}: {r.get('reason', '')}"})
            continue
        gain = prev["ms_per_step"] / r["ms_per_step"] if prev else None
        noise = prev is not None and within_noise(r, prev)
        keep = gain is None or (gain >= MIN_GAIN and not noise)
        why = "baseline" if gain is None else f"{gain:.3f}x vs the rung before it (need {MIN_GAIN:.2f}x)"
        if noise:
            why += ", within noise (the p10-p90 ranges overlap)"
        rung = RUNGS_BY_NAME.get(r["name"])
        if rung is not None and rung.parity_failure:
            keep, why = False, f"{why}; fails parity: {rung.parity_failure}"
        decisions.append({"rung": r["name"], "kept": keep, "why": why})
        if keep:
            kept.append(r["name"])
        prev = r
    return kept, decisions


def add_best(record: dict, cfg, device, caps, tokens, dist: distributed.Dist = distributed.SINGLE,
             progress: bool = True, rule: StepRule | None = None) -> None:
    """Decide which measured rungs pay, then measure them together as one more row, named 'best' (timed
    as `rule` says, like the rows it is compared with)."""
    kept, decisions = decide(record["rungs"])
    record["best"] = {"rungs": kept, "decisions": decisions, "rule": f"keep a rung when it is >= {MIN_GAIN}x faster"
                      " than the rung before it and outside the noise; the kept set is then measured as the row 'best'"}
    row = measure_rung(Row(kept[-1], tuple(kept)), cfg, tokens, device, caps, dist, progress, rule)
    row.update(name="best", summary="The rungs that paid here: " + ", ".join(kept) + ".", kind="best")
    record["rungs"].append(row)
    add_speedups(record["rungs"])
    record["best"]["too_noisy"] = too_noisy(record["rungs"], kept)


def too_noisy(rows: list[dict], kept: list[str]) -> str | None:
    """Why this run cannot tell which rungs pay, or None (pure; tested on numbers).

    A climb row made of kept rungs only is a part of the kept set, whose other rungs each measured
    faster: measured together, the kept set should not be slower than that row. If it is, beyond both
    rows' p10-p90, step times changed during the run by more than the rungs differ.
    """
    best = rows[-1]
    if best["status"] != "ok":
        return None
    applied, parts = set(), []
    for r in rows[:-1]:
        if r["status"] != "skipped":  # a rung that could run is applied to every row after it
            applied.add(r["name"])
        if r["status"] == "ok" and applied <= set(kept) and best["ms_p10"] > r["ms_p90"]:
            parts.append(r)
    if not parts:
        return None
    part = min(parts, key=lambda r: r["ms_per_step"])
    return (f"too noisy to rank: the kept rungs together took {best['ms_per_step']:.1f} ms, slower than "
            f"{part['name']} at {part['ms_per_step']:.1f} ms, whose rungs they all include: step "
            "times changed during the run by more than the rungs differ")


def best_summary(record: dict) -> str:
    """What --rungs best kept and why each other rung was dropped, and how the kept set measured."""
    best = record["best"]
    lines = [f"--rungs best kept: {', '.join(best['rungs'])}"]
    lines += [f"  dropped {d['rung']}: {d['why']}" for d in best["decisions"] if not d["kept"]]
    row = record["rungs"][-1]
    if row["status"] == "ok":
        base = next(r for r in record["rungs"] if r["status"] == "ok")
        gain = base["ms_per_step"] / row["ms_per_step"]
        lines.append(f"  the kept set together: {row['ms_per_step']:.1f} ms/step, {gain:.2f}x the {base['name']}"
                     + (" (slower than it, in this run)" if gain < 1 else ""))
    else:
        lines.append(f"  the kept set together: {row['status']}: {row.get('reason', '')}")
    if best.get("too_noisy"):
        lines.append(f"  {best['too_noisy']}")
    return "\n".join(lines)
