"""The Python API: what the commands do with a model, as four functions.

    import gpt2ladder
    model = gpt2ladder.load("gpt2")                    # a run directory, a Hugging Face folder or a hub name
    print(gpt2ladder.generate(model, "ROMEO:", max_new_tokens=50))
    gpt2ladder.save_hf(model, "hf/gpt2")               # a folder transformers loads
    gpt2ladder.evaluate(model, "hellaswag", limit=100) # {"task", "n", "acc", "acc_norm", ...}

Each is the command's own code (`training/loading.py`, `model/hf.py`, `model/generate.py`, `evals/`),
so a name, a folder or a run loads here exactly as `sample`, `eval` and `export` load it, with the same
one-line errors (`gpt2ladder.errors.UsageError`, `LadderError`), which name this API's parameters
(`task_data=`, `overwrite=True`), not the commands' flags; an argument out of range is a `BadArgument`
(a UsageError and a ValueError) before any work. `import gpt2ladder` stays light: torch is imported by the
first of these calls, not before.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from gpt2ladder.data.tokenizer import GPT2_EOT, encode_text, get_tokenizer, write_hf_tokenizer
from gpt2ladder.errors import BadArgument
from gpt2ladder.evals.runner import evaluate as run_task
from gpt2ladder.evals.runner import prepare
from gpt2ladder.model.generate import generate as extend
from gpt2ladder.model.gpt import GPT
from gpt2ladder.model.hf import save_hf_gpt2
from gpt2ladder.report.records import check_new_folder, folder_written_whole
from gpt2ladder.runtime.hardware import resolve_device
from gpt2ladder.training.loading import load_model
from gpt2ladder.training.outdirs import check_export_replaceable, hold_unless_training

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load(source: str | Path, device: str | torch.device = "auto") -> GPT:
    """The model a run directory (its newest good checkpoint), a checkpoint file, a Hugging Face folder
    or weights file, or a hub name (`gpt2`, `openai-community/gpt2`, ...) holds, in eval mode on `device`
    ("auto": a GPU when there is one)."""
    return load_model(source, _device(device)).model


def generate(model: GPT, prompt: str = "\n", max_new_tokens: int = 100, temperature: float = 0.8,
             top_k: int | None = 200, seed: int = 1337) -> str:
    """The prompt and its continuation as text, as `gpt2ladder sample` writes it; temperature 0 is greedy.
    A literal <|endoftext|> in the prompt is GPT-2's end-of-text token."""
    _positive("max_new_tokens", max_new_tokens)
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise BadArgument(f"temperature must be zero (greedy) or a finite positive number, got {temperature!r}")
    if top_k is not None and not (_is_int(top_k) and top_k >= 0):
        raise BadArgument(f"top_k must be None or zero (all tokens) or a positive integer, got {top_k!r}")
    device = next(model.parameters()).device
    given = encode_text(prompt)
    idx = torch.tensor([given or [GPT2_EOT]], dtype=torch.long, device=device)  # an empty prompt starts a document
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        out = extend(model, idx, max_new_tokens, temperature, top_k or None, gen)
    finally:
        model.train(was_training)
    return get_tokenizer().decode(out[0].tolist()[0 if given else 1:])  # that start is not part of the text


def save_hf(model: GPT, folder: str | Path, dtype: str = "float32", overwrite: bool = False) -> Path:
    """`model` as a Hugging Face GPT-2 folder (config.json, model.safetensors, generation_config.json and
    the GPT-2 tokenizer files) that `transformers.AutoModelForCausalLM.from_pretrained` loads. The
    folder appears whole or not at all; one that is not empty is replaced only with `overwrite`, and only
    when it holds an earlier export: never a run directory (above all one still training), never a folder
    of other files."""
    if dtype not in DTYPES:
        raise BadArgument(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    folder = Path(folder).expanduser()
    check_new_folder(folder, overwrite, force_flag="overwrite=True")
    check_export_replaceable(folder)
    held = hold_unless_training(folder)
    try:
        check_export_replaceable(folder)  # again, now that no run can start there
        with folder_written_whole(folder, force=overwrite, force_flag="overwrite=True") as tmp:
            save_hf_gpt2(model, tmp, DTYPES[dtype])
            write_hf_tokenizer(tmp, model_max_length=model.config.block_size)
    finally:
        if held is not None:
            held.release()
    return folder


def evaluate(model: GPT, task: str = "hellaswag", task_data: str | Path | None = None, limit: int | None = None,
             batch_size: int = 4) -> dict:
    """`gpt2ladder eval`'s measurement of `model` (fp32, eager): {"task", "n", "acc", "acc_norm", ...}. The
    task's official data comes from the data cache (downloaded once) unless `task_data` names a file."""
    if limit is not None:
        _positive("limit", limit)
    _positive("batch_size", batch_size)
    prepared = prepare(task, task_data, limit, flag="task_data=FILE")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        result = run_task(prepared, model, device=device, block_size=model.config.block_size,
                          vocab_size=model.config.vocab_size, batch_size=batch_size, progress=False)
    finally:
        model.train(was_training)
    return {**result.to_dict(), "data": prepared.data.to_dict()}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(name: str, value) -> None:
    if not (_is_int(value) and value > 0):
        raise BadArgument(f"{name} must be a positive integer, got {value!r}")


def _device(device: str | torch.device) -> torch.device:
    return device if isinstance(device, torch.device) else resolve_device(device)
