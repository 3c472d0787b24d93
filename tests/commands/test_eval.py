"""`gpt2ladder eval` end to end on CPU: a run directory, a Hugging Face folder and a hub name, on a small
HellaSwag file the test writes; eval.json's fields; and the bad inputs, each one line."""

import json
import shutil
import zipfile

import pytest
import torch

from gpt2ladder import cli
from gpt2ladder.evals import runner
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.hf import save_hf_gpt2
from gpt2ladder.training.checkpoint import load_checkpoint, save_checkpoint, state_digest

SMALL = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_multiple=128)
EXAMPLES = [("A man is sitting on a roof. he", ["is using wrap.", "is ripping tiles off.", "holds a cube.",
                                                "starts pulling up roofing."], 3),
            ("A dog runs in a park. It", ["sleeps.", "chases a ball across the grass.", "sings.", "reads."], 1),
            ("The chef cuts onions. She", ["cries.", "flies away.", "puts them in a pan with oil.", "swims."], 2)]


@pytest.fixture(scope="module")
def setup(module_tmp):
    """A run directory (a checkpoint of a random small model), the same weights as a Hugging Face folder,
    and a HellaSwag file."""
    root = module_tmp("eval")
    model = init_weights(GPT(SMALL), seed=1).eval()
    (root / "run").mkdir()
    save_checkpoint(root / "run" / "ckpt.pt", {"model": model.state_dict(), "model_config": SMALL.to_dict(),
                                                "setup": {"autocast": "bfloat16"}, "step": 7})
    save_hf_gpt2(model, root / "hf")
    with open(root / "hellaswag.jsonl", "w") as f:
        for i, (ctx, endings, label) in enumerate(EXAMPLES):
            f.write(json.dumps({"ind": i, "ctx": ctx, "endings": endings, "label": label, "split": "val"}) + "\n")
    return model, root


@pytest.fixture
def run_dir(setup, tmp_path):
    return shutil.copytree(setup[1] / "run", tmp_path / "run")


