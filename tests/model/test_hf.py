"""Tests for model/hf.py: loading a Hugging Face-format GPT-2 file written by the test, the config.json values
it refuses, and writing the format (without transformers: tests/commands/test_hugging_face.py loads it there)."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt2ladder import cli
from gpt2ladder.errors import UsageError
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.hf import (
    CONV1D_SUFFIXES,
    hf_model_config,
    hf_tensors,
    load_hf_gpt2,
    load_hf_model,
    save_hf_gpt2,
)
from gpt2ladder.runtime.engine import built_model_config
from gpt2ladder.model.setup import Setup

SHAPE = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)


def write_hf_gpt2(model: GPT, folder, prefix: str = "", config: bool = True, extras: bool = True):
    """Save `model` the way Hugging Face stores GPT-2: Conv1D weights (in, out), no padding, buffers."""
    tensors = {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        key = name.removeprefix("transformer.")
        if key == "wte.weight":
            value = value[: model.config.vocab_size]
        if key.endswith(CONV1D_SUFFIXES):
            value = value.t()
        tensors[prefix + key] = value.contiguous().clone()
    if extras:  # older HF files carry the causal mask buffers and sometimes the tied head
        for i in range(model.config.n_layer):
            tensors[f"{prefix}h.{i}.attn.bias"] = torch.ones(1, 1, 4, 4)
        tensors["lm_head.weight"] = tensors[prefix + "wte.weight"].clone()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    if config:
        c = model.config
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": c.n_layer, "n_head": c.n_head,
                                                        "n_embd": c.n_embd, "n_positions": c.block_size,
                                                        "vocab_size": c.vocab_size}))
    return folder / "model.safetensors"


@pytest.fixture
def source_model():
    return init_weights(GPT(SHAPE), seed=11).eval()


def _logits(model, idx):
    with torch.no_grad():
        return model(idx)[0][..., : model.config.vocab_size]


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_loaded_model_computes_the_same_logits(tmp_path, source_model, prefix):
    path = write_hf_gpt2(source_model, tmp_path / "gpt2", prefix=prefix)
    target = GPT(SHAPE).eval()  # fresh, different (default) weights
    idx = torch.randint(0, SHAPE.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(_logits(target, idx), _logits(source_model, idx))
    load_hf_gpt2(path, target)
    assert torch.equal(_logits(target, idx), _logits(source_model, idx))
    # the transposes really happened: a Linear weight matches the file's Conv1D weight transposed
    assert torch.equal(target.transformer.h[0].attn.c_attn.weight, source_model.transformer.h[0].attn.c_attn.weight)


def test_loads_into_a_padded_vocabulary(tmp_path, source_model):
    path = write_hf_gpt2(source_model, tmp_path / "gpt2", extras=False)
    padded = GPT(built_model_config(SHAPE, Setup(vocab_multiple=128))).eval()
    load_hf_gpt2(tmp_path / "gpt2", padded)  # a folder means its model.safetensors
    assert padded.transformer.wte.weight.shape[0] == 50304
    assert torch.count_nonzero(padded.transformer.wte.weight[SHAPE.vocab_size:]) == 0
    idx = torch.randint(0, SHAPE.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(padded, idx), _logits(source_model, idx), rtol=1e-5, atol=1e-5)
    assert path.is_file()


def test_config_json_gives_the_shape(tmp_path, source_model):
    write_hf_gpt2(source_model, tmp_path / "gpt2")
    assert hf_model_config(tmp_path / "gpt2" / "model.safetensors") == SHAPE
    write_hf_gpt2(source_model, tmp_path / "bare", config=False)
    assert hf_model_config(tmp_path / "bare") is None


def test_missing_file_says_what_loads(tmp_path):
    with pytest.raises(UsageError, match="no GPT-2 weights at .*model.safetensors: no such file or folder "
                                         "\\(give a Hugging Face folder") as err:
        load_hf_gpt2(tmp_path / "model.safetensors", GPT(SHAPE))
    assert "\n" not in str(err.value) and "hub name" in str(err.value)


def test_wrong_shape_without_config_is_a_usage_error(tmp_path, source_model):
    write_hf_gpt2(source_model, tmp_path / "gpt2", config=False)
    wider = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64))
    with pytest.raises(UsageError, match="has shape") as err:
        load_hf_gpt2(tmp_path / "gpt2", wider)
    assert "\n" not in str(err.value)
    deeper = GPT(ModelConfig(n_layer=3, n_head=2, n_embd=32, block_size=64))
    with pytest.raises(UsageError, match="missing transformer.h.2"):
        load_hf_gpt2(tmp_path / "gpt2", deeper)


def test_train_init_from_starts_from_the_file(tmp_path, source_model):
    from gpt2ladder.commands.train import config_from_args
    from gpt2ladder.training.config import TrainConfig
    from gpt2ladder.training.trainer import build_engine

    path = write_hf_gpt2(source_model, tmp_path / "gpt2")
    args = SimpleNamespace(preset=None, steps=3, batch_size=2, seq_len=None, init_from=str(path), rungs="baseline",
                           tokens_per_step=None, lr=6e-4, min_lr=None, warmup_steps=None, weight_decay=0.1,
                           grad_clip=1.0, eval_every=None, eval_batches=2, ckpt_every=None, seed=0, data=None,
                           strategy="auto")
    from gpt2ladder.runtime.hardware import detect

    cfg, _ = config_from_args(args, torch.device("cpu"), detect(torch.device("cpu")), notify=lambda msg: None)
    assert isinstance(cfg, TrainConfig) and cfg.model == SHAPE
    assert cfg.seq_len == 64  # the CPU default of 128 is cut to the file's 64 positions
    engine = build_engine(cfg, Setup(), torch.device("cpu"))
    for name, value in source_model.state_dict().items():
        assert torch.equal(engine.raw_model.state_dict()[name], value), name


# --- which config.json values load ------------------------------------------------------------------

# (field, a value gpt2ladder's GPT does not compute): each must be refused in one line naming the field
REFUSED = [
    ("tie_word_embeddings", False), ("activation_function", "gelu"), ("activation_function", "relu"),
    ("layer_norm_epsilon", 1e-6), ("scale_attn_weights", False), ("scale_attn_by_inverse_layer_idx", True),
    ("reorder_and_upcast_attn", True), ("n_inner", 100), ("add_cross_attention", True), ("vocab_size", 50304),
    ("model_type", "gpt_neo"), ("is_encoder_decoder", True), ("pruned_heads", {"0": [1]}),
    ("quantization_config", {"quant_method": "bitsandbytes"}),
]
# values transformers computes the same function for: the tanh GELU's other names, fields that only
# matter for training, generation or storage
ACCEPTED = [
    ("activation_function", "gelu_new"), ("activation_function", "gelu_pytorch_tanh"),
    ("activation_function", "gelu_fast"), ("n_inner", None), ("n_inner", 4 * SHAPE.n_embd),
    ("resid_pdrop", 0.1), ("initializer_range", 0.5), ("use_cache", False), ("dtype", "bfloat16"),
    ("summary_type", "mean"), ("pad_token_id", 0), ("layer_norm_epsilon", 1e-05),
]


def _with_config(folder, **fields):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize("field, value", REFUSED, ids=lambda v: str(v))
def test_config_values_not_implemented_are_refused(tmp_path, source_model, field, value, capsys):
    write_hf_gpt2(source_model, tmp_path / "gpt2")
    _with_config(tmp_path / "gpt2", **{field: value})
    with pytest.raises(UsageError, match=rf"{field} = .* is not implemented") as err:
        hf_model_config(tmp_path / "gpt2")
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match=field):  # loading into a model checks the same file
        load_hf_gpt2(tmp_path / "gpt2", GPT(SHAPE))
    for argv in (["sample", tmp_path / "gpt2", "--device", "cpu"],
                 ["train", "--device", "cpu", "--init-from", tmp_path / "gpt2" / "model.safetensors",
                  "--out", tmp_path / "run", "--no-progress"]):
        code = cli.main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("gpt2ladder: error: ") and err.count("\n") == 1, err
        assert f"{field} = " in err and "not implemented" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field, value", ACCEPTED, ids=lambda v: str(v))
def test_config_values_that_compute_the_same_function_load(tmp_path, source_model, field, value):
    write_hf_gpt2(source_model, tmp_path / "gpt2")
    _with_config(tmp_path / "gpt2", **{field: value})
    assert hf_model_config(tmp_path / "gpt2") == SHAPE


def test_an_untied_classifier_is_refused(tmp_path, source_model):
    path = write_hf_gpt2(source_model, tmp_path / "gpt2")
    tensors = load_file(str(path))
    tensors["lm_head.weight"] = tensors["wte.weight"] + 1e-3
    save_file(tensors, str(path))
    with pytest.raises(UsageError, match="lm_head.weight differs from transformer.wte.weight") as err:
        load_hf_gpt2(path, GPT(SHAPE))
    assert "\n" not in str(err.value)


def test_head_count_comes_from_config_json(tmp_path, source_model):
    """The tensors of 2 and 4 heads have the same shapes: only config.json tells them apart."""
    write_hf_gpt2(source_model, tmp_path / "gpt2")
    four_heads = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=32, block_size=64))
    with pytest.raises(UsageError, match="n_head 2 there, 4 here"):
        load_hf_gpt2(tmp_path / "gpt2", four_heads)
    assert load_hf_model(tmp_path / "gpt2").config == SHAPE
    write_hf_gpt2(source_model, tmp_path / "bare", config=False)
    with pytest.raises(UsageError, match="no config.json beside"):
        load_hf_model(tmp_path / "bare")


# --- writing --------------------------------------------------------------------------------------


def test_written_tensors_have_the_hugging_face_layout(source_model):
    tensors = hf_tensors(source_model)
    assert "lm_head.weight" not in tensors and all(k.startswith("transformer.") for k in tensors)
    assert tensors["transformer.wte.weight"].shape == (50257, SHAPE.n_embd)
    fc = source_model.transformer.h[1].mlp.c_fc.weight  # (out, in) = (128, 32) here
    assert tensors["transformer.h.1.mlp.c_fc.weight"].shape == (32, 128)
    assert torch.equal(tensors["transformer.h.1.mlp.c_fc.weight"], fc.t())
    assert tensors["transformer.h.0.attn.c_proj.weight"].is_contiguous()
    assert hf_tensors(source_model, torch.bfloat16)["transformer.ln_f.weight"].dtype == torch.bfloat16


def test_written_folder_loads_back_into_a_padded_model(tmp_path, source_model):
    padded = GPT(built_model_config(SHAPE, Setup(vocab_multiple=128))).eval()
    load_hf_gpt2(write_hf_gpt2(source_model, tmp_path / "src"), padded)  # the same weights, padded
    files = save_hf_gpt2(padded, tmp_path / "out")
    assert sorted(p.name for p in files) == ["config.json", "generation_config.json", "model.safetensors"]
    assert load_file(str(tmp_path / "out" / "model.safetensors"))["transformer.wte.weight"].shape[0] == 50257
    back = load_hf_model(tmp_path / "out")
    idx = torch.randint(0, SHAPE.vocab_size, (2, 20), generator=torch.Generator().manual_seed(2))
    assert torch.equal(_logits(back, idx), _logits(padded, idx))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["n_head"] == 2 and config["n_positions"] == 64 and config["tie_word_embeddings"] is True


def test_train_init_from_a_folder_names_the_shape_it_read(tmp_path, source_model, capsys, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))  # the test text's tokens stay private
    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question.\n" * 200)
    write_hf_gpt2(source_model, tmp_path / "gpt2")
    code = cli.main(["train", "--device", "cpu", "--init-from", str(tmp_path / "gpt2"),
                     "--data", str(tmp_path / "text.txt"),
                     "--steps", "1", "--batch-size", "1", "--seq-len", "16", "--rungs", "baseline", "--eval-every", "0",
                     "--out", str(tmp_path / "run"), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"model: 2 layers, 2 heads, 32 wide, 1.6M parameters from {tmp_path / 'gpt2'} on cpu" in out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["block_size"] == 64
