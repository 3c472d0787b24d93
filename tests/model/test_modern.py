"""The modern family: GPT-2 with the recipe's model parts switched on, each part against its reference expression."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask

from gpt2ladder.errors import UsageError
from gpt2ladder.model import family, modern
from gpt2ladder.model.config import PRESETS, ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.modern import (ModernGPT, doc_window_block_mask, doc_window_mask, doc_window_tiles,
                                     document_ids, masked_attention,
                                     mix_values, qk_norm, relu2, rotary_tables, rotate, value_embed_tables)
from gpt2ladder.model.recipe import MODEL_PARTS, SOFTCAP

SHAPE = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300)


def _model(*parts, shape=SHAPE):
    return family.built(dataclasses.replace(shape, parts=parts), seed=3)


def test_with_no_part_on_it_is_gpt2_weight_for_weight_and_logit_for_logit():
    gpt2 = init_weights(GPT(PRESETS["tiny"]), 5)
    modern = family.initialise(ModernGPT(PRESETS["tiny"]), 5)
    assert list(gpt2.state_dict()) == list(modern.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(gpt2.state_dict().values(), modern.state_dict().values()))
    x = torch.randint(0, 50257, (2, 24))
    assert torch.equal(gpt2(x, x)[1], modern(x, x)[1])
    assert family.build(PRESETS["tiny"]).__class__ is GPT  # GPT-2 itself is built as GPT


# The parts whose model starts as the one without them (their learned weights make them the identity at the start):
# they change the function once those weights move.
STARTS_AS_WITHOUT = {"embed_skips": "embed_mix"}


@pytest.mark.parametrize("part", MODEL_PARTS)
def test_each_part_alone_changes_the_function_and_trains(part):
    x = torch.randint(0, 300, (2, 12))
    x[:, 5] = SHAPE.vocab_size - 1  # <|endoftext|>: a second document begins (doc_windows)
    base_loss = _model()(x, x)[1]
    model = _model(part)
    if part in STARTS_AS_WITHOUT:
        assert torch.equal(model(x, x)[1], base_loss)
        with torch.no_grad():
            getattr(model, STARTS_AS_WITHOUT[part]).fill_(0.5)
    loss = model(x, x)[1]
    assert math.isfinite(loss.item()) and loss.item() != pytest.approx(base_loss.item(), abs=1e-7)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("parts", [(), ("rope",), ("rmsnorm",), ("untied_head",), ("value_embeds",), ("unet_skips",),
                                   ("doc_windows",), ("embed_skips",), ("rmsnorm", "value_embeds", "unet_skips"),
                                   tuple(MODEL_PARTS)])
def test_the_parameter_count_from_the_shape_is_the_built_models(parts):
    for multiple in (1, 128):
        cfg = dataclasses.replace(SHAPE, parts=parts, vocab_multiple=multiple)
        assert family.parameters(cfg) == family.build(cfg).num_params(non_embedding=False)
    for n_layer in (2, 3, 5, 12):  # the value embeddings' and skips' share of a shape depends on its depth
        cfg = dataclasses.replace(SHAPE, parts=parts, n_layer=n_layer)
        assert family.parameters(cfg) == family.build(cfg).num_params(non_embedding=False)


def test_rotate_turns_each_pair_by_its_positions_angle():
    cfg = dataclasses.replace(SHAPE, parts=("rope",))
    cos, sin = rotary_tables(cfg)
    x = torch.randn(1, 2, 16, 16)
    half = 8
    angles = torch.arange(16.0)[:, None] * 10000.0 ** (-torch.arange(half) / half)
    as_complex = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angles), angles)
    expected = torch.cat((as_complex.real, as_complex.imag), dim=-1)
    torch.testing.assert_close(rotate(x, cos, sin), expected, rtol=1e-5, atol=1e-5)
    # relative positions: q.k after rotation depends on the offset only
    q, k = torch.randn(1, 1, 1, 16).expand(1, 1, 16, 16), torch.randn(1, 1, 1, 16).expand(1, 1, 16, 16)
    rq, rk = rotate(q, cos, sin), rotate(k, cos, sin)
    torch.testing.assert_close((rq[..., 3, :] * rk[..., 1, :]).sum(), (rq[..., 9, :] * rk[..., 7, :]).sum(),
                               rtol=1e-4, atol=1e-4)


def test_rope_has_no_position_table_and_the_others_keep_gpt2s_names():
    assert "transformer.wpe.weight" not in _model("rope").state_dict()
    names = set(_model("qk_norm", "relu2", "softcap").state_dict())
    assert names == set(_model().state_dict())


def test_qk_norm_relu2_and_rmsnorm_are_their_reference_expressions():
    x = torch.randn(3, 4, 8)
    torch.testing.assert_close(qk_norm(x), x / x.pow(2).mean(-1, keepdim=True).add(torch.finfo(x.dtype).eps).sqrt())
    torch.testing.assert_close(relu2(x), torch.where(x > 0, x * x, torch.zeros_like(x)))
    model = _model("rmsnorm")
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))
    h = torch.randn(2, 5, 32)
    torch.testing.assert_close(model.transformer.ln_f(h), F.rms_norm(h, (32,)))


def test_zero_init_starts_every_block_as_the_identity():
    model = _model("zero_init")
    for block in model.transformer.h:
        assert not block.attn.c_proj.weight.any() and not block.mlp.c_proj.weight.any()
        h = torch.randn(2, 5, 32)
        torch.testing.assert_close(block(h), h)
    # the other weights keep GPT-2's draws
    assert torch.equal(model.transformer.h[0].attn.c_attn.weight, _model().transformer.h[0].attn.c_attn.weight)


def test_untied_head_has_its_own_zero_weight_and_the_softcap_bounds_the_logits():
    untied = _model("untied_head")
    assert untied.lm_head.weight is not untied.transformer.wte.weight and not untied.lm_head.weight.any()
    assert untied.num_params() == _model().num_params()  # 6N counts one classifier: the lookup is no matmul
    capped = _model("softcap")
    capped.lm_head.weight.data.mul_(1000)
    logits, _ = capped(torch.randint(0, 300, (1, 8)))
    assert logits.abs().max() <= SOFTCAP
    z = torch.nn.Linear.forward(capped.lm_head, torch.ones(1, 32))
    torch.testing.assert_close(capped.lm_head(torch.ones(1, 32)), SOFTCAP * torch.tanh(z / SOFTCAP))


def test_a_shape_rope_cannot_rotate_is_one_line():
    with pytest.raises(UsageError, match="even head size"):
        ModelConfig(n_layer=1, n_head=2, n_embd=6, parts=("rope",))
    with pytest.raises(UsageError, match="unknown model part"):
        ModelConfig(parts=("muon",))


def test_the_model_config_records_parts_only_when_there_are_any():
    assert "parts" not in SHAPE.to_dict()
    cfg = dataclasses.replace(SHAPE, parts=("rope", "relu2"))
    assert ModelConfig(**cfg.to_dict()) == cfg and cfg.family == "modern" and SHAPE.family == "gpt2"


# --- value_embeds ---------------------------------------------------------------------------------------------


def test_the_first_and_last_blocks_use_the_value_tables_in_order_and_a_shallow_model_uses_fewer():
    assert value_embed_tables(12) == (0, 1, 2) + (None,) * 6 + (0, 1, 2)
    assert value_embed_tables(6) == (0, 1, 2, 0, 1, 2)
    assert value_embed_tables(5) == (0, 1, None, 0, 1)  # half of 5 Blocks: two tables
    assert value_embed_tables(3) == (0, None, 0)
    assert value_embed_tables(2) == (0, 0)
    assert value_embed_tables(1) == (0,)  # one Block, both ends: one table
    model = _model("value_embeds", shape=dataclasses.replace(SHAPE, n_layer=5))
    assert len(model.value_embeds) == 2
    assert [hasattr(b.attn, "value_mix") for b in model.transformer.h] == [True, True, False, True, True]


def test_mix_values_is_a_v_plus_b_ve_head_by_head():
    v, ve, mix = torch.randn(2, 3, 5, 4), torch.randn(2, 5, 12), torch.tensor([0.7, -1.3])
    expected = torch.stack([0.7 * v[:, h] - 1.3 * ve[..., 4 * h:4 * h + 4] for h in range(3)], dim=1)
    torch.testing.assert_close(mix_values(v, ve, mix), expected)
    assert mix_values(v.bfloat16(), ve, mix).dtype == torch.bfloat16  # the attention's operands stay alike


def test_value_embeds_start_half_and_half_are_drawn_after_gpt2s_weights_and_mix_into_the_values():
    x = torch.randint(0, 300, (2, 12))
    model = _model("value_embeds", shape=dataclasses.replace(SHAPE, vocab_multiple=128))
    assert all(b.attn.value_mix.tolist() == [0.5, 0.5] for b in model.transformer.h)
    table = model.value_embeds[0].weight
    assert table.shape == (384, 32) and not table[300:].any()  # padded rows stay zero, as the token embedding's
    assert table[:300].std().item() == pytest.approx(0.02, rel=0.1)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.value_mix.copy_(torch.tensor([1.0, 0.0]))  # a v + b ve with a = 1, b = 0: the values alone
    assert torch.equal(model(x, x)[1], _model(shape=dataclasses.replace(SHAPE, vocab_multiple=128))(x, x)[1])
    fresh = _model("value_embeds")
    fresh(x, x)[1].backward()
    assert fresh.value_embeds[0].weight.grad[x.unique()].abs().sum(-1).all()  # learned from the first step on


# --- unet_skips ---------------------------------------------------------------------------------------------


def test_unet_skips_add_the_first_halfs_outputs_in_reverse_each_scaled_by_its_weight():
    shape = dataclasses.replace(SHAPE, n_layer=5)
    model = _model("unet_skips", shape=shape)
    assert model.skip_weights.tolist() == [1.0, 1.0]  # one weight per pair, starting whole
    with torch.no_grad():
        model.skip_weights.copy_(torch.tensor([0.3, -0.6]))
    idx = torch.randint(0, 300, (2, 12))
    h = model.transformer.h
    o0 = h[0](model.embed(idx))
    o1 = h[1](o0)
    o2 = h[2](o1)  # the middle Block of an odd count: no pair
    o3 = h[3](o2 + -0.6 * o1)  # the second half's first input takes the first half's last output
    o4 = h[4](o3 + 0.3 * o0)
    torch.testing.assert_close(model.hidden(idx), model.transformer.ln_f(o4))
    with torch.no_grad():
        model.skip_weights.zero_()
    assert torch.equal(model(idx, idx)[1], _model(shape=shape)(idx, idx)[1])  # no skip: the model without the part


# --- embed_skips ---------------------------------------------------------------------------------------------


def test_embed_skips_mix_the_embedded_tokens_into_every_blocks_input_after_the_unet_skip():
    shape = dataclasses.replace(SHAPE, n_layer=3)
    model = _model("embed_skips", "unet_skips", shape=shape)
    assert model.residual_mix.tolist() == [1.0] * 3 and model.embed_mix.tolist() == [0.0] * 3
    a, b = torch.tensor([0.9, 1.2, 0.7]), torch.tensor([0.3, -0.2, 0.5])
    with torch.no_grad():
        model.residual_mix.copy_(a)
        model.embed_mix.copy_(b)
        model.skip_weights.fill_(0.4)
    idx = torch.randint(0, 300, (2, 12))
    h = model.transformer.h
    x0 = model.embed(idx)
    o0 = h[0](a[0] * x0 + b[0] * x0)
    o1 = h[1](a[1] * o0 + b[1] * x0)  # the middle Block of three: no skip
    o2 = h[2](a[2] * (o1 + 0.4 * o0) + b[2] * x0)  # the skip first, then the mix
    torch.testing.assert_close(model.hidden(idx), model.transformer.ln_f(o2))
    # x0 carries the gradient back to the token embedding, as the written-out expression does
    table = model.transformer.wte.weight
    probe = torch.randn(2, 12, 32)  # a plain sum of a normed output has no gradient to speak of
    ours = torch.autograd.grad((model.hidden(idx) * probe).sum(), table)
    x0 = model.embed(idx)
    o0 = h[0](a[0] * x0 + b[0] * x0)
    o1 = h[1](a[1] * o0 + b[1] * x0)
    written = model.transformer.ln_f(h[2](a[2] * (o1 + 0.4 * o0) + b[2] * x0))
    torch.testing.assert_close(ours, torch.autograd.grad((written * probe).sum(), table))
    # b is learned though it starts at zero
    fresh = _model("embed_skips", shape=shape)
    fresh(idx, idx)[1].backward()
    assert fresh.embed_mix.grad.abs().min() > 0 and fresh.residual_mix.grad.abs().min() > 0
    # in a bf16 residual stream the mix stays bf16
    mixed = modern.embed_skip(torch.randn(2, 3, dtype=torch.bfloat16), torch.randn(2, 3), a[0], b[0])
    assert mixed.dtype == torch.bfloat16


def test_unet_skips_need_two_halves():
    with pytest.raises(UsageError, match="n_layer=1 has no halves") as err:
        ModelConfig(n_layer=1, n_head=2, n_embd=32, parts=("unet_skips",))
    assert "\n" not in str(err.value)


# --- doc_windows ---------------------------------------------------------------------------------------------


def _reference_attention(q, k, v, docs, window):
    """Masked softmax written out: query i over the keys j <= i of its own document less than `window` back."""
    T = q.shape[-2]
    allowed = torch.tensor([[[j <= i and i - j < window and docs[b, i] == docs[b, j] for j in range(T)]
                             for i in range(T)] for b in range(q.shape[0])])  # (B, T, T)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, allowed


def test_a_document_begins_at_its_end_of_text_token():
    idx = torch.tensor([[5, 7, 9, 9, 5, 9, 1]])
    assert document_ids(idx, end_of_text=9).tolist() == [[0, 0, 1, 2, 2, 3, 3]]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("window", [3, 64])
def test_the_doc_window_attention_is_the_masked_softmax_on_every_path(window):
    gen = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 2, 20, 8
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    idx = torch.randint(0, 8, (B, T), generator=gen)
    idx[0, 7] = idx[0, 13] = idx[1, 0] = 9
    docs = document_ids(idx, end_of_text=9)
    expected, allowed = _reference_attention(q, k, v, docs, window)
    assert torch.equal(doc_window_mask(docs, window)[:, 0], allowed)
    torch.testing.assert_close(masked_attention(q, k, v, doc_window_mask(docs, window), manual=True), expected)
    torch.testing.assert_close(masked_attention(q, k, v, doc_window_mask(docs, window), manual=False), expected)
    flex = masked_attention(q, k, v, doc_window_block_mask(docs, window), manual=False)  # FlexAttention, eager
    torch.testing.assert_close(flex, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("window", [3, 12, 64])
def test_the_tiles_read_off_the_documents_are_those_the_mask_makes(window):
    """doc_window_tiles against the mask itself, tile by tile (tiles of 4 over a row of 20): a tile is full when every
    query of its tile may see every key of it, partial when some may; and FlexAttention with the BlockMask built
    from them is the masked softmax."""
    gen = torch.Generator().manual_seed(1)
    B, H, T, D, block = 3, 2, 20, 8, 4
    idx = torch.randint(0, 8, (B, T), generator=gen)
    idx[0, 7] = idx[0, 8] = idx[0, 13] = idx[1, 0] = idx[2, 4] = 9  # documents starting mid-tile and on a tile's edge
    docs = document_ids(idx, end_of_text=9)
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    expected, allowed = _reference_attention(q, k, v, docs, window)
    n = T // block
    tiles = allowed.view(B, n, block, n, block)
    every, some = tiles.all(dim=4).all(dim=2), tiles.any(dim=4).any(dim=2)
    partial, full = doc_window_tiles(docs, window, block)
    assert torch.equal(full, every) and torch.equal(partial, some & ~every)
    assert partial.any() and full.any() == (window >= 2 * block)  # a full tile needs a window past two tiles
    flex = masked_attention(q, k, v, doc_window_block_mask(docs, window, block=block), manual=False)
    torch.testing.assert_close(flex, expected, rtol=1e-5, atol=1e-5)


def test_the_block_masks_lists_are_create_block_masks_on_both_sides():
    """Both sides' lists (each query tile's key tiles, for the forward; each key tile's query tiles, for the
    backward), partial and full, entry for entry as create_block_mask lists them. (FlexAttention has no backward on
    a CPU: the GPU tests take the gradients through them.)"""
    gen = torch.Generator().manual_seed(2)
    B, T, block, window = 3, 24, 4, 12
    idx = torch.randint(0, 8, (B, T), generator=gen)
    idx[0, 7] = idx[0, 8] = idx[1, 0] = idx[2, 16] = 9
    docs = document_ids(idx, end_of_text=9)
    ours = doc_window_block_mask(docs, window, block=block)
    theirs = create_block_mask(lambda b, h, q, k: (k <= q) & (q - k < window) & (docs[b, q] == docs[b, k]),
                               B, None, T, T, device="cpu", BLOCK_SIZE=block)
    for side in ("kv", "q"):
        for kind in ("", "full_"):
            for what in ("num_blocks", "indices"):
                name = f"{kind}{side}_{what}"
                assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert ours.full_kv_num_blocks.any() and ours.kv_num_blocks.any()  # both kinds of tile occur


def test_a_torch_whose_block_mask_takes_no_lengths_is_refused_in_one_line_by_train_and_race(monkeypatch, capsys):
    """PyTorch 2.5's BlockMask takes no seq_lengths: doc_windows says so before anything starts."""
    from gpt2ladder import cli
    from gpt2ladder.measure.race import recipe_problem
    from gpt2ladder.runtime.hardware import detect

    assert modern.block_mask_problem() is None  # this torch's takes them

    class Older:
        def __init__(self, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices,
                     full_q_num_blocks, full_q_indices, BLOCK_SIZE, mask_mod):
            pass

    monkeypatch.setattr(modern, "BlockMask", Older)
    assert "PyTorch 2.6+" in modern.block_mask_problem()
    assert recipe_problem("doc_windows", detect(torch.device("cpu"))) == modern.block_mask_problem()
    assert recipe_problem("rope", detect(torch.device("cpu"))) is None
    assert cli.main(["train", "--recipe", "doc_windows", "--device", "cpu", "--steps", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PyTorch 2.6+" in err[0]


def test_a_token_sees_nothing_of_an_earlier_document():
    model = _model("doc_windows").eval()
    eot = SHAPE.vocab_size - 1
    x = torch.randint(0, 299, (1, 12))
    x[0, 6] = eot
    other = x.clone()
    other[0, :6] = torch.randint(0, 299, (6,))  # another first document
    assert isinstance(model.attention_mask(x), torch.Tensor)  # on a CPU, uncompiled: the plain attention's mask
    a, b = model(x)[0], model(other)[0]
    torch.testing.assert_close(a[0, 6:], b[0, 6:])  # the second document's logits do not move
    assert not torch.allclose(a[0, :6], b[0, :6])


def test_bf16_tables_keeps_the_looked_up_tables_in_bf16_and_computes_the_model_with_them_rounded():
    parts = ("untied_head", "value_embeds")
    rounded, model = _model(*parts), _model(*parts, "bf16_tables")
    tables = {"transformer.wte.weight", "transformer.wpe.weight", "value_embeds.0.weight"}
    assert {n for n, p in model.named_parameters() if p.dtype == torch.bfloat16} == tables
    with torch.no_grad():  # the reference: the fp32 model, its tables rounded to bf16; a classifier that is not zero
        for name, p in rounded.named_parameters():
            if name in tables:
                p.copy_(p.bfloat16().float())
                assert torch.equal(p, model.get_parameter(name).float())  # the same draws, rounded
        rounded.lm_head.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
        model.lm_head.weight.copy_(rounded.lm_head.weight)
    x = torch.randint(0, 300, (2, 12))
    assert model.embed(x).dtype == torch.float32  # widened before the sum with the positions
    logits, loss = model(x, x)
    assert torch.equal(logits, rounded(x, x)[0]) and torch.equal(loss, rounded(x, x)[1])
    loss.backward()
    assert all(model.get_parameter(n).grad.dtype == torch.bfloat16 for n in tables)
    empty = family.build(model.config)  # as sample and --resume build a model to load a checkpoint into
    empty.load_state_dict(model.state_dict())
    assert {n for n, p in empty.named_parameters() if p.dtype == torch.bfloat16} == tables


def test_bf16_tables_leaves_a_tied_token_embedding_in_fp32_as_the_classifier_it_also_is():
    model = _model("rope", "bf16_tables")  # tied, and no position table: nothing is only looked up
    assert model.tied and all(p.dtype == torch.float32 for p in model.parameters())
    alone = _model("bf16_tables")
    assert [n for n, p in alone.named_parameters() if p.dtype == torch.bfloat16] == ["transformer.wpe.weight"]
