"""Draw the loss curves of training runs in one plot: python benchmarks/loss_curves.py OUT.png RUN_DIR..."""

import sys
from pathlib import Path

from gpt2ladder.report.plots import loss_curves
from gpt2ladder.training.runlog import read_log

if __name__ == "__main__":
    out, runs = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    curves = {}
    for run in runs:
        entries = read_log(run / "log.jsonl")
        curves[f"{run.name} train"] = ([e["step"] for e in entries], [e["loss"] for e in entries])
        val = [e for e in entries if "val_loss" in e]
        curves[f"{run.name} val"] = ([e["step"] for e in val], [e["val_loss"] for e in val])
    loss_curves(curves, out, "loss per step: " + " vs ".join(r.name for r in runs))
    print(f"wrote {out}")
