"""Round trips with transformers (the test extra installs it), on a small random config and on the real
124M shape with random weights:
- export -> `from_pretrained` (model and tokenizer) with no warning, the same logits to 1e-5 in fp32 and
  the same greedy tokens as `gpt2ladder sample --temperature 0`;
- a folder transformers wrote (`save_pretrained`) -> gpt2ladder's sample and `train --init-from`, the same;
- the exported tokenizer gives gpt2ladder's ids on Tiny Shakespeare;
- a run of a recipe whose only model part sets the initial weights (muon,wsd,zero_init) exports, the same logits.
The 124M model is built once per module and checked with one forward per model over transformers'
greedy sequence (the same check as decoding again, token by token: see `_same_function_and_greedy_tokens`);
the command line is exercised on the small config.
"""

import contextlib
import logging
import warnings

import pytest
import torch

from gpt2ladder import cli
from gpt2ladder.data import get_tokenizer
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.generate import generate
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.hf import load_hf_model, save_hf_gpt2
from gpt2ladder.training.checkpoint import save_checkpoint

transformers = pytest.importorskip("transformers")

SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_multiple=128)  # padded, as the vocab rung
GPT2_124M = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_multiple=128)
PROMPT = "ROMEO:"
NEW_TOKENS = 6


@contextlib.contextmanager
def no_warnings():
    """Fails on a Python warning or a record at warning level or above from transformers' loggers (where
    transformers reports missing, unexpected or re-initialised weights and tokenizer problems)."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.WARNING)  # whatever TRANSFORMERS_VERBOSITY says, warnings reach the handler
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    found = [str(w.message) for w in caught] + [r.getMessage() for r in records]
    if found:
        raise AssertionError(f"transformers warned: {found}")


def _logits(model, idx):
    with torch.no_grad():
        if isinstance(model, GPT):
            return model(idx)[0][..., : model.config.vocab_size]
        return model(idx).logits


def _hf_greedy(hf, prompt_ids: list[int]) -> list[int]:
    idx = torch.tensor([prompt_ids])
    out = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=NEW_TOKENS, do_sample=False,
                      pad_token_id=hf.config.eos_token_id)
    return out[0].tolist()


def _our_greedy(model: GPT, prompt_ids: list[int]) -> list[int]:
    return generate(model, torch.tensor([prompt_ids]), NEW_TOKENS, temperature=0.0)[0].tolist()


def _sample_greedy(capsys, path) -> str:
    code = cli.main(["sample", str(path), "--device", "cpu", "--temperature", "0", "--prompt", PROMPT,
                     "--num-tokens", str(NEW_TOKENS)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _ids(seed: int, n: int = 12) -> torch.Tensor:
    return torch.randint(0, 50257, (2, n), generator=torch.Generator().manual_seed(seed))


# --- a small random config, through the command line ----------------------------------------------


@pytest.fixture(scope="module")
def small_export(module_tmp):
    """(our model, its run directory, the folder `gpt2ladder export` wrote, transformers' model and
    tokenizer loaded from it, with no warning)."""
    root = module_tmp("small")
    model = init_weights(GPT(SMALL), seed=5).eval()
    (root / "run").mkdir()
    save_checkpoint(root / "run" / "ckpt.pt",
                    {"model": model.state_dict(), "model_config": SMALL.to_dict(), "setup": {}, "step": 1})
    assert cli.main(["export", str(root / "run"), str(root / "hf")]) == 0
    with no_warnings():
        hf = transformers.GPT2LMHeadModel.from_pretrained(root / "hf")
        tokenizer = transformers.AutoTokenizer.from_pretrained(root / "hf")
    return model, root / "run", root / "hf", hf.eval(), tokenizer


def test_export_computes_the_same_logits_in_transformers(small_export):
    model, _, _, hf, _ = small_export
    assert not hf.training and hf.dtype == torch.float32
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied, as saved
    torch.testing.assert_close(_logits(hf, _ids(0)), _logits(model, _ids(0)), rtol=1e-5, atol=1e-5)


def test_export_gives_the_greedy_tokens_of_gpt2ladder_sample(small_export, capsys):
    model, run, _, hf, tokenizer = small_export
    prompt = tokenizer(PROMPT)["input_ids"]
    assert prompt == get_tokenizer().encode_ordinary(PROMPT)
    tokens = _hf_greedy(hf, prompt)
    assert _sample_greedy(capsys, run) == get_tokenizer().decode(tokens) + "\n"
    assert tokens == _our_greedy(model, prompt)


def test_a_folder_transformers_wrote_samples_and_trains_the_same(tmp_path, capsys):
    from gpt2ladder.commands.train import model_shape
    from gpt2ladder.model.setup import Setup
    from gpt2ladder.training.config import TrainConfig
    from gpt2ladder.training.trainer import build_engine

    torch.manual_seed(3)  # transformers draws its random weights from the global generator
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=48)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf_model(tmp_path / "hf")
    assert ours.config == ModelConfig(n_layer=2, n_head=4, n_embd=64, block_size=48)
    torch.testing.assert_close(_logits(ours, _ids(1)), _logits(hf, _ids(1)), rtol=1e-5, atol=1e-5)
    prompt = get_tokenizer().encode_ordinary(PROMPT)
    assert _sample_greedy(capsys, tmp_path / "hf") == get_tokenizer().decode(_hf_greedy(hf, prompt)) + "\n"
    shape = model_shape("tiny", str(tmp_path / "hf"))  # what `train --init-from` reads: config.json, not the preset
    assert shape == ours.config
    cfg = TrainConfig(init_from=str(tmp_path / "hf"), seq_len=32, batch_size=1, tokens_per_step=32, steps=1,
                      model=shape)
    engine = build_engine(cfg, Setup(vocab_multiple=128), torch.device("cpu"))
    torch.testing.assert_close(_logits(engine.raw_model.eval(), _ids(2)), _logits(hf, _ids(2)), rtol=1e-5, atol=1e-5)


def test_bfloat16_export_loads_in_bfloat16(small_export, tmp_path, capsys):
    model, run, _, _, _ = small_export
    assert cli.main(["export", str(run), str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0
    capsys.readouterr()
    with no_warnings():
        hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf", dtype="auto")  # auto: config.json's
    assert hf.dtype == torch.bfloat16
    expected = model.transformer.h[0].attn.c_proj.weight.t().to(torch.bfloat16)
    assert torch.equal(hf.transformer.h[0].attn.c_proj.weight, expected)  # Conv1D layout


def test_the_warning_check_can_fail(small_export, tmp_path):
    """A file missing a tensor makes transformers warn; no_warnings must see it."""
    from safetensors.torch import load_file, save_file

    _, _, folder, _, _ = small_export
    for name in ("config.json", "generation_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["transformer.ln_f.bias"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="ln_f"):
        with no_warnings():
            transformers.GPT2LMHeadModel.from_pretrained(tmp_path)


def test_exported_tokenizer_gives_gpt2ladders_ids(small_export, shakespeare_cache):
    tokenizer = small_export[4]
    text = (shakespeare_cache / "tinyshakespeare" / "input.txt").read_text()[:300_000]  # a quarter of the play text
    ids = tokenizer(text, verbose=False)["input_ids"]  # verbose: the text is longer than the model's context
    assert ids == get_tokenizer().encode_ordinary(text) and len(ids) > 80_000
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == 50256 and tokenizer.model_max_length == SMALL.block_size


# --- the real 124M shape, random weights -----------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_export(module_tmp):
    """Our random 124M model (padded vocabulary) exported; transformers' model loaded from it (no
    warning), its greedy continuation of the prompt and its logits over that whole sequence."""
    folder = module_tmp("gpt2") / "hf"
    model = init_weights(GPT(GPT2_124M), seed=0).eval()
    save_hf_gpt2(model, folder)
    with no_warnings():
        hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    greedy = _hf_greedy(hf, get_tokenizer().encode_ordinary(PROMPT))
    return model, hf, torch.tensor([greedy]), _logits(hf, torch.tensor([greedy]))


def _same_function_and_greedy_tokens(model: GPT, sequence: torch.Tensor, hf_logits: torch.Tensor) -> None:
    """One forward over transformers' greedy sequence: the same logits, and at every generated position
    our argmax is the token transformers chose. A causal model's logits at t depend only on tokens <= t,
    so this is the greedy decoding itself, checked token by token, without generating again."""
    logits = _logits(model, sequence)
    torch.testing.assert_close(logits, hf_logits, rtol=1e-5, atol=1e-5)
    start = sequence.shape[1] - NEW_TOKENS
    assert torch.equal(logits[0, start - 1:-1].argmax(-1), sequence[0, start:])


def test_124m_export_computes_the_same_logits_and_greedy_tokens(gpt2_export):
    model, hf, sequence, hf_logits = gpt2_export
    assert hf.num_parameters() == 124_439_808 and sequence.shape[1] > NEW_TOKENS
    _same_function_and_greedy_tokens(model, sequence, hf_logits)


def test_124m_folder_transformers_wrote_loads_the_same(gpt2_export, tmp_path):
    _, hf, sequence, hf_logits = gpt2_export
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf_model(tmp_path / "hf")
    assert ours.config == ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024)
    _same_function_and_greedy_tokens(ours, sequence, hf_logits)


# --- a recipe whose only model part is an initialisation: GPT-2's function, exported as GPT-2 ------------------


@pytest.fixture(scope="module")
def zero_init_run(module_tmp):
    """A real 3-step run of `train --recipe muon,wsd,zero_init` (tiny preset, padded vocabulary) and its export."""
    root = module_tmp("zero-init")
    text = root / "text.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 100)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2LADDER_CACHE", str(root / "cache"))
        assert cli.main(["train", "--recipe", "muon,wsd,zero_init", "--device", "cpu", "--preset", "tiny", "--rungs",
                         "baseline,vocab", "--batch-size", "2", "--seq-len", "32", "--steps", "3", "--eval-every", "0",
                         "--ckpt-every", "0", "--no-progress", "--data", str(text), "--out", str(root / "run")]) == 0
    assert cli.main(["export", str(root / "run"), str(root / "hf")]) == 0
    return root / "run", root / "hf"


def test_a_run_of_an_initialisation_only_recipe_exports_the_same_logits(zero_init_run):
    from gpt2ladder.model.modern import ModernGPT
    from gpt2ladder.training.loading import load_model

    run, folder = zero_init_run
    model = load_model(run, torch.device("cpu")).model
    assert isinstance(model, ModernGPT) and model.config.parts == ("zero_init",)
    assert model.transformer.h[0].attn.c_proj.weight.any()  # trained away from zero: not a trivial check
    with no_warnings():
        hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    torch.testing.assert_close(_logits(hf, _ids(4)), _logits(model, _ids(4)), rtol=1e-5, atol=1e-5)
    card = (folder / "README.md").read_text()
    assert "| recipe | muon,zero_init,wsd (Muon for the Blocks' matrices, AdamW for the rest; linear warm-up, then " \
           "stable, then linear decay) |" in card
