"""`gpt2ladder export`: a run's checkpoint -> a Hugging Face GPT-2 folder (weights only, no optimizer).

The folder holds config.json, generation_config.json and model.safetensors (`model/hf.py`), the GPT-2
tokenizer files (`data/tokenizer.py`) and a model card (`report/model_card.py`); it is written beside
OUT_DIR and renamed into place, so a failure leaves no half folder behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gpt2ladder.data.tokenizer import write_hf_tokenizer
from gpt2ladder.errors import UsageError
from gpt2ladder.model.gpt import describe_shape
from gpt2ladder.model.hf import save_hf_gpt2
from gpt2ladder.report.model_card import model_card
from gpt2ladder.report.records import check_new_folder, folder_written_whole
from gpt2ladder.training.checkpoint import (
    checkpoint_path,
    load_checkpoint,
    model_from_checkpoint,
)
from gpt2ladder.training.runlog import read_log

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def export_command(args) -> int:
    dtype = DTYPES[args.dtype]
    ckpt, out = checkpoint_path(args.run), Path(args.out_dir).expanduser()
    _check_target(ckpt, out, args.force)
    state = load_checkpoint(ckpt)  # one-line errors for a missing, corrupt or foreign file
    model = model_from_checkpoint(state, torch.device("cpu"))
    facts = run_facts(ckpt, state)
    with folder_written_whole(out, force=args.force) as tmp:
        save_hf_gpt2(model, tmp, dtype)
        write_hf_tokenizer(tmp, model_max_length=model.config.block_size)
        card = model_card(out.name, describe_shape(model), str(dtype).removeprefix("torch."), facts)
        (tmp / "README.md").write_text(card)
    size = (out / "model.safetensors").stat().st_size
    print(f"gpt2ladder export: {describe_shape(model)}, step {facts['step']} of {ckpt} -> {out} "
          f"(model.safetensors {size / 1e6:.1f} MB, {str(dtype).removeprefix('torch.')})")
    return 0


def _check_target(ckpt: Path, out: Path, force: bool) -> None:
    """Refuse before any work: a missing run, an output that is not empty, or one that holds the run itself."""
    if not ckpt.is_file():
        raise UsageError(f"no checkpoint at {ckpt}; give a run directory or its ckpt.pt")
    if ckpt.resolve().is_relative_to(out.resolve()):
        raise UsageError(f"{out} holds the run being exported ({ckpt}); give another folder")
    check_new_folder(out, force)


def run_facts(ckpt: Path, state: dict) -> dict:
    """What the run recorded about the weights in `state`: the checkpoint itself, and the config.json
    and log.jsonl beside it, each fact only where it belongs to this checkpoint."""
    train = state.get("train_config") or {}
    step = int(state.get("step", 0))
    log = [e for e in read_log(ckpt.parent / "log.jsonl") if e["step"] <= step]  # a log may run past its checkpoint
    val = [e for e in log if isinstance(e.get("val_loss"), (int, float))]
    last = next((e for e in log if e["step"] == step), {})
    keys = ("steps", "tokens_per_step", "init_from", "seed", "rungs", "eval_batches", "batch_size", "seq_len")
    return {**{k: train.get(k) for k in keys}, **_record_facts(ckpt.parent / "config.json", state),
            "step": step, "loss": last.get("loss"),
            "val": {"step": val[-1]["step"], "loss": val[-1]["val_loss"]} if val else None}


def _record_facts(path: Path, state: dict) -> dict:
    """Data, device and version from the run's config.json, when it describes the checkpoint's data."""
    data = dict(state.get("data_source") or {})
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"data": data}
    if not isinstance(record, dict) or record.get("command") != "train":
        return {"data": data}
    recorded = record.get("data") or {}
    if recorded.get("sha256") == data.get("sha256"):
        data["n_tokens"] = recorded.get("n_tokens")
    return {"data": data, "device": (record.get("device") or {}).get("name"), "date": record.get("date"),
            "gpt2ladder": record.get("gpt2ladder"), "git_sha": record.get("git_sha")}
