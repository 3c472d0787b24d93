"""Tests for gpt2ladder.hf: loading a Hugging Face-format GPT-2 safetensors file written by the test."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from gpt2ladder.errors import UsageError
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.hf import CONV1D_SUFFIXES, hf_model_config, load_hf_gpt2
from gpt2ladder.runtime.engine import model_config_for
from gpt2ladder.runtime.setup import Setup

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
    padded = GPT(model_config_for(SHAPE, Setup(vocab_multiple=128))).eval()
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


def test_missing_file_says_no_download(tmp_path):
    with pytest.raises(UsageError, match="no download is attempted") as err:
        load_hf_gpt2(tmp_path / "model.safetensors", GPT(SHAPE))
    assert "\n" not in str(err.value)


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
                           grad_clip=1.0, eval_every=None, eval_batches=2, ckpt_every=None, seed=0, data=None)
    from gpt2ladder.runtime.hardware import detect

    cfg = config_from_args(args, torch.device("cpu"), detect(torch.device("cpu")), notify=lambda msg: None)
    assert isinstance(cfg, TrainConfig) and cfg.model_config() == SHAPE
    assert cfg.seq_len == 64  # the CPU default of 128 is cut to the file's 64 positions
    engine = build_engine(cfg, Setup(), torch.device("cpu"))
    for name, value in source_model.state_dict().items():
        assert torch.equal(engine.raw_model.state_dict()[name], value), name
