"""Validation loss against training seconds, one curve per run: the ladder as time to a loss.

    python benchmarks/time_to_loss.py OUT.png RUN_DIR...

A run's seconds at a validation are the sum of its timed steps up to that step (log.jsonl's "ms"), the
first step of the run left out: it compiles and captures, which `train --target-val-loss` reports apart as
warm-up. A run that stopped at its target has a "target" entry on its last validation; the target is
drawn as a dashed line.
"""

import sys
from pathlib import Path

from gpt2ladder.report.plots import loss_curves
from gpt2ladder.training.runlog import read_log


def curve(entries: list[dict]) -> tuple[list[float], list[float]]:
    seconds, xs, losses = 0.0, [], []
    for e in entries[1:]:  # the first step compiles and captures
        seconds += e["ms"] / 1000
        if "val_loss" in e:
            xs.append(seconds)
            losses.append(e["val_loss"])
    return xs, losses


if __name__ == "__main__":
    out, runs = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    curves, target = {}, None
    for run in runs:
        entries = read_log(run / "log.jsonl")
        reached = next((e for e in reversed(entries) if "target" in e), None)
        label = run.name
        if reached:
            t = reached["target"]
            target = t["val_loss"]
            label += (f": below {t['val_loss']} at step {reached['step']} ({reached['val_loss']:.3f}), "
                      f"after {t['train_s']:.2f} s of steps")
        curves[label] = curve(entries)
    loss_curves(curves, out, "validation loss against training time: " + " vs ".join(r.name for r in runs),
                ylabel="validation loss", xlabel="seconds of timed training steps (compile and capture left out)",
                hline=(target, f"target {target}") if target is not None else None)
    print(f"wrote {out}")
