"""Tests for model/generate.py and `gpt2ladder sample`: deterministic generation, real-vocabulary-only ids, compile,
the command on a run and on Hugging Face weights."""

import pytest
import torch

from gpt2ladder import cli
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.generate import generate
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.training.checkpoint import save_checkpoint

SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16)


def _model(cfg: ModelConfig = SMALL, seed: int = 0) -> GPT:
    return init_weights(GPT(cfg), seed).eval()


def _tokens(model, seed, n=12, **kw):
    gen = torch.Generator().manual_seed(seed)
    return generate(model, torch.zeros((2, 3), dtype=torch.long), n, generator=gen, **kw)


def test_same_seed_same_tokens_other_seed_other_tokens():
    model = _model()
    a, b, c = _tokens(model, 1), _tokens(model, 1), _tokens(model, 2)
    assert a.shape == (2, 15)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(a[:, :3], torch.zeros((2, 3), dtype=torch.long))  # the prompt is kept


def test_top_k_one_is_greedy():
    model = _model()
    sampled = _tokens(model, 5, top_k=1, temperature=1.0)
    greedy = _tokens(model, 99, temperature=0.0)
    idx = torch.zeros((2, 3), dtype=torch.long)
    with torch.no_grad():
        for _ in range(12):  # argmax by hand
            nxt = model(idx[:, -SMALL.block_size:])[0][:, -1, :SMALL.vocab_size].argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
    assert torch.equal(sampled, greedy) and torch.equal(greedy, idx)


def test_a_tiny_temperature_is_the_greedy_limit_not_nan():
    """1e-45 divides every logit into +-inf; the sampler must still pick the most likely token."""
    model = _model()
    assert torch.equal(_tokens(model, 1, temperature=1e-45), _tokens(model, 2, temperature=0.0))


def test_padded_vocabulary_ids_are_never_sampled():
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_multiple=128)
    model = _model(cfg)
    with torch.no_grad():
        # every hidden state becomes all-ones, and the padded classifier rows all-ones: padded logits
        # are 32 while real ones are about 0, so a sampler that forgot to slice would pick only them
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[cfg.vocab_size:] = 1.0
        logits = model(torch.zeros((1, 1), dtype=torch.long))[0]
    assert cfg.padded_vocab_size > cfg.vocab_size
    assert logits[0, -1].argmax() >= cfg.vocab_size  # the test can fail: padding dominates the raw logits
    for kw in ({"temperature": 1.0}, {"temperature": 2.0, "top_k": 50}, {"temperature": 0.0}):
        out = _tokens(model, 3, n=40, **kw)
        assert int(out.max()) < cfg.vocab_size


def test_context_is_cropped_to_block_size():
    model = _model()
    idx = torch.randint(0, 100, (1, 40))  # longer than the block size of 16
    out = generate(model, idx, 5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 45)
    assert torch.equal(out[:, :40], idx)


def test_generation_under_torch_compile_matches_eager():
    model = _model()
    compiled = torch.compile(model, backend="eager")
    try:
        assert torch.equal(_tokens(compiled, 4, n=8), _tokens(model, 4, n=8))
    finally:
        torch._dynamo.reset()


# --- the command ----------------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path):
    model = _model(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_multiple=128))
    save_checkpoint(tmp_path / "ckpt.pt", {"model": model.state_dict(), "model_config": model.config.to_dict(),
                                           "setup": {"autocast": None}, "step": 1})
    return tmp_path


def _sample(capsys, *args):
    code = cli.main(["sample", *map(str, args), "--device", "cpu", "--num-tokens", "24"])
    out, err = capsys.readouterr()
    return code, out, err


def test_sample_command_is_deterministic_per_seed(run_dir, capsys):
    code, first, _ = _sample(capsys, run_dir, "--seed", 7, "--prompt", "ROMEO:")
    assert code == 0 and first.startswith("ROMEO:")
    assert _sample(capsys, run_dir / "ckpt.pt", "--seed", 7, "--prompt", "ROMEO:")[1] == first
    assert _sample(capsys, run_dir, "--seed", 8, "--prompt", "ROMEO:")[1] != first


