"""The bad-input list as a table: each row is a command line, its exit code and a fragment of the one line
it must print on stderr, with no traceback. A user's mistake (exit 2) prints nothing on stdout either:
every command checks its inputs before it prints a banner or starts work. A new case is one line in CASES.

A flag given twice takes its last value, so a row overrides a default by appending. Placeholders in a
row's arguments name things the `places` fixture makes once for the module: {run} a
trained run directory, {text} a small text, {out} a fresh output directory, and damaged files. A row
must fail before it writes anything, since {run} and the files are shared.
Everything runs through `cli.main` in-process (fast); tests that need a real process (signals, kill)
live next to the code they test.
"""

import json
import os
import shutil

import pytest

from gpt2ladder.cli import main
from gpt2ladder.measure.parity import ParityConfig
from gpt2ladder.training.checkpoint import load_checkpoint, save_checkpoint

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40
TINY = ["--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2", "--seq-len", "16",
        "--no-progress"]
TRAIN = ["train", *TINY, "--steps", "2", "--eval-every", "0", "--data", "{text}", "--out", "{out}"]
SAMPLE = ["sample", "{run}", "--device", "cpu", "--num-tokens", "2"]
PARITY = ["parity", *TINY, "--steps", "1", "--eval-batches", "1", "--data", "{text}", "--out", "{out}"]
BENCH = ["bench", *TINY, "--steps", "1", "--warmup", "0", "--data", "{text}", "--out", "{out}"]
PROFILE = ["profile", *TINY, "--steps", "1", "--warmup", "0", "--data", "{text}", "--out", "{out}"]
RACE = ["race", "--device", "cpu", "--preset", "tiny", "--batch-size", "2", "--seq-len", "16", "--rungs", "gpt2",
        "--no-progress", "--seeds", "1", "--steps", "2", "--target-val-loss", "9", "--data", "{text}", "--out", "{out}"]


def sample(path: str) -> list[str]:
    """SAMPLE of another checkpoint (a positional argument is not overridden by appending)."""
    return ["sample", path, *SAMPLE[2:]]


