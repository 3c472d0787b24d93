"""The value_embeds, unet_skips and doc_windows parts on a GPU: FlexAttention's attention within documents and a
window against the plain path's in bfloat16, and compiled training steps of the tiny model with the three parts (on
top of the other model parts), which build the batch's block mask inside the compiled forward."""

import dataclasses
import math

import pytest
import torch

from gpu_support import GPU, TINY, needs_cuda, random_batches
from gpt2ladder.model.config import PRESETS
from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.model import modern
from gpt2ladder.model.modern import doc_window_block_mask, doc_window_mask, document_ids, masked_attention
from gpt2ladder.model.recipe import DOC_WINDOW, parse_recipe
from gpt2ladder.runtime.engine import Engine, OptimConfig
from gpt2ladder.runtime.hardware import detect

pytestmark = [pytest.mark.gpu, needs_cuda]
RECIPE = parse_recipe("muon,rope,qk_norm,relu2,rmsnorm,zero_init,untied_head,softcap,value_embeds,unet_skips,"
                      "doc_windows")
SHAPE = dataclasses.replace(TINY, parts=RECIPE.model_parts)
EOT = TINY.vocab_size - 1  # <|endoftext|>, 50256
# bfloat16 attention against the fp32 expression: inputs rounded to 8 bits of mantissa, the softmax's weights and the
# output too; about 0.4% of an output's size per rounding, so 2% (in norm) leaves room and a wrong mask (a score
# let in or kept out) is far beyond it.
BF16_REL = 0.02


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _documents(B: int, T: int) -> torch.Tensor:
    """Random tokens with <|endoftext|> at a few places, so that documents of several lengths begin in each row."""
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, EOT, (B, T), generator=gen)
    idx[torch.rand(B, T, generator=gen) < 4 / T] = EOT
    idx[0, 0] = idx[1, T // 3] = EOT
    return idx.to(GPU)


def test_flex_attention_is_the_plain_doc_window_attention_in_bf16_forward_and_backward():
    B, H, T, D = 4, 12, 1024, 64  # GPT-2's heads at its sequence: the window of DOC_WINDOW < T cuts in
    assert DOC_WINDOW < T
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(B, H, T, D, generator=gen).to(GPU) for _ in range(4))
    docs = document_ids(_documents(B, T), EOT)

    def attend(q, k, v, docs, flex):
        mask = doc_window_block_mask(docs) if flex else doc_window_mask(docs)  # built inside the compiled function
        return masked_attention(q, k, v, mask, manual=False)

    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = masked_attention(*ref_in, doc_window_mask(docs), manual=True)  # fp32, the four-line attention
    ref.backward(grad)
    compiled = torch.compile(attend)
    gaps = {}
    for flex in (False, True):
        bf16_in = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
        out = compiled(*bf16_in, docs, flex)
        out.backward(grad.to(torch.bfloat16))
        assert out.dtype == torch.bfloat16
        gaps[flex] = [_gap(out, ref)] + [_gap(a.grad, b.grad) for a, b in zip(bf16_in, ref_in)]
    assert max(gaps[False]) < BF16_REL  # the plain path in bf16: what rounding alone costs
    for flex_gap, plain_gap in zip(gaps[True], gaps[False]):  # FlexAttention: as near the fp32 expression
        assert flex_gap < max(BF16_REL, 2 * plain_gap), gaps


def _losses(setup, steps: int = 8) -> list[float]:
    """The losses of `steps` steps of the three parts' model on one batch of documents, again and again: a model
    that learns lowers its loss."""
    (x, y), = random_batches(1)
    x = _documents(*x.shape)
    engine = Engine(SHAPE, setup, GPU, seed=0, optim=OptimConfig(name="muon", lr=3e-3, muon_lr=0.02))
    return [engine.step(x, y).item() for _ in range(steps)]


def test_a_compiled_step_with_the_three_parts_runs_flex_attention_and_learns(monkeypatch):
    built = []

    def counted(docs, window=DOC_WINDOW):
        built.append(1)
        return doc_window_block_mask(docs, window)

    monkeypatch.setattr(modern, "doc_window_block_mask", counted)
    compiled = _losses(setup_for(["baseline", "tf32", "bf16", "compile"]))
    assert built  # the compiled forward built the batch's BlockMask: FlexAttention ran
    eager = _losses(setup_for(["baseline", "tf32", "bf16"]))  # the plain path, from the same start
    assert compiled[-1] < compiled[0] - 0.5
    assert abs(compiled[-1] - eager[-1]) <= 0.05 * eager[-1]  # the same training, bf16 rounding apart


def test_the_top_of_auto_for_the_three_parts_trains():
    names = resolve_rungs("auto", detect(GPU), recipe=RECIPE)
    assert "compile" in names and "flash" not in names  # doc_windows takes the place of SDPA
    losses = _losses(setup_for(names))
    assert losses[-1] < losses[0] - 0.5


def test_the_tiles_found_from_the_documents_are_create_block_masks_at_gpt2s_size():
    from torch.nn.attention.flex_attention import create_block_mask

    docs = document_ids(_documents(16, 1024), EOT)
    ours = doc_window_block_mask(docs)

    def may_attend(b, h, q, k):
        return (k <= q) & (q - k < DOC_WINDOW) & (docs[b, q] == docs[b, k])

    theirs = create_block_mask(may_attend, 16, None, 1024, 1024, device=GPU)  # eager: its search is not compiled
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks)


def test_the_top_of_auto_for_the_three_parts_trains_and_validates_at_gpt2s_attention_size():
    """GPT-2's width, heads and sequence (two Blocks, to keep it quick), 16 x 1024 tokens: eight tiles a row, the
    window cutting in, CUDA graphs and the rotary kernel with FlexAttention; a few steps, then a validation's
    forward, each synchronised so a kernel's fault is caught here."""
    shape = dataclasses.replace(PRESETS["gpt2"], n_layer=2, parts=RECIPE.model_parts)
    names = resolve_rungs("auto", detect(GPU), recipe=RECIPE)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, EOT, (16, 1025), generator=gen)
    x[torch.rand(16, 1025, generator=gen) < 3 / 1024] = EOT
    x, y = x[:, :-1].to(GPU), x[:, 1:].to(GPU)
    engine = Engine(shape, setup_for(names), GPU, seed=0, optim=OptimConfig(name="muon", lr=3e-3, muon_lr=0.02))
    losses = [engine.step(x, y).item() for _ in range(6)]
    engine.model.eval()  # as the trainer validates: eval mode, no grad, the step's precision
    with torch.no_grad(), engine.precision():
        val = engine.loss(x, y).item()
    engine.model.train()
    torch.cuda.synchronize()
    assert losses[-1] < losses[0] - 0.5 and math.isfinite(val) and val < losses[0], (losses, val)
