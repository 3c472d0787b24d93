"""FLOPs, MFU and timing statistics, against hand computation."""

import dataclasses

import pytest

from gpt2ladder.model.config import preset
from gpt2ladder.runtime.metrics import TimingStats, flops_per_token, mfu, peak_flops


def test_flops_per_token_matches_hand_computation():
    cfg = dataclasses.replace(preset("gpt2"), vocab_multiple=128)
    n = 124_475_904 - 1024 * 768  # parameters without wpe, vocabulary 50304
    attention = 12 * 12 * 12 * 64 * 1024
    assert flops_per_token(cfg, 1024, n) == 6 * n + attention
    # BENCHMARKING.md: about 0.855 GFLOP per token, 14.0 TFLOP per B=16, T=1024 step.
    assert flops_per_token(cfg, 1024, n) == pytest.approx(0.855e9, rel=2e-3)
    assert 16 * 1024 * flops_per_token(cfg, 1024, n) == pytest.approx(14.0e12, rel=5e-3)


def test_flops_per_token_with_doc_windows_counts_the_window_not_the_sequence():
    from gpt2ladder.model.recipe import DOC_WINDOW

    cfg = dataclasses.replace(preset("gpt2"), parts=("doc_windows",))
    n = 85_000_000
    assert flops_per_token(cfg, 1024, n) == 6 * n + 12 * 12 * 12 * 64 * DOC_WINDOW
    assert flops_per_token(cfg, 256, n) == flops_per_token(preset("gpt2"), 256, n)  # a window longer than T


def test_mfu_against_hand_computation():
    # 16,384 tokens in 40 ms at 0.855 GFLOP/token on a 989 TFLOP/s card: 35.4% MFU.
    tok_s = 16384 / 0.040
    assert mfu(tok_s, 0.855e9, 989e12) == pytest.approx(16384 * 0.855e9 / 0.040 / 989e12)
    assert mfu(tok_s, 0.855e9, 989e12) == pytest.approx(0.3541, abs=1e-4)
    assert mfu(tok_s, 0.855e9, None) is None


@pytest.mark.parametrize("name,peak", [("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12),
                                       ("NVIDIA H100 PCIe", 756e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                       ("NVIDIA GeForce RTX 5070", 61.7e12)])
def test_peak_table_lookup(name, peak):
    assert peak_flops(name) == peak


def test_unknown_device_has_no_peak():
    assert peak_flops("cpu (x86_64)") is None


def test_timing_stats():
    s = TimingStats.of([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (s.median, s.min, s.max, s.n) == (3.0, 1.0, 5.0, 5)
    assert s.p10 == pytest.approx(1.4) and s.p90 == pytest.approx(4.6)
    with pytest.raises(ValueError):
        TimingStats.of([])
