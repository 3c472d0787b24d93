"""HellaSwag scoring checked against a direct computation: transformers' GPT2LMHeadModel on the same
weights (exported from a tiny random gpt2ladder model) scores each ending token by token, one example
at a time, with no padding; gpt2ladder's batched, padded evaluation must give the same per-ending
losses and the same acc and acc_norm. The examples are a small file in the official format that the
test writes (tests never download)."""

import hashlib
import json
import urllib.error

import pytest
import torch

from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.evals import hellaswag, runner, scoring
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights

SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_multiple=128)  # padded, as the vocab rung

# In the official file's format, extra fields included; the fourth has a context long enough that its
# rows pad to 64 tokens, not 32, and the fifth one too long for the 64 positions (it keeps its end).
CONTEXTS = ["A man is sitting on a roof. he", "A woman is outside with a bucket and a dog. The dog",
            "Two people are standing in a kitchen. They",
            "A young boy is seen standing in front of a large audience holding a violin and bow. He begins "
            "playing and the crowd listens intently while his teacher watches from the side of the stage. He",
            "The credits of the movie are shown on a black screen. " * 8 + "Then the",
            "<|endoftext|>A cat sits on a mat. The cat"]
ENDINGS = [["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.",
            "starts pulling up roofing on a roof."],
           ["runs away.", "gets into the bath tub with the bucket.", "uses a hose to wash the car.", "sleeps."],
           ["cook pasta.", "dance", "paint the walls of the kitchen blue and then leave.", "sing a song"],
           ["plays the violin.", "walks off stage.", "is juggling.", "eats a sandwich slowly."],
           ["end.", "movie begins again with a long scene of a city at night.", "cat.", "credits roll."],
           ["sleeps.", "jumps.", "is a dog.", "purrs loudly."]]
LABELS = [3, 0, 0, 0, 1, 3]


def write_examples(path, contexts=CONTEXTS, endings=ENDINGS, labels=LABELS):
    with open(path, "w") as f:
        for i, (ctx, ends, label) in enumerate(zip(contexts, endings, labels)):
            f.write(json.dumps({"ind": i, "activity_label": "Test", "ctx_a": ctx, "ctx_b": "", "ctx": ctx,
                                "split": "val", "split_type": "indomain", "label": label, "endings": ends,
                                "source_id": f"test~{i}"}) + "\n")
    return path


@pytest.fixture
def examples_file(tmp_path):
    return write_examples(tmp_path / "hellaswag_val.jsonl")


@pytest.fixture(scope="module")
def model():
    return init_weights(GPT(SMALL), seed=2).eval()


@pytest.fixture(scope="module")
def hf(model, module_tmp):
    """transformers' model and tokenizer, loaded from `model` exported."""
    transformers = pytest.importorskip("transformers")
    from gpt2ladder.data.tokenizer import write_hf_tokenizer
    from gpt2ladder.model.hf import save_hf_gpt2

    folder = module_tmp("hf")
    save_hf_gpt2(model, folder)
    write_hf_tokenizer(folder, model_max_length=SMALL.block_size)
    return (transformers.GPT2LMHeadModel.from_pretrained(folder).eval(),
            transformers.AutoTokenizer.from_pretrained(folder))


def direct_scores(hf_model, tokenizer, contexts, endings, block_size):
    """Per example and ending: (sum, mean) of -log p(token) over the ending, one unpadded forward per row."""
    sums, means = [], []
    for ctx, ends in zip(contexts, endings):
        context = tokenizer(ctx, verbose=False)["input_ids"]  # verbose: longer than the model's context
        row_sums, row_means = [], []
        for end in ends:
            ending = tokenizer(" " + end)["input_ids"]
            ids = (context + ending)[-block_size:]
            with torch.no_grad():
                logp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].double(), dim=-1)
            losses = [-logp[t - 1, ids[t]] for t in range(len(ids) - len(ending), len(ids))]
            row_sums.append(float(sum(losses)))
            row_means.append(float(sum(losses)) / len(ending))
        sums.append(row_sums)
        means.append(row_means)
    return torch.tensor(sums, dtype=torch.float64), torch.tensor(means, dtype=torch.float64)


