"""The rewrites run in one order, asserted in code: a misordered list fails loudly."""

import dataclasses

import pytest
import torch.nn as nn

from gpt2ladder import speedups
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.model.setup import Setup


def test_the_list_is_in_a_valid_order():
    speedups.check_order()  # raises on a violation


def test_a_rewrite_moved_before_what_it_needs_fails():
    by_name = {r.name: r for r in speedups.REWRITES}
    swapped = (by_name["fused_loss"], by_name["fp32_wgrad"], by_name["gelu_kernel"])
    with pytest.raises(AssertionError, match="fp32_wgrad must come after"):
        speedups.check_order(swapped)
    with pytest.raises(AssertionError, match="unknown"):
        speedups.check_order((dataclasses.replace(by_name["gelu_kernel"], after=("nope",)),))


def test_the_order_matters_gelu_kernel_then_fp32_wgrad():
    """Applied in the list's order both rewrites take every Block; the other way the MLPs stay plain."""
    setup = Setup(gelu_kernel=True, fp32_wgrad=True)
    model = init_weights(GPT(PRESETS["tiny"]), 0)
    changed = speedups.apply(model, setup)
    assert len(changed["gelu_kernel"]) == PRESETS["tiny"].n_layer
    by_name = {r.name: r for r in speedups.REWRITES}
    backwards = init_weights(GPT(PRESETS["tiny"]), 0)
    by_name["fp32_wgrad"].rewrite(backwards, setup)
    assert by_name["gelu_kernel"].rewrite(backwards, setup) == []  # why the list says "after"


def test_rewrites_keep_the_parameters_and_the_tying():
    model = init_weights(GPT(PRESETS["tiny"]), 0)
    before = {n: p for n, p in model.named_parameters()}
    speedups.apply(model, setup_for(["baseline", "vocab", "fused_loss", "gelu_kernel", "fp32_wgrad"]))
    assert {n: p for n, p in model.named_parameters()} == before  # the same Parameter objects
    assert model.lm_head.weight is model.transformer.wte.weight
    assert all(type(m) is not nn.Linear for n, m in model.named_modules() if ".h." in f".{n}")
