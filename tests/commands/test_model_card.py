"""The exported model card's metadata as the hub reads it (parsed back with huggingface_hub's ModelCard),
only finite and only this checkpoint's results on it, HellaSwag from `eval` of the run, the usage
snippet, other sources than a run (a Hugging Face folder, a hub name), and --push-to-hub through a
stand-in for huggingface_hub's HfApi (tests never reach the network)."""

import json
import shutil
from pathlib import Path

import pytest

from gpt2ladder import cli
from gpt2ladder.evals import hellaswag
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.hf import save_hf_gpt2
from gpt2ladder.training.checkpoint import save_checkpoint

huggingface_hub = pytest.importorskip("huggingface_hub")

SMALL = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
LOG = [{"step": 2, "loss": 9.5, "val_loss": 9.25}, {"step": 4, "loss": 8.5, "val_loss": 8.75}]


def make_run(folder, log=LOG, init_from=None, step=4, seed=3, recipe=None):
    """A run directory as `train` leaves it, made by hand: a checkpoint, its log.jsonl and config.json."""
    folder.mkdir(parents=True)
    model = init_weights(GPT(SMALL), seed=seed)
    train = {"steps": 4, "tokens_per_step": 64, "seed": 0, "init_from": init_from, "rungs": ["baseline"],
             "eval_batches": 2, "batch_size": 2, "seq_len": 32, **({"recipe": recipe} if recipe else {})}
    save_checkpoint(folder / "ckpt.pt", {"model": model.state_dict(), "model_config": SMALL.to_dict(), "setup": {},
                                         "step": step, "train_config": train,
                                         "data_source": {"source": "tinyshakespeare", "sha256": "ab" * 32}})
    (folder / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return folder


@pytest.fixture(autouse=True)
def private_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def export(capsys, *argv):
    code = cli.main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def card(folder):
    """(metadata as a dict, the card's text) of an exported folder, as huggingface_hub parses it."""
    parsed = huggingface_hub.ModelCard.load(folder / "README.md")
    return parsed.data.to_dict(), parsed.text, parsed.data.eval_results or []


def test_the_metadata_the_hub_reads(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    meta, text, results = card(tmp_path / "hf")
    assert meta["language"] == "en" and meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "text-generation" and meta["datasets"] == ["karpathy/tiny_shakespeare"]
    assert "license" not in meta and "base_model" not in meta  # none stated, none started from
    assert [(r.metric_type, r.metric_value, r.dataset_type, r.dataset_split) for r in results] == [
        ("loss", 8.75, "karpathy/tiny_shakespeare", "validation")]
    assert "from transformers import AutoModelForCausalLM, AutoTokenizer" in text
    assert 'repo = "your-name/hf"' in text and "AutoModelForCausalLM.from_pretrained(repo)" in text
    assert "<|endoftext|>" in text


def test_license_and_base_model(tmp_path, capsys):
    run = make_run(tmp_path / "run", init_from="gpt2")
    assert export(capsys, run, tmp_path / "hf", "--license", "apache-2.0")[0] == 0
    meta, text, _ = card(tmp_path / "hf")
    assert meta["license"] == "apache-2.0" and meta["base_model"] == "openai-community/gpt2"
    assert "| started from | the weights of openai-community/gpt2 |" in text


def test_a_local_init_from_folder_is_no_base_model(tmp_path, capsys):
    run = make_run(tmp_path / "run", init_from=str(tmp_path / "my/weights"))
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    meta, text, _ = card(tmp_path / "hf")
    assert "base_model" not in meta and f"the weights of {tmp_path / 'my/weights'}" in text


@pytest.mark.parametrize("bad", ["Infinity", "NaN"])
def test_a_non_finite_loss_never_reaches_the_card(tmp_path, capsys, bad):
    log = [LOG[0], {"step": 4, "loss": float(bad.lower().replace("infinity", "inf")),
                    "val_loss": float(bad.lower().replace("infinity", "inf"))}]
    run = make_run(tmp_path / "run", log=log)
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    meta, text, results = card(tmp_path / "hf")
    assert [r.metric_value for r in results] == [9.25]  # the last finite validation loss
    assert "inf" not in text.lower() and "nan" not in text.lower()
    assert "| validation loss | 9.2500 at step 2" in text and "training loss" not in text


def test_only_finite_losses_when_none_is(tmp_path, capsys):
    run = make_run(tmp_path / "run", log=[{"step": 4, "loss": float("nan"), "val_loss": float("inf")}])
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    meta, text, results = card(tmp_path / "hf")
    assert results == [] and "model-index" not in meta and "| validation loss | not recorded |" in text


# --- HellaSwag on the card ----------------------------------------------------------------------


@pytest.fixture
def official_standin(tmp_path, monkeypatch):
    """A three-example HellaSwag file that the code takes for the official set (its sha256 and count)."""
    import hashlib

    path = tmp_path / "hs.jsonl"
    path.write_text("".join(json.dumps({"ctx": f"Step {i}: a man walks to the", "label": i % 4,
                                        "endings": ["door.", "car slowly.", "sea.", "shop and buys bread."]}) + "\n"
                            for i in range(3)))
    monkeypatch.setattr(hellaswag, "SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    monkeypatch.setattr(hellaswag, "N_EXAMPLES", 3)
    return path


def _hellaswag_rows(results):
    return {r.metric_type: r.metric_value for r in results if r.dataset_type == "Rowan/hellaswag"}


def test_hellaswag_from_eval_of_this_checkpoint(tmp_path, capsys, official_standin):
    run = make_run(tmp_path / "run")
    assert cli.main(["eval", str(run), "--task-data", str(official_standin), "--device", "cpu", "--no-progress"]) == 0
    measured = json.loads((run / "eval.json").read_text())
    capsys.readouterr()
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    _, text, results = card(tmp_path / "hf")
    assert _hellaswag_rows(results) == {"acc_norm": round(measured["acc_norm"], 4), "acc": round(measured["acc"], 4)}
    assert f"| HellaSwag | acc_norm {measured['acc_norm']:.4f}, acc {measured['acc']:.4f} over 3 validation" in text


@pytest.mark.parametrize("why", ["other weights", "a subset", "not the official set"])
def test_hellaswag_of_anything_else_stays_off_the_card(tmp_path, capsys, official_standin, monkeypatch, why):
    run = make_run(tmp_path / "run")
    argv = ["eval", str(run), "--task-data", str(official_standin), "--device", "cpu", "--no-progress"]
    if why == "not the official set":
        monkeypatch.setattr(hellaswag, "SHA256", "0" * 64)
    assert cli.main(argv + (["--limit", "2"] if why == "a subset" else [])) == 0
    if why == "a subset":  # as eval.json (an older gpt2ladder wrote it there): still read as a subset
        (run / "eval-limit-2.json").rename(run / "eval.json")
    if why == "other weights":  # the run trained on after the evaluation
        shutil.copy(run / "eval.json", tmp_path / "eval.json")
        shutil.rmtree(run)
        make_run(run, seed=4)
        shutil.copy(tmp_path / "eval.json", run / "eval.json")
    capsys.readouterr()
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    _, text, results = card(tmp_path / "hf")
    assert _hellaswag_rows(results) == {} and "HellaSwag" not in text


def test_a_quick_look_after_the_full_evaluation_leaves_the_full_result_on_the_card(tmp_path, capsys,
                                                                                     official_standin):
    """`eval --limit N` after a full `eval` writes eval-limit-N.json beside eval.json: the card keeps the full
    result."""
    run = make_run(tmp_path / "run")
    argv = ["eval", str(run), "--task-data", str(official_standin), "--device", "cpu", "--no-progress"]
    assert cli.main(argv) == 0
    measured = json.loads((run / "eval.json").read_text())
    assert cli.main(argv + ["--limit", "2"]) == 0
    assert json.loads((run / "eval-limit-2.json").read_text())["n"] == 2
    capsys.readouterr()
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    assert _hellaswag_rows(card(tmp_path / "hf")[2]) == {"acc_norm": round(measured["acc_norm"], 4),
                                                          "acc": round(measured["acc"], 4)}


def test_hellaswag_from_a_log_entry_at_the_checkpoints_step(tmp_path, capsys, official_standin):
    """The entry a training run logs (`runner.log_entry`) reaches the card when it is at the checkpoint's step."""
    import torch

    from gpt2ladder.evals import runner

    run = make_run(tmp_path / "run")
    prepared = runner.prepare("hellaswag", official_standin)
    model = init_weights(GPT(SMALL), seed=3).eval()
    result = runner.evaluate(prepared, model, device=torch.device("cpu"), block_size=64, vocab_size=50257,
                             batch_size=2, progress=False)
    entry = runner.log_entry(prepared, result)
    assert entry["official"] is True and entry["n"] == 3
    log = [{**LOG[0], "hellaswag": {**entry, "acc_norm": 0.9}}, {**LOG[1], "hellaswag": entry}]
    (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    assert _hellaswag_rows(card(tmp_path / "hf")[2]) == {"acc_norm": round(result.acc_norm, 4),
                                                          "acc": round(result.acc, 4)}


# --- other sources, and pushing -------------------------------------------------------------------


def test_a_hugging_face_folder_and_a_hub_name_export_too(tmp_path, capsys):
    model = init_weights(GPT(SMALL), seed=3).eval()
    save_hf_gpt2(model, tmp_path / "src")
    code, out, _ = export(capsys, tmp_path / "src", tmp_path / "a")
    assert code == 0 and f", {tmp_path / 'src' / 'model.safetensors'} -> {tmp_path / 'a'}" in out
    meta, text, results = card(tmp_path / "a")
    assert "base_model" not in meta and results == [] and "exported by gpt2ladder" in text
    assert "| weights | a Hugging Face folder |" in text and "| steps |" not in text
    snapshot = tmp_path / "hf-home" / "hub" / "models--openai-community--gpt2" / "snapshots" / ("c" * 40)
    shutil.copytree(tmp_path / "src", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("c" * 40)
    assert export(capsys, "gpt2", tmp_path / "b")[0] == 0
    meta, text, _ = card(tmp_path / "b")
    assert meta["base_model"] == "openai-community/gpt2" and "| weights | those of openai-community/gpt2 |" in text
    code, _, err = export(capsys, tmp_path / "src", tmp_path, "--force")
    assert code == 2 and "holds the model being exported" in err
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == (tmp_path / "a" / "model.safetensors").read_bytes()


def test_exporting_an_export_again_keeps_the_runs_training_details(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert export(capsys, run, tmp_path / "hf", "--license", "mit")[0] == 0
    assert export(capsys, tmp_path / "hf", tmp_path / "again", "--dtype", "bfloat16")[0] == 0
    first, again = card(tmp_path / "hf"), card(tmp_path / "again")
    assert "| steps |" in again[1] and again[2] and [(r.metric_type, r.metric_value) for r in again[2]] == [
        (r.metric_type, r.metric_value) for r in first[2]]
    assert "license" not in again[0]  # the license is what this export was told
    save_hf_gpt2(init_weights(GPT(SMALL), seed=5), tmp_path / "hf")  # other weights in the folder: no claims
    assert export(capsys, tmp_path / "hf", tmp_path / "other")[0] == 0
    assert "| steps |" not in card(tmp_path / "other")[1] and card(tmp_path / "other")[2] == []


class FakeApi:
    """huggingface_hub.HfApi's two calls export makes, recorded; `fail` raises from create_repo."""

    calls: list = []
    fail: Exception | None = None

    def create_repo(self, repo_id, repo_type=None, exist_ok=False, **kwargs):
        FakeApi.calls.append(("create_repo", repo_id, repo_type, exist_ok))
        if FakeApi.fail:
            raise FakeApi.fail
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{'me/' if '/' not in repo_id else ''}{repo_id}")

    def upload_folder(self, repo_id, folder_path, repo_type=None, commit_message=None, **kwargs):
        FakeApi.calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))


@pytest.fixture
def fake_api(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls, FakeApi.fail = [], None
    return FakeApi


def test_push_to_hub_creates_the_repository_and_uploads_the_folder(tmp_path, capsys, fake_api):
    code, out, _ = export(capsys, make_run(tmp_path / "run"), tmp_path / "hf", "--push-to-hub", "shakespeare")
    assert code == 0 and out.splitlines()[-1] == (f"gpt2ladder export: pushed {tmp_path / 'hf'} "
                                                  "to https://huggingface.co/me/shakespeare")
    assert fake_api.calls[0] == ("create_repo", "shakespeare", "model", True)
    assert fake_api.calls[1][:2] == ("upload_folder", "me/shakespeare") and "README.md" in fake_api.calls[1][2]
    assert 'repo = "shakespeare"' in card(tmp_path / "hf")[1]


def _one_line(code, err, expected):
    assert code == expected and err.startswith("gpt2ladder: error: ") and err.count("\n") == 1, err


def test_push_refused_for_write_access_is_one_line(tmp_path, capsys, fake_api):
    err = huggingface_hub.errors.HfHubHTTPError.__new__(huggingface_hub.errors.HfHubHTTPError)
    Exception.__init__(err, "401 Unauthorized")
    err.response = type("Response", (), {"status_code": 401})()
    fake_api.fail = err
    code, _, message = export(capsys, make_run(tmp_path / "run"), tmp_path / "hf", "--push-to-hub", "me/x")
    _one_line(code, message, 1)
    assert "hf auth login" in message and (tmp_path / "hf" / "model.safetensors").is_file()  # the folder is kept


@pytest.mark.parametrize("argv, words", [
    (["--push-to-hub", "me/x"], "--push-to-hub needs the network, and HF_HUB_OFFLINE is set"),
    (["--push-to-hub", "a/b/c"], "is not a Hugging Face repository name"),
    (["--license", "MIT License"], "is not a license id"),
])
def test_bad_export_options_are_one_line_before_any_work(tmp_path, capsys, argv, words):
    code, _, err = export(capsys, make_run(tmp_path / "run"), tmp_path / "hf", *argv)
    _one_line(code, err, 2)
    assert words in err and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("recipe, row", [
    ("gpt2", "| recipe | gpt2 (AdamW; linear warm-up, then cosine decay) |"),
    ("muon,wsd", "| recipe | muon,wsd (Muon for the Blocks' matrices, AdamW for the rest; linear warm-up, then stable, "
                 "then linear decay) |"),
    (None, None),  # a run that recorded no recipe: no row, not a guess
    ("muon,nope", None)])  # one this version cannot read: no row either
def test_the_card_says_which_recipe_trained_the_weights(tmp_path, capsys, recipe, row):
    run = make_run(tmp_path / "run", recipe=recipe)
    assert export(capsys, run, tmp_path / "hf")[0] == 0
    _, text, _ = card(tmp_path / "hf")
    lines = [line for line in text.splitlines() if line.startswith("| recipe |")]
    assert lines == ([row] if row else [])
