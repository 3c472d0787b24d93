"""The modern family: GPT-2 with the recipe's model parts switched on, each part against its reference expression."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from gpt2ladder.errors import UsageError
from gpt2ladder.model import family
from gpt2ladder.model.config import PRESETS, ModelConfig
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.modern import ModernGPT, qk_norm, relu2, rotary_tables, rotate
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


@pytest.mark.parametrize("part", MODEL_PARTS)
def test_each_part_alone_changes_the_function_and_trains(part):
    x = torch.randint(0, 300, (2, 12))
    base_loss = _model()(x, x)[1]
    model = _model(part)
    loss = model(x, x)[1]
    assert math.isfinite(loss.item()) and loss.item() != pytest.approx(base_loss.item(), abs=1e-7)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("parts", [(), ("rope",), ("rmsnorm",), ("untied_head",), tuple(MODEL_PARTS)])
def test_the_parameter_count_from_the_shape_is_the_built_models(parts):
    for multiple in (1, 128):
        cfg = dataclasses.replace(SHAPE, parts=parts, vocab_multiple=multiple)
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