def _evaluate(prepared, forward, batch_size, **kw):
    return runner.evaluate(prepared, forward, device=torch.device("cpu"), block_size=SMALL.block_size,
                           vocab_size=SMALL.vocab_size, batch_size=batch_size, progress=False, **kw)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_scores_equal_a_direct_computation_in_transformers(model, hf, examples_file, batch_size):
    prepared = runner.prepare("hellaswag", examples_file)
    assert len({runner.padded_length(len(prepared.contexts[i]) + 5, 64) for i in range(6)}) > 1  # two lengths
    result = _evaluate(prepared, model, batch_size)
    sums, means = direct_scores(*hf, CONTEXTS, ENDINGS, SMALL.block_size)
    torch.testing.assert_close(result.sums.double(), sums, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(result.means.double(), means, rtol=1e-4, atol=1e-4)
    labels = torch.tensor(LABELS)
    assert result.n == 6
    assert result.correct == int((sums.argmin(1) == labels).sum())
    assert result.correct_norm == int((means.argmin(1) == labels).sum())
    assert result.acc == result.correct / 6 and result.acc_norm == result.correct_norm / 6


def test_acc_and_acc_norm_can_differ_and_follow_the_labels(model, tmp_path):
    """Labels set to each example's own argmin of the sum, then of the mean: acc 1, then acc_norm 1."""
    prepared = runner.prepare("hellaswag", write_examples(tmp_path / "a.jsonl"))
    result = _evaluate(prepared, model, 4)
    by_sum, by_mean = result.sums.argmin(1).tolist(), result.means.argmin(1).tolist()
    assert by_sum != by_mean  # these endings differ in length enough for the two rules to disagree
    for labels, field in ((by_sum, "acc"), (by_mean, "acc_norm")):
        again = _evaluate(runner.prepare("hellaswag", write_examples(tmp_path / "b.jsonl", labels=labels)), model, 4)
        assert getattr(again, field) == 1.0


def test_the_trainers_call_scores_the_same(model, examples_file):
    """The engine's forward (SDPA attention, the padded vocabulary), as `train` would evaluate through it."""
    from gpt2ladder.runtime.engine import Engine
    from gpt2ladder.model.setup import Setup

    copy = GPT(SMALL.__class__(**{**SMALL.to_dict(), "attention": "sdpa"}))
    copy.load_state_dict(model.state_dict())
    engine = Engine(SMALL, Setup(attention="sdpa", vocab_multiple=128), torch.device("cpu"), model=copy.eval())
    prepared = runner.prepare("hellaswag", examples_file)
    plain = _evaluate(prepared, model, 2)
    through = _evaluate(prepared, engine.forward, 2, autocast=engine.setup.autocast,
                        matmul_precision=engine.setup.matmul_precision)
    torch.testing.assert_close(through.sums, plain.sums, rtol=1e-5, atol=1e-5)
    assert (through.correct, through.correct_norm) == (plain.correct, plain.correct_norm)


def test_limit_takes_the_first_examples(model, examples_file):
    prepared = runner.prepare("hellaswag", examples_file, limit=2)
    assert prepared.labels == tuple(LABELS[:2]) and prepared.data.n_in_file == 6
    full = _evaluate(runner.prepare("hellaswag", examples_file), model, 4)
    assert torch.equal(_evaluate(prepared, model, 4).sums, full.sums[:2])


def test_rendering_puts_a_space_before_each_ending_and_reads_endoftext_as_the_token():
    from gpt2ladder.data import get_tokenizer

    enc = get_tokenizer()
    context, endings = hellaswag.render(hellaswag.Example(CONTEXTS[5], tuple(ENDINGS[5]), 3))
    assert context[0] == 50256 and context[1:] == enc.encode_ordinary(CONTEXTS[5][len("<|endoftext|>"):])
    assert endings[0] == enc.encode_ordinary(" sleeps.") and enc.decode(endings[2]) == " is a dog."


# --- the pure scoring function ---------------------------------------------------------------------


def test_ending_losses_equal_a_loop_over_positions():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 20, generator=gen)
    tokens = torch.randint(0, 16, (3, 7), generator=gen)
    ending = torch.zeros(3, 7, dtype=torch.bool)
    ending[0, 2:5], ending[1, 6], ending[2, 1:7] = True, True, True
    sums, means = scoring.ending_losses(logits, tokens, ending, vocab_size=16)  # columns 16..19 are padding
    for r in range(3):
        positions = ending[r].nonzero().flatten().tolist()
        losses = [-torch.log_softmax(logits[r, t - 1, :16], -1)[tokens[r, t]] for t in positions]
        torch.testing.assert_close(sums[r], sum(losses))
        torch.testing.assert_close(means[r], sum(losses) / len(positions))


