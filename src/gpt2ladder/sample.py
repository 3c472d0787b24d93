"""`gpt2ladder sample`: generate text from a checkpoint, eagerly or with the compiled model.

Sampling only ever draws from the real vocabulary: the padded rows of a 50304-row classifier are
sliced off before the softmax, so no id the tokenizer cannot decode is ever produced.
"""

from __future__ import annotations

import contextlib

import torch

from gpt2ladder.config import ModelConfig
from gpt2ladder.errors import UsageError
from gpt2ladder.model import GPT


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Extend idx (B, T) by max_new_tokens tokens; `model` may be a torch.compile'd GPT.

    temperature 0 (or top_k 1) is greedy decoding. The same generator seed gives the same tokens.
    """
    cfg = model.config  # a compiled module forwards attribute access to the original
    for _ in range(max_new_tokens):
        context = idx[:, -cfg.block_size:]  # the model has no positions beyond block_size
        logits, _ = model(context)
        logits = logits[:, -1, :cfg.vocab_size].float()  # (B, vocab): padded rows never compete
        idx = torch.cat([idx, _pick(logits, temperature, top_k, generator)], dim=1)
    return idx


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """One token id per row, (B, 1)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


def model_from_checkpoint(state: dict, device: torch.device) -> GPT:
    """A GPT of the checkpoint's own shape (padding and attention included), its weights loaded."""
    model = GPT(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model.to(device).eval()


def _precision(device: torch.device, setup: dict):
    """The training run's autocast on CUDA (bf16 sampling is what the model was trained in)."""
    dtype = setup.get("autocast") if device.type == "cuda" else None
    if dtype not in ("bfloat16", "float16"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=getattr(torch, dtype))


def _check_args(args) -> None:
    if args.temperature < 0:
        raise UsageError(f"--temperature must be zero (greedy) or positive, got {args.temperature}")
    if args.top_k < 0:
        raise UsageError(f"--top-k must be zero (all tokens) or positive, got {args.top_k}")


def _compiled(model: GPT, device: torch.device):
    from gpt2ladder.hardware import detect

    problem = detect(device).compile_problem
    if problem:
        raise UsageError(f"--compile cannot run here: {problem}")
    return torch.compile(model)


def sample_command(args) -> int:
    from gpt2ladder.checkpoint import load_checkpoint
    from gpt2ladder.data import GPT2_EOT, get_tokenizer
    from gpt2ladder.hardware import resolve_device

    _check_args(args)
    device = resolve_device(args.device)
    state = load_checkpoint(args.checkpoint)
    model = model_from_checkpoint(state, device)
    forward = _compiled(model, device) if args.compile else model
    enc = get_tokenizer()
    prompt = enc.encode_ordinary(args.prompt) or [GPT2_EOT]
    gen = torch.Generator(device=device).manual_seed(args.seed)
    for i in range(args.num_samples):
        idx = torch.tensor([prompt], dtype=torch.long, device=device)
        with _precision(device, state.get("setup", {})):
            out = generate(forward, idx, args.num_tokens, args.temperature, args.top_k or None, gen)
        if i:
            print("-" * 40)
        print(enc.decode(out[0].tolist()), flush=True)
    return 0
