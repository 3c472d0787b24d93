"""A run of a recipe other than GPT-2's, end to end on CPU: trained, recorded, resumed, sampled, refused where it
cannot go (another recipe on --resume, export to Hugging Face's GPT-2, GPT-2 weights as its start)."""

import json
import shutil

import pytest

from gpt2ladder import cli
from gpt2ladder.training.checkpoint import load_checkpoint
from gpt2ladder.training.runlog import read_log
from gpt2ladder.training.schedule import momentum_at

from training_support import one_line_error, real_text_offline, run_cli  # noqa: F401  (the real text, offline)

RECIPE = (
    "muon,rope,qk_norm,relu2,rmsnorm,zero_init,untied_head,softcap,value_embeds,unet_skips,doc_windows,wsd,"
    "momentum_warmup,polar_express,embed_skips")


def _args(out, *extra):
    return ["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2",
            "--seq-len", "32", "--steps", "6", "--ckpt-every", "3", "--eval-every", "3", "--eval-batches", "1",
            "--no-progress", "--recipe", RECIPE, "--out", str(out), *extra]


_cli, _one_line_error = run_cli, one_line_error


@pytest.fixture(scope="module")
def modern_run(module_tmp, shakespeare_cache):
    out = module_tmp("modern") / "run"
    assert cli.main(_args(out, "--muon-lr", "0.015", "--decay-fraction", "0.5")) == 0
    return out


def test_the_run_records_its_recipe_and_trains(modern_run):
    config = json.loads((modern_run / "config.json").read_text())
    assert config["train_config"]["recipe"] == RECIPE and config["train_config"]["muon_lr"] == 0.015
    assert config["train_config"]["decay_fraction"] == 0.5
    rates = [e["lr"] for e in read_log(modern_run / "log.jsonl")]  # 6 steps, half of them decaying: from step 4
    assert rates[:4] == [rates[0]] * 4 and rates[3] > rates[4] > rates[5]  # at 0.4, step 5 would be at the peak
    state = load_checkpoint(modern_run)
    assert state["model_config"]["parts"] == ["rope", "qk_norm", "relu2", "rmsnorm", "zero_init", "untied_head",
                                              "softcap", "value_embeds", "unet_skips", "doc_windows",
                                              "embed_skips"]
    assert "transformer.wpe.weight" not in state["model"] and "lm_head.weight" in state["model"]
    assert {"value_embeds.0.weight", "skip_weights", "transformer.h.1.attn.value_mix", "residual_mix",
            "embed_mix"} <= set(state["model"])
    log = read_log(modern_run / "log.jsonl")
    assert log[-1]["step"] == 6 and log[-1]["val_loss"] < log[2]["val_loss"] < 10.9
    assert [e["momentum"] for e in log] == [momentum_at(s) for s in range(6)] and log[0]["momentum"] == 0.85


def test_resume_keeps_the_recipe_and_refuses_another(modern_run, tmp_path, capsys):
    run = shutil.copytree(modern_run, tmp_path / "run")
    before = (run / "ckpt.pt").read_bytes()
    code, _, err = _cli(capsys, ["train", "--device", "cpu", "--resume", "--recipe", "gpt2", "--out", str(run)])
    assert code == 2 and _one_line_error(err) and RECIPE in err
    assert (run / "ckpt.pt").read_bytes() == before
    code, out, _ = _cli(capsys, ["train", "--device", "cpu", "--resume", "--steps", "7", "--no-progress",
                                 "--out", str(run)])
    assert code == 0 and "resuming from step 6" in out
    assert load_checkpoint(run)["train_config"]["recipe"] == RECIPE
    assert read_log(run / "log.jsonl")[-1]["momentum"] == momentum_at(6)  # the warm-up goes on, not over


def test_sample_and_the_api_load_the_modern_model(modern_run, capsys):
    import gpt2ladder

    model = gpt2ladder.load(str(modern_run))
    assert model.config.parts and type(model).__name__ == "ModernGPT"
    text = gpt2ladder.generate(model, "ROMEO:", max_new_tokens=5, seed=0)
    assert text.startswith("ROMEO:")
    code, out, _ = _cli(capsys, ["sample", str(modern_run), "--prompt", "ROMEO:", "--num-tokens", "5",
                                 "--device", "cpu"])
    assert code == 0 and "ROMEO:" in out


