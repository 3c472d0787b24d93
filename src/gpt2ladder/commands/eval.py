"""`gpt2ladder eval`: a model (a run, a Hugging Face folder or a hub name) measured on a benchmark
(`evals/`), written as OUT/eval.json and told in one line. A run is evaluated in its own precision
(its autocast and matmul setting, on a GPU) and, on a GPU, through the compiled forward; Hugging Face
weights in fp32, with TF32 matmuls on a GPU, as build-nanogpt's and llm.c's HellaSwag scripts run
OpenAI's GPT-2 for the figures they publish. By default a run's result goes into the run directory, where
`export` finds it for the model card. A partial evaluation (--limit N) is written as OUT/eval-limit-N.json
instead, so that a quick look never replaces the full result the card reports.

What is checked, in order: MODEL (a path that names no model is refused before the task data, which may be
downloaded), then the task data, then the model is loaded."""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from gpt2ladder.errors import UsageError
from gpt2ladder.evals.runner import BATCH_SIZE, evaluate, prepare
from gpt2ladder.model.gpt import describe_shape
from gpt2ladder.model.hf import is_hf_weights
from gpt2ladder.model.hub import repo_id
from gpt2ladder.report.progress import on_terminal
from gpt2ladder.report.records import output_dir, record_header, write_json
from gpt2ladder.runtime.hardware import detect, resolve_device
from gpt2ladder.training.checkpoint import foreign_archive, state_digest
from gpt2ladder.training.loading import LoadedModel, check_source, is_run, load_model

DEFAULT_OUT = "runs/eval"


def eval_command(args) -> int:
    device = resolve_device(args.device)
    if args.batch_size is not None and args.batch_size <= 0:
        raise UsageError(f"--batch-size must be a positive integer, got {args.batch_size}")
    check_model(args.model)  # MODEL's mistakes first: it is the argument the user typed
    prepared = prepare(args.task, args.task_data, args.limit)  # the data's problems come before loading a model
    out = Path(args.out or (args.model if is_run(args.model) and Path(args.model).is_dir() else DEFAULT_OUT))
    name = result_name(args.limit)
    with output_dir(out) as out:
        loaded = load_model(args.model, device)
        caps = detect(device)
        settings = _settings(loaded, device, caps, args)
        forward = torch.compile(loaded.model, dynamic=False) if settings["compiled"] else loaded.model
        result = evaluate(prepared, forward, device=device, block_size=loaded.model.config.block_size,
                          vocab_size=loaded.model.config.vocab_size, batch_size=settings["batch_size"],
                          autocast=settings["autocast"], matmul_precision=settings["matmul_precision"],
                          progress=not args.no_progress and on_terminal())
        record = {**record_header(caps, device), "command": "eval", **result.to_dict(),
                  "model": model_record(loaded), "data": {**prepared.data.to_dict(), "limit": args.limit},
                  "settings": settings}
        write_json(out / name, record)
    limited = f" (the first {result.n:,} of {prepared.data.n_in_file:,})" if result.n < prepared.data.n_in_file else ""
    print(f"gpt2ladder eval: {result.task} acc {result.acc:.4f}, acc_norm {result.acc_norm:.4f} over {result.n:,} "
          f"examples{limited}; {loaded.description} on {device}, {result.seconds:.1f} s; wrote {out / name}")
    return 0


def result_name(limit: int | None) -> str:
    """eval.json for a full evaluation, the one `export` reads; eval-limit-N.json for the first N examples, so a
    quick look beside it never replaces it (nor one quick look another of a different N)."""
    return "eval.json" if limit is None else f"eval-limit-{limit}.json"


def check_model(source: str) -> None:
    """One line, before the task data is read or downloaded, when MODEL names nothing a model loads from: a
    missing path, a folder with neither a checkpoint nor Hugging Face weights, a file that is neither Hugging Face
    weights nor a zip archive (what torch.save writes). `load_model` refuses each of those with its own one line
    before it reads any weights, so it is asked to here; a hub name, or a path that may load, loads after the data
    is checked. (A file of torch.save's old format, no zip, is read here and again after the data.)"""
    check_source(source)
    path = Path(source).expanduser()
    if not path.exists() or is_hf_weights(path) or (is_run(path) and (path.is_dir() or (
            zipfile.is_zipfile(path) and not foreign_archive(path)))):
        return
    load_model(source, torch.device("cpu"))  # its one line: no model there (exit 2), or a damaged file (exit 1)


def _settings(loaded: LoadedModel, device: torch.device, caps, args) -> dict:
    """How the model runs, decided once: on a GPU a run's own precision (Hugging Face weights: fp32 with
    TF32 matmuls), compiled unless --no-compile or it cannot compile there; fp32 and eager on the CPU."""
    gpu = device.type == "cuda"
    autocast = loaded.setup.get("autocast") if gpu else None
    matmul = loaded.setup.get("matmul_precision", "highest") if loaded.kind == "run" else "high"
    return {"batch_size": args.batch_size or BATCH_SIZE.get(device.type, BATCH_SIZE["cpu"]),
            "autocast": autocast if autocast in ("bfloat16", "float16") else None,
            "matmul_precision": matmul if gpu else "highest",
            "compiled": gpu and not args.no_compile and caps.compile_problem is None}


def model_record(loaded: LoadedModel) -> dict:
    """What was evaluated: for a run, its checkpoint, step and a digest of its weights (which `export`
    compares before it puts the result on a model card)."""
    record = {"source": loaded.source, "kind": loaded.kind, "path": str(loaded.path),
              "shape": describe_shape(loaded.model), "config": loaded.model.config.to_dict()}
    if loaded.kind == "hub":
        record["repo_id"] = repo_id(loaded.source)
    if loaded.kind == "run":
        record |= {"step": loaded.step, "weights_sha256": state_digest(loaded.state["model"])}
    return record
