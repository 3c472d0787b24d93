"""`gpt2ladder export`: a model (a run's checkpoint, a Hugging Face folder or a hub name, loaded by
`training/loading.py`) -> a Hugging Face GPT-2 folder (weights only, no optimizer), and with
--push-to-hub that folder uploaded as a hub repository.

The folder holds config.json, generation_config.json and model.safetensors (`model/hf.py`), the GPT-2
tokenizer files (`data/tokenizer.py`), a model card (`report/model_card.py`) and gpt2ladder.json, what the
card was made from (exporting that folder again keeps the run's details); it is written beside
OUT_DIR and renamed into place, so a failure leaves no half folder behind. Meanwhile the export holds a
lock beside OUT_DIR (a second export to the same place is refused, and what a killed one left there is
removed) and, when OUT_DIR is a run's folder, that run's lock (a run still training there is never
replaced). --force replaces a folder of other files, an earlier export among them, but never one that holds
a gpt2ladder run's checkpoint, in it or anywhere below it: a finished run is kept as a running one is.

Only GPT-2's model exports: the gpt2 recipe, or one whose parts change only the optimizer, the schedule or
the initial weights (`model/hf.check_exportable`). A run's weights are its last good checkpoint, as `sample`
reads it. The card's results are only those measured on these very weights: the run's last finite validation
loss at or before the checkpoint's step, and a full HellaSwag evaluation of the official set (an eval.json in
the run directory whose weights digest is this checkpoint's, or a log entry at this step; a partial one,
`eval --limit N`, is written to eval-limit-N.json and never read here).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import torch

from gpt2ladder.data.files import write_atomic
from gpt2ladder.data.shards import file_sha256
from gpt2ladder.data.tokenizer import write_hf_tokenizer
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.evals import hellaswag
from gpt2ladder.model import hub
from gpt2ladder.model.gpt import describe_shape
from gpt2ladder.model.hf import WEIGHTS_NAME, check_exportable, save_hf_gpt2
from gpt2ladder.report.model_card import finite, model_card
from gpt2ladder.report.records import check_new_folder, folder_written_whole, remove_stale_folders
from gpt2ladder.training import lock
from gpt2ladder.training.checkpoint import BEST, FILENAME, PREVIOUS, state_digest
from gpt2ladder.training.loading import LoadedModel, is_run, load_model
from gpt2ladder.training.outdirs import hold_unless_training
from gpt2ladder.training.runlog import read_log

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]*")  # the hub's license ids: mit, apache-2.0, cc-by-4.0, other, ...


def export_command(args) -> int:
    dtype = DTYPES[args.dtype]
    out = Path(os.path.abspath(Path(args.out_dir).expanduser()))  # "." and ".." have no name to write beside
    _check_options(args)
    _check_target(args.run, out, args.force)
    loaded = load_model(args.run, torch.device("cpu"))  # one-line errors for a missing, corrupt or foreign source
    model = loaded.model
    check_exportable(model.config)  # before anything is written
    facts = {**source_facts(loaded), "license": args.license}
    with _disk_errors(out), _destination(out, args.force) as tmp:
        save_hf_gpt2(model, tmp, dtype)
        write_hf_tokenizer(tmp, model_max_length=model.config.block_size)
        card = model_card(out.name, describe_shape(model), str(dtype).removeprefix("torch."), facts,
                          repo=args.push_to_hub)
        write_atomic(tmp / "README.md", card)
        keep_facts(tmp, facts)
    size = (out / "model.safetensors").stat().st_size
    what = f"step {facts['step']} of {loaded.path}" if loaded.kind == "run" else loaded.description
    print(f"gpt2ladder export: {describe_shape(model)}, {what} -> {out} "
          f"(model.safetensors {size / 1e6:.1f} MB, {str(dtype).removeprefix('torch.')})")
    if args.push_to_hub:
        url = hub.push_folder(out, args.push_to_hub, f"gpt2ladder export: {describe_shape(model)}")
        print(f"gpt2ladder export: pushed {out} to {url}")
    return 0


def _check_options(args) -> None:
    if args.license is not None and not _LICENSE.fullmatch(args.license):
        raise UsageError(f"--license {args.license!r} is not a license id as the Hugging Face hub writes them "
                         "(lower case, e.g. mit, apache-2.0, cc-by-4.0, or other)")
    if args.push_to_hub:
        hub.check_push(args.push_to_hub)


def _check_target(source: str, out: Path, force: bool) -> None:
    """Refuse before any work: an output that is not empty, or one that holds the source itself."""
    path = Path(source).expanduser()
    if not out.name:
        raise UsageError(f"{out} cannot be replaced; give a folder to write")
    if path.exists() and path.resolve().is_relative_to(out.resolve()):
        what = "run" if is_run(path) else "model"
        raise UsageError(f"{out} holds the {what} being exported ({path}); give another folder")
    _check_no_run_inside(out)
    check_new_folder(out, force)


# The files a gpt2ladder run keeps its weights in (`training/checkpoint.py`), in the order a refusal names them: a
# folder holding one is never replaced.
RUN_CHECKPOINTS = (FILENAME, PREVIOUS, BEST)


def _check_no_run_inside(out: Path) -> None:
    """A UsageError when `out` holds a gpt2ladder run's checkpoint, in it or in any folder below it: replacing `out`
    would delete that run. A link is not followed (replacing `out` removes the link, never what it points to); a
    folder that cannot be read is refused too, since what it holds cannot be known."""
    if out.is_symlink() or not out.is_dir():
        return  # check_new_folder says why such an OUT_DIR is refused

    def unreadable(err: OSError) -> None:
        raise UsageError(f"cannot read {err.filename} to see whether it holds a gpt2ladder run "
                         f"({err.strerror or err}); {out} is not replaced: give another folder")

    for folder, subfolders, files in os.walk(out, onerror=unreadable):
        subfolders.sort()  # in name order: the same checkpoint is named every time
        found = [n for n in RUN_CHECKPOINTS if n in files and not os.path.islink(os.path.join(folder, n))]
        if found:
            raise UsageError(f"{out} holds a gpt2ladder run's checkpoint ({Path(folder) / found[0]}); an export "
                             "never replaces a run, even with --force: give another folder")


@contextlib.contextmanager
def _destination(out: Path, force: bool):
    """`folder_written_whole(out)`, while this export holds a lock beside `out` (a second export to the
    same place fails in one line, and what a killed one left there is removed) and, when `out` is a
    run directory, that run's lock (a run still training there is never replaced)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot write to {out.parent}: {err.strerror or err}") from None
    held, holder = lock.try_lock_file(out.parent / f".{out.name}.lock")
    if holder:
        raise UsageError(f"{out} is being written by another gpt2ladder export ({holder}); wait for it to finish")
    run_lock = None
    try:
        check_new_folder(out, force)  # again, now that no other export can write there
        _check_no_run_inside(out)  # and a run written there meanwhile
        run_lock = hold_unless_training(out)
        remove_stale_folders(out)
        with folder_written_whole(out, force) as tmp:
            yield tmp
    finally:
        for held_lock in (run_lock, held):
            if held_lock is not None:
                held_lock.release()


