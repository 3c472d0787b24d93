"""Stand in for the shard 0 that ran out of time in the float8 parity run (2026-11-29-h200-fp8-linears).

Shard 0 held two units: the fp32 baseline with seed 0 and `flash`. It was stopped by its time limit
before writing its file, and no device time was left to run it again. The fp32 baseline is an eager
run and repeats bit for bit: in this very run the other eager units, `baseline-seed1` and `bf16`,
gave exactly the final losses they gave in the earlier all-rung parity (2026-11-29-h200-beyond), on
the same configuration (B=16 x 1024, 300 steps, eval every 25, seed 0, lr 6e-4). So this script writes
a shard-0 file that carries that earlier run's `baseline-seed0` result, says so in `assembled_from`,
and leaves `flash` out (its row reads "was not run"). It checks the bit-for-bit agreement first.

  python benchmarks/scripts/assemble_parity_shard0.py   (then: gpt2ladder parity --merge ...)
"""

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
NEW = RESULTS / "2026-11-29-h200-fp8-linears" / "parity-shards"
OLD = RESULTS / "2026-11-29-h200-beyond" / "parity-shards"
SAME = ("preset", "batch_size", "seq_len", "steps", "seeds", "tolerance", "floor", "lr", "warmup_steps",
        "eval_every", "eval_batches", "seed", "data")


def results_of(directory: Path) -> dict:
    return {uid: r for f in sorted(directory.glob("parity-shard-*.json"))
            for uid, r in json.loads(f.read_text())["results"].items()}


def main() -> None:
    new_shard = json.loads((NEW / "parity-shard-1-of-4.json").read_text())
    old_shard = json.loads((OLD / "parity-shard-0-of-4.json").read_text())
    assert all(new_shard["config"][k] == old_shard["config"][k] for k in SAME), "configurations differ"
    new, old = results_of(NEW), results_of(OLD)
    for uid in ("baseline-seed1", "bf16"):  # eager units of both runs: must agree exactly
        assert new[uid]["final_val"] == old[uid]["final_val"] and new[uid]["val"] == old[uid]["val"], uid
    shard = {k: v for k, v in new_shard.items() if k not in ("shard", "results")}
    shard["shard"] = [0, 4]
    shard["results"] = {"baseline-seed0": old_shard["results"]["baseline-seed0"]}
    shard["assembled_from"] = {
        "baseline-seed0": f"{OLD.relative_to(RESULTS.parent)}/parity-shard-0-of-4.json (git {old_shard['git_sha'][:12]})",
        "why": "shard 0 of this run hit its time limit; eager fp32 runs repeat bit for bit (baseline-seed1 and "
               "bf16 of this run equal the earlier run's exactly), so the earlier seed-0 baseline stands in",
        "not_run": ["flash"],
    }
    (NEW / "parity-shard-0-of-4.json").write_text(json.dumps(shard, indent=1) + "\n")
    print(f"wrote {NEW / 'parity-shard-0-of-4.json'}")


if __name__ == "__main__":
    main()