def test_sample_command_with_compile(run_dir, capsys, monkeypatch):
    eager_text = _sample(capsys, run_dir, "--seed", 3, "--num-samples", 2)[1]
    real_compile = torch.compile
    backends = []

    def eager_compile(model, **kw):  # Inductor on two CPU cores takes minutes; the wiring is the same
        backends.append("eager")
        return real_compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    try:
        code, text, _ = _sample(capsys, run_dir, "--seed", 3, "--num-samples", 2, "--compile")
    finally:
        torch._dynamo.reset()
    assert code == 0 and backends == ["eager"]
    assert text == eager_text and text.count("-" * 40) == 1


def test_sample_reads_hugging_face_weights(run_dir, tmp_path, capsys):
    """The run's model exported to a Hugging Face folder samples the same greedy text, from the folder or
    its model.safetensors; the banner names the shape it read."""
    from gpt2ladder.model.hf import save_hf_gpt2
    from gpt2ladder.training.checkpoint import load_checkpoint, model_from_checkpoint

    save_hf_gpt2(model_from_checkpoint(load_checkpoint(run_dir), torch.device("cpu")), tmp_path / "hf")
    code, from_run, err = _sample(capsys, run_dir, "--temperature", 0, "--prompt", "ROMEO:")
    # a run names the recipe it trained; Hugging Face weights, which no recipe of ours trained, none
    assert code == 0 and err == (f"gpt2ladder sample: 1 layer, 2 heads, 32 wide, 1.6M parameters, recipe gpt2 from "
                                 f"{run_dir / 'ckpt.pt'} (step 1) on cpu\n")
    for path in (tmp_path / "hf", tmp_path / "hf" / "model.safetensors"):
        code, text, err = _sample(capsys, path, "--temperature", 0, "--prompt", "ROMEO:")
        assert code == 0 and text == from_run
        assert err == ("gpt2ladder sample: 1 layer, 2 heads, 32 wide, 1.6M parameters from "
                       f"{tmp_path / 'hf' / 'model.safetensors'} on cpu\n")


def test_sample_of_weights_without_config_json_is_one_line(run_dir, tmp_path, capsys):
    from gpt2ladder.model.hf import save_hf_gpt2
    from gpt2ladder.training.checkpoint import load_checkpoint, model_from_checkpoint

    save_hf_gpt2(model_from_checkpoint(load_checkpoint(run_dir), torch.device("cpu")), tmp_path / "hf")
    (tmp_path / "hf" / "config.json").unlink()
    code, _, err = _sample(capsys, tmp_path / "hf")
    assert code == 2 and "no config.json beside" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-k", "-2"], "--top-k"),
])
def test_sample_bad_arguments_are_one_line(run_dir, capsys, args, message):
    code, _, err = _sample(capsys, run_dir, *args)
    assert code == 2 and message in err and err.count("\n") == 1


