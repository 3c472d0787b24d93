"""GPT-2 in the Hugging Face format, both ways: load a local `model.safetensors` (+ `config.json`) into
our `GPT`, and write a `GPT` as a folder that `transformers.GPT2LMHeadModel.from_pretrained` loads.

Only local files: nothing is downloaded. Hugging Face stores GPT-2's linear layers as `Conv1D`, whose
weight is (in, out); ours are `nn.Linear`, (out, in), so those four matrices per block are transposed
both ways (the two square `attn.c_proj.weight`s would load silently wrong otherwise). The embedding is
copied into the first vocab_size rows of a padded vocabulary (the rest stay zero) and cut back to
vocab_size rows on the way out. The classifier is tied to the embedding, so a file holds only
`transformer.wte.weight`, as `save_pretrained` writes it.

The number of heads cannot be read off tensor shapes, so the shape comes from a `config.json` beside
the weights when there is one, else the model (its preset) must already match.

Which `config.json` values load. A field changes either the function the network computes or only how
transformers trains, generates or stores it. Every field of the first kind is checked against what our
GPT computes, and any other value is refused in one line naming the field; a field absent from the
file takes transformers' default, which is GPT-2's and ours:
- vocab_size 50257 (gpt2ladder has only the GPT-2 tokenizer); model_type "gpt2";
- activation_function: the tanh approximation of GELU, which transformers names gelu_new (GPT-2's),
  gelu_pytorch_tanh, gelu_python_tanh, gelu_fast and gelu_accurate (the same formula); not "gelu" (erf);
- layer_norm_epsilon 1e-05 (nn.LayerNorm's); n_inner null or 4 x n_embd;
- scale_attn_weights true, scale_attn_by_inverse_layer_idx false, reorder_and_upcast_attn false (it
  changes the attention's rounding under mixed precision, which our attention does not reproduce);
- tie_word_embeddings true (and a file whose lm_head.weight differs from wte is refused too);
- add_cross_attention false, is_encoder_decoder false, pruned_heads empty, no quantization_config.
Ignored, because they do not change the logits of a loaded model: dropout (resid/embd/attn_pdrop;
gpt2ladder trains without it), initializer_range, the summary_* fields (GPT2DoubleHeadsModel's extra
head), token ids (bos/eos/pad), use_cache and other generation settings, dtype (weights are cast to the
model's), architectures, transformers_version, n_ctx (the positions are n_positions, as in transformers)
and the fine-tuning label fields.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE, ModelConfig

# HF Conv1D layers, stored (in, out): transposed into nn.Linear's (out, in).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers some HF checkpoints carry (h.N.attn.bias and .masked_bias, the attention masks, not to be
# confused with h.N.attn.c_attn.bias): not parameters of ours. lm_head.weight is checked, then dropped.
SKIPPED_TAILS = (("attn", "bias"), ("attn", "masked_bias"))
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast", "gelu_accurate")
# config.json fields that change the function, and the values our GPT computes (see the docstring).
IMPLEMENTED = {
    "model_type": ("gpt2",), "vocab_size": (GPT2_VOCAB_SIZE,), "activation_function": TANH_GELUS,
    "layer_norm_epsilon": (1e-5,), "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
    "reorder_and_upcast_attn": (False,), "tie_word_embeddings": (True,), "add_cross_attention": (False,),
    "is_encoder_decoder": (False,), "pruned_heads": ({},), "quantization_config": (None,),
}
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
GPT2_EOT_ID = GPT2_VOCAB_SIZE - 1  # <|endoftext|>, GPT-2's only special token


# --- reading ------------------------------------------------------------------------------------


def weights_file(path: str | Path) -> Path:
    """The safetensors file itself, or model.safetensors inside a folder; UsageError when missing."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / WEIGHTS_NAME
    if not path.is_file():
        raise UsageError(f"GPT-2 weights not found at {path}; give a local Hugging Face-format "
                         "model.safetensors (no download is attempted)")
    return path


def is_hf_weights(path: str | Path) -> bool:
    """Whether `path` names Hugging Face weights: a .safetensors file, or a folder holding model.safetensors."""
    path = Path(path).expanduser()
    return (path / WEIGHTS_NAME).is_file() if path.is_dir() else path.suffix == ".safetensors"


