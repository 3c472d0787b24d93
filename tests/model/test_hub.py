"""Hub names (`gpt2`, `openai-community/gpt2`, ...) through huggingface_hub, never reaching the network:
each test fills a private HF_HOME with a cache laid out as huggingface_hub lays it out
(models--ORG--NAME/blobs, snapshots/<commit>/<file> linking to a blob, refs/main naming the commit), or
replaces the download function with a stand-in."""

import hashlib
import os

import pytest
import torch

from gpt2ladder import cli
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model import hub
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.hf import hf_tensors, save_hf_gpt2
from gpt2ladder.training.loading import load_model

huggingface_hub = pytest.importorskip("huggingface_hub")

SHAPE = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
IDX = torch.randint(0, SHAPE.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model():
    return init_weights(GPT(SHAPE), seed=4).eval()


@pytest.fixture
def weights(model, tmp_path):
    """A Hugging Face folder of `model`, as the hub would serve it."""
    save_hf_gpt2(model, tmp_path / "served")
    return tmp_path / "served"


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """A private, empty Hugging Face cache, offline; returns its hub folder."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf-home" / "hub"


def fill_cache(cache, repo: str, folder, files=None):
    """Put `folder`'s files into the cache as snapshot `COMMIT` of `repo`, the way huggingface_hub does."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    for file in sorted(folder.iterdir()):
        if (files is not None and file.name not in files) or (snapshot / file.name).exists():
            continue
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


def _logits(m):
    with torch.no_grad():
        return m(IDX)[0][..., : m.config.vocab_size]


def _one_line(capsys, argv, code):
    got = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert got == code and err.startswith("gpt2ladder: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("name", ["gpt2", "openai-community/gpt2"])
def test_a_hub_name_loads_from_the_cache_offline(model, weights, hf_home, name):
    snapshot = fill_cache(hf_home, "openai-community/gpt2", weights)
    loaded = load_model(name, CPU)
    assert loaded.kind == "hub" and loaded.path == snapshot / "model.safetensors"
    assert loaded.description == f"openai-community/gpt2 ({snapshot / 'model.safetensors'})"
    assert torch.equal(_logits(loaded.model), _logits(model))


def test_a_short_name_is_also_found_under_its_own_id(model, weights, hf_home):
    """transformers' from_pretrained("gpt2") caches under models--gpt2."""
    fill_cache(hf_home, "gpt2", weights)
    assert torch.equal(_logits(load_model("gpt2", CPU).model), _logits(model))


def test_hf_hub_cache_is_honoured(model, weights, tmp_path, hf_home, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    fill_cache(tmp_path / "elsewhere", "someone/tiny-gpt2", weights)
    assert torch.equal(_logits(load_model("someone/tiny-gpt2", CPU).model), _logits(model))


def test_sample_a_hub_name_gives_the_folders_text(weights, hf_home, capsys):
    fill_cache(hf_home, "openai-community/gpt2", weights)
    argv = ["--device", "cpu", "--temperature", "0", "--num-tokens", "4", "--prompt", "ROMEO:"]
    assert cli.main(["sample", "gpt2", *argv]) == 0
    from_hub, banner = capsys.readouterr()
    assert "from openai-community/gpt2 (" in banner
    assert cli.main(["sample", str(weights), *argv]) == 0
    assert capsys.readouterr().out == from_hub


@pytest.mark.parametrize("cached", [None, ["config.json"]], ids=["empty", "config only"])
def test_offline_with_nothing_usable_cached_names_the_fetch_command(weights, hf_home, capsys, cached):
    if cached:
        fill_cache(hf_home, "openai-community/gpt2", weights, files=cached)
    err = _one_line(capsys, ["sample", "gpt2", "--device", "cpu"], 2)
    assert 'hf download openai-community/gpt2 --include "*.json" --include "*.safetensors"' in err
    assert "HF_HUB_OFFLINE" in err and str(hf_home) in err


def test_a_path_that_exists_is_never_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_name("gpt2") and hub.is_hub_name("openai-community/gpt2")
    (tmp_path / "gpt2").mkdir()
    assert not hub.is_hub_name("gpt2")
    for path in ("runs/x/ckpt.pt", "/abs/olute", "./rel/ative", "my-folder", "a/b/c", "hf/model.safetensors"):
        assert not hub.is_hub_name(path), path
    (tmp_path / "runs" / "ref100").mkdir(parents=True)
    assert not hub.is_hub_name("runs/ref10")  # a mistyped run: its first folder exists
    assert hub.is_hub_name("someone/ref10")


@pytest.mark.parametrize("argv", [["sample", "runs/ref10"], ["eval", "runs/ref10"], ["export", "runs/ref10", "hf"],
                                  ["train", "--init-from", "runs/ref10", "--steps", "1", "--device", "cpu"]])
def test_a_mistyped_local_path_is_said_missing_not_looked_up_on_the_hub(tmp_path, monkeypatch, capsys, argv):
    from gpt2ladder.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "ref100").mkdir(parents=True)
    monkeypatch.setattr(hub, "resolve", lambda *a, **k: pytest.fail("looked runs/ref10 up on the hub"))
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and len(err) < 200
    assert "at runs/ref10: no such file or folder" in err and "HellaSwag" not in err


def test_train_init_from_a_hub_name_reads_its_shape_and_weights(model, weights, hf_home):
    from gpt2ladder.commands.train import model_shape
    from gpt2ladder.model.setup import Setup
    from gpt2ladder.training.config import TrainConfig
    from gpt2ladder.training.trainer import build_engine

    fill_cache(hf_home, "openai-community/gpt2", weights)
    shape = model_shape("tiny", "gpt2")  # what `train --init-from gpt2` reads, once, where the command starts
    cfg = TrainConfig(init_from="gpt2", seq_len=16, batch_size=1, tokens_per_step=16, steps=1, model=shape)
    assert cfg.model == SHAPE
    engine = build_engine(cfg, Setup(vocab_multiple=128), CPU)
    loaded, served = engine.raw_model.state_dict(), model.state_dict()
    for name, weight in served.items():  # the hub's weights, bit for bit; the padded rows beyond them zero
        rows = weight.shape[0]
        assert torch.equal(loaded[name][:rows], weight), name
        assert not loaded[name][rows:].any(), name
    # The padded classifier is a wider matmul, which a CPU's BLAS may block differently: the same logits to
    # float32 rounding, not bit for bit.
    torch.testing.assert_close(_logits(engine.raw_model.eval()), _logits(model), rtol=1e-5, atol=1e-6)


# --- online, with the download replaced ------------------------------------------------------------


@pytest.fixture
def online(hf_home, monkeypatch):
    """Downloads allowed, and huggingface_hub's snapshot_download replaced by `serve` (never the network)."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls = []

    def install(serve):
        def fake(repo_id, allow_patterns=None, cache_dir=None, **kwargs):
            calls.append({"repo_id": repo_id, "allow_patterns": allow_patterns, "cache_dir": cache_dir})
            return str(serve(repo_id, allow_patterns, cache_dir))
        monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
        return calls

    return install


def test_online_a_missing_model_is_downloaded_once(model, weights, hf_home, online):
    calls = online(lambda repo, patterns, cache: fill_cache(hf_home, repo, weights, files=["config.json",
                                                                                           "model.safetensors"]))
    loaded = load_model("gpt2", CPU)
    assert torch.equal(_logits(loaded.model), _logits(model))
    assert [c["repo_id"] for c in calls] == ["openai-community/gpt2"] and calls[0]["cache_dir"] == str(hf_home)
    assert "*.safetensors" in calls[0]["allow_patterns"] and not any("bin" in p for p in calls[0]["allow_patterns"])
    load_model("gpt2", CPU)  # now cached: no second download
    assert len(calls) == 1


def test_online_a_repository_with_only_pytorch_model_bin(model, weights, hf_home, online, tmp_path):
    torch.save(hf_tensors(model), weights / "pytorch_model.bin")

    def serve(repo, patterns, cache):
        wanted = ["config.json"] + (["pytorch_model.bin"] if "pytorch_model*.bin" in patterns else [])
        return fill_cache(hf_home, repo, weights, files=wanted)

    calls = online(serve)
    loaded = load_model("someone/old-gpt2", CPU)
    assert loaded.path.name == "pytorch_model.bin" and len(calls) == 2
    assert torch.equal(_logits(loaded.model), _logits(model))


def _raise(err):
    def serve(*args):
        raise err
    return serve


def _hub_error(cls, message):
    """An instance of one of huggingface_hub's HTTP errors without an HTTP response to build it from."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


def test_online_a_name_the_hub_does_not_know_is_one_line(hf_home, online, capsys):
    online(_raise(_hub_error(huggingface_hub.errors.RepositoryNotFoundError, "404 Repository Not Found")))
    err = _one_line(capsys, ["sample", "someone/no-such-model", "--device", "cpu"], 2)
    assert "no model someone/no-such-model on the Hugging Face hub" in err


def test_online_an_unreachable_hub_is_one_line(hf_home, online):
    online(_raise(huggingface_hub.errors.LocalEntryNotFoundError("Got: ConnectError: no route to host")))
    with pytest.raises(LadderError, match="cannot reach the Hugging Face hub") as err:
        load_model("gpt2", CPU)
    assert not isinstance(err.value, UsageError) and "\n" not in str(err.value)
    assert 'hf download openai-community/gpt2' in str(err.value)
