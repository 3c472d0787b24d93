"""GPT-2 in the Hugging Face format, both ways: load a Hugging Face folder (config.json and its weights)
into our `GPT`, and write a `GPT` as a folder that `transformers.GPT2LMHeadModel.from_pretrained` loads.

The weights are read from model.safetensors, from the shards a model.safetensors.index.json names, or
from pytorch_model.bin (and its sharded index), the last with `torch.load(weights_only=True)`, which
loads tensors and never runs pickled code. A hub name (`gpt2`, `openai-community/gpt2`) is first turned
into its cached or downloaded folder (`hub.py`); everything else here reads local files. Hugging Face
stores GPT-2's linear layers as `Conv1D`, whose weight is (in, out); ours are `nn.Linear`, (out, in), so
those four matrices per block are transposed both ways (the two square `attn.c_proj.weight`s would load
silently wrong otherwise). The embedding is copied into the first vocab_size rows of a padded vocabulary
(the rest stay zero) and cut back to vocab_size rows on the way out. The classifier is tied to the
embedding, so a file holds only `transformer.wte.weight`, as `save_pretrained` writes it.

The number of heads cannot be read off tensor shapes, so the shape comes from a `config.json` beside
the weights when there is one, else the model (its preset) must already match. A config.json is checked
against the tensors' shapes in the weights' headers (no tensor data is read) before any model is
built, so a config.json that asks for 10,000 layers of a 12-layer file is one line at once, not a
model built in memory and then refused.

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
import os
from pathlib import Path

import torch

from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model import hub
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
INDEX_NAME = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"
BIN_INDEX_NAME = "pytorch_model.bin.index.json"
WEIGHT_NAMES = (WEIGHTS_NAME, INDEX_NAME, BIN_NAME, BIN_INDEX_NAME)  # a folder's weights, in the order looked for
CONFIG_NAME = "config.json"
GPT2_EOT_ID = GPT2_VOCAB_SIZE - 1  # <|endoftext|>, GPT-2's only special token
WHAT_LOADS = ("a Hugging Face folder (config.json with model.safetensors, a sharded model.safetensors.index.json "
              "or pytorch_model.bin), one of those files, or a hub name such as openai-community/gpt2")


# --- where the weights are ----------------------------------------------------------------------


def local_path(path: str | Path) -> Path:
    """`path` itself, or for a hub name its folder in the Hugging Face cache (downloaded when missing)."""
    if hub.is_hub_name(str(path)):
        return hub.resolve(str(path), usable=lambda folder: (folder / CONFIG_NAME).is_file()
                           and _entry_in(folder) is not None)
    return Path(path).expanduser()


def _entry_in(folder: Path) -> Path | None:
    return next((folder / name for name in WEIGHT_NAMES if (folder / name).is_file()), None)


def weights_file(path: str | Path) -> Path:
    """The file that names the weights (model.safetensors, a shard index or pytorch_model.bin): the one
    given, or a folder's; UsageError when there is none."""
    path = local_path(path)
    if not path.exists():
        raise UsageError(f"no GPT-2 weights at {path}: no such file or folder (give a Hugging Face folder, "
                         "its model.safetensors or a hub name)")
    entry = _entry_in(path) if path.is_dir() else path
    if entry is None or not entry.is_file():
        raise UsageError(f"no GPT-2 weights at {path}; give {WHAT_LOADS}")
    return entry