CASES = [  # (id, argv, exit code, a fragment of the one line)
    # one input of each kind, for each command
    ("train data missing", [*TRAIN, "--data", "{root}/missing.txt"], 2, "does not exist"),
    ("bench data missing", [*BENCH, "--data", "{root}/missing.txt"], 2, "does not exist"),
    ("parity data missing", [*PARITY, "--data", "{root}/missing.txt"], 2, "does not exist"),
    ("profile data missing", [*PROFILE, "--data", "{root}/missing.txt"], 2, "does not exist"),
    ("train data a directory", [*TRAIN, "--data", "{root}"], 2, "holds no token shards"),
    ("train unknown rung", [*TRAIN, "--rungs", "baseline,warp"], 2, "unknown rung warp"),
    ("bench unknown rung", [*BENCH, "--rungs", "warp"], 2, "unknown rung warp"),
    ("parity unknown rung", [*PARITY, "--rungs", "warp"], 2, "unknown rung warp"),
    ("profile unknown rung", [*PROFILE, "--rungs", "warp"], 2, "unknown rung warp"),
    ("train unknown preset", [*TRAIN, "--preset", "gpt5"], 2, "unknown preset 'gpt5'"),
    ("train seq len above the block", [*TRAIN, "--seq-len", "257"], 2, "exceeds the model's block size of 256"),
    ("bench steps zero", [*BENCH, "--steps", "0"], 2, "--steps: expected a positive integer"),
    ("bench from a rung not climbed", [*BENCH, "--rungs", "baseline,flash", "--from", "vocab"], 2,
     "--from vocab: not one of the rungs climbed (baseline, flash)"),
    ("bench best from a rung", [*BENCH, "--rungs", "best", "--from", "vocab"], 2, "times every rung: drop --from"),
    ("bench best last only", [*BENCH, "--rungs", "best", "--last-only"], 2, "times every rung: drop --last-only"),
    ("profile warmup negative", [*PROFILE, "--warmup", "-1"], 2, "--warmup: expected zero or more"),
    ("parity bad shard", [*PARITY, "--shard", "3/2"], 2, "need 0 <= K < N"),
    ("train bad strategy", [*TRAIN, "--strategy", "zero3"], 2, "unknown --strategy 'zero3'"),
    ("train init from nothing", [*TRAIN, "--init-from", "{root}/no-such-model"], 2, "no GPT-2 weights at"),
    ("resume a missing run directory", [*TRAIN, "--out", "{root}/no-such-run", "--resume"], 2, "no checkpoint at"),
    ("sample a missing run directory", sample("{root}/no-such-run"), 2, "no checkpoint at"),
    ("export a missing run directory", ["export", "{root}/no-such-run", "{out}"], 2, "no checkpoint at"),
    ("eval a text file", ["eval", "{text}", "--device", "cpu", "--out", "{out}"], 2, "is not a PyTorch file"),
    ("eval a folder of no model", ["eval", "{mine}", "--device", "cpu", "--out", "{out}"], 2,
     "nor Hugging Face weights in"),
    ("doctor unknown device", ["doctor", "--device", "tpu"], 2, "unknown device 'tpu'"),
    ("doctor gpu memory zero", ["doctor", "--gpu-memory", "0"], 2, "--gpu-memory: expected a positive number"),
    # numbers no flag can take
    ("train seed 2**70", [*TRAIN, "--seed", str(2**70)], 2, "--seed: expected a seed from 0 to 2**63 - 1"),
    ("sample seed 2**70", [*SAMPLE, "--seed", str(2**70)], 2, "--seed: expected a seed from 0 to 2**63 - 1"),
    ("parity seed -1", [*PARITY, "--seed", "-1"], 2, "--seed: expected a seed from 0"),
    ("train batch 2**64", [*TRAIN, "--batch-size", str(2**64)], 2, "up to 2**63 - 1"),
    ("train lr inf", [*TRAIN, "--lr", "inf"], 2, "--lr must be a finite number"),
    ("train lr nan", [*TRAIN, "--lr", "nan"], 2, "--lr must be a finite number"),
    ("train weight decay nan", [*TRAIN, "--weight-decay", "nan"], 2, "--weight-decay must be a finite number"),
    ("parity lr inf", [*PARITY, "--lr", "inf"], 2, "--lr must be a finite positive number"),
    ("parity tolerance nan", [*PARITY, "--tolerance", "nan"], 2, "--tolerance"),
    ("sample temperature nan", [*SAMPLE, "--temperature", "nan"], 2, "--temperature must be zero"),
    ("sample temperature inf", [*SAMPLE, "--temperature", "inf"], 2, "--temperature must be zero"),
    ("sample temperature -inf", [*SAMPLE, "--temperature=-inf"], 2, "--temperature must be zero"),
    ("sample temperature -1e-30", [*SAMPLE, "--temperature=-1e-30"], 2, "--temperature must be zero"),
    ("sample temperature 0x1p-3", [*SAMPLE, "--temperature", "0x1p-3"], 2, "--temperature: invalid float value"),
    ("sample num tokens past the context", [*SAMPLE, "--num-tokens", "257"], 2,
     "--num-tokens 257 is more than this model's context of 256 tokens"),
    ("sample num tokens 10**9", [*SAMPLE, "--num-tokens", str(10**9)], 2, "--num-tokens is at most 100,000"),
    # data that is not a text file
    ("train data FIFO", [*TRAIN, "--data", "{fifo}"], 2, "is not a regular file"),
    ("parity data device", [*PARITY, "--data", "/dev/zero"], 2, "is not a regular file"),
    ("profile data FIFO", ["profile", *TINY, "--steps", "1", "--warmup", "0", "--data", "{fifo}", "--out", "{out}"], 2,
     "is not a regular file"),
    ("train text too short for validation", [*TRAIN, "--data", "{short}", "--eval-every", "1"], 2,
     "its validation split (the last 10%)"),
    ("parity eval batches 10**12", [*PARITY, "--eval-batches", str(10**12)], 2, "--eval-batches is at most"),
    ("train eval batches 10**12", [*TRAIN, "--eval-batches", str(10**12)], 2, "--eval-batches is at most"),
    ("parity seeds 10**12", [*PARITY, "--seeds", str(10**12)], 2, "--seeds must be from 2"),
    # files the tool reads, damaged
    ("sample checkpoint without model_config", sample("{no_config_ckpt}"), 1, "lacks model_config"),
    ("resume checkpoint without optimizer", [*TRAIN, "--out", "{run_without_optimizer}", "--resume"], 1,
     "lacks optimizer"),
    ("sample checkpoint of an unknown model", sample("{odd_model_ckpt}"), 1, "does not hold a GPT"),
    ("sample truncated checkpoint", sample("{truncated_ckpt}"), 1, "unreadable"),
    ("sample checkpoint of NaN weights", sample("{nan_ckpt}"), 1, "holds non-finite weights"),
    ("sample checkpoint whose config is 10,000 layers", sample("{huge_config_ckpt}"), 1,
     "n_layer 10000 in model_config, 2 in the tensors"),
    ("sample checkpoint with a field of another form", sample("{odd_field_ckpt}"), 1,
     "holds data_source in another form"),
    ("resume checkpoint with a field of another form", [*TRAIN, "--out", "{run_with_odd_best}", "--resume"], 1,
     "holds best.val_loss in another form"),
    # a flag a resumed run cannot honour is refused, never announced and ignored
    ("resume with another seed", [*TRAIN, "--out", "{run}", "--resume", "--seed", "5"], 2,
     "--seed 5 with --resume: the run in"),
    ("resume with init from", [*TRAIN, "--out", "{run}", "--resume", "--init-from", "{root}/hf"], 2,
     "continues from its own weights, not from --init-from's"),
    # a valid sha256 over settings no run writes: checked as the flags are, before anything uses them
    ("resume checkpoint at step -5", [*TRAIN, "--out", "{run_at_step_minus_5}", "--resume"], 1, "holds step -5:"),
    ("sample checkpoint at step -5", sample("{run_at_step_minus_5}"), 1, "holds step -5:"),
    ("resume checkpoint of steps 'twelve'", [*TRAIN, "--out", "{run_of_steps_twelve}", "--resume"], 1,
     "holds train_config.steps = 'twelve'"),
    ("resume checkpoint of lr nan", [*TRAIN, "--out", "{run_of_lr_nan}", "--resume"], 1,
     "holds train_config that a flag would refuse (--lr must be a finite number"),
    ("merge shard with an unknown setting", ["parity", "--merge", "{shard_unknown_key}", "--out", "{out}"], 2,
     "settings this gpt2ladder does not know (flux_capacitor)"),
    ("merge shard with a broken result", ["parity", "--merge", "{shard_broken}", "--out", "{out}"], 2,
     "is damaged or from another gpt2ladder: KeyError"),
    ("bench baseline json with a damaged row", ["bench", *TINY, "--steps", "1", "--warmup", "0", "--data", "{text}",
     "--out", "{out}", "--baseline-json", "{baseline_broken}"], 2, "is not a ladder.json written by gpt2ladder bench"),
    ("resume on another text", [*TRAIN, "--out", "{run}", "--resume", "--data", "{other_text}"], 2,
     "--allow-data-change"),
    # numbers that fit a flag but not the memory: checked by arithmetic before anything is allocated
    ("train tokens per step 2**60", [*TRAIN, "--tokens-per-step", str(2**60)], 2, "use a smaller --tokens-per-step"),
    ("train batch 100000", [*TRAIN, "--batch-size", "100000"], 2, "the largest batch that fits is"),
    ("train batch 2**63 - 1", [*TRAIN, "--batch-size", str(2**63 - 1)], 2, "the largest batch that fits is"),
    # counts far past any real use, and numbers no count is (inf, 1e400 read as a float): one line at once
    ("train steps 2**63 - 1", [*TRAIN, "--steps", str(2**63 - 1)], 2,
     "--steps: expected a positive integer, at most 1,000,000,000,"),
    ("bench steps 2**63 - 1", [*BENCH, "--steps", str(2**63 - 1)], 2, "--steps: expected a positive integer, at most"),
    ("bench warmup 10**14", [*BENCH, "--warmup", str(10**14)], 2, "--warmup: expected zero or more, at most"),
    ("train val tokens inf", [*TRAIN, "--val-tokens", "inf"], 2, "--val-tokens: expected a whole, positive token"),
    ("train val tokens 1e400", [*TRAIN, "--val-tokens", "1e400"], 2, "--val-tokens: expected a whole, positive"),
    ("prepare workers 2**63", ["prepare", "{text}", "{out}", "--workers", str(2**63)], 2,
     "--workers: expected a positive integer, at most 1,024,"),
    ("prepare val tokens inf", ["prepare", "{text}", "{out}", "--val-tokens", "inf"], 2,
     "--val-tokens: expected a whole"),
    ("prepare shard tokens 1e400", ["prepare", "{text}", "{out}", "--shard-tokens", "1e400"], 2, "--shard-tokens: exp"),
    ("eval batch 10**9", ["eval", "{run}", "--device", "cpu", "--batch-size", str(10**9)], 2,
     "--batch-size: expected a positive integer, at most 4,096,"),
    ("sample samples 2**63 - 1", [*SAMPLE, "--num-samples", str(2**63 - 1)], 2, "--num-samples: expected a positive"),
    ("train warmup steps 2**63", [*TRAIN, "--warmup-steps", str(2**63)], 2,
     "--warmup-steps: expected zero or more, at most 1,000,000,000,"),
    ("train eval every 10**10", [*TRAIN, "--eval-every", str(10**10)], 2, "--eval-every: expected zero or more"),
    ("train ckpt every 2**63", [*TRAIN, "--ckpt-every", str(2**63)], 2, "--ckpt-every: expected zero or more, at most"),
    ("train hellaswag every 10**10", [*TRAIN, "--hellaswag-every", str(10**10)], 2,
     "--hellaswag-every: expected zero or more, at most"),
    ("train gpu memory 1e308", [*TRAIN, "--gpu-memory", "1e308"], 2, "--gpu-memory: expected a positive number of GiB"),
    ("doctor gpu memory 2**21", ["doctor", "--gpu-memory", str(2**21)], 2, "--gpu-memory: expected a positive number"),
    ("doctor gpu memory nan", ["doctor", "--gpu-memory", "nan"], 2, "--gpu-memory: expected a positive number"),
    ("parity eval every 10**10", [*PARITY, "--eval-every", str(10**10)], 2, "--eval-every: expected a positive"),
    ("race seeds 10**12", [*RACE, "--seeds", str(10**12)], 2, "--seeds: expected a positive integer, at most 1,000,"),
    ("race steps 2**63 - 1", [*RACE, "--steps", str(2**63 - 1)], 2, "--steps: expected a positive integer, at most"),
    ("race eval every 2**63", [*RACE, "--eval-every", str(2**63)], 2, "--eval-every: expected a positive integer, at"),
    ("race muon rate and no muon rung", [*RACE, "--muon-lr", "0.01", "--embed-lr", "0.1"], 2,
     "--muon-lr, --embed-lr set the muon recipe part's rates; no rung of this race has muon"),
    ("race decay fraction and no wsd rung", [*RACE, "--rungs", "gpt2,muon", "--decay-fraction", "0.5"], 2,
     "--decay-fraction sets the wsd recipe part's decay; no rung of this race has wsd"),
    # the options of train's measurements
    ("train target without validation", [*TRAIN, "--target-val-loss", "3"], 2,
     "--target-val-loss needs validation: give --eval-every N"),
    ("train target zero", [*TRAIN, "--eval-every", "1", "--target-val-loss", "0"], 2,
     "--target-val-loss: expected a positive number"),
    ("train eval near without a target", [*TRAIN, "--eval-every", "1", "--eval-near", "0.1"], 2,
     "--eval-near validates more often near the target: give --target-val-loss too"),
    ("train eval near negative", [*TRAIN, "--eval-every", "1", "--target-val-loss", "3", "--eval-near", "-1"], 2,
     "--eval-near must be a finite number of nats >= 0"),
    ("race eval near nan", [*RACE, "--eval-near", "nan"], 2, "--eval-near must be a finite number of nats >= 0"),
    ("train val tokens on a text", [*TRAIN, "--val-tokens", "2K"], 2, "--val-tokens is for a corpus of token shards"),
    ("train val tokens 1.5", [*TRAIN, "--val-tokens", "1.5"], 2, "--val-tokens: expected a whole, positive token"),
    ("train hellaswag every -1", [*TRAIN, "--hellaswag-every", "-1"], 2, "--hellaswag-every: expected zero or more"),
    ("train hellaswag data missing", [*TRAIN, "--hellaswag-every", "1", "--hellaswag-data", "{root}/missing.jsonl"],
     2, "HellaSwag file"),
    ("train hellaswag data alone", [*TRAIN, "--hellaswag-data", "{text}"], 2, "is read by --hellaswag-every N"),
    ("train hellaswag data not HellaSwag", [*TRAIN, "--hellaswag-every", "1", "--hellaswag-data", "{text}"], 2,
     "is not a HellaSwag example"),
    # a step no host holds, refused by the estimate before anything is allocated (not grown into until
    # the kernel kills the process)
    ("bench batch 100000", [*BENCH, "--batch-size", "100000"], 2, "the largest batch that fits is"),
    ("parity batch 100000", [*PARITY, "--batch-size", "100000"], 2, "the largest batch that fits is"),
    ("profile batch 100000", [*PROFILE, "--batch-size", "100000"], 2, "the largest batch that fits is"),
    # an --out folder of the user's own files: its files are never replaced, so nothing starts
    ("bench out a folder of other files", [*BENCH, "--out", "{mine}"], 2,
     "holds files gpt2ladder bench did not write (notes.txt)"),
    ("profile out a folder of other files", [*PROFILE, "--out", "{mine}"], 2,
     "holds files gpt2ladder profile did not write (ladder.json, notes.txt)"),
    ("parity out a folder of other files", [*PARITY, "--out", "{mine}"], 2,
     "holds files gpt2ladder parity did not write (ladder.json, notes.txt)"),
    ("parity merge into a folder of other files", ["parity", "--merge", "{shard_broken}", "--out", "{mine}"], 2,
     "holds files gpt2ladder parity did not write (ladder.json, notes.txt)"),
    ("race out a folder of other files", [*RACE, "--out", "{mine}"], 2,
     "holds files gpt2ladder race did not write (ladder.json, notes.txt)"),
    ("bench out a train run", [*BENCH, "--out", "{run}"], 2, "holds files gpt2ladder bench did not write ("),
]