def hf_model_config(path: str | Path) -> ModelConfig | None:
    """The shape from a config.json beside the weights (checked: see the module docstring), or None
    when there is none."""
    cfg_path = weights_file(path).parent / CONFIG_NAME
    if not cfg_path.is_file():
        return None
    try:
        raw = json.loads(cfg_path.read_text())
        check_implemented(raw, cfg_path)
        return ModelConfig(n_layer=int(raw["n_layer"]), n_head=int(raw["n_head"]), n_embd=int(raw["n_embd"]),
                           block_size=int(raw.get("n_positions", 1024)),  # transformers' default
                           vocab_size=int(raw.get("vocab_size", GPT2_VOCAB_SIZE)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise UsageError(f"cannot read the GPT-2 shape from {cfg_path}: {type(err).__name__}: {err}") from None


def check_implemented(raw: dict, where: Path) -> None:
    """UsageError naming the first config.json field whose value our GPT does not compute."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where} is not a JSON object")
    accepted = {**IMPLEMENTED, "n_inner": (None, 4 * int(raw.get("n_embd", 768)))}
    for field, values in accepted.items():
        if field in raw and raw[field] not in values:
            expected = " or ".join(json.dumps(v) for v in values)
            raise UsageError(f"{where}: {field} = {json.dumps(raw[field])} is not implemented by gpt2ladder's "
                             f"GPT-2, which computes {field} = {expected}")


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
        if tuple(name.split(".")[-2:]) in SKIPPED_TAILS or name == "lm_head.weight":
            continue
        if name.endswith(CONV1D_SUFFIXES):
            value = value.t()
        state[f"transformer.{name}"] = value
    _check_tied(tensors.get("lm_head.weight"), state.get("transformer.wte.weight"), file)
    return state


def _check_tied(head: torch.Tensor | None, wte: torch.Tensor | None, file: Path) -> None:
    """Our classifier is the embedding: a file with another lm_head would compute other logits."""
    if head is not None and wte is not None and not (head.shape == wte.shape and torch.equal(head, wte)):
        raise UsageError(f"{file}: lm_head.weight differs from transformer.wte.weight (an untied classifier); "
                         "gpt2ladder's GPT-2 ties them")


@torch.no_grad()
def load_hf_gpt2(path: str | Path, model) -> None:
    """Copy the weights of a HF GPT-2 file into `model` (a `GPT`) in place; UsageError on any mismatch."""
    _check_shape(hf_model_config(path), model.config, weights_file(path))
    state = read_hf_state(path)
    params = dict(model.named_parameters())  # lm_head is tied to wte, so it is listed once
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise UsageError(f"{weights_file(path)} does not fit this model: missing {_few(missing)}, "
                         f"unexpected {_few(unexpected)}")
    for name, param in params.items():
        _copy_into(param, state[name], name, vocab_size=model.config.vocab_size)


def _check_shape(saved: ModelConfig | None, cfg: ModelConfig, file: Path) -> None:
    """The head count is not in any tensor's shape: compare it (and the rest) with config.json."""
    fields = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
    diffs = [f"{f} {getattr(saved, f)} there, {getattr(cfg, f)} here" for f in fields
             if saved is not None and getattr(saved, f) != getattr(cfg, f)]
    if diffs:
        raise UsageError(f"{file} does not fit this model: its config.json says {'; '.join(diffs)}")


def load_hf_model(path: str | Path):
    """A `GPT` of the shape in config.json beside the weights, the weights loaded, on the CPU, in eval mode."""
    from gpt2ladder.model.gpt import GPT

    cfg = hf_model_config(path)
    if cfg is None:
        raise UsageError(f"no {CONFIG_NAME} beside {weights_file(path)}: the number of heads cannot be read "
                         "from the tensors; put the model's config.json there")
    model = GPT(cfg)
    load_hf_gpt2(path, model)
    return model.eval()


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


# --- writing ------------------------------------------------------------------------------------


def hf_config(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> dict:
    """config.json for GPT2LMHeadModel: the shape, and every function-changing field set to what we compute."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "add_cross_attention": False,
        # gpt2ladder trains without dropout; fine-tuning in transformers then starts from the same function
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "bos_token_id": GPT2_EOT_ID, "eos_token_id": GPT2_EOT_ID, "dtype": str(dtype).removeprefix("torch."),
    }



def hf_tensors(model, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The model's weights as GPT2LMHeadModel names them: Conv1D layout, vocab_size rows, no lm_head."""
    out = {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # the same tensor as wte; transformers ties it back on load
        if name == "transformer.wte.weight":
            value = value[: model.config.vocab_size]  # the padded rows are never used
        if name.endswith(CONV1D_SUFFIXES):
            value = value.t()
        out[name] = value.detach().to("cpu", dtype).contiguous().clone()  # safetensors wants owned, dense tensors
    return out


def save_hf_gpt2(model, folder: str | Path, dtype: torch.dtype = torch.float32) -> list[Path]:
    """Write config.json, generation_config.json and model.safetensors of `model` into `folder`."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / CONFIG_NAME, folder / "generation_config.json", folder / WEIGHTS_NAME]
    _write_json(files[0], hf_config(model.config, dtype))
    _write_json(files[1], {"bos_token_id": GPT2_EOT_ID, "eos_token_id": GPT2_EOT_ID})
    save_file(hf_tensors(model, dtype), str(files[2]), metadata={"format": "pt"})  # "pt": transformers checks it
    return files


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