def test_a_row_without_a_scorable_ending_is_refused():
    logits, tokens = torch.zeros(1, 4, 8), torch.zeros(1, 4, dtype=torch.long)
    for ending in (torch.tensor([[True, True, False, False]]), torch.zeros(1, 4, dtype=torch.bool)):
        with pytest.raises(ValueError):
            scoring.ending_losses(logits, tokens, ending, 8)


def test_choose_takes_the_lowest_and_the_first_of_a_tie():
    sums = torch.tensor([3.0, 1.0, 2.0, 1.0, 5.0, 6.0, 7.0, 4.0])
    means = torch.tensor([0.5, 0.9, 0.1, 0.1, 1.0, 1.0, 1.0, 1.0])
    pred, pred_norm = scoring.choose(sums, means, 4)
    assert pred.tolist() == [1, 3] and pred_norm.tolist() == [2, 0]


# --- the data ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, problem", [
    ('{"ctx": "A man", "endings": ["a", "b", "c"], "label": 0}', '"endings" is not a list of 4 strings'),
    ('{"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 4}', '"label" is not an integer from 0 to 3'),
    ('{"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": "1"}', '"label" is not an integer'),
    ('{"text": "a sentence of another data set"}', 'no "ctx" text'),
    ('{"ctx": "A man", "endings": ["a", "b", "c", "d"], "lab', "not JSON"),
    ('[1, 2, 3]', "not a JSON object"),
])
def test_a_line_in_another_format_is_one_line_naming_it(examples_file, line, problem):
    with open(examples_file, "a") as f:
        f.write(line + "\n")
    with pytest.raises(UsageError, match=f"line 7 of .* is not a HellaSwag example: {problem}") as err:
        runner.prepare("hellaswag", examples_file)
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_text_or_empty_is_one_line(tmp_path):
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00binary")
    (tmp_path / "empty").write_text("\n")
    for name, words in (("bin", "not UTF-8"), ("empty", "holds no HellaSwag examples"), ("none", "does not exist")):
        with pytest.raises(UsageError, match=words):
            runner.prepare("hellaswag", tmp_path / name)


def test_an_unknown_task_is_one_line():
    with pytest.raises(UsageError, match="unknown task 'mmlu'; choose one of: hellaswag"):
        runner.prepare("mmlu")


@pytest.fixture
def cache(tmp_path, monkeypatch, examples_file):
    """A private data cache, and the official set's sha256 set to the test file's, which stands in for it."""
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hellaswag, "SHA256", hashlib.sha256(examples_file.read_bytes()).hexdigest())
    return tmp_path / "cache"


def _urlopen_serving(data: bytes, calls: list):
    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return data

    def urlopen(url, timeout):
        calls.append(url)
        return Response()

    return urlopen


def test_the_official_set_is_downloaded_once_and_checked(cache, examples_file, monkeypatch):
    calls = []
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", _urlopen_serving(examples_file.read_bytes(), calls))
    first = runner.prepare("hellaswag")
    assert calls == [hellaswag.URL] and first.data.official and first.data.path == hellaswag.cached_path()
    assert runner.prepare("hellaswag").labels == tuple(LABELS) and len(calls) == 1  # read from the cache


def test_a_download_with_the_wrong_bytes_leaves_nothing(cache, monkeypatch):
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", _urlopen_serving(b"{}\n", []))
    with pytest.raises(LadderError, match="sha256 is .* not the official"):
        runner.prepare("hellaswag")
    assert not hellaswag.cached_path().exists()


def test_offline_with_no_cached_set_says_where_to_put_it(cache, monkeypatch):
    def unreachable(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", unreachable)
    with pytest.raises(LadderError) as err:
        runner.prepare("hellaswag")
    message = str(err.value)
    assert "\n" not in message and "is not in the cache and could not be downloaded" in message
    assert f"put hellaswag_val.jsonl from {hellaswag.URL} at {hellaswag.cached_path()}" in message
    assert "--task-data FILE" in message


def test_a_damaged_cached_set_is_downloaded_again(cache, examples_file, monkeypatch):
    hellaswag.cached_path().parent.mkdir(parents=True)
    hellaswag.cached_path().write_bytes(examples_file.read_bytes()[:-40])  # cut short
    calls = []
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", _urlopen_serving(examples_file.read_bytes(), calls))
    assert runner.prepare("hellaswag").data.official and len(calls) == 1


def test_another_file_is_read_but_not_called_official(examples_file):
    data = runner.prepare("hellaswag", examples_file).data
    assert not data.official and data.sha256 == hashlib.sha256(examples_file.read_bytes()).hexdigest()
    assert data.to_dict()["url"] is None
