"""One reading of a literal <|endoftext|> everywhere: GPT-2's end-of-text token 50256, as GPT-2's tokenizer
on the hub reads it. The exported tokenizer (transformers' AutoTokenizer on an export) and gpt2ladder's
own give the same ids on texts with and without the literal string; `sample` prompts are read the same."""

import pytest

from gpt2ladder import cli
from gpt2ladder.data.tokenizer import encode_text, get_tokenizer, write_hf_tokenizer

EOT = "<|endoftext|>"
TEXTS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",  # none
    f"{EOT}ROMEO: But soft!",  # at the start
    f"What light through yonder window breaks?{EOT}",  # at the end
    f"one{EOT}two{EOT}three",  # twice, between letters
    f"{EOT}{EOT}",  # adjacent to itself
    f"word {EOT} word\n\n{EOT}\n",  # between spaces and newlines
    f"x{EOT}y <|endoftext <|endoftext|",  # next to letters, and two cut-off copies that are plain text
    "",
]


@pytest.fixture(scope="module")
def exported_tokenizer(module_tmp):
    transformers = pytest.importorskip("transformers")
    folder = module_tmp("tokenizer")
    write_hf_tokenizer(folder, model_max_length=1024)
    return transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("text", TEXTS)
def test_the_exported_tokenizer_gives_the_same_ids(exported_tokenizer, text):
    ids = encode_text(text)
    assert exported_tokenizer(text)["input_ids"] == ids
    assert ids.count(50256) == text.count(EOT)
    assert exported_tokenizer.decode(ids) == get_tokenizer().decode(ids) == text


def test_the_literal_is_not_read_as_characters():
    """What the same text would be without the policy: the check above would fail on it."""
    assert get_tokenizer().encode_ordinary(TEXTS[3]) != encode_text(TEXTS[3])


def test_a_sample_prompt_reads_the_literal_as_the_token(tmp_path, monkeypatch, capsys):
    from gpt2ladder.model.config import ModelConfig
    from gpt2ladder.model.gpt import GPT, init_weights
    from gpt2ladder.training.checkpoint import save_checkpoint

    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32)
    save_checkpoint(tmp_path / "ckpt.pt", {"model": init_weights(GPT(cfg), 0).state_dict(),
                                           "model_config": cfg.to_dict(), "setup": {}, "step": 1})
    seen = []

    def record(model, idx, *args):  # stands in for the token stream: what the prompt became, and no new tokens
        seen.append(idx[0].tolist())
        return iter(())

    monkeypatch.setattr("gpt2ladder.commands.sample.stream", record)
    assert cli.main(["sample", str(tmp_path / "ckpt.pt"), "--device", "cpu", "--prompt", TEXTS[1]]) == 0
    assert seen == [encode_text(TEXTS[1])] and seen[0][0] == 50256
    assert capsys.readouterr().out == TEXTS[1] + "\n"
