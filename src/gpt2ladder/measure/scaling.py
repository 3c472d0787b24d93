"""How throughput scales with GPUs: a multi-GPU ladder against a one-GPU ladder.json of the same config.

Under torchrun --batch-size is per GPU, so N GPUs do N times the one-GPU work per step. Scaling
efficiency = tokens/s per GPU here / tokens/s per GPU in the baseline (1.0 = perfectly linear:
N GPUs give N times the tokens/s). The baseline is any ladder.json written by `gpt2ladder bench`
(usually on one GPU); rungs are matched by name, and only rows measured in both are compared.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpt2ladder.errors import UsageError

# The step must be the same work per GPU for a per-GPU comparison to mean anything.
MUST_MATCH = ("preset", "batch_size", "seq_len")


def load_baseline(path: str | Path, config: dict | None = None) -> dict:
    """A baseline ladder.json, or one line saying why it cannot serve as one (for this config, if given:
    `check_baseline`)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--baseline-json {path} does not exist") from None
    except (OSError, ValueError) as err:
        raise UsageError(f"--baseline-json {path} is not a readable ladder.json: {err}") from None
    if not isinstance(record, dict) or record.get("command") != "bench" or not _rows_readable(record.get("rungs")):
        raise UsageError(f"--baseline-json {path} is not a ladder.json written by gpt2ladder bench")
    baseline = {**record, "path": str(path)}
    if config is not None:
        check_baseline(baseline, config)
    return baseline


def check_baseline(baseline: dict, config: dict) -> None:
    """One line if the baseline measured another step per GPU than `config` (the config as it will run:
    after the batch and the sequence length are planned for this card)."""
    saved = baseline.get("config", {})
    diffs = [f"{k} {saved.get(k)!r} vs {config.get(k)!r}" for k in MUST_MATCH if saved.get(k) != config.get(k)]
    if diffs:
        raise UsageError(f"--baseline-json {baseline['path']} measured another step per GPU ({'; '.join(diffs)}); "
                         "rerun it with the same --preset, --batch-size and --seq-len")


def _rows_readable(rows) -> bool:
    """Every row names its rung and status, and a measured one its tokens/s (a damaged file may not)."""
    return isinstance(rows, list) and all(
        isinstance(r, dict) and isinstance(r.get("name"), str) and (
            r.get("status") != "ok" or isinstance(r.get("tokens_per_s"), (int, float))) for r in rows)


def add_scaling(record: dict, baseline: dict | None) -> None:
    """Per-GPU tokens/s on every measured row, and the efficiency against the baseline where it has the rung."""
    world = record.get("world_size", 1)
    base = {}
    if baseline is not None:
        base_world = baseline.get("world_size", 1)
        base = {r["name"]: r["tokens_per_s"] / base_world for r in baseline["rungs"] if r.get("status") == "ok"}
        record["baseline"] = {"path": baseline["path"], "world_size": base_world, "date": baseline.get("date"),
                              "git_sha": baseline.get("git_sha"), "device": baseline.get("device", {}).get("name")}
    for row in record["rungs"]:
        if row.get("status") != "ok":
            continue
        row["tokens_per_s_per_gpu"] = row["tokens_per_s"] / world
        if row["name"] in base:
            row["baseline_tokens_per_s_per_gpu"] = base[row["name"]]
            row["scaling_efficiency"] = row["tokens_per_s_per_gpu"] / base[row["name"]]
