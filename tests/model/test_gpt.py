"""The model computes GPT-2, and the two rungs that touch its tensors keep the same function."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gpt2ladder.errors import UsageError
from gpt2ladder.model.config import PRESETS, ModelConfig, preset
from gpt2ladder.model.gpt import GPT, init_weights, manual_attention

TINY = PRESETS["tiny"]


def _model(**changes) -> GPT:
    return init_weights(GPT(dataclasses.replace(TINY, **changes)), seed=0)


def test_sdpa_equals_manual_attention_on_random_input():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 4, 37, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tril(torch.ones(37, 37, dtype=torch.bool)).view(1, 1, 37, 37)
    manual = manual_attention(q, k, v, mask)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(fused, manual, rtol=1e-10, atol=1e-10)


def test_sdpa_model_equals_manual_model():
    manual, sdpa = _model(attention="manual"), _model(attention="sdpa")
    idx = torch.randint(0, TINY.vocab_size, (2, 50), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(sdpa(idx)[0], manual(idx)[0], rtol=1e-5, atol=1e-5)


def test_attention_is_causal():
    """Changing a later token never changes an earlier position's logits."""
    model = _model(attention="sdpa")
    idx = torch.randint(0, TINY.vocab_size, (1, 20), generator=torch.Generator().manual_seed(3))
    changed = idx.clone()
    changed[0, 15] = (changed[0, 15] + 1) % TINY.vocab_size
    a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :15], b[:, :15])
    assert not torch.allclose(a[:, 15:], b[:, 15:])


@pytest.mark.parametrize("vocab_multiple,expected", [(1, 124_439_808), (128, 124_475_904)])
def test_gpt2_124m_parameter_count_on_meta_device(vocab_multiple, expected):
    with torch.device("meta"):
        model = GPT(dataclasses.replace(preset("gpt2"), vocab_multiple=vocab_multiple))
    # 124,439,808 is the published count of Hugging Face's gpt2 (tied classifier counted once).
    assert model.num_params(non_embedding=False) == expected
    assert model.num_params() == expected - 1024 * 768


def test_classifier_is_tied_to_the_embedding():
    model = _model()
    assert model.lm_head.weight is model.transformer.wte.weight


def test_padded_vocab_is_the_same_function():
    plain, padded = _model(), _model(vocab_multiple=128)
    assert padded.config.padded_vocab_size == 50304
    torch.testing.assert_close(padded.transformer.wte.weight[:50257], plain.transformer.wte.weight)
    assert padded.transformer.wte.weight[50257:].abs().max() == 0
    idx = torch.randint(0, 50257, (2, 30), generator=torch.Generator().manual_seed(4))
    tgt = torch.randint(0, 50257, (2, 30), generator=torch.Generator().manual_seed(5))
    (lp, loss_p), (lq, loss_q) = plain(idx, tgt), padded(idx, tgt)
    torch.testing.assert_close(lq[..., :50257], lp)
    torch.testing.assert_close(loss_q, loss_p)
    loss_q.backward()
    assert padded.lm_head.weight.grad[50257:].abs().max() == 0  # padded rows never learn


def _block_input_dtypes(model: GPT) -> list[torch.dtype]:
    seen = []
    for block in model.transformer.h:
        block.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    return seen


def test_low_precision_residual_follows_autocast_only():
    plain, low = _model(), _model(low_precision_residual=True)
    seen_plain, seen_low = _block_input_dtypes(plain), _block_input_dtypes(low)
    idx = torch.randint(0, 50257, (2, 30), generator=torch.Generator().manual_seed(6))
    tgt = torch.randint(0, 50257, (2, 30), generator=torch.Generator().manual_seed(7))
    # Off autocast the flag changes nothing: same numbers, bit for bit (sampling on CPU, fp32 eval).
    assert torch.equal(low(idx, tgt)[1], plain(idx, tgt)[1])
    assert seen_low == seen_plain == [torch.float32] * TINY.n_layer
    seen_plain.clear(), seen_low.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits_p, loss_p = plain(idx, tgt)
        logits_l, loss_l = low(idx, tgt)
    assert seen_plain == [torch.float32] * TINY.n_layer  # autocast alone leaves the stream in fp32
    assert seen_low == [torch.bfloat16] * TINY.n_layer
    assert loss_l.dtype == torch.float32 and not torch.equal(loss_l, loss_p)  # it did run differently
    torch.testing.assert_close(loss_l, loss_p, rtol=2e-3, atol=0)  # ... and computes the same function
    (loss_p + 0 * logits_p.sum()).backward()
    (loss_l + 0 * logits_l.sum()).backward()
    for (name, a), b in zip(plain.named_parameters(), low.parameters()):
        assert b.grad.dtype == torch.float32, name
        cos = F.cosine_similarity(a.grad.flatten(), b.grad.flatten(), dim=0)
        assert cos > 0.99, (name, cos)


def test_init_follows_gpt2():
    model = _model()
    cfg = model.config
    c_proj = model.transformer.h[0].mlp.c_proj.weight
    c_fc = model.transformer.h[0].mlp.c_fc.weight
    assert abs(c_fc.std().item() - 0.02) < 0.002
    assert abs(c_proj.std().item() - 0.02 / (2 * cfg.n_layer) ** 0.5) < 0.002
    assert model.transformer.h[0].attn.c_attn.bias.abs().max() == 0
    assert torch.equal(model.transformer.ln_f.weight, torch.ones(cfg.n_embd))


def test_init_depends_on_seed_only():
    a = init_weights(GPT(TINY), seed=7)
    b = init_weights(GPT(TINY), seed=7)
    c = init_weights(GPT(TINY), seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.transformer.wte.weight, c.transformer.wte.weight)


def test_initial_loss_is_near_uniform():
    model = _model()
    idx = torch.randint(0, 50257, (4, 64), generator=torch.Generator().manual_seed(6))
    _, loss = model(idx, torch.roll(idx, -1, 1))
    assert abs(loss.item() - torch.log(torch.tensor(50257.0)).item()) < 0.3


def test_sequence_longer_than_block_is_refused():
    model = _model()
    with pytest.raises(ValueError, match="block size"):
        model(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))


def test_bad_configs_are_usage_errors():
    with pytest.raises(UsageError, match="divisible"):
        ModelConfig(n_embd=100, n_head=3)
    with pytest.raises(UsageError, match="attention"):
        ModelConfig(attention="fast")
    with pytest.raises(UsageError, match="unknown preset"):
        preset("gpt5")
