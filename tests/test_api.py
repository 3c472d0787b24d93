"""The Python API (`gpt2ladder.load`, `generate`, `save_hf`, `evaluate`) gives what the commands give, and
`import gpt2ladder` and `--help` never import torch (checked in a fresh interpreter)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpt2ladder
from gpt2ladder import cli
from gpt2ladder.errors import BadArgument, LadderError, UsageError
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.training.checkpoint import save_checkpoint

SMALL = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_multiple=128)
SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_import_and_help_do_not_import_torch():
    script = """
import sys
import gpt2ladder
assert "torch" not in sys.modules, "import gpt2ladder imported torch"
from gpt2ladder import cli
for argv in (["--help"], ["eval", "--help"], ["sample", "--help"], ["export", "--help"], ["train", "--help"]):
    try:
        cli.main(argv)
    except SystemExit:
        pass
    assert "torch" not in sys.modules, f"gpt2ladder {' '.join(argv)} imported torch"
print("light")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("light")


def test_help_imports_neither_numpy_nor_the_tokenizer():
    """`gpt2ladder --help` starts in a few hundredths of a second: building the parser (prepare's --format
    choices included) reads no numpy and no tiktoken, which alone cost it a fifth of a second."""
    script = """
import sys
from gpt2ladder import cli
for argv in (["--help"], ["prepare", "--help"]):
    try:
        cli.main(argv)
    except SystemExit:
        pass
    heavy = sorted(m for m in ("numpy", "tiktoken") if m in sys.modules)
    assert not heavy, f"gpt2ladder {' '.join(argv)} imported {heavy}"
print("light")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("light")


def test_the_check_can_fail():
    """The same check sees torch once something imports it."""
    script = "import sys, gpt2ladder; gpt2ladder.load; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "True", proc.stderr[-2000:]


@pytest.fixture(scope="module")
def run_dir(module_tmp):
    folder = module_tmp("api") / "run"
    folder.mkdir()
    model = init_weights(GPT(SMALL), seed=9)
    save_checkpoint(folder / "ckpt.pt", {"model": model.state_dict(), "model_config": SMALL.to_dict(), "setup": {},
                                         "step": 3})
    return folder


def test_load_and_generate_give_what_sample_prints(run_dir, capsys):
    model = gpt2ladder.load(run_dir, device="cpu")
    assert isinstance(model, GPT) and not model.training and model.config == SMALL
    text = gpt2ladder.generate(model, "ROMEO:", max_new_tokens=5, temperature=0)
    assert cli.main(["sample", str(run_dir), "--device", "cpu", "--prompt", "ROMEO:", "--num-tokens", "5",
                     "--temperature", "0"]) == 0
    assert capsys.readouterr().out == text + "\n" and text.startswith("ROMEO:")
    assert gpt2ladder.generate(model, "ROMEO:", 5, seed=1) != gpt2ladder.generate(model, "ROMEO:", 5, seed=2)


def test_save_hf_writes_a_folder_transformers_and_load_read(run_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = gpt2ladder.load(run_dir, device="cpu")
    folder = gpt2ladder.save_hf(model, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.json"} <= {p.name for p in folder.iterdir()}
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    idx = torch.randint(0, 50257, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(idx)[0][..., :50257]
        torch.testing.assert_close(hf(idx).logits, ours, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gpt2ladder.load(folder, "cpu")(idx)[0][..., :50257], ours, rtol=1e-6, atol=1e-6)
    with pytest.raises(UsageError, match="not empty"):
        gpt2ladder.save_hf(model, folder)
    assert gpt2ladder.save_hf(model, folder, overwrite=True) == folder


def test_evaluate_gives_what_eval_writes(run_dir, tmp_path, capsys):
    data = tmp_path / "hs.jsonl"
    data.write_text("".join(json.dumps({"ctx": f"A man opens door {i}. He", "label": i % 4,
                                        "endings": ["walks in.", "sings a long song.", "flies.", "sits."]}) + "\n"
                            for i in range(5)))
    model = gpt2ladder.load(run_dir, device="cpu")
    result = gpt2ladder.evaluate(model, "hellaswag", task_data=data)
    assert cli.main(["eval", str(run_dir), "--task-data", str(data), "--device", "cpu", "--out", str(tmp_path / "o"),
                     "--no-progress"]) == 0
    record = json.loads((tmp_path / "o" / "eval.json").read_text())
    assert (result["n"], result["acc"], result["acc_norm"]) == (record["n"], record["acc"], record["acc_norm"]) == (
        5, result["correct"] / 5, result["correct_norm"] / 5)
    assert not model.training


def test_save_hf_never_replaces_a_run_directory_nor_a_folder_it_did_not_write(run_dir, tmp_path):
    import shutil

    from gpt2ladder.training import lock

    model = gpt2ladder.load(run_dir, device="cpu")
    run = shutil.copytree(run_dir, tmp_path / "run")
    (run / "log.jsonl").write_text('{"step": 1}\n')
    held, _ = lock.try_lock(run)  # a run still training there
    try:
        with pytest.raises(UsageError, match="run directory"):
            gpt2ladder.save_hf(model, run, overwrite=True)
    finally:
        held.release()
    with pytest.raises(UsageError, match="run directory"):  # nor when it has finished
        gpt2ladder.save_hf(model, run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["ckpt.pt", "log.jsonl"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(UsageError, match=r"files an export did not write \(notes.txt\)"):
        gpt2ladder.save_hf(model, mine, overwrite=True)
    assert (mine / "notes.txt").read_text() == "my notes" and (mine / "config.json").read_text() == "{}"


@pytest.mark.parametrize("call, name", [
    (lambda m: gpt2ladder.generate(m, "x", max_new_tokens=-5), "max_new_tokens"),
    (lambda m: gpt2ladder.generate(m, "x", max_new_tokens=0), "max_new_tokens"),
    (lambda m: gpt2ladder.generate(m, "x", 3, temperature=-1), "temperature"),
    (lambda m: gpt2ladder.generate(m, "x", 3, temperature=float("nan")), "temperature"),
    (lambda m: gpt2ladder.generate(m, "x", 3, top_k=-5), "top_k"),
    (lambda m: gpt2ladder.evaluate(m, batch_size=0), "batch_size"),
    (lambda m: gpt2ladder.evaluate(m, limit=-1), "limit"),
    (lambda m: gpt2ladder.save_hf(m, "unused", dtype="int3"), "dtype"),
])
def test_arguments_out_of_range_are_one_clear_error_naming_the_parameter(run_dir, call, name):
    model = gpt2ladder.load(run_dir, device="cpu")
    with pytest.raises(BadArgument, match=f"^{name} must be") as caught:
        call(model)
    assert isinstance(caught.value, (UsageError, ValueError)) and "--" not in str(caught.value)


def test_api_errors_name_the_apis_parameters_not_the_clis_flags(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("urllib.request.urlopen", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    model = gpt2ladder.load(run_dir, device="cpu")
    with pytest.raises(LadderError, match="task_data=FILE") as caught:
        gpt2ladder.evaluate(model)
    assert "--" not in str(caught.value).replace("hellaswag_val", "")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UsageError, match="overwrite=True") as caught:
        gpt2ladder.save_hf(model, tmp_path / "full")
    assert "--force" not in str(caught.value)


def test_save_hf_writes_every_file_with_the_umask(run_dir, tmp_path):
    model = gpt2ladder.load(run_dir, device="cpu")
    old = os.umask(0o027)
    try:
        folder = gpt2ladder.save_hf(model, tmp_path / "hf")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o640, modes