@contextlib.contextmanager
def _disk_errors(out: Path):
    """safetensors reports a failed write (a full disk) as its own SafetensorError: one line, exit 1."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        detail = " ".join(str(err).split())
        raise LadderError(f"could not write {out}: {detail}; it is left as it was") from None


# Beside an export's card, what the card was made from, so exporting that folder again (another dtype, a
# push) keeps the run's training details; read back only while model.safetensors is the one written with it.
FACTS_NAME = "gpt2ladder.json"


def keep_facts(folder: Path, facts: dict) -> None:
    weights = file_sha256(folder / WEIGHTS_NAME)
    write_atomic(folder / FACTS_NAME, json.dumps({"facts": facts, "weights_sha256": weights}, indent=2) + "\n")


def kept_facts(entry: Path) -> dict | None:
    """The facts an earlier export wrote beside `entry` (its model.safetensors), if that file is unchanged."""
    try:
        record = json.loads((entry.parent / FACTS_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(record, dict) and isinstance(record.get("facts"), dict) and entry.name == WEIGHTS_NAME
            and record.get("weights_sha256") == file_sha256(entry)):
        return None
    return {k: v for k, v in record["facts"].items() if k != "license"}  # the license is this export's flag


def source_facts(loaded: LoadedModel) -> dict:
    """What the card may say about the weights: a run's record; for Hugging Face weights what an earlier
    export of them kept, else the hub repository they came from, when that is known."""
    if loaded.kind != "run":
        kept = kept_facts(loaded.path) if loaded.kind == "hf" else None
        return kept or {"base_model": hub.known_repo(loaded.source) or hub.known_repo(str(loaded.path))}
    facts = run_facts(loaded.path, loaded.state)
    return {**facts, "base_model": hub.known_repo(facts.get("init_from")),
            "hellaswag": measured_hellaswag(loaded.path, loaded.state)}


# The type of every fact a run records, as the model card prints it; a value of another type (a file
# edited by hand, or written by another tool) is left out of the card, never printed or guessed.
TRAIN_FACTS = {"steps": int, "tokens_per_step": int, "init_from": str, "seed": int, "rungs": list,
               "eval_batches": int, "batch_size": int, "seq_len": int, "recipe": str}
DATA_FACTS = {"source": str, "sha256": str, "n_tokens": int}


def run_facts(ckpt: Path, state: dict) -> dict:
    """What the run recorded about the weights in `state`: the checkpoint itself, and the config.json
    and log.jsonl beside it, each fact only where it belongs to this checkpoint (and only finite losses)."""
    train = _typed(state.get("train_config"), TRAIN_FACTS)
    step = state["step"] if _of(state.get("step"), int) is not None else 0
    log = [e for e in read_log(ckpt.parent / "log.jsonl") if e["step"] <= step]  # a log may run past its checkpoint
    val = [e for e in log if finite(e.get("val_loss"))]
    last = next((e for e in log if e["step"] == step), {})
    return {**train, **_record_facts(ckpt.parent / "config.json", state),
            "step": step, "loss": last.get("loss") if finite(last.get("loss")) else None,
            "val": {"step": val[-1]["step"], "loss": val[-1]["val_loss"]} if val else None}


def measured_hellaswag(ckpt: Path, state: dict) -> dict | None:
    """A full HellaSwag result on the official set for exactly these weights: RUN/eval.json written by
    `gpt2ladder eval` of this checkpoint, else a log.jsonl entry at the checkpoint's step (its
    "hellaswag" field: task, n, acc, acc_norm, official); None if neither."""
    try:
        record = json.loads((ckpt.parent / "eval.json").read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("command") == "eval" and isinstance(record.get("model"), dict) \
            and record["model"].get("weights_sha256") == state_digest(state["model"]):
        found = _full_result(record, (record.get("data") or {}).get("official"))
        if found:
            return found
    for entry in read_log(ckpt.parent / "log.jsonl"):
        result = entry.get("hellaswag")
        if entry["step"] == state.get("step") and isinstance(result, dict):
            found = _full_result(result, result.get("official"))
            if found:
                return found
    return None


def _full_result(result: dict, official) -> dict | None:
    """{n, acc, acc_norm} of a result over the whole official validation set, else None."""
    if not (official is True and result.get("task") == hellaswag.NAME and result.get("n") == hellaswag.N_EXAMPLES):
        return None
    if not all(finite(result.get(k)) and 0 <= result[k] <= 1 for k in ("acc", "acc_norm")):
        return None
    return {"n": result["n"], "acc": result["acc"], "acc_norm": result["acc_norm"]}


def _record_facts(path: Path, state: dict) -> dict:
    """Data, device and version from the run's config.json, when it describes the checkpoint's data."""
    data = _typed(state.get("data_source"), DATA_FACTS)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"data": data}
    if not isinstance(record, dict) or record.get("command") != "train":
        return {"data": data}
    recorded = _typed(record.get("data"), DATA_FACTS)
    if recorded.get("sha256") is not None and recorded.get("sha256") == data.get("sha256"):
        data["n_tokens"] = recorded.get("n_tokens")
    device = record.get("device") if isinstance(record.get("device"), dict) else {}
    return {"data": data, "device": _of(device.get("name"), str),
            **_typed(record, {"date": str, "gpt2ladder": str, "git_sha": str})}


def _typed(record, types: dict) -> dict:
    """The fields of `record` (a dict, or anything else read from a file) of the types named, each None
    when missing or of another type; a list is a list of strings."""
    record = record if isinstance(record, dict) else {}
    return {key: _of(record.get(key), kind) for key, kind in types.items()}


def _of(value, kind: type):
    """value when it is a `kind` (a bool is not an int; a tuple of strings counts as a list), else None."""
    if kind is list:
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return list(value) if ok else None
    return value if isinstance(value, kind) and not isinstance(value, bool) else None