def _eval(capsys, *argv):
    code = cli.main(["eval", *map(str, argv), "--device", "cpu", "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def _expected(model, data):
    prepared = runner.prepare("hellaswag", data)
    return runner.evaluate(prepared, model, device=torch.device("cpu"), block_size=64, vocab_size=50257,
                           batch_size=1, progress=False)


def test_eval_of_a_hugging_face_folder_writes_eval_json(setup, tmp_path, capsys):
    model, root = setup
    code, out, err = _eval(capsys, root / "hf", "--task-data", root / "hellaswag.jsonl", "--out", tmp_path / "o")
    assert code == 0 and err == "" and out.count("\n") == 1
    record = json.loads((tmp_path / "o" / "eval.json").read_text())
    expected = _expected(model, root / "hellaswag.jsonl")
    assert (record["task"], record["n"]) == ("hellaswag", 3)
    assert record["acc"] == expected.acc and record["acc_norm"] == expected.acc_norm
    assert out.startswith(f"gpt2ladder eval: hellaswag acc {expected.acc:.4f}, acc_norm {expected.acc_norm:.4f} "
                          "over 3 examples;")
    assert record["model"]["kind"] == "hf" and record["model"]["path"] == str(root / "hf" / "model.safetensors")
    assert record["data"]["path"] == str(root / "hellaswag.jsonl") and record["data"]["official"] is False
    assert record["settings"] == {"batch_size": 4, "autocast": None, "matmul_precision": "highest", "compiled": False}
    for key in ("gpt2ladder", "date", "git_sha", "device", "versions", "host"):  # the header every record has
        assert key in record
    assert record["command"] == "eval"


def test_eval_of_a_run_goes_into_the_run_directory(setup, run_dir, capsys):
    model, root = setup
    code, out, _ = _eval(capsys, run_dir, "--task-data", root / "hellaswag.jsonl")
    assert code == 0 and f"{run_dir / 'ckpt.pt'} (step 7)" in out and out.endswith(f"wrote {run_dir / 'eval.json'}\n")
    record = json.loads((run_dir / "eval.json").read_text())
    state = load_checkpoint(run_dir)
    assert record["model"]["step"] == 7 and record["model"]["weights_sha256"] == state_digest(state["model"])
    assert record["n"] == 3 and record["data"]["limit"] is None
    assert record["settings"]["autocast"] is None  # the run's bf16 autocast applies on a GPU only


def test_a_partial_eval_never_replaces_the_full_one(setup, run_dir, capsys):
    """--limit N writes eval-limit-N.json: the full eval.json, which export puts on the model card, stays as it was
    (and one quick look does not replace another of a different N)."""
    _, root = setup
    assert _eval(capsys, run_dir, "--task-data", root / "hellaswag.jsonl")[0] == 0
    full = (run_dir / "eval.json").read_bytes()
    for limit in (2, 1):
        code, out, err = _eval(capsys, run_dir, "--task-data", root / "hellaswag.jsonl", "--limit", limit)
        assert code == 0 and err == "" and f"(the first {limit} of 3)" in out, err
        assert out.endswith(f"wrote {run_dir / f'eval-limit-{limit}.json'}\n")
        record = json.loads((run_dir / f"eval-limit-{limit}.json").read_text())
        assert record["n"] == limit and record["data"]["limit"] == limit
    assert (run_dir / "eval.json").read_bytes() == full
    assert json.loads((run_dir / "eval-limit-2.json").read_text())["n"] == 2


def test_eval_of_a_hub_name_from_the_cache(setup, tmp_path, capsys, monkeypatch):
    model, root = setup
    snapshot = tmp_path / "hf-home" / "hub" / "models--someone--tiny" / "snapshots" / ("a" * 40)
    shutil.copytree(root / "hf", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    code, out, _ = _eval(capsys, "someone/tiny", "--task-data", root / "hellaswag.jsonl", "--out", tmp_path / "o")
    assert code == 0 and "someone/tiny (" in out
    record = json.loads((tmp_path / "o" / "eval.json").read_text())
    assert (record["model"]["repo_id"] == "someone/tiny"
            and record["acc"] == _expected(model, root / "hellaswag.jsonl").acc)


def _one_line(code, err, expected_code, *words):
    assert code == expected_code, err
    assert err.startswith("gpt2ladder: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_bad_inputs_are_one_line_and_leave_no_output(setup, tmp_path, capsys, monkeypatch):
    _, root = setup
    data = ["--task-data", root / "hellaswag.jsonl", "--out", tmp_path / "o"]
    (tmp_path / "other.jsonl").write_text('{"text": "a line of another data set"}\n')
    (tmp_path / "cut.jsonl").write_text((root / "hellaswag.jsonl").read_text()[:-30])
    (tmp_path / "empty-dir").mkdir()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cases = [
        ([root / "hf", "--task", "mmlu", *data], 2, ["unknown task 'mmlu'; choose one of: hellaswag"]),
        ([root / "hf", "--task-data", tmp_path / "other.jsonl"], 2, ["line 1 of", 'no "ctx" text']),
        ([root / "hf", "--task-data", tmp_path / "cut.jsonl"], 2, ["line 3 of", "not JSON"]),
        ([tmp_path / "empty-dir", *data], 2, ["no checkpoint at", "nor Hugging Face weights"]),
        ([tmp_path / "missing.pt", *data], 2, ["no checkpoint at", "missing.pt"]),
        (["gpt2", *data], 2, ['hf download openai-community/gpt2', "HF_HUB_OFFLINE"]),
        ([root / "hf", *data, "--limit", 0], 2, ["--limit"]),
    ]
    for argv, code, words in cases:
        got, _, err = _eval(capsys, *argv)
        _one_line(got, err, code, *words)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("what, words", [
    ("a text file", "is not a PyTorch file, so no gpt2ladder checkpoint"),
    ("an empty folder", "nor Hugging Face weights in"),
    ("a missing file", "no such file or folder"),
    ("a zip of other files", "is a zip archive that torch.save did not write"),
])
def test_a_model_that_is_none_is_refused_before_the_task_data_is_downloaded(tmp_path, capsys, monkeypatch, what,
                                                                              words):
    """MODEL is the argument typed: a path that names no model is one line, exit 2, before the official set (not in
    the cache) is fetched, or even tried."""
    from gpt2ladder.evals import hellaswag

    def no_download(url, timeout):
        raise AssertionError(f"eval fetched {url} before it checked MODEL")

    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", no_download)
    model = {"a text file": tmp_path / "notes.txt", "an empty folder": tmp_path / "empty",
             "a missing file": tmp_path / "missing.txt", "a zip of other files": tmp_path / "notes.zip"}[what]
    if what == "a text file":
        model.write_text("not a model\n")
    elif what == "an empty folder":
        model.mkdir()
    elif what == "a zip of other files":
        with zipfile.ZipFile(model, "w") as archive:
            archive.writestr("notes.txt", "not a model")
    code, out, err = _eval(capsys, model, "--out", tmp_path / "o")
    _one_line(code, err, 2, words, str(model))
    assert out == "" and not (tmp_path / "o").exists() and not (tmp_path / "cache").exists()


def test_offline_without_the_official_set_says_where_to_put_it(setup, tmp_path, capsys, monkeypatch):
    import urllib.error

    from gpt2ladder.evals import hellaswag

    def unreachable(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", unreachable)
    code, _, err = _eval(capsys, setup[1] / "hf", "--out", tmp_path / "o")
    _one_line(code, err, 1, f"put hellaswag_val.jsonl from {hellaswag.URL} at "
              f"{tmp_path / 'cache' / 'hellaswag' / 'hellaswag_val.jsonl'}", "or pass --task-data FILE")


def test_eval_help_states_every_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--task", "--task-data", "--limit", "--batch-size", "--device", "--out", "--no-compile",
                   "--no-progress"):
        start = text.index(option + " ", text.index("options:"))
        assert "(default:" in text[start:start + 300], option
    assert "--limit N only the first N examples, for a quick look, written to eval-limit-N.json instead of " \
           "eval.json" in text


@pytest.mark.parametrize("device, kind, setup, expected", [
    ("cuda", "run", {"autocast": "bfloat16", "matmul_precision": "high"}, ("bfloat16", "high", True, 16)),
    ("cuda", "run", {}, (None, "highest", True, 16)),
    ("cuda", "hub", {}, (None, "high", True, 16)),  # fp32 weights with TF32, as build-nanogpt and llm.c run GPT-2
    ("cpu", "run", {"autocast": "bfloat16", "matmul_precision": "high"}, (None, "highest", False, 4)),
])
def test_settings_are_the_runs_precision_on_a_gpu(device, kind, setup, expected):
    """Decided once from the source and the device (a CUDA device object needs no GPU to exist)."""
    from types import SimpleNamespace

    from gpt2ladder.commands.eval import _settings

    loaded = SimpleNamespace(kind=kind, setup=setup)
    args = SimpleNamespace(batch_size=None, no_compile=False)
    got = _settings(loaded, torch.device(device), SimpleNamespace(compile_problem=None), args)
    assert (got["autocast"], got["matmul_precision"], got["compiled"], got["batch_size"]) == expected
    assert _settings(loaded, torch.device(device), SimpleNamespace(compile_problem="no compiler"),
                     args)["compiled"] is False


MODERN = "rope,relu2,rmsnorm,untied_head,softcap"


def _direct_scores(model, prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """Each ending's summed and mean cross-entropy, one unpadded forward per ending of the loaded model: what
    the batched, padded evaluation must equal."""
    vocab = model.config.vocab_size
    sums, means = torch.zeros(len(prepared.labels), prepared.n_choices), torch.zeros(len(prepared.labels),
                                                                                      prepared.n_choices)
    with torch.no_grad():
        for i, (context, endings) in enumerate(zip(prepared.contexts, prepared.endings)):
            for j, ending in enumerate(endings):
                ids = torch.tensor([list(context) + list(ending)])
                logits, _ = model(ids)
                predicted = logits[0, len(context) - 1:-1, :vocab].float()  # the logits before each ending token
                losses = torch.nn.functional.cross_entropy(predicted, torch.tensor(ending), reduction="none")
                sums[i, j], means[i, j] = losses.sum(), losses.mean()
    return sums, means


def test_eval_of_a_run_of_a_modern_recipe_scores_its_own_model(setup, tmp_path, capsys):
    """A run trained with rotary positions, ReLU^2, RMSNorm, an untied head and soft-capped logits (a small shape,
    so the test is quick) is loaded as that model, and eval's scores are a direct computation on it."""
    from gpt2ladder.model.modern import SOFTCAP
    from gpt2ladder.training.loading import load_model

    from gpt2ladder.runtime.hardware import detect
    from gpt2ladder.training.config import TrainConfig
    from gpt2ladder.training.run import run_training

    _, root = setup
    text = tmp_path / "text.txt"
    text.write_text("The chef cuts onions and the dog runs in the park while a man sits on the roof.\n" * 60)
    run, cpu = tmp_path / "run", torch.device("cpu")
    cfg = TrainConfig(recipe=MODERN, model=SMALL, data=str(text), steps=3, batch_size=2, seq_len=32,
                      tokens_per_step=64, lr=1e-2, min_lr=1e-3, warmup_steps=0, eval_every=0, ckpt_every=0)
    assert run_training(cfg, cpu, run, progress=False, caps=detect(cpu)).exit_code == 0
    capsys.readouterr()
    code, out, err = _eval(capsys, run, "--task-data", root / "hellaswag.jsonl", "--batch-size", 2)
    assert code == 0 and err == "", err
    record = json.loads((run / "eval.json").read_text())
    assert record["model"]["config"]["parts"] == MODERN.split(",")

    model = load_model(run, torch.device("cpu")).model
    assert model.config.parts == tuple(MODERN.split(",")) and model.lm_head.softcap == SOFTCAP
    prepared = runner.prepare("hellaswag", root / "hellaswag.jsonl")
    sums, means = _direct_scores(model, prepared)
    result = runner.evaluate(prepared, model, device=torch.device("cpu"), block_size=model.config.block_size,
                             vocab_size=model.config.vocab_size, batch_size=2, progress=False)
    torch.testing.assert_close(result.sums, sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.means, means, rtol=1e-5, atol=1e-5)
    labels = torch.tensor(prepared.labels)
    assert record["correct"] == int((sums.argmin(1) == labels).sum())
    assert record["correct_norm"] == int((means.argmin(1) == labels).sum())
    assert (record["n"], record["acc"], record["acc_norm"]) == (3, result.acc, result.acc_norm)
