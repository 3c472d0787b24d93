"""`gpt2ladder sample`: a run, Hugging Face GPT-2 weights or a hub name (`training/loading.py`) -> the
model -> text, printed as each token is generated (`model/generate.py stream`), eagerly or compiled. A
literal <|endoftext|> in the prompt is GPT-2's end-of-text token, as everywhere (`data/tokenizer.py`)."""

from __future__ import annotations

import contextlib
import itertools
import math
import sys

import torch

from gpt2ladder.data import GPT2_EOT, get_tokenizer
from gpt2ladder.data.tokenizer import decode_stream, encode_text
from gpt2ladder.defaults import DEFAULTS
from gpt2ladder.errors import UsageError
from gpt2ladder.model.generate import stream
from gpt2ladder.model.gpt import GPT, describe_shape
from gpt2ladder.model.recipe import recipe_label
from gpt2ladder.runtime.hardware import detect, resolve_device
from gpt2ladder.training.loading import load_model


# --num-tokens: at most the model's context (its block size), and never more than this, which is
# checked before any model is loaded.
MAX_NEW_TOKENS = 100_000
DEFAULT_NEW_TOKENS = DEFAULTS["sample"]["any"]["num_tokens"]  # or the model's context when that is shorter


def _precision(device: torch.device, setup: dict):
    """The training run's autocast on CUDA (bf16 sampling is what the model was trained in)."""
    dtype = setup.get("autocast") if device.type == "cuda" else None
    if dtype not in ("bfloat16", "float16"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=getattr(torch, dtype))


def _check_args(args) -> None:
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UsageError(f"--temperature must be zero (greedy) or a finite positive number, got {args.temperature}")
    if args.top_k < 0:
        raise UsageError(f"--top-k must be zero (all tokens) or positive, got {args.top_k}")
    if args.num_tokens is not None and args.num_tokens > MAX_NEW_TOKENS:
        raise UsageError(f"--num-tokens is at most {MAX_NEW_TOKENS:,}, got {args.num_tokens}")


def _num_tokens(asked: int | None, context: int) -> int:
    """The tokens to generate per sample: --num-tokens, which must fit the model's context, or the default."""
    if asked is None:
        return min(DEFAULT_NEW_TOKENS, context)
    if asked > context:
        raise UsageError(f"--num-tokens {asked} is more than this model's context of {context} tokens; "
                         f"ask for at most {context}")
    return asked


def _trained_len(state: dict | None) -> int | None:
    """The sequence length a run trained at (None for Hugging Face weights, whose is not recorded)."""
    seq_len = ((state or {}).get("train_config") or {}).get("seq_len")
    return seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) else None


def _recipe(state: dict | None) -> str:
    """", recipe speedrun": the recipe a run trained (a checkpoint from before recipes trained gpt2's); nothing for
    Hugging Face weights, which no recipe of this gpt2ladder trained."""
    if state is None:
        return ""
    name = (state.get("train_config") or {}).get("recipe")
    try:
        return f", recipe {recipe_label(name)}"
    except (UsageError, AttributeError):  # a name no version of gpt2ladder wrote: as the checkpoint has it
        return f", recipe {name}"


def notices(prompt_len: int, num_tokens: int, context: int, trained: int | None) -> list[str]:
    """What a user should know before reading the sample: a prompt cut to the context, and positions the
    run never trained (a CPU tiny run trains at 128 of its 256)."""
    lines = []
    if prompt_len > context:
        lines.append(f"notice: the prompt is {prompt_len:,} tokens, longer than this model's context of {context}; "
                     f"the model sees its last {context}")
    used = min(prompt_len + num_tokens, context)
    if trained is not None and used > trained:
        lines.append(f"notice: this run trained on sequences of {trained} tokens; this sample reaches position "
                     f"{used} of the model's {context}, which training never used, so text past {trained} tokens "
                     "may lose its way")
    return lines


def _compiled(model: GPT, device: torch.device):
    problem = detect(device).compile_problem
    if problem:
        raise UsageError(f"--compile cannot run here: {problem}")
    return torch.compile(model)


def sample_command(args) -> int:
    _check_args(args)
    device = resolve_device(args.device)
    loaded = load_model(args.checkpoint, device)
    model, setup = loaded.model, loaded.setup
    num_tokens = _num_tokens(args.num_tokens, model.config.block_size)
    print(f"gpt2ladder sample: {describe_shape(model)}{_recipe(loaded.state)} from {loaded.description} on {device}",
          file=sys.stderr, flush=True)
    forward = _compiled(model, device) if args.compile else model
    enc = get_tokenizer()
    given = encode_text(args.prompt)
    prompt = given or [GPT2_EOT]  # an empty prompt starts a document; that token is not printed
    for line in notices(len(prompt), num_tokens, model.config.block_size, _trained_len(loaded.state)):
        print(line, file=sys.stderr, flush=True)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    for i in range(args.num_samples):
        if i:
            print("-" * 40)
        idx = torch.tensor([prompt], dtype=torch.long, device=device)
        with _precision(device, setup):
            new = (int(t) for t in stream(forward, idx, num_tokens, args.temperature, args.top_k or None, gen))
            for piece in decode_stream(itertools.chain(given, new), enc):
                print(piece, end="", flush=True)  # as it is generated: a long sample is not a silent wait
        print(flush=True)
    return 0
