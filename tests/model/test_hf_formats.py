"""The Hugging Face weight formats besides one model.safetensors: a sharded model.safetensors.index.json
and pytorch_model.bin (read with torch.load(weights_only=True)); and config.json checked against the
tensors' shapes from the headers alone, before any model is built."""

import json

import pytest
import torch
from safetensors.torch import save_file

from gpt2ladder import cli
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model import gpt as gpt_module
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.hf import hf_model_config, hf_tensors, load_hf_model, save_hf_gpt2

SHAPE = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)
IDX = torch.randint(0, SHAPE.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def model():
    return init_weights(GPT(SHAPE), seed=7).eval()


def _logits(m):
    with torch.no_grad():
        return m(IDX)[0][..., : m.config.vocab_size]


def _config_only(model, folder):
    save_hf_gpt2(model, folder)
    (folder / "model.safetensors").unlink()
    return folder


def write_shards(model, folder, n=3):
    """The tensors split over n safetensors files and the index naming each tensor's file, as
    transformers' save_pretrained(max_shard_size=...) writes them."""
    tensors = hf_tensors(model)
    names = sorted(tensors)
    weight_map = {}
    for i in range(n):
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::n]}
        save_file(part, str(folder / shard), metadata={"format": "pt"})
        weight_map |= {k: shard for k in part}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                      "weight_map": weight_map}))
    return folder


def test_a_sharded_folder_loads_the_same_model(model, tmp_path):
    folder = write_shards(model, _config_only(model, tmp_path / "hf"))
    loaded = load_hf_model(folder)
    assert loaded.config == SHAPE
    assert torch.equal(_logits(loaded), _logits(model))
    assert torch.equal(_logits(load_hf_model(folder / "model.safetensors.index.json")), _logits(model))