def test_sample_missing_or_corrupt_checkpoint_is_one_line(run_dir, capsys):
    code, _, err = _sample(capsys, run_dir / "missing.pt")
    assert code == 2 and err.startswith("gpt2ladder: error: no checkpoint") and err.count("\n") == 1
    good = (run_dir / "ckpt.pt").read_bytes()
    (run_dir / "broken.pt").write_bytes(good[: len(good) // 3])
    code, _, err = _sample(capsys, run_dir / "broken.pt")
    assert code == 1 and "unreadable" in err and err.count("\n") == 1 and "Traceback" not in err
    assert (run_dir / "ckpt.pt").read_bytes() == good


@pytest.mark.slow
def test_sample_command_with_inductor(run_dir, capsys):
    """The real default backend (C++ code generation on CPU, about 25 s on two cores)."""
    from gpt2ladder.runtime.hardware import detect

    problem = detect(torch.device("cpu")).compile_problem
    if problem:
        pytest.skip(problem)
    eager_text = _sample(capsys, run_dir, "--seed", 5)[1]
    try:
        code, text, _ = _sample(capsys, run_dir, "--seed", 5, "--compile")
    finally:
        torch._dynamo.reset()
    assert code == 0 and text == eager_text


# --- temperatures at the edges of float32, the length, the text as it comes ---------------------------


def test_temperatures_below_float32s_range_are_greedy_not_nan(run_dir, capsys):
    """Rounded to zero in float32 they made the largest logit 0/0 = NaN and multinomial raise."""
    greedy = _sample(capsys, run_dir, "--temperature", "0", "--prompt", "ROMEO:")[1]
    for temperature in ("1e-46", "5e-324", "1e-38", "-0.0"):
        code, text, err = _sample(capsys, run_dir, "--temperature", temperature, "--prompt", "ROMEO:")
        assert code == 0 and "Traceback" not in err and text == greedy, temperature


@pytest.mark.parametrize("temperature", [1e39, 1e300, 1.7e308])
def test_a_temperature_above_float32s_range_is_uniform_among_the_top_k(temperature):
    """Rounded to inf it made the masked logits -inf/inf = NaN; it is the uniform limit over the k kept."""
    from gpt2ladder.model.generate import pick

    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    top = set(torch.topk(logits, 5).indices[0].tolist())
    gen = torch.Generator().manual_seed(1)
    drawn = [int(pick(logits, temperature, 5, gen)) for _ in range(200)]
    assert set(drawn) == top  # all five, and nothing outside them


def test_num_tokens_defaults_to_the_context_when_that_is_shorter(run_dir, capsys):
    """The fixture's model sees 32 tokens: the default 200 becomes 32, an explicit 33 is refused."""
    from gpt2ladder.data import get_tokenizer

    code = cli.main(["sample", str(run_dir), "--device", "cpu", "--temperature", "0"])
    text = capsys.readouterr().out
    assert code == 0 and len(get_tokenizer().encode_ordinary(text)) >= 32
    code = cli.main(["sample", str(run_dir), "--device", "cpu", "--num-tokens", "33"])
    assert code == 2 and "more than this model's context of 32 tokens" in capsys.readouterr().err


def test_the_text_is_printed_as_it_is_generated(run_dir, capsys, monkeypatch):
    """Each token's text reaches stdout before the next token is computed."""
    import gpt2ladder.commands.sample as sample_mod

    real_stream, seen = sample_mod.stream, []

    def watched(*args, **kw):
        for token in real_stream(*args, **kw):
            seen.append(len(capsys.readouterr().out))  # what had been printed before this token
            yield token

    monkeypatch.setattr(sample_mod, "stream", watched)
    code = cli.main(["sample", str(run_dir), "--device", "cpu", "--num-tokens", "12", "--prompt", "ROMEO:"])
    assert code == 0 and len(seen) == 12
    assert seen[0] > 0 and sum(1 for n in seen[1:] if n > 0) >= 6  # the prompt first, then piece by piece


def test_streamed_text_is_exactly_the_decoded_text_with_characters_split_across_tokens():
    from gpt2ladder.data import get_tokenizer
    from gpt2ladder.data.tokenizer import decode_stream

    enc = get_tokenizer()
    text = "naïve café — 日本語の文章 🙂🎉 Ωmega"
    ids = enc.encode_ordinary(text)
    split = [i for i in ids if not _whole_utf8(enc.decode_single_token_bytes(i))]
    assert split, "the test needs a character whose bytes span tokens"
    pieces = list(decode_stream(ids, enc))
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    rng = torch.Generator().manual_seed(0)
    for _ in range(20):  # random ids: bytes that are not UTF-8 become U+FFFD exactly as in decode
        ids = torch.randint(0, 50257, (40,), generator=rng).tolist()
        assert "".join(decode_stream(ids, enc)) == enc.decode(ids)


def _whole_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_an_empty_prompt_prints_no_end_of_text_token(run_dir, capsys):
    import gpt2ladder

    code, out, _ = _sample(capsys, run_dir, "--prompt", "", "--temperature", "0")
    assert code == 0 and "<|endoftext|>" not in out and out.strip()
    text = gpt2ladder.generate(gpt2ladder.load(run_dir, "cpu"), "", max_new_tokens=24, temperature=0)
    assert "<|endoftext|>" not in text and out == text + "\n"


def test_a_prompt_past_the_context_and_positions_never_trained_are_each_one_notice(tmp_path, capsys):
    model = _model(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_multiple=128))
    save_checkpoint(tmp_path / "ckpt.pt", {"model": model.state_dict(), "model_config": model.config.to_dict(),
                                           "setup": {}, "step": 1, "train_config": {"seq_len": 16}})
    code, _, err = _sample(capsys, tmp_path, "--prompt", "word " * 40)
    assert code == 0
    notices = [line for line in err.splitlines() if line.startswith("notice:")]
    assert len(notices) == 2
    assert "longer than this model's context of 32" in notices[0] and "last 32" in notices[0]
    assert "trained on sequences of 16 tokens" in notices[1] and "position 32" in notices[1]
    code, _, err = cli.main(["sample", str(tmp_path), "--device", "cpu", "--num-tokens", "8"]), *capsys.readouterr()
    assert code == 0 and "notice" not in err  # 1 + 8 positions: all trained
