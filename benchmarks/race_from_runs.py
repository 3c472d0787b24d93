"""race.json, race.md and race.png from training runs made apart (by `train --target-val-loss`), read as
`gpt2ladder race` reads its own: a rung's time is the training seconds of its timed steps up to its run's first
validation at or below the target.

    python benchmarks/race_from_runs.py OUT TARGET NAME=RUN_DIR[,RUN_DIR...] ...

Each NAME is a rung, its run directories its seeds (each run's config.json says its recipe, seed and settings).
A run that planned its steps without --target-val-loss (the one whose last validation set the target) is read
the same way from its log: the first validation at or below the target, and the timed steps before it.
"""

import json
import sys
from pathlib import Path

from gpt2ladder.measure.race import RaceConfig, RaceRung, add_gains, run_result, rung_row
from gpt2ladder.report.race import format_markdown, race_chart
from gpt2ladder.runtime.metrics import peak_flops
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.runlog import read_log


def with_target(entries: list[dict], target: float, tokens_per_step: int) -> list[dict]:
    """The log with a "target" entry where the trainer would have written one (at its first validation at or
    below the target), if the run had none: the timed steps' seconds before it, the first step's apart."""
    if any("target" in e for e in entries):
        return entries
    train_ms = 0.0
    for i, e in enumerate(entries):
        train_ms += e["ms"] if i else 0.0
        if e.get("val_loss") is not None and e["val_loss"] <= target:
            hit = {**e, "target": {"val_loss": target, "train_s": round(train_ms / 1000, 3), "wall_s": None,
                                   "tokens": e["step"] * tokens_per_step,
                                   "warmup_s": round(entries[0]["ms"] / 1000, 3), "validation_s": None}}
            return entries[:i] + [hit] + entries[i + 1:]
    return entries


def train_config(run: Path, target: float) -> TrainConfig:
    saved = json.loads((run / "config.json").read_text())["train_config"]
    saved["rungs"] = tuple(saved["rungs"])
    return TrainConfig(**{**saved, "target_val_loss": target})


def main(out: Path, target: float, rungs: dict[str, list[Path]]) -> None:
    configs = {name: [train_config(run, target) for run in runs] for name, runs in rungs.items()}
    first = next(iter(configs.values()))[0]
    race_rungs = [RaceRung(name, cfgs[0].recipe, cfgs[0].rungs, cfgs[0].batch_size) for name, cfgs in configs.items()]
    seeds = max(len(runs) for runs in rungs.values())
    race = RaceConfig(tuple(race_rungs), seeds, first)
    rows = []
    for rung in race_rungs:
        results = []
        for run, cfg in zip(rungs[rung.name], configs[rung.name]):
            entries = with_target(read_log(run / "log.jsonl"), target, cfg.tokens_per_step)
            results.append(run_result(entries, cfg, cfg.seed, Path(rung.name) / run.name))
        rows.append(rung_row(rung, results, race))
    add_gains(rows)
    header = json.loads((rungs[race_rungs[-1].name][0] / "config.json").read_text())
    header = {k: header[k] for k in ("gpt2ladder", "date", "git_sha", "device", "versions", "host") if k in header}
    record = {**header, "command": "race", "config": race.to_dict(), "target_val_loss": target,
              "target_source": "given", "model": first.model.to_dict(),
              "data": {"source": first.data, "n_tokens": None}, "peak_flops": peak_flops(header["device"]["name"]),
              "partial": False, "rungs": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "race.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "race.md").write_text(format_markdown(record))
    race_chart(record, out / "race.png")


if __name__ == "__main__":
    named = dict(arg.split("=", 1) for arg in sys.argv[3:])
    main(Path(sys.argv[1]), float(sys.argv[2]), {k: [Path(p) for p in v.split(",")] for k, v in named.items()})