@pytest.fixture(scope="module")
def places(module_tmp):
    """The paths the placeholders stand for; the run is a one-step tiny training run, made once."""
    root = module_tmp("bad-inputs")
    (root / "small.txt").write_text(TEXT)
    paths = {"text": root / "small.txt", "run": root / "run", "root": root, "fifo": root / "fifo",
             "mine": root / "mine"}
    paths["mine"].mkdir()
    (paths["mine"] / "notes.txt").write_text("mine")
    (paths["mine"] / "ladder.json").write_text("mine too")  # a name bench writes, in a folder it did not write
    os.mkfifo(paths["fifo"])  # nothing ever writes to it: reading it would hang
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2LADDER_CACHE", str(root / "cache"))
        assert main(_fill([*TRAIN, "--steps", "1"], {**paths, "out": paths["run"]})) == 0
    paths.update(_texts(root), **_damaged_checkpoints(root, paths["run"]), **_damaged_shards(root))
    return paths


def _texts(root) -> dict:
    (root / "short.txt").write_text(TEXT[:300])  # a validation split of a few tokens
    (root / "other.txt").write_text(TEXT.upper())
    return {"short": root / "short.txt", "other_text": root / "other.txt"}


def _damaged_checkpoints(root, run) -> dict:
    """Checkpoints whose sha256 is valid but whose contents are not what the reader needs, and a cut one."""
    state = load_checkpoint(run)
    without = {"no_config_ckpt": "model_config", "run_without_optimizer": "optimizer"}
    paths = {name: root / name for name in [*without, "odd_model_ckpt", "truncated_ckpt", "nan_ckpt",
                                            "huge_config_ckpt", "odd_field_ckpt"]}
    shutil.copytree(run, paths["run_without_optimizer"])
    paths["run_without_optimizer"] /= "ckpt.pt"
    paths["run_with_odd_best"] = shutil.copytree(run, root / "run_with_odd_best")
    save_checkpoint(paths["run_with_odd_best"] / "ckpt.pt", {**state, "best": {"step": 1, "val_loss": "low"}})
    for name, change in {"run_at_step_minus_5": {"step": -5},
                         "run_of_steps_twelve": {"train_config": {**state["train_config"], "steps": "twelve"}},
                         "run_of_lr_nan": {"train_config": {**state["train_config"], "lr": float("nan")}}}.items():
        paths[name] = shutil.copytree(run, root / name)
        save_checkpoint(paths[name] / "ckpt.pt", {**state, **change})
    save_checkpoint(paths["huge_config_ckpt"], {**state, "model_config": {**state["model_config"], "n_layer": 10_000}})
    save_checkpoint(paths["odd_field_ckpt"], {**state, "data_source": "tinyshakespeare"})
    for name, key in without.items():
        save_checkpoint(paths[name], {k: v for k, v in state.items() if k != key})
    save_checkpoint(paths["odd_model_ckpt"], {**state, "model_config": {**state["model_config"], "n_head": 3}})
    paths["truncated_ckpt"].write_bytes((run / "ckpt.pt").read_bytes()[:5000])
    model = {k: v.clone() for k, v in state["model"].items()}
    model["transformer.ln_f.weight"][0] = float("nan")
    save_checkpoint(paths["nan_ckpt"], {**state, "model": model})
    paths["run_without_optimizer"] = paths["run_without_optimizer"].parent
    return paths