def weight_files(entry: Path) -> list[Path]:
    """The files holding the tensors: `entry` itself, or every shard its index names (all must be there)."""
    if not entry.name.endswith(".index.json"):
        return [entry]
    try:
        shards = sorted(set(json.loads(entry.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise UsageError(f"{entry} is not a shard index (a JSON object whose weight_map names each tensor's "
                         f"file): {type(err).__name__}: {err}") from None
    outside = [s for s in shards if not isinstance(s, str) or Path(s).name != s]
    if outside:
        raise UsageError(f"{entry} names a shard outside its folder: {outside[0]!r}")
    missing = [s for s in shards if not (entry.parent / s).is_file()]
    if missing:
        raise UsageError(f"{entry} names shards that are not in {entry.parent}: {_few(missing)}")
    return [entry.parent / s for s in shards]


def is_hf_weights(path: str | Path) -> bool:
    """Whether `path` names Hugging Face weights: a weights file, or a folder holding one."""
    path = Path(path).expanduser()
    if path.is_dir():
        return _entry_in(path) is not None
    return path.suffix in (".safetensors", ".bin") or path.name.endswith(".index.json")


# --- the shape ----------------------------------------------------------------------------------


def hf_model_config(path: str | Path) -> ModelConfig | None:
    """The shape from a config.json beside the weights, checked against what our GPT computes (see the
    module docstring) and against the tensors' shapes; None when there is no config.json."""
    entry = weights_file(path)
    cfg_path = entry.parent / CONFIG_NAME
    if not cfg_path.is_file():
        return None
    try:
        raw = json.loads(cfg_path.read_text())
        check_implemented(raw, cfg_path)
        cfg = ModelConfig(**{ours: _shape_field(raw, field, default, cfg_path)
                             for field, (ours, default) in SHAPE_FIELDS.items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise UsageError(f"cannot read the GPT-2 shape from {cfg_path}: {type(err).__name__}: {err}") from None
    check_against_weights(cfg, tensor_shapes(weight_files(entry)), cfg_path, entry)
    return cfg


# config.json's shape fields: our name, transformers' default (None: required), and the largest we build.
SHAPE_FIELDS = {"n_layer": ("n_layer", None), "n_head": ("n_head", None), "n_embd": ("n_embd", None),
                "n_positions": ("block_size", 1024), "vocab_size": ("vocab_size", GPT2_VOCAB_SIZE)}
SHAPE_LIMIT = 2**20  # far above any GPT-2 (48 layers, 1600 wide, 1024 positions): a typo, not a model


def _shape_field(raw: dict, field: str, default: int | None, where: Path) -> int:
    """A shape field as a whole number from 1 to SHAPE_LIMIT, or a UsageError naming it (2.5 is no layer
    count, and is not read as 2)."""
    if field not in raw and default is not None:
        return default
    value = raw[field]
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= SHAPE_LIMIT:
        raise UsageError(f"{where}: {field} = {json.dumps(value)} is not a whole number from 1 to {SHAPE_LIMIT:,}")
    return value


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


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape under its Hugging Face name without `transformer.`, read from the files'
    headers: safetensors' header, or a memory-mapped pytorch_model.bin (its data is never read)."""
    shapes = {}
    for file in files:
        shapes.update(_safetensors_shapes(file) if file.suffix == ".safetensors" else _bin_shapes(file))
    return {name.removeprefix("transformer."): shape for name, shape in shapes.items()}


def _safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as err:
        raise LadderError(f"cannot read {file} as safetensors: {err}") from None


def _bin_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    try:
        tensors = _load_bin(file, mmap=True)
    except LadderError:
        tensors = _load_bin(file)  # a file from before torch's zip format cannot be memory-mapped
    return {name: tuple(value.shape) for name, value in tensors.items()}


def check_against_weights(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], cfg_path: Path,
                          weights: Path) -> None:
    """UsageError when config.json's shape is not the tensors' (n_layer, n_embd, vocab_size, n_positions
    as they hold them, then every tensor's shape), before a model of that shape is built."""
    held = _held_fields(shapes)
    absent = [f for f in ("n_layer", "n_embd") if held[f] is None]
    if absent:  # nothing to compare the config with: and a model of its shape is never built from nothing
        tensors = {"n_layer": "no layer tensors (h.0.*)", "n_embd": "no token embedding (wte.weight)"}
        raise UsageError(f"{weights} holds {' and '.join(tensors[f] for f in absent)}: not the weights of the GPT-2 "
                         f"its {CONFIG_NAME} describes")
    said = {"n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size}
    diffs = [f for f, v in held.items() if v is not None and v != said[f]]
    if diffs:
        raise UsageError(f"{cfg_path} does not describe {weights}: it says "
                         f"{', '.join(f'{f} = {said[f]}' for f in diffs)}, but the weights hold "
                         f"{', '.join(f'{f} = {held[f]}' for f in diffs)}")
    expected = expected_shapes(cfg)
    found = {k: v for k, v in shapes.items() if tuple(k.split(".")[-2:]) not in SKIPPED_TAILS and k != "lm_head.weight"}
    problems = [f"{k} has shape {found[k]}, not {v}" for k, v in expected.items() if k in found and found[k] != v]
    problems += [f"missing {_few(sorted(set(expected) - set(found)))}"] if set(expected) - set(found) else []
    problems += [f"unexpected {_few(sorted(set(found) - set(expected)))}"] if set(found) - set(expected) else []
    if problems:
        raise UsageError(f"{weights} does not fit the GPT-2 its {CONFIG_NAME} describes: {'; '.join(problems[:3])}")


def _held_fields(shapes: dict[str, tuple[int, ...]]) -> dict[str, int | None]:
    """The shape fields the tensors themselves hold (None where the tensor that would tell is absent)."""
    wte, wpe = shapes.get("wte.weight"), shapes.get("wpe.weight")
    layers = {int(k.split(".")[1]) for k in shapes if k.startswith("h.") and k.split(".")[1].isdigit()}
    return {"n_layer": max(layers) + 1 if layers else None,
            "n_embd": wte[1] if wte and len(wte) == 2 else None,
            "vocab_size": wte[0] if wte else None,
            "n_positions": wpe[0] if wpe else None}


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Hugging Face GPT-2 file of this shape (Conv1D weights (in, out), no `transformer.`)."""
    c = cfg.n_embd
    shapes = {"wte.weight": (cfg.vocab_size, c), "wpe.weight": (cfg.block_size, c), "ln_f.weight": (c,),
              "ln_f.bias": (c,)}
    block = {"ln_1.weight": (c,), "ln_1.bias": (c,), "attn.c_attn.weight": (c, 3 * c), "attn.c_attn.bias": (3 * c,),
             "attn.c_proj.weight": (c, c), "attn.c_proj.bias": (c,), "ln_2.weight": (c,), "ln_2.bias": (c,),
             "mlp.c_fc.weight": (c, 4 * c), "mlp.c_fc.bias": (4 * c,), "mlp.c_proj.weight": (4 * c, c),
             "mlp.c_proj.bias": (c,)}
    for i in range(cfg.n_layer):
        shapes.update({f"h.{i}.{name}": shape for name, shape in block.items()})
    return shapes


# --- the weights --------------------------------------------------------------------------------


def read_hf_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of the weights under our names (no `transformer.` prefix, Linear layout)."""
    entry = weights_file(path)
    tensors = {}
    for file in weight_files(entry):
        tensors.update(_load_safetensors(file) if file.suffix == ".safetensors" else _load_bin(file))
    state = {}
    for key, value in tensors.items():
        name = key.removeprefix("transformer.")
        if tuple(name.split(".")[-2:]) in SKIPPED_TAILS or name == "lm_head.weight":
            continue
        if name.endswith(CONV1D_SUFFIXES):
            value = value.t()
        state[f"transformer.{name}"] = value
    _check_tied(tensors.get("lm_head.weight"), state.get("transformer.wte.weight"), entry)
    return state


def _load_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise LadderError(f"cannot read {file} as safetensors: {err}") from None


def _load_bin(file: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A pytorch_model.bin's tensors through torch.load(weights_only=True): tensors only, no pickled code."""
    try:
        tensors = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # torch raises many types for foreign or damaged files
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if first.startswith("Weights only load failed"):  # torch's advice to unpickle arbitrary code: not ours
            first = "it holds Python objects besides tensors, which are not loaded"
        raise LadderError(f"cannot read {file} as PyTorch weights: {first[:200]}") from None
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise LadderError(f"{file} does not hold a dictionary of tensors, as pytorch_model.bin does")
    return tensors


def _check_tied(head: torch.Tensor | None, wte: torch.Tensor | None, file: Path) -> None:
    """Our classifier is the embedding: a file with another lm_head would compute other logits."""
    if head is not None and wte is not None and not (head.shape == wte.shape and torch.equal(head, wte)):
        raise UsageError(f"{file}: lm_head.weight differs from transformer.wte.weight (an untied classifier); "
                         "gpt2ladder's GPT-2 ties them")


@torch.no_grad()
def load_hf_gpt2(path: str | Path, model) -> None:
    """Copy the weights of a HF GPT-2 file into `model` (a `GPT`) in place; UsageError on any mismatch."""
    entry = weights_file(path)
    _check_shape(hf_model_config(entry), model.config, entry)
    state = read_hf_state(entry)
    params = dict(model.named_parameters())  # lm_head is tied to wte, so it is listed once
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise UsageError(f"{entry} does not fit this model: missing {_few(missing)}, "
                         f"unexpected {_few(unexpected)}")
    for name, param in params.items():
        _copy_into(param, state[name], name, vocab_size=model.config.vocab_size)
    bad = first_non_finite(model)
    if bad:  # every logit would be NaN: sampling fails, or greedy decoding emits token 0 without a word
        raise LadderError(f"{entry}: tensor {bad} holds NaN or infinite values; these weights are damaged")


def first_non_finite(model) -> str | None:
    """The name of the first parameter holding NaN or inf, or None."""
    return next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)


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

    entry = weights_file(path)
    cfg = hf_model_config(entry)
    if cfg is None:
        raise UsageError(f"no {CONFIG_NAME} beside {entry}: the number of heads cannot be read "
                         "from the tensors; put the model's config.json there")
    model = GPT(cfg)
    load_hf_gpt2(entry, model)
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


# The recipe's model parts that change only where the weights start (`model/recipe.py`): the modules, their names
# and shapes, and the function the trained weights compute stay GPT-2's, so such a model exports as GPT-2.
INIT_ONLY_PARTS = ("zero_init",)


def check_exportable(cfg: ModelConfig) -> None:
    """A UsageError unless the model computes GPT-2's function: GPT-2 itself, or GPT-2 with parts that only set its
    initial weights (INIT_ONLY_PARTS). Hugging Face's GPT-2 computes no other function."""
    changed = [p for p in cfg.parts if p not in INIT_ONLY_PARTS]
    if changed:
        raise UsageError(f"this model is GPT-2 with the recipe parts {', '.join(changed)}, which Hugging Face's "
                         "GPT-2 does not compute: only GPT-2's model exports, a recipe whose parts change only the "
                         "optimizer, the schedule or the initialisation (sample and eval read the run itself)")


def save_hf_gpt2(model, folder: str | Path, dtype: torch.dtype = torch.float32) -> list[Path]:
    """Write config.json, generation_config.json and model.safetensors of `model` into `folder`."""
    from safetensors.torch import save_file

    check_exportable(model.config)

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / CONFIG_NAME, folder / "generation_config.json", folder / WEIGHTS_NAME]
    _write_json(files[0], hf_config(model.config, dtype))
    _write_json(files[1], {"bos_token_id": GPT2_EOT_ID, "eos_token_id": GPT2_EOT_ID})
    save_file(hf_tensors(model, dtype), str(files[2]), metadata={"format": "pt"})  # "pt": transformers checks it
    os.chmod(files[2], 0o666 & ~_umask())  # safetensors creates it 0600; the folder's other files follow the umask
    return files


def _umask() -> int:
    """The process's umask (reading it means setting it: put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