def test_a_missing_shard_is_one_line_naming_it(model, tmp_path):
    folder = write_shards(model, _config_only(model, tmp_path / "hf"))
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(UsageError, match="names shards that are not in .*: model-00002-of-00003.safetensors") as err:
        load_hf_model(folder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_a_pytorch_model_bin_folder_loads_the_same_model(model, tmp_path, prefix):
    """OpenAI's own GPT-2 .bin files have no `transformer.` prefix; transformers' older ones do."""
    folder = _config_only(model, tmp_path / "hf")
    torch.save({prefix + k.removeprefix("transformer."): v for k, v in hf_tensors(model).items()},
               folder / "pytorch_model.bin")
    loaded = load_hf_model(folder)
    assert torch.equal(_logits(loaded), _logits(model))


class Payload:
    """A pickled object torch.load(weights_only=True) must not build."""


def test_a_pytorch_model_bin_with_python_objects_is_refused_in_one_line(model, tmp_path):
    folder = _config_only(model, tmp_path / "hf")
    torch.save({"wte.weight": torch.zeros(2, 2), "extra": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(LadderError, match="Python objects besides tensors") as err:
        load_hf_model(folder)
    assert "\n" not in str(err.value) and "model.safetensors" not in str(err.value)


def test_a_folder_without_weights_names_what_it_looks_for(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    code = cli.main(["sample", str(tmp_path / "hf"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "nor Hugging Face weights in" in err
    assert "pytorch_model.bin" in err and "model.safetensors.index.json" in err


# --- config.json against the tensors ---------------------------------------------------------------


def _with_config(folder, **fields):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return folder


@pytest.fixture
def no_model_built(monkeypatch):
    """Building a GPT fails the test: the check must come first."""
    def refuse(self, cfg):
        raise AssertionError(f"a GPT of {cfg} was built")

    monkeypatch.setattr(gpt_module.GPT, "__init__", refuse)


@pytest.mark.parametrize("fmt", ["safetensors", "sharded", "bin"])
def test_ten_thousand_layers_are_refused_before_a_model_is_built(model, tmp_path, no_model_built, fmt):
    folder = tmp_path / "hf"
    save_hf_gpt2(model, folder)
    if fmt != "safetensors":
        (folder / "model.safetensors").unlink()
        write_shards(model, folder) if fmt == "sharded" else torch.save(hf_tensors(model), folder / "pytorch_model.bin")
    _with_config(folder, n_layer=10_000)
    with pytest.raises(UsageError, match="it says n_layer = 10000, but the weights hold n_layer = 2") as err:
        load_hf_model(folder)
    assert "\n" not in str(err.value)


def test_the_check_reads_only_the_header(model, tmp_path, monkeypatch):
    """hf_model_config never loads tensor data: safetensors' loader is not called."""
    import safetensors.torch

    folder = save_hf_gpt2(model, tmp_path / "hf")[0].parent
    monkeypatch.setattr(safetensors.torch, "load_file", lambda *a, **k: pytest.fail("tensor data was read"))
    assert hf_model_config(folder) == SHAPE


@pytest.mark.parametrize("fields, words", [
    ({"n_embd": 64, "n_head": 2}, "it says n_embd = 64, but the weights hold n_embd = 32"),
    ({"n_positions": 1024}, "it says n_positions = 1024, but the weights hold n_positions = 64"),
])
def test_a_config_that_describes_other_weights_is_one_line(model, tmp_path, no_model_built, fields, words, capsys):
    folder = _with_config(save_hf_gpt2(model, tmp_path / "hf")[0].parent, **fields)
    for argv in (["sample", str(folder), "--device", "cpu"],
                 ["train", "--device", "cpu", "--init-from", str(folder), "--out", str(tmp_path / "run"),
                  "--no-progress"]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "run").exists()


def test_a_tensor_of_another_shape_is_named(model, tmp_path, no_model_built):
    folder = save_hf_gpt2(model, tmp_path / "hf")[0].parent
    tensors = hf_tensors(model)
    tensors["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(32, 100)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"h.1.mlp.c_fc.weight has shape \(32, 100\), not \(32, 128\)"):
        hf_model_config(folder)


def test_a_folder_transformers_sharded_loads_the_same(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)  # transformers draws its random weights from the global generator
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64)).eval()
    hf.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) > 1
    with torch.no_grad():
        torch.testing.assert_close(_logits(load_hf_model(tmp_path / "hf")), hf(IDX).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fields, words", [
    ({"n_head": 0}, "n_head = 0 is not a whole number from 1 to"),
    ({"n_layer": 2.5}, "n_layer = 2.5 is not a whole number"),  # never read as 2
    ({"n_embd": "32"}, 'n_embd = "32" is not a whole number'),
    ({"n_layer": 10**8}, "n_layer = 100000000 is not a whole number"),
])
def test_a_config_json_shape_field_that_is_no_count_is_one_line(model, tmp_path, no_model_built, fields, words):
    folder = _with_config(save_hf_gpt2(model, tmp_path / "hf")[0].parent, **fields)
    with pytest.raises(UsageError, match=words) as err:
        load_hf_model(folder)
    assert "\n" not in str(err.value)


def test_weights_without_the_layer_tensors_are_refused_before_a_model_is_built(model, tmp_path, no_model_built):
    folder = _with_config(save_hf_gpt2(model, tmp_path / "hf")[0].parent, n_layer=2**20)
    tensors = {k: v for k, v in hf_tensors(model).items() if ".h." not in k}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"holds no layer tensors \(h.0.\*\)"):
        hf_model_config(folder)


def test_weights_holding_nan_are_refused_naming_the_tensor(model, tmp_path, capsys):
    folder = save_hf_gpt2(model, tmp_path / "hf")[0].parent
    tensors = hf_tensors(model)
    tensors["transformer.h.1.attn.c_proj.bias"][3] = float("nan")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for temperature in ("0.8", "0"):  # greedy decoding would emit token 0 without a word
        code = cli.main(["sample", str(folder), "--device", "cpu", "--num-tokens", "2", "--temperature", temperature])
        captured = capsys.readouterr()
        assert code == 1 and captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert "tensor transformer.h.1.attn.c_proj.bias holds NaN" in captured.err