def test_a_run_names_its_recipe_when_it_starts_when_it_resumes_and_when_it_is_sampled(tmp_path, capsys):
    """speedrun by that name (its parts exactly), any other recipe by its parts."""
    def args(recipe, out):
        given = [a if a != RECIPE else recipe for a in _args(out, "--tokens-per-step", "64")]
        given[given.index("--steps") + 1] = "1"
        return given

    out = tmp_path / "run"
    code, text, _ = _cli(capsys, args("speedrun", out))
    assert code == 0 and " on cpu, recipe speedrun, rungs: baseline; 1 step of 64 tokens (2 x 32 x 1 " in text
    code, text, _ = _cli(capsys, ["train", "--device", "cpu", "--resume", "--steps", "2", "--no-progress",
                                  "--out", str(out)])
    assert code == 0 and " on cpu, recipe speedrun, rungs: baseline; 2 steps of 64 tokens" in text
    code, _, err = _cli(capsys, ["sample", str(out), "--num-tokens", "2", "--device", "cpu"])
    assert code == 0 and f", recipe speedrun from {out / 'ckpt.pt'} (step 2) on cpu" in err
    code, text, _ = _cli(capsys, args("speedrun-wsd", tmp_path / "other"))
    assert code == 0 and " on cpu, recipe muon,rope,qk_norm,relu2,rmsnorm,zero_init,untied_head,softcap," \
                         "value_embeds, rungs: baseline;" in text


def test_export_to_hugging_faces_gpt2_is_refused_in_one_line(modern_run, tmp_path, capsys):
    code, _, err = _cli(capsys, ["export", str(modern_run), str(tmp_path / "hf")])
    assert code == 2 and _one_line_error(err) and "recipe parts" in err
    assert not (tmp_path / "hf").exists()


def test_gpt2_weights_cannot_start_a_modern_model(tmp_path, capsys):
    code, _, err = _cli(capsys, _args(tmp_path / "x", "--init-from", str(tmp_path)))
    assert code == 2 and _one_line_error(err) and "--init-from" in err


def test_bench_times_a_recipe_and_records_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    code, out, err = _cli(capsys, ["bench", "--device", "cpu", "--recipe", "relu2,softcap",
                                   "--rungs", "baseline,flash,fused_loss",
                                   "--steps", "2", "--warmup", "1", "--batch-size", "1", "--seq-len", "16",
                                   "--no-progress", "--out", str(tmp_path / "b")])
    assert code == 0, err
    record = json.loads((tmp_path / "b" / "ladder.json").read_text())
    assert record["config"]["recipe"] == "relu2,softcap" and record["model"]["parts"] == ["relu2", "softcap"]
    assert all(r["status"] == "ok" for r in record["rungs"])


@pytest.mark.parametrize("flag, value, says", [("--decay-fraction", "0.5", "no wsd part"),
                                                ("--decay-fraction", "1.5", "above 0 and at most 1")])
def test_a_decay_for_a_recipe_without_wsd_or_beyond_the_steps_is_refused(tmp_path, capsys, flag, value, says):
    args = _args(tmp_path / "x", flag, value)
    if "wsd" in says:
        args[args.index("--recipe") + 1] = "muon,rope"
    code, _, err = _cli(capsys, args)
    assert code == 2 and _one_line_error(err) and "--decay-fraction" in err and says in err
    assert not (tmp_path / "x").exists()


def test_muon_rates_for_a_recipe_without_muon_are_refused_not_recorded_and_ignored(tmp_path, capsys):
    args = [a for a in _args(tmp_path / "x", "--muon-lr", "0.01") if a != RECIPE]
    args[args.index("--recipe") + 1:args.index("--recipe") + 1] = ["rope"]
    code, _, err = _cli(capsys, args)
    assert code == 2 and _one_line_error(err) and "--muon-lr" in err and "no muon part" in err
    assert not (tmp_path / "x").exists()