def _damaged_shards(root) -> dict:
    config = ParityConfig(rungs=("baseline",)).to_dict()
    shard = {"device": {"name": "cpu"}, "command": "parity-shard", "shard": [0, 1], "skipped": {},
             "results": {"baseline-seed0": {"status": "ok"}, "baseline-seed1": {"status": "ok"}}}
    paths = {"shard_unknown_key": root / "unknown.json", "shard_broken": root / "broken.json"}
    paths["shard_unknown_key"].write_text(json.dumps({**shard, "config": {**config, "flux_capacitor": 1}}))
    paths["shard_broken"].write_text(json.dumps({**shard, "config": config}))  # results without their losses
    paths["baseline_broken"] = root / "ladder.json"
    paths["baseline_broken"].write_text(json.dumps({"command": "bench", "config": {"preset": "tiny", "batch_size": 2,
                                                   "seq_len": 16}, "rungs": [{"name": "baseline", "status": "ok"}]}))
    return paths


def test_a_folder_of_a_commands_own_output_is_written_again_and_any_other_file_refused(tmp_path):
    from gpt2ladder.commands import bench, parity, profile, race
    from gpt2ladder.errors import UsageError
    from gpt2ladder.training.outdirs import check_own_out

    own = {bench: ["ladder.json", "ladder.md", "ladder.png"],
           profile: ["profile.json", "profile.md", "profile.png", "trace-baseline+tf32.json"],
           parity: ["parity.json", "parity.md", "parity.png", "parity-shard-0-of-2.json"],
           race: ["race.json", "race.md", "race.png", "gpt2", "muon"]}
    for module, names in own.items():
        command = module.__name__.rsplit(".", 1)[1]
        out = tmp_path / command
        out.mkdir()
        for name in names:
            (out / name).write_text("")
        (out / ".lock").write_text("")  # hidden names are a writer's own: a lock, a temporary
        check_own_out(out, command, module.OWN_FILES)
        check_own_out(tmp_path / "new", command, module.OWN_FILES)
        for other in ("notes.txt", "ladder.json.bak", "config.json"):
            (out / other).write_text("mine")
            with pytest.raises(UsageError, match=f"did not write \\({other}"):
                check_own_out(out, command, module.OWN_FILES)
            (out / other).unlink()


def _fill(argv: list[str], paths: dict) -> list[str]:
    return [a.format(**{k: str(v) for k, v in paths.items()}) for a in argv]


@pytest.mark.parametrize("argv, code, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_an_exit_code(places, argv, code, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(places["root"] / "cache"))
    got = main(_fill(argv, {**places, "out": tmp_path / "out"}))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert got == code, err
    assert err.startswith("gpt2ladder: error: ") and err.count("\n") == 1, f"not one line: {err!r}"
    assert fragment in err, err
    if code == 2:
        assert out == "", f"printed before the error: {out!r}"
