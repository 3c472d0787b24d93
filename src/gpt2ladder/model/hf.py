"""Load real GPT-2 weights from a local Hugging Face-format `model.safetensors` into our `GPT`.

Only local files: nothing is downloaded. Hugging Face stores GPT-2's linear layers as `Conv1D`, whose
weight is (in, out); ours are `nn.Linear`, (out, in), so those four matrices per block are transposed.
The embedding is copied into the first vocab_size rows of a padded vocabulary, the rest stay zero.
The number of heads cannot be read off tensor shapes, so the shape comes from a `config.json` beside
the weights when there is one, else the model (its preset) must already match.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model.config import ModelConfig

# HF Conv1D layers, stored (in, out): transposed into nn.Linear's (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers some HF checkpoints carry (h.N.attn.bias and .masked_bias, the attention masks, not to be
# confused with h.N.attn.c_attn.bias) and the classifier, which is tied to wte: not parameters of ours.
SKIPPED_TAILS = (("attn", "bias"), ("attn", "masked_bias"), ("lm_head", "weight"))


def weights_file(path: str | Path) -> Path:
    """The safetensors file itself, or model.safetensors inside a folder; UsageError when missing."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise UsageError(f"GPT-2 weights not found at {path}; give a local Hugging Face-format "
                         "model.safetensors (no download is attempted)")
    return path


def hf_model_config(path: str | Path) -> ModelConfig | None:
    """The shape from a config.json beside the weights, or None when there is none."""
    cfg_path = weights_file(path).parent / "config.json"
    if not cfg_path.is_file():
        return None
    try:
        raw = json.loads(cfg_path.read_text())
        return ModelConfig(n_layer=int(raw["n_layer"]), n_head=int(raw["n_head"]), n_embd=int(raw["n_embd"]),
                           block_size=int(raw.get("n_positions", raw.get("n_ctx"))),
                           vocab_size=int(raw["vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"cannot read the GPT-2 shape from {cfg_path}: {type(err).__name__}: {err}") from None


def read_hf_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of the file under our names (no `transformer.` prefix, Linear layout)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = weights_file(path)
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise LadderError(f"cannot read {file} as safetensors: {err}") from None
    state = {}
    for key, value in tensors.items():
        name = key.removeprefix("transformer.")
        if tuple(name.split(".")[-2:]) in SKIPPED_TAILS:
            continue
        if name.endswith(CONV1D_SUFFIXES):
            value = value.t()
        state[f"transformer.{name}"] = value
    return state


@torch.no_grad()
def load_hf_gpt2(path: str | Path, model) -> None:
    """Copy the weights of a HF GPT-2 file into `model` (a `GPT`) in place; UsageError on any mismatch."""
    state = read_hf_state(path)
    params = dict(model.named_parameters())  # lm_head is tied to wte, so it is listed once
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise UsageError(f"{weights_file(path)} does not fit this model: missing {_few(missing)}, "
                         f"unexpected {_few(unexpected)}")
    for name, param in params.items():
        _copy_into(param, state[name], name, vocab_size=model.config.vocab_size)


def _copy_into(param: torch.Tensor, value: torch.Tensor, name: str, vocab_size: int) -> None:
    if name == "transformer.wte.weight" and value.shape[0] == vocab_size < param.shape[0]:
        param.zero_()  # padded rows: never looked up, never in the softmax
        param[:vocab_size].copy_(value)
        return
    if value.shape != param.shape:
        raise UsageError(f"{name} has shape {tuple(value.shape)} in the file but {tuple(param.shape)} in "
                         "this model; put the model's config.json beside the weights or pick the matching --preset")
    param.copy_(value)


def _few(names: list[str]) -> str:
    if not names:
        return "nothing"
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
